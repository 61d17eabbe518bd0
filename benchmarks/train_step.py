"""The training step of ``examples/train_tied_lm.py``, tied against duplicated.

The model, the step and the data are the example's (imported, not copied): a
one-block GPT-2 shaped Flax LM whose ``lm_head/kernel`` is its
``wte/embedding.T``, trained with ``optax.adam`` under
``jax.jit(step, donate_argnums=(0, 1))``. Side by side, in one run:

* **tied**: the parameters as a ``jaxshare.Tied`` -- the embedding is one leaf,
  ``lm_head/kernel`` is re-created from it inside the step;
* **duplicated**: the same model with the tie duplicated, ``lm_head/kernel`` an
  independent leaf (how a converted model is trained without jaxshare).

Reported: bytes of the parameters and of the Adam state (goal: the tied Adam
state smaller by exactly twice the tied bytes, its ``mu`` and ``nu``), the first
call (trace + compile), and the step time (goal: tied not slower), as the median
over ``--steps`` timed steps after ``--warmup`` steps, the two models stepping in
turn so load from other processes falls on both alike.

The default sizes make the tied array dominate as in a real LM (vocabulary
8192 x width 128). Run: ``python benchmarks/train_step.py`` (``--help`` for the
sizes). Prints a table; a missed goal is reported, and the exit status is 0
either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_tied_lm as example  # noqa: E402  (the example is a script, not a package)


def _timed_step(step: example.Step, state: list[Any], batch: jax.Array) -> float:
    """Runs one step on ``state = [params, opt_state]`` in place; returns its seconds."""
    start = time.perf_counter()
    params, opt_state, loss = step(state[0], state[1], batch)
    jax.block_until_ready((params, opt_state, loss))
    seconds = time.perf_counter() - start
    state[:] = [params, opt_state]
    return seconds


def ratio_interval(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of ``median(a) / median(b)``."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(a), np.asarray(b)
    ia = rng.integers(len(x), size=(2000, len(x)))
    ib = rng.integers(len(y), size=(2000, len(y)))
    ratios = np.median(x[ia], axis=1) / np.median(y[ib], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def verdict(ratio: float, interval: tuple[float, float]) -> str:
    """Whether the tied step is not slower: ``met``, ``met within noise`` (slower
    by the medians, but the 95% interval includes 1) or ``MISSED``.

    >>> verdict(0.9, (0.85, 0.95)), verdict(1.01, (0.98, 1.03))
    ('met', 'met within noise (95% interval 0.980-1.030 includes 1)')
    """
    lo, hi = interval
    if ratio <= 1.0:
        return "met"
    if lo <= 1.0:
        return f"met within noise (95% interval {lo:.3f}-{hi:.3f} includes 1)"
    return f"MISSED: slower by {100 * (ratio - 1):.1f}% (95% interval {lo:.3f}-{hi:.3f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints its table; returns 0."""
    defaults = example.Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--tie",
        choices=["transpose", "identity"],
        default="transpose",
        help="the example's kind of tie (default: transpose)",
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps after compiling")
    parser.add_argument("--steps", type=int, default=100, help="timed steps of each model")
    args = parser.parse_args(argv)
    config = dataclasses.replace(
        defaults,
        vocab=args.vocab,
        dim=args.dim,
        seq_len=args.seq_len,
        batch=args.batch,
        tie=args.tie,
    )

    model = example.model_for(config)
    optimizer = optax.adam(config.learning_rate)
    step = example.make_step(model, optimizer)
    batches = example.synthetic_batches(config, 16)
    tied = example.init_tied(model, jax.random.key(config.seed))
    dup = example.duplicate(tied)
    tied_bytes = example.tree_bytes(example.at(tied.unique, example.CANONICAL))
    states = {"tied": [tied, optimizer.init(tied)], "duplicated": [dup, optimizer.init(dup)]}
    params_bytes = {k: example.tree_bytes(s[0]) for k, s in states.items()}
    opt_bytes = {k: example.tree_bytes(s[1]) for k, s in states.items()}

    first = {k: _timed_step(step, s, batches[0]) for k, s in states.items()}
    for i in range(args.warmup):
        for s in states.values():
            _timed_step(step, s, batches[i % len(batches)])
    times: dict[str, list[float]] = {k: [] for k in states}
    for i in range(args.steps):
        order = list(states) if i % 2 == 0 else list(reversed(states))
        for k in order:
            times[k].append(_timed_step(step, states[k], batches[i % len(batches)]))
    median = {k: statistics.median(t) for k, t in times.items()}
    quartiles = {k: np.percentile(t, [25, 75]) for k, t in times.items()}

    saved_opt = opt_bytes["duplicated"] - opt_bytes["tied"]
    ratio = median["tied"] / median["duplicated"]
    print(
        f"train_step benchmark: jax {jax.__version__}, {platform.python_implementation()} "
        f"{platform.python_version()}, {jax.devices()[0].platform}, {jax.local_device_count()} "
        "device(s), one used"
    )
    print(
        f"TiedLM tie={config.tie} vocab={config.vocab} dim={config.dim} seq_len={config.seq_len} "
        f"batch={config.batch}; tied array {config.vocab}x{config.dim} float32 = "
        f"{tied_bytes:,} B; optax.adam; median of {args.steps} steps after {args.warmup} warm-up"
    )
    print(
        f"| {'':<28} | {'params B':>11} | {'Adam state B':>12} | {'first call s':>12} "
        f"| {'step ms (median)':>16} | {'IQR ms':>13} |"
    )
    print(f"|{'-' * 30}|{'-' * 12}:|{'-' * 13}:|{'-' * 13}:|{'-' * 17}:|{'-' * 14}:|")
    for k, label in (("tied", "tied (jaxshare.Tied)"), ("duplicated", "duplicated (2 leaves)")):
        q = quartiles[k] * 1e3
        print(
            f"| {label:<28} | {params_bytes[k]:>11,} | {opt_bytes[k]:>12,} | {first[k]:>12.2f} "
            f"| {median[k] * 1e3:>16.2f} | {q[0]:>6.2f}-{q[1]:<6.2f} |"
        )
    print(
        f"| {'tied - duplicated':<28} | {params_bytes['tied'] - params_bytes['duplicated']:>11,} "
        f"| {-saved_opt:>12,} | {first['tied'] - first['duplicated']:>12.2f} "
        f"| {(median['tied'] - median['duplicated']) * 1e3:>16.2f} | {'':>13} |"
    )
    met = saved_opt == 2 * tied_bytes
    print(
        f"Adam state: tied smaller by {saved_opt:,} B = {saved_opt / tied_bytes:g} x tied bytes; "
        f"goal exactly 2 x: {'met' if met else 'MISSED'}"
    )
    interval = ratio_interval(times["tied"], times["duplicated"])
    print(
        f"step time: tied / duplicated = {ratio:.3f} (median; 95% interval {interval[0]:.3f}-"
        f"{interval[1]:.3f}); goal <= 1 (not slower): {verdict(ratio, interval)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
