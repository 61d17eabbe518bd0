"""The restricted unpickler of ``torch.save`` files: tensors rebuilt as numpy views,
and nothing else of a pickle's code ever run.

A ``torch.save`` file is a zip archive (:class:`~jaxshare.formats.torch_save.zip.TorchZip`)
or, before torch 1.6, the legacy format: a run of pickles -- a magic number, a
protocol version, system information, the object, the list of storage keys --
followed by each storage's element count and bytes. Either way a pickle can run
any code when loaded; :class:`Unpickler` allows exactly:

- the names ``torch.save`` uses to rebuild tensors (``_rebuild_tensor``,
  ``_rebuild_tensor_v2``, ``_rebuild_tensor_v3``, ``_rebuild_from_type_v2`` of a
  plain ``torch.Tensor``, ``_rebuild_parameter`` and
  ``_rebuild_parameter_with_state``), typed and untyped storages,
  ``torch.Size``, dtype and device names, ``OrderedDict``, and
  ``_codecs.encode`` (how pickle protocol 2 writes ``bytes``);
- classes the caller maps to inert stand-ins of its own (``classes``: the
  DeepSpeed reader's, see :mod:`jaxshare.formats.deepspeed.files`).

Every other global is refused in one line naming it, so the file's code never
runs. A tensor must lie inside its storage, and a storage inside the file.
Tensors come back as numpy arrays over the file's memory (no copy; bfloat16 and
float8 through ``ml_dtypes``), dtypes and devices as their names
(``"torch.float16"``). torch is never imported.
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxshare.core.dtype import numpy_dtype
from jaxshare.formats.torch_save.tables import DTYPES, STORAGES, UINTS
from jaxshare.formats.torch_save.zip import ArrayFile, TorchZip
from jaxshare.io.mapped import scattered_reads

__all__ = ["Storage", "Unpickler", "unpickle_torch", "unpickle_zip", "unpickling"]

#: The first pickle of a legacy file, and its protocol version.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


@dataclass(frozen=True, slots=True)
class _StorageKind:
    """What ``torch.FloatStorage`` (...) unpickles to: the element dtype's name."""

    dtype: str


@dataclass(frozen=True, slots=True)
class _TensorClass:
    """What ``torch.Tensor`` unpickles to (only as ``_rebuild_from_type_v2``'s type)."""


class Storage:
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
        bits = flat[offset:].view(UINTS.get(item, flat.dtype))
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
    if not isinstance(storage, Storage):
        raise pickle.UnpicklingError(f"a tensor over a {type(storage).__name__}, not a storage")
    return storage.view(offset, size, stride)


