"""``find_shared``: the ties in a pytree or an NNX graph, as an ``AliasMap``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np

from jaxshare.core import nnx as _nnx
from jaxshare.core.alias import AliasMap, check_path
from jaxshare.core.leafkey import By, identity_key, is_array, key_function
from jaxshare.core.paths import SEP, keypath_to_path, render

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
    path_of: Callable[[int], str]
    if is_leaf is None and _nnx.is_nnx_root(tree):
        entries = _nnx.walk(tree)
        leaves = [leaf for _, leaf in entries]
        keyfn = _nnx.leaf_key(keyfn, by)

        def path_of(i: int) -> str:
            return render(entries[i][0])
    else:
        leaves, paths = _flatten_with_rendered_paths(tree, is_leaf)
        path_of = paths.__getitem__
        if any(_BAD in p for p in paths):

            def path_of(i: int) -> str:
                if _BAD in paths[i]:  # A key that cannot be rendered: jax's path says which.
                    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
                    return check_path(render(keypath_to_path(flat[i][0])), "tied path")
                return paths[i]

    rank = _ranker(prefer)
    aliases: dict[str, str]
    canonicals: list[str]
    groups: list[list[int]] | None
    if keyfn is identity_key:
        members, starts = _tied_by_identity(leaves)
        if rank is None:  # The hot path: canonical = first in flatten order, at C speed.
            canonicals = list(map(path_of, members[starts].tolist()))
            canonical_of = np.repeat(members[starts], np.diff(starts, append=len(members)))
            is_alias = np.ones(len(members), bool)
            is_alias[starts] = False
            aliases = dict(
                zip(
                    map(path_of, members[is_alias].tolist()),
                    map(path_of, canonical_of[is_alias].tolist()),
                    strict=True,
                )
            )
            groups = None
        else:
            groups = [g.tolist() for g in np.split(members, starts[1:])] if len(members) else []
    else:
        groups = _group(leaves, keyfn, path_of)
    if groups is not None:
        aliases, canonicals = {}, []
        for group in groups:
            rendered = list(map(path_of, group))
            best = min(range(len(rendered)), key=lambda j: (rank(rendered[j]), j)) if rank else 0
            canonical = rendered[best]
            canonicals.append(canonical)
            for p in rendered:
                aliases[p] = canonical
            del aliases[canonical]
    if len(aliases) + len(canonicals) != (
        len(members) if groups is None else sum(map(len, groups))
    ) or not aliases.keys().isdisjoint(canonicals):
        if groups is None:
            groups = [g.tolist() for g in np.split(members, starts[1:])]
        _raise_clash([[path_of(i) for i in group] for group in groups])
    # Every path is checked and distinct, and no canonical is an alias: the map
    # needs no resolving.
    return AliasMap.checked(aliases)


def _raise_clash(groups: list[list[str]]) -> None:
    seen: set[str] = set()
    for rendered in groups:
        if seen.intersection(rendered) or len(set(rendered)) != len(rendered):
            raise ValueError(
                f"paths {rendered} of tied arrays render to a string another tied path "
                "renders to; give the keys distinct names (e.g. not both 1 and '1')."
            )
        seen.update(rendered)


#: Stands for a key that cannot be rendered in a path (see ``path_of``).
_BAD = "\0"
#: Types jax flattens as leaves whatever ``is_leaf`` says (arrays, scalars); jax's
#: array types join on first sight.
_LEAF_TYPES: set[type] = {np.ndarray, int, float, complex, bool, str, bytes}


def _flatten_with_rendered_paths(
    tree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[list[Any], list[str]]:
    """``jax.tree_util.tree_flatten(tree, is_leaf)``'s leaves with their rendered paths.

    The same leaves in the same order as jax's flatten, and the same paths as
    rendering ``tree_flatten_with_path``'s key paths, at about the cost of that
    traversal alone: dicts, lists, tuples and ``None`` -- the containers of
    parameter trees -- are walked here, building each path from its parent's
    string, so no key entry objects are made and hashed; any other pytree node
    (a dataclass, a ``FrozenDict``, an Equinox module, an OrderedDict) is
    flattened by jax and its key paths rendered. A key that cannot be rendered
    is marked with ``_BAD`` and raises only if its path is asked for.
    """
    leaves: list[Any] = []
    paths: list[str] = []
    keys: dict[Any, str] = {}

    def key(k: Any) -> str:
        if type(k) is str and k and SEP not in k:
            return k
        try:
            return keys[(type(k), k)]
        except KeyError:
            text = k if type(k) is str else str(k)
            ok = (type(k) is str and text and SEP not in text) or (
                type(k) is int and not isinstance(k, bool)
            )
            keys[(type(k), k)] = text if ok else _BAD
            return keys[(type(k), k)]

    def visit(node: Any, prefix: str) -> None:
        kind = type(node)
        if kind is dict:
            items: Any = [(key(k), node[k]) for k in sorted(node)]
        elif kind is list or kind is tuple:
            items = zip(map(str, range(len(node))), node, strict=True)
        elif node is None:
            return
        else:
            flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=is_leaf)
            if len(flat) == 1 and not flat[0][0]:  # A leaf.
                leaves.append(node)
                paths.append(prefix[:-1])
                return
            for keypath, leaf in flat:
                leaves.append(leaf)
                parts = [key(p) for p in keypath_to_path(keypath)]
                paths.append(prefix + SEP.join(parts))
            return
        for name, child in items:
            if type(child) in _LEAF_TYPES or (is_leaf is not None and is_leaf(child)):
                leaves.append(child)
                paths.append(prefix + name)
            elif isinstance(child, jax.Array):
                _LEAF_TYPES.add(type(child))
                leaves.append(child)
                paths.append(prefix + name)
            else:
                visit(child, prefix + name + SEP)

    if is_leaf is not None and is_leaf(tree):
        return [tree], [""]
    visit(tree, "")
    return leaves, paths


def _tied_by_identity(leaves: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The array leaves that are one object, found at C speed (a stable sort of
    the ids): ``(members, starts)``, the indices of tied leaves grouped, each
    group in flatten order, and where each group starts in ``members``."""
    ids = np.fromiter(map(id, leaves), np.uint64, len(leaves))
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    same = ids[1:] == ids[:-1]
    none = np.zeros(0, np.intp)
    if not same.any():
        return none, none
    tied = np.zeros(len(ids), bool)
    tied[1:] = same
    tied[:-1] |= same
    first = tied.copy()
    first[1:] &= ~same  # the first of each run of equal ids
    members, starts = order[tied], np.flatnonzero(first[tied])
    arrays = [is_array(leaves[i]) for i in members[starts].tolist()]
    if not all(arrays):  # e.g. a small int repeated is no tie
        keep = np.repeat(np.array(arrays, bool), np.diff(starts, append=len(members)))
        members = members[keep]
        starts = np.flatnonzero(first[tied][keep])
    return members, starts


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
