"""PyTorch Distributed Checkpoint (DCP) folders, read with numpy only and never running pickle code.

``torch.distributed.checkpoint.save`` writes a folder: ``.metadata``, a pickle of
DCP's ``Metadata``, and one or more ``__{rank}_{i}.distcp`` files per rank. The
state dict is flattened first, nested keys joined by dots (``{"model":
{"wte.weight": t}}`` -> ``model.wte.weight``, list items by index:
``optimizer.param_groups.0.lr``), and each flattened item is either

- a tensor (``TensorStorageMetadata``: global shape, dtype and chunks, each chunk
  the ``offsets`` and ``sizes`` of the box one rank stored -- a DTensor
  ``Shard``, an FSDP2 ``fully_shard`` shard, uneven last chunks and empty ones
  included; a ``Replicate`` or plain tensor is stored once), or
- another object (``BytesStorageMetadata``: an int, a list, a dataloader's
  state), pickled by ``torch.save``.

``storage_data`` maps each chunk (fqn, offsets) and each object (fqn) to a record
``(file, offset, length)`` in a ``.distcp`` file. torch 2.x writes every record
as a ``torch.save`` zip archive of its own (the chunk as a contiguous tensor);
a record exactly ``prod(sizes) * itemsize`` long is read as the chunk's raw
bytes, in C order. Records written through a stream transform (DCP's
experimental ``_extensions``, e.g. ``stream.zstd/1``) are refused.

``.metadata`` is unpickled by an unpickler of this module that allows exactly
DCP's metadata classes (as inert stand-ins, converted into the frozen
dataclasses below), ``torch.Size``, dtype and layout names, the memory-format
enum, ``pathlib`` paths (the checkpoint id) and ``OrderedDict``: any other
global is refused in one line naming it, so a hostile file's payload never
runs. Tensor records are read by the restricted unpickler of PyTorch files
(:mod:`jaxshare.formats.pytorch`) as numpy views of the mapped ``.distcp``
file: no copy until chunks are assembled, and a slice reads only the chunks
it overlaps. torch is never imported.

Everything is checked when a folder is opened, each problem one ``ValueError``
line naming the file: the metadata's types, every tensor's chunks tiling its
shape exactly (the first gap or overlap named), every record's file present,
inside the folder and long enough (a truncated file names the bytes expected
and found). A record is checked against its chunk (shape, dtype, length) when
it is read.
"""

from __future__ import annotations

import bisect
import collections
import io
import math
import os
import pathlib
import pickle
import re
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import itemsize, numpy_dtype
from jaxshare.core.naming import NamingRecord
from jaxshare.core.report import ArrayInfo, format_bytes
from jaxshare.formats.item_files import ALIAS_MAP_FILE, DCP_METADATA_FILE, NAMING_FILE
from jaxshare.formats.pytorch import _DTYPES, _Zip
from jaxshare.io.mapped import FileRange, map_file, scattered_reads
from jaxshare.io.source import Index, TensorSource

__all__ = [
    "AUTO",
    "DISTCP_SUFFIX",
    "MAX_METADATA_BYTES",
    "METADATA_FILE",
    "TRAINING_STATE_KEYS",
    "DCPChunk",
    "DCPFolder",
    "DCPMetadata",
    "DCPRecord",
    "DCPTensor",
    "is_dcp_folder",
    "read_dcp_metadata",
]

#: The metadata file of a DCP folder.
METADATA_FILE = DCP_METADATA_FILE
#: The suffix of DCP's data files (``__{rank}_{i}.distcp``).
DISTCP_SUFFIX = ".distcp"
#: The largest ``.metadata`` read unless ``max_bytes=`` says more.
MAX_METADATA_BYTES = 1 << 30
#: What a record's file may be called: a name inside the folder (no separators, no
#: control characters).
_FILE_NAME = re.compile(r"[^/\\\x00-\x1f\x7f]+")
#: Why a folder written in DCP's safetensors serialization is refused.
_SAFETENSORS_HINT = (
    ": the folder was written with FileSystemWriter(serialization_format=SAFETENSORS), whose "
    "records torch's own FileSystemReader cannot read either; save it with the default "
    "(torch.save) serialization"
)
#: ``part=`` default: the model part of a training checkpoint, else everything.
AUTO = "auto"
#: Top-level keys of a training checkpoint beside its model: torchtitan's
#: (``optimizer``, ``lr_scheduler``, ``dataloader``, ``train_state``) and torchtune's.
TRAINING_STATE_KEYS = frozenset(
    {
        "optimizer", "optim", "lr_scheduler", "lr_schedulers", "dataloader", "train_state",
        "seed", "epochs_run", "total_epochs", "max_steps_per_epoch", "steps_run",
    }
)  # fmt: skip
_MODEL = "model"


# -- what the metadata says ------------------------------------------------------------


