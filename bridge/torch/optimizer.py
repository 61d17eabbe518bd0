"""A live model and optimizer (or their state dicts) as a training state: the
weights' source and the numpy-level :class:`jaxshare.formats.OptimizerState` every
reader of a file gives, named as the model names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from bridge.layouts.rules import Rules
from bridge.torch.state_dict import StateDictSource
from bridge.torch.tensors import as_numpy
from jaxshare.formats import OptimizerState
from jaxshare.stream import TensorSource

__all__ = ["training_in_memory"]


def _numpy(value: Any, where: str) -> Any:
    """An optimizer state dict with every tensor as a numpy array."""
    if isinstance(value, torch.Tensor):
        return as_numpy(value.detach(), where)
    if isinstance(value, Mapping):
        return {k: _numpy(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v, where) for v in value)
    return value


def training_in_memory(
    model: Any, optimizer: Any, rules: Rules
) -> tuple[TensorSource, OptimizerState]:
    """A model (or its state dict) and its optimizer (or its state dict) as the
    weights' source and the optimizer state, named as the model names them."""
    from jaxshare.formats import optimizer_state

    source = StateDictSource(model, rules, arg="source[0]")
    names: list[str] | None = None
    if isinstance(optimizer, torch.optim.Optimizer):
        sd = optimizer.state_dict()
        if isinstance(model, torch.nn.Module):
            name_of = {id(p): n for n, p in model.named_parameters()}
            unknown = [i for g in optimizer.param_groups for i, p in enumerate(g["params"])
                       if id(p) not in name_of]  # fmt: skip
            if unknown:
                raise ValueError(
                    "`source[1]`: the optimizer holds parameters that are not the model's; "
                    "pass the model the optimizer was built over."
                )
            names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    elif isinstance(optimizer, Mapping):
        sd = optimizer
        # model.parameters()' order is the optimizer's only for one group built from it;
        # several groups need their param_names (else one line says so).
        if isinstance(model, torch.nn.Module) and len(sd.get("param_groups", ())) == 1:
            names = [n for n, _ in model.named_parameters()]
    else:
        raise TypeError(
            "`source[1]` must be a torch.optim.Optimizer or its state_dict(), got "
            f"{type(optimizer).__name__}."
        )
    return source, optimizer_state(_numpy(sd, "optimizer"), names, params=source)
