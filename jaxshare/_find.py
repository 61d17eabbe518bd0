"""``find_shared``: the ties in a pytree or an NNX graph, as an ``AliasMap``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

from jaxshare import _nnx
from jaxshare._alias import AliasMap
from jaxshare._leafkey import By, key_function
from jaxshare._paths import keypath_to_path, render

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
        entries: list[tuple[Any, Any]] = _nnx.walk(tree)
        to_path: Callable[[Any], tuple] = tuple
        groups = _group(entries, _nnx.leaf_key(keyfn, by), to_path)
    else:
        entries, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
        to_path = keypath_to_path
        if by == "identity":
            groups = _group_by_identity(entries)
        else:
            groups = _group(entries, keyfn, to_path)
    rank = _ranker(prefer)
    aliases: dict[str, str] = {}
    for indices in groups:
        paths = [render(to_path(entries[i][0])) for i in indices]
        if len(set(paths)) != len(paths):
            raise ValueError(
                f"paths {paths} of one tied array render to the same string; give "
                "the keys distinct names (e.g. not both 1 and '1')."
            )
        best = min(range(len(paths)), key=lambda j: (rank(paths[j]), j)) if rank else 0
        canonical = paths[best]
        for p in paths:
            if p != canonical:
                aliases[p] = canonical
    return AliasMap(aliases)


def _group_by_identity(entries: list[tuple[Any, Any]]) -> list[list[int]]:
    """The hot path: pytree leaves grouped by ``id``, arrays only."""
    array_types = (jax.Array, np.ndarray)
    first: dict[int, int] = {}
    dups: dict[int, list[int]] = {}
    for i, (_, leaf) in enumerate(entries):
        if isinstance(leaf, array_types):
            j = first.setdefault(id(leaf), i)
            if j != i:
                dups.setdefault(j, [j]).append(i)
    return list(dups.values())


def _group(
    entries: list[tuple[Any, Any]],
    keyfn: Callable[[Any, Callable[[], str]], Hashable | None],
    to_path: Callable[[Any], tuple],
) -> list[list[int]]:
    first: dict[Hashable, int] = {}
    dups: dict[int, list[int]] = {}
    for i, (path, leaf) in enumerate(entries):
        key = keyfn(leaf, lambda: render(to_path(path)))
        if key is None:
            continue
        j = first.setdefault(key, i)
        if j != i:
            dups.setdefault(j, [j]).append(i)
    return list(dups.values())


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
