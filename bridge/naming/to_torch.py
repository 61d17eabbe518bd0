"""``to_torch``: Flax variables as a PyTorch state dict, every tie one tensor again.

Names and axis orders come from the rules (or from a target module, ``like=``); the
ties from the alias map, arrays that are one object, or an NNX module's shared
Variables. A tie whose permutations cancel between the two sides (``kernel ==
embedding.T`` going back to two ``weight`` s of one axis order) is the very same
tensor object under both names, so ``load_state_dict(strict=True)`` works and
``torch.save`` writes one storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from bridge.layouts.layout import Layout, layout_rules
from bridge.layouts.rules import RulesArg
from bridge.naming.torch_naming import (
    TorchNaming,
    flax_layout,
    flax_variables,
    model_config,
    name_leaves,
)
from bridge.torch.tensors import to_tensor
from jaxshare import AliasMap
from jaxshare.internal import LAYER, Perm, compose, inverse, parallel_map, per_layer
from jaxshare.stream import ProgressFn

if TYPE_CHECKING:
    from bridge.sources.registry import Source

__all__ = ["to_torch"]


def _torch_tensors(
    plan: TorchNaming, progress: ProgressFn | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of ``plan``: stored leaves first, then every alias as the very
    tensor of its canonical (axis orders cancel), a permuted view of it, or -- when
    the canonical has no PyTorch name -- its own tensor."""
    amap = plan.alias_map
    made: dict[tuple[str, Perm | None], torch.Tensor] = {}

    def source(path: str) -> tuple[str, Perm | None]:
        """The stored path ``path`` holds, and the permutation of it into torch axis order."""
        key, perm = plan.names[path]
        stored, flax_perm = (amap[path], amap.transform(path)) if path in amap else (path, None)
        # torch = transpose(flax value, inverse(perm)); flax value = transpose(stored, flax_perm).
        return stored, compose(inverse(perm), flax_perm)

    stored = [p for p in plan.order if p not in amap]

    def convert(path: str) -> torch.Tensor:
        return to_tensor(plan.leaves[path].value, source(path)[1], key=plan.names[path][0])

    by_path: dict[str, torch.Tensor] = {}
    tensors = parallel_map(convert, stored)
    for done, (path, tensor) in enumerate(zip(stored, tensors, strict=True), 1):
        by_path[path] = made[source(path)] = tensor
        if progress is not None:
            progress(done, len(plan.order), plan.names[path][0], _nbytes(tensor))
    for done, path in enumerate([p for p in plan.order if p in amap], len(stored) + 1):
        key = plan.names[path][0]
        stored_path, total = source(path)
        tensor = made.get((stored_path, total))
        if tensor is None:
            base = made.get(source(stored_path)) if stored_path in plan.names else None
            if base is not None:  # A view of the canonical's tensor: one memory.
                perm = compose(total, inverse(source(stored_path)[1]))
                assert perm is not None  # (else `made` held it)
                tensor = base.permute(perm)
            else:
                tensor = to_tensor(plan.leaves[stored_path].value, total, key=key)
            made[stored_path, total] = tensor
        by_path[path] = tensor
        if progress is not None:
            progress(done, len(plan.order), key, _nbytes(tensor))
    return {plan.names[path][0]: by_path[path] for path in plan.order}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _apply_torch_map(out: dict[str, torch.Tensor], torch_map: AliasMap | None) -> None:
    """Puts the aliases of a PyTorch-named (DeepSpeed) map into ``out``, tied."""
    for alias, canonical in (torch_map or {}).items():
        if canonical not in out:
            raise ValueError(
                f"`alias_map` ties {alias!r} to {canonical!r}, which the converted weights "
                f"do not have (they have e.g. {list(out)[:3]})."
            )
        held, value = out.get(alias), out[canonical]
        if held is not None and held is not value:
            same = held.shape == value.shape and held.dtype == value.dtype
            if not (same and torch.equal(held, value)):
                raise ValueError(
                    f"`alias_map` ties {alias!r} to {canonical!r}, but they hold different "
                    "values; the map does not belong to these weights."
                )
        out[alias] = value


