"""PyTorch Distributed Checkpoint (DCP) folders, written with numpy only.

A folder that ``torch.distributed.checkpoint.FileSystemWriter`` writes, and
stock ``dcp.load`` reads, is

- ``__0_0.distcp``: one record per stored tensor, back to back. A record is a
  complete ``torch.save`` zip archive of the one tensor (``archive/data.pkl``,
  the raw bytes in ``archive/data/0``, ...), because
  ``FileSystemReader.read_data`` hands the bytes ``offset:offset + length`` of
  the file to ``torch.load`` for every tensor it reads;
- ``.metadata``: a pickle of ``torch.distributed.checkpoint.metadata.Metadata``:
  for each fully qualified name (FQN) its dtype, size and chunks, and, keyed by
  ``MetadataIndex(fqn, chunk offsets)``, the ``_StorageInfo(relative_path,
  offset, length)`` of the record that holds it.

:func:`write_dcp` writes such a folder from a plan, without torch: each stored
tensor of the plan is one record, streamed from the source a block at a time;
an alias of the plan's tie map is one more FQN whose ``_StorageInfo`` is its
canonical's, so the tie is stored once and ``dcp.load`` fills both names from
the same bytes. DCP itself records no ties: jaxshare's alias map stands beside
the files (:data:`ALIAS_MAP_FILE`), with the naming record if the plan has one.

The records and the metadata pickle are assembled opcode by opcode
(:func:`torch_pickle`): the pickle names torch's classes (``torch.Size``,
``torch.float32``, DCP's dataclasses), which torch's unpickler resolves, but
nothing here imports torch to name them.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from jaxshare.core.perm import Perm, permute_shape
from jaxshare.core.progress import ProgressFn
from jaxshare.core.report import ArrayInfo
from jaxshare.formats.dcp.reader import DISTCP_SUFFIX, METADATA_FILE, METADATA_MODULE
from jaxshare.formats.item_files import ALIAS_MAP_FILE, NAMING_FILE
from jaxshare.formats.pytorch import _STORAGES
from jaxshare.io.atomic import OutputKind, atomic_output, fsync_dir, write_synced
from jaxshare.io.mapped import write_array
from jaxshare.io.output_file import WriteBehind
from jaxshare.io.plan import Plan, PlanEntry
from jaxshare.io.source import TensorSource
from jaxshare.io.transpose import contiguous_transpose

__all__ = [
    "DCP_DATA_FILE",
    "DCP_DTYPES",
    "DCP_FOLDER",
    "DCP_VERSION",
    "Global",
    "NewObject",
    "PersistentId",
    "Reduce",
    "holds_only_dcp",
    "torch_pickle",
    "write_dcp",
]

#: The one data file :func:`write_dcp` writes (rank 0's first file, as DCP names it).
DCP_DATA_FILE = "__0_0.distcp"
#: The metadata pickle of a DCP folder.
#: ``torch.distributed.checkpoint.filesystem.CURRENT_DCP_VERSION`` of torch 2.13.
DCP_VERSION = "1.0.0"

_FILESYSTEM = "torch.distributed.checkpoint.filesystem"


# -- pickles, opcode by opcode --------------------------------------------------------------


@dataclass(frozen=True)
class Global:
    """The global ``module.name``, pickled by name (never imported here)."""

    module: str
    name: str


@dataclass(frozen=True, eq=False)  # (Compared and hashed by identity: dict keys may be nodes.)
class Reduce:
    """``func(*args)`` when unpickled."""

    func: Global
    args: tuple[object, ...]


@dataclass(frozen=True, eq=False)
class NewObject:
    """``cls.__new__(cls)`` given ``state`` (``__setstate__(state)``, or the
    ``__dict__`` updated from a dict), as pickle stores a dataclass."""

    cls: Global
    state: object


@dataclass(frozen=True)
class PersistentId:
    """What the unpickler's ``persistent_load(pid)`` returns (``torch.save``: a storage)."""

    pid: tuple[object, ...]


