"""Reading DeepSpeed's files without deepspeed, without torch, and without running
pickle code.

``torch.save`` writes a zip archive: ``NAME/data.pkl``, a pickle whose tensors
point (by persistent id) at raw storages ``NAME/data/KEY`` stored uncompressed.
DeepSpeed's ZeRO files pickle, beside tensors and plain containers, three (with
fp16, four) of its own classes, so ``torch.load(weights_only=True)`` refuses them
and ``zero_to_fp32`` needs deepspeed installed and ``weights_only=False``.

:func:`load_deepspeed_file` unpickles with a restricted unpickler of its own. It
allows exactly:

- the names ``torch.save`` uses to rebuild tensors (``_rebuild_tensor_v2``,
  ``_rebuild_from_type_v2`` of a plain ``torch.Tensor``, ``_rebuild_parameter``),
  typed storages, ``torch.Size``, dtype and device names, ``OrderedDict``, and
  ``_codecs.encode`` (how protocol 2 writes ``bytes``);
- DeepSpeed's classes, each mapped to an inert stand-in defined here (:data:`STAND_INS`):
  a stand-in only keeps the plain values the unpickler has already built.

Every other global is refused, so the file's code never runs. Tensors come back
as read-only numpy arrays over the memory-mapped file (no copy, no anonymous
memory, and writers copy them file to file); dtypes and devices as their names
(``"torch.float16"``). Importing torch (over a second) is not needed: converting a
DeepSpeed folder to safetensors does not pay for it.
"""

from __future__ import annotations

import collections
import enum
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.formats import check_torch_file
from jaxshare.internal import map_file, numpy_dtype

