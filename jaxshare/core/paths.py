"""Paths: tuples of keys inside the library, ``'/'``-joined strings at its edges.

A path is a tuple of ``str | int`` parts taken from a ``jax.tree_util`` key path
(``DictKey``, ``SequenceKey``, ``GetAttrKey``, ``FlattenedIndexKey``) or an NNX
graph. It is rendered the way ``flax.traverse_util.flatten_dict(sep='/')`` does:
``('params', 'wte', 'embedding')`` becomes ``'params/wte/embedding'``.

Between the stages of a conversion paths stay tuples; they are rendered at the
edges -- an ``AliasMap``, a ``NamingRecord``, a plan's output names, JSON,
messages -- and a tree's paths are rendered to be matched, never parsed. A
rendered path is split back in one place, :func:`split`, where paths come back
from an edge and a tree must be rebuilt from them: ``retie`` re-creating the
mapping keys ``dedupe`` removed, :func:`nest` building a tree from an item's
paths, an alias map's alias that the tree does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "Path",
    "SEP",
    "children",
    "flatten_with_paths",
    "keypath_to_path",
    "nest",
    "render",
    "render_part",
    "split",
]

Path = tuple[str | int, ...]
SEP = "/"


_GETTERS: dict[type, Callable[[Any], Any]] = {}


def _part(key: Any) -> Any:
    """The raw key inside one ``jax.tree_util`` key entry."""
    if not _GETTERS:  # Filled on first use: rendering paths needs no JAX.
        from jax import tree_util as tu

        _GETTERS.update(
            {
                tu.DictKey: lambda k: k.key,
                tu.SequenceKey: lambda k: k.idx,
                tu.GetAttrKey: lambda k: k.name,
                tu.FlattenedIndexKey: lambda k: k.key,
            }
        )
    getter = _GETTERS.get(type(key))
    return key if getter is None else getter(key)


def keypath_to_path(keypath: tuple[Any, ...]) -> Path:
    """Converts a ``jax.tree_util`` key path to a tuple path.

    >>> import jax
    >>> [(kp, _)] = jax.tree_util.tree_flatten_with_path({"a": [0]})[0]
    >>> keypath_to_path(kp)
    ('a', 0)
    """
    return tuple(_part(k) for k in keypath)


def render(path: Path) -> str:
    """Renders a tuple path as a ``'/'``-joined string.

    Raises:
      ValueError: a part contains ``'/'`` (the rendering would be ambiguous) or
        is neither ``str`` nor ``int``.

    >>> render(("params", "layers", 0, "kernel"))
    'params/layers/0/kernel'
    """
    return SEP.join([render_part(part, path) for part in path])


def render_part(part: Any, path: Path) -> str:
    """One part of ``path`` as a string; errors name the whole ``path``."""
    if type(part) is str:
        if SEP in part:
            raise ValueError(
                f"key {part!r} at path {_repr(path)} contains {SEP!r}, which jaxshare "
                f"uses to join paths; rename the key (e.g. replace {SEP!r} with '.')."
            )
        return part
    if isinstance(part, int) and not isinstance(part, bool):
        return str(part)
    raise ValueError(
        f"key {part!r} of type {type(part).__name__} at path {_repr(path)} cannot "
        "be rendered as a path part; jaxshare paths take str and int keys."
    )


def split(path: str) -> tuple[str, ...]:
    """Splits a rendered path into its string parts (the inverse of :func:`render`).

    >>> split("params/layers/0/kernel")
    ('params', 'layers', '0', 'kernel')
    """
    return tuple(path.split(SEP))


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rendered paths back to nested dicts, keeping order: ``{'a/b': x}`` ->
    ``{'a': {'b': x}}``.

    Raises:
      ValueError: a path that runs through another path's leaf, or one given twice.

    >>> nest({"params/a/kernel": 1, "params/b": 2})
    {'params': {'a': {'kernel': 1}, 'b': 2}}
    """
    root: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, last = split(path)
        node = root
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(
                    f"{path!r} needs {SEP.join(parents[: i + 1])!r} to hold keys, but it is a leaf."
                )
        if last in node:
            raise ValueError(f"{path!r} would be written twice.")
        node[last] = value
    return root


def _repr(path: Path) -> str:
    return "(" + ", ".join(repr(p) for p in path) + ("," if len(path) == 1 else "") + ")"


def flatten_with_paths(
    tree: Any, /, *, is_leaf: Callable[[Any], bool] | None = None
) -> list[tuple[Path, Any]]:
    """Flattens ``tree`` into ``(path, leaf)`` pairs in ``jax.tree_util`` order."""
    import jax

    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [(keypath_to_path(kp), leaf) for kp, leaf in leaves]


def children(node: Any) -> list[tuple[str | int, Any]] | None:
    """The immediate ``(key, child)`` pairs of one container node; ``None`` for a leaf.

    Mappings give their items (``None`` values included); every other pytree
    node is flattened one level with ``jax.tree_util``, so ``None`` children of
    lists, tuples and dataclasses are visible too.

    >>> children({"b": 1, "a": None})
    [('b', 1), ('a', None)]
    >>> children((1, None)), children(3)
    ([(0, 1), (1, None)], None)
    """
    if isinstance(node, Mapping):
        return list(node.items())
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if len(flat) == 1 and not flat[0][0]:
        return None
    return [(_part(keypath[0]), child) for keypath, child in flat]
