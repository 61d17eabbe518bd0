"""``find_shared``: the ties in a pytree or an NNX graph, as an ``AliasMap``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np

from jaxshare import _nnx
from jaxshare._alias import AliasMap
from jaxshare._leafkey import By, _identity_key, is_array, key_function
from jaxshare._paths import Path, keypath_to_path, render

__all__ = ["find_shared", "Prefer"]

Prefer = Callable[[str], Any] | Sequence[str]


def find_shared(
    tree: Any,
    /,
    *,
    by: By = "identity",
    is_leaf: Callable[[Any], bool] | None = None,
    prefer: Prefer | None = None,
) -> AliasMap:
    """Finds the leaves of ``tree`` that are one array reached by several paths.

    The canonical path of each tie is the first in flatten order: the order of
    ``jax.tree_util`` (dict keys sorted, sequences by index, dataclass fields as
    declared); for ``flax.nnx`` Modules and ``nnx.State``, NNX's own traversal,
    so the canonical is the path ``nnx.state`` keeps and ``nnx.state(model)`` is
    already the unique tree (NNX keeps raw, non-Variable arrays at every path,
    so a tie between those is an alias NNX did not drop).

    Args:
      tree: any pytree, or an ``nnx`` graph node (a shared Module expands to one
        alias per Variable beneath it).
      by: ``"identity"``: the same Python object (arrays, tracers inside
        ``jit``, NNX Variables). ``"buffer"``: the same memory -- per addressable
        shard the device and buffer pointer, plus shape, dtype and sharding, so
        distinct ``jax.Array`` wrappers over the same shards are found; numpy
        leaves by data pointer, shape, strides and dtype. Zero-size arrays are
        never tied by address.
      is_leaf: as in ``jax.tree_util``.
      prefer: ranks the paths of a tie to pick its canonical. A callable maps a
        path to a sort key (smallest wins); a sequence of paths or path prefixes
        ranks by the first entry that matches. Flatten order breaks ranks.

    Returns:
      ``AliasMap`` of every non-canonical path to its canonical. Leaves that
      are not arrays (ints, strings, ``None``) are never aliases.

    Raises:
      TypeError: a tracer leaf with ``by="buffer"``.
      ValueError: a deleted (donated) array with ``by="buffer"``; a key that
        cannot be rendered in a path (contains ``'/'``).

    >>> import jax.numpy as jnp
    >>> emb = jnp.ones((10, 4))
    >>> find_shared({"wte": {"embedding": emb}, "lm_head": {"embedding": emb}})
    AliasMap({'wte/embedding': 'lm_head/embedding'})
    >>> find_shared({"wte": {"embedding": emb}, "lm_head": {"embedding": emb}},
    ...             prefer=["wte"])
    AliasMap({'lm_head/embedding': 'wte/embedding'})
    """
    keyfn = key_function(by)  # validates `by` first
    if is_leaf is None and _nnx.is_nnx_root(tree):
        entries = _nnx.walk(tree)
        leaves = [leaf for _, leaf in entries]

        def paths_at(idx: list[int]) -> dict[int, Path]:
            return {i: entries[i][0] for i in idx}

        keyfn = _nnx.leaf_key(keyfn, by)
    else:
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)

        def paths_at(idx: list[int]) -> dict[int, Path]:
            return _paths_at(tree, treedef, idx, is_leaf)

    if keyfn is _identity_key:
        groups = _group_by_identity(leaves)
    else:
        groups = _group(leaves, keyfn, lambda i: render(paths_at([i])[i]))

    paths = paths_at([i for group in groups for i in group])
    rank = _ranker(prefer)
    aliases: dict[str, str] = {}
    for group in groups:
        rendered = [render(paths[i]) for i in group]
        if len(set(rendered)) != len(rendered):
            raise ValueError(
                f"paths {rendered} of one tied array render to the same string; give "
                "the keys distinct names (e.g. not both 1 and '1')."
            )
        best = min(range(len(rendered)), key=lambda j: (rank(rendered[j]), j)) if rank else 0
        for p in rendered:
            if p != rendered[best]:
                aliases[p] = rendered[best]
    return AliasMap(aliases)


def _group_by_identity(leaves: list[Any]) -> list[list[int]]:
    """The hot path: indices of array leaves grouped by ``id``, in flatten order.

    Repeated ids are found at C speed (a set, then ``np.unique``), so only the
    repeated leaves are looked at in Python.
    """
    ids = list(map(id, leaves))
    if len(set(ids)) == len(ids):
        return []
    _, inverse, counts = np.unique(
        np.array(ids, np.uint64), return_inverse=True, return_counts=True
    )
    groups: dict[int, list[int]] = {}
    for i in np.flatnonzero(counts[inverse] > 1).tolist():
        if is_array(leaves[i]):
            groups.setdefault(ids[i], []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _group(
    leaves: list[Any],
    keyfn: Callable[[Any, Callable[[], str]], Hashable | None],
    where: Callable[[int], str],
) -> list[list[int]]:
    first: dict[Hashable, int] = {}
    dups: dict[int, list[int]] = {}
    for i, leaf in enumerate(leaves):
        key = keyfn(leaf, partial(where, i))
        if key is None:
            continue
        j = first.setdefault(key, i)
        if j != i:
            dups.setdefault(j, [j]).append(i)
    return list(dups.values())


class _Mark:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _paths_at(
    tree: Any, treedef: Any, indices: list[int], is_leaf: Callable[[Any], bool] | None
) -> dict[int, Path]:
    """Key paths of the leaves at ``indices`` only.

    Building a key path for every leaf costs most of a flatten, and ties are
    few: the paths come from a copy of the structure holding a marker at each
    wanted leaf and ``None`` (no leaf at all) elsewhere. A custom pytree node
    that refuses ``None`` children gets the full flatten instead.
    """
    if not indices:
        return {}
    marks: list[Any] = [None] * treedef.num_leaves
    for i in indices:
        marks[i] = _Mark(i)
    try:
        marked = jax.tree_util.tree_unflatten(treedef, marks)
        flat, _ = jax.tree_util.tree_flatten_with_path(marked)  # A _Mark is a leaf.
        found = {m.index: keypath_to_path(kp) for kp, m in flat if isinstance(m, _Mark)}
        if len(found) == len(set(indices)):
            return found
    except Exception:  # noqa: BLE001 -- any failure of a node's unflatten: fall back.
        pass
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return {i: keypath_to_path(flat[i][0]) for i in indices}


def _ranker(prefer: Prefer | None) -> Callable[[str], Any] | None:
    if prefer is None:
        return None
    if callable(prefer):
        return prefer
    if isinstance(prefer, str) or not isinstance(prefer, Sequence):
        raise TypeError(
            "`prefer` must be a callable (path -> sort key) or a sequence of paths or "
            f"path prefixes, got {type(prefer).__name__}: {prefer!r}."
        )
    prefixes = list(prefer)

    def rank(path: str) -> int:
        for i, prefix in enumerate(prefixes):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return i
        return len(prefixes)

    return rank
