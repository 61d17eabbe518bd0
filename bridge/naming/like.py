"""The Flax tree a conversion aims at (``like=``), and the shapes of NNX objects.

A target is any pytree of arrays, ``jax.ShapeDtypeStruct`` or NNX Variables --
linen variables, a params dict, an ``nnx.State`` -- or an ``nnx.Module`` (its
``nnx.state``). It is read once into ``{path: leaf}`` and rebuilt with new
leaves, so the result has exactly its structure and types. Paths are tuples of
``str`` keys (a list index ``0`` is ``"0"``, as a PyTorch name spells it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax

from jaxshare import find_shared
from jaxshare.internal import (
    is_nnx_module,
    is_variable,
    keypath_to_path,
    render_part,
    split,
    variable_value,
)

__all__ = ["LikeTree", "like_tree"]

FlaxPath = tuple[str, ...]


def _placement(leaf: Any) -> Any:
    """The sharding a leaf asks for; ``None`` for the default device."""
    sharding = getattr(variable_value(leaf), "sharding", None)
    if sharding is None:
        return None
    default = {jax.devices()[0]}
    if isinstance(sharding, jax.sharding.SingleDeviceSharding) and sharding.device_set == default:
        return None
    return sharding


@dataclass(frozen=True)
class LikeTree:
    """A target tree taken apart.

    Attributes:
      treedef: its structure (NNX Variables are leaves).
      leaves: ``[(path, leaf)]`` in flatten order.
      shared: ``{path: shape}`` of the paths an NNX graph reaches a shared
        Variable by, which ``nnx.state`` drops: an alias has its place there.
      shapes: ``{path: shape}`` of the leaves that are arrays (or abstract ones).
      index: ``shapes`` and ``shared``: every path a tensor can be placed at.
      shardings: ``{path: sharding}`` of the leaves placed off the default device.
    """

    treedef: Any
    leaves: list[tuple[FlaxPath, Any]]
    shared: dict[FlaxPath, tuple[int, ...]] = field(default_factory=dict)
    shapes: dict[FlaxPath, tuple[int, ...]] = field(init=False)
    index: dict[FlaxPath, tuple[int, ...]] = field(init=False)
    shardings: dict[FlaxPath, Any] = field(init=False)

    def __post_init__(self) -> None:
        values = [(p, variable_value(v)) for p, v in self.leaves]
        shapes = {
            p: tuple(v.shape) for p, v in values if hasattr(v, "shape") and hasattr(v, "dtype")
        }
        placed = {p: _placement(v) for p, v in self.leaves if p in shapes}
        shardings = {p: s for p, s in placed.items() if s is not None}
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "index", {**self.shared, **shapes})
        object.__setattr__(self, "shardings", shardings)

    def build(self, values: Mapping[FlaxPath, Any]) -> Any:
        """The tree with the leaf at each path of ``values`` replaced (placed as
        the leaf asked, inside its Variable for NNX)."""
        out = []
        for path, leaf in self.leaves:
            if path not in values:
                out.append(leaf)
                continue
            value = values[path]
            if path in self.shardings and getattr(value, "sharding", None) != self.shardings[path]:
                value = jax.device_put(value, self.shardings[path])
            out.append(leaf.replace(value) if is_variable(leaf) else value)
        return jax.tree_util.tree_unflatten(self.treedef, out)


def like_tree(like: Any) -> LikeTree:
    """Takes ``like`` apart; an ``nnx.Module`` stands for its ``nnx.state``, plus
    the paths of its shared Variables that ``nnx.state`` drops."""
    module = like if is_nnx_module(like) else None
    if module is not None:
        from flax import nnx

        like = nnx.state(module)
    flat, treedef = jax.tree_util.tree_flatten_with_path(like, is_leaf=is_variable)
    leaves = [(_str_path(keypath_to_path(kp)), leaf) for kp, leaf in flat]
    shared: dict[FlaxPath, tuple[int, ...]] = {}
    if module is not None:
        kept = dict(leaves)
        for alias, canonical in find_shared(module).items():  # (Rendered: split back.)
            value = variable_value(kept.get(split(canonical)))
            if split(alias) not in kept and hasattr(value, "shape"):
                shared[split(alias)] = tuple(value.shape)
    return LikeTree(treedef, leaves, shared)


def _str_path(path: tuple[str | int, ...]) -> FlaxPath:
    """A key path with every key a ``str``, as rendering spells it (``0`` is ``"0"``)."""
    return tuple(render_part(part, path) for part in path)
