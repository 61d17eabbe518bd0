"""Restoring an item: the restore target for Orbax, and re-tying what it returns.

A ``target`` is checked against the stored alias map and shapes before any
array is read. A full tree is deduped with the stored map, so Orbax reads each
tie once, sharded as the canonical's target leaf asks; the aliases are then
put back as that very array (or its transform) -- but the implicit ones, which
the model computes and whose paths are no leaves of its tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxshare.checkpoint._item import StoredItem, sample
from jaxshare.checkpoint._nested import expand, wrap
from jaxshare.core.alias import AliasMap
from jaxshare.core.edit import DROP, Absent, Put, edit_paths, get_paths
from jaxshare.core.paths import flatten_with_paths, render
from jaxshare.core.tie import dedupe, retie
from jaxshare.core.tied import Tied
from jaxshare.formats import ALIAS_MAP_FILE

__all__ = ["restore_item"]

ReadOrbax = Callable[[Any], Any]


def restore_item(item: StoredItem, target: Any, read_orbax: ReadOrbax) -> Any:
    """Restores ``item`` into the shape of ``target``.

    Args:
      item: the opened item.
      target: ``None`` (the full tree as saved), a full tree of arrays or
        ``jax.ShapeDtypeStruct`` (shardings honoured) that may hold ``Tied``
        nodes, or a ``Tied`` (whose alias map must equal the stored one).
      read_orbax: restores the Orbax PyTree given its target (``None``: as saved).

    Returns:
      The full tree with every alias the same object as its canonical (or its
      transform), or a ``Tied`` for a ``Tied`` target.
    """
    amap = item.alias_map
    if isinstance(target, Tied):
        _check_same_map(item, target.alias_map)
        unique_target = _abstract(target.unique)
    elif target is not None:
        unique_target = _dedupe_target(item, expand(_abstract(target))[0])
    else:
        unique_target = None
    if unique_target is not None:
        _check_fits(item, unique_target)
    orbax_target, empty_likes = _split_empty_targets(item, unique_target)
    unique = read_orbax(orbax_target)
    if item.empty:  # Orbax cannot store zero-size arrays; they are recorded instead.
        unique = edit_paths(
            unique, {p: Put(item.empty[p].make(like)) for p, like in empty_likes.items()}
        )
    if isinstance(target, Tied):
        return Tied(unique, amap)
    full = retie(unique, amap)
    return full if target is None else wrap(full, target)


def _split_empty_targets(item: StoredItem, unique_target: Any) -> tuple[Any, dict[str, Any]]:
    """The target of Orbax's restore (no zero-size arrays), and the target leaf
    of each zero-size array (``None`` where there is no target)."""
    if unique_target is None or not item.empty:
        return unique_target, dict.fromkeys(item.empty)
    found = get_paths(unique_target, list(item.empty))
    likes = {p: None if isinstance(v, Absent) else v for p, v in found.items()}
    return edit_paths(unique_target, dict.fromkeys(item.empty, DROP)), likes


def _abstract(tree: Any) -> Any:
    """``jax.Array`` leaves as ``jax.ShapeDtypeStruct`` with their sharding: only
    shapes, dtypes and shardings of a target matter, never its values."""
    return jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array)
            else x
        ),
        tree,
    )


def _fail(item: StoredItem, problems: list[str], fix: str) -> None:
    if problems:
        raise ValueError(
            f"`target` does not fit the checkpoint in {item.directory}:\n  "
            + "\n  ".join(problems)
            + f"\nFix: {fix}"
        )


def _check_same_map(item: StoredItem, got: AliasMap) -> None:
    stored = item.alias_map
    problems = []
    for alias in sorted(set(stored) | set(got)):
        want = (stored[alias], stored.transform(alias)) if alias in stored else None
        have = (got[alias], got.transform(alias)) if alias in got else None
        if want != have:
            problems.append(
                f"alias {alias!r}: the checkpoint stores {_describe(want)}, the target "
                f"Tied has {_describe(have)}"
            )
    _fail(
        item,
        problems,
        f"build the target Tied with the alias map the checkpoint stores "
        f"(`jaxshare.checkpoint.read_alias_map`, from {ALIAS_MAP_FILE}), or pass a full tree.",
    )


def _describe(entry: tuple[str, Any] | None) -> str:
    if entry is None:
        return "no such alias"
    canonical, perm = entry
    return f"alias of {canonical!r}" + (f" transposed by {list(perm)}" if perm else "")


def _dedupe_target(item: StoredItem, target: Any) -> Any:
    """The unique part of a full target, after checking it holds every tie as stored
    (but an implicit one, which the model computes: no leaf of its tree)."""
    amap = item.alias_map.explicit()
    if not amap:
        return target
    found = get_paths(target, sorted(set(amap) | set(amap.values())))
    problems = [
        f"{path!r}: no leaf there, but the checkpoint stores it as "
        + (f"an alias of {amap[path]!r}" if path in amap else "a canonical")
        for path, value in found.items()
        if isinstance(value, Absent) or value is None
    ]
    for alias, canonical in amap.items():
        a, c = found[alias], found[canonical]
        a_sharding, c_sharding = getattr(a, "sharding", None), getattr(c, "sharding", None)
        if (
            amap.transform(alias) is None
            and a_sharding is not None
            and c_sharding is not None
            and not a_sharding.is_equivalent_to(c_sharding, len(c.shape))
        ):
            problems.append(
                f"alias {alias!r} asks for sharding {a_sharding}, its canonical "
                f"{canonical!r} for {c_sharding}; a tie is one array, so they must agree"
            )
    fix = "pass the full tree of the model that was saved, e.g. from `jax.eval_shape`."
    _fail(item, problems, fix)
    try:
        unique, _ = dedupe(target, amap)
    except ValueError as e:
        _fail(item, [str(e).replace("`tree`", "`target`").replace("\n", "\n  ")], fix)
    return unique


def _check_fits(item: StoredItem, unique_target: Any) -> None:
    leaves = {render(p): leaf for p, leaf in flatten_with_paths(unique_target)}
    stored = set(item.stored) | set(item.other)
    problems = []
    if missing := stored - set(leaves):
        problems.append(f"no leaf at stored path(s) {sample(missing)}")
    computed = item.alias_map.implicit
    for path in sorted(set(leaves) & computed):
        problems.append(
            f"{path!r}: a leaf, but the checkpoint stores it as an implicit alias of "
            f"{item.alias_map[path]!r}, which the model computes: no leaf of its tree"
        )
    if extra := set(leaves) - stored - computed:
        problems.append(f"leaves at path(s) {sample(extra)}, which the checkpoint does not store")
    for path, info in item.stored.items():
        shape = getattr(leaves.get(path), "shape", None)
        if shape is not None and tuple(shape) != info.shape:
            problems.append(
                f"{path!r}: the checkpoint stores shape {info.shape}, the target asks for "
                f"{tuple(shape)}"
            )
    _fail(
        item,
        problems,
        "build `target` from the model that was saved (e.g. `jax.eval_shape` of its init); "
        "`jaxshare inspect` lists what the checkpoint stores.",
    )
