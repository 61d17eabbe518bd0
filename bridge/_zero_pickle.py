"""Reading DeepSpeed's pickles without deepspeed and without running pickle code.

DeepSpeed's ZeRO optimizer files pickle three (with fp16, four) of its own
classes beside tensors and plain containers, so ``torch.load(weights_only=True)``
refuses them and ``zero_to_fp32`` needs deepspeed installed and
``weights_only=False``. :func:`load_deepspeed_file` keeps torch's restricted
unpickler and allows exactly those names, each mapped to an inert stand-in
defined here: a stand-in only stores the plain values torch's unpickler has
already rebuilt (ints, floats, dtypes). Everything else is refused as
``torch.load(weights_only=True)`` refuses it, and the file's code never runs.
"""

from __future__ import annotations

import enum
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "STAND_INS",
    "FragmentAddress",
    "LossScalerState",
    "ZeroStage",
    "load_deepspeed_file",
    "torch_load_checked",
]


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
_BOILERPLATE = ("Weights only load failed", "(1) ", "(2) ", "Please file an issue",
                "Check the documentation")  # fmt: skip


def _torch_reason(error: BaseException) -> str:
    """The line of torch's weights-only message that says what was refused."""
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_BOILERPLATE)]
    if not lines and isinstance(error, EOFError):
        return "the file ends early"
    reason = (lines or [type(error).__name__])[0].removeprefix("WeightsUnpickler error: ")
    # torch goes on to suggest allow-listing the global: not advice for this reader.
    return reason.split(" Please use `torch.serialization.add_safe_globals")[0].strip()


def torch_load_checked(path: str | os.PathLike, /, *, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors naming ``path``.

    A file that needs more than tensors and plain containers is refused (its
    code does not run); torch's reason is kept. ``mmap=True`` maps the file's
    tensors instead of reading them (zip-format files; others are read).

    Raises:
      ValueError: the file is refused, or is not a file ``torch.load`` can read.

    >>> import os, tempfile
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.system, ("echo pwned",))
    >>> path = tempfile.mkdtemp() + "/evil.pt"
    >>> torch.save({"x": Evil()}, path)
    >>> torch_load_checked(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...evil.pt: refused: loading it would run code ... (Trying to load unsupported GLOBAL posix.system whose module posix is blocked.)...
    """
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        reason = _torch_reason(e)
        if reason.startswith("Unsupported operand") or "load key" in reason:
            raise ValueError(
                f"{path}: not a PyTorch file torch.load can read (torch: {reason})."
            ) from None
        raise ValueError(
            f"{path}: refused: loading it would run code beyond rebuilding tensors ({reason}). "
            "jaxshare reads .pt/.bin files only with `torch.load(weights_only=True)`; if you "
            "trust this file, load it yourself with `torch.load(path, weights_only=False)`."
        ) from None
    except FileNotFoundError:
        raise
    except (RuntimeError, OSError) as e:
        if mmap:  # not a zip file (which mmap needs), or a damaged one: say what torch says
            return torch_load_checked(path, mmap=False)
        reason = _torch_reason(e) if isinstance(e, RuntimeError) else e.strerror or str(e)
        raise ValueError(
            f"{path}: not a PyTorch file torch.load can read ({reason}); is it truncated or "
            "damaged?"
        ) from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a PyTorch file torch.load can read ({_torch_reason(e)})."
        ) from None


def load_deepspeed_file(path: str | os.PathLike, /, *, mmap: bool = True) -> Any:
    """:func:`torch_load_checked` of a DeepSpeed checkpoint file, DeepSpeed's
    pickled classes loaded as the inert stand-ins in :data:`STAND_INS`.

    Raises:
      ValueError: as :func:`torch_load_checked`; any class beyond those is refused.

    >>> for name in sorted(STAND_INS):  # all that is allowed beyond torch's own list
    ...     print(name)
    deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
    deepspeed.runtime.fp16.loss_scaler.LossScaler
    deepspeed.runtime.zero.config.ZeroStageEnum
    deepspeed.utils.tensor_fragment.fragment_address
    """
    with _LOCK, torch.serialization.safe_globals([(c, n) for n, c in STAND_INS.items()]):
        return torch_load_checked(path, mmap=mmap)