def _per_layer(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``out`` with each stack of layers (a name with ``{i}``) as one view per layer,
    in place of the stack; a stack that is another's very tensor gives its layers'."""
    if not any(LAYER in name.split(".") for name in out):
        return out
    views: dict[int, tuple[torch.Tensor, ...]] = {}  # id(stack) -> its layers, made once
    result: dict[str, torch.Tensor] = {}
    for name, stack, k in per_layer(out, lambda name: out[name].shape[0]):
        if k is None:
            result[name] = out[name]
        else:
            result[name] = views.setdefault(id(out[stack]), out[stack].unbind(0))[k]
    return result


def to_torch(
    variables: Any,
    alias_map: Mapping[str, str] | None = None,
    /,
    *,
    like: Source | None = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, torch.Tensor]:
    """Flax variables as a PyTorch state dict, every tie one tensor again.

    The inverse of :func:`to_flax`: ``to_torch(*to_flax(sd))`` equals ``sd`` bit for
    bit, names and dtypes included, and each alias is the very same tensor object
    as its canonical wherever the axis orders cancel (an Embedding ``weight`` reused as
    a Linear ``weight``), so ``load_state_dict(strict=True)`` works and
    ``torch.save`` stores one storage. A tie whose axis orders do not cancel comes back
    as a permuted view of its canonical: one memory, another shape.

    Tensors share the arrays' memory where no permutation is needed and an array
    lives on one CPU device (clone them before modifying them in place); other
    tensors are contiguous copies.

    Args:
      variables: linen variables or a params mapping (``FrozenDict``, ``nnx.State``
        included), a ``jaxshare.Tied``, or an ``nnx.Module`` -- whose shared
        Variables, which ``nnx.state`` drops, come back under every name.
      alias_map: the ties, in Flax paths (``to_flax``'s map, a checkpoint's) or as
        PyTorch names (DeepSpeed's ``shared_params``). Arrays that are one object
        in ``variables`` are tied even without it.
      like: the target module or state dict: the result has exactly its names,
        shapes checked; its layer types settle axis orders names cannot (a square
        GPT-2 ``Conv1D`` weight). Without it, names and axis orders come from the
        rules alone, which invert :func:`to_flax` of a state dict exactly.
      rules: a :class:`bridge.Rules` or a sequence of :class:`bridge.Rule`.
      layout: the Flax layout ``variables`` are in: ``"jaxshare"`` or
        ``"transformers-flax"`` (a transformers 4.57 Flax model's ``params``; its
        family quirks come from ``like``'s config, when ``like`` is a
        transformers model). Default: where ``like`` is a transformers model, the
        layout its config and the tree show (:func:`bridge.naming.torch_naming.flax_layout`:
        no collection at the top, or a linen ``params`` collection alone whose leaves
        ``like`` holds in that layout's names and shapes, is transformers-flax), else
        jaxshare's. A naming record in the alias map names every leaf exactly
        whatever the layout.
      progress: ``progress(done, total, name, nbytes)`` after each tensor.

    Raises:
      ValueError: a canonical path missing, an alias of the wrong shape, two leaves
        with one PyTorch name, or (with ``like``) names that do not match.

    >>> import jax.numpy as jnp
    >>> emb = jnp.arange(8.0).reshape(4, 2)
    >>> variables = {"params": {"wte": {"embedding": emb}}}
    >>> sd = to_torch(variables, {"params/head/kernel": "params/wte/embedding"})
    >>> sd["head.weight"] is sd["wte.weight"], sd["head.weight"].shape
    (False, torch.Size([2, 4]))
    >>> from jaxshare import AliasMap
    >>> tied = AliasMap({"params/head/kernel": "params/wte/embedding"},
    ...                 transforms={"params/head/kernel": (1, 0)})
    >>> sd = to_torch(variables, tied)
    >>> sd["head.weight"] is sd["wte.weight"]
    True
    """
    tree, amap, torch_map = flax_variables(variables, alias_map)
    config = model_config(like)
    found = flax_layout(tree, amap, layout=layout, config=config, rules=rules, like=like)
    plan = name_leaves(tree, amap, like, layout_rules(found, rules, config), torch_map or ())
    out = _torch_tensors(plan, progress)
    _apply_torch_map(out, torch_map)
    for alias, canonical in plan.fills.items():  # Names `like` ties that no leaf holds.
        out[alias] = out[canonical]
    out = _per_layer(out)
    # With `like`, every name is placed or filled by the map: give them in its order.
    return out if plan.like_keys is None else {k: out[k] for k in plan.like_keys}
