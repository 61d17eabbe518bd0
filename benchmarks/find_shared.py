"""``find_shared`` against the pytree traversal it stands on, on a 50k-leaf tree.

The tree is a mixture-of-experts shaped params dict: ``--layers`` layers (500)
of ``--experts`` experts (50), each expert ``{"w_in", "w_out"}``, so 50,000 small
array leaves; in every layer the last expert's ``w_out`` is the first expert's
``w_in`` (one tie per layer, 500 in all). Side by side, in one run, the best
of ``--rounds`` x ``--number`` calls (see :func:`best_of`) of:

* ``jax.tree_util.tree_flatten_with_path``, the traversal every tie finder
  needs at least (the baseline, 1.00x);
* ``find_shared(tree)`` (``by="identity"``), goal at most 1.5x the traversal;
* ``dedupe(tree, alias_map)``, ``retie(unique, alias_map)`` and ``Tied.tree``
  on the same tree (reported against the same baseline, no goal);
* ``find_shared`` where half the leaves are aliases -- in pairs, in groups of
  11, in one group (see :func:`build_tree`) -- against the traversal of the
  same tree, goal at most 1.5x too;
* ``find_shared(tree, by="buffer")`` on a smaller tree (``--buffer-layers``
  layers), against the traversal of that tree, for reference: it reads every
  leaf's device buffer pointer.

Run: ``python benchmarks/find_shared.py``. Prints a table; a missed goal is
reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import jaxshare

GOAL = 1.5  # find_shared at most this many times tree_flatten_with_path


def build_tree(
    layers: int, experts: int, ties: str = "layer"
) -> tuple[dict[str, Any], jaxshare.AliasMap]:
    """The benchmark tree and the alias map it must produce.

    Args:
      ties: where the aliases are. ``"layer"``: in every layer the last
        expert's ``w_out`` is the first expert's ``w_in`` (``layers`` aliases).
        The rest make half the leaves aliases: ``"pairs"``: every expert's
        ``w_out`` is its own ``w_in`` (groups of 2); ``"tens"``: the ``w_out``
        of ten experts in a row are the first one's ``w_in`` (groups of 11);
        ``"one"``: every ``w_out`` is expert 0 of layer 0's ``w_in`` (one group).

    Returns:
      ``({"layers": [{"experts": [{"w_in", "w_out"}, ...]}, ...]}, expected_map)``
      with ``2 * layers * experts`` leaves.
    """
    host = [np.full((4,), i, np.float32) for i in range(2 * layers * experts)]
    arrays = iter(jax.device_put(host))
    tree = {
        "layers": [
            {"experts": [{"w_in": next(arrays), "w_out": next(arrays)} for _ in range(experts)]}
            for _ in range(layers)
        ]
    }
    aliases = {}
    for i, layer in enumerate(tree["layers"]):
        for j, expert in enumerate(layer["experts"]):
            if ties == "layer":
                source = (i, 0) if j == experts - 1 else None
            elif ties == "pairs":
                source = (i, j)
            elif ties == "tens":
                source = (i, j - j % 10)
            elif ties == "one":
                source = (0, 0)
            else:
                raise ValueError(f"unknown ties {ties!r}")
            if source is not None:
                expert["w_out"] = tree["layers"][source[0]]["experts"][source[1]]["w_in"]
                canonical = f"layers/{source[0]}/experts/{source[1]}/w_in"
                aliases[f"layers/{i}/experts/{j}/w_out"] = canonical
    return tree, jaxshare.AliasMap(aliases)


def best_of(
    fns: dict[str, Callable[[], Any]], rounds: int, number: int, *, gc_on: bool = False
) -> dict[str, float]:
    """The fastest call of each function, in seconds.

    Each round times every function in turn: one untimed call, then ``number``
    timed calls in a row (the steady state ``timeit`` measures). Repeating the
    rounds spreads load from other processes over all functions. The functions
    are not interleaved call by call: a call that follows one that churned
    through memory pays for it, so interleaving slows the traversal baseline
    (by ~40% here) and flatters every ratio. As in ``timeit``, the garbage
    collector is off while timing unless ``gc_on``.
    """
    best = dict.fromkeys(fns, float("inf"))
    enabled = gc.isenabled()
    gc.collect()
    if not gc_on:
        gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                fn()
                for _ in range(number):
                    start = time.perf_counter()
                    fn()
                    best[name] = min(best[name], time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return best


def _row(name: str, seconds: float, base: float, goal: float | None = None) -> str:
    ratio = seconds / base
    verdict = (
        "" if goal is None else (f"met (<= {goal}x)" if ratio <= goal else f"MISSED (> {goal}x)")
    )
    return f"| {name:<46} | {seconds * 1e3:9.2f} | {ratio:6.2f}x | {verdict:<16} |"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints its table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=500)
    parser.add_argument("--experts", type=int, default=50)
    parser.add_argument(
        "--buffer-layers", type=int, default=50, help="layers of the by='buffer' tree"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all operations")
    parser.add_argument("--number", type=int, default=5, help="timed calls in a row per round")
    args = parser.parse_args(argv)

    tree, expected = build_tree(args.layers, args.experts)
    small, small_expected = build_tree(args.buffer_layers, args.experts)
    n, n_small = len(jax.tree_util.tree_leaves(tree)), len(jax.tree_util.tree_leaves(small))
    # Correctness first: a fast wrong answer is no result.
    found = jaxshare.find_shared(tree)
    assert found == expected, f"find_shared found {len(found)} aliases, expected {len(expected)}"
    assert jaxshare.find_shared(small, by="buffer") == small_expected
    unique, amap = jaxshare.dedupe(tree, found)
    assert len(jax.tree_util.tree_leaves(unique)) == n - len(amap)
    tied = jaxshare.Tied(unique, amap)

    r = (args.rounds, args.number)
    flat = f"tree_flatten_with_path, {n:,} leaves"
    find = "find_shared(tree)  [by='identity']"
    big = best_of(
        {
            flat: lambda: jax.tree_util.tree_flatten_with_path(tree),
            find: lambda: jaxshare.find_shared(tree),
            "dedupe(tree, alias_map)": lambda: jaxshare.dedupe(tree, amap),
            "retie(unique, alias_map)": lambda: jaxshare.retie(unique, amap),
            "Tied.tree": lambda: tied.tree,
        },
        *r,
    )
    flat_small = f"tree_flatten_with_path, {n_small:,} leaves"
    small_times = best_of(
        {
            flat_small: lambda: jax.tree_util.tree_flatten_with_path(small),
            "find_shared(small, by='buffer')": lambda: jaxshare.find_shared(small, by="buffer"),
        },
        *r,
    )
    many_rows = []
    for ties, what in [
        ("pairs", "pairs"),
        ("tens", "groups of 11"),
        ("one", "one group"),
    ]:
        many, many_expected = build_tree(args.layers, args.experts, ties)
        assert jaxshare.find_shared(many) == many_expected, ties
        flat_many = f"tree_flatten_with_path, {what}"
        find_many = f"find_shared, half aliases, {what}"
        times = best_of(
            {
                flat_many: lambda many=many: jax.tree_util.tree_flatten_with_path(many),
                find_many: lambda many=many: jaxshare.find_shared(many),
            },
            *r,
        )
        many_rows.append(_row(flat_many, times[flat_many], times[flat_many]))
        many_rows.append(_row(find_many, times[find_many], times[flat_many], GOAL))
        del many, times
    gc_times = best_of(
        {
            flat + ", GC on": lambda: jax.tree_util.tree_flatten_with_path(tree),
            find + ", GC on": lambda: jaxshare.find_shared(tree),
        },
        *r,
        gc_on=True,
    )
    sections = [
        [_row(k, t, big[flat], GOAL if k == find else None) for k, t in big.items()],
        [_row(k, t, small_times[flat_small]) for k, t in small_times.items()],
        many_rows,
        [
            _row(k, t, gc_times[flat + ", GC on"], GOAL if k.startswith(find) else None)
            for k, t in gc_times.items()
        ],
    ]
    print(
        f"find_shared benchmark: jax {jax.__version__}, {platform.python_implementation()} "
        f"{platform.python_version()}, {jax.devices()[0].platform}, best of "
        f"{args.rounds} x {args.number} calls, "
        "GC off unless noted"
    )
    print(
        f"tree: {args.layers} layers x {args.experts} experts x 2 arrays = {n:,} leaves, "
        f"{len(amap)} ties; small tree: {args.buffer_layers} layers, {n_small:,} leaves"
    )
    print(f"| {'operation':<46} | {'ms':>9} | {'vs flat':>7} | {'goal':<16} |")
    print(f"|{'-' * 48}|{'-' * 10}:|{'-' * 8}:|{'-' * 18}|")
    blank = f"| {'':<46} | {'':>9} | {'':>7} | {'':<16} |"
    print(f"\n{blank}\n".join("\n".join(rows) for rows in sections))
    ratio = big[find] / big[flat]
    print(
        f"find_shared / tree_flatten_with_path = {ratio:.2f}x: goal <= {GOAL}x "
        f"{'met' if ratio <= GOAL else 'MISSED'}"
    )
    missed = [row for row in many_rows if "MISSED" in row]
    print(
        f"half the leaves aliases: goal <= {GOAL}x {'MISSED' if missed else 'met'} in all 3 cases"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
