"""``shared_params``: the tied tensors of a PyTorch module, as DeepSpeed reports them.

DeepSpeed's ``DeepSpeedEngine._get_shared_params`` walks ``named_parameters(
recurse=False)`` and ``named_children()`` and keys each parameter by
``data_ptr()`` (``ds_id`` under ZeRO-3). That walk is wrong in five ways: every
zero-size parameter has ``data_ptr() == 0`` and is reported as tied to the
first one; a view starting at the same address (``b = a[:5]``) is reported as
tied to ``a``; buffers are never looked at; and both walks skip duplicates, so
a module registered twice under one parent, or a parameter registered twice in
one module, loses its second name.

This port keeps DeepSpeed's output -- ``{alias: canonical}`` in PyTorch names,
canonical the first name -- and walks what ``state_dict()`` holds instead:
parameters and persistent buffers, every name a tensor is registered under. A
tensor is keyed by its memory (the address of its first element, shape,
strides, dtype and device: a :class:`jaxshare.internal.Extent`), or by
``ds_id`` when it has one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch

from jaxshare.internal import Extent, Perm, memory_ties

__all__ = ["shared_params", "state_dict_of", "storage_key", "tensor_ties"]


def storage_key(tensor: Any) -> Hashable | None:
    """What makes two tensors one: ``None`` for values that can never be tied.

    ZeRO-3 parameters are keyed by their ``ds_id`` (their data is a gathered
    placeholder). Zero-element tensors are never tied by address, which means
    nothing for them, and neither are tensors without readable memory (meta,
    sparse): these are tied only when they are the same object.

    >>> a = torch.zeros(10)
    >>> storage_key(a) == storage_key(a.view(10)), storage_key(a) == storage_key(a[:5])
    (True, False)
    >>> empty, other = torch.zeros(0), torch.zeros(0)
    >>> storage_key(empty) == storage_key(other), storage_key(empty) == storage_key(empty)
    (False, True)
    """
    if not isinstance(tensor, torch.Tensor):
        return None
    ds_id = getattr(tensor, "ds_id", None)
    if ds_id is not None:
        return ("ds_id", ds_id)
    if tensor.is_meta or tensor.layout is not torch.strided or not tensor.numel():
        return ("object", id(tensor))
    size = tensor.element_size()
    return Extent(
        tensor.data_ptr(),
        tuple(tensor.shape),
        tuple(s * size for s in tensor.stride()),
        str(tensor.dtype),
        size,
        None if tensor.is_cpu else str(tensor.device),  # (`.device` is slow to build)
    )


def state_dict_of(module_or_state_dict: Any, arg: str = "module_or_state_dict") -> dict[str, Any]:
    """The state dict of a module (keeping ``Parameter`` objects, so ``ds_id``
    survives), or a mapping checked to be one."""
    if isinstance(module_or_state_dict, torch.nn.Module):
        return module_or_state_dict.state_dict(keep_vars=True)
    if isinstance(module_or_state_dict, Mapping):
        bad = [k for k in module_or_state_dict if not isinstance(k, str)]
        if bad:
            raise TypeError(f"`{arg}` keys must be str names; got {bad[:3]}.")
        return dict(module_or_state_dict)
    raise TypeError(
        f"`{arg}` must be a torch.nn.Module or a state dict (a mapping of names to "
        f"tensors), got {type(module_or_state_dict).__name__}."
    )


def shared_params(module_or_state_dict: torch.nn.Module | Mapping[str, Any], /) -> dict[str, str]:
    """The tied tensors of a module or state dict: ``{alias: canonical}``.

    The same output as DeepSpeed's ``_get_shared_params`` (which ``zero_to_fp32``
    reads to re-add the names it did not store), right where DeepSpeed is wrong.

    Args:
      module_or_state_dict: a ``torch.nn.Module`` (its ``state_dict()``:
        parameters and persistent buffers, under every name they are registered
        as) or a state dict.

    Returns:
      ``{alias: canonical}``, aliases in ``state_dict()`` order; the canonical of
      each tie is its first name in that order, which is DeepSpeed's choice
      wherever DeepSpeed finds the tie. Non-tensor entries are never tied.

    >>> emb = torch.nn.Embedding(10, 4)
    >>> head = torch.nn.Linear(4, 10, bias=False)
    >>> head.weight = emb.weight
    >>> shared_params(torch.nn.ModuleDict({"wte": emb, "lm_head": head}))
    {'lm_head.weight': 'wte.weight'}
    """
    state = state_dict_of(module_or_state_dict)
    # `state` holds a reference to every tensor for the whole walk, so no address
    # can be freed and reused by another tensor while keys are compared.
    return memory_ties({name: storage_key(value) for name, value in state.items()}).aliases


def tensor_ties(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, str], dict[str, Perm]]:
    """``({alias: canonical}, {alias: permutation})`` of tensors over the same memory.

    Same storage key: an identical alias. Same first element, shape and strides a
    permutation of an earlier tensor's: an alias with that permutation
    (``to_torch`` gives such views). Any other overlap cannot be stored once.

    Raises:
      ValueError: two tensors overlap in memory without one being the other or
        a permutation of it.

    >>> w = torch.zeros(2, 3)
    >>> tensor_ties({"w": w, "w_t": w.t(), "v": w.view(2, 3)})
    ({'w_t': 'w', 'v': 'w'}, {'w_t': (1, 0)})
    """
    found = memory_ties({name: storage_key(t) for name, t in state.items()}, views=True)
    if found.overlaps:
        name, other = found.overlaps[0]
        raise ValueError(
            f"{name!r} and {other!r} share memory but neither is the other or a "
            "permutation of it, so the file cannot store that memory once; "
            f"`.clone()` one of them (e.g. state_dict[{name!r}] = "
            f"state_dict[{name!r}].clone())."
        )
    return found.aliases, found.transforms
