"""Flax msgpack files (``flax.serialization.to_bytes`` output), read with numpy only.

``to_bytes(params)`` writes a state dict -- nested dicts with ``str`` keys (lists
and tuples become dicts keyed ``'0'``, ``'1'``, ...) -- as one msgpack map whose
leaves are:

- arrays: msgpack ext type 1, whose payload is itself msgpack of ``(shape, dtype
  name, raw C-order bytes)``; numpy scalars the same as ext type 3, of shape ``()``;
- arrays over ``flax.serialization.MAX_CHUNK_SIZE`` bytes (1 GiB), which msgpack
  cannot hold whole: a map ``{"__msgpack_chunked_array__": True, "shape": {"0": d0,
  ...}, "chunks": {"0": flat array, ...}}``, the flattened array cut into 1-D chunks;
- Python scalars: ints, floats, booleans, strings, bytes, ``None``, and complex
  numbers (ext type 2, a msgpack ``(real, imag)`` pair).

:func:`read_msgpack` walks the file's bytes with a strict parser of exactly this
subset and records, per leaf, its ``'/'``-joined path (as
``flax.traverse_util.flatten_dict(sep='/')`` renders it) and, per array, its
shape, dtype and where its bytes lie in the file, copying none of them.
Everything is checked before any array is read: a known type byte and ext code
everywhere; string keys without ``'/'``, each once per map; maps nested at most
:data:`MAX_DEPTH` deep; a dtype from :data:`DTYPES` (plain numbers: never object,
void or structured dtypes) and a shape of at most 64 sizes whose product times
the item size is the byte count; every length inside the file and the file
consumed exactly. A length the file claims is trusted only once its bytes are
there, and what the parser records stays within the file's size plus
:data:`MAX_RECORDS_BYTES`, so a hostile file can neither make it allocate nor
recurse without bound.

:class:`MsgpackFile` maps the file and gives each array as a read-only numpy
view of its pages (bfloat16 and float8 included): memory holds no copy. A
Hugging Face Flax checkpoint sharded into ``flax_model-0000k-of-0000N.msgpack``
files, listed in ``flax_model.msgpack.index.json``, is a directory layout
(:func:`jaxshare.formats.hf_weights`) whose shards are each such a file.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.core.dtype import itemsize, numpy_dtype
from jaxshare.core.report import ArrayInfo
from jaxshare.io.mapped import map_file
from jaxshare.io.source import Index, TensorSource, file_part

__all__ = [
    "DTYPES",
    "MAX_DEPTH",
    "MAX_RECORDS_BYTES",
    "MsgpackContents",
    "MsgpackEntry",
    "MsgpackFile",
    "read_msgpack",
]

#: The dtypes an array may have: plain numbers, as ``ndarray.dtype.name`` writes them.
DTYPES = frozenset(
    {
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2",
        "complex64", "complex128",
    }
)  # fmt: skip
#: Maps nested deeper than this are refused (a Flax tree is a few levels deep).
MAX_DEPTH = 64
#: What the records of a file's leaves (paths, strings) may take beyond the file's size.
MAX_RECORDS_BYTES = 16 * 2**20

#: numpy's limit on the number of axes.
_MAX_NDIM = 64
#: Bytes of Python objects a leaf's record takes besides its path, and a string
#: besides its characters, about.
_LEAF_COST, _STR_COST = 128, 64
_CHUNKED = "__msgpack_chunked_array__"
#: What joins a path's keys (``jaxshare.core.paths.SEP``, whose module imports JAX when
#: used, which the formats may not).
SEP = "/"
#: A path inside the parser: the keys from the top level down.
_Keys = tuple[str, ...]
#: flax's ext type codes (``flax.serialization._MsgpackExtType``).
_NDARRAY, _COMPLEX, _NPSCALAR = 1, 2, 3

# msgpack type bytes beyond the fixed ranges -> (kind, value) or (kind, struct format).
_CONSTANTS: dict[int, tuple[str, Any]] = {
    0xC0: ("nil", None), 0xC2: ("bool", False), 0xC3: ("bool", True),
}  # fmt: skip
_NUMBERS = {
    0xCA: ("float", ">f"), 0xCB: ("float", ">d"),
    0xCC: ("int", ">B"), 0xCD: ("int", ">H"), 0xCE: ("int", ">I"), 0xCF: ("int", ">Q"),
    0xD0: ("int", ">b"), 0xD1: ("int", ">h"), 0xD2: ("int", ">i"), 0xD3: ("int", ">q"),
}  # fmt: skip
_LENGTHS = {
    0xC4: ("bin", ">B"), 0xC5: ("bin", ">H"), 0xC6: ("bin", ">I"),
    0xC7: ("ext", ">B"), 0xC8: ("ext", ">H"), 0xC9: ("ext", ">I"),
    0xD9: ("str", ">B"), 0xDA: ("str", ">H"), 0xDB: ("str", ">I"),
    0xDC: ("array", ">H"), 0xDD: ("array", ">I"), 0xDE: ("map", ">H"), 0xDF: ("map", ">I"),
}  # fmt: skip
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_KINDS = {
    "nil": "nil", "bool": "a boolean", "int": "an integer", "float": "a float",
    "str": "a string", "bin": "bytes", "ext": "an ext value", "array": "a msgpack array",
    "map": "a map",
}  # fmt: skip


@dataclass(frozen=True)
class MsgpackEntry(ArrayInfo):
    """One array of a file: its shape, dtype name and the ``(begin, end)`` byte
    ranges of its data in the file, one per chunk (one for an array stored whole).

    Attributes:
      chunked: whether flax cut it into chunks (``__msgpack_chunked_array__``).
    """

    ranges: tuple[tuple[int, int], ...]
    chunked: bool = False


@dataclass(frozen=True)
class MsgpackContents:
    """What a checked file holds, in the file's order.

    Attributes:
      path: the file.
      arrays: ``{path: MsgpackEntry}`` of its arrays (numpy scalars as 0-d arrays).
      scalars: ``{path: value}`` of its leaves that are no arrays (ints, floats,
        booleans, strings, bytes, ``None``, complex numbers).
      leaves: every leaf's path, arrays and scalars together.
    """

    path: Path
    arrays: dict[str, MsgpackEntry]
    scalars: dict[str, Any]
    leaves: tuple[str, ...]


class _Parser:
    """A cursor over a file's bytes that never reads past ``end``: the file's end, or
    the end of the ext payload being read. Every refusal names the byte it is at."""

    def __init__(self, path: Path, data: np.ndarray) -> None:
        self.path = path
        self.data = data.data  # (a memoryview: the file's bytes, not a copy)
        self.pos = 0
        self.end = self.size = len(data)
        self.inside = False  # within an ext payload, which ends at `end`
        self.budget = self.size + MAX_RECORDS_BYTES
        self.arrays: dict[str, MsgpackEntry] = {}
        self.scalars: dict[str, Any] = {}
        self.leaves: list[str] = []

    def bad(self, why: str, at: int | None = None) -> ValueError:
        at = self.pos if at is None else at
        return ValueError(
            f"{self.path}: not a Flax msgpack file jaxshare can read: {why} (at byte {at})."
        )

    # -- msgpack values ------------------------------------------------------------------

    def take(self, n: int, what: object) -> int:
        """Steps over ``n`` bytes of ``what``; returns where they start."""
        start = self.pos
        if n > self.end - start:
            where = (
                f"the file ends {_bytes(self.size - start)} later: it is truncated"
                if not self.inside
                else f"the ext payload it is in ends {_bytes(self.end - start)} later"
            )
            raise self.bad(f"{what} needs {_bytes(n)}, but {where}", start)
        self.pos = start + n
        return start

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def head(self) -> tuple[str, Any]:
        """Reads one value's type byte and what follows it up to its payload:
        ``(kind, value)`` for a scalar, ``(kind, count)`` for a map, array, string
        or bytes (whose payload follows), ``("ext", (code, length))``."""
        at = self.take(1, "a msgpack value")
        b = self.data[at]
        if b <= 0x7F:
            return "int", b
        if b >= 0xE0:
            return "int", b - 0x100
        if b <= 0x8F:
            return "map", b & 0x0F
        if b <= 0x9F:
            return "array", b & 0x0F
        if b <= 0xBF:
            return "str", b & 0x1F
        if b in _CONSTANTS:
            return _CONSTANTS[b]
        if b in _NUMBERS:
            kind, fmt = _NUMBERS[b]
            return kind, self.unpack(fmt, _KINDS[kind])
        if b in _LENGTHS:
            kind, fmt = _LENGTHS[b]
            n = self.unpack(fmt, f"the length of {_KINDS[kind]}")
            return kind, ((self.unpack(">b", "an ext type code"), n) if kind == "ext" else n)
        if b in _FIXEXT:
            return "ext", (self.unpack(">b", "an ext type code"), _FIXEXT[b])
        raise self.bad(f"0x{b:02x} is no msgpack type byte", at)

    def text(self, n: int, what: object) -> str:
        at = self.take(n, what)
        self.spend(n + _STR_COST)  # (Before it is decoded.)
        try:
            return bytes(self.data[at : at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{what} is not UTF-8", at) from None

    def spend(self, n: int) -> None:
        """Counts ``n`` bytes of what the parser keeps against its budget."""
        self.budget -= n
        if self.budget < 0:
            raise self.bad(
                f"its keys, strings and paths would take more than "
                f"{self.size + MAX_RECORDS_BYTES} bytes to record (its size plus "
                "MAX_RECORDS_BYTES)"
            )

    # -- the tree ------------------------------------------------------------------------

    def parse(self) -> MsgpackContents:
        if self.size == 0:
            raise self.bad("the file is empty", 0)
        kind, n = self.head()
        if kind != "map":
            raise self.bad(
                f"the top level is {_KINDS[kind]}, not a map of arrays (flax.serialization."
                "to_bytes of a dict)",
                0,
            )
        self.tree((), n)
        if self.pos != self.size:
            raise self.bad(
                f"the top-level map ends {_bytes(self.size - self.pos)} before the file does"
            )
        return MsgpackContents(self.path, self.arrays, self.scalars, tuple(self.leaves))

    def key(self, path: _Keys) -> str:
        at = self.pos
        kind, n = self.head()
        what = _About("a key of the map at {}", path)
        if kind != "str":
            raise self.bad(f"{what} is {_KINDS[kind]}, not a string", at)
        key = self.text(n, what)
        if SEP in key:
            raise self.bad(
                f"the key {key!r} in the map at {_where(path)} contains {SEP!r}, which joins "
                "the keys of a path",
                at,
            )
        return key

    def tree(self, path: _Keys, n: int) -> None:
        """The ``n`` entries of the map at ``path`` (its head read)."""
        if len(path) >= MAX_DEPTH:
            raise self.bad(f"maps nested deeper than {MAX_DEPTH} levels, at {_where(path)}")
        seen: set[str] = set()
        for _ in range(n):
            at = self.pos
            key = self.key(path)
            if key in seen:
                raise self.bad(f"the map at {_where(path)} has the key {key!r} twice", at)
            if key == _CHUNKED:
                raise self.bad(
                    f"the key {_CHUNKED!r} in the map at {_where(path)}, where no chunked "
                    "array can be (flax writes it first in a chunked array's map)",
                    at,
                )
            seen.add(key)
            self.value((*path, key))

    def value(self, path: _Keys) -> None:
        at = self.pos
        kind, value = self.head()
        if kind == "map":
            if value and self.first_key(path) == _CHUNKED:
                self.chunked(path, value, at)
            else:
                self.tree(path, value)
        elif kind == "ext":
            code, n = value
            if code == _COMPLEX:
                self.scalar(path, self.complex(path, n))
            elif code in (_NDARRAY, _NPSCALAR):
                entry = self.array(path, n)
                if code == _NPSCALAR and entry.shape != ():
                    raise self.bad(f"the numpy scalar {_where(path)} has shape {entry.shape}", at)
                self.leaf(path, entry)
            else:
                raise self.bad(
                    f"{_where(path)} is of msgpack ext type {code}, which flax does not "
                    "write (1: arrays, 2: complex numbers, 3: numpy scalars)",
                    at,
                )
        elif kind == "array":
            raise self.bad(
                f"{_where(path)} is a msgpack array; flax writes lists and tuples as maps "
                "keyed '0', '1', ...",
                at,
            )
        elif kind == "str":
            self.scalar(path, self.text(value, _About("the string {}", path)))
        elif kind == "bin":
            start = self.take(value, _About("the bytes {}", path))
            self.spend(value)
            self.scalar(path, bytes(self.data[start : start + value]))
        else:
            self.scalar(path, value)

    def first_key(self, path: _Keys) -> str:
        """The next key, read again after (and counted once)."""
        pos, budget = self.pos, self.budget
        key = self.key(path)
        self.pos, self.budget = pos, budget
        return key

    def record(self, path: _Keys) -> str:
        self.spend(sum(map(len, path)) + len(path) + _LEAF_COST)  # (Before rendering it.)
        name = SEP.join(path)
        self.leaves.append(name)
        return name

    def leaf(self, path: _Keys, entry: MsgpackEntry) -> None:
        self.arrays[self.record(path)] = entry

    def scalar(self, path: _Keys, value: Any) -> None:
        self.scalars[self.record(path)] = value

    # -- arrays and complex numbers ------------------------------------------------------

    def payload(self, n: int, what: object) -> int:
        """Steps into an ext payload of ``n`` bytes; returns where the outer value
        ends (the caller leaves the payload with :meth:`leave`)."""
        start = self.take(n, what)
        outer, self.end, self.pos, self.inside = self.end, start + n, start, True
        return outer

    def leave(self, outer: int, what: object) -> None:
        if self.pos != self.end:
            raise self.bad(f"{what} ends {_bytes(self.end - self.pos)} before its ext payload")
        self.end, self.inside = outer, False

    def complex(self, path: _Keys, n: int) -> complex:
        what = _About("the complex number {}", path)
        outer = self.payload(n, what)
        kind, count = self.head()
        parts = [self.head() for _ in range(count)] if kind == "array" and count == 2 else []
        if not parts or any(k not in ("float", "int") for k, _ in parts):
            raise self.bad(f"{what} is not a msgpack (real, imag) pair")
        self.leave(outer, what)
        return complex(parts[0][1], parts[1][1])

    def array(self, path: _Keys, n: int) -> MsgpackEntry:
        """An ndarray's ext payload of ``n`` bytes: msgpack ``(shape, dtype, bytes)``."""
        outer = self.payload(n, _About("the array {}", path))
        at = self.pos
        kind, count = self.head()
        if kind != "array" or count != 3:
            raise self.bad(f"the array {_where(path)} is not msgpack (shape, dtype, bytes)", at)
        shape = self.sizes(path, "array")
        at = self.pos
        kind, count = self.head()
        if kind != "str":
            raise self.bad(f"the dtype of {_where(path)} is {_KINDS[kind]}, not a name", at)
        dtype = self.text(count, _About("the dtype of {}", path))
        if dtype not in DTYPES:
            raise self.bad(
                f"{_where(path)} has dtype {dtype!r}, not one of the plain numeric dtypes "
                f"jaxshare reads ({', '.join(sorted(DTYPES))})",
                at,
            )
        at = self.pos
        kind, size = self.head()
        if kind != "bin":
            raise self.bad(f"the data of {_where(path)} is {_KINDS[kind]}, not bytes", at)
        nbytes = math.prod(shape) * itemsize(dtype)
        if size != nbytes:
            raise self.bad(
                f"{_where(path)} ({dtype}{list(shape)}) needs {nbytes} bytes, but its data "
                f"holds {size}",
                at,
            )
        data = _About("the data of {}", path)
        begin = self.take(size, data)
        self.leave(outer, data)
        return MsgpackEntry(shape, dtype, ((begin, begin + size),))

    def sizes(self, path: _Keys, kind: str) -> tuple[int, ...]:
        """A shape: a msgpack array of sizes (``kind="array"``), or the map
        ``{"0": d0, ...}`` of a chunked array (``kind="map"``)."""
        at = self.pos
        found, ndim = self.head()
        if found != kind:
            raise self.bad(
                f"the shape of {_where(path)} is {_KINDS[found]}, not {_KINDS[kind]}", at
            )
        if ndim > _MAX_NDIM:
            raise self.bad(
                f"the shape of {_where(path)} has {ndim} axes, over numpy's {_MAX_NDIM}", at
            )
        shape = []
        for i in range(ndim):
            if kind == "map":
                self.expect(path, str(i), "shape")
            at = self.pos
            found, size = self.head()
            if found != "int" or size < 0:
                raise self.bad(
                    f"the shape of {_where(path)} holds {_KINDS[found]} {size!r}, no size", at
                )
            shape.append(size)
        return tuple(shape)

    def expect(self, path: _Keys, key: str, what: str) -> None:
        at = self.pos
        found = self.key(path)
        if found != key:
            raise self.bad(
                f"the {what} of the chunked array {_where(path)} has the key {found!r} where "
                f"flax writes {key!r}",
                at,
            )

    def chunked(self, path: _Keys, n: int, at: int) -> None:
        """A chunked array's map of ``n`` entries (its head read): the marker,
        ``shape`` and ``chunks``, in the order flax writes them."""
        if n != 3:
            raise self.bad(
                f"the chunked array {_where(path)} has {n} entries, not {_CHUNKED!r}, 'shape' "
                "and 'chunks'",
                at,
            )
        self.key(path)  # (The marker, already seen.)
        marker_at = self.pos
        if self.head() != ("bool", True):
            raise self.bad(
                f"the chunked array {_where(path)} has a marker that is not true", marker_at
            )
        self.expect(path, "shape", "map")
        shape = self.sizes(path, "map")
        self.expect(path, "chunks", "map")
        chunks_at = self.pos
        kind, count = self.head()
        if kind != "map" or count == 0:
            raise self.bad(
                f"the chunks of {_where(path)} are not a map of one or more arrays", chunks_at
            )
        ranges: list[tuple[int, int]] = []
        dtype = None
        for i in range(count):
            self.expect(path, str(i), "chunks")
            chunk_at = self.pos
            kind, value = self.head()
            if kind != "ext" or value[0] != _NDARRAY:
                raise self.bad(
                    f"chunk {i} of {_where(path)} is {_KINDS[kind]}, not an array", chunk_at
                )
            chunk = self.array((*path, str(i)), value[1])
            if len(chunk.shape) != 1 or dtype not in (None, chunk.dtype):
                raise self.bad(
                    f"chunk {i} of {_where(path)} is {chunk.dtype}{list(chunk.shape)}, not a "
                    f"flat run of {dtype or 'its'} elements",
                    chunk_at,
                )
            dtype = chunk.dtype
            self.spend(_LEAF_COST)
            ranges.extend(chunk.ranges)
        assert dtype is not None
        elements = sum(end - begin for begin, end in ranges) // itemsize(dtype)
        if elements != math.prod(shape):
            raise self.bad(
                f"the chunks of {_where(path)} hold {elements} elements, but its shape "
                f"{list(shape)} needs {math.prod(shape)}",
                chunks_at,
            )
        self.leaf(path, MsgpackEntry(shape, dtype, tuple(ranges), chunked=True))


