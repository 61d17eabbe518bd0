"""How Flax leaves are named in PyTorch: the plan :func:`bridge.to_torch` and
:func:`bridge.torch_plan` share.

Naming reads only paths, shapes, the alias map and its naming record, so this
module never imports torch: ``jaxshare convert ckpt out.safetensors --names
torch`` names an Orbax item's arrays without paying for torch's import. Only
naming after a target module (``like=``) imports it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge._match import place
from bridge._names import Rules, torch_name
from jaxshare import AliasMap, ArrayInfo, NamingRecord, dedupe
from jaxshare.internal import (
    Perm,
    is_nnx_state,
    is_variable,
    nest,
    permute_shape,
    render,
    variable_value,
)

if TYPE_CHECKING:
    from bridge._to_flax import Source

__all__ = ["TorchPlan", "plan_torch", "plan_torch_names"]


_NNX_COLLECTIONS = {"Param": "params", "BatchStat": "batch_stats"}


@dataclass(frozen=True)
class _FlaxLeaf:
    path: str  # full rendered path
    parts: tuple[str, ...]  # path without the collection
    collection: str | None  # None: the tree has no collections
    value: Any  # the array (a _Shape for an alias the tree does not hold)


def _flax_leaves(tree: Any) -> list[_FlaxLeaf]:
    """Every array of ``tree`` in insertion order, with its collection."""
    # Linen variables have their collections at the top; NNX Variables carry theirs.
    top = list(tree) if isinstance(tree, Mapping) else []
    collections = (
        not is_nnx_state(tree)
        and bool(top)
        and ("params" in top or all(k in {"batch_stats", "buffers"} for k in top))
    )
    out: list[_FlaxLeaf] = []

    def visit(node: Any, parts: tuple[Any, ...]) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                visit(child, (*parts, key))
            return
        if node is None:
            return
        path = render(parts)
        rendered = tuple(path.split("/"))
        if is_variable(node):
            collection = _NNX_COLLECTIONS.get(type(node).__name__, type(node).__name__.lower())
            value = variable_value(node)
        elif collections:
            collection, rendered, value = rendered[0], rendered[1:], node
        else:
            collection, value = None, node
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"`variables` leaf {path!r} is a {type(value).__name__}, not an array.")
        out.append(_FlaxLeaf(path, rendered, collection, value))

    visit(tree, ())
    return out


@dataclass(frozen=True)
class TorchPlan:
    names: dict[str, tuple[str, Perm | None]]  # flax path -> (torch key, torch->flax perm)
    leaves: dict[str, _FlaxLeaf]  # flax path -> leaf; absent aliases hold a _Shape
    alias_map: AliasMap
    order: list[str]  # flax paths in output order
    like_keys: list[str] | None  # the output's names, in order, given `like`


def plan_torch(
    tree: Any,
    amap: AliasMap,
    like: Source | None,
    rules: Rules,
    filled_by_map: Collection[str] = (),
) -> TorchPlan:
    """Names every leaf (and alias) of ``tree``. With ``like``, its names are the
    output's: each must be placed, but for ``filled_by_map`` (the aliases of a
    PyTorch-named map, filled afterwards)."""
    flat = _flax_leaves(tree)
    leaves = {leaf.path: leaf for leaf in flat}
    missing = sorted({c for c in amap.values() if c not in leaves})
    if missing:
        raise ValueError(
            f"`variables` has no array at canonical path(s) {missing[:5]} named by the alias "
            "map; was the map made for another tree?"
        )
    held = [a for a in amap if a in leaves]
    if held:  # The tree holds aliases too: each must be its canonical (transformed).
        try:
            dedupe(
                tree,
                AliasMap(
                    {a: amap[a] for a in held}, transforms={a: amap.transform(a) for a in held}
                ),
            )
        except ValueError as e:
            raise ValueError(
                f"`variables` and the alias map disagree, so one PyTorch tensor cannot hold "
                f"both names of a tie ({e}). Were the copies trained apart? Train with a "
                "`jaxshare.Tied`, or pass an alias map without these ties."
            ) from None
    for alias, canonical in amap.items():
        c = leaves[canonical]
        shape = permute_shape(tuple(c.value.shape), amap.transform(alias))
        if alias not in leaves:
            parts = tuple(alias.split("/"))
            if c.parts != tuple(canonical.split("/")):  # The tree has collections.
                collection, parts = parts[0], parts[1:]
            else:
                collection = c.collection
            leaves[alias] = _FlaxLeaf(alias, parts, collection, _Shape(shape))
    present = {leaf.path for leaf in flat}
    order = [leaf.path for leaf in flat] + sorted(a for a in amap if a not in present)
    names: dict[str, tuple[str, Perm | None]] = {}
    like_keys = None
    if like is None:
        record = amap.naming or NamingRecord()
        for path in order:
            leaf = leaves[path]
            ndim = len(leaf.value.shape)
            recorded = record.get(path)
            if recorded is None:
                names[path] = torch_name(leaf.parts, ndim, leaf.collection, rules)
            elif recorded.permute is not None and len(recorded.permute) != ndim:
                raise ValueError(
                    f"{path!r} has shape {tuple(leaf.value.shape)}, but the naming record "
                    f"permutes it by {list(recorded.permute)}: the tree is not the one the "
                    "record was made for."
                )
            else:
                names[path] = recorded
    else:
        # `like` is a module or a state dict: only this branch needs torch.
        from bridge._flax_naming import torch_leaves
        from bridge._open import open_source

        torch_side = torch_leaves(open_source(like, rules, arg="like"), rules, guess=False)
        index = {p: tuple(leaf.value.shape) for p, leaf in leaves.items()}
        slots, problems = place(
            torch_side, index, rules, optional=filled_by_map, what="`variables`"
        )
        claimed = {s.path for s in slots.values()}
        unclaimed = [p for p in order if p not in claimed and p not in amap]
        if unclaimed:
            problems.append(f"leaves of `variables` with no name in `like`: {unclaimed[:10]}")
        if problems:
            raise ValueError(
                "cannot name the Flax leaves after `like`:\n  "
                + "\n  ".join(problems)
                + "\nCheck that `variables` belong to this model, or pass `rules=`."
            )
        names = {s.path: (key, s.perm) for key, s in slots.items()}
        order = [slots[leaf.key].path for leaf in torch_side if leaf.key in slots]
        like_keys = [leaf.key for leaf in torch_side]
    seen: dict[str, str] = {}
    for path in order:
        key = names[path][0]
        if key in seen:
            raise ValueError(
                f"{path!r} and {seen[key]!r} both map to the PyTorch name {key!r}; pass "
                "`rules=` (or `like=`) that tell them apart."
            )
        seen[key] = path
    return TorchPlan(names, leaves, amap, order, like_keys)


@dataclass(frozen=True)
class _Shape:
    """Stands in for an alias's array that the tree does not hold."""

    shape: tuple[int, ...]


def plan_torch_names(
    stored: Mapping[str, ArrayInfo], alias_map: AliasMap, like: Source | None, rules: Rules
) -> tuple[dict[str, tuple[str, Perm | None]], list[str]]:
    """The PyTorch name and layout of every stored Flax path and alias, from
    metadata alone: ``({flax path: (torch name, torch -> flax perm)}, flax paths in
    output order)``."""
    plan = plan_torch(nest(dict(stored)), alias_map, like, rules)
    return plan.names, plan.order
