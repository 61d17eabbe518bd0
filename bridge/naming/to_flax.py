"""``to_flax``: PyTorch weights as Flax variables, each tie one array plus aliases.

A tie in PyTorch is one tensor under several names (:func:`bridge.shared_params`
finds them). In Flax it becomes one leaf, at the first name's place, and an
``AliasMap`` entry for every other name. Where the two ends of a tie get
different axis orders (an Embedding ``weight`` reused as a Linear ``weight``: Flax
``embedding`` and ``kernel == embedding.T``) the alias carries the permutation.

Where each tensor goes is decided first, from names and shapes alone
(:func:`bridge.naming.flax_placement.place_source`); then the values move. A file or
folder (safetensors, PyTorch files, Hugging Face directories, DeepSpeed
folders) is read as numpy views and needs no torch; a module or a state dict in
memory is moved through torch, sharing its memory where it can.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from bridge.layouts.layout import Layout, as_layout
from bridge.layouts.rules import RulesArg, as_rules
from bridge.naming.flax_placement import FlaxPlacement, place_source
from bridge.naming.relayout import place_any
from bridge.naming.torch_naming import torch_aliases
from bridge.sources.registry import opened
from jaxshare import AliasMap
from jaxshare.internal import (
    Index,
    Perm,
    contiguous_transpose,
    inverse,
    nest,
    parallel_map,
    permute_shape,
    render,
)
from jaxshare.stream import ProgressFn, TensorSource

if TYPE_CHECKING:
    from bridge.sources.registry import Source

__all__ = ["flax_alias_map", "placed_variables", "to_flax"]

#: Dtypes JAX narrows unless ``jax_enable_x64`` is on: such arrays stay numpy.
_WIDE = frozenset({"int64", "uint64", "float64", "complex128"})


def _in_memory_torch(source: TensorSource) -> bool:
    """Whether ``source`` holds torch tensors in memory (a module's, a state dict)."""
    if "torch" not in sys.modules:  # (No torch imported: no torch tensor anywhere.)
        return False
    from bridge.torch.state_dict import StateDictSource

    return isinstance(source, StateDictSource)


def _from_numpy(array: np.ndarray, perm: Perm | None, sharding: Any) -> Any:
    """A numpy array (a view of a mapped file) permuted by ``perm``, copied once
    into an array of its own: a ``jax.Array``, placed as ``sharding`` asks, or a
    numpy array for 64-bit dtypes JAX would narrow."""
    out = contiguous_transpose(array, perm) if perm is not None else np.array(array)
    if out.dtype.name in _WIDE and not jax.config.read("jax_enable_x64"):
        return out
    return jax.device_put(out, sharding)


def _flax_arrays(
    source: TensorSource,
    plan: FlaxPlacement,
    progress: ProgressFn | None,
) -> dict[tuple[str, ...], Any]:
    """``{flax path: array}`` of the stored tensors, in the source's order. A leaf
    of the target with a sharding is built on its devices from the slices they
    hold."""
    shardings = {} if plan.like is None else plan.like.shardings
    torch_tensors = _in_memory_torch(source)

    def convert(key: str) -> Any:
        sharding = shardings.get(plan.places[key].path)
        base, perm = plan.source_of(key)
        if sharding is not None and _wants_slices(sharding):
            return _sharded_array(source, base, perm, sharding)
        if torch_tensors:
            from bridge.torch.tensors import to_array

            return to_array(source.read(base), perm, key=key, sharding=sharding)
        return _from_numpy(source.array(base), perm, sharding)

    direct: list[str] = []
    queued: list[str] = []
    arrays: dict[str, Any] = {}
    if torch_tensors:
        # Tensors JAX can take as they are (CPU, contiguous, Flax axis order: e.g. a live
        # module's) become arrays over their memory in one call. Tensors to transpose
        # are handed to XLA one after another (each call only queues the transpose,
        # which XLA runs on its own threads), first, so they run while the rest is
        # done.
        from bridge.torch.tensors import arrays_sharing_memory, shares_memory_as_array

        tensors = []
        for key in plan.stored:
            if shardings.get(plan.places[key].path) is None and key not in plan.copies:
                value = source.read(key)
                if shares_memory_as_array(value, plan.places[key].perm):
                    direct.append(key)
                    tensors.append(value)
                else:
                    queued.append(key)
        arrays = {key: convert(key) for key in queued}
        arrays.update(zip(direct, arrays_sharing_memory(tensors, direct), strict=True))
        del tensors
    done = {*direct, *queued}
    copied = [key for key in plan.stored if key not in done]  # Read a few at a time.
    arrays.update(zip(copied, parallel_map(convert, copied), strict=True))
    # Transposes run on XLA's threads and read the tensors they were given: done
    # before returning, so changing a tensor afterwards cannot reach the result.
    jax.block_until_ready([arrays[key] for key in [*queued, *copied]])
    out: dict[tuple[str, ...], Any] = {}
    for i, key in enumerate(plan.stored):
        out[plan.places[key].path] = array = arrays[key]
        if progress is not None:
            progress(i + 1, len(plan.stored), key, int(array.nbytes))
    return out


def _wants_slices(sharding: Any) -> bool:
    """Whether to read per device: the sharding spans several devices (or processes)."""
    return len(sharding.device_set) > 1 or not sharding.is_fully_addressable


def _sharded_array(source: TensorSource, key: str, perm: Perm | None, sharding: Any) -> Any:
    """The array of ``key`` in Flax axis order, built on ``sharding``'s devices with
    ``jax.make_array_from_callback``: each addressable device's block is read as the
    matching slice of the PyTorch tensor (transposed where the axis order differs), and
    a block several local devices hold is read once. The blocks may be views of the
    source's files (:meth:`TensorSource.slice_view`): the caller waits for the arrays
    before the source closes."""
    info = source.infos[key]
    shape = permute_shape(info.shape, perm)
    inv = inverse(perm)
    blocks: dict[tuple[tuple[int, int, int], ...], np.ndarray] = {}

    def block(index: Index) -> np.ndarray:
        bounds = tuple(s.indices(n) for s, n in zip(index, shape, strict=True))
        if bounds not in blocks:
            flax_index = tuple(slice(*b) for b in bounds)
            torch_index = flax_index if inv is None else tuple(flax_index[i] for i in inv)
            # A view of the file where the source maps one: the device's buffer is its
            # one copy (transposed on the way, in XLA's tiles).
            data = source.slice_view(key, torch_index)
            blocks[bounds] = data if perm is None else data.transpose(perm)
        return blocks[bounds]

    # (jax annotates the callback as taking `Index | None`, but never passes None.)
    return jax.make_array_from_callback(shape, sharding, block)  # type: ignore[arg-type]


def _with_aliases(
    stored: Mapping[tuple[str, ...], Any],
    plan: FlaxPlacement,
    keep: Callable[[tuple[str, ...]], bool],
) -> dict[tuple[str, ...], Any]:
    """``stored`` plus the value of every alias ``keep`` accepts: the canonical's
    very object, or one transposed copy per (canonical, permutation). An implicit
    alias (the model computes it) is never a leaf."""
    out = dict(stored)
    amap = plan.alias_map
    paths = {place.name: place.path for place in plan.places.values()}
    transposed: dict[tuple[tuple[str, ...], Perm], Any] = {}
    for alias, canonical in amap.items():
        path, base = paths[alias], paths[canonical]
        if not keep(path) or alias in amap.implicit:
            continue
        perm = amap.transform(alias)
        value = stored[base]
        if perm is not None:
            if (base, perm) not in transposed:
                transposed[base, perm] = value.transpose(perm)
            value = transposed[base, perm]
        out[path] = value
    return out


def placed_variables(
    source: TensorSource,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
    progress: ProgressFn | None = None,
) -> tuple[FlaxPlacement, Any]:
    """The placement of an opened ``source`` and its Flax variables: what
    :func:`to_flax` returns of it, with the placement it was made by (every name's
    Flax path and permutation)."""
    rules = as_rules(rules)
    plan, placed = place_any(source, like=like, rules=rules, layout=layout)
    stored = _flax_arrays(placed, plan, progress)
    if plan.like is None:
        # Linen variables hold every alias; a layout of a Flax port's own params, only
        # the leaves the port holds (an implicit tie is its alias map's alone).
        own = layout is None or as_layout(layout).collections
        full = _with_aliases(stored, plan, lambda path: own)
        return plan, nest({render(path): value for path, value in full.items()})
    target = plan.like
    return plan, target.build(_with_aliases(stored, plan, target.shapes.__contains__))


def to_flax(
    state_dict_or_module: Source,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
) -> tuple[Any, AliasMap]:
    """PyTorch weights as Flax variables, with their ties as an ``AliasMap``.

    Names and axis orders follow ``rules`` (see :data:`bridge.DEFAULT_RULES`):
    ``a.b.0.c.weight`` of a Linear becomes ``params/a/b/0/c/kernel``, transposed.
    A tensor under several names (found by :func:`bridge.shared_params`) becomes
    one array: every other name is an alias of its first name, carrying the
    permutation where the two names get different axis orders.

    Arrays are ``jax.Array`` on the default device (or as a ``like`` leaf's
    sharding asks), sharing a tensor's memory where no permutation is needed,
    so do not modify the tensors in place afterwards; 64-bit dtypes stay numpy
    arrays unless ``jax_enable_x64`` is on. Dtypes are kept, bit for bit. A file
    or folder is read without torch.

    Args:
      state_dict_or_module: a ``torch.nn.Module`` (its layer types decide what
        names cannot: a GPT-2 ``Conv1D`` ``weight`` is already ``(in, out)``), a
        state dict, a weights file (``.safetensors``, ``.pt``, ``.bin``), a
        Hugging Face directory, a DeepSpeed folder, or a
        ``jaxshare.stream.TensorSource``. Without a module, layer types are
        guessed from module names (:data:`bridge.DEFAULT_LAYER_NAMES`), and a
        naming record the input carries (a file jaxshare wrote) places every
        tensor exactly.
      like: the tree the Flax model expects -- linen variables, a params dict (a
        Hugging Face model's ``params``), an ``nnx.State`` or ``nnx.Module``, or
        their ``jax.eval_shape``. The result then has exactly its structure,
        shapes checked leaf by leaf; ``like`` also settles ambiguous names and
        axis orders. An alias ``like`` has no place for (a model that computes
        ``lm_head`` from the embedding) stays in the alias map.
      rules: a :class:`bridge.Rules` or a sequence of :class:`bridge.Rule`.
      layout: the Flax layout to place in: ``"jaxshare"`` (the default, linen
        variables) or ``"transformers-flax"`` (exactly the ``params`` of
        transformers 4.57's Flax model of the same architecture, found by the
        source's ``config.json``: a Hugging Face directory's, a transformers
        module's); see ``docs/flax-layouts.md``.

    Returns:
      ``(variables, alias_map)``; the alias map's ``naming`` records each leaf's
      PyTorch name and permutation, so :func:`bridge.to_torch` inverts the
      conversion exactly without ``like``. Without ``like``, linen variables
      ``{"params": ..., "batch_stats": ...}`` (``batch_stats`` and ``buffers``
      only when there are any), every alias present: the same array object as
      its canonical, or its transpose; with ``layout="transformers-flax"``,
      exactly the Flax model's ``params``, whose implicit ties (GPT-2's
      ``lm_head``) are in the alias map only. ``jaxshare.tie(variables, alias_map)``
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
    rules = as_rules(rules)
    with opened(state_dict_or_module, rules) as source:
        plan, variables = placed_variables(source, like=like, rules=rules, layout=layout)
    return variables, plan.alias_map


def flax_alias_map(
    aliases: Mapping[str, str],
    source: Source,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
) -> AliasMap:
    """PyTorch ``{alias: canonical}`` (DeepSpeed's ``shared_params``) as an
    ``AliasMap`` in Flax paths, with the permutations their axis orders imply.

    Args:
      aliases: PyTorch names. An alias ``source`` lacks (DeepSpeed did not store
        it) is taken to have its canonical's shape.
      source: the module, state dict or file the names belong to (shapes and
        layer types decide the Flax names).
      like, rules, layout: as in :func:`to_flax`.

    >>> import torch
    >>> sd = {"wte.weight": torch.zeros(10, 4)}  # DeepSpeed did not store lm_head.weight
    >>> flax_alias_map({"lm_head.weight": "wte.weight"}, sd)
    AliasMap({'params/lm_head/kernel': 'params/wte/embedding'},
             transforms={'params/lm_head/kernel': (1, 0)})
    """
    rules = as_rules(rules)
    aliases = torch_aliases(aliases, "aliases")
    with opened(source, rules, arg="source") as src:
        ties = dict(src.ties.items())
        ties.update(aliases)
        merged = AliasMap(ties, transforms=src.ties.transforms)
        plan = place_source(src, like=like, rules=rules, ties=merged, layout=layout)
        return plan.alias_map.with_naming(None)
