"""``Tied`` nodes inside a larger tree, e.g. a train state ``{"params": Tied,
"opt_state": optax state whose mu and nu are Tieds too}``.

Saving expands each ``Tied`` into its full tree and records its ties under its
path, so the checkpoint alone holds every tie; restoring into a target with
``Tied`` nodes wraps the restored full trees back into ``Tied``s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxshare.core.alias import AliasMap
from jaxshare.core.edit import Put, edit_paths, get_paths
from jaxshare.core.naming import NamingRecord
from jaxshare.core.paths import Path, flatten_with_paths, render
from jaxshare.core.tie import dedupe
from jaxshare.core.tied import Tied

__all__ = ["expand", "tied_nodes", "wrap"]


def _is_tied(x: Any) -> bool:
    return isinstance(x, Tied)


def tied_nodes(tree: Any, /) -> list[tuple[Path, Tied]]:
    """The ``Tied`` nodes of ``tree`` with their paths, in flatten order."""
    return [(p, node) for p, node in flatten_with_paths(tree, is_leaf=_is_tied) if _is_tied(node)]


def expand(tree: Any, /) -> tuple[Any, AliasMap]:
    """``tree`` with each ``Tied`` replaced by its full tree, and their ties
    with paths from the root of ``tree``.

    >>> import jax.numpy as jnp
    >>> from jaxshare import tie
    >>> w = jnp.ones(2)
    >>> full, ties = expand({"params": tie({"a": w, "b": w}), "step": 0})
    >>> full["params"]["b"] is full["params"]["a"], ties
    (True, AliasMap({'params/b': 'params/a'}))
    """
    if isinstance(tree, Tied):
        return tree.tree, tree.alias_map
    nodes = tied_nodes(tree)
    if not nodes:
        return tree, AliasMap()
    aliases: dict[str, str] = {}
    transforms: dict[str, Any] = {}
    naming: dict[str, Any] = {}
    implicit: set[str] = set()
    computed: set[str] = set()  # (The naming records' implicit leaves.)
    for path, node in nodes:
        prefixed = node.alias_map.rename(_prefixer(render(path)))
        aliases.update(prefixed)
        transforms.update(prefixed.transforms)
        implicit |= prefixed.implicit
        naming.update(prefixed.naming or {})
        computed |= prefixed.naming.implicit if prefixed.naming else frozenset()
    full = edit_paths(tree, {render(p): Put(node.tree) for p, node in nodes})
    record = NamingRecord(naming, implicit=computed) if naming else None
    return full, AliasMap(aliases, transforms=transforms, naming=record, implicit=implicit)


def _prefixer(prefix: str) -> Callable[[str], str]:
    return lambda path: f"{prefix}/{path}"


def wrap(full: Any, like: Any, /) -> Any:
    """``full`` (a restored expanded tree) with each subtree where ``like`` has a
    ``Tied`` made a ``Tied`` again, with that node's alias map."""
    nodes = tied_nodes(like)
    subtrees = get_paths(full, [render(p) for p, _ in nodes])
    return edit_paths(
        full,
        {render(p): Put(Tied(*dedupe(subtrees[render(p)], node.alias_map))) for p, node in nodes},
    )