@dataclass(frozen=True, slots=True)
class _About:
    """What a message is about, naming a path: rendered only when a message is made
    (a path may be long, and most values are never refused)."""

    template: str
    path: _Keys

    def __str__(self) -> str:
        return self.template.format(_where(self.path))


def _bytes(n: int) -> str:
    return f"{n} byte" if n == 1 else f"{n} bytes"


def _where(path: _Keys) -> str:
    """A path in a message: quoted, or "the top level"."""
    return repr(SEP.join(path)) if path else "the top level"


def _read(path: Path) -> tuple[MsgpackContents, np.ndarray]:
    """The checked contents of the file ``path``, and its map."""
    if path.is_dir():
        raise ValueError(f"{path}: not a Flax msgpack file jaxshare can read: it is a directory.")
    data = map_file(path)
    return _Parser(path, data).parse(), data


def read_msgpack(path: str | os.PathLike) -> MsgpackContents:
    """Reads and checks a Flax msgpack file, reading no array's data.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the first problem found, in one line: ``PATH: not a Flax msgpack
        file jaxshare can read: WHY (at byte N).``

    >>> import tempfile
    >>> from flax.serialization import to_bytes
    >>> path = Path(tempfile.mkdtemp()) / "flax_model.msgpack"
    >>> _ = path.write_bytes(to_bytes({"dense": {"kernel": np.zeros((2, 3), np.float32)},
    ...                                "step": 3}))
    >>> contents = read_msgpack(path)
    >>> contents.arrays["dense/kernel"].info, contents.scalars
    (ArrayInfo(shape=(2, 3), dtype='float32'), {'step': 3})
    """
    return _read(Path(path))[0]


