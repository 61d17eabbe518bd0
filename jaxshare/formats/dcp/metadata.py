"""A DCP folder's ``.metadata``, read with numpy only and never running pickle code.

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
``(file, offset, length)`` in a ``.distcp`` file.

``.metadata`` is unpickled by an unpickler of this module that allows exactly
DCP's metadata classes (as inert stand-ins, converted into the frozen
dataclasses below), ``torch.Size``, dtype and layout names, the memory-format
enum, ``pathlib`` paths (the checkpoint id) and ``OrderedDict``: any other
global is refused in one line naming it, so a hostile file's payload never
runs. What it holds is checked, each problem one ``ValueError`` line naming the
file: the types, and every tensor's chunks tiling its shape exactly
(:mod:`jaxshare.formats.dcp.tiling`: the first gap or overlap named).
"""

from __future__ import annotations

import collections
import math
import os
import pathlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from jaxshare.core.report import ArrayInfo, format_bytes
from jaxshare.formats.dcp.tiling import tiling_problem
from jaxshare.formats.item_files import DCP_METADATA_FILE
from jaxshare.formats.torch_save.tables import DTYPES
from jaxshare.io.source import Index

__all__ = [
    "MAX_METADATA_BYTES",
    "METADATA_FILE",
    "METADATA_MODULE",
    "DCPChunk",
    "DCPMetadata",
    "DCPRecord",
    "DCPTensor",
    "read_dcp_metadata",
]

#: The metadata file of a DCP folder.
METADATA_FILE = DCP_METADATA_FILE
#: The largest ``.metadata`` read unless ``max_bytes=`` says more.
MAX_METADATA_BYTES = 1 << 30


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
class DCPTensor(ArrayInfo):
    """A tensor item: global ``shape``, numpy ``dtype`` name, its chunks."""

    chunks: tuple[DCPChunk, ...]


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


#: The module of DCP's metadata classes, as torch 2.x pickles them.
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
        if module == "torch" and name in DTYPES:
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
        if name not in DTYPES:
            known = ", ".join(f"torch.{d}" for d in sorted(set(DTYPES.values())))
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
        problem = tiling_problem(shape, out)
        if problem:
            raise self.fail(f"{where} of shape {shape}: {problem}")
        return DCPTensor(shape, DTYPES[name], tuple(out))


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
