"""``dedupe`` and ``retie``: remove every alias from a tree, and put them back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxshare.core import nnx as _nnx
from jaxshare.core.alias import AliasMap, as_alias_map
from jaxshare.core.edit import DROP, Absent, Put, edit_paths, get_paths
from jaxshare.core.find import find_shared
from jaxshare.core.leafkey import By, is_array
from jaxshare.core.perm import Perm, transpose

__all__ = ["dedupe", "retie"]

IsLeaf = Callable[[Any], bool] | None


def _read(tree: Any, amap: AliasMap, is_leaf: IsLeaf, arg: str) -> dict[str, Any]:
    """The values at every alias and canonical path, in one walk; every canonical
    must be present."""
    found = get_paths(tree, sorted({*amap, *amap.values()}), is_leaf=is_leaf)
    missing = sorted({c for c in amap.values() if isinstance(found[c], Absent) or found[c] is None})
    if missing:
        raise ValueError(
            f"`{arg}` has no value at canonical path(s) {missing}, named by the alias map "
            f"(aliases: {sorted(a for a, c in amap.items() if c in missing)[:5]}). Was the "
            "map made for another tree?"
        )
    return found


def dedupe(
    tree: Any,
    /,
    alias_map: Mapping[str, str] | None = None,
    *,
    by: By = "identity",
    is_leaf: IsLeaf = None,
) -> tuple[Any, AliasMap]:
    """Removes every alias from ``tree``.

    From a mapping the alias key is dropped (and a mapping this empties is
    dropped from its parent mapping), so the unique tree of a Flax params dict
    is a plain params dict anyone can load. In other containers (lists, tuples,
    dataclasses, and ``OrderedDict``, whose key order JAX keeps) the alias
    becomes ``None``. The input is not mutated.

    An alias already absent from its mapping (or ``None``) counts as removed:
    ``dedupe`` is idempotent, and ``nnx.state(model)`` -- from which NNX drops
    shared Variables -- dedupes with ``find_shared(model)``.

    Args:
      tree: any pytree.
      alias_map: the ties to remove; ``None`` finds them with
        ``find_shared(tree, by=by, is_leaf=is_leaf)``.
      by, is_leaf: as in :func:`find_shared`.

    Returns:
      ``(unique_tree, alias_map)``; :func:`retie` inverts it.

    Raises:
      ValueError: a canonical path is missing; an alias in a list, tuple or
        dataclass does not exist; an alias that is not its canonical's very
        object differs from it in shape, dtype or value (for
        ``jax.ShapeDtypeStruct`` leaves, in shape or dtype) (the tie was broken,
        e.g. by ``jax.jit`` returning copies that were updated separately).
        Every problem is listed in one error.

    >>> import jax.numpy as jnp
    >>> emb = jnp.arange(6.0).reshape(3, 2)
    >>> unique, m = dedupe({"wte": emb, "head": emb, "heads": [emb, emb]})
    >>> unique
    {'head': Array(...), 'heads': [None, None]}
    >>> m
    AliasMap({'heads/0': 'head', 'heads/1': 'head', 'wte': 'head'})
    """
    if alias_map is None:
        amap = find_shared(tree, by=by, is_leaf=is_leaf)
    else:
        amap = as_alias_map(alias_map)
    if not amap:
        return tree, amap
    found = _read(tree, amap, is_leaf, "tree")
    problems: list[str] = []
    for alias in amap:
        value = found[alias]
        if value is None or (isinstance(value, Absent) and value.under_mappings):
            continue  # Already removed.
        if isinstance(value, Absent):
            problems.append(
                f"{alias!r}: no such path (stops at {value.where!r}, which is not a mapping)"
            )
            continue
        reason = _mismatch(value, found[amap[alias]], amap.transform(alias), alias)
        if reason:
            problems.append(f"{alias!r} (alias of {amap[alias]!r}): {reason}")
    if problems:
        raise ValueError("cannot dedupe `tree` with this alias map:\n  " + "\n  ".join(problems))
    return edit_paths(tree, dict.fromkeys(amap, DROP), is_leaf=is_leaf), amap


def _mismatch(alias: Any, canonical: Any, perm: Perm | None, path: str) -> str | None:
    """Why ``alias`` cannot be dropped as a copy of ``canonical``, or ``None``."""
    if alias is canonical and perm is None:
        return None
    a, c = _nnx.variable_value(alias), _nnx.variable_value(canonical)
    if a is c and perm is None:
        return None
    abstract = isinstance(a, jax.ShapeDtypeStruct) or isinstance(c, jax.ShapeDtypeStruct)
    if not abstract and not (is_array(a) and is_array(c)):
        return (
            f"a {type(alias).__name__} and a {type(canonical).__name__} that are not the "
            "same object"
        )
    try:
        expected = transpose(c, perm, f"alias {path!r}")
    except (TypeError, ValueError) as e:
        return str(e)
    if tuple(a.shape) != tuple(expected.shape) or a.dtype != expected.dtype:
        return (
            f"expected {expected.dtype}{list(expected.shape)} (the canonical"
            f"{'' if perm is None else f' transposed by {list(perm)}'}), got "
            f"{a.dtype}{list(a.shape)}"
        )
    if abstract or isinstance(a, jax.core.Tracer) or isinstance(expected, jax.core.Tracer):
        return None  # Values are unknown (abstract or tracing); shapes and dtypes agree.
    if not bool(_same_values(a, expected)):
        return "holds different values than its canonical, so it is not a tie"
    return None


@jax.jit
def _same_values(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.array_equal(a, b, equal_nan=True)


def retie(unique_tree: Any, alias_map: Mapping[str, str], /, *, is_leaf: IsLeaf = None) -> Any:
    """Puts every alias back: the exact inverse of :func:`dedupe`.

    Each aliased path holds the very same object as its canonical, or for an
    alias with a transform the transposed canonical (one object shared by all
    aliases with the same canonical and transform). Mapping keys that ``dedupe``
    removed are re-created (``int`` where the mapping's other keys are ints, as
    NNX list indices are; otherwise ``str``). An implicit alias
    (:attr:`AliasMap.implicit`: the model computes it) is no leaf of the tree and
    is not put back. The input is not mutated.

    Raises:
      ValueError: a canonical path is missing; the tree already holds a
        different value at an alias path; an alias path cannot be re-created
        (its parent is not a mapping); a transform does not fit its canonical.

    >>> import jax.numpy as jnp
    >>> emb = jnp.ones((3, 2))
    >>> full = retie({"wte": emb}, AliasMap({"head/kernel": "wte"},
    ...                                     transforms={"head/kernel": (1, 0)}))
    >>> full["head"]["kernel"].shape
    (2, 3)
    >>> retie({"a": emb, "b": [None]}, {"b/0": "a"})["b"][0] is emb
    True
    >>> sorted(retie({"wte": emb}, AliasMap({"head": "wte"}, implicit=["head"])))
    ['wte']
    """
    amap = as_alias_map(alias_map).explicit()  # (An implicit alias is never a leaf.)
    if not amap:
        return unique_tree
    found = _read(unique_tree, amap, is_leaf, "unique_tree")
    values: dict[str, Any] = {}
    transformed: dict[tuple[str, Perm], Any] = {}
    problems: list[str] = []
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        try:
            if perm is None:
                value = found[canonical]
            elif (canonical, perm) in transformed:
                value = transformed[canonical, perm]
            else:
                value = transformed[canonical, perm] = transpose(
                    found[canonical], perm, f"alias {alias!r}"
                )
        except (TypeError, ValueError) as e:
            problems.append(str(e))
            continue
        held = found[alias]
        if not (isinstance(held, Absent) or held is None or (perm is None and held is value)):
            problems.append(
                f"`unique_tree` already holds a {type(held).__name__} at alias path "
                f"{alias!r}; retie takes the unique tree that `dedupe` returns"
            )
        values[alias] = value
    if problems:
        raise ValueError("cannot retie:\n  " + "\n  ".join(problems))
    try:
        return edit_paths(unique_tree, {a: Put(v) for a, v in values.items()}, is_leaf=is_leaf)
    except ValueError as e:
        raise ValueError(f"cannot retie: {e}") from None
