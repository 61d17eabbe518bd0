"""``from_optax``: an optax training state back to a ``model.state_dict()`` and an
``optimizer.state_dict()`` that ``load_state_dict`` takes (the torch side of
:mod:`bridge.training.to_optax`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from bridge.layouts.layout import Layout
from bridge.layouts.rules import RulesArg
from bridge.naming.to_torch import to_torch
from bridge.training.hyper import torch_group
from bridge.training.optax_state import KINDS, moments_of
from bridge.training.record import record_groups
from jaxshare import Tied

__all__ = ["from_optax", "save_run"]


def from_optax(
    params: Tied,
    opt_state: Any,
    tx: Any,
    /,
    *,
    like: Any = None,
    groups: Sequence[Sequence[str]] | torch.optim.Optimizer | None = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optax training state back to PyTorch: ``(state_dict, optimizer_state)``
    for ``model.load_state_dict`` and ``optimizer.load_state_dict``.

    The state dict is :func:`bridge.to_torch` of ``params`` (every alias present,
    the very tensor of its canonical). The optimizer state is what
    ``optimizer.state_dict()`` holds: ``state`` keyed by each parameter's index
    in the groups (a tie once), with ``step`` as a float32 tensor and the
    moments (``exp_avg``/``exp_avg_sq`` or ``momentum_buffer``) named and laid
    out as their parameters; ``param_groups`` with ``param_names`` and the values
    ``tx`` updates with, read back by probing it (see :func:`bridge.to_optax`)
    through its float32 arithmetic, to 5 significant digits (a training run's
    record, ``jaxshare convert RUN run.pt``, keeps the torch values exactly).

    Args:
      params: the ``Tied`` trained (it must carry the naming record, as
        :func:`bridge.to_optax` and ``checkpoint.restore`` give it).
      opt_state: the optax state of ``tx`` over ``params``.
      tx: the optax transformation (Adam, AdamW, SGD, or a chain holding one).
      like: the torch module (or state dict) to name after, as in
        :func:`bridge.to_torch`.
      groups: the PyTorch names of each param group, in the order of the
        optimizer that will load the state -- or that optimizer itself (then
        ``like`` must be its model). Default: the parameters ``tx`` updates,
        grouped by the values it updates them with, in ``like``'s
        ``named_parameters()`` order (else the naming record's).
      rules, layout: as in :func:`bridge.to_torch`.

    Raises:
      ValueError: one line: a ``tx`` whose update torch's Adam/AdamW/SGD cannot
        make, a group whose parameters ``tx`` updates differently, a name
        ``params`` lacks.

    >>> import torch, optax
    >>> model = torch.nn.Linear(3, 2)
    >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    >>> model(torch.ones(3)).sum().backward(); opt.step()
    >>> import bridge
    >>> tx = optax.adamw(1e-2, weight_decay=0.1)
    >>> params, opt_state = bridge.to_optax((model, opt), tx)
    >>> sd, osd = from_optax(params, opt_state, tx, like=model)
    >>> fresh = torch.nn.Linear(3, 2)
    >>> fresh_opt = torch.optim.AdamW(fresh.parameters())
    >>> _ = fresh.load_state_dict(sd); fresh_opt.load_state_dict(osd)
    >>> torch.equal(fresh_opt.state[fresh.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])
    True
    """
    import jax
    import jax.numpy as jnp

    if not isinstance(params, Tied):
        raise TypeError(f"`params` must be a jaxshare.Tied, got {type(params).__name__}.")
    names: list[list[str]] | None = None
    if isinstance(groups, torch.optim.Optimizer):
        if not isinstance(like, torch.nn.Module):
            raise TypeError("`groups` is an optimizer: pass its model as `like=` to name it.")
        name_of = {id(p): n for n, p in like.named_parameters()}
        names = [[name_of[id(p)] for p in g["params"]] for g in groups.param_groups]
    elif groups is not None:
        names = [list(g) for g in groups]
    kind, step, found = record_groups(params, opt_state, tx, names)
    if names is None and isinstance(like, torch.nn.Module):
        order = {n: i for i, (n, _) in enumerate(like.named_parameters())}
        found = [(tuple(sorted(n, key=lambda k: order.get(k, len(order)))), h) for n, h in found]
        found.sort(key=lambda group: order.get(group[0][0], len(order)))
    state_dict = to_torch(params, like=like, rules=rules, layout=layout)
    moments: dict[str, dict[str, torch.Tensor]] = {}
    if kind is not None:
        by_field = moments_of(opt_state, kind)
        for slot, field in KINDS[kind].items():
            unique = jax.tree_util.tree_map_with_path(
                functools.partial(_held, by_field[field], jnp=jnp), params.unique
            )
            moments[slot] = to_torch(params.replace(unique), like=like, rules=rules, layout=layout)
    state: dict[int, dict[str, Any]] = {}
    param_groups = []
    i = 0
    for members, h in found:
        ids = []
        for name in members:
            entry: dict[str, Any] = {}
            if kind == "adam":
                entry["step"] = torch.tensor(float(step))
            for slot in moments:
                entry[slot] = moments[slot][name].detach().clone().contiguous()
            if entry:
                state[i] = entry
            ids.append(i)
            i += 1
        param_groups.append(torch_group(kind, members, h, ids))
    return state_dict, {"state": state, "param_groups": param_groups}


def save_run(run: Mapping[str, Any], path: Any) -> None:
    """``torch.save`` of a run file (``{"model": ..., "optimizer": ...}``)."""
    torch.save(dict(run), path)


def _held(held: Mapping[str, Any], kp: Any, leaf: Any, *, jnp: Any) -> Any:
    from jaxshare.internal import keypath_to_path, render

    path = render(keypath_to_path(kp))
    return held[path] if path in held else jnp.zeros(leaf.shape, jnp.float32)
