"""PyTorch files (``torch.save`` output), read with numpy only and never running pickle code.

``torch.save`` writes a zip archive (since torch 1.6): ``NAME/data.pkl``, a
pickle whose tensors point, by persistent id, at raw storages ``NAME/data/KEY``
stored uncompressed. Older files (the legacy format) are a run of pickles --
a magic number, a protocol version, system information, the object, the list
of storage keys -- followed by each storage's element count and bytes.
Either way a pickle can run any code when loaded; :func:`unpickle_torch_file`
unpickles with an unpickler of its own that allows exactly:

- the names ``torch.save`` uses to rebuild tensors (``_rebuild_tensor``,
  ``_rebuild_tensor_v2``, ``_rebuild_tensor_v3``, ``_rebuild_from_type_v2`` of a
  plain ``torch.Tensor``, ``_rebuild_parameter`` and
  ``_rebuild_parameter_with_state``), typed and untyped storages,
  ``torch.Size``, dtype and device names, ``OrderedDict``, and
  ``_codecs.encode`` (how pickle protocol 2 writes ``bytes``);
- classes the caller maps to inert stand-ins of its own (``classes=``: the
  DeepSpeed reader's, see :mod:`jaxshare.formats.deepspeed.checkpoint`).

Every other global is refused in one line naming it, so the file's code never
runs. A tensor must lie inside its storage, and a storage inside the file.
Tensors come back as numpy arrays over the file's memory (no copy; bfloat16 and
float8 through ``ml_dtypes``), dtypes and devices as their names
(``"torch.float16"``). torch is never imported.

:class:`TorchFile` is a state-dict file as a :class:`jaxshare.stream.TensorSource`:
a tensor stored under several names (one storage) is a tie, and so is a
permuted view of another tensor's storage (what ``bridge.save_torch`` writes
for a tie whose layouts differ).
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import numpy_dtype
from jaxshare.core.memory import MemoryTies, array_key, memory_ties
from jaxshare.core.report import ArrayInfo
from jaxshare.io.atomic import OutputKind
from jaxshare.io.mapped import FileRange, file_extent, map_file, scattered_reads
from jaxshare.io.source import Index, TensorSource, file_part

__all__ = [
    "TORCH_FILE",
    "TORCH_SUFFIXES",
    "TorchFile",
    "check_torch_file",
    "looks_like_torch_file",
    "state_dict_in",
    "state_dict_ties",
    "unpickle_torch_file",
]

#: Suffixes of PyTorch pickle/zip weight files.
TORCH_SUFFIXES = (".pt", ".bin", ".pth")

_ZIP = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"
#: The first pickle of a legacy file, and its protocol version.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


def looks_like_torch_file(path: str | os.PathLike) -> bool:
    """Whether the file starts like ``torch.save`` output: a zip archive or a
    pickle stream (protocol 2 or higher, as torch writes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if head.startswith((_ZIP, _EMPTY_ZIP)):
        return True
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def check_torch_file(path: str | os.PathLike) -> None:
    """Raises unless ``path`` looks like a PyTorch file.

    A file that is neither a zip archive nor a pickle stream is not a PyTorch
    file whatever its suffix says, and is refused as such before anything reads
    it: random bytes or a JSON file named ``.bin`` are not "a pickle that would
    run code".

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line: the file is not a PyTorch zip or pickle file.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/w.bin"
    >>> _ = Path(path).write_text('{"not": "weights"}')
    >>> check_torch_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...w.bin: not a PyTorch/zip/pickle file (it starts with b'{"no'...
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: expected a PyTorch weights file, found a directory.")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if not looks_like_torch_file(path):
        with open(path, "rb") as f:
            head = f.read(4)
        found = "an empty file" if not head else f"it starts with {head!r}"
        raise ValueError(
            f"{path}: not a PyTorch/zip/pickle file ({found}); expected the output of `torch.save`."
        )


#: A ``.pt``/``.bin`` output, for ``force``: replaces only a PyTorch file.
TORCH_FILE = OutputKind("a PyTorch weights file", False, looks_like_torch_file)


# -- the restricted unpickler ----------------------------------------------------------

#: ``torch.<Kind>Storage`` -> the dtype of its elements.
_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}  # fmt: skip
#: ``torch.<dtype>`` names a pickle may hold (a tensor's dtype, a loss scaler's) ->
#: numpy's name for the same bits.
_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128",
    "cdouble": "complex128",
}  # fmt: skip


#: Unsigned integers by width, to stride any dtype's bits.
_UINTS = {n: np.dtype(f"u{n}") for n in (1, 2, 4, 8)}


@dataclass(frozen=True, slots=True)
class _StorageKind:
    """What ``torch.FloatStorage`` (...) unpickles to: the element dtype's name."""

    dtype: str


@dataclass(frozen=True, slots=True)
class _TensorClass:
    """What ``torch.Tensor`` unpickles to (only as ``_rebuild_from_type_v2``'s type)."""


class _Storage:
    """One storage: a flat array of its elements over the file's bytes."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def view(self, offset: Any, size: Any, stride: Any, dtype: str | None = None) -> np.ndarray:
        """The tensor ``torch`` would rebuild: ``size`` elements with ``stride``
        from element ``offset`` of this storage (read as ``dtype``, for an
        untyped storage), as a view."""
        flat = self.array
        if dtype is not None and np.dtype(flat.dtype) != numpy_dtype(dtype):
            target = numpy_dtype(dtype)
            if flat.dtype.itemsize != 1 or flat.size % target.itemsize:
                raise pickle.UnpicklingError(
                    f"a {dtype} tensor over a storage of {flat.size} {flat.dtype} elements"
                )
            flat = flat.view(target)
        shape, strides, offset = _ints(size, "size"), _ints(stride, "stride"), _int(offset)
        if len(shape) != len(strides) or any(n < 0 for n in (*shape, *strides, offset)):
            raise pickle.UnpicklingError(
                f"a tensor of size {shape} and stride {strides} at offset {offset}"
            )
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if math.prod(shape) and last >= flat.size:
            raise pickle.UnpicklingError(
                f"a tensor of size {shape} reaches element {last} of a storage of {flat.size}"
            )
        # (as_strided goes through the array interface, whose type strings numpy cannot
        # parse back for every ml_dtypes type: stride the bits as integers, then view.)
        item = flat.itemsize
        bits = flat[offset:].view(_UINTS.get(item, flat.dtype))
        view = np.lib.stride_tricks.as_strided(
            bits, shape, tuple(s * item for s in strides), writeable=flat.flags.writeable
        )
        return view.view(flat.dtype)


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise pickle.UnpicklingError(f"a tensor offset that is not an int: {value!r}")
    return value


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


def _rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *_: Any
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v3``: an untyped storage read as ``dtype``
    (how torch saves float8 and unsigned tensors)."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError(f"a tensor over a {type(storage).__name__}, not a storage")
    name = dtype.removeprefix("torch.") if isinstance(dtype, str) else None
    if name not in _DTYPES:
        raise pickle.UnpicklingError(f"_rebuild_tensor_v3 with dtype {dtype!r}")
    return storage.view(offset, size, stride, _DTYPES[name])


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """``torch._tensor._rebuild_from_type_v2`` for plain tensors only."""
    if func not in (_rebuild_tensor, _rebuild_tensor_v3) or not isinstance(new_type, _TensorClass):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 of anything but a plain torch.Tensor")
    if not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 with arguments that are no tuple")
    return func(*args)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    """``torch._utils._rebuild_parameter`` (and ``_with_state``): a parameter is its
    tensor; ``requires_grad``, hooks and attributes are dropped."""
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
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch.Size": _size,
    "torch.device": _device,
    "_codecs.encode": _encode,
}


#: The callables above that build tensors: in a dry run (:class:`_Legacy`'s first
#: pass, before the storages' bytes are known) they build nothing.
_BUILDERS = frozenset(n for n in _CALLABLES if "_rebuild_" in n)


def _nothing(*_: Any) -> None:
    return None


class _Unpickler(pickle.Unpickler):
    """Unpickles one pickle of a PyTorch file with the allowlist above (and
    ``classes``); ``storage(pid)`` resolves persistent ids. A ``dry`` run checks
    every global and records the storages, but builds no tensor."""

    def __init__(
        self,
        stream: Any,
        storage: Callable[[tuple], Any] | None,
        classes: Mapping[str, type],
        *,
        dry: bool = False,
    ) -> None:
        super().__init__(stream)
        self._storage = storage
        self._classes = classes
        self._dry = dry

    def find_class(self, module: str, name: str) -> Any:
        fq = f"{module}.{name}"
        if self._dry and fq in _BUILDERS:
            return _nothing
        found = _CALLABLES.get(fq) or self._classes.get(fq)
        if found is not None:
            return found
        if module in ("torch", "torch.storage") and name in _STORAGES:
            return _StorageKind(_STORAGES[name])
        if fq == "torch.Tensor":
            return _TensorClass()
        if module == "torch" and name in _DTYPES:
            return fq
        raise pickle.UnpicklingError(f"Trying to load unsupported GLOBAL {fq}")

    def persistent_load(self, pid: Any) -> Any:
        if self._storage is None:
            raise pickle.UnpicklingError("a storage outside the object pickle")
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        if not isinstance(pid[1], _StorageKind) or not isinstance(pid[4], int):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        return self._storage(pid)


class _Zip:
    """A ``torch.save`` zip archive: its pickle and its storages, over ``data``."""

    def __init__(self, path: Path, data: np.ndarray) -> None:
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
        self._data = data
        self._storages: dict[str, _Storage] = {}

    def storage(self, pid: tuple) -> _Storage:
        _, kind, key, _location, numel, *_ = pid
        key = str(key)
        found = self._storages.get(key)
        if found is not None:
            return found
        info = self._entries.get(f"{self.prefix}/data/{key}")
        if info is None:
            raise ValueError(f"the pickle names storage {key!r}, which the archive lacks")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"storage {key!r} is compressed; torch.save stores storages as-is")
        local = self._data[info.header_offset : info.header_offset + 30].tobytes()
        if len(local) != 30 or local[:4] != _ZIP:
            raise ValueError(f"storage {key!r} has no local zip header where the index says")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        dtype = numpy_dtype(kind.dtype)
        if numel * dtype.itemsize > info.file_size or start + info.file_size > self._data.size:
            raise ValueError(
                f"storage {key!r} holds {info.file_size} bytes, fewer than its "
                f"{numel} {kind.dtype} elements"
            )
        array = np.frombuffer(self._data, dtype, count=numel, offset=start)
        self._storages[key] = storage = _Storage(array)
        return storage

    def load(self, classes: Mapping[str, type]) -> Any:
        with scattered_reads(self._data):  # (The storages' local headers.)
            return _Unpickler(io.BytesIO(self.pickle), self.storage, classes).load()


class _Legacy:
    """A legacy (pre-1.6) ``torch.save`` stream over ``data``.

    Storages are read after the object pickle, so the object is unpickled twice:
    once to find where it ends (the storage keys and bytes follow it), then
    over the storages' bytes.
    """

    def __init__(self, data: np.ndarray) -> None:
        self._data = data
        stream = _Reader(data)
        if self._plain(stream) != _LEGACY_MAGIC:
            raise ValueError("not a torch.save file: its first pickle is not torch's magic number")
        if self._plain(stream) != _LEGACY_PROTOCOL:
            raise ValueError("a legacy torch.save file of an unknown protocol version")
        info = self._plain(stream)
        if not isinstance(info, dict) or info.get("little_endian") is not True:
            raise ValueError("tensors stored big-endian; expected little-endian")
        self._object = stream.tell()
        self._kinds: dict[str, tuple[str, int]] = {}  # storage key -> (dtype, numel)
        _Unpickler(stream, self._record, {}, dry=True).load()
        keys = self._plain(stream)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("the storage keys of a legacy file are not a list of names")
        self._storages: dict[str, _Storage] = {}
        position = stream.tell()
        for key in keys:
            dtype_name, numel = self._kinds.get(key, ("uint8", -1))
            head = data[position : position + 8].tobytes()
            if len(head) != 8:
                raise ValueError(f"storage {key!r} runs past the end of the file")
            (count,) = struct.unpack("<q", head)
            dtype = numpy_dtype(dtype_name)
            end = position + 8 + count * dtype.itemsize
            if count != numel or end > data.size:
                raise ValueError(
                    f"storage {key!r} holds {count} elements where the pickle names {numel}, "
                    "or runs past the end of the file"
                )
            array = np.frombuffer(data, dtype, count=count, offset=position + 8)
            self._storages[key] = _Storage(array)
            position = end
        missing = sorted(set(self._kinds) - set(self._storages))
        if missing:
            raise ValueError(f"the pickle names storages {missing[:3]} the file does not hold")

    @staticmethod
    def _plain(stream: _Reader) -> Any:
        return _Unpickler(stream, None, {}).load()

    def _record(self, pid: tuple) -> None:
        _, kind, key, _location, numel, *_ = pid
        self._kinds.setdefault(str(key), (kind.dtype, numel))

    def _storage(self, pid: tuple) -> _Storage:
        _, _kind, key, _location, _numel, *view = pid
        storage = self._storages[str(key)]
        if view and view[0] is not None:  # (view key, offset, size): a slice of the storage
            _, offset, size = view[0]
            storage = _Storage(storage.array[_int(offset) : _int(offset) + _int(size)])
        return storage

    def load(self, classes: Mapping[str, type]) -> Any:
        return _Unpickler(_Reader(self._data, self._object), self._storage, classes).load()


class _Reader:
    """A read-only file over an array of bytes, for pickle: reads copy only what
    they return, so the storages' bytes are never read through it."""

    def __init__(self, data: np.ndarray, position: int = 0) -> None:
        self._view = memoryview(data)  # type: ignore[arg-type]  # (a uint8 array)
        self._position = position

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n < 0 else min(len(self._view), self._position + n)
        out = self._view[self._position : end].tobytes()
        self._position = end
        return out

    def readline(self) -> bytes:
        end = self._position
        while end < len(self._view) and self._view[end] != 0x0A:
            end += 1
        return self.read(end + 1 - self._position)

    def tell(self) -> int:
        return self._position


Mode = Literal["read", "copy-on-write", "memory"]


def unpickle_torch_file(
    path: str | os.PathLike,
    /,
    *,
    classes: Mapping[str, type] | None = None,
    mode: Mode = "read",
    fix: str = "if you trust this file, load it yourself and pass the state dict",
) -> Any:
    """A ``torch.save`` file (zip or legacy), unpickled with the restricted
    unpickler of this module: tensors as numpy arrays over the file's memory,
    ``classes`` (fully-qualified name -> stand-in) allowed too, anything else
    refused.

    Args:
      path: the file.
      classes: more globals to allow, each mapped to a stand-in of the caller's.
      mode: where the tensors' memory is: ``"read"`` (default), read-only views
        of the mapped file; ``"copy-on-write"``, writable views of a private map
        (writes never reach the file, as ``torch.load(mmap=True)``);
        ``"memory"``, the file read into memory of its own.
      fix: what a refusal suggests doing instead.

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line naming the file: not a PyTorch file, damaged, or
        refused (a global not allowed, anything that would run code), with the
        reason.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "evil.pt"
    >>> _ = path.write_bytes(b"\\x80\\x02cposix\\nsystem\\nX\\x02\\x00\\x00\\x00ls\\x85R.")
    >>> unpickle_torch_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...evil.pt: refused: loading it would run code ... GLOBAL posix.system)...
    """
    path = Path(path)
    check_torch_file(path)
    try:
        if mode == "memory":
            data = np.fromfile(path, np.uint8)
        else:
            data = map_file(path, private=mode == "copy-on-write")
        zipped = data[:2].tobytes() == b"PK"
        reader: _Zip | _Legacy = _Zip(path, data) if zipped else _Legacy(data)
        return reader.load(classes or {})
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path}: refused: loading it would run code beyond rebuilding tensors ({e}). "
            f"jaxshare reads PyTorch files with its own restricted unpickler; {fix}."
        ) from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: not a PyTorch file jaxshare can read ({type(e).__name__}: {e})."
        ) from None


