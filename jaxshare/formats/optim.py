"""An optimizer's state as PyTorch stores it, read with numpy only.

PyTorch optimizers keep, per parameter, a few tensors of the parameter's shape
(Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``) and a step,
and, per parameter group, the hyper-parameters (``lr``, ``betas``, ...). Every
producer stores them differently -- ``optimizer.state_dict()`` keys them by
parameter index, DeepSpeed ZeRO flattens them into per-rank partitions, DCP
names them ``optim.state.<fqn>.exp_avg`` -- and every reader of this package
hands them out the same way: an :class:`OptimizerState`, whose slots are
:class:`jaxshare.stream.TensorSource` s in the parameters' PyTorch names, so the
upper layers place each moment exactly as they place its parameter.

:func:`optimizer_state` reads an ``optimizer.state_dict()`` whose tensors are
numpy arrays (as :func:`jaxshare.formats.unpickle_torch_file` hands them out, or
``get_state_dict``'s, keyed by parameter names); :func:`read_torch_training`
reads a ``torch.save`` of ``{"model": ..., "optimizer": ...}``. A parameter
index becomes a name through the groups' ``param_names`` (torch >= 2.6, an
optimizer built from ``named_parameters()``), else through ``names=``, else --
for one group -- through the model's floating-point tensors in ``state_dict()``
order, each tie once (the order ``model.parameters()`` gives them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxshare.core.dtype import is_floating
from jaxshare.core.report import ArrayInfo
from jaxshare.formats.pytorch import (
    TorchFile,
    looks_like_torch_file,
    unpickle_torch_file,
)
from jaxshare.io.source import Index, TensorSource

__all__ = [
    "MODEL_KEYS",
    "MOMENTS",
    "OPTIMIZER_KEYS",
    "OptimizerState",
    "ParamGroup",
    "SlotSource",
    "Stored",
    "TrainingState",
    "is_torch_training_file",
    "optimizer_state",
    "read_torch_training",
]

#: The per-parameter tensors of torch's Adam, AdamW, SGD (and their kin) by name:
#: each must have its parameter's shape.
MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")
#: Where a training file keeps the model's state dict, in the order looked for.
MODEL_KEYS = ("model", "state_dict", "model_state_dict")
#: Where a training file keeps ``optimizer.state_dict()``, in the order looked for.
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim")
#: What a refusal of a training file's pickle suggests.
_TRUST_FIX = (
    "if you trust this file, torch.load it and save the model's and the optimizer's state "
    "dicts alone, or pass `optimizer.state_dict()` (tensors as numpy) to `optimizer_state`"
)
#: What the groups say beside the hyper-parameters.
_GROUP_NAMES = ("params", "param_names")
_STEP = "step"
#: How a refusal to map indices to names ends.
_NAMES_FIX = (
    "build the optimizer with `model.named_parameters()` (torch >= 2.6 then stores "
    "`param_names`), or pass `names`, the parameters' names in the order the optimizer "
    "was given them"
)


@dataclass(frozen=True)
class ParamGroup:
    """One parameter group of a PyTorch optimizer.

    Attributes:
      names: the PyTorch names of the group's parameters, in the group's order
        (each tie once, under its canonical name).
      hyper: the group's other entries as stored (``lr``, ``betas`` as a tuple,
        ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``, ``momentum``,
        ``decoupled_weight_decay``, ...): everything but ``params`` and
        ``param_names``.
    """

    names: tuple[str, ...]
    hyper: Mapping[str, Any]


#: The torch optimizers :attr:`OptimizerState.kind` tells apart: ``{kind: (the slots
#: its state may hold, the group entries it has, the entry every group of it has)}``.
_KINDS = {
    "adam": (
        frozenset({"exp_avg", "exp_avg_sq"}),
        frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"})
        | frozenset({"decoupled_weight_decay", "adam_w_mode"}),
        "betas",
    ),
    "sgd": (
        frozenset({"momentum_buffer"}),
        frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}),
        "momentum",
    ),
}
#: Group entries that change no arithmetic (how torch runs the update, schedulers' notes).
_NO_ARITHMETIC = frozenset(
    {"foreach", "capturable", "differentiable", "fused", "initial_lr", "bias_correction"}
)


@dataclass(frozen=True)
class OptimizerState:
    """The per-parameter state and the groups of one PyTorch optimizer.

    Attributes:
      path: the file or folder it was read from (``None`` in memory).
      producer: who wrote it: ``"torch"`` (``optimizer.state_dict()``),
        ``"deepspeed"`` (ZeRO partitions) or ``"dcp"``.
      groups: the parameter groups, in the optimizer's order.
      steps: ``{parameter name: step}`` for every parameter that has state
        (PyTorch keeps one step per parameter; they agree after ordinary
        training).
      slots: ``{slot: source}``, one source per kind of per-parameter tensor
        (``"exp_avg"``, ``"exp_avg_sq"``, ``"max_exp_avg_sq"``,
        ``"momentum_buffer"``, or whatever else the file holds), each in the
        parameters' PyTorch names and shapes, float32 as stored.
      unknown: per-parameter entries that are neither a tensor of the
        parameter's shape nor ``step`` (Adafactor's factored rows, a per-param
        ``lr``), one line each naming the parameter and the entry.
    """

    path: Path | None
    producer: str
    groups: tuple[ParamGroup, ...]
    steps: Mapping[str, int]
    slots: Mapping[str, TensorSource]
    unknown: tuple[str, ...] = field(default=())

    @property
    def group_of(self) -> dict[str, int]:
        """``{parameter name: index of its group}`` of every parameter in a group."""
        return {name: i for i, group in enumerate(self.groups) for name in group.names}

    @property
    def kind(self) -> str:
        """Which torch optimizer this is, told by its slots and its groups' entries:
        ``"adam"`` (Adam, AdamW) or ``"sgd"``.

        Raises:
          ValueError: one line: :attr:`unknown` entries (they cannot be carried),
            or the state of another optimizer (Muon, Adafactor, amsgrad, ...).

        >>> group = ParamGroup(("w",), {"lr": 0.1, "momentum": 0.9, "nesterov": False})
        >>> OptimizerState(None, "torch", (group,), {}, {}).kind
        'sgd'
        """
        where = self.path or "the optimizer state"
        if self.unknown:
            more = f" (and {len(self.unknown) - 3} more)" if len(self.unknown) > 3 else ""
            raise ValueError(
                f"{where}: the optimizer state holds entries jaxshare cannot carry into optax: "
                f"{'; '.join(self.unknown[:3])}{more}; they would be reset, so nothing is "
                "converted. Convert the weights alone (bridge.to_flax) and start the optimizer "
                "anew."
            )
        slots = set(self.slots)
        keys = {k for g in self.groups for k in g.hyper} - _NO_ARITHMETIC
        for kind, (kind_slots, known, mark) in _KINDS.items():
            if slots <= kind_slots and keys <= known and (slots or "betas" not in keys):
                if mark in keys:
                    return kind
        extra = sorted(keys - _KINDS["adam"][1] - _KINDS["sgd"][1])
        raise ValueError(
            f"{where}: not an optimizer jaxshare carries: its state has slots {sorted(slots)}"
            + (f" and its groups entries no torch Adam, AdamW or SGD has: {extra}" if extra else "")
            + "; only those three map exactly onto optax's adam, adamw and sgd, so nothing is "
            "converted (its state would be lost)."
        )

    def describe(self) -> tuple[str, ...]:
        """A few lines for ``inspect``: the optimizer, its step, its groups and the
        bytes of each slot.

        >>> group = ParamGroup(("w",), {"lr": 0.1, "momentum": 0.9})
        >>> slots = {"momentum_buffer": SlotSource("momentum_buffer", {"w": np.zeros(4, "f4")})}
        >>> for line in OptimizerState(None, "torch", (group,), {"w": 3}, slots).describe():
        ...     print(line)
        optimizer state (torch): SGD, step 3, 1 param group(s)
          momentum_buffer: 1 tensors, 16 B
        """
        from jaxshare.core.report import format_bytes

        try:
            what = {"adam": "Adam/AdamW", "sgd": "SGD"}[self.kind]
        except ValueError:
            what = "an optimizer jaxshare does not carry"
        steps = sorted(set(self.steps.values()))
        step = (
            str(steps[0])
            if len(steps) == 1
            else ("none" if not steps else f"{steps[0]}..{steps[-1]}")
        )
        lines = [
            f"optimizer state ({self.producer}): {what}, step {step}, "
            f"{len(self.groups)} param group(s)"
        ]
        for name, slot in self.slots.items():
            nbytes = sum(
                int(np.prod(i.shape)) * np.dtype(i.dtype).itemsize for i in slot.infos.values()
            )
            lines.append(f"  {name}: {len(slot.infos)} tensors, {format_bytes(nbytes)}")
        lines += [f"  not carried: {u}" for u in self.unknown[:3]]
        return tuple(lines)


# -- the slots -------------------------------------------------------------------------


class TrainingState(NamedTuple):
    """What a training checkpoint holds: the weights and the optimizer's state.

    Attributes:
      params: the weights in PyTorch names (DeepSpeed's: the fp32 masters).
      optimizer: the optimizer's groups, steps and per-parameter slots.
    """

    params: TensorSource
    optimizer: OptimizerState


@dataclass(frozen=True)
class Stored:
    """A tensor another source holds, read when asked: ``source``'s ``name``
    (a DCP folder's moment, so that opening reads none of them)."""

    source: TensorSource
    name: str

    @property
    def info(self) -> ArrayInfo:
        return self.source.infos[self.name]


def _info(value: Any) -> ArrayInfo | None:
    """The shape and dtype of a tensor entry; ``None`` for anything else."""
    if isinstance(value, Stored):
        return value.info
    if isinstance(value, np.ndarray):
        return ArrayInfo(tuple(value.shape), value.dtype.name)
    return None


class SlotSource(TensorSource):
    """One kind of per-parameter tensor (``exp_avg``, ...) of an optimizer, as a
    :class:`~jaxshare.stream.TensorSource` in the parameters' names: numpy
    arrays in memory (views of a mapped file, no copy) or tensors of another
    source (:class:`Stored`), read when asked.

    Each tie is there once, under its canonical name (a tie is one parameter,
    with one state); :attr:`ties` is empty.

    Attributes:
      slot: the kind (``"exp_avg"``).

    >>> src = SlotSource("exp_avg", {"fc.weight": np.zeros((2, 3), np.float32)})
    >>> src.kind, src.infos["fc.weight"], src.array("fc.weight").shape
    ('exp_avg', ArrayInfo(shape=(2, 3), dtype='float32'), (2, 3))
    """

    mapped = True  # arrays in memory, or a mapped source's views

    def __init__(
        self,
        slot: str,
        tensors: Mapping[str, np.ndarray | Stored],
        /,
        *,
        path: str | os.PathLike | None = None,
    ) -> None:
        self.slot = self.kind = slot
        self.path = None if path is None else Path(path)
        self._tensors = dict(tensors)
        self.infos = {}
        for name, value in self._tensors.items():
            info = _info(value)
            if info is None:
                raise TypeError(f"`tensors` entry {name!r} is a {type(value).__name__}, no array")
            self.infos[name] = info

    def _get(self, name: str) -> np.ndarray | Stored:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.where}: no {self.slot} of a parameter named {name!r}.") from None

    def read(self, name: str) -> np.ndarray:
        value = self._get(name)
        return value.source.array(value.name) if isinstance(value, Stored) else value

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        value = self._get(name)
        return value.source.blocks(value.name) if isinstance(value, Stored) else (value,)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        value = self._get(name)
        if isinstance(value, Stored):
            return value.source.read_slice(value.name, index)
        return np.asarray(value[index])

    @property
    def where(self) -> str:
        return f"{self.path if self.path is not None else 'the optimizer state'} ({self.slot})"


# -- optimizer.state_dict() ------------------------------------------------------------


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _is_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _groups_of(where: str, optimizer_sd: Any) -> list[Mapping[str, Any]]:
    if not isinstance(optimizer_sd, Mapping) or not isinstance(
        optimizer_sd.get("param_groups"), Sequence | Mapping
    ):
        found = (
            f"a dict with keys {sorted(map(str, optimizer_sd))[:8]}"
            if isinstance(optimizer_sd, Mapping)
            else f"a {type(optimizer_sd).__name__}"
        )
        raise _fail(
            where,
            "expected an optimizer state dict ({'state': ..., 'param_groups': [...]}, as "
            f"`optimizer.state_dict()` gives), found {found}; pass `optimizer.state_dict()`.",
        )
    groups = optimizer_sd["param_groups"]
    if isinstance(groups, Mapping):  # (a flattened list: {0: group, 1: group})
        if set(groups) != set(range(len(groups))):
            raise _fail(where, f"`param_groups` keyed by {list(groups)[:6]}; expected 0, 1, ...")
        groups = [groups[i] for i in range(len(groups))]
    for i, group in enumerate(groups):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, Sequence) or isinstance(params, str):
            raise _fail(where, f"param group {i} has no list `params`; expected one per group.")
        if not all(_is_id(p) for p in params):
            shown = list(params)[:4]
            raise _fail(where, f"param group {i} lists params {shown}; expected indices.")
    state = optimizer_sd.get("state", {})
    if not isinstance(state, Mapping) or not all(isinstance(v, Mapping) for v in state.values()):
        raise _fail(where, "`state` is not a dict of per-parameter dicts, as torch keeps it.")
    return list(groups)


