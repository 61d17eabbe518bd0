"""``to_optax``: a PyTorch optimizer's state as an optax state over a ``Tied``.

A PyTorch optimizer keeps, per parameter, a few tensors of the parameter's shape
(Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``) and a step;
optax keeps the same tensors as trees shaped like the params and one ``count``.
So a moment is placed exactly as its parameter: each slot of the optimizer
state is handed to :func:`bridge.to_flax` as a source with the parameters'
names, shapes, layer types and ties (:class:`SlotAsParams`), and lands at its
parameter's Flax path, with its transpose, one leaf per tie -- as the ``Tied``
of the params holds one. ``tx`` is read by :func:`bridge.training.probe.probe`
and held against the torch groups. Nothing here imports torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bridge.layouts.layout import Layout
from bridge.layouts.rules import RulesArg, as_rules
from bridge.training.hyper import step_of
from bridge.training.optax_state import KINDS, fill_state, leaves_by_path, tx_kind
from bridge.training.probe import check_hyper, probe
from bridge.training.state import read_training
from jaxshare.stream import ArrayInfo, TensorSource

if TYPE_CHECKING:
    from jaxshare import Tied

__all__ = ["SlotAsParams", "to_optax"]


class SlotAsParams(TensorSource):
    """One slot of the optimizer state (``exp_avg``, ...) with the parameters' names,
    shapes, layer types and ties: placed by the same plan as the parameters. A
    tensor with no state of its own (a buffer, a frozen parameter) reads as zeros.

    >>> from jaxshare.formats import SlotSource
    >>> params = SlotSource("weights", {"w": np.zeros((2, 3)), "b": np.zeros(3)})
    >>> moments = SlotAsParams(params, SlotSource("exp_avg", {"w": np.ones((2, 3))}))
    >>> moments.array("w").tolist(), moments.array("b").tolist()
    ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [0.0, 0.0, 0.0])
    """

    mapped = True

    def __init__(self, params: TensorSource, slot: TensorSource) -> None:
        self.path, self.kind = params.path, params.kind
        self._params, self._slot = params, slot
        self.infos = {name: ArrayInfo(info.shape, "float32") for name, info in params.infos.items()}
        self.ties, self.layers = params.ties, params.layers
        self.config, self.buffers, self.live = params.config, params.buffers, params.live

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        from jaxshare.internal import transpose

        own = self._params.ties.get(name, name)  # (One state per tie: the canonical's.)
        if own not in self._slot.infos:
            return np.zeros(self.infos[name].shape, np.float32)
        value = np.asarray(self._slot.array(own), np.float32)
        perm = self._params.ties.transform(name) if name in self._params.ties else None
        return value if perm is None else np.ascontiguousarray(transpose(value, perm))


def to_optax(
    source: Any,
    tx: Any,
    /,
    *,
    like: Any = None,
    layout: str | Layout | None = None,
    rules: RulesArg = None,
    ties: Mapping[str, str] | Sequence[str] = (),
    config: Any = None,
) -> tuple[Tied, Any]:
    """A PyTorch training run's weights and optimizer state as a ``Tied`` and an
    optax state: resume it in JAX.

    ``params`` is what :func:`bridge.to_flax` gives for the same weights, as a
    ``jaxshare.Tied`` (one leaf per tie). ``opt_state`` is ``tx.init(params)``
    with the torch optimizer's state filled in: Adam's ``exp_avg``/``exp_avg_sq``
    as ``mu``/``nu`` and SGD's ``momentum_buffer`` as ``trace``, each placed
    exactly as its parameter (its Flax path and transpose, one entry per tie),
    and every ``count`` at the step.

    ``tx`` must make the torch optimizer's update: it is probed (one
    ``tx.update`` of probe values at the step, read back per parameter) and its
    learning rate, betas, eps, weight decays (decoupled as AdamW's, or L2 as
    Adam's and SGD's), momentum and nesterov are compared with every param
    group's, within a relative 1e-4. Groups with different values need a ``tx``
    that treats them so (``optax.multi_transform``, a ``mask=``);
    :func:`bridge.optax_for` builds one.

    Args:
      source: a ``torch.save`` of ``{"model": state_dict, "optimizer":
        optimizer.state_dict()}``, a DeepSpeed ZeRO folder (the fp32 masters), a
        DCP folder of ``get_state_dict``, or ``(model_or_state_dict,
        optimizer_or_its_state_dict)`` in memory.
      tx: ``optax.adam``, ``optax.adamw``, ``optax.sgd(momentum=...)``, or a
        chain (``multi_transform``, ``inject_hyperparams``) holding one.
      like, layout, rules: as in :func:`bridge.to_flax`.
      ties: ties the source does not record (a DCP folder records none), as
        ``{alias: canonical}`` or ``"ALIAS=CANONICAL"`` strings, in PyTorch names;
        each is checked by content (``--tie``).
      config: a ``config.json`` whose model class declares the source's ties.

    Returns:
      ``(params, opt_state)``.

    Raises:
      ValueError: one line: the state of another optimizer (Muon, Adafactor,
        amsgrad, per-parameter entries jaxshare does not know), steps that
        differ, or a ``tx`` whose update differs (each value named on both
        sides).

    >>> import torch, optax
    >>> model = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    >>> model(torch.ones(3)).sum().backward(); opt.step()
    >>> tx = optax.adamw(1e-2, weight_decay=0.1)
    >>> params, opt_state = to_optax((model, opt), tx)
    >>> mu = opt_state[0].mu.unique["params"]
    >>> bool((mu["kernel"] == opt.state[model.weight]["exp_avg"].T.numpy()).all())
    True
    >>> int(opt_state[0].count)
    1
    """
    import jax

    from bridge.naming.to_flax import placed_variables
    from jaxshare import tie

    rules = as_rules(rules)
    training = read_training(source, rules, ties=ties, config=config)
    state = training.optimizer
    kind = state.kind
    step = step_of(state)
    with training.params as src:
        plan, variables = placed_variables(src, like=like, rules=rules, layout=layout)
        amap = plan.alias_map
        if plan.reads is not None:
            raise ValueError(
                f"{src.where}: scanned (stacked) layers are not carried with optimizer "
                "state yet; convert without `rules.stacks` / --stack."
            )
        params = tie(variables, amap)
        if src.live:  # Arrays of their own: the torch run may go on.
            import jax.numpy as jnp

            params = params.replace(jax.tree.map(lambda x: jnp.array(x, copy=True), params.unique))
        flax_of = {src.ties.get(n, n): plan.places[n].name for n in plan.stored}
        missing = [
            n for g in state.groups for n in g.names if n not in flax_of and n not in src.ties
        ]
        if missing:
            raise ValueError(
                f"{src.where}: the optimizer's groups name {missing[:3]}, which the weights "
                "do not hold; the model and the optimizer state are of different models."
            )
        in_group = state.group_of
        if step > 0:
            stateless = [
                n for n in in_group for slot in state.slots.values() if n not in slot.infos
            ]
            if stateless:
                raise ValueError(
                    f"{src.where}: {stateless[0]!r} is in a param group but has no optimizer "
                    f"state at step {step}; optax cannot start one parameter anew."
                )
        values: dict[str, dict[str, Any]] = {}
        for slot_name, field in KINDS[kind].items():
            if slot_name not in state.slots:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (The weights' conversion said it once.)
                placed, moments = placed_variables(
                    SlotAsParams(src, state.slots[slot_name]),
                    like=like,
                    rules=rules,
                    layout=layout,
                )
            values[field] = leaves_by_path(tie(moments, placed.alias_map))
    opt_state = tx.init(params)
    held = tx_kind(opt_state, kind)
    values = {f: values.get(f, {}) for f in KINDS[kind].values()}
    probed = probe(tx, params, kind, step)
    check_hyper(state, kind, probed, flax_of)
    if held is None and state.slots:
        raise ValueError(
            f"{state.path or 'the optimizer state'}: the torch optimizer keeps "
            f"{', '.join(state.slots)}, but `tx` keeps no Adam or SGD-momentum state to hold them."
        )
    moving = [p for n, p in flax_of.items() if n not in in_group and probed[p]["moves"]]
    if moving:
        raise ValueError(
            f"{state.path or 'the optimizer state'}: {moving[:3]} are in no torch param group "
            "(frozen), but `tx` updates them; freeze them (optax.multi_transform with "
            "optax.set_to_zero(), as bridge.optax_for(state) does)."
        )
    return params, fill_state(opt_state, held, values, step)
