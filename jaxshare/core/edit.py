"""Reading and editing a tree at rendered paths, out of place.

Both operations walk only the spines of the paths they are given: a node whose
rendered children do not lead to a requested path is returned as it is (the
same object), so editing one leaf of a 50k-leaf tree touches a handful of nodes
and the input is never mutated.

Mappings are special: a key can be removed from them (``drop``) and added to
them (``put`` at a path that does not exist creates the missing mapping keys).
Every other container keeps its structure; ``drop`` leaves ``None`` in place.
So does an ``OrderedDict``: JAX flattens it in insertion order, so a removed
key could not be put back at its place.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import jax

from jaxshare.core.paths import Path, children, keypath_to_path, render, render_part, split

__all__ = ["DROP", "Absent", "Put", "get_paths", "edit_paths"]

IsLeaf = Callable[[Any], bool] | None


@dataclass(frozen=True)
class Absent:
    """A path that is not in the tree.

    Attributes:
      where: the rendered path of the deepest node that exists.
      under_mappings: every missing part would be a mapping key, i.e. the path
        could have been removed by ``drop`` (and can be re-created by ``put``).
    """

    where: str
    under_mappings: bool


@dataclass(frozen=True)
class Put:
    value: Any


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()
_OP = object()  # Key of a trie node's operation.


def _trie(paths: Mapping[str, Any]) -> dict:
    root: dict = {}
    for path, op in paths.items():
        node = root
        for part in split(path):
            node = node.setdefault(part, {})
        node[_OP] = op
    return root


Lookup = Callable[[str], tuple[Any, Any] | None]


def _lookup(node: Any, where: Path, is_leaf: IsLeaf) -> Lookup | None:
    """A function from a rendered key to ``(key, child)`` (``None`` when absent);
    ``None`` itself when ``node`` is a leaf.

    Mappings, lists and tuples are looked up directly; other nodes (namedtuples,
    dataclasses, custom pytrees) are flattened one level and their keys rendered.
    """
    if is_leaf is not None and is_leaf(node):
        return None
    if isinstance(node, Mapping):

        def in_mapping(part: str) -> tuple[Any, Any] | None:
            as_int = _as_int(part)
            hits = [k for k in (part, as_int) if k is not None and k in node]
            if len(hits) == 2:
                raise ValueError(
                    f"keys {part!r} and {as_int!r} under {render(where)!r} render to the "
                    "same path; give them distinct names."
                )
            return (hits[0], node[hits[0]]) if hits else None

        return in_mapping
    if type(node) in (list, tuple):

        def in_sequence(part: str) -> tuple[Any, Any] | None:
            i = _as_int(part)
            return (i, node[i]) if i is not None and i < len(node) else None

        return in_sequence
    pairs = children(node)
    if pairs is None:
        return None
    index: dict[str, tuple[Any, Any]] = {}
    for key, child in pairs:
        rendered = render_part(key, (*where, key))
        if rendered in index:
            raise ValueError(
                f"keys {index[rendered][0]!r} and {key!r} under {render(where)!r} render "
                "to the same path; give them distinct names."
            )
        index[rendered] = (key, child)
    return index.get


def _as_int(part: str) -> int | None:
    """``'12'`` -> ``12``: the int key a path part renders, if it renders one."""
    if part.isdigit() and (part == "0" or not part.startswith("0")):
        return int(part)
    return None


def get_paths(tree: Any, paths: list[str], *, is_leaf: IsLeaf = None) -> dict[str, Any]:
    """The value at each rendered path, or an :class:`Absent` describing why not."""
    out: dict[str, Any] = {}

    def visit(node: Any, trie: dict, where: Path) -> None:
        lookup = _lookup(node, where, is_leaf)
        for part, sub in trie.items():
            if part is _OP:
                out[sub] = node
                continue
            entry = None if lookup is None else lookup(part)
            if entry is None:
                here = render(where)
                for path in _ops(sub):
                    out[path] = Absent(here, isinstance(node, Mapping))
                continue
            key, child = entry
            visit(child, sub, (*where, key))

    visit(tree, _trie({p: p for p in paths}), ())
    return out


def _ops(trie: dict) -> list[Any]:
    found = [trie[_OP]] if _OP in trie else []
    for part, sub in trie.items():
        if part is not _OP:
            found.extend(_ops(sub))
    return found


def edit_paths(tree: Any, ops: Mapping[str, Put | _Drop], *, is_leaf: IsLeaf = None) -> Any:
    """A copy of ``tree`` with each path set (``Put``) or removed (``DROP``).

    ``DROP`` of a mapping key removes the key, and a mapping that this empties
    is removed from its parent mapping in turn; in an ``OrderedDict`` or any
    other container the leaf becomes ``None``. ``DROP`` of an absent path does
    nothing. ``Put`` at an absent path creates the missing keys, which requires
    every missing part to be a mapping key.
    """

    def visit(node: Any, trie: dict, where: Path) -> Any:
        lookup = _lookup(node, where, is_leaf)
        if lookup is None:
            raise ValueError(
                f"path {render(where)!r} is a leaf of type {type(node).__name__}, but the "
                f"edit needs keys below it: {sorted(trie)[:3]}."
            )
        is_mapping = isinstance(node, Mapping)
        drops_keys = is_mapping and not isinstance(node, OrderedDict)
        changes: dict[Any, Any] = {}
        for part, sub in trie.items():
            if part is _OP:
                continue
            entry = lookup(part)
            if entry is None and all(op is DROP for op in _ops(sub)):
                continue  # Nothing to remove.
            if entry is None and not is_mapping:
                raise ValueError(
                    f"cannot create {render(where) + '/' if where else ''}{part!s}: its "
                    f"parent is a {type(node).__name__}, and only mappings get new keys."
                )
            key, child = entry if entry is not None else (_new_key(node, part), None)
            op = sub.get(_OP)
            if op is DROP:
                changes[key] = _REMOVE if drops_keys else None
            elif isinstance(op, Put):
                changes[key] = op.value
            else:
                if entry is None:
                    child = _new_mapping(node, [], where)
                new = visit(child, sub, (*where, key))
                if new is child:
                    continue
                emptied = isinstance(child, Mapping) and len(child) > 0 and len(new) == 0
                changes[key] = _REMOVE if (drops_keys and emptied) else new
        return _replace(node, changes, where)

    return visit(tree, _trie(ops), ())


_REMOVE = object()


def _replace(node: Any, changes: dict[Any, Any], where: Path) -> Any:
    if not changes:
        return node
    if isinstance(node, Mapping):
        items = [(k, changes.pop(k, v)) for k, v in node.items()]
        items += list(changes.items())
        return _new_mapping(node, [(k, v) for k, v in items if v is not _REMOVE], where)
    if type(node) in (list, tuple):
        return type(node)(changes.get(i, child) for i, child in enumerate(node))
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    values = [changes.get(keypath_to_path(kp)[0], child) for kp, child in flat]
    return jax.tree_util.tree_unflatten(treedef, values)


def _new_mapping(like: Mapping, items: list[tuple[Any, Any]], where: Path) -> Mapping:
    """A mapping of ``like``'s type holding ``items``, in order."""
    if type(like) is dict:
        return dict(items)
    if isinstance(like, defaultdict):
        return defaultdict(like.default_factory, items)
    try:
        return cast(Any, type(like))(dict(items))  # A Mapping subclass: its own signature.
    except Exception as e:  # Only the mapping's own constructor knows what it accepts.
        raise TypeError(
            f"cannot rebuild the {type(like).__name__} at {render(where)!r} from a dict "
            f"({e}); use dict, FrozenDict, OrderedDict or nnx.State mappings."
        ) from e


def _new_key(mapping: Mapping, part: str) -> str | int:
    """The key for a re-created path part: ``int`` where the mapping's keys are ints.

    ``dedupe`` may remove every key of a mapping of list indices (an NNX State of
    an ``nnx.List``); the rendered part alone cannot say it was an ``int``, the
    siblings can.
    """
    as_int = _as_int(part)
    if as_int is not None and mapping and all(type(k) is int for k in mapping):
        return as_int
    return part