class _Emitter:
    """Writes the pickle opcodes of one object tree: ``None``, bools, ints, strings,
    tuples, lists, dicts, and the nodes above. Globals and strings are memoized
    at protocol 4 (a name stored once, referenced after); protocol 2 writes them
    as ``torch.save`` writes its ``data.pkl``."""

    def __init__(self, protocol: int) -> None:
        if protocol not in (2, 4):
            raise ValueError(f"`protocol` must be 2 or 4, got {protocol}.")
        self.protocol = protocol
        self.out = bytearray(b"\x80" + bytes([protocol]))
        self.memo: dict[object, int] = {}

    def _get(self, key: object) -> bool:
        index = self.memo.get(key)
        if index is None:
            return False
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
        return True

    def _memoize(self, key: object) -> None:
        if self.protocol == 4:
            self.memo[key] = len(self.memo)
            self.out += b"\x94"  # MEMOIZE

    def _str(self, text: str) -> None:
        if self._get(("str", text)):
            return
        data = text.encode("utf-8", "surrogatepass")
        if self.protocol == 4 and len(data) < 256:
            self.out += b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE
        elif len(data) < 1 << 32:
            self.out += b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE
        else:
            self.out += b"\x8d" + struct.pack("<Q", len(data)) + data  # BINUNICODE8
        self._memoize(("str", text))

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out += b"K" + bytes([value])  # BININT1
        elif 0 <= value < 65536:
            self.out += b"M" + struct.pack("<H", value)  # BININT2
        elif -(1 << 31) <= value < 1 << 31:
            self.out += b"J" + struct.pack("<i", value)  # BININT
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(data)]) + data  # LONG1

    def _global(self, g: Global) -> None:
        if self._get(g):
            return
        if self.protocol == 4:
            self._str(g.module)
            self._str(g.name)
            self.out += b"\x93"  # STACK_GLOBAL
        else:
            self.out += b"c" + f"{g.module}\n{g.name}\n".encode()  # GLOBAL
        self._memoize(g)

    def _tuple(self, items: tuple[object, ...]) -> None:
        if len(items) <= 3:
            for item in items:
                self.save(item)
            self.out += (b")", b"\x85", b"\x86", b"\x87")[len(items)]  # EMPTY_TUPLE, TUPLE1-3
            return
        self.out += b"("  # MARK
        for item in items:
            self.save(item)
        self.out += b"t"  # TUPLE

    def save(self, obj: object) -> None:
        if obj is None:
            self.out += b"N"
        elif obj is True or obj is False:
            self.out += b"\x88" if obj else b"\x89"
        elif type(obj) is int:
            self._int(obj)
        elif type(obj) is str:
            self._str(obj)
        elif type(obj) is tuple:
            self._tuple(obj)
        elif type(obj) is list:
            self.out += b"]"  # EMPTY_LIST
            if obj:
                self.out += b"("
                for item in obj:
                    self.save(item)
                self.out += b"e"  # APPENDS
        elif type(obj) is dict:
            self.out += b"}"  # EMPTY_DICT
            items = list(obj.items())
            for start in range(0, len(items), 1000):  # SETITEMS in batches, as pickle does.
                self.out += b"("
                for key, value in items[start : start + 1000]:
                    self.save(key)
                    self.save(value)
                self.out += b"u"
        elif isinstance(obj, Global):
            self._global(obj)
        elif isinstance(obj, Reduce):
            self._global(obj.func)
            self._tuple(obj.args)
            self.out += b"R"  # REDUCE
        elif isinstance(obj, NewObject):
            self._global(obj.cls)
            self.out += b")\x81"  # EMPTY_TUPLE, NEWOBJ
            self.save(obj.state)
            self.out += b"b"  # BUILD
        elif isinstance(obj, PersistentId):
            self._tuple(obj.pid)
            self.out += b"Q"  # BINPERSID
        else:
            raise TypeError(f"cannot pickle {type(obj).__name__} objects: {obj!r:.80}")