@dataclass(frozen=True)
class DCPRecord:
    """Where DCP stored one chunk or object: ``length`` bytes at ``offset`` of
    ``file`` (a name in the folder), written through ``transforms`` (none, as
    ``FileSystemWriter`` writes by default)."""

    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class DCPChunk:
    """One stored box of a tensor: ``sizes`` elements from ``offsets`` of the
    global tensor, and the record that holds them."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    record: DCPRecord

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def index(self) -> Index:
        """The box as an index into the global tensor."""
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.sizes, strict=True))


@dataclass(frozen=True)
class DCPTensor:
    """A tensor item: global ``shape``, numpy ``dtype`` name, its chunks."""

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[DCPChunk, ...]

    @property
    def info(self) -> ArrayInfo:
        return ArrayInfo(self.shape, self.dtype)


@dataclass(frozen=True)
class DCPMetadata:
    """A DCP folder's ``.metadata``, checked.

    Attributes:
      path: the ``.metadata`` file.
      tensors: ``{fqn: DCPTensor}``, in the saved state dict's order.
      objects: ``{fqn: DCPRecord}`` of the items that are not tensors.
      keys: ``{fqn: path}``: the key path of each item in the nested state dict
        DCP flattened (``("model", "wte.weight")``; ``(fqn,)`` where the
        metadata records none).
      version: DCP's metadata version (``"1.0.0"`` for torch 2.4+, ``None`` before).
    """

    path: Path
    tensors: Mapping[str, DCPTensor]
    objects: Mapping[str, DCPRecord]
    keys: Mapping[str, tuple[str | int, ...]]
    version: str | None

    @property
    def top_level(self) -> tuple[str, ...]:
        """The top-level keys of the saved state dict, in order."""
        return tuple(dict.fromkeys(str(path[0]) for path in self.keys.values()))


# -- the restricted unpickler ----------------------------------------------------------


class _Refused(pickle.UnpicklingError):
    """What the metadata unpickler refuses to build (as opposed to a damaged pickle)."""


class _Pickled:
    """An inert stand-in for one of DCP's metadata classes: pickle builds it with
    no arguments and hands it its state, which it keeps and nothing more."""

    __slots__ = ("state",)
    kind = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Pickled:
        if args or kwargs:
            raise _Refused(f"it calls {cls.kind} with arguments")
        return super().__new__(cls)

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _stand_in(kind: str) -> type[_Pickled]:
    return type(kind, (_Pickled,), {"__slots__": (), "kind": kind})


METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_SHARD_METADATA = "torch.distributed._shard.sharded_tensor.metadata"  # torch 2.0-2.1
_KINDS = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
          "TensorProperties", "MetadataIndex", "StorageMeta", "_StorageInfo")  # fmt: skip
_STAND_INS = {kind: _stand_in(kind) for kind in _KINDS}
#: Fully-qualified class names (as torch 2.x pickles them) -> stand-in.
_CLASSES: dict[str, type[_Pickled]] = {
    **{f"{METADATA_MODULE}.{k}": _STAND_INS[k] for k in _KINDS if k != "_StorageInfo"},
    f"{_SHARD_METADATA}.TensorProperties": _STAND_INS["TensorProperties"],
    "torch.distributed.checkpoint.filesystem._StorageInfo": _STAND_INS["_StorageInfo"],
}


def _size(*args: Any) -> tuple[int, ...]:
    if len(args) > 1:
        raise pickle.UnpicklingError("torch.Size called with more than one argument")
    value = args[0] if args else ()
    if not isinstance(value, tuple | list) or not all(type(n) is int and n >= 0 for n in value):
        raise pickle.UnpicklingError(f"torch.Size of {value!r:.60}")
    return tuple(value)


def _layout(name: Any) -> str:
    if not isinstance(name, str):
        raise pickle.UnpicklingError(f"a tensor layout named {name!r:.60}")
    return name


def _memory_format(value: Any) -> int:
    if type(value) is not int or value not in (0, 1, 2):
        raise pickle.UnpicklingError(f"a memory format encoding {value!r:.60}")
    return value


def _path(*parts: Any) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise pickle.UnpicklingError("a path of anything but strings")
    return str(pathlib.PurePath(*parts)) if parts else "."


#: Callables a ``.metadata`` may name, beside the classes above.
_CALLABLES: dict[str, Callable[..., Any]] = {
    "torch.Size": _size,
    "torch.serialization._get_layout": _layout,
    f"{METADATA_MODULE}._MEM_FORMAT_ENCODING": _memory_format,
    f"{_SHARD_METADATA}.MEM_FORMAT_ENCODING": _memory_format,
    "collections.OrderedDict": collections.OrderedDict,
    **{
        f"{module}.{name}": _path
        for module in ("pathlib", "pathlib._local")
        for name in (
            "Path",
            "PosixPath",
            "WindowsPath",
            "PurePath",
            "PurePosixPath",
            "PureWindowsPath",
        )  # fmt: skip
    },
}


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object per use, so what a pickle does to it (``BUILD``
    sets attributes) stays with that one load."""
    return lambda *args: fn(*args)


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` with the allowlist above; refuses every other
    global, persistent ids and extension codes."""

    def find_class(self, module: str, name: str) -> Any:
        fq = f"{module}.{name}"
        stand_in = _CLASSES.get(fq)
        if stand_in is not None:
            return stand_in
        call = _CALLABLES.get(fq)
        if call is not None:
            return _fresh(call)
        if module == "torch" and name in _DTYPES:
            return fq
        raise _Refused(f"it names {fq}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent id")


def read_dcp_metadata(
    path: str | os.PathLike, /, *, max_bytes: int = MAX_METADATA_BYTES
) -> DCPMetadata:
    """The ``.metadata`` of a DCP folder, read without torch and checked.

    Args:
      path: the folder, or its ``.metadata`` file.
      max_bytes: the largest file read (default :data:`MAX_METADATA_BYTES`).

    Raises:
      FileNotFoundError: no such folder or ``.metadata``.
      ValueError: one line naming the file: larger than ``max_bytes``; a pickle
        that names anything but DCP's metadata classes (refused, never run);
        damaged; or metadata whose chunks do not tile a tensor, with what was
        expected and what was found.

    >>> import pathlib, tempfile
    >>> evil = pathlib.Path(tempfile.mkdtemp()) / ".metadata"
    >>> _ = evil.write_bytes(b"\\x80\\x04cposix\\nsystem\\nX\\x02\\x00\\x00\\x00ls\\x85R.")
    >>> read_dcp_metadata(evil)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: .../.metadata: refused: not DCP metadata: it names posix.system, ...
    """
    path = Path(path)
    if path.is_dir():
        path = path / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; expected a DCP folder's {METADATA_FILE}.")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(
            f"{path}: {format_bytes(size)}, over the {format_bytes(max_bytes)} a DCP "
            "metadata file is read up to; pass `max_bytes=` for a trusted file."
        )
    try:
        with open(path, "rb") as f:
            raw = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise ValueError(
            f"{path}: refused: not DCP metadata: {e}, which DCP's metadata never holds; "
            "unpickling it would run that code, so jaxshare reads only DCP's own metadata "
            "classes."
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, MemoryError, RecursionError) as e:  # fmt: skip
        raise ValueError(
            f"{path}: not DCP metadata jaxshare can read ({type(e).__name__}: {e})."
        ) from None
    return _Converter(path).metadata(raw)


class _Converter:
    """The stand-ins of one ``.metadata`` into :class:`DCPMetadata`, checked."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, message: str) -> ValueError:
        return ValueError(f"{self.path}: invalid DCP metadata: {message}.")

    def fields(self, obj: Any, kind: str, where: str) -> dict[str, Any]:
        if not isinstance(obj, _Pickled) or obj.kind != kind:
            raise self.fail(f"{where}: expected a {kind}, found {_describe(obj)}")
        state = getattr(obj, "state", None)
        if state is None:
            return {}
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]  # (None, slots)
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise self.fail(f"{where}: expected the fields of a {kind}, found {_describe(state)}")
        return state

    def metadata(self, raw: Any) -> DCPMetadata:
        top = self.fields(raw, "Metadata", "the pickle")
        items = top.get("state_dict_metadata")
        if not isinstance(items, dict) or not all(isinstance(k, str) for k in items):
            raise self.fail(
                f"expected `state_dict_metadata` (fqn -> item), found {_describe(items)}"
            )
        version = top.get("version")
        if version is not None and (not isinstance(version, str) or version.split(".")[0] != "1"):
            raise self.fail(f"metadata version {version!r}; this jaxshare reads DCP's version 1")
        records = self.records(top.get("storage_data"))
        keys = self.keys(top.get("planner_data"), items)
        tensors: dict[str, DCPTensor] = {}
        objects: dict[str, DCPRecord] = {}
        for fqn in keys:
            item = items[fqn]
            if isinstance(item, _Pickled) and item.kind == "BytesStorageMetadata":
                record = records.get((fqn, None))
                if record is None:
                    raise self.fail(f"{fqn!r} has no record in `storage_data`")
                objects[fqn] = record
            else:
                tensors[fqn] = self.tensor(fqn, item, records)
        return DCPMetadata(self.path, tensors, objects, keys, version)

    def records(self, storage: Any) -> dict[tuple[str, tuple[int, ...] | None], DCPRecord]:
        if not isinstance(storage, dict):
            raise self.fail(
                f"expected `storage_data` (a dict of records, as FileSystemWriter writes), "
                f"found {_describe(storage)}"
            )
        out: dict[tuple[str, tuple[int, ...] | None], DCPRecord] = {}
        for key, info in storage.items():
            index = self.fields(key, "MetadataIndex", "a `storage_data` key")
            fqn, offset = index.get("fqn"), index.get("offset")
            if not isinstance(fqn, str) or not (offset is None or _is_ints(offset)):
                raise self.fail(
                    f"a `storage_data` key of fqn {fqn!r:.60} and offset {offset!r:.60}"
                )
            where = f"the record of {fqn!r}"
            f = self.fields(info, "_StorageInfo", where)
            file, start, length = f.get("relative_path"), f.get("offset"), f.get("length")
            transforms = f.get("transform_descriptors") or ()
            if (
                not isinstance(file, str)
                or not _is_count(start)
                or not _is_count(length)
                or not isinstance(transforms, list | tuple)
                or not all(isinstance(t, str) for t in transforms)
            ):
                raise self.fail(
                    f"{where}: expected a file name, offset and length, found {f!r:.120}"
                )
            out[fqn, None if offset is None else tuple(offset)] = DCPRecord(
                file, start, length, tuple(transforms)
            )
        return out

    def keys(self, planner: Any, items: Mapping[str, Any]) -> dict[str, tuple[str | int, ...]]:
        """``{fqn: key path}``, in the saved state dict's order (DCP's planner data
        merges every rank's, in the last rank's order)."""
        paths: dict[str, tuple[str | int, ...]] = {}
        if isinstance(planner, dict):
            for fqn, path in planner.items():
                if (
                    fqn in items
                    and isinstance(path, tuple | list)
                    and path
                    and all(isinstance(k, str | int) and not isinstance(k, bool) for k in path)
                ):
                    paths[fqn] = tuple(path)
        elif planner is not None:
            raise self.fail(
                f"expected `planner_data` (fqn -> key path), found {_describe(planner)}"
            )
        for fqn in items:
            paths.setdefault(fqn, (fqn,))
        return paths

    def properties(self, props: Any, where: str) -> tuple[Any, Any]:
        """``(dtype, layout)`` of a ``TensorProperties``: pickled as the tuple
        ``(dtype, layout, requires_grad, memory format, pin_memory)``, or as fields."""
        state = getattr(props, "state", None)
        if isinstance(props, _Pickled) and isinstance(state, tuple) and len(state) == 5:
            return state[0], state[1]
        fields = self.fields(props, "TensorProperties", f"{where}'s properties")
        return fields.get("dtype"), fields.get("layout")

    def tensor(self, fqn: str, item: Any, records: Mapping[Any, DCPRecord]) -> DCPTensor:
        where = f"tensor {fqn!r}"
        f = self.fields(item, "TensorStorageMetadata", where)
        shape, chunks = f.get("size"), f.get("chunks")
        dtype, layout = self.properties(f.get("properties"), where)
        name = dtype.removeprefix("torch.") if isinstance(dtype, str) else None
        if name not in _DTYPES:
            known = ", ".join(f"torch.{d}" for d in sorted(set(_DTYPES.values())))
            raise self.fail(f"{where} has dtype {dtype!r}; expected one of {known}")
        if layout not in (None, "torch.strided"):
            raise self.fail(f"{where} has layout {layout!r}; DCP stores strided tensors only")
        if not _is_ints(shape) or not isinstance(chunks, list):
            raise self.fail(f"{where}: expected a size and a list of chunks, found {f!r:.120}")
        shape = tuple(shape)
        out = []
        for i, chunk in enumerate(chunks):
            c = self.fields(chunk, "ChunkStorageMetadata", f"{where}'s chunk {i}")
            offsets, sizes = c.get("offsets"), c.get("sizes")
            if (
                not _is_ints(offsets)
                or not _is_ints(sizes)
                or len(offsets) != len(shape)
                or len(sizes) != len(shape)
                or any(o + n > d for o, n, d in zip(offsets, sizes, shape, strict=True))
            ):
                raise self.fail(
                    f"{where} of shape {shape}: chunk {i} at offsets {offsets} of sizes "
                    f"{sizes} does not lie inside it"
                )
            record = records.get((fqn, tuple(offsets)))
            if record is None:
                raise self.fail(
                    f"{where}: chunk {i} at offsets {tuple(offsets)} has no record in "
                    "`storage_data`"
                )
            out.append(DCPChunk(tuple(offsets), tuple(sizes), record))
        problem = _tiling_problem(shape, out)
        if problem:
            raise self.fail(f"{where} of shape {shape}: {problem}")
        return DCPTensor(shape, _DTYPES[name], tuple(out))


def _is_count(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _is_ints(value: Any) -> TypeGuard[Sequence[int]]:
    return isinstance(value, tuple | list) and all(_is_count(n) for n in value)


def _describe(obj: Any) -> str:
    if isinstance(obj, _Pickled):
        return f"a {obj.kind}"
    if isinstance(obj, dict):
        return f"a dict with keys {list(obj)[:6]}"
    return type(obj).__name__


#: Tiling is checked on a grid of the chunks' edges; one larger than this is refused.
_MAX_GRID_CELLS = 1 << 22


def _tiling_problem(shape: tuple[int, ...], chunks: Sequence[DCPChunk]) -> str | None:
    """Why ``chunks`` do not cover ``shape`` exactly once, or ``None`` if they do.

    The chunks' edges cut each axis into intervals; a grid cell of those intervals
    lies wholly inside or outside each chunk, so counting the chunks over every
    cell finds the first element no chunk holds and the first two holds.
    """
    if math.prod(shape) == 0:
        return None
    filled = [c for c in chunks if c.numel]
    edges = [
        sorted(
            {0, n, *(c.offsets[d] for c in filled), *(c.offsets[d] + c.sizes[d] for c in filled)}
        )
        for d, n in enumerate(shape)
    ]
    cells = math.prod(len(e) - 1 for e in edges)
    if cells > _MAX_GRID_CELLS:
        return _pairwise_problem(shape, chunks)
    count = np.zeros([len(e) - 1 for e in edges], np.int32)
    owner = np.full(count.shape, -1, np.int32)
    for i, c in enumerate(chunks):
        if not c.numel:
            continue
        box = tuple(
            slice(bisect.bisect_left(e, o), bisect.bisect_left(e, o + n))
            for e, o, n in zip(edges, c.offsets, c.sizes, strict=True)
        )
        twice = np.flatnonzero(count[box] > 0)
        if twice.size:
            cell = np.unravel_index(twice[0], count[box].shape)
            at = tuple(e[b.start + k] for e, b, k in zip(edges, box, cell, strict=True))
            j = int(owner[box][cell])
            return (
                f"chunks {j} (offsets {chunks[j].offsets}, sizes {chunks[j].sizes}) and {i} "
                f"(offsets {c.offsets}, sizes {c.sizes}) overlap at element {at}"
            )
        count[box] += 1
        owner[box] = i
    gaps = np.flatnonzero(count == 0)
    if gaps.size:
        cell = np.unravel_index(gaps[0], count.shape)
        lo = tuple(e[k] for e, k in zip(edges, cell, strict=True))
        hi = tuple(e[k + 1] for e, k in zip(edges, cell, strict=True))
        box_text = ", ".join(f"{a}:{b}" for a, b in zip(lo, hi, strict=True))
        return (
            f"no chunk holds [{box_text}] (from element {lo}); expected chunks that cover "
            f"it exactly, found {len(chunks)}: a rank's chunk is missing"
        )
    return None


def _pairwise_problem(shape: tuple[int, ...], chunks: Sequence[DCPChunk]) -> str | None:
    """:func:`_tiling_problem` for chunks too irregular for a grid: no two overlap
    (checked pairwise, one chunk against all the later ones at a time) and together
    they hold as many elements as the tensor."""
    filled = [(i, c) for i, c in enumerate(chunks) if c.numel]
    lo = np.array([c.offsets for _, c in filled], np.int64).reshape(len(filled), len(shape))
    hi = lo + np.array([c.sizes for _, c in filled], np.int64).reshape(lo.shape)
    for k, (i, c) in enumerate(filled):
        hit = np.flatnonzero(((lo[k + 1 :] < hi[k]) & (lo[k] < hi[k + 1 :])).all(axis=1))
        if hit.size:
            j, d = filled[k + 1 + hit[0]]
            at = tuple(int(n) for n in np.maximum(lo[k], lo[k + 1 + hit[0]]))
            return (
                f"chunks {i} (offsets {c.offsets}, sizes {c.sizes}) and {j} "
                f"(offsets {d.offsets}, sizes {d.sizes}) overlap at element {at}"
            )
    held, total = sum(c.numel for _, c in filled), math.prod(shape)
    if held != total:
        return (
            f"expected chunks that hold its {total} elements exactly, found {len(chunks)} "
            f"holding {held}: a rank's chunk is missing"
        )
    return None


# -- the folder ------------------------------------------------------------------------


def is_dcp_folder(path: str | os.PathLike, /) -> bool:
    """Whether ``path`` is a directory holding a DCP ``.metadata`` and ``.distcp`` files.

    >>> import tempfile
    >>> is_dcp_folder(tempfile.mkdtemp())
    False
    """
    path = Path(path)
    return (
        path.is_dir()
        and (path / METADATA_FILE).is_file()
        and any(p.suffix == DISTCP_SUFFIX for p in path.iterdir())
    )


class _FileView(io.RawIOBase):
    """A read-only, seekable file over an array of bytes (one record of a mapped
    file), for ``zipfile``: reads copy only what they return."""

    def __init__(self, data: np.ndarray) -> None:
        super().__init__()
        self._view = memoryview(data)  # type: ignore[arg-type]  # (a uint8 array)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._position : self._position + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, len(self._view))[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position


def _unpickle_record(data: np.ndarray) -> Any:
    """A ``torch.save`` record (a zip archive) in ``data``, unpickled by the
    restricted unpickler of PyTorch files: tensors are views of ``data``."""
    # (`_Zip` opens its archive with zipfile, which takes a file object as well as a
    # path. Its directory, at the record's end, and headers are read page by page: a
    # record read past the page cache reads its values again, and an 8 GB folder
    # read 9.65 GB with the kernel's read-around.)
    with scattered_reads(data):
        return _Zip(_FileView(data), data).load({})  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Item:
    """One exposed tensor: its fqn in the folder and what the metadata says."""

    fqn: str
    tensor: DCPTensor


class DCPFolder(TensorSource):
    """A PyTorch Distributed Checkpoint folder, read with numpy only: a
    :class:`~jaxshare.stream.TensorSource` whose tensors are assembled from the
    chunks of any number of ranks, bit for bit, and whose slices read only the
    chunks they overlap.

    Names are DCP's flattened fqns, within ``part``: a training checkpoint
    (top-level ``model`` beside ``optimizer``, ``lr_scheduler``, ``dataloader``,
    ``train_state``, as torchtitan and torchtune save it; or the model's keys at
    the top level beside them, as newer torchtitan does) shows its model by
    default, ``model.`` stripped, and :attr:`notes` says what else it holds.
    DCP itself records no ties: two fqns over the very same records are one
    (origin ``"storage"``), and so is each alias of the alias map jaxshare writes
    beside the records (``jaxshare_alias_map.json`` and its naming record; origin
    ``"alias map"``).

    Args:
      path: the folder (holding ``.metadata`` and ``__{rank}_{i}.distcp``).
      part: the top-level key whose items to expose, its prefix stripped
        (``"optimizer"`` gives ``state.wte.weight.exp_avg``...); ``None``: every
        item, as DCP names it; :data:`AUTO` (default): ``"model"`` in a training
        checkpoint, else every item.
      max_metadata_bytes: as :func:`read_dcp_metadata`'s ``max_bytes``.

    Attributes:
      metadata: the folder's :class:`DCPMetadata`.
      part: the part exposed (``None``: everything).
      top_level: the top-level keys of the saved state dict.
      other_items: names of the items of ``part`` that are not tensors (read
        one with :meth:`read_item`).
      notes: one line saying what else the folder holds, where ``part`` hides
        something (for the command line to print).
      bytes_read: the data bytes of the chunks reads have used so far (a
        chunk counts whole each time a read uses it): a slice inside one chunk
        adds that chunk's bytes only.

    Raises:
      FileNotFoundError: no such folder or ``.metadata``.
      ValueError: one line naming the file: metadata refused or invalid (see
        :func:`read_dcp_metadata`); a record in a file that is missing, outside
        the folder, shorter than the record needs (truncated) or written through
        a stream transform; a ``part`` the folder does not have.

    >>> import pathlib, jaxshare
    >>> FIXTURES = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/dcp"
    >>> with DCPFolder(FIXTURES / "sharded") as ckpt:
    ...     print(ckpt.part, ckpt.top_level, ckpt.infos["fc.weight"])
    ...     print(ckpt.notes[0])
    ...     print([(offsets, sizes) for offsets, sizes, _ in ckpt.chunks("fc.weight")])
    ...     print(ckpt.array("fc.weight").shape, ckpt.read_slice("fc.weight", (slice(5, 7),)).shape)
    model ('model', 'optimizer', 'train_state') ArrayInfo(shape=(7, 6), dtype='float32')
    also holds: optimizer (21 tensors, 12 other items), train_state (1 other item)
    [((0, 0), (4, 6)), ((4, 0), (3, 6))]
    (7, 6) (2, 6)
    >>> with DCPFolder(FIXTURES / "sharded", part="train_state") as state:
    ...     print(state.other_items, state.read_item("step"))
    ('step',) 3
    """

    kind = "dcp"
    mapped = True  # chunks are views of the mapped files

    def __init__(
        self,
        path: str | os.PathLike,
        /,
        *,
        part: str | None = AUTO,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> None:
        self.folder = self.path = Path(path)
        self.bytes_read = 0
        self._lock = threading.Lock()
        self._maps: dict[str, np.ndarray] = {}
        self._arrays: dict[DCPRecord, np.ndarray] = {}
        if not self.folder.is_dir():
            raise FileNotFoundError(
                f"{self.folder}: no such folder; expected a DCP checkpoint folder (holding "
                f"{METADATA_FILE} and __RANK_I{DISTCP_SUFFIX} files)."
            )
        self.metadata = read_dcp_metadata(self.folder, max_bytes=max_metadata_bytes)
        self.top_level = self.metadata.top_level
        self._sizes = self._check_records()
        self._training = self._training_layout()
        self.part = self._choose_part(part)
        self._items: dict[str, _Item] = {}
        self._objects: dict[str, str] = {}  # name -> fqn
        for fqn, key in self.metadata.keys.items():
            name = self._name_in_part(fqn, key)
            if name is None:
                continue
            tensor = self.metadata.tensors.get(fqn)
            if tensor is not None:
                self._items[name] = _Item(fqn, tensor)
            else:
                self._objects[name] = fqn
        self.infos = {name: item.tensor.info for name, item in self._items.items()}
        self.other_items: tuple[str, ...] = tuple(self._objects)
        self.notes = self._notes()
        shared = self._ties()
        recorded = self._recorded_ties()
        aliases = {**shared, **recorded}
        try:
            self.ties = AliasMap(aliases, transforms=recorded.transforms).with_naming(
                recorded.naming
            )
        except ValueError as e:
            raise ValueError(f"{self.folder / ALIAS_MAP_FILE}: {e}") from None
        self.origins = {a: "alias map" if a in recorded else "storage" for a in aliases}
        self._written_out = frozenset(a for a in recorded if a in self.infos and a not in shared)
        self.parts = self._part_lines()
        self.other_files = tuple(
            sorted(
                p.name
                for p in self.folder.iterdir()
                if p.name not in (METADATA_FILE, ALIAS_MAP_FILE, NAMING_FILE)
                and p.name not in self._sizes
            )
        )

    # -- opening -------------------------------------------------------------------

    def _records(self) -> Iterator[tuple[str, DCPRecord]]:
        for fqn, tensor in self.metadata.tensors.items():
            for chunk in tensor.chunks:
                yield fqn, chunk.record
        yield from self.metadata.objects.items()

    def _check_records(self) -> dict[str, int]:
        """``{file: size}``; every record's file is a file of the folder, long
        enough, and read without a transform."""
        ends: dict[str, tuple[int, str]] = {}
        for fqn, record in self._records():
            name = record.file
            if not _FILE_NAME.fullmatch(name) or name in (".", ".."):
                raise ValueError(
                    f"{self.metadata.path}: the record of {fqn!r} is in {name!r}; expected a "
                    "file name inside the folder (DCP writes __RANK_I.distcp)."
                )
            if record.transforms:
                raise ValueError(
                    f"{self.folder / name}: the record of {fqn!r} was written through the stream "
                    f"transform(s) {list(record.transforms)} (DCP's `_extensions`); jaxshare "
                    "reads untransformed records only: load the folder with torch and save it "
                    "again without `_extensions`."
                )
            end = record.offset + record.length
            if end > ends.get(name, (-1, ""))[0]:
                ends[name] = (end, fqn)
        sizes = {}
        for name, (end, fqn) in ends.items():
            file = self.folder / name
            if not file.is_file():
                raise ValueError(
                    f"{file}: no such file; the metadata puts the record of {fqn!r} in it "
                    "(a rank's file is missing)."
                )
            size = file.stat().st_size
            if size < end:
                raise ValueError(
                    f"{file}: truncated: expected at least {end} bytes (the record of {fqn!r} "
                    f"ends there), found {size}."
                )
            sizes[name] = size
        self._check_overlaps()
        self._check_raw_records()
        return sizes

    def _check_overlaps(self) -> None:
        """No two records share bytes, unless they are one record (a tie written once)."""
        spans: dict[str, dict[tuple[int, int], str]] = {}
        for fqn, record in self._records():
            if record.length:
                spans.setdefault(record.file, {}).setdefault((record.offset, record.length), fqn)
        for name, found in spans.items():
            end, last = 0, ""
            for (offset, length), fqn in sorted(found.items()):
                if offset < end:
                    raise ValueError(
                        f"{self.folder / name}: the records of {last!r} and {fqn!r} overlap "
                        f"(the second starts at byte {offset}, before the first ends at {end}); "
                        "expected each record on bytes of its own"
                        + _SAFETENSORS_HINT * self._safetensors_at(name, offset)
                        + "."
                    )
                if offset + length > end:
                    end, last = offset + length, fqn

    def _check_raw_records(self) -> None:
        """A raw-looking record (``prod(sizes) * itemsize`` long) is not the
        safetensors blob DCP's ``SAFETENSORS`` serialization writes."""
        for fqn, tensor in self.metadata.tensors.items():
            size = itemsize(tensor.dtype)
            for chunk in tensor.chunks:
                record = chunk.record
                if record.length == chunk.numel * size and self._safetensors_at(
                    record.file, record.offset
                ):
                    raise ValueError(
                        f"{self.folder / record.file}: a safetensors header where the metadata "
                        f"puts the raw bytes of {fqn!r}" + _SAFETENSORS_HINT + "."
                    )

    def _safetensors_at(self, name: str, offset: int) -> bool:
        """Whether a safetensors header of DCP's starts at byte ``offset`` of ``name``."""
        data = self._file(name)
        head = data[offset : offset + 9].tobytes()
        if len(head) < 9 or head[8:9] != b"{":
            return False
        n = int.from_bytes(head[:8], "little")
        header = data[offset + 8 : offset + 8 + min(n, 1 << 20)].tobytes()
        return b'"data_offsets"' in header and b'"DCP_SHARDING_INFO"' in header

    def _training_layout(self) -> bool:
        top = set(self.top_level)
        if _MODEL in top:
            return top - {_MODEL} <= TRAINING_STATE_KEYS
        return "optimizer" in top and bool(self._flat_model_fqns())

    def _flat_model_fqns(self) -> list[str]:
        """The tensors of a training checkpoint whose model keys are top level."""
        return [
            fqn for fqn in self.metadata.tensors
            if str(self.metadata.keys[fqn][0]) not in TRAINING_STATE_KEYS
        ]  # fmt: skip

    def _choose_part(self, part: str | None) -> str | None:
        if part == AUTO:
            return _MODEL if self._training else None
        if part is None:
            return None
        if not isinstance(part, str) or (
            part not in self.top_level and not (part == _MODEL and self._training)
        ):
            raise ValueError(
                f"{self.folder}: `part` {part!r} is not a top-level key of this checkpoint; "
                f"expected one of {list(self.top_level)[:12]} (or None for every item)."
            )
        return part

    def _part_of(self, key: tuple[str | int, ...]) -> str:
        top = str(key[0])
        if _MODEL not in self.top_level and top not in TRAINING_STATE_KEYS and self._training:
            return _MODEL  # newer torchtitan: the model's keys at the top level
        return top

    def _name_in_part(self, fqn: str, key: tuple[str | int, ...]) -> str | None:
        if self.part is None:
            return fqn
        if self._part_of(key) != self.part:
            return None
        if str(key[0]) != self.part or not fqn.startswith(f"{self.part}."):
            return fqn
        return fqn[len(self.part) + 1 :]

    def _notes(self) -> tuple[str, ...]:
        items = ()
        if self.other_items:  # Listed, never read as tensors.
            shown = ", ".join(self.other_items[:8])
            more = f" (+{len(self.other_items) - 8} more)" if len(self.other_items) > 8 else ""
            items = (f"items that are not tensors: {shown}{more}",)
        if self.part is None:
            return items
        counts: dict[str, list[int]] = {}
        for fqn, key in self.metadata.keys.items():
            part = self._part_of(key)
            if part != self.part:
                counts.setdefault(part, [0, 0])[fqn not in self.metadata.tensors] += 1
        if not counts:
            return items

        def what(tensors: int, others: int) -> str:
            words = [f"{tensors} tensor{'s' * (tensors != 1)}"] if tensors else []
            words += [f"{others} other item{'s' * (others != 1)}"] if others else []
            return ", ".join(words)

        held = ", ".join(f"{p} ({what(*n)})" for p, n in counts.items())
        return (*items, f"also holds: {held}")

    def _ties(self) -> dict[str, str]:
        """Names over the very same records (a tie written once); zero-size tensors
        are never tied."""
        first: dict[tuple, str] = {}
        aliases = {}
        for name, item in self._items.items():
            t = item.tensor
            if not math.prod(t.shape):
                continue
            key = (t.shape, t.dtype, tuple((c.offsets, c.sizes, c.record) for c in t.chunks))
            canonical = first.setdefault(key, name)
            if canonical != name:
                aliases[name] = canonical
        return aliases

    def _recorded_ties(self) -> AliasMap:
        """The alias map jaxshare wrote beside the records (``jaxshare_alias_map.json``,
        in the folder's fqns, with its naming record), in this part's names."""
        file = self.folder / ALIAS_MAP_FILE
        if not file.is_file():
            return AliasMap()
        try:
            recorded = AliasMap.from_json(file.read_bytes())
            naming_file = self.folder / NAMING_FILE
            naming = (
                NamingRecord.from_json(naming_file.read_bytes()) if naming_file.is_file() else None
            )
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None
        names = {item.fqn: name for name, item in self._items.items()}
        aliases, transforms = {}, {}
        for alias, canonical in recorded.items():
            if canonical not in self.metadata.tensors:
                raise ValueError(
                    f"{file}: ties {alias!r} to {canonical!r}; expected a tensor of the folder, "
                    f"found none of that name."
                )
            if canonical not in names:
                continue  # another part's tie
            name = names.get(alias, alias)
            aliases[name] = names[canonical]
            if recorded.transform(alias) is not None:
                transforms[name] = recorded.transform(alias)
        return AliasMap(aliases, transforms=transforms, naming=naming if aliases else None)

    def _part_lines(self) -> tuple[str, ...]:
        chunks: dict[str, int] = dict.fromkeys(self._sizes, 0)
        objects: dict[str, int] = dict.fromkeys(self._sizes, 0)
        for tensor in self.metadata.tensors.values():
            for chunk in tensor.chunks:
                chunks[chunk.record.file] += 1
        for record in self.metadata.objects.values():
            objects[record.file] += 1
        lines = []
        for name in sorted(self._sizes):
            extra = f", {objects[name]} other items" if objects[name] else ""
            lines.append(f"{name}: {chunks[name]} chunks{extra}, {format_bytes(self._sizes[name])}")
        return tuple(lines)

    def chunk_lines(self) -> tuple[str, ...]:
        """One line per tensor: its chunks, each as its index range and file
        (``fc.weight: [0:4, 0:6] __0_0.distcp, [4:7, 0:6] __1_0.distcp``)."""
        lines = []
        for name in self.infos:
            cells = []
            for offsets, sizes, file in self.chunks(name):
                box = ", ".join(f"{o}:{o + n}" for o, n in zip(offsets, sizes, strict=True))
                cells.append(f"[{box}] {file}")
            lines.append(f"{name}: {', '.join(cells) or 'no chunks'}")
        return tuple(lines)

    # -- records -------------------------------------------------------------------

    def _file(self, name: str) -> np.ndarray:
        with self._lock:
            data = self._maps.get(name)
            if data is None:
                data = self._maps[name] = map_file(self.folder / name)
        return data

    def _record_bytes(self, record: DCPRecord) -> np.ndarray:
        data = self._file(record.file)
        view = data[record.offset : record.offset + record.length]
        if view.size != record.length:  # the file shrank since it was opened
            raise ValueError(
                f"{self.folder / record.file}: truncated: expected at least "
                f"{record.offset + record.length} bytes, found {data.size}."
            )
        return view

    def _chunk(self, item: _Item, chunk: DCPChunk) -> np.ndarray:
        """The values of ``chunk``, of its sizes: a read-only view of the mapped file."""
        record = chunk.record
        with self._lock:
            self.bytes_read += chunk.numel * itemsize(item.tensor.dtype)
            found = self._arrays.get(record)
        if found is not None:
            return found
        dtype = numpy_dtype(item.tensor.dtype)
        data = self._record_bytes(record)
        where = (
            f"{self.folder / record.file}: the record of {item.fqn!r} at offsets {chunk.offsets} "
            f"(bytes {record.offset}..{record.offset + record.length})"
        )
        if record.length == chunk.numel * dtype.itemsize:  # raw bytes, C order
            array = data.view(dtype).reshape(chunk.sizes)
        else:
            try:
                array = _unpickle_record(data)
            except pickle.UnpicklingError as e:
                raise ValueError(
                    f"{where}: refused: a torch.save record that would run code beyond "
                    f"rebuilding a tensor ({e})."
                ) from None
            except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{where}: expected the chunk's {chunk.numel * dtype.itemsize} raw bytes or "
                    f"a torch.save record of it, found neither ({type(e).__name__}: {e})."
                ) from None
            if (
                not isinstance(array, np.ndarray)
                or array.dtype != dtype
                or (array.shape != chunk.sizes)
            ):
                found_text = (
                    f"a {array.dtype.name} tensor of shape {array.shape}"
                    if isinstance(array, np.ndarray)
                    else f"a {type(array).__name__}"
                )
                raise ValueError(
                    f"{where}: expected a {dtype.name} tensor of shape {chunk.sizes}, as the "
                    f"metadata says, found {found_text}."
                )
        with self._lock:
            self._arrays[record] = array
        return array

    def _item(self, name: str) -> _Item:
        try:
            return self._items[name]
        except KeyError:
            hint = (
                "it is an item that is not a tensor (see `other_items`)"
                if name in self._objects
                else f"the tensors are {list(self._items)[:5]}..."
            )
            raise KeyError(f"{self.folder}: no tensor named {name!r}; {hint}") from None

    # -- tensors -------------------------------------------------------------------

    def chunks(self, name: str, /) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
        """``(offsets, sizes, file)`` of each chunk of tensor ``name``, as stored."""
        return [(c.offsets, c.sizes, c.record.file) for c in self._item(name).tensor.chunks]

    def _filled(self, item: _Item) -> list[DCPChunk]:
        return [c for c in item.tensor.chunks if c.numel]

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` whole: a read-only view of the mapped file where one
        chunk holds it all, else its chunks assembled into memory of its own."""
        item = self._item(name)
        t = item.tensor
        filled = self._filled(item)
        if len(filled) == 1 and filled[0].sizes == t.shape:
            return self._chunk(item, filled[0])
        out = np.empty(t.shape, numpy_dtype(t.dtype))
        for chunk in filled:
            out[chunk.index()] = self._chunk(item, chunk)
        return out

    def read(self, name: str) -> np.ndarray:
        """:meth:`array`."""
        return self.array(name)

    def extents(self, name: str) -> Sequence[FileRange]:
        return [
            (os.fspath(self.folder / c.record.file), c.record.offset, c.record.length)
            for c in self._filled(self._item(name))
        ]

    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """Tensor ``name`` in C order as blocks end to end: its chunks as views
        of the mapped files where they are whole rows (one chunk, or chunks that
        split the first axis only, as FSDP shards), else the assembled array."""
        item = self._item(name)
        t = item.tensor
        filled = sorted(self._filled(item), key=lambda c: c.offsets)
        if t.shape and all(c.sizes[1:] == t.shape[1:] for c in filled):
            for chunk in filled:
                yield self._chunk(item, chunk)
        else:
            yield self.array(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]`` (one slice of step 1 per axis, as sharded loading
        asks), read from the chunks it overlaps only."""
        item = self._item(name)
        t = item.tensor
        box = _box(t.shape, index, lambda: f"{self.folder}: {name!r}")
        out = np.empty(tuple(hi - lo for lo, hi in box), numpy_dtype(t.dtype))
        for chunk in self._filled(item):
            cut = [
                (max(lo, o), min(hi, o + n))
                for (lo, hi), o, n in zip(box, chunk.offsets, chunk.sizes, strict=True)
            ]
            if any(a >= b for a, b in cut):
                continue
            values = self._chunk(item, chunk)
            src = tuple(slice(a - o, b - o) for (a, b), o in zip(cut, chunk.offsets, strict=True))
            dst = tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(cut, box, strict=True))
            out[dst] = values[src]
        return out

    # -- other items ---------------------------------------------------------------

    def read_item(self, name: str, /) -> Any:
        """The item ``name`` that is not a tensor (:attr:`other_items`), unpickled
        by the restricted unpickler of PyTorch files: plain Python values
        (numbers, strings, lists, dicts) and tensors as numpy arrays; an object of
        any other class is refused, never built.

        Raises:
          KeyError: no such item.
          ValueError: one line naming the file: the record is damaged, or holds
            an object whose class would run code when unpickled.
        """
        fqn = self._objects.get(name)
        if fqn is None:
            raise KeyError(
                f"{self.folder}: no item named {name!r} that is not a tensor; they are "
                f"{list(self._objects)[:6]}"
            )
        record = self.metadata.objects[fqn]
        where = f"{self.folder / record.file}: the record of {fqn!r}"
        try:
            return _unpickle_record(self._record_bytes(record))
        except pickle.UnpicklingError as e:
            raise ValueError(
                f"{where}: refused: unpickling it would run code ({e}); load it with torch "
                "if you trust the folder."
            ) from None
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{where}: expected a torch.save record, found none ({type(e).__name__}: {e})."
            ) from None

    @property
    def written_out(self) -> frozenset[str]:
        """Aliases stored as tensors of their own (a tie across a layout change);
        the others share their canonical's records."""
        return self._written_out

    def close(self) -> None:
        """Lets go of the mapped files; arrays already returned stay valid."""
        with self._lock:
            self._maps, self._arrays = {}, {}

    def __repr__(self) -> str:
        return (
            f"DCPFolder({str(self.folder)!r}, part={self.part!r}, tensors={len(self.infos)}, "
            f"other_items={len(self.other_items)})"
        )


def _box(shape: tuple[int, ...], index: Index, where: Callable[[], str]) -> list[tuple[int, int]]:
    if not isinstance(index, tuple) or len(index) > len(shape):
        raise IndexError(f"{where()}: expected one slice per axis of {shape}, got {index!r}")
    box = []
    for n, s in zip(shape, index + (slice(None),) * (len(shape) - len(index)), strict=True):
        if not isinstance(s, slice):
            raise IndexError(f"{where()}: expected slices, got {index!r}")
        lo, hi, step = s.indices(n)
        if step != 1:
            raise IndexError(f"{where()}: expected slices of step 1, got {index!r}")
        box.append((lo, max(lo, hi)))
    return box