__all__ = [
    "STAND_INS",
    "FragmentAddress",
    "LossScalerState",
    "ZeroStage",
    "load_deepspeed_file",
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

#: ``torch.<Kind>Storage`` -> the dtype of its elements.
_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}  # fmt: skip
#: ``torch.<dtype>`` names a pickle may hold as values (a loss scaler's dtype...).
_DTYPES = frozenset(
    {
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
        "uint8", "bool", "complex64", "complex128", "float", "double", "half", "long", "int",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _StorageKind:
    """What ``torch.FloatStorage`` (...) unpickles to: the element dtype's name."""

    dtype: str


@dataclass(frozen=True, slots=True)
class _TensorClass:
    """What ``torch.Tensor`` unpickles to (only as ``_rebuild_from_type_v2``'s type)."""


class _Storage:
    """One storage of the archive: a flat read-only array over the mapped file."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def view(self, offset: Any, size: Any, stride: Any) -> np.ndarray:
        """The tensor ``torch`` would rebuild: ``size`` elements with ``stride``
        from element ``offset`` of this storage, as a read-only view."""
        shape, strides, offset = _ints(size, "size"), _ints(stride, "stride"), int(offset)
        if len(shape) != len(strides) or any(n < 0 for n in (*shape, *strides, offset)):
            raise pickle.UnpicklingError(
                f"a tensor of size {shape} and stride {strides} at offset {offset}"
            )
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if math.prod(shape) and last >= self.array.size:
            raise pickle.UnpicklingError(
                f"a tensor of size {shape} reaches element {last} of a storage of {self.array.size}"
            )
        base = self.array[offset:]
        item = self.array.itemsize
        return np.lib.stride_tricks.as_strided(
            base, shape, tuple(s * item for s in strides), writeable=False
        )


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in value
    ):
        raise pickle.UnpicklingError(f"a tensor {what} that is not a tuple of ints: {value!r}")
    return tuple(value)


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2`` (and ``_rebuild_tensor``): gradients,
    hooks and metadata are dropped; the values are what a weights file holds."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError(f"a tensor over a {type(storage).__name__}, not a storage")
    return storage.view(offset, size, stride)


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """``torch._tensor._rebuild_from_type_v2`` for plain tensors only."""
    if func is not _rebuild_tensor or not isinstance(new_type, _TensorClass):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 of anything but a plain torch.Tensor")
    if not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 with arguments that are no tuple")
    return _rebuild_tensor(*args)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    """``torch._utils._rebuild_parameter``: a parameter is its tensor."""
    if not isinstance(data, np.ndarray):
        raise pickle.UnpicklingError("a parameter that holds no tensor")
    return data


def _size(*args: Any) -> tuple[int, ...]:
    if len(args) != 1:
        raise pickle.UnpicklingError("torch.Size called with more than one argument")
    return _ints(args[0], "torch.Size")


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode``, as protocol 2 uses it for ``bytes``: latin-1 only."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("_codecs.encode beyond latin-1 text")
    return text.encode("latin1")


def _device(*args: Any) -> str:
    if not all(isinstance(a, str | int) and not isinstance(a, bool) for a in args):
        raise pickle.UnpicklingError("torch.device of anything but a name and an index")
    return ":".join(str(a) for a in args)


_CALLABLES: dict[str, Callable[..., Any]] = {
    "collections.OrderedDict": collections.OrderedDict,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch.Size": _size,
    "torch.device": _device,
    "_codecs.encode": _encode,
}


class _Archive:
    """A ``torch.save`` zip archive, mapped: its pickle and its storages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with zipfile.ZipFile(path) as z:
            self._entries = {info.filename: info for info in z.infolist()}
            pickles = [n for n in self._entries if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise ValueError(f"expected one NAME/data.pkl in the archive, found {len(pickles)}")
            self.prefix = pickles[0].split("/")[0]
            self.pickle = z.read(pickles[0])
            order = self._entries.get(f"{self.prefix}/byteorder")
            byteorder = z.read(order).decode(errors="replace") if order else "little"
        if byteorder != "little":
            raise ValueError(f"tensors stored {byteorder}-endian; expected little-endian")
        self._map = map_file(path)
        self._storages: dict[str, _Storage] = {}

    def storage(self, key: str, dtype: str, numel: int) -> _Storage:
        found = self._storages.get(key)
        if found is not None:
            return found
        info = self._entries.get(f"{self.prefix}/data/{key}")
        if info is None:
            raise ValueError(f"the pickle names storage {key!r}, which the archive lacks")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"storage {key!r} is compressed; torch.save stores storages as-is")
        local = self._map[info.header_offset : info.header_offset + 30].tobytes()
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"storage {key!r} has no local zip header where the index says")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        np_dtype = numpy_dtype(dtype)
        if numel * np_dtype.itemsize > info.file_size or start + info.file_size > self._map.size:
            raise ValueError(
                f"storage {key!r} holds {info.file_size} bytes, fewer than its "
                f"{numel} {dtype} elements"
            )
        array = np.frombuffer(self._map, np_dtype, count=numel, offset=start)
        self._storages[key] = storage = _Storage(array)
        return storage


class _Unpickler(pickle.Unpickler):
    def __init__(self, archive: _Archive) -> None:
        import io

        super().__init__(io.BytesIO(archive.pickle))
        self._archive = archive

    def find_class(self, module: str, name: str) -> Any:
        fq = f"{module}.{name}"
        found = _CALLABLES.get(fq) or STAND_INS.get(fq)
        if found is not None:
            return found
        if module == "torch" and name in _STORAGES:
            return _StorageKind(_STORAGES[name])
        if fq == "torch.Tensor":
            return _TensorClass()
        if module == "torch" and name in _DTYPES:
            return fq
        raise pickle.UnpicklingError(f"Trying to load unsupported GLOBAL {fq}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageKind) or not isinstance(numel, int):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        return self._archive.storage(str(key), kind.dtype, numel)


def load_deepspeed_file(path: str | os.PathLike, /) -> Any:
    """A DeepSpeed checkpoint file (``torch.save`` output), unpickled with the
    restricted unpickler of this module: tensors as read-only numpy arrays over
    the mapped file, DeepSpeed's classes as the inert stand-ins in
    :data:`STAND_INS`, anything else refused.

    Raises:
      ValueError: one line naming the file: not a PyTorch zip file, damaged, or
        refused (any other class, anything that would run code), with the reason.

    >>> for name in sorted(STAND_INS):  # all that is allowed beyond tensors and containers
    ...     print(name)
    deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
    deepspeed.runtime.fp16.loss_scaler.LossScaler
    deepspeed.runtime.zero.config.ZeroStageEnum
    deepspeed.utils.tensor_fragment.fragment_address
    """
    path = Path(path)
    check_torch_file(path)
    with open(path, "rb") as f:
        zipped = f.read(2) == b"PK"
    if not zipped:
        raise ValueError(
            f"{path}: a PyTorch file in the legacy (pre-1.6) format; jaxshare reads DeepSpeed "
            "files saved as zip archives: re-save it with a current torch."
        )
    try:
        return _Unpickler(_Archive(path)).load()
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path}: refused: loading it would run code beyond rebuilding tensors ({e}). "
            "jaxshare reads DeepSpeed files with its own restricted unpickler; if you trust "
            "this file, consolidate it with DeepSpeed's zero_to_fp32."
        ) from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: not a PyTorch file jaxshare can read ({type(e).__name__}: {e})."
        ) from None