def torch_pickle(obj: object, *, protocol: int = 4) -> bytes:
    """The pickle of ``obj``, a tree of ``None``, bools, ints, strings, tuples,
    lists, dicts (in their order) and :class:`Global`, :class:`Reduce`,
    :class:`NewObject` and :class:`PersistentId` nodes: a pickle that names
    classes of a package (torch) this process need not have.

    >>> import pickle
    >>> size = Reduce(Global("collections", "Counter"), ({"a": 2},))
    >>> pickle.loads(torch_pickle({"n": size, "t": (1, None, True)}))
    {'n': Counter({'a': 2}), 't': (1, None, True)}
    """
    emitter = _Emitter(protocol)
    emitter.save(obj)
    emitter.out += b"."  # STOP
    return bytes(emitter.out)


# -- torch's objects, by name -------------------------------------------------------------

#: numpy dtype name -> the typed storage ``torch.save`` pickles (``torch.FloatStorage``...).
#: The dtypes without one are pickled as torch does: an untyped storage of bytes, and
#: ``_rebuild_tensor_v3`` given the dtype.
_STORAGE_OF = {dtype: kind for kind, dtype in _STORAGES.items() if kind != "UntypedStorage"}
_UNTYPED = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
#: The dtypes a DCP folder can hold (as numpy names them; torch's names agree).
DCP_DTYPES = (*_STORAGE_OF, *_UNTYPED)


def _size(shape: Sequence[int]) -> Reduce:
    return Reduce(Global("torch", "Size"), (tuple(shape),))


def _check_dtype(info: ArrayInfo, name: str) -> None:
    if info.dtype not in DCP_DTYPES:
        raise ValueError(
            f"{name!r} has dtype {info.dtype}, which a DCP folder cannot store (torch has no "
            f"such dtype); it stores {', '.join(sorted(DCP_DTYPES))}. Pass `dtype=` to cast "
            "floating arrays, or convert this array first."
        )


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of ``shape`` (a size-0 axis counts as 1)."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _tensor_pickle(info: ArrayInfo) -> bytes:
    """``archive/data.pkl`` of a record: the tensor over storage ``"0"``, as ``torch.save``
    writes it."""
    shape, strides = tuple(info.shape), _contiguous_strides(info.shape)
    count = math.prod(shape)
    no_hooks = Reduce(Global("collections", "OrderedDict"), ())
    kind = _STORAGE_OF.get(info.dtype)
    if kind is not None:
        storage = PersistentId(("storage", Global("torch", kind), "0", "cpu", count))
        args: tuple[object, ...] = (storage, 0, shape, strides, False, no_hooks)
        return torch_pickle(Reduce(Global("torch._utils", "_rebuild_tensor_v2"), args), protocol=2)
    untyped = Global("torch.storage", "UntypedStorage")  # Counted in bytes.
    storage = PersistentId(("storage", untyped, "0", "cpu", info.nbytes))
    args = (storage, 0, shape, strides, False, no_hooks, Global("torch", info.dtype))
    return torch_pickle(Reduce(Global("torch._utils", "_rebuild_tensor_v3"), args), protocol=2)


def _tensor_metadata(info: ArrayInfo) -> NewObject:
    """``TensorStorageMetadata`` of a tensor stored whole: one chunk at offset 0."""
    properties = NewObject(
        Global(METADATA_MODULE, "TensorProperties"),
        (  # TensorProperties.__getstate__: dtype, layout, requires_grad, memory format, pinned.
            Global("torch", info.dtype),
            Reduce(Global("torch.serialization", "_get_layout"), ("torch.strided",)),
            False,
            Reduce(Global(METADATA_MODULE, "_MEM_FORMAT_ENCODING"), (0,)),  # contiguous_format
            False,
        ),
    )
    zeros = _size((0,) * len(info.shape))
    chunk = NewObject(
        Global(METADATA_MODULE, "ChunkStorageMetadata"),
        {"offsets": zeros, "sizes": _size(info.shape)},
    )
    return NewObject(
        Global(METADATA_MODULE, "TensorStorageMetadata"),
        {"properties": properties, "size": _size(info.shape), "chunks": [chunk]},
    )


