"""Walking ``flax.nnx`` graphs: every path to every Variable and array leaf.

``nnx.state`` keeps a shared Variable (or a Variable under a shared Module) once,
at the first path of NNX's depth-first traversal (attributes in sorted order)
and drops the others. ``find_shared`` needs all of them, so this walk visits a
shared node again under each path that reaches it, in the same order NNX uses:
the first path it yields for a Variable is the one ``nnx.state`` keeps.

``flax.nnx`` is only consulted when it has already been imported: a tree cannot
hold NNX objects otherwise, and ``import jaxshare`` stays light.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from jaxshare.core.paths import Path

if TYPE_CHECKING:
    from jaxshare.core.leafkey import KeyFn

__all__ = [
    "is_nnx_module",
    "is_nnx_root",
    "is_nnx_state",
    "is_variable",
    "leaf_key",
    "variable_value",
    "walk",
]


def _nnx() -> Any | None:
    return sys.modules.get("flax.nnx")


def is_nnx_root(tree: Any) -> bool:
    """Whether ``tree`` is walked as an NNX graph: an NNX graph node (Module,
    Optimizer, ...), an ``nnx.State``, or a dict/list/tuple holding one directly
    (``{"model": model, "ema": ema}``)."""
    nnx = _nnx()
    if nnx is None:
        return False
    from flax.nnx import graphlib

    def is_node(x: Any) -> bool:
        return type(x) in graphlib.GRAPH_REGISTRY or isinstance(x, nnx.State)

    if is_node(tree):
        return True
    if isinstance(tree, dict):
        return any(is_node(v) for v in tree.values())
    if type(tree) in (list, tuple):
        return any(is_node(v) for v in tree)
    return False


def is_variable(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.Variable`` (``False`` when NNX was never imported)."""
    nnx = _nnx()
    return nnx is not None and isinstance(x, nnx.Variable)


def is_nnx_module(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.Module``."""
    nnx = _nnx()
    return nnx is not None and isinstance(x, nnx.Module)


def is_nnx_state(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.State``."""
    nnx = _nnx()
    return nnx is not None and isinstance(x, nnx.State)


def variable_value(x: Any) -> Any:
    """The array inside a Variable, or ``x`` itself."""
    return x.get_value() if is_variable(x) else x


def leaf_key(keyfn: KeyFn, by: str) -> KeyFn:
    """NNX keying: by identity a Variable is shared as the Variable object (what
    NNX itself tracks); by buffer, through the array it holds."""
    if by == "identity":
        return lambda leaf, where: id(leaf) if is_variable(leaf) else keyfn(leaf, where)
    return lambda leaf, where: keyfn(variable_value(leaf), where)


def walk(root: Any) -> list[tuple[Path, Any]]:
    """All ``(path, leaf)`` pairs under ``root``, a shared node once per path.

    Leaves are Variables and raw arrays; static attributes are skipped. A
    reference back to an ancestor (a cycle) is not followed: its leaves are
    reached through the ancestor.
    """
    from flax import nnx
    from flax.nnx import graphlib

    from jaxshare.core.leafkey import is_array

    out: list[tuple[Path, Any]] = []
    on_stack: set[int] = {id(root)}

    def visit(node: Any, path: Path) -> None:
        impl = graphlib.get_node_impl(node)
        if impl is None:
            return
        for key, child in impl.node_dict(node).items():
            child_path = (*path, cast(str | int, key))  # An attribute name or an index.
            if isinstance(child, nnx.Variable) or is_array(child):
                out.append((child_path, child))
            elif graphlib.is_node(child) and id(child) not in on_stack:
                on_stack.add(id(child))
                visit(child, child_path)
                on_stack.discard(id(child))

    if isinstance(root, nnx.Variable) or is_array(root):
        return [((), root)]
    visit(root, ())
    return out