# -- state-dict files ------------------------------------------------------------------


def state_dict_in(path: Path, obj: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The state dict a PyTorch file holds, and the ties it records.

    A DeepSpeed checkpoint (``{"module": state_dict, "shared_params": ...}``)
    gives its ``module``, with each name DeepSpeed recorded as shared and did not
    store added back as its canonical's array (``{alias: canonical}``, the second
    value); a name the file stores is kept as stored, since DeepSpeed's walk can
    be wrong. A consolidated ``zero_to_fp32`` file is a plain state dict.

    Raises:
      ValueError: the file holds no state dict, or a recorded tie names a
        canonical it lacks or a zero-size one.
    """
    recorded: Any = {}
    if isinstance(obj, Mapping) and isinstance(obj.get("module"), Mapping):  # DeepSpeed
        recorded = obj.get("shared_params") or {}
        obj = obj["module"]
    if not isinstance(obj, Mapping) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    ):
        what = (
            f"a dict with keys {list(obj)[:8]}" if isinstance(obj, Mapping) else type(obj).__name__
        )
        raise ValueError(
            f"{path}: expected a state dict (names -> tensors) or a DeepSpeed checkpoint "
            f"with a 'module' state dict, found {what}; extract the state dict and pass it."
        )
    state = dict(obj)
    ties: dict[str, str] = {}
    for alias, canonical in dict(recorded).items():
        if alias in state:
            continue  # What the file stores is the truth.
        if canonical not in state or state[canonical].size == 0:
            raise ValueError(
                f"{path}: DeepSpeed's shared_params ties {alias!r} to {canonical!r}, "
                + (
                    "which the file does not hold."
                    if canonical not in state
                    else "a zero-size tensor; DeepSpeed keys by data_ptr(), 0 for every zero-size "
                    f"tensor, so this tie is not real and the shape of {alias!r} is unknown."
                )
            )
        state[alias] = state[canonical]
        ties[alias] = canonical
    return state, ties


def state_dict_ties(state: Mapping[str, np.ndarray]) -> MemoryTies:
    """The ties of a state dict read from a file: names over one storage (or one
    object, for a zero-size tensor), and permuted views of another tensor's
    storage (an alias with that permutation). Tensors whose memory overlaps
    otherwise are not tied: each is stored as it is."""
    return memory_ties({name: array_key(a) for name, a in state.items()}, views=True)


class TorchFile(TensorSource):
    """A ``.pt``/``.bin``/``.pth`` state-dict file, read without torch: a
    :class:`~jaxshare.stream.TensorSource` whose tensors are views of the mapped
    file (read only when touched).

    The ties are the tensors over one memory: a storage stored under several
    names (origin ``"storage"``), a permuted view of another tensor (an alias
    with that permutation), and the aliases a DeepSpeed file records in
    ``shared_params`` (origin ``"shared_params"``).

    Attributes:
      state: ``{name: array}`` of every name, aliases included.

    Raises:
      FileNotFoundError, ValueError: as :func:`unpickle_torch_file`, or the file
        holds no state dict.

    >>> import tempfile, torch
    >>> w = torch.arange(6.0).reshape(2, 3)
    >>> path = tempfile.mkdtemp() + "/m.pt"
    >>> torch.save({"wte.weight": w, "lm_head.weight": w, "proj.weight": w.t()}, path)
    >>> with TorchFile(path) as f:
    ...     print(dict(f.ties), f.ties.transforms)
    ...     print(f.array("proj.weight").tolist())
    {'lm_head.weight': 'wte.weight', 'proj.weight': 'wte.weight'} {'proj.weight': (1, 0)}
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """

    mapped = True  # blocks are views of the mapped file
    kind = "torch"

    def __init__(self, path: str | os.PathLike, /) -> None:
        self.path = Path(path)
        self.state, recorded = state_dict_in(self.path, unpickle_torch_file(self.path))
        self.infos = {k: ArrayInfo(tuple(a.shape), a.dtype.name) for k, a in self.state.items()}
        found = state_dict_ties(self.state)
        self.ties = AliasMap(found.aliases, transforms=found.transforms)
        self.origins = {a: "shared_params" if a in recorded else "storage" for a in self.ties}
        self.parts = (file_part(self.path, len(self.state)),)

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset()  # A tie is one storage: its names share one memory.

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        try:
            return self.state[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}.") from None

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return np.array(self.array(name)[index])

    def extents(self, name: str) -> Sequence[FileRange]:
        found = file_extent(self.array(name))
        return () if found is None else (found,)

    def close(self) -> None:
        self.state = {}