@dataclass(frozen=True)
class _Record:
    """Where a tensor's record lies in the data file."""

    offset: int
    length: int


def _metadata_pickle(fqns: dict[str, tuple[ArrayInfo, _Record]]) -> bytes:
    """The ``.metadata`` pickle: ``Metadata`` of every FQN, each over its record."""
    storage = {}
    for fqn, (info, record) in fqns.items():
        index = NewObject(
            Global(METADATA_MODULE, "MetadataIndex"),
            {"fqn": fqn, "offset": _size((0,) * len(info.shape)), "index": 0},
        )
        storage[index] = NewObject(  # _StorageInfo.__getstate__ leaves out a None field.
            Global(_FILESYSTEM, "_StorageInfo"),
            {"relative_path": DCP_DATA_FILE, "offset": record.offset, "length": record.length},
        )
    metadata = NewObject(
        Global(METADATA_MODULE, "Metadata"),
        {
            "state_dict_metadata": {fqn: _tensor_metadata(info) for fqn, (info, _) in fqns.items()},
            "planner_data": {fqn: (fqn,) for fqn in fqns},  # A flat state dict: one key each.
            "storage_data": storage,
            "storage_meta": NewObject(
                Global(METADATA_MODULE, "StorageMeta"),
                {"checkpoint_id": None, "save_id": None, "load_id": None, "modules": []},
            ),
            "version": DCP_VERSION,
        },
    )
    return torch_pickle(metadata)


# -- one record: a torch.save zip archive of one tensor ----------------------------------------

_ALIGN = 64  # torch.save aligns every entry's data to 64 bytes; so does each record here.
#: sizes and offsets from here on take zip64 fields (a module constant, so tests reach it)
_ZIP64_AT = 0xFFFFFFFF
_DOS_DATE = 0x21  # 1980-01-01, 00:00: every entry, so a record's bytes depend on its data only.


@dataclass
class _ZipEntry:
    name: bytes
    offset: int  # of its local header, from the start of the record
    size: int
    crc: int

    @property
    def zip64(self) -> bool:
        return self.size >= _ZIP64_AT


