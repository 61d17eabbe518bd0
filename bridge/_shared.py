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
tensor is keyed by its memory (storage, offset, shape, stride, dtype, device),
or by ``ds_id`` when it has one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch

from jaxshare import AliasMap
from jaxshare.internal import Perm

__all__ = ["memory_ties", "shared_params", "state_dict_of", "storage_key", "torch_aliases"]


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
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        None if tensor.is_cpu else tensor.device,  # (`.device` is slow to build)
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
    first: dict[Hashable, str] = {}
    aliases: dict[str, str] = {}
    # `state` holds a reference to every tensor for the whole walk, so no address
    # can be freed and reused by another tensor while keys are compared.
    for name, value in state.items():
        key = storage_key(value)
        if key is None:
            continue
        canonical = first.setdefault(key, name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def torch_aliases(aliases: Any, arg: str) -> AliasMap:
    """A DeepSpeed-style ``{alias: canonical}`` in PyTorch names, checked, as an
    ``AliasMap`` (a PyTorch name is one path part: it has no ``'/'``).

    >>> torch_aliases({"lm_head.weight": "wte.weight"}, "aliases")
    AliasMap({'lm_head.weight': 'wte.weight'})
    """
    if not isinstance(aliases, Mapping):
        raise TypeError(
            f"`{arg}` must be a mapping of PyTorch names, got {type(aliases).__name__}."
        )
    slashed = [k for k in [*aliases, *aliases.values()] if not isinstance(k, str) or "/" in k]
    if slashed:
        raise ValueError(
            f"`{arg}` must name PyTorch tensors ('a.b.weight'); {slashed[0]!r} is not one."
        )
    return aliases if isinstance(aliases, AliasMap) else AliasMap(aliases)


def memory_ties(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, str], dict[str, Perm]]:
    """``({alias: canonical}, {alias: permutation})`` of tensors over the same memory.

    Same storage key: an identical alias. Same storage and offset, shape and
    strides a permutation of an earlier tensor's: an alias with that permutation
    (``to_torch`` gives such views). Any other overlap cannot be stored once.

    Raises:
      ValueError: two tensors overlap in memory without one being the other or
        a permutation of it.

    >>> w = torch.zeros(2, 3)
    >>> memory_ties({"w": w, "w_t": w.t(), "v": w.view(2, 3)})
    ({'v': 'w', 'w_t': 'w'}, {'w_t': (1, 0)})
    """
    aliases = shared_params(state)
    transforms: dict[str, Perm] = {}
    by_storage: dict[Hashable, list[str]] = {}
    for name, t in state.items():
        if name in aliases or not t.numel() or t.is_meta or t.layout != torch.strided:
            continue  # Tied by identity only (see storage_key): shared_params found those.
        by_storage.setdefault((t.untyped_storage().data_ptr(), t.device), []).append(name)
    for names in by_storage.values():
        kept: list[str] = []
        for name in names:
            t = state[name]
            for other in kept:
                perm = _permutation_of(state[other], t)
                if perm is not None:
                    aliases[name], transforms[name] = other, perm
                    break
                if _overlap(state[other], t):
                    raise ValueError(
                        f"{name!r} and {other!r} share memory but neither is the other or a "
                        "permutation of it, so the file cannot store that memory once; "
                        f"`.clone()` one of them (e.g. state_dict[{name!r}] = "
                        f"state_dict[{name!r}].clone())."
                    )
            else:
                kept.append(name)
    return aliases, transforms


def _permutation_of(base: torch.Tensor, t: torch.Tensor) -> Perm | None:
    """``perm`` with ``t`` the very view ``base.permute(perm)``, if there is one."""
    if (
        t.dtype != base.dtype
        or t.ndim != base.ndim
        or t.storage_offset() != base.storage_offset()
        or t.ndim < 2
    ):
        return None
    free = list(range(base.ndim))
    perm = []
    for size, stride in zip(t.shape, t.stride(), strict=True):
        j = next((j for j in free if (base.shape[j], base.stride(j)) == (size, stride)), None)
        if j is None:
            return None
        free.remove(j)
        perm.append(j)
    return tuple(perm) if perm != list(range(t.ndim)) else None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    start = int(t.storage_offset()) * size
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n > 0) + 1
    return start, start + span * size


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < b1 and b0 < a1
