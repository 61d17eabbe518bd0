"""The probe: what ``tx`` does to each parameter, read back from what it does.

``tx`` is never taken apart: optax keeps hyper-parameters in closures. Instead
:func:`probe` runs ``tx.update`` once on a few probe values per parameter (a
zero gradient, chosen moments and weights, the count at the step) and reads the
learning rate, the betas, ``eps`` and the weight decays back from what ``tx``
does, per parameter -- so a chain (``clip_by_global_norm`` + ``adamw``), a
schedule (read at the step), ``optax.multi_transform`` over groups and
``mask=`` are all read as they act. A last probe value checks the whole update
against the PyTorch formula; the values are compared within a relative 1e-4
(:func:`close`; the probe runs in ``tx``'s float32). :func:`check_hyper` holds
what was read against the torch param groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bridge.training.hyper import torch_hyper
from bridge.training.optax_state import KINDS, fill_state, leaves_by_path, moments_of, tx_kind
from jaxshare.formats import OptimizerState

__all__ = ["ATOL", "check_hyper", "close", "format_value", "probe"]

#: How messages name each value, in order.
_LABELS = {
    "lr": "lr",
    "b1": "betas[0]",
    "b2": "betas[1]",
    "eps": "eps",
    "weight_decay": "decoupled weight_decay (AdamW)",
    "l2": "L2 weight_decay (added to the gradient)",
    "momentum": "momentum",
    "nesterov": "nesterov",
    "dampening": "dampening",
    "amsgrad": "amsgrad",
    "maximize": "maximize",
}
_RTOL = 1e-4
#: Weight decays are read beside an Adam step of about 1: compared within this, absolute.
ATOL = 1e-6
_GAMMA = 1e-4  # A probe gradient small enough that no clipping by norm acts on it.

# Probe lanes, per parameter: (moment 1, moment 2, weight, gradient).
_ADAM_LANES = np.array(
    [[0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0.3, 0.5, -0.7, 0]], np.float32
)
_SGD_LANES = np.array(
    [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, _GAMMA], [0.3, 0, -0.7, _GAMMA / 2]], np.float32
)


def probe(tx: Any, params: Any, kind: str, step: int) -> dict[str, dict[str, Any]]:
    """What ``tx`` does to each parameter, read from one ``tx.update`` of probe
    values at count ``step``: ``{flax path: {"lr": ..., "b1": ..., ...}}``, plus
    ``"formula"`` (whether a random probe value agrees with PyTorch's update of
    those values) and ``"moves"`` (whether ``tx`` changes the parameter at all).

    ``params`` is the ``Tied`` (or tree) ``tx`` trains; each leaf is probed as a
    small array of its rank (masks that look at ``ndim`` still see it)."""
    import jax
    import jax.numpy as jnp

    lanes = _ADAM_LANES if kind == "adam" else _SGD_LANES
    k = len(lanes)

    def lane(column: int) -> Callable[[Any], Any]:
        def make(leaf: Any) -> Any:
            shape = (1,) * max(len(leaf.shape) - 1, 0) + (k,)
            return jnp.asarray(lanes[:, column].reshape(shape), jnp.float32)

        return make

    probe_params = jax.tree.map(lane(2), params)
    grads = jax.tree.map(lane(3), params)
    state = tx.init(probe_params)
    held = tx_kind(state, kind)
    fields = list(KINDS[kind].values())
    values = {
        f: leaves_by_path(jax.tree.map(lane(i), params)) for i, f in enumerate(fields) if held
    }
    state = fill_state(state, held, values, step)
    updates, new_state = tx.update(grads, state, probe_params)
    u = {p: np.asarray(v, np.float64).reshape(-1) for p, v in leaves_by_path(updates).items()}
    new = moments_of(new_state, kind) if held else {}
    new = {
        f: {p: np.asarray(v, np.float64).reshape(-1) for p, v in d.items()} for f, d in new.items()
    }
    read = _read_adam if kind == "adam" else _read_sgd
    out = {}
    for path, up in u.items():
        moments = [new[f][path] if path in new.get(f, {}) else None for f in fields]
        with np.errstate(all="ignore"):
            out[path] = read(up, moments, step + 1)
        out[path]["moves"] = bool(np.any(up != 0))
    return out


def close(a: float, b: float, atol: float = 1e-30) -> bool:
    """Whether ``a`` and ``b`` agree within a relative 1e-4 (and ``atol``); two NaNs do.

    >>> close(1.0, 1.00001), close(1.0, 1.001), close(0.0, 1e-7, ATOL)
    (True, False, True)
    """
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= _RTOL * max(abs(a), abs(b)) + atol


def _read_adam(u: np.ndarray, m: list[np.ndarray | None], t: int) -> dict[str, Any]:
    mu, nu = m
    if mu is None or nu is None:
        return {"formula": False}
    b1, b2 = float(mu[1]), float(nu[2])
    l2 = float(mu[0]) / (1 - b1) if b1 != 1 else 0.0
    c1, c2 = 1 - b1**t, 1 - b2**t
    mh, nh = b1 / c1, b2 / c2
    eps = math.sqrt(nh) / (u[1] / u[3] - 1) if u[3] != 0 else math.nan
    lr = -u[3] * (math.sqrt(nh) + eps) / mh if u[3] != 0 else 0.0

    def adam(mu1: float, nu1: float) -> float:
        return (mu1 / c1) / (math.sqrt(max(nu1, 0.0) / c2) + eps)

    wd = -u[0] / lr - adam(float(mu[0]), float(nu[0])) if lr else math.nan
    g = l2 * -0.7  # (lane 4: moments 0.3, 0.5, weight -0.7, no gradient)
    mu4, nu4 = b1 * 0.3 + (1 - b1) * g, b2 * 0.5 + (1 - b2) * g * g
    want = -lr * (adam(mu4, nu4) + wd * -0.7)
    ok = close(want, float(u[4])) and close(mu4, float(mu[4])) and close(nu4, float(nu[4]))
    return {"lr": lr, "b1": b1, "b2": b2, "eps": eps, "weight_decay": wd, "l2": l2, "formula": ok}


def _read_sgd(u: np.ndarray, m: list[np.ndarray | None], t: int) -> dict[str, Any]:
    (trace,) = m
    mom = float(trace[1]) if trace is not None else 0.0
    l2 = float(trace[0]) if trace is not None else 0.0
    plain = -u[2] / _GAMMA
    nest = plain / (1 + mom)
    nesterov = trace is not None and mom != 0 and close(float(u[1]), -nest * mom * mom)
    lr = nest if nesterov else plain
    total = (1 + mom) if nesterov else 1.0
    wd = -u[0] / lr - l2 * total if lr else math.nan
    if trace is None:  # (No momentum: a weight decay anywhere is the same update.)
        l2, wd = wd, 0.0
    g = _GAMMA / 2 + l2 * -0.7
    tr = g + mom * 0.3
    want = -lr * ((g + mom * tr) if nesterov else tr) - lr * wd * -0.7
    ok = close(want, float(u[3])) and (trace is None or close(tr, float(trace[3])))
    return {
        "lr": lr,
        "momentum": mom,
        "l2": l2,
        "weight_decay": wd,
        "nesterov": nesterov,
        "dampening": 0.0,
        "formula": ok,
    }


def format_value(v: Any) -> str:
    """A probed value as messages show it: 5 significant digits.

    >>> format_value(0.0010000123), format_value(True)
    ('0.001', 'True')
    """
    return str(v) if isinstance(v, bool) else f"{v:.5g}"


def check_hyper(
    state: OptimizerState,
    kind: str,
    probed: Mapping[str, Mapping[str, Any]],
    flax_of: Mapping[str, str],
) -> None:
    """Raises ``ValueError``, one line per param group that ``tx`` does not update as
    PyTorch does, naming each value on both sides."""
    where = state.path or "the optimizer state"
    problems = []
    for i, group in enumerate(state.groups):
        want = torch_hyper(kind, group, str(where))
        paths = [flax_of[n] for n in group.names if n in flax_of]
        seen = [probed[p] for p in paths if p in probed]
        if not seen:
            continue
        bad: dict[str, set[str]] = {}
        for got in seen:
            if not got.get("formula", False):
                bad.setdefault("update", set()).add("not Adam's/SGD's")
                continue
            for key, value in want.items():
                theirs = got.get(key, False if isinstance(value, bool) else 0.0)
                if key == "weight_decay" and kind == "sgd":
                    continue
                atol = ATOL if key in ("weight_decay", "l2") else 1e-30
                same = (
                    theirs == value
                    if isinstance(value, bool)
                    else close(float(theirs), value, atol)
                )
                if not same:
                    bad.setdefault(key, set()).add(format_value(theirs))
        if kind == "sgd":
            extra = {
                format_value(g["weight_decay"])
                for g in seen
                if g.get("formula") and abs(g["weight_decay"]) > ATOL
            }
            if extra:
                bad["weight_decay"] = extra
                want = {**want, "weight_decay": 0.0}
        if bad:
            parts = [
                f"the update is not {'Adam' if kind == 'adam' else 'SGD'}'s formula (a "
                "transform in the chain that changes it, eps_root, nesterov Adam?)"
                if key == "update"
                else f"{_LABELS.get(key, key)}: torch {format_value(want[key])}, optax "
                f"{', '.join(sorted(vals))}"
                for key, vals in bad.items()
            ]
            problems.append(
                f"param group {i} ({len(group.names)} params, e.g. {group.names[0]!r}): "
                + "; ".join(parts)
            )
    if problems:
        raise ValueError(
            f"{where}: `tx` does not make the torch optimizer's update: "
            + " | ".join(problems)
            + ". Build `tx` with the torch values (bridge.optax_for(state) does), with "
            "optax.multi_transform where the groups differ."
        )