class MsgpackFile(TensorSource):
    """A Flax msgpack file mapped into memory: a :class:`TensorSource` whose arrays
    are read-only numpy views of the file's pages.

    The file is checked whole before any array is read (:func:`read_msgpack`).
    Names are the arrays' ``'/'``-joined Flax paths, in the file's order; the
    leaves that are no arrays are :attr:`scalars`. msgpack records no ties, so
    there are none. A chunked array's :meth:`blocks` are its chunks, each a view;
    :meth:`array` joins them (the one copy this reader makes).

    Attributes:
      contents: what the file holds (:class:`MsgpackContents`).
      scalars: ``{path: value}`` of the leaves that are no arrays.

    >>> import tempfile
    >>> from flax.serialization import to_bytes
    >>> path = Path(tempfile.mkdtemp()) / "flax_model.msgpack"
    >>> w = np.arange(6, dtype=np.int32).reshape(2, 3)
    >>> _ = path.write_bytes(to_bytes({"params": {"w": w}}))
    >>> with MsgpackFile(path) as f:
    ...     f.kind, list(f.infos), f.array("params/w")[1].tolist()
    ('msgpack', ['params/w'], [3, 4, 5])
    """

    mapped = True  # blocks are views of the mapped file
    kind = "msgpack"

    def __init__(self, path: str | os.PathLike, /) -> None:
        self.path = Path(path)
        self.contents, data = _read(self.path)
        self.infos = {name: e.info for name, e in self.contents.arrays.items()}
        self.scalars = self.contents.scalars
        self.parts = (file_part(self.path, len(self.infos)),)
        self._map: np.ndarray | None = data

    def _entry(self, name: str) -> MsgpackEntry:
        try:
            return self.contents.arrays[name]
        except KeyError:
            raise KeyError(f"{self.path}: no array named {name!r}.") from None

    def _views(self, entry: MsgpackEntry) -> list[np.ndarray]:
        if self._map is None:
            raise ValueError(f"{self.path}: the file is closed.")
        dtype = numpy_dtype(entry.dtype)
        return [self._map[begin:end].view(dtype) for begin, end in entry.ranges]

    def read(self, name: str) -> np.ndarray:
        """The array ``name`` (see :meth:`array`)."""
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        """The array ``name``, read-only: a view of the file's pages, or for a
        chunked array of several chunks, its chunks joined."""
        entry = self._entry(name)
        views = self._views(entry)
        if len(views) == 1:
            return views[0].reshape(entry.shape)
        joined = np.concatenate(views).reshape(entry.shape)
        joined.flags.writeable = False  # (As every array of the file.)
        return joined

    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """The array ``name`` in C order: the whole array, or a chunked array's
        chunks, each a view of the file's pages."""
        entry = self._entry(name)
        if not entry.chunked:
            yield self.array(name)
            return
        yield from self._views(entry)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]``, copied out of the pages it covers (of a chunked
        array, out of the chunks under the rows it selects)."""
        entry = self._entry(name)
        if len(entry.ranges) == 1 or not entry.shape:
            return np.array(self.array(name)[index])
        return _chunked_slice(self._views(entry), entry.shape, index)

    def close(self) -> None:
        """Drops this source's map of the file; arrays already returned stay valid."""
        self._map = None


def _chunked_slice(
    chunks: Sequence[np.ndarray], shape: tuple[int, ...], index: Index
) -> np.ndarray:
    """``array[index]`` of the array whose flattened elements are ``chunks`` end to
    end, joining only the chunks under the rows of axis 0 it selects."""
    rows = range(*index[0].indices(shape[0])) if index else range(shape[0])
    low, high = (min(rows), max(rows) + 1) if rows else (0, 0)
    row = math.prod(shape[1:])
    block = _flat_range(chunks, low * row, high * row).reshape(high - low, *shape[1:])
    local = slice(rows[0] - low, None, rows.step) if rows else slice(0, 0)
    return np.array(block[(local, *index[1:])])


def _flat_range(chunks: Sequence[np.ndarray], begin: int, end: int) -> np.ndarray:
    """Elements ``begin:end`` of ``chunks`` end to end: a view where one chunk holds them."""
    pieces, offset = [], 0
    for chunk in chunks:
        lo, hi = max(begin - offset, 0), min(end - offset, chunk.size)
        if lo < hi:
            pieces.append(chunk[lo:hi])
        offset += chunk.size
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate(pieces) if pieces else chunks[0][:0]