def _parameter_names(params: TensorSource) -> list[str]:
    """The model's floating-point tensors in its order, each tie once: the order
    of ``model.parameters()`` when the model has no floating-point buffers."""
    return [
        name
        for name, info in params.infos.items()
        if name not in params.ties and is_floating(info.dtype)
    ]


def _names_by_id(
    where: str,
    groups: Sequence[Mapping[str, Any]],
    names: Sequence[str] | None,
    params: TensorSource | None,
) -> dict[Any, str]:
    ids = [p for g in groups for p in g["params"]]
    if len(set(ids)) != len(ids):
        raise _fail(where, "a parameter index is in several groups; expected each once.")
    if all(isinstance(p, str) for p in ids):  # get_state_dict's: keyed by names
        return {p: p for p in ids}
    if all("param_names" in g for g in groups):
        found = [n for g in groups for n in g["param_names"]]
        if len(found) != len(ids) or not all(isinstance(n, str) for n in found):
            raise _fail(
                where,
                f"the groups list {len(ids)} params but {len(found)} param_names; expected "
                "one name per parameter, as torch stores them; pass `names` instead.",
            )
        return dict(zip(ids, found, strict=True))
    if names is not None:
        names = list(names)
        if len(names) != len(ids) or not all(isinstance(n, str) for n in names):
            raise _fail(
                where,
                f"`names` holds {len(names)} names, the optimizer {len(ids)} parameters; "
                f"expected one name per parameter; {_NAMES_FIX}.",
            )
        return dict(zip(ids, names, strict=True))
    if params is None:
        raise _fail(where, f"the param groups name no parameters (no `param_names`); {_NAMES_FIX}.")
    if len(groups) > 1:
        raise _fail(
            where,
            f"{len(groups)} param groups name no parameters (no `param_names`), and the model's "
            f"order does not tell which parameter is in which group; {_NAMES_FIX}.",
        )
    order = _parameter_names(params)
    if len(order) != len(ids):
        raise _fail(
            where,
            f"the optimizer holds {len(ids)} parameters and names none (no `param_names`); the "
            f"model has {len(order)} floating-point tensors (each tie once), so indices cannot "
            f"be matched to names; {_NAMES_FIX}.",
        )
    return dict(zip(ids, order, strict=True))


