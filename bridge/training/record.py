"""The way back's record: what a trained optax state says of torch's param groups.

:func:`record_groups` reads, from a trained ``Tied``, its optax state and ``tx``,
the optimizer's kind, its step and each group's PyTorch names and values (by the
probe); :func:`optimizer_record` is the JSON record a training step keeps of
them, from which :func:`bridge.optax_for` rebuilds ``tx`` and the way back names
the groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bridge.training.optax_state import KINDS, counts, found_states, leaves_by_path
from bridge.training.probe import ATOL, close, format_value, probe

if TYPE_CHECKING:
    from jaxshare import Tied

__all__ = ["optimizer_record", "record_groups"]


def record_groups(
    params: Tied, opt_state: Any, tx: Any, names: Sequence[Sequence[str]] | None
) -> tuple[str | None, int, list[tuple[tuple[str, ...], dict[str, Any]]]]:
    """``(kind, step, [(PyTorch names, torch values)])`` of a trained optax state:
    the kind ``tx`` keeps, the count, and per group (``names``; default: the
    parameters grouped by what ``tx`` does to them) the values read by the probe."""
    opt_kind = None
    for kind in KINDS:
        if found_states(opt_state)[kind]:
            opt_kind = kind
    kind = opt_kind or "sgd"
    found = counts(opt_state)
    step = max(found) if found else 0
    probed = probe(tx, params, kind, step)
    naming = params.alias_map.naming
    if naming is None:
        raise ValueError(
            "`params` carries no naming record (its alias map's `naming`): pass the `Tied` "
            "that to_optax or checkpoint.restore gave, whose record names every leaf in PyTorch."
        )
    held = leaves_by_path(params)  # (In the naming record's order: the torch source's.)
    torch_of = {p: naming[p].torch for p in naming if p in held}
    torch_of |= {p: naming[p].torch for p in held if p not in torch_of}
    path_of = {t: p for p, t in torch_of.items()}
    keys = (
        ["lr", "b1", "b2", "eps", "weight_decay", "l2"]
        if kind == "adam"
        else ["lr", "momentum", "l2", "nesterov"]
    )

    def values(path: str) -> dict[str, Any]:
        got = probed[path]
        if not got.get("formula"):
            raise ValueError(
                f"`tx` does not update {torch_of[path]!r} as torch's Adam/AdamW/SGD would "
                "(a transform in the chain that changes the update?); it has no torch state dict."
            )
        # (Read through tx's float32 arithmetic: 5 significant digits hold.)
        out = {k: (bool(got[k]) if k == "nesterov" else _round(got[k])) for k in keys}
        for k in ("weight_decay", "l2"):  # (Read within ATOL of none: none.)
            if k in out and abs(out[k]) <= ATOL:
                out[k] = 0.0
        if kind == "adam":
            out |= {"amsgrad": False}
        else:
            out |= {"dampening": 0.0}
        return out | {"maximize": False}

    if names is None:
        groups: list[tuple[list[str], dict[str, Any]]] = []
        for path, name in torch_of.items():
            if not probed[path]["moves"]:
                continue  # (Frozen: in no group.)
            h = values(path)
            for members, gh in groups:
                if all(close(gh[k], h[k]) if isinstance(h[k], float) else gh[k] == h[k] for k in h):
                    members.append(name)
                    break
            else:
                groups.append(([name], h))
        return opt_kind, step, [(tuple(n), h) for n, h in groups]
    out = []
    for i, members in enumerate(names):
        unknown = [n for n in members if n not in path_of]
        if unknown:
            raise ValueError(
                f"`groups` {i} names {unknown[:3]}, which `params` has no leaf for (it has "
                f"e.g. {list(path_of)[:3]})."
            )
        hs = [values(path_of[n]) for n in members]
        for n, h in zip(members, hs, strict=True):
            diff = [
                k
                for k in h
                if not (close(h[k], hs[0][k]) if isinstance(h[k], float) else h[k] == hs[0][k])
            ]
            if diff:
                raise ValueError(
                    f"`groups` {i}: `tx` updates {n!r} and {members[0]!r} differently "
                    f"({diff[0]}: {format_value(h[diff[0]])} vs "
                    f"{format_value(hs[0][diff[0]])}); one torch param group has one value of each."
                )
        out.append((tuple(members), hs[0] if hs else {}))
    return opt_kind, step, out


def _round(v: Any) -> float:
    """A value read through ``tx``'s float32 arithmetic, to the 5 significant digits
    that hold (``0.0`` for none, or NaN)."""
    v = float(v)
    return 0.0 if abs(v) < 1e-30 or math.isnan(v) else float(f"{v:.5g}")


def optimizer_record(
    kind: str | None, step: int, groups: Sequence[tuple[Sequence[str], Mapping[str, Any]]]
) -> dict[str, Any]:
    """The JSON record a training step keeps of its optimizer: what
    :func:`bridge.optax_for` rebuilds ``tx`` from and the way back names groups by.

    >>> optimizer_record("sgd", 3, [(["w"], {"lr": 0.1})])["groups"]
    [{'names': ['w'], 'hyper': {'lr': 0.1}}]
    """
    return {
        "format": "jaxshare.optimizer",
        "version": 1,
        "kind": kind or "sgd",
        "step": int(step),
        "groups": [{"names": list(n), "hyper": dict(h)} for n, h in groups],
    }
