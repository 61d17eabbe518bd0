"""Reading DeepSpeed's pickles without deepspeed and without running pickle code.

DeepSpeed's ZeRO optimizer files pickle three (with fp16, four) of its own
classes beside tensors and plain containers, so ``torch.load(weights_only=True)``
refuses them and ``zero_to_fp32`` needs deepspeed installed and
``weights_only=False``. :func:`load_deepspeed_file` loads files as
:func:`bridge.load_torch` does (torch's restricted unpickler) and allows exactly
those names, each mapped to an inert stand-in defined here: a stand-in only
stores the plain values torch's unpickler has already rebuilt (ints, floats,
dtypes). Everything else is refused as ``torch.load(weights_only=True)``
refuses it, and the file's code never runs.
"""

from __future__ import annotations

import enum
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import torch

from bridge._torchfile import safe_load
from jaxshare.formats import check_torch_file

__all__ = ["STAND_INS", "FragmentAddress", "LossScalerState", "ZeroStage", "load_deepspeed_file"]


class ZeroStage(enum.IntEnum):
    """Stand-in for ``deepspeed.runtime.zero.config.ZeroStageEnum`` (pickled as
    ``ZeroStageEnum(stage)``; only the values 0-4 load)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 4


class _Inert:
    """A stand-in that keeps the state pickle hands it and does nothing else."""

    __slots__ = ("state",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # DeepSpeed's files rebuild these from attributes only
            raise pickle.UnpicklingError(
                f"{type(self).__name__} is rebuilt from its attributes only; this file calls "
                "it with arguments"
            )
        self.state: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]  # (None, slots) from a class with __slots__
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise pickle.UnpicklingError(
                f"{type(self).__name__} expects a dict of attributes, got {type(state).__name__}"
            )
        self.state = dict(state)

    def __getattr__(self, name: str) -> Any:
        if name == "state":  # not yet set: built by NEWOBJ without __init__
            raise AttributeError(name)
        try:
            return self.state[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.state.items())
        return f"{type(self).__name__}({items})"


class LossScalerState(_Inert):
    """Stand-in for DeepSpeed's ``LossScaler`` and ``DynamicLossScaler``: their
    attributes (``cur_scale``, ``dynamic``, ...), nothing more."""

    __slots__ = ()


class FragmentAddress(_Inert):
    """Stand-in for ``deepspeed.utils.tensor_fragment.fragment_address``
    (``numel``, ``start``: where a parameter's piece lies in a rank's partition)."""

    __slots__ = ()


#: DeepSpeed's fully-qualified class names (as its files spell them) -> stand-in.
STAND_INS: dict[str, type] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": LossScalerState,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": LossScalerState,
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStage,
    "deepspeed.utils.tensor_fragment.fragment_address": FragmentAddress,
}

# torch keeps its allow-list in one process-wide set that `safe_globals` edits
# on entry and exit; one lock keeps two of our loads from undoing each other.
_LOCK = threading.Lock()


def load_deepspeed_file(path: str | os.PathLike, /, *, mmap: bool = True) -> Any:
    """A DeepSpeed checkpoint file, loaded as :func:`bridge.load_torch` loads files
    (it must look like ``torch.save`` output; ``torch.load(weights_only=True)``
    only), DeepSpeed's pickled classes rebuilt as the inert stand-ins in
    :data:`STAND_INS`. ``mmap=True`` maps the file's tensors instead of reading
    them.

    Raises:
      ValueError: one line naming the file: not a PyTorch file, or refused (any
        class beyond those, anything that would run code), with torch's reason.

    >>> for name in sorted(STAND_INS):  # all that is allowed beyond torch's own list
    ...     print(name)
    deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
    deepspeed.runtime.fp16.loss_scaler.LossScaler
    deepspeed.runtime.zero.config.ZeroStageEnum
    deepspeed.utils.tensor_fragment.fragment_address
    """
    path = Path(path)
    check_torch_file(path)
    with _LOCK, torch.serialization.safe_globals([(c, n) for n, c in STAND_INS.items()]):
        return safe_load(path, mmap=mmap)
