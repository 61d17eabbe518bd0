"""A torch optimizer's values in the probe's terms, and back: each param group's
hyper-parameters (:func:`torch_hyper`), the entry torch writes for a group of
probed values (:func:`torch_group`), and the one step of all parameters
(:func:`step_of`). Which optimizer a state is, is
:attr:`jaxshare.formats.OptimizerState.kind`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxshare.formats import OptimizerState, ParamGroup

__all__ = ["step_of", "torch_group", "torch_hyper"]


def torch_hyper(kind: str, group: ParamGroup, where: str = "the optimizer state") -> dict[str, Any]:
    """The values of one PyTorch param group that decide its update, in the
    probe's terms (``lr``, ``b1``, ``b2``, ``eps``, ``weight_decay`` (decoupled),
    ``l2``; ``momentum``, ``nesterov``, ``dampening``; ``amsgrad``, ``maximize``).

    >>> h = torch_hyper("adam", ParamGroup(("w",), {"lr": 1e-3, "betas": (0.9, 0.999),
    ...     "eps": 1e-8, "weight_decay": 0.1, "decoupled_weight_decay": True}))
    >>> h["lr"], h["b1"], h["b2"], h["eps"], h["weight_decay"], h["l2"]
    (0.001, 0.9, 0.999, 1e-08, 0.1, 0.0)
    """
    h = group.hyper
    wd = float(h.get("weight_decay", 0.0))
    out: dict[str, Any] = {"lr": float(h.get("lr", 0.0))}
    if kind == "adam":
        b1, b2 = (float(b) for b in h.get("betas", (0.9, 0.999)))
        decoupled = h.get("decoupled_weight_decay", h.get("adam_w_mode"))
        if decoupled is None and wd != 0:
            raise ValueError(
                f"{where}: a param group has weight_decay {wd} and no 'decoupled_weight_decay', "
                "so Adam (L2) and AdamW cannot be told apart; re-save it with torch >= 2.5, "
                "or add the entry to the group."
            )
        out |= {"b1": b1, "b2": b2, "eps": float(h.get("eps", 1e-8))}
        out |= {"weight_decay": wd if decoupled else 0.0, "l2": 0.0 if decoupled else wd}
        out |= {"amsgrad": bool(h.get("amsgrad", False))}
    else:
        out |= {"momentum": float(h.get("momentum", 0.0)), "l2": wd}
        out |= {"nesterov": bool(h.get("nesterov", False))}
        out |= {"dampening": float(h.get("dampening", 0.0))}
    out["maximize"] = bool(h.get("maximize", False))
    return out


def torch_group(
    kind: str | None, names: Sequence[str], h: Mapping[str, Any], ids: list[int]
) -> dict[str, Any]:
    """One entry of ``optimizer.state_dict()["param_groups"]`` as torch writes it,
    of values in the probe's terms (:func:`torch_hyper`'s).

    >>> h = {"lr": 0.1, "momentum": 0.9, "l2": 0.0, "nesterov": False}
    >>> group = torch_group("sgd", ["w"], h, [0])
    >>> group["momentum"], group["weight_decay"], group["params"], group["param_names"]
    (0.9, 0.0, [0], ['w'])
    """
    if kind == "adam":
        decoupled = bool(h["weight_decay"]) or not h["l2"]
        group: dict[str, Any] = {
            "lr": h["lr"],
            "betas": (h["b1"], h["b2"]),
            "eps": h["eps"],
            "weight_decay": h["weight_decay"] if decoupled else h["l2"],
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "decoupled_weight_decay": decoupled,
        }
    else:
        group = {
            "lr": h["lr"],
            "momentum": h.get("momentum", 0.0),
            "dampening": 0,
            "weight_decay": h["l2"],
            "nesterov": bool(h.get("nesterov", False)),
            "maximize": False,
            "foreach": None,
            "differentiable": False,
            "fused": None,
        }
    return group | {"params": ids, "param_names": list(names)}


def step_of(state: OptimizerState) -> int:
    """The one step of every parameter (``0`` where none has state); differing
    steps are one line (optax keeps one count).

    >>> step_of(OptimizerState(None, "torch", (), {"w": 3, "b": 3}, {}))
    3
    """
    steps = dict(state.steps)
    if not steps:
        return 0
    values = sorted(set(steps.values()))
    if len(values) > 1:
        first = {v: next(n for n, s in steps.items() if s == v) for v in values[:2]}
        raise ValueError(
            f"{state.path or 'the optimizer state'}: the parameters' steps differ "
            f"({first[values[0]]!r} at {values[0]}, {first[values[1]]!r} at {values[1]}); "
            "optax keeps one count for all parameters, so they cannot be carried over."
        )
    return int(values[0])