def _rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *_: Any
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v3``: an untyped storage read as ``dtype``
    (how torch saves float8 and unsigned tensors)."""
    if not isinstance(storage, Storage):
        raise pickle.UnpicklingError(f"a tensor over a {type(storage).__name__}, not a storage")
    name = dtype.removeprefix("torch.") if isinstance(dtype, str) else None
    if name not in DTYPES:
        raise pickle.UnpicklingError(f"_rebuild_tensor_v3 with dtype {dtype!r}")
    return storage.view(offset, size, stride, DTYPES[name])


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


class Unpickler(pickle.Unpickler):
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
        if module in ("torch", "torch.storage") and name in STORAGES:
            return _StorageKind(STORAGES[name])
        if fq == "torch.Tensor":
            return _TensorClass()
        if module == "torch" and name in DTYPES:
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


def _storages(archive: TorchZip) -> Callable[[tuple], Storage]:
    """Resolves the persistent ids of ``archive``'s pickle: each storage once, as
    its first id describes it."""
    found: dict[str, Storage] = {}

    def storage(pid: tuple) -> Storage:
        _, kind, key, _location, numel, *_ = pid
        key = str(key)
        if key not in found:
            found[key] = Storage(archive.storage(key, kind.dtype, numel))
        return found[key]

    return storage


def unpickle_zip(archive: TorchZip, classes: Mapping[str, type]) -> Any:
    """The object of a ``torch.save`` zip archive, unpickled with :class:`Unpickler`
    (``classes`` allowed too): tensors as views of ``archive.data``."""
    with scattered_reads(archive.data):  # (The storages' local headers.)
        return Unpickler(io.BytesIO(archive.pickle), _storages(archive), classes).load()


class _Legacy:
    """A legacy (pre-1.6) ``torch.save`` stream over ``data``.

    Storages are read after the object pickle, so the object is unpickled twice:
    once to find where it ends (the storage keys and bytes follow it), then
    over the storages' bytes.
    """

    def __init__(self, data: np.ndarray) -> None:
        self._data = data
        stream = ArrayFile(data)
        if self._plain(stream) != _LEGACY_MAGIC:
            raise ValueError("not a torch.save file: its first pickle is not torch's magic number")
        if self._plain(stream) != _LEGACY_PROTOCOL:
            raise ValueError("a legacy torch.save file of an unknown protocol version")
        info = self._plain(stream)
        if not isinstance(info, dict) or info.get("little_endian") is not True:
            raise ValueError("tensors stored big-endian; expected little-endian")
        self._object = stream.tell()
        self._kinds: dict[str, tuple[str, int]] = {}  # storage key -> (dtype, numel)
        Unpickler(stream, self._record, {}, dry=True).load()
        keys = self._plain(stream)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("the storage keys of a legacy file are not a list of names")
        self._storages: dict[str, Storage] = {}
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
            self._storages[key] = Storage(array)
            position = end
        missing = sorted(set(self._kinds) - set(self._storages))
        if missing:
            raise ValueError(f"the pickle names storages {missing[:3]} the file does not hold")

    @staticmethod
    def _plain(stream: ArrayFile) -> Any:
        return Unpickler(stream, None, {}).load()

    def _record(self, pid: tuple) -> None:
        _, kind, key, _location, numel, *_ = pid
        self._kinds.setdefault(str(key), (kind.dtype, numel))

    def _storage(self, pid: tuple) -> Storage:
        _, _kind, key, _location, _numel, *view = pid
        storage = self._storages[str(key)]
        if view and view[0] is not None:  # (view key, offset, size): a slice of the storage
            _, offset, size = view[0]
            storage = Storage(storage.array[_int(offset) : _int(offset) + _int(size)])
        return storage

    def load(self, classes: Mapping[str, type]) -> Any:
        stream = ArrayFile(self._data)
        stream.seek(self._object)
        return Unpickler(stream, self._storage, classes).load()


def unpickle_torch(
    data: np.ndarray, classes: Mapping[str, type], *, file: str | os.PathLike | None = None
) -> Any:
    """The object of a ``torch.save`` file (a zip archive or a legacy file) whose
    bytes are ``data``, unpickled with :class:`Unpickler` (``classes`` allowed
    too): tensors as views of ``data``. ``file``: where a zip archive's directory
    is read (default: ``data``).

    Raises:
      pickle.UnpicklingError: a global not allowed, anything that would run code.
      ValueError, zipfile.BadZipFile, EOFError, KeyError, TypeError: damaged.
    """
    if data[:2].tobytes() == b"PK":
        return unpickle_zip(TorchZip(data, file), classes)
    return _Legacy(data).load(classes)


@contextlib.contextmanager
def unpickling(refused: Callable[[str], str], unreadable: Callable[[str], str]) -> Iterator[None]:
    """Unpickles a ``torch.save`` record: what the restricted unpickler refuses is one
    line, ``refused(why)``; what is no record it can read, ``unreadable(why)``
    (``why``: the reason, with the error's type for the latter). Never anything that
    ran code: nothing does."""
    try:
        yield
    except pickle.UnpicklingError as e:
        raise ValueError(refused(str(e))) from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(unreadable(f"{type(e).__name__}: {e}")) from None