class _RecordWriter:
    """Writes one record, a ``torch.save`` archive, at the file's position: small
    entries from bytes, the tensor's data from blocks as they come."""

    def __init__(self, f: BinaryIO, after: Callable[[], None] | None = None) -> None:
        self.f = f
        self.after = after  # Called after each step of a tensor's data is written.
        self.start = f.tell()
        self.entries: list[_ZipEntry] = []

    def _local_header(self, name: bytes, size: int, crc: int) -> _ZipEntry:
        entry = _ZipEntry(name, self.f.tell() - self.start, size, crc)
        extra = struct.pack("<HHQQ", 1, 16, size, size) if entry.zip64 else b""
        fixed = 30 + len(name) + len(extra) + 4
        pad = -(entry.offset + fixed) % _ALIGN
        extra += b"FB" + struct.pack("<H", pad) + b"Z" * pad  # torch's padding field
        small = 0xFFFFFFFF if entry.zip64 else size
        version = 45 if entry.zip64 else 20
        self.f.write(
            struct.pack(
                "<IHHHHHIIIHH",
                0x04034B50,
                version,
                0,
                0,
                0,
                _DOS_DATE,
                crc,
                small,
                small,
                len(name),
                len(extra),
            )  # fmt: skip
            + name
            + extra
        )
        self.entries.append(entry)
        return entry

    def add(self, name: str, data: bytes) -> None:
        self._local_header(f"archive/{name}".encode(), len(data), zlib.crc32(data))
        self.f.write(data)

    def add_blocks(self, name: str, nbytes: int, blocks: Iterable[np.ndarray], what: str) -> int:
        """Streams ``blocks`` (``nbytes`` in all) as the entry ``name``; returns its CRC."""
        entry = self._local_header(f"archive/{name}".encode(), nbytes, 0)
        crc, size = 0, 0
        for block in blocks:
            data = _little_endian(np.ascontiguousarray(block))
            raw = data.reshape(-1).view(np.uint8)
            size += raw.size
            if size > nbytes:
                break
            crc = zlib.crc32(raw.data, crc)
            write_array(data, self.f, self.after)
        if size != nbytes:
            raise ValueError(f"{what}: expected {nbytes} bytes, got {size} or more.")
        entry.crc = crc
        end = self.f.tell()
        self.f.seek(self.start + entry.offset + 14)  # The local header's CRC field.
        self.f.write(struct.pack("<I", crc))
        self.f.seek(end)
        return crc

    def finish(self) -> _Record:
        """Writes the central directory; returns where the whole record lies."""
        directory = self.f.tell() - self.start
        for e in self.entries:
            big = [e.size, e.size] if e.zip64 else []
            if e.offset >= _ZIP64_AT:
                big.append(e.offset)
            extra = struct.pack(f"<HH{len(big)}Q", 1, 8 * len(big), *big) if big else b""
            small = 0xFFFFFFFF if e.zip64 else e.size
            offset = 0xFFFFFFFF if e.offset >= _ZIP64_AT else e.offset
            version = 45 if big else 20
            self.f.write(
                struct.pack(
                    "<IHHHHHHIIIHHHHHII",
                    0x02014B50,
                    version,
                    version,
                    0,
                    0,
                    0,
                    _DOS_DATE,
                    e.crc,
                    small,
                    small,
                    len(e.name),
                    len(extra),
                    0,
                    0,
                    0,
                    0,
                    offset,
                )  # fmt: skip
                + e.name
                + extra
            )
        end = self.f.tell() - self.start
        size, count = end - directory, len(self.entries)
        if directory >= _ZIP64_AT or size >= _ZIP64_AT or any(e.zip64 for e in self.entries):
            self.f.write(
                struct.pack(
                    "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, size, directory
                )  # fmt: skip
                + struct.pack("<IIQI", 0x07064B50, 0, end, 1)
            )
            size, directory = 0xFFFFFFFF, 0xFFFFFFFF
        self.f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, size, directory, 0))
        return _Record(self.start, self.f.tell() - self.start)


def _little_endian(data: np.ndarray) -> np.ndarray:
    order = data.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return data.byteswap().view(data.dtype.newbyteorder("<"))
    return data


def _write_record(
    f: BinaryIO,
    info: ArrayInfo,
    blocks: Iterable[np.ndarray],
    name: str,
    after: Callable[[], None] | None = None,
) -> _Record:
    """One tensor as a ``torch.save`` archive at the next aligned offset of ``f``:
    what ``torch.load`` of those bytes returns, bit for bit (``after`` is called
    after each step of its data is written)."""
    f.write(b"\0" * (-f.tell() % _ALIGN))
    record = _RecordWriter(f, after)
    record.add("data.pkl", _tensor_pickle(info))
    record.add(".format_version", b"1")
    record.add(".storage_alignment", str(_ALIGN).encode())
    record.add("byteorder", b"little")
    expected = info.dtype
    checked = (_checked(block, expected, name) for block in blocks)
    crc = record.add_blocks("data/0", info.nbytes, checked, repr(name))
    record.add("version", b"3\n")
    # torch writes 40 random digits; these depend on the data, so a rewrite is identical.
    record.add(".data/serialization_id", f"{crc:020d}{info.nbytes:020d}".encode())
    return record.finish()


def _checked(block: np.ndarray, dtype: str, name: str) -> np.ndarray:
    if block.dtype.name != dtype:
        raise ValueError(f"{name!r}: expected {dtype}, got {block.dtype.name}.")
    return block


# -- the folder ----------------------------------------------------------------------------

_KNOWN = (METADATA_FILE, ALIAS_MAP_FILE, NAMING_FILE)


