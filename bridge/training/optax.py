"""``to_optax``: a PyTorch optimizer's state as an optax state over a ``Tied``.

A PyTorch optimizer keeps, per parameter, a few tensors of the parameter's shape
(Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``) and a step;
optax keeps the same tensors as trees shaped like the params (``ScaleByAdamState``
``mu``/``nu``, ``TraceState`` ``trace``) and one ``count``. So a moment is
placed exactly as its parameter: each slot of the optimizer state is handed to
:func:`bridge.to_flax` as a source with the parameters' names, shapes, layer
types and ties (:class:`_SlotSource`), and lands at its parameter's Flax path,
with its transpose, one leaf per tie -- as the ``Tied`` of the params holds one.

``tx`` is never taken apart: optax keeps hyper-parameters in closures. Instead
:func:`probe` runs ``tx.update`` once on a few probe values per parameter (a
zero gradient, chosen moments and weights, the count at the step) and reads the
learning rate, the betas, ``eps`` and the weight decays back from what ``tx``
does, per parameter -- so a chain (``clip_by_global_norm`` + ``adamw``), a
schedule (read at the step), ``optax.multi_transform`` over groups and
``mask=`` are all read as they act. A last probe value checks the whole update
against the PyTorch formula; the values are compared within a relative 1e-4
(the probe runs in ``tx``'s float32). :func:`optax_for` builds the ``tx`` that
makes PyTorch's update for given param groups, and the record of them
(:func:`optimizer_record`) is what a training step stores beside its items.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bridge.layouts.layout import Layout
from bridge.layouts.rules import RulesArg, as_rules
from bridge.sources.declared import declare_ties, tie_map
from jaxshare.formats import OptimizerState, ParamGroup
from jaxshare.internal import is_floating, keypath_to_path, render, same_bytes
from jaxshare.stream import ArrayInfo, TensorSource

if TYPE_CHECKING:
    from jaxshare import Tied

__all__ = [
    "KINDS",
    "TrainingState",
    "describe",
    "fill_state",
    "moments_of",
    "optax_for",
    "optimizer_record",
    "probe",
    "read_training",
    "training_report",
    "record_groups",
    "to_optax",
    "torch_hyper",
]

#: The optimizers carried, by the slots of their state: ``{kind: {torch slot: optax field}}``.
KINDS: dict[str, dict[str, str]] = {
    "adam": {"exp_avg": "mu", "exp_avg_sq": "nu"},
    "sgd": {"momentum_buffer": "trace"},
}
#: Group entries that change no arithmetic (how torch runs the update, schedulers' notes).
_IGNORED = frozenset(
    {"foreach", "capturable", "differentiable", "fused", "initial_lr", "bias_correction"}
)
_KNOWN = {
    "adam": frozenset(
        {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"}
        | {"adam_w_mode"}
    ),
    "sgd": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}),
}
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
_ATOL = 1e-6  # Weight decays are read beside an Adam step of about 1: absolute.
_GAMMA = 1e-4  # A probe gradient small enough that no clipping by norm acts on it.


@dataclasses.dataclass(frozen=True)
class TrainingState:
    """What a training checkpoint holds: the weights and the optimizer's state.

    Attributes:
      params: the weights in PyTorch names (DeepSpeed's: the fp32 masters).
      optimizer: the optimizer's groups, steps and per-parameter slots.
    """

    params: TensorSource
    optimizer: OptimizerState


# -- the source ----------------------------------------------------------------------


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
    training = _read_training(source, rules)
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


def _read_training(source: Any, rules: RulesArg) -> TrainingState:
    """:func:`read_training` of the source alone."""
    if isinstance(source, tuple) and len(source) == 2:
        from bridge.torch.optimizer import training_in_memory  # (torch objects)

        return TrainingState(*training_in_memory(*source, as_rules(rules)))
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            "`source` must be a path (a torch.save run file, a DeepSpeed or DCP folder) or a "
            "pair (model_or_state_dict, optimizer_or_its_state_dict), got "
            f"{type(source).__name__}."
        )
    from bridge.sources.registry import is_deepspeed_folder
    from jaxshare import formats

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    if formats.is_dcp_folder(path):
        return TrainingState(*formats.read_dcp_training(path))
    if is_deepspeed_folder(path):
        return TrainingState(*formats.read_deepspeed_training(path))
    if path.is_file() and path.suffix in formats.TORCH_SUFFIXES:
        return TrainingState(*formats.read_torch_training(path))
    raise ValueError(
        f"{path}: expected a training checkpoint -- a torch.save of {{'model': state_dict, "
        "'optimizer': optimizer.state_dict()}, a DeepSpeed folder or a DCP folder -- found "
        f"{'a directory' if path.is_dir() else 'a ' + (path.suffix or 'suffix-less') + ' file'}."
    )


class _SlotSource(TensorSource):
    """One slot of the optimizer state (``exp_avg``, ...) with the parameters' names,
    shapes, layer types and ties: placed by the same plan as the parameters. A
    tensor with no state of its own (a buffer, a frozen parameter) reads as zeros."""

    mapped = True

    def __init__(self, params: TensorSource, slot: TensorSource) -> None:
        self.path, self.kind = params.path, params.kind
        self._params, self._slot = params, slot
        self.infos = {name: ArrayInfo(info.shape, "float32") for name, info in params.infos.items()}
        self.ties, self.layers = params.ties, params.layers
        for attr in ("config", "buffers"):
            if hasattr(params, attr):
                setattr(self, attr, getattr(params, attr))

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


# -- torch's side --------------------------------------------------------------------


def _kind_of(state: OptimizerState) -> str:
    """``"adam"`` or ``"sgd"``; any other state is refused in one line."""
    where = state.path or "the optimizer state"
    if state.unknown:
        more = f" (and {len(state.unknown) - 3} more)" if len(state.unknown) > 3 else ""
        raise ValueError(
            f"{where}: the optimizer state holds entries jaxshare cannot carry into optax: "
            f"{'; '.join(state.unknown[:3])}{more}; they would be reset, so nothing is "
            "converted. Convert the weights alone (bridge.to_flax) and start the optimizer anew."
        )
    slots = set(state.slots)
    keys = {k for g in state.groups for k in g.hyper} - _IGNORED
    for kind, fields in KINDS.items():
        if slots <= set(fields) and keys <= _KNOWN[kind] and (slots or "betas" not in keys):
            if kind == "adam" and "betas" not in keys:
                continue
            if kind == "sgd" and "momentum" not in keys:
                continue
            return kind
    extra = sorted(keys - _KNOWN["adam"] - _KNOWN["sgd"])
    raise ValueError(
        f"{where}: not an optimizer jaxshare carries: its state has slots {sorted(slots)}"
        + (f" and its groups entries no torch Adam, AdamW or SGD has: {extra}" if extra else "")
        + "; only those three map exactly onto optax's adam, adamw and sgd, so nothing is "
        "converted (its state would be lost)."
    )


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


def _group_of(state: OptimizerState) -> dict[str, int]:
    return {name: i for i, g in enumerate(state.groups) for name in g.names}


def _step_of(state: OptimizerState) -> int:
    """The one step of every parameter; differing steps are one line."""
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


# -- optax's side: finding and filling the state ---------------------------------------


def _state_types() -> dict[str, type]:
    import optax

    return {"adam": optax.ScaleByAdamState, "sgd": optax.TraceState}


def _walk(node: Any, fn: Callable[[Any], Any | None]) -> Any:
    """``node`` rebuilt with ``fn`` applied to every container (an optimizer state's
    NamedTuples, tuples, lists, dicts) top down: where ``fn`` returns a value, that
    value replaces the container."""
    done = fn(node)
    if done is not None:
        return done
    if _is_tied(node):
        return node
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return type(node)(*(_walk(x, fn) for x in node))
    if isinstance(node, (tuple, list)):
        return type(node)(_walk(x, fn) for x in node)
    if isinstance(node, dict):
        return {k: _walk(v, fn) for k, v in node.items()}
    return node


def _is_tied(x: Any) -> bool:
    """Whether ``x`` is a ``jaxshare.Tied`` (asked only of optax trees: JAX is in use)."""
    from jaxshare import Tied

    return isinstance(x, Tied)


def _leaves(tree: Any) -> dict[str, Any]:
    """``{rendered path: leaf}`` of a ``Tied`` (its unique tree) or a tree."""
    import jax

    if _is_tied(tree):
        tree = tree.unique
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {render(keypath_to_path(kp)): leaf for kp, leaf in flat}


def _found(opt_state: Any) -> dict[str, list[Any]]:
    """The Adam and SGD-momentum states in ``opt_state``, by kind."""
    found: dict[str, list[Any]] = {kind: [] for kind in KINDS}
    types = _state_types()

    def visit(node: Any) -> None:
        for kind, t in types.items():
            if isinstance(node, t):
                found[kind].append(node)

    _walk(opt_state, lambda n: visit(n))
    return found


def _tx_kind(opt_state: Any, want: str) -> str | None:
    """The kind of state ``tx`` keeps (``None``: neither, e.g. plain SGD)."""
    found = {k: v for k, v in _found(opt_state).items() if v}
    if len(found) > 1:
        raise ValueError(
            "`tx` keeps both Adam and SGD-momentum state; jaxshare fills one optimizer's."
        )
    kind = next(iter(found), None)
    if kind is not None and kind != want:
        names = {"adam": "Adam/AdamW", "sgd": "SGD"}
        raise ValueError(
            f"the torch optimizer is {names[want]} (its state has "
            f"{', '.join(KINDS[want])}), but `tx` keeps {names[kind]} state "
            f"({', '.join(KINDS[kind].values())}); pass the optax optimizer that matches it."
        )
    return kind


def fill_state(
    opt_state: Any, kind: str | None, values: Mapping[str, Mapping[str, Any]], count: int
) -> Any:
    """``opt_state`` with every ``count`` set to ``count`` and the fields of each
    Adam/SGD state (``{"mu": {flax path: array}, ...}``) filled, each leaf cast to
    the dtype ``tx.init`` gave it (and placed on its sharding)."""
    import jax
    import jax.numpy as jnp

    types = _state_types()

    def fill_tree(tree: Any, by_path: Mapping[str, Any]) -> Any:
        def one(kp: Any, leaf: Any) -> Any:
            path = render(keypath_to_path(kp)[1:] if _is_tied(tree) else keypath_to_path(kp))
            value = by_path.get(path)
            if value is None:  # (No torch state for it: as tx.init made it.)
                return leaf
            sharding = getattr(leaf, "sharding", None)
            out = jnp.asarray(value, dtype=leaf.dtype)
            return out if sharding is None else jax.device_put(out, sharding)

        return jax.tree_util.tree_map_with_path(one, tree)

    def fn(node: Any) -> Any | None:
        if not (isinstance(node, tuple) and hasattr(node, "_fields")):
            return None
        changes: dict[str, Any] = {}
        if kind is not None and isinstance(node, types[kind]):
            for field in KINDS[kind].values():
                changes[field] = fill_tree(getattr(node, field), values[field])
        if "count" in node._fields:
            old = getattr(node, "count")  # noqa: B009 (the field, not tuple.count)
            if hasattr(old, "dtype") and getattr(old, "shape", None) == ():
                changes["count"] = jnp.asarray(count, dtype=old.dtype)
        if not changes:
            return None
        rest = {f: _walk(getattr(node, f), fn) for f in node._fields if f not in changes}
        return node._replace(**rest, **changes)  # type: ignore[attr-defined]

    return _walk(opt_state, fn)


def moments_of(opt_state: Any, kind: str) -> dict[str, dict[str, Any]]:
    """``{optax field: {flax path: array}}`` of every Adam/SGD state in ``opt_state``
    (the states of ``multi_transform``'s groups together)."""
    out: dict[str, dict[str, Any]] = {f: {} for f in KINDS[kind].values()}
    for node in _found(opt_state)[kind]:
        for field in out:
            out[field].update(_leaves(getattr(node, field)))
    return out


def _counts(opt_state: Any) -> list[int]:
    counts: list[int] = []

    def fn(node: Any) -> None:
        if isinstance(node, tuple) and hasattr(node, "_fields") and "count" in node._fields:
            value = getattr(node, "count")  # noqa: B009 (the field, not tuple.count)
            if getattr(value, "shape", None) == ():
                counts.append(int(value))

    _walk(opt_state, fn)
    return counts


# -- the probe -----------------------------------------------------------------------

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
    tx_kind = _tx_kind(state, kind)
    fields = list(KINDS[kind].values())
    values = {f: _leaves(jax.tree.map(lane(i), params)) for i, f in enumerate(fields) if tx_kind}
    state = fill_state(state, tx_kind, values, step)
    updates, new_state = tx.update(grads, state, probe_params)
    u = {p: np.asarray(v, np.float64).reshape(-1) for p, v in _leaves(updates).items()}
    new = moments_of(new_state, kind) if tx_kind else {}
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


def _close(a: float, b: float, atol: float = 1e-30) -> bool:
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
    ok = _close(want, float(u[4])) and _close(mu4, float(mu[4])) and _close(nu4, float(nu[4]))
    return {"lr": lr, "b1": b1, "b2": b2, "eps": eps, "weight_decay": wd, "l2": l2, "formula": ok}


def _read_sgd(u: np.ndarray, m: list[np.ndarray | None], t: int) -> dict[str, Any]:
    (trace,) = m
    mom = float(trace[1]) if trace is not None else 0.0
    l2 = float(trace[0]) if trace is not None else 0.0
    plain = -u[2] / _GAMMA
    nest = plain / (1 + mom)
    nesterov = trace is not None and mom != 0 and _close(float(u[1]), -nest * mom * mom)
    lr = nest if nesterov else plain
    total = (1 + mom) if nesterov else 1.0
    wd = -u[0] / lr - l2 * total if lr else math.nan
    if trace is None:  # (No momentum: a weight decay anywhere is the same update.)
        l2, wd = wd, 0.0
    g = _GAMMA / 2 + l2 * -0.7
    tr = g + mom * 0.3
    want = -lr * ((g + mom * tr) if nesterov else tr) - lr * wd * -0.7
    ok = _close(want, float(u[3])) and (trace is None or _close(tr, float(trace[3])))
    return {
        "lr": lr,
        "momentum": mom,
        "l2": l2,
        "weight_decay": wd,
        "nesterov": nesterov,
        "dampening": 0.0,
        "formula": ok,
    }


def _round(v: Any) -> float:
    v = float(v)
    return 0.0 if abs(v) < 1e-30 or math.isnan(v) else float(f"{v:.5g}")


def _fmt(v: Any) -> str:
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
                atol = _ATOL if key in ("weight_decay", "l2") else 1e-30
                same = (
                    theirs == value
                    if isinstance(value, bool)
                    else _close(float(theirs), value, atol)
                )
                if not same:
                    bad.setdefault(key, set()).add(_fmt(theirs))
        if kind == "sgd":
            extra = {
                _fmt(g["weight_decay"])
                for g in seen
                if g.get("formula") and abs(g["weight_decay"]) > _ATOL
            }
            if extra:
                bad["weight_decay"] = extra
                want = {**want, "weight_decay": 0.0}
        if bad:
            parts = [
                f"the update is not {'Adam' if kind == 'adam' else 'SGD'}'s formula (a "
                "transform in the chain that changes it, eps_root, nesterov Adam?)"
                if key == "update"
                else f"{_LABELS.get(key, key)}: torch {_fmt(want[key])}, optax "
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


# -- building a tx for torch's groups ---------------------------------------------------


def _one_tx(kind: str, h: Mapping[str, Any]) -> Any:
    import optax

    if h.get("maximize") or h.get("amsgrad") or h.get("dampening"):
        key = next(k for k in ("maximize", "amsgrad", "dampening") if h.get(k))
        raise ValueError(
            f"a param group has {key}={h[key]}, which optax's adam/adamw/sgd do not make; "
            "nothing is converted."
        )
    if kind == "adam":
        adam = optax.adamw if h["weight_decay"] else optax.adam
        kw = {"weight_decay": h["weight_decay"]} if h["weight_decay"] else {}
        tx = adam(h["lr"], b1=h["b1"], b2=h["b2"], eps=h["eps"], **kw)
    else:
        tx = optax.sgd(h["lr"], momentum=h["momentum"] or None, nesterov=h["nesterov"])
    return optax.chain(optax.add_decayed_weights(h["l2"]), tx) if h["l2"] else tx


def optax_for(state: OptimizerState | Mapping[str, Any]) -> Any:
    """The optax transformation that makes PyTorch's update for these param groups:
    ``optax.adamw``/``adam``/``sgd`` with the groups' values (an L2 ``weight_decay``
    as ``add_decayed_weights`` before them), and ``optax.multi_transform`` over the
    groups where they differ (parameters in no group are frozen:
    ``optax.set_to_zero``). ``state`` is an :class:`jaxshare.formats.OptimizerState`
    or the record a training step keeps (:func:`optimizer_record`); the groups are
    told apart by the PyTorch names in the params' naming record.

    >>> from jaxshare.formats import OptimizerState, ParamGroup
    >>> group = ParamGroup(("w",), {"lr": 0.1, "momentum": 0.9})
    >>> tx = optax_for(OptimizerState(None, "torch", (group,), {}, {}))
    >>> import jax.numpy as jnp
    >>> tx.init({"w": jnp.zeros(2)})[0].trace["w"].shape
    (2,)
    """
    import jax
    import optax

    if isinstance(state, OptimizerState):
        kind = _kind_of(state)
        groups = [(g.names, torch_hyper(kind, g)) for g in state.groups]
    else:
        kind = state["kind"]
        groups = [(tuple(g["names"]), dict(g["hyper"])) for g in state["groups"]]
    distinct: list[dict[str, Any]] = []
    for _, h in groups:
        if h not in distinct:
            distinct.append(h)
    if len(distinct) == 1:
        return _one_tx(kind, distinct[0])
    label_of = {n: f"group{distinct.index(h)}" for names, h in groups for n in names}

    def labels(params: Any) -> Any:
        naming = params.alias_map.naming if _is_tied(params) else None
        if naming is None:
            raise ValueError(
                "the param groups are told apart by PyTorch names: train a `Tied` whose "
                "alias map carries the naming record (as to_optax and checkpoint.restore give)."
            )

        def one(kp: Any, _: Any) -> str:
            record = naming.get(render(keypath_to_path(kp)[1:]))
            name = record.torch if record is not None else None
            return label_of.get(name, "frozen") if name is not None else "frozen"

        return jax.tree_util.tree_map_with_path(one, params)

    txs = {f"group{i}": _one_tx(kind, h) for i, h in enumerate(distinct)}
    txs["frozen"] = optax.set_to_zero()
    return optax.multi_transform(txs, labels)


# -- to_optax --------------------------------------------------------------------------


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

    from bridge.naming.relayout import place_any
    from bridge.naming.to_flax import to_flax
    from bridge.sources.registry import open_source
    from jaxshare import tie

    rules = as_rules(rules)
    training = read_training(source, rules, ties=ties, config=config)
    state = training.optimizer
    kind = _kind_of(state)
    step = _step_of(state)
    with open_source(training.params, rules) as src:
        variables, amap = to_flax(src, like=like, rules=rules, layout=layout)
        plan, _ = place_any(src, like=like, rules=rules, layout=layout)
        if plan.reads is not None:
            raise ValueError(
                f"{src.where}: scanned (stacked) layers are not carried with optimizer "
                "state yet; convert without `rules.stacks` / --stack."
            )
        params = tie(variables, amap)
        if src.kind == "state dict":  # Arrays of their own: the torch run may go on.
            import jax.numpy as jnp

            params = params.replace(jax.tree.map(lambda x: jnp.array(x, copy=True), params.unique))
        flax_of = {src.ties.get(n, n): plan.slots[n].name for n in plan.stored}
        missing = [
            n for g in state.groups for n in g.names if n not in flax_of and n not in src.ties
        ]
        if missing:
            raise ValueError(
                f"{src.where}: the optimizer's groups name {missing[:3]}, which the weights "
                "do not hold; the model and the optimizer state are of different models."
            )
        in_group = _group_of(state)
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
                moments, m_amap = to_flax(
                    _SlotSource(src, state.slots[slot_name]), like=like, rules=rules, layout=layout
                )
            values[field] = _leaves(tie(moments, m_amap))
    opt_state = tx.init(params)
    tx_kind = _tx_kind(opt_state, kind)
    values = {f: values.get(f, {}) for f in KINDS[kind].values()}
    probed = probe(tx, params, kind, step)
    check_hyper(state, kind, probed, flax_of)
    if tx_kind is None and state.slots:
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
    return params, fill_state(opt_state, tx_kind, values, step)


# -- the way back's record ----------------------------------------------------------------


def record_groups(
    params: Tied, opt_state: Any, tx: Any, names: Sequence[Sequence[str]] | None
) -> tuple[str | None, int, list[tuple[tuple[str, ...], dict[str, Any]]]]:
    """``(kind, step, [(PyTorch names, torch values)])`` of a trained optax state:
    the kind ``tx`` keeps, the count, and per group (``names``; default: the
    parameters grouped by what ``tx`` does to them) the values read by the probe."""
    opt_kind = None
    for kind in KINDS:
        if _found(opt_state)[kind]:
            opt_kind = kind
    kind = opt_kind or "sgd"
    counts = _counts(opt_state)
    step = max(counts) if counts else 0
    probed = probe(tx, params, kind, step)
    naming = params.alias_map.naming
    if naming is None:
        raise ValueError(
            "`params` carries no naming record (its alias map's `naming`): pass the `Tied` "
            "that to_optax or checkpoint.restore gave, whose record names every leaf in PyTorch."
        )
    held = _leaves(params)  # (In the naming record's order: the torch source's.)
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
        for k in ("weight_decay", "l2"):  # (Read within _ATOL of none: none.)
            if k in out and abs(out[k]) <= _ATOL:
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
                if all(
                    _close(gh[k], h[k]) if isinstance(h[k], float) else gh[k] == h[k] for k in h
                ):
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
                if not (_close(h[k], hs[0][k]) if isinstance(h[k], float) else h[k] == hs[0][k])
            ]
            if diff:
                raise ValueError(
                    f"`groups` {i}: `tx` updates {n!r} and {members[0]!r} differently "
                    f"({diff[0]}: {_fmt(h[diff[0]])} vs {_fmt(hs[0][diff[0]])}); one torch param "
                    "group has one value of each."
                )
        out.append((tuple(members), hs[0] if hs else {}))
    return opt_kind, step, out


def torch_group(
    kind: str | None, names: Sequence[str], h: Mapping[str, Any], ids: list[int]
) -> dict[str, Any]:
    """One entry of ``optimizer.state_dict()["param_groups"]`` as torch writes it."""
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


def optimizer_record(
    kind: str | None, step: int, groups: Sequence[tuple[Sequence[str], Mapping[str, Any]]]
) -> dict[str, Any]:
    """The JSON record a training step keeps of its optimizer: what
    :func:`optax_for` rebuilds ``tx`` from and the way back names groups by.

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


def training_report(path: Any) -> Any:
    """The tie report of a training checkpoint at ``path`` (a torch run file, a
    DeepSpeed or DCP folder holding optimizer state), its notes ending with
    :func:`describe`'s lines; ``None`` for any other input."""
    from jaxshare import formats

    if not isinstance(path, (str, os.PathLike)):
        return None
    path = Path(path)
    if path.is_file():
        found = path.suffix in formats.TORCH_SUFFIXES and formats.is_torch_training_file(path)
    else:
        found = path.is_dir() and (
            formats.is_deepspeed_training(path) or formats.is_dcp_training_folder(path)
        )
    if not found:
        return None
    training = _read_training(path, None)  # (Metadata only: no tie is checked by content.)
    with training.params as params:
        report = params.report()
    return dataclasses.replace(report, notes=(*report.notes, *describe(training.optimizer)))


def describe(state: OptimizerState) -> tuple[str, ...]:
    """A few lines for ``inspect``: the optimizer, its step, its groups and the
    bytes of each moment."""
    from jaxshare.internal import format_bytes

    try:
        kind = _kind_of(state)
        what = {"adam": "Adam/AdamW", "sgd": "SGD"}[kind]
    except ValueError:
        kind, what = "unknown", "an optimizer jaxshare does not carry"
    steps = sorted(set(state.steps.values()))
    step = (
        str(steps[0]) if len(steps) == 1 else ("none" if not steps else f"{steps[0]}..{steps[-1]}")
    )
    lines = [
        f"optimizer state ({state.producer}): {what}, step {step}, "
        f"{len(state.groups)} param group(s)"
    ]
    for name, slot in state.slots.items():
        nbytes = sum(
            int(np.prod(i.shape)) * np.dtype(i.dtype).itemsize for i in slot.infos.values()
        )
        lines.append(f"  {name}: {len(slot.infos)} tensors, {format_bytes(nbytes)}")
    lines += [f"  not carried: {u}" for u in state.unknown[:3]]
    return tuple(lines)
