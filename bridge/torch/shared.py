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
strides, dtype and device: a :class:`jaxshare.internal.Extent`, or a tuple that
is equal exactly when the extents are), or by ``ds_id`` when it has one.

It is held to 1.5x DeepSpeed's time (``benchmarks/bridge_convert.py``), so a
module whose every submodule saves its state as ``torch.nn.Module`` does (no
``state_dict`` hooks, none of the three saving methods overridden) is walked here
in ``state_dict()``'s own order, without the ``OrderedDict``, metadata and hook
loops ``state_dict()`` builds at every submodule; any other module is asked for
its ``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch.nn import Module

from jaxshare.internal import Extent, Perm, memory_ties

__all__ = ["shared_params", "state_dict_of", "storage_key", "tensor_ties"]

_STRIDED = torch.strided
# What `Module.state_dict()` runs on every submodule; a class overriding none of them
# saves exactly `_parameters`, then the persistent `_buffers`, then its children's.
_MODULE_SAVING = (Module.state_dict, Module._save_to_state_dict, Module.get_extra_state)


def storage_key(tensor: Any, /, *, extent: bool = False) -> Hashable | None:
    """What makes two tensors one: ``None`` for values that can never be tied.

    ZeRO-3 parameters are keyed by their ``ds_id`` (their data is a gathered
    placeholder). Zero-element tensors are never tied by address, which means
    nothing for them, and neither are tensors without readable memory (meta,
    sparse): these are tied only when they are the same object. Any other tensor
    is keyed by its memory: the address of its first element, shape, strides,
    dtype and device.

    Args:
      tensor: any value; only tensors have a key.
      extent: key memory by a :class:`jaxshare.internal.Extent`, which
        ``memory_ties(..., views=True)`` needs to find permuted views. Without
        it, by a plain tuple, equal exactly when the extents are and a fraction
        of the cost to build and hash.

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
    if tensor.is_meta or tensor.layout is not _STRIDED or not tensor.numel():
        return ("object", id(tensor))
    device = None if tensor.is_cpu else tensor.device  # (`.device` is slow to build)
    if not extent:
        # Strides in elements and the dtype itself: with the dtype equal, the
        # same as the extent's byte strides, dtype name and item size.
        return (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, device)
    size = tensor.element_size()
    return Extent(
        tensor.data_ptr(),
        tuple(tensor.shape),
        tuple(s * size for s in tensor.stride()),
        str(tensor.dtype),
        size,
        None if device is None else str(device),
    )


def _save_like_module(module: Module, prefix: str, destination: dict[str, Any]) -> bool:
    """``module.state_dict(destination=destination, prefix=prefix, keep_vars=True)``
    for a module tree that saves as ``Module`` does; ``False`` (``destination``
    partly filled) at the first submodule that does not (a ``state_dict`` hook, or
    a saving method overridden, by its class or on the object), which only its own
    ``state_dict()`` can answer."""
    cls, own = type(module), module.__dict__  # (`state_dict()` calls what `own` holds)
    if (
        module._state_dict_pre_hooks
        or module._state_dict_hooks
        or "state_dict" in own
        or "_save_to_state_dict" in own
        or cls.state_dict is not _MODULE_SAVING[0]
        or cls._save_to_state_dict is not _MODULE_SAVING[1]
        or cls.get_extra_state is not _MODULE_SAVING[2]
    ):
        return False
    # `Module._save_to_state_dict`, then the children, as `Module.state_dict`.
    for name, param in module._parameters.items():
        if param is not None:
            destination[prefix + name] = param
    if module._buffers:
        transient = module._non_persistent_buffers_set
        for name, buf in module._buffers.items():
            if buf is not None and name not in transient:
                destination[prefix + name] = buf
    for name, child in module._modules.items():
        if child is not None and not _save_like_module(child, prefix + name + ".", destination):
            return False
    return True


def state_dict_of(module_or_state_dict: Any, arg: str = "module_or_state_dict") -> dict[str, Any]:
    """The state dict of a module (keeping ``Parameter`` objects, so ``ds_id``
    survives), or a mapping checked to be one.

    A module's is ``module.state_dict(keep_vars=True)``: the same names, order
    and objects, but built without ``state_dict()``'s ``OrderedDict`` and
    metadata wherever every submodule saves as ``torch.nn.Module`` does.

    >>> bn = torch.nn.BatchNorm1d(2)
    >>> list(state_dict_of(bn)) == list(bn.state_dict()), state_dict_of(bn)["weight"] is bn.weight
    (True, True)
    """
    if isinstance(module_or_state_dict, Module):
        state: dict[str, Any] = {}
        if _save_like_module(module_or_state_dict, "", state):
            return state
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
    keys = {name: storage_key(t, extent=True) for name, t in state.items()}
    found = memory_ties(keys, views=True)
    if found.overlaps:
        name, other = found.overlaps[0]
        raise ValueError(
            f"{name!r} and {other!r} share memory but neither is the other or a "
            "permutation of it, so the file cannot store that memory once; "
            f"`.clone()` one of them (e.g. state_dict[{name!r}] = "
            f"state_dict[{name!r}].clone())."
        )
    return found.aliases, found.transforms
