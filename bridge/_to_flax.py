"""``to_flax``: PyTorch weights as Flax variables, each tie one array plus aliases.

A tie in PyTorch is one tensor under several names (:func:`bridge.shared_params`
finds them). In Flax it becomes one leaf, at the first name's place, and an
``AliasMap`` entry for every other name. Where the two ends of a tie get
different layouts (an Embedding ``weight`` reused as a Linear ``weight``: Flax
``embedding`` and ``kernel == embedding.T``) the alias carries the permutation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bridge._match import Slot, default_slot, place
from bridge._names import Rule, Rules, TorchLeaf, as_rules, layer_kind
from bridge._shared import shared_params, state_dict_of, torch_aliases
from bridge._target import TargetTree, target_tree
from bridge._tensors import parallel_map, to_array
from jaxshare import AliasMap, ProgressFn
from jaxshare.internal import Perm, compose, inverse

__all__ = [
    "RulesArg",
    "Source",
    "flax_alias_map",
    "flax_conversion",
    "nest",
    "to_flax",
    "torch_leaves",
]

RulesArg = Rules | Sequence[Rule] | None
Source = torch.nn.Module | Mapping[str, torch.Tensor]


def torch_leaves(
    source: Source, rules: Rules, arg: str = "state_dict_or_module"
) -> tuple[dict[str, torch.Tensor], list[TorchLeaf]]:
    """The state dict of ``source`` and what the rules need to know of each entry."""
    state = state_dict_of(source, arg)
    layers = _layers(source, rules)
    params: set[str] | None = None
    if isinstance(source, torch.nn.Module):
        params = {n for n, _ in source.named_parameters(remove_duplicate=False)}
    leaves = []
    for key, value in state.items():
        if "/" in key:
            raise ValueError(
                f"`{arg}` name {key!r} contains '/', which Flax paths use to join keys; "
                "rename it (PyTorch names join with '.')."
            )
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"`{arg}` entry {key!r} is a {type(value).__name__}, not a tensor; drop it "
                "(e.g. a module's extra state) before converting."
            )
        buffer = None if params is None else key not in params
        leaves.append(TorchLeaf(key, tuple(value.shape), layers.get(_owner(key)), buffer))
    return state, leaves


def _layers(source: Source, rules: Rules) -> dict[str, str | None]:
    """``{module prefix: layer kind}`` of a module (empty for a state dict)."""
    if not isinstance(source, torch.nn.Module):
        return {}
    return {p: layer_kind(m, rules) for p, m in source.named_modules(remove_duplicate=False)}


def _owner(key: str) -> str:
    """The module prefix of a state-dict name: ``'h.0.attn'`` for ``'h.0.attn.bias'``."""
    return key.rpartition(".")[0]


@dataclass(frozen=True)
class _FlaxPlan:
    """Where every tensor of a state dict goes: the Flax slots and the alias map."""

    slots: dict[str, Slot]          # torch key -> slot, every key of the state dict
    stored: list[str]               # torch keys whose tensor is stored (flax canonicals and untied)
    alias_map: AliasMap             # in Flax paths


def plan_flax(
    leaves: list[TorchLeaf],
    aliases: Mapping[str, str],
    like: TargetTree | None,
    rules: Rules,
) -> _FlaxPlan:
    groups: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        groups.setdefault(canonical, [canonical]).append(alias)
    order = {leaf.key: i for i, leaf in enumerate(leaves)}
    tied = {k for members in groups.values() for k in members}
    problems: list[str] = []
    if like is None:
        slots = {leaf.key: default_slot(leaf, rules) for leaf in leaves}
    else:
        slots, problems = place(leaves, like.shapes, rules, optional=tied)
    by_key = {leaf.key: leaf for leaf in leaves}
    amap: dict[str, str] = {}
    transforms: dict[str, Perm | None] = {}
    alias_keys: set[str] = set()
    for members in groups.values():
        members.sort(key=order.__getitem__)
        placed = [k for k in members if k in slots]
        if not placed:
            problems.append(f"none of the tied names {members} has a place in `like`")
            continue
        canonical = slots[placed[0]]
        for key in members:
            if key == placed[0]:
                continue
            alias_keys.add(key)
            if key not in slots:  # No place in `like`: the tie stays in the alias map.
                slots[key] = default_slot(
                    by_key[key], rules, collection=canonical.collection, linen=canonical.linen
                )
            slot = slots[key]
            amap[slot.path] = canonical.path
            transforms[slot.path] = compose(slot.perm, inverse(canonical.perm))
    taken: dict[str, str] = {}
    for key, slot in slots.items():  # (`place` has reported collisions among placed tensors)
        other = taken.setdefault(slot.path, key)
        if other != key:
            problems.append(f"{other!r} and {key!r} both go to {slot.path!r}")
    if like is not None:
        empty = [f"{p!r} {s}" for p, s in like.shapes.items() if p not in taken]
        if empty:
            problems.append(f"`like` has leaves no tensor fills: {', '.join(empty[:10])}")
    if problems:
        raise ValueError(
            f"cannot place the PyTorch tensors in {'Flax paths' if like is None else '`like`'}:"
            + "".join(f"\n  {p}" for p in problems)
            + "\nPass `like=` the tree the Flax model expects (e.g. `jax.eval_shape` of its "
            "init), the module instead of its state dict (its layer types decide), or "
            "`rules=` naming what the defaults do not know."
        )
    stored = [leaf.key for leaf in leaves if leaf.key not in alias_keys]
    return _FlaxPlan(slots, stored, AliasMap(amap, transforms=transforms))


def _flax_arrays(
    state: Mapping[str, torch.Tensor],
    plan: _FlaxPlan,
    like: TargetTree | None,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """``{flax path: array}`` of the stored tensors, in state-dict order."""
    shardings = {} if like is None else like.shardings

    def convert(key: str) -> Any:
        slot = plan.slots[key]
        return to_array(state[key], slot.perm, key=key, sharding=shardings.get(slot.path))

    out: dict[str, Any] = {}
    arrays = parallel_map(convert, plan.stored)
    for i, (key, array) in enumerate(zip(plan.stored, arrays, strict=True)):
        out[plan.slots[key].path] = array
        if progress is not None:
            progress(i + 1, len(plan.stored), key, int(array.nbytes))
    return out


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


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{'a/b': x}`` -> ``{'a': {'b': x}}``, keeping order.

    >>> nest({"params/a/kernel": 1, "params/b": 2})
    {'params': {'a': {'kernel': 1}, 'b': 2}}
    """
    root: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, last = path.split("/")
        node = root
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(
                    f"{path!r} needs {'/'.join(parents[: i + 1])!r} to hold keys, but it is a leaf."
                )
        if last in node:
            raise ValueError(f"{path!r} would be written twice.")
        node[last] = value
    return root


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
    state, leaves = torch_leaves(state_dict_or_module, rules)
    target = None if like is None else target_tree(like)
    plan = plan_flax(leaves, shared_params(state), target, rules)
    return _flax_arrays(state, plan, target, progress), plan.alias_map, target


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
        names cannot: a GPT-2 ``Conv1D`` ``weight`` is already ``(in, out)``) or a
        state dict.
      like: the tree the Flax model expects -- linen variables, a params dict (a
        Hugging Face model's ``params``), an ``nnx.State`` or ``nnx.Module``, or
        their ``jax.eval_shape``. The result then has exactly its structure,
        shapes checked leaf by leaf; ``like`` also settles ambiguous names and
        layouts. An alias ``like`` has no place for (a model that computes
        ``lm_head`` from the embedding) stays in the alias map.
      rules: a :class:`bridge.Rules` or a sequence of :class:`bridge.Rule`.

    Returns:
      ``(variables, alias_map)``. Without ``like``, linen variables
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
             transforms={'params/lm_head/kernel': (1, 0)})
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
    >>> sd = {"wte.weight": torch.zeros(10, 4), "head.weight": torch.zeros(10, 4)}
    >>> flax_alias_map({"head.weight": "wte.weight"}, sd)
    AliasMap({'params/head/kernel': 'params/wte/kernel'})
    """
    rules = as_rules(rules)
    aliases = torch_aliases(aliases, "aliases")
    state, leaves = torch_leaves(source, rules, "source")
    by_key = {leaf.key: leaf for leaf in leaves}
    missing = sorted({c for c in aliases.values() if c not in by_key})
    if missing:
        raise ValueError(f"`aliases` names canonical(s) {missing[:5]} that `source` does not hold.")
    layers = _layers(source, rules)
    for alias, canonical in aliases.items():
        if alias not in by_key:
            c = by_key[canonical]
            by_key[alias] = TorchLeaf(alias, c.shape, layers.get(_owner(alias)), c.buffer)
            leaves.append(by_key[alias])
    target = None if like is None else target_tree(like)
    return plan_flax(leaves, aliases, target, rules).alias_map
