"""``to_flax``: PyTorch weights as Flax variables, each tie one array plus aliases.

A tie in PyTorch is one tensor under several names (:func:`bridge.shared_params`
finds them). In Flax it becomes one leaf, at the first name's place, and an
``AliasMap`` entry for every other name. Where the two ends of a tie get
different layouts (an Embedding ``weight`` reused as a Linear ``weight``: Flax
``embedding`` and ``kernel == embedding.T``) the alias carries the permutation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import torch

from bridge._flax_naming import FlaxPlan, plan_flax, torch_leaves
from bridge._names import RulesArg, as_rules
from bridge._open import open_source
from bridge._shared import torch_aliases
from bridge._sources import StateDictSource
from bridge._target import TargetTree, target_tree
from bridge._tensors import (
    arrays_sharing_memory,
    parallel_map,
    shares_memory_as_array,
    to_array,
)
from jaxshare import AliasMap, ProgressFn, TensorSource
from jaxshare.internal import Index, Perm, inverse, nest, permute_shape

__all__ = ["Source", "flax_alias_map", "flax_conversion", "to_flax"]

Source = torch.nn.Module | Mapping[str, torch.Tensor] | str | os.PathLike | TensorSource


def _flax_arrays(
    source: TensorSource,
    plan: FlaxPlan,
    like: TargetTree | None,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """``{flax path: array}`` of the stored tensors, in the source's order. A leaf
    of ``like`` with a sharding is built on its devices from the slices they hold."""
    shardings = {} if like is None else like.shardings

    def convert(key: str) -> Any:
        slot = plan.slots[key]
        sharding = shardings.get(slot.path)
        if sharding is not None and _wants_slices(sharding):
            return _sharded_array(source, key, slot.perm, sharding)
        return to_array(source.read(key), slot.perm, key=key, sharding=sharding)

    # Tensors JAX can take as they are (CPU, contiguous, Flax layout: e.g. a live
    # module's) become arrays over their memory in one call. Tensors in memory to
    # transpose are handed to XLA one after another (each call only queues the
    # transpose, which XLA runs on its own threads), first, so they run while the
    # rest is done; what is read from a file is copied a few at a time.
    direct, tensors, queued = [], [], []
    # Only tensors already in memory: reading another source's (a DeepSpeed
    # parameter assembled from partitions) here would read it twice.
    in_memory = isinstance(source, StateDictSource)
    for key in plan.stored if in_memory else ():
        if shardings.get(plan.slots[key].path) is None:
            value = source.read(key)
            if shares_memory_as_array(value, plan.slots[key].perm):
                direct.append(key)
                tensors.append(value)
            elif isinstance(value, torch.Tensor):
                queued.append(key)
    done = {*direct, *queued}
    copied = [key for key in plan.stored if key not in done]
    arrays = {key: convert(key) for key in queued}
    arrays.update(zip(direct, arrays_sharing_memory(tensors, direct), strict=True))
    del tensors
    arrays.update(zip(copied, parallel_map(convert, copied), strict=True))
    # Transposes run on XLA's threads and read the tensors they were given: done
    # before returning, so changing a tensor afterwards cannot reach the result.
    jax.block_until_ready([arrays[key] for key in [*queued, *copied]])
    out: dict[str, Any] = {}
    for i, key in enumerate(plan.stored):
        out[plan.slots[key].path] = array = arrays[key]
        if progress is not None:
            progress(i + 1, len(plan.stored), key, int(array.nbytes))
    return out


def _wants_slices(sharding: Any) -> bool:
    """Whether to read per device: the sharding spans several devices (or processes)."""
    return len(sharding.device_set) > 1 or not sharding.is_fully_addressable


def _sharded_array(source: TensorSource, key: str, perm: Perm | None, sharding: Any) -> Any:
    """The array of ``key`` in Flax layout, built on ``sharding``'s devices with
    ``jax.make_array_from_callback``: each addressable device's block is read as the
    matching slice of the PyTorch tensor (transposed where the layout differs), and
    a block several local devices hold is read once."""
    info = source.infos[key]
    shape = permute_shape(info.shape, perm)
    inv = inverse(perm)
    blocks: dict[tuple[tuple[int, int, int], ...], np.ndarray] = {}

    def block(index: Index) -> np.ndarray:
        bounds = tuple(s.indices(n) for s, n in zip(index, shape, strict=True))
        if bounds not in blocks:
            flax_index = tuple(slice(*b) for b in bounds)
            torch_index = flax_index if inv is None else tuple(flax_index[i] for i in inv)
            data = source.read_slice(key, torch_index)
            blocks[bounds] = data if perm is None else np.ascontiguousarray(data.transpose(perm))
        return blocks[bounds]

    # (jax annotates the callback as taking `Index | None`, but never passes None.)
    return jax.make_array_from_callback(shape, sharding, block)  # type: ignore[arg-type]


def _with_aliases(
    stored: Mapping[str, Any], amap: AliasMap, keep: Callable[[str], bool]
) -> dict[str, Any]:
    """``stored`` plus the value of every alias ``keep`` accepts: the canonical's
    very object, or one transposed copy per (canonical, permutation)."""
    out = dict(stored)
    transposed: dict[tuple[str, Perm], Any] = {}
    for alias, canonical in amap.items():
        if not keep(alias):
            continue
        perm = amap.transform(alias)
        value = stored[canonical]
        if perm is not None:
            if (canonical, perm) not in transposed:
                transposed[canonical, perm] = value.transpose(perm)
            value = transposed[canonical, perm]
        out[alias] = value
    return out


def flax_conversion(
    state_dict_or_module: Source,
    *,
    like: Any = None,
    rules: RulesArg = None,
    progress: ProgressFn | None = None,
) -> tuple[dict[str, Any], AliasMap, TargetTree | None]:
    """The stored arrays ``{flax path: array}`` and the alias map (what a
    checkpoint stores), before aliases are filled in."""
    rules = as_rules(rules)
    source = open_source(state_dict_or_module, rules)
    try:
        target = None if like is None else target_tree(like)
        ties = source.ties
        leaves = torch_leaves(source, rules, guess=target is None)
        plan = plan_flax(leaves, ties, target, rules, ties.naming)
        return _flax_arrays(source, plan, target, progress), plan.alias_map, target
    finally:
        if source is not state_dict_or_module:
            source.close()


def to_flax(
    state_dict_or_module: Source,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
) -> tuple[Any, AliasMap]:
    """PyTorch weights as Flax variables, with their ties as an ``AliasMap``.

    Names and layouts follow ``rules`` (see :data:`bridge.DEFAULT_RULES`):
    ``a.b.0.c.weight`` of a Linear becomes ``params/a/b/0/c/kernel``, transposed.
    A tensor under several names (found by :func:`bridge.shared_params`) becomes
    one array: every other name is an alias of its first name, carrying the
    permutation where the two names get different layouts.

    Arrays are ``jax.Array`` on the default device (or as a ``like`` leaf's
    sharding asks), sharing the tensor's memory where no permutation is needed,
    so do not modify the tensors in place afterwards; 64-bit dtypes stay numpy
    arrays unless ``jax_enable_x64`` is on. Dtypes are kept, bit for bit.

    Args:
      state_dict_or_module: a ``torch.nn.Module`` (its layer types decide what
        names cannot: a GPT-2 ``Conv1D`` ``weight`` is already ``(in, out)``), a
        state dict, a weights file (``.safetensors``, ``.pt``, ``.bin``), or a
        ``jaxshare.TensorSource``. Without a module, layer types are guessed from
        module names (:data:`bridge.DEFAULT_LAYER_NAMES`), and a naming record the
        input carries (a file jaxshare wrote) places every tensor exactly.
      like: the tree the Flax model expects -- linen variables, a params dict (a
        Hugging Face model's ``params``), an ``nnx.State`` or ``nnx.Module``, or
        their ``jax.eval_shape``. The result then has exactly its structure,
        shapes checked leaf by leaf; ``like`` also settles ambiguous names and
        layouts. An alias ``like`` has no place for (a model that computes
        ``lm_head`` from the embedding) stays in the alias map.
      rules: a :class:`bridge.Rules` or a sequence of :class:`bridge.Rule`.

    Returns:
      ``(variables, alias_map)``; the alias map's ``naming`` records each leaf's
      PyTorch name and permutation, so :func:`bridge.to_torch` inverts the
      conversion exactly without ``like``. Without ``like``, linen variables
      ``{"params": ..., "batch_stats": ...}`` (``batch_stats`` and ``buffers``
      only when there are any), every alias present: the same array object as
      its canonical, or its transpose. ``jaxshare.tie(variables, alias_map)``
      gives the ``Tied`` a training loop takes.

    Raises:
      ValueError: with ``like``, a tensor with no place, a shape that does not
        fit, or a leaf of ``like`` that no tensor fills -- all named at once.
      TypeError: a non-tensor entry or a dtype JAX cannot hold bit-exactly.

    >>> import torch
    >>> emb = torch.nn.Embedding(10, 4)
    >>> head = torch.nn.Linear(4, 10, bias=False)
    >>> head.weight = emb.weight
    >>> variables, aliases = to_flax(torch.nn.ModuleDict({"wte": emb, "lm_head": head}))
    >>> aliases
    AliasMap({'params/lm_head/kernel': 'params/wte/embedding'},
             transforms={'params/lm_head/kernel': (1, 0)}, naming=NamingRecord(2 leaves))
    >>> aliases.naming["params/lm_head/kernel"]
    Naming(torch='lm_head.weight', permute=(1, 0))
    >>> variables["params"]["lm_head"]["kernel"].shape
    (4, 10)
    """
    stored, amap, target = flax_conversion(state_dict_or_module, like=like, rules=rules)
    if target is None:
        return nest(_with_aliases(stored, amap, lambda alias: True)), amap
    return target.build(_with_aliases(stored, amap, target.shapes.__contains__)), amap


def flax_alias_map(
    aliases: Mapping[str, str],
    source: Source,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
) -> AliasMap:
    """PyTorch ``{alias: canonical}`` (DeepSpeed's ``shared_params``) as an
    ``AliasMap`` in Flax paths, with the permutations the layouts imply.

    Args:
      aliases: PyTorch names. An alias ``source`` lacks (DeepSpeed did not store
        it) is taken to have its canonical's shape.
      source: the module or state dict the names belong to (shapes and layer
        types decide the Flax names).
      like, rules: as in :func:`to_flax`.

    >>> import torch
    >>> sd = {"wte.weight": torch.zeros(10, 4)}  # DeepSpeed did not store lm_head.weight
    >>> flax_alias_map({"lm_head.weight": "wte.weight"}, sd)
    AliasMap({'params/lm_head/kernel': 'params/wte/embedding'},
             transforms={'params/lm_head/kernel': (1, 0)})
    """
    rules = as_rules(rules)
    aliases = torch_aliases(aliases, "aliases")
    opened = open_source(source, rules, arg="source")
    try:
        ties = dict(opened.ties.items())
        ties.update(aliases)
        merged = AliasMap(ties, transforms=opened.ties.transforms)
        target = None if like is None else target_tree(like)
        leaves = torch_leaves(opened, rules, merged, guess=target is None)
        return plan_flax(leaves, merged, target, rules).alias_map.with_naming(None)
    finally:
        if opened is not source:
            opened.close()