def _canonical(where: str, name: str, params: TensorSource | None) -> str:
    if params is None:
        return name
    if name in params.ties:
        if params.ties.transform(name) is not None:
            raise _fail(
                where,
                f"the optimizer names {name!r}, a permuted view of {params.ties[name]!r} in the "
                "model; expected each parameter in its own axis order; save the model with the "
                "tie as one tensor.",
            )
        return params.ties[name]
    if name not in params.infos:
        shown = list(params.infos)[:5]
        raise _fail(
            where,
            f"the optimizer names a parameter {name!r}, which the model lacks (it holds "
            f"{shown}...); expected the optimizer of this model.",
        )
    return name


def _step(where: str, name: str, value: Any) -> int:
    if isinstance(value, Stored):
        value = value.source.array(value.name)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(where, f"the step of {name!r} is {value!r:.40}; expected a number.")
    if value != int(value) or value < 0:
        raise _fail(where, f"the step of {name!r} is {value!r}; expected a whole number >= 0.")
    return int(value)


def _moment_shape(entries: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of the first moment of ``entries``: the parameter's, where the
    model is not known."""
    for key in MOMENTS:
        info = _info(entries.get(key))
        if info is not None:
            return info.shape
    return None


def _describe(value: Any) -> str:
    info = _info(value)
    if info is not None:
        return f"a {info.dtype} tensor of shape {info.shape}"
    if isinstance(value, int | float | bool | str) or value is None:
        return f"{type(value).__name__} {value!r:.40}"
    return f"a {type(value).__name__}"


def optimizer_state(
    optimizer_sd: Mapping[str, Any],
    names: Sequence[str] | None = None,
    *,
    path: str | os.PathLike | None = None,
    params: TensorSource | None = None,
    producer: str = "torch",
) -> OptimizerState:
    """The :class:`OptimizerState` of an ``optimizer.state_dict()`` whose tensors
    are numpy arrays (as :func:`~jaxshare.formats.unpickle_torch_file` gives them).

    Parameter indices become names through the groups' ``param_names`` (an
    optimizer built from ``model.named_parameters()``, torch >= 2.6), else
    ``names``, else (one group, ``params`` given) the model's floating-point
    tensors in ``state_dict()`` order, each tie once. A state dict keyed by
    names (``get_state_dict``'s) needs none of them. With ``params``, a name
    that is an alias of a tie becomes its canonical, and every tensor entry is
    held against its parameter's shape.

    Args:
      optimizer_sd: ``{"state": {index: {entry: value}}, "param_groups": [...]}``.
      names: the parameters' names in the order the optimizer was given them
        (its groups' ``params`` end to end; for one group built from
        ``model.parameters()``, ``[n for n, _ in model.named_parameters()]``).
      path: the file it was read from, for messages and :attr:`OptimizerState.path`.
      params: the model's tensors (a source, e.g. :class:`~jaxshare.formats.TorchFile`).
      producer: :attr:`OptimizerState.producer`.

    Returns:
      The state: ``steps`` as ints; one :class:`SlotSource` per kind of tensor
      of the parameter's shape; every other entry (a tensor of another shape, a
      number other than ``step``) one line of ``unknown``.

    Raises:
      ValueError: one line: not an optimizer state dict; indices that cannot
        be matched to names (with the fix); a name the model lacks; a moment
        (:data:`MOMENTS`) whose shape is not its parameter's; a step that is no
        whole number.

    >>> import torch
    >>> model = torch.nn.Linear(2, 3)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> model(torch.ones(1, 2)).sum().backward(); opt.step()
    >>> sd = opt.state_dict()  # (tensors made numpy arrays, as a file gives them)
    >>> sd["state"] = {i: {k: v.numpy() for k, v in s.items()} for i, s in sd["state"].items()}
    >>> state = optimizer_state(sd, [n for n, _ in model.named_parameters()])
    >>> list(state.slots), dict(state.slots["momentum_buffer"].infos)["weight"]
    (['momentum_buffer'], ArrayInfo(shape=(3, 2), dtype='float32'))
    >>> state.groups[0].names, state.groups[0].hyper["momentum"]
    (('weight', 'bias'), 0.9)
    """
    where = str(path) if path is not None else "the optimizer state dict"
    groups = _groups_of(where, optimizer_sd)
    by_id = _names_by_id(where, groups, names, params)
    by_id = {i: _canonical(where, n, params) for i, n in by_id.items()}
    if len(set(by_id.values())) != len(by_id):
        twice = sorted({n for n in by_id.values() if list(by_id.values()).count(n) > 1})
        raise _fail(
            where, f"the optimizer holds {twice[:3]} twice (a tie's names); expected each once."
        )
    state: Mapping[Any, Mapping[str, Any]] = optimizer_sd.get("state", {})
    strays = [i for i in state if i not in by_id]
    if strays:
        raise _fail(where, f"`state` holds parameters {strays[:4]} that no param group lists.")
    steps: dict[str, int] = {}
    slots: dict[str, dict[str, np.ndarray | Stored]] = {}
    unknown: list[str] = []
    for i, name in by_id.items():
        entries = state.get(i)
        if not entries:
            continue
        want = params.infos[name].shape if params is not None else _moment_shape(entries)
        for entry, value in entries.items():
            info = _info(value)
            if entry == _STEP:
                steps[name] = _step(where, name, value)
            elif info is not None and info.shape == want:
                slots.setdefault(str(entry), {})[name] = value
            elif entry in MOMENTS and info is not None:
                raise _fail(
                    where,
                    f"{entry} of {name!r} has shape {info.shape}, its parameter {want}; "
                    "expected the optimizer of this model, saved with it.",
                )
            else:
                unknown.append(f"{name}: {entry} ({_describe(value)})")
    out_groups = tuple(
        ParamGroup(
            tuple(by_id[p] for p in g["params"]),
            {k: v for k, v in g.items() if k not in _GROUP_NAMES},
        )
        for g in groups
    )
    return OptimizerState(
        None if path is None else Path(path),
        producer,
        out_groups,
        steps,
        {slot: SlotSource(slot, tensors, path=path) for slot, tensors in slots.items()},
        tuple(unknown),
    )


# -- torch.save of {"model": ..., "optimizer": ...} ------------------------------------


def _key(obj: Mapping[Any, Any], keys: Sequence[str]) -> str | None:
    return next((k for k in keys if isinstance(obj.get(k), Mapping)), None)


def _training_keys(obj: Any) -> tuple[str | None, str | None]:
    if not isinstance(obj, Mapping):
        return None, None
    return _key(obj, MODEL_KEYS), _key(obj, OPTIMIZER_KEYS)


def is_torch_training_file(path: str | os.PathLike, /) -> bool:
    """Whether ``path`` is a ``torch.save`` of a model's and an optimizer's state
    dicts (:func:`read_torch_training` reads it). Unpickles the file (with the
    restricted unpickler; no tensor's bytes are read); never raises.

    >>> import tempfile, torch
    >>> model = torch.nn.Linear(2, 2)
    >>> path = tempfile.mkdtemp() + "/run.pt"
    >>> optimizer = {"state": {}, "param_groups": []}
    >>> torch.save({"model": model.state_dict(), "optimizer": optimizer}, path)
    >>> is_torch_training_file(path), is_torch_training_file(__file__)
    (True, False)
    """
    if not looks_like_torch_file(path) or Path(path).is_dir():
        return False
    try:
        obj = unpickle_torch_file(path)
    except (OSError, ValueError):
        return False
    return None not in _training_keys(obj)


class _TrainingModel(TorchFile):
    """The model part of a training file: a :class:`TorchFile` over a sub-dict of
    what the file holds, its ties found the same way."""

    def __init__(self, path: Path, model: Mapping[str, Any], notes: tuple[str, ...]) -> None:
        self._load(path, model)
        self.notes = notes


def _extras(obj: Mapping[Any, Any], model_key: str, optim_key: str) -> str:
    shown = []
    for key, value in obj.items():
        if key in (model_key, optim_key):
            continue
        if isinstance(value, int | float | str | bool) or value is None:
            shown.append(f"{key} = {value!r:.30}")
        else:
            shown.append(f"{key} (a {type(value).__name__})")
    return ", ".join(shown)


def read_torch_training(path: str | os.PathLike, /) -> TrainingState:
    """A ``torch.save`` of a model's and an optimizer's state dicts, read without torch.

    The file is a dict holding the model's state dict under ``"model"``,
    ``"state_dict"`` or ``"model_state_dict"`` and ``optimizer.state_dict()``
    under ``"optimizer"``, ``"optimizer_state_dict"`` or ``"optim"``; other
    entries (``epoch``, an ``lr_scheduler``'s state) are named in the model
    source's :attr:`~jaxshare.stream.TensorSource.notes` and not read.

    Returns:
      ``(params, state)``: the model as a :class:`~jaxshare.formats.TorchFile`
      (its ties: tensors over one storage), and :func:`optimizer_state` of the
      optimizer's state dict against it.

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line: as :func:`~jaxshare.formats.unpickle_torch_file`;
        no model or no optimizer in the file; as :func:`optimizer_state`.

    >>> import tempfile, torch
    >>> model = torch.nn.Linear(2, 3)
    >>> opt = torch.optim.AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1)
    >>> model(torch.ones(1, 2)).sum().backward(); opt.step()
    >>> path = tempfile.mkdtemp() + "/run.pt"
    >>> torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)
    >>> params, state = read_torch_training(path)
    >>> sorted(state.slots), state.steps, state.groups[0].hyper["weight_decay"]
    (['exp_avg', 'exp_avg_sq'], {'weight': 1, 'bias': 1}, 0.1)
    >>> params.notes
    ('also holds: epoch = 3 (not read)',)
    """
    path = Path(path)
    obj = unpickle_torch_file(path, fix=_TRUST_FIX)
    model_key, optim_key = _training_keys(obj)
    if model_key is None or optim_key is None:
        keys = sorted(map(str, obj))[:8] if isinstance(obj, Mapping) else None
        found = f"a dict with keys {keys}" if keys is not None else f"a {type(obj).__name__}"
        if isinstance(obj, Mapping) and model_key is None and optim_key is None:
            if obj and all(isinstance(v, np.ndarray) for v in obj.values()):
                found = "a model's state dict only"
        lacks = " and ".join(
            f"{what} (under {' / '.join(repr(k) for k in keys_)})"
            for what, key, keys_ in (
                ("a model state dict", model_key, MODEL_KEYS),
                ("an optimizer state dict", optim_key, OPTIMIZER_KEYS),
            )
            if key is None
        )
        raise ValueError(
            f"{path}: expected a training checkpoint holding {lacks}, found {found}; save "
            '`{"model": model.state_dict(), "optimizer": optimizer.state_dict()}`.'
        )
    extras = _extras(obj, model_key, optim_key)
    notes = (f"also holds: {extras} (not read)",) if extras else ()
    params = _TrainingModel(path, obj[model_key], notes)
    return TrainingState(params, optimizer_state(obj[optim_key], path=path, params=params))