def holds_only_dcp(path: Path) -> bool:
    """Whether ``path`` is a DCP folder and nothing else: a ``.metadata`` file beside
    only DCP's files (``*.distcp``, ``__N.metadata``) and jaxshare's JSON files, so
    ``--force`` never replaces a directory that holds something more.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> holds_only_dcp(d), (d / ".metadata").touch(), holds_only_dcp(d)
    (False, None, True)
    """
    if not path.is_dir() or path.is_symlink() or not (path / METADATA_FILE).is_file():
        return False
    for child in path.iterdir():
        name = child.name
        dcp_file = name.endswith(DISTCP_SUFFIX) or (
            name.startswith("__") and name.endswith(METADATA_FILE)
        )
        if not child.is_file() or not (name in _KNOWN or dcp_file):
            return False
    return True


#: A DCP folder output, for :func:`jaxshare.io.atomic.atomic_output`.
DCP_FOLDER = OutputKind("a PyTorch DCP folder", True, holds_only_dcp)


@dataclass(frozen=True)
class _Copy:
    """An alias written out as a tensor of its own: its canonical, permuted."""

    name: str
    perm: Perm
    info: ArrayInfo


def _layout(plan: Plan) -> tuple[dict[str, list[str]], dict[str, list[_Copy]]]:
    """``(aliases sharing each entry's record, aliases written out after it)``, checked."""
    stored = {e.name: e for e in plan.entries}
    shared: dict[str, list[str]] = {name: [] for name in stored}
    copies: dict[str, list[_Copy]] = {name: [] for name in stored}
    problems = []
    if len(stored) != len(plan.entries):
        counts = Counter(e.name for e in plan.entries)
        twice = sorted(name for name, n in counts.items() if n > 1)
        problems.append(f"the plan stores {twice[:3]} more than once")
    for canonical, aliases in plan.alias_map.groups().items():
        entry = stored.get(canonical)
        if entry is None:
            problems.append(
                f"alias {aliases[0]!r} names {canonical!r}, which the plan does not store"
            )
            continue
        for alias in aliases:
            if alias in stored:
                problems.append(f"{alias!r} is both stored and an alias of {canonical!r}")
                continue
            perm = plan.alias_map.transform(alias)
            if perm is None:
                shared[canonical].append(alias)
            else:
                info = ArrayInfo(permute_shape(entry.info.shape, perm), entry.info.dtype)
                copies[canonical].append(_Copy(alias, perm, info))
    if problems:
        raise ValueError("cannot write a DCP folder of this plan: " + "; ".join(problems) + ".")
    for entry in plan.entries:
        _check_dtype(entry.info, entry.name)
    return shared, copies


def _entries_with_arrays(
    plan: Plan, source: TensorSource, copies: dict[str, list[_Copy]]
) -> Iterator[tuple[PlanEntry, Iterable[np.ndarray], np.ndarray | None]]:
    """Each entry with its blocks, and its whole array where an alias is written out
    from it: the source's own blocks where it maps them (no copy, no read-ahead),
    else arrays read ahead on a thread (:meth:`Plan.arrays`)."""
    if source.mapped:
        for entry in plan.entries:
            array = plan.array(source, entry) if copies[entry.name] else None
            blocks = plan.blocks(source, entry) if array is None else (array,)
            yield entry, blocks, array
        return
    for entry, array in plan.arrays(source):
        yield entry, (array,), array
        del array  # Before the next is read.


