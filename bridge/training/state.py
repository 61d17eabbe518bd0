"""A training checkpoint read for optax: the weights and the optimizer state of a
``torch.save`` run file, a DeepSpeed ZeRO folder, a DCP folder or a pair in memory
(opened by their readers, :func:`bridge.sources.registry.open_training`), with
the ties declared for it, refusing a tie nothing declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.layouts.rules import RulesArg, as_rules
from bridge.sources.declared import declare_ties, tie_map
from bridge.sources.registry import open_training
from jaxshare.formats import TrainingState
from jaxshare.internal import is_floating, same_bytes

__all__ = ["read_training"]


def read_training(
    source: Any,
    rules: RulesArg = None,
    *,
    ties: Mapping[str, str] | Sequence[str] = (),
    config: Any = None,
) -> TrainingState:
    """The weights and the optimizer state of ``source``: a ``torch.save`` of
    ``{"model": ..., "optimizer": ...}``, a DeepSpeed folder, a DCP folder, or
    ``(model_or_state_dict, optimizer_or_its_state_dict)`` in memory; with the
    ``ties`` (``{alias: canonical}`` or ``"ALIAS=CANONICAL"``) and those ``config``
    declares, which a DCP folder does not record, each checked by content.

    Raises:
      ValueError: one line: a weight in no param group that equals a grouped one
        bit for bit (one Parameter saved under two names: a tie nothing declares;
        its state would be lost), or as :func:`bridge.sources.declared.declare_ties`.
    """
    if isinstance(source, TrainingState):
        return source
    training = open_training(source, as_rules(rules))
    if ties or config is not None:
        declared = tie_map(ties)
        params = declare_ties(training.params, declared, config=config, rules=as_rules(rules))
        training = TrainingState(params, training.optimizer)
    _refuse_undeclared_ties(training)
    return training


def _refuse_undeclared_ties(training: TrainingState) -> None:
    """One line where a floating weight in no param group is a grouped weight's copy,
    bit for bit: the two names of one Parameter (DCP keeps both and records no tie),
    which untied would train one and freeze the other."""
    params, state = training.params, training.optimizer
    grouped = {name for group in state.groups for name in group.names}
    loose = [
        name
        for name, info in params.infos.items()
        if name not in grouped and name not in params.ties and is_floating(info.dtype)
    ]
    if not loose:
        return
    by_kind: dict[tuple[tuple[int, ...], str], list[str]] = {}
    for name in grouped:
        info = params.infos.get(name)
        if info is not None:
            by_kind.setdefault((tuple(info.shape), info.dtype), []).append(name)
    for name in loose:
        info = params.infos[name]
        for other in sorted(by_kind.get((tuple(info.shape), info.dtype), [])):
            if same_bytes(params.array(name), params.array(other)):
                raise ValueError(
                    f"{params.where}: {name!r} is in no param group but equals {other!r} bit "
                    "for bit: one Parameter saved under two names, a tie the input does not "
                    f"record; declare it (`ties={{{name!r}: {other!r}}}`, --tie "
                    f"{name}={other}, or the model's config.json) so its state is kept once."
                )
