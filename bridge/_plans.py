"""Plans between PyTorch and Flax names, from a source's metadata alone.

:func:`flax_plan` places the tensors of a PyTorch-named source (a file, a Hugging
Face directory, a DeepSpeed folder, a state dict) in Flax paths;
:func:`torch_plan` names the arrays of a Flax-named source (an Orbax item, a
Flax-named safetensors file) in PyTorch. Both read only names, shapes, dtypes,
ties and a recorded naming, and return a :class:`jaxshare.Plan` that writers
stream from; the same rules as :func:`bridge.to_flax` and :func:`bridge.to_torch`
decide, so every route gives the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge._flax_naming import plan_flax, torch_leaves
from bridge._names import RulesArg, as_rules
from bridge._open import open_source
from bridge._torch_naming import plan_torch_names
from jaxshare import AliasMap, NamingRecord, Plan, PlanEntry, TensorSource
from jaxshare.internal import compose, inverse

if TYPE_CHECKING:
    from bridge._to_flax import Source

__all__ = ["flax_plan", "torch_plan"]


def flax_plan(source: Source, /, *, like: Any = None, rules: RulesArg = None) -> Plan:
    """Where each tensor of a PyTorch-named source goes in Flax: its path, layout
    and ties, as :func:`bridge.to_flax` would place it, without reading a tensor.

    The plan's alias map (Flax paths) carries the naming record.

    >>> import torch
    >>> sd = {"wte.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(4, 4)}
    >>> for e in flax_plan(sd).entries:
    ...     print(e.name, e.source, e.perm)
    params/wte/embedding wte.weight None
    params/lm_head/kernel lm_head.weight (1, 0)
    """
    from bridge._target import target_tree  # (JAX: `like` is a Flax tree.)

    rules = as_rules(rules)
    opened = open_source(source, rules)
    ties = opened.ties
    target = None if like is None else target_tree(like)
    leaves = torch_leaves(opened, rules, guess=target is None)
    plan = plan_flax(leaves, ties, target, rules, ties.naming)
    entries = []
    for key in plan.stored:
        slot = plan.slots[key]
        info = opened.infos[key]
        entries.append(PlanEntry(slot.path, key, slot.perm, info.permuted(slot.perm)))
    return Plan(tuple(entries), plan.alias_map)


def torch_plan(source: TensorSource, /, *, like: Any = None, rules: RulesArg = None) -> Plan:
    """How each array of a Flax-named source is named and laid out in PyTorch, as
    :func:`bridge.to_torch` would, without reading an array.

    A naming record the source carries (a conversion's) decides names and
    layouts exactly; otherwise the rules do (or ``like``, a module or state
    dict). The plan's alias map is in PyTorch names: a tie whose layouts cancel
    is an identical alias (stored once), one whose layouts differ an alias with
    a transform; its naming record maps the Flax paths to the PyTorch names.

    >>> import jax.numpy as jnp, tempfile
    >>> from jaxshare import checkpoint
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(path, {"params": {"wte": {"embedding": jnp.zeros((10, 4))}}})
    >>> [(e.name, e.source, e.perm) for e in torch_plan(checkpoint.open_source(path)).entries]
    [('wte.weight', 'params/wte/embedding', None)]
    """
    rules = as_rules(rules)
    flax_ties = source.ties
    stored = {p: info for p, info in source.infos.items() if p not in flax_ties}
    names, order = plan_torch_names(stored, flax_ties, like, rules)
    entries = []
    for path in order:
        if path in flax_ties:
            continue
        name, perm = names[path]
        back = inverse(perm)
        entries.append(PlanEntry(name, path, back, stored[path].permuted(back)))
    aliases: dict[str, str] = {}
    transforms: dict[str, Any] = {}
    for alias, canonical in flax_ties.items():
        if alias not in names:
            continue  # `like` has no place for it: PyTorch has no name for it.
        (a_name, a_perm), (c_name, c_perm) = names[alias], names[canonical]
        # torch alias = T(flax alias, a^-1) = T(flax canonical, a^-1 . t), and
        # flax canonical = T(torch canonical, c).
        aliases[a_name] = c_name
        transforms[a_name] = compose(compose(inverse(a_perm), flax_ties.transform(alias)), c_perm)
    naming = NamingRecord({path: names[path] for path in order})
    return Plan(tuple(entries), AliasMap(aliases, transforms=transforms, naming=naming))