def write_dcp(
    directory: str | os.PathLike,
    plan: Plan,
    source: TensorSource,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
) -> Path:
    """Writes the outputs of ``plan``, read from ``source`` one at a time, as a
    PyTorch Distributed Checkpoint folder that stock ``dcp.load`` reads.

    Each entry of the plan is stored once, in :data:`DCP_DATA_FILE`, as the
    ``torch.save`` archive of that one tensor (its raw little-endian bytes in C
    order, 64-byte aligned). Each alias of ``plan.alias_map`` is a second FQN
    whose storage info names its canonical's bytes (same file, offset and
    length), so ``dcp.load`` fills both names and the tie costs no bytes; an
    alias with a transform (a tie across a layout change) cannot share bytes,
    and is written out as a record of its own, its canonical permuted, right
    after it (the alias map file still records it, so a reader that knows ties
    reports it as written out). Beside the data: :data:`METADATA_FILE`, and
    :data:`ALIAS_MAP_FILE` (``plan.alias_map.to_json()``), with
    :data:`NAMING_FILE` if the plan carries a naming record.

    Memory holds about one tensor (two where an alias is written out from it,
    or a non-mapped source is read ahead). Every file is fsynced, and the
    folder is written at a temporary name and renamed into place when
    complete: a failure leaves nothing at ``directory``.

    Args:
      directory: the folder to write (a ``checkpoint_id`` for ``dcp.load``).
      plan: the outputs: names are the FQNs (PyTorch names, as
        ``module.state_dict()`` has them).
      source: what the plan reads.
      force: replace an existing DCP folder at ``directory``.
      inputs: paths the output is made from; ``directory`` may be none of them.
      progress: called after each record (``done, total, name, nbytes``).

    Returns:
      ``directory``, as a :class:`~pathlib.Path`.

    Raises:
      FileExistsError: ``directory`` exists and ``force`` is false.
      ValueError: a dtype torch has no name for; a plan whose aliases do not
        fit its entries; ``directory`` is an input, or (with ``force``) not a
        DCP folder.

    >>> import tempfile, json
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import ALIAS_MAP_KEY, SafetensorsFile
    >>> d = tempfile.mkdtemp()
    >>> tie = '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"head": "wte"}}'
    >>> save_file({"wte": np.ones((4, 2), np.float32)}, d + "/m.safetensors", {ALIAS_MAP_KEY: tie})
    >>> with SafetensorsFile(d + "/m.safetensors") as source:
    ...     out = write_dcp(d + "/dcp", Plan.identity(source), source)
    >>> sorted(p.name for p in out.iterdir())
    ['.metadata', '__0_0.distcp', 'jaxshare_alias_map.json']
    >>> json.loads((out / "jaxshare_alias_map.json").read_text())["aliases"]
    {'head': 'wte'}
    """
    shared, copies = _layout(plan)
    total = len(plan.entries) + sum(map(len, copies.values()))
    fqns: dict[str, tuple[ArrayInfo, _Record]] = {}
    done = 0
    with atomic_output(directory, DCP_FOLDER, force=force, inputs=inputs) as tmp:
        tmp.mkdir()
        with open(tmp / DCP_DATA_FILE, "wb") as f:
            behind = WriteBehind(f)  # The disk writes each record while the next is read.
            for entry, blocks, array in _entries_with_arrays(plan, source, copies):
                record = _write_record(f, entry.info, blocks, entry.name, behind.wrote)
                fqns[entry.name] = (entry.info, record)
                for alias in shared[entry.name]:
                    fqns[alias] = (entry.info, record)
                done += 1
                if progress is not None:
                    progress(done, total, entry.name, entry.info.nbytes)
                for copy in copies[entry.name]:
                    assert array is not None  # (Read whole for its copies.)
                    permuted = contiguous_transpose(array, copy.perm)
                    record = _write_record(f, copy.info, (permuted,), copy.name, behind.wrote)
                    del permuted
                    fqns[copy.name] = (copy.info, record)
                    done += 1
                    if progress is not None:
                        progress(done, total, copy.name, copy.info.nbytes)
                del array, blocks
            behind.close()
        files = {METADATA_FILE: _metadata_pickle(fqns)}
        files[ALIAS_MAP_FILE] = plan.alias_map.to_json(indent=1).encode()
        if plan.alias_map.naming is not None:
            files[NAMING_FILE] = plan.alias_map.naming.to_json(indent=1).encode()
        for name, data in files.items():
            write_synced(tmp / name, data)
        fsync_dir(tmp)
    return Path(directory)
