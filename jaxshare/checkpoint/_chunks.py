"""An item's arrays read from their stored chunks directly: where each chunk lies,
and its bytes decoded into place.

TensorStore reads a chunk into its own buffer (from the page cache: one copy),
decodes it into another, then copies that into the array asked for, all on its
threads; a transposed read then copies the array once more. Here the chunks of
an array stored in the formats Orbax writes -- zarr v2, or zarr v3 with or
without ``sharding_indexed``; raw or zstd; little-endian; no filters -- are read
from the item's files themselves:

- :class:`ChunkStore` finds where each stored value lies: for an OCDBT item
  (Orbax's default) from its B+tree, which TensorStore's ``ocdbt.dump`` decodes
  (every key, its data file, offset and length, read once); otherwise each
  chunk is a file of its own.
- :class:`DirectArray` fills an array (or a region of it, or its transpose)
  chunk by chunk on a few threads: a raw chunk is copied from the mapped data
  file, once; a zstd chunk is decoded straight into the array where its bytes
  are contiguous there, else into a chunk-sized buffer and copied; a transposed
  read transposes each chunk into its place (:func:`contiguous_transpose`), so
  the array is never made first and transposed after.

Anything else (another codec, a big-endian dtype, a step in an index) is read by
TensorStore, as before: :meth:`DirectArray.of` says ``None``.
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from jaxshare.checkpoint._ocdbt import crc32c
from jaxshare.core.perm import Perm, inverse, permute_shape
from jaxshare.io.buffers import empty_array
from jaxshare.io.mapped import map_file, read_direct
from jaxshare.io.threads import parallel_map
from jaxshare.io.transpose import contiguous_transpose

__all__ = ["Chunk", "ChunkStore", "DirectArray", "Chunking"]

#: The size of a shard index entry: offset and length, both ``uint64le``.
_SHARD_ENTRY = 16
_MISSING = 2**64 - 1
#: The largest zarr metadata document read.
_MAX_METADATA_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Chunk:
    """A stored value: ``length`` bytes at ``offset`` of ``file``, or of ``inline``
    bytes (a value small enough to live in OCDBT's B+tree)."""

    file: Path | None
    offset: int
    length: int
    inline: bytes | None = None


class ChunkStore:
    """The stored values of an item's arrays, by key (``"params.w/0.0"``), and their
    bytes as read-only views of the mapped files.

    An OCDBT item's B+tree is read once, on first use, through
    ``tensorstore.ocdbt.dump``; other items keep each value in a file named by
    its key.
    """

    def __init__(self, item_dir: str | os.PathLike, *, use_ocdbt: bool) -> None:
        self.directory = Path(item_dir)
        self._ocdbt = use_ocdbt
        self._index: dict[str, Chunk] | None = None
        self._maps: dict[Path, np.ndarray] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Chunk | None:
        """Where the value of ``key`` lies; ``None`` if it is not stored."""
        if not self._ocdbt:
            path = _inside(self.directory, key)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return None
            return Chunk(path, 0, size)
        if self._index is None:
            self._index = _ocdbt_index(self.directory)
        return self._index.get(key)

    def data(self, chunk: Chunk) -> np.ndarray:
        """The bytes of ``chunk`` as a read-only ``uint8`` array: a view of its
        mapped file (reading it copies nothing until it is used, and a writer
        can copy it file to file, :func:`jaxshare.io.mapped.copy_view`)."""
        if chunk.inline is not None:
            return np.frombuffer(chunk.inline, np.uint8)[chunk.offset :][: chunk.length]
        assert chunk.file is not None
        with self._lock:
            mapped = self._maps.get(chunk.file)
            if mapped is None:
                mapped = self._maps[chunk.file] = map_file(chunk.file)
        view = mapped[chunk.offset : chunk.offset + chunk.length]
        if len(view) != chunk.length:
            raise ValueError(self._short(chunk, len(mapped)))
        return view

    def let_go(self, chunk: Chunk) -> None:
        """Unmaps the pages of ``chunk`` read through :meth:`data` from this
        process (``MADV_DONTNEED``; the page cache keeps them), so a conversion's
        resident memory does not grow by every page of the item it decodes. A
        view of them still in use reads them in again."""
        if chunk.file is None:
            return
        with self._lock:
            mapped = self._maps.get(chunk.file)
        if mapped is None or not isinstance(mapped.base, memoryview):
            return
        start = chunk.offset - chunk.offset % mmap.PAGESIZE
        stop = min(chunk.offset + chunk.length, len(mapped))
        if stop > start:
            mapped.base.obj.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def read_into(self, chunk: Chunk, target: np.ndarray) -> None:
        """Reads the bytes of ``chunk`` into ``target`` (``uint8``, its length), with
        large reads of the file (no page of it mapped)."""
        if chunk.inline is not None:  # (Its offset is within the inline bytes.)
            target[:] = np.frombuffer(chunk.inline, np.uint8)[chunk.offset :][: len(target)]
            return
        assert chunk.file is not None
        fd = os.open(chunk.file, os.O_RDONLY)
        try:
            view, done = target.data.cast("B"), 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], chunk.offset + done)
                if n == 0:
                    raise ValueError(self._short(chunk, chunk.offset + done))
                done += n
        finally:
            os.close(fd)

    def _short(self, chunk: Chunk, size: int) -> str:
        return (
            f"{chunk.file}: the item's index places {chunk.length} bytes at offset "
            f"{chunk.offset}, but the file ends at {size}. The item is damaged or was cut "
            "short."
        )

    def read_json(self, key: str) -> dict[str, Any] | None:
        """The JSON object stored at ``key`` (an array's zarr metadata), ``None``
        if absent or not a JSON object of at most a few MiB."""
        chunk = self.get(key)
        if chunk is None or chunk.length > _MAX_METADATA_BYTES:
            return None
        try:
            value = json.loads(bytes(self.data(chunk)))
        except ValueError:  # (Not metadata read here: TensorStore says what is wrong.)
            return None
        return value if isinstance(value, dict) else None

    def close(self) -> None:
        """Lets go of the mapped files (views handed out keep their maps)."""
        with self._lock:
            self._maps.clear()


def _ocdbt_index(directory: Path) -> dict[str, Chunk]:
    """Every key of the OCDBT database at ``directory`` and where its value lies,
    from the latest version's B+tree (interior nodes followed down: a child's
    keys follow its entry's ``subtree_common_prefix``, its data file paths the
    base path of the file it lies in)."""
    import tensorstore as ts

    base = ts.KvStore.open({"driver": "file", "path": os.fspath(directory) + "/"}).result()
    versions = ts.ocdbt.dump(base).result().get("versions") or []
    index: dict[str, Chunk] = {}
    root = versions[-1].get("root", {}) if versions else {}
    if "location" not in root:
        return index  # An empty database.
    _, base_path, relative, offset, length = _split_location(root["location"])
    # (node, the transitive path of the files it names, the prefix of its keys)
    pending = [(f"btreenode::{base_path}{relative}:{offset}:{length}", base_path, b"")]
    while pending:
        location, transitive, prefix = pending.pop()
        node = ts.ocdbt.dump(base, location).result()
        for entry in node.get("entries", ()):
            key = prefix + bytes(entry["key"])
            if "inline_value" in entry:
                value = bytes(entry["inline_value"])
                index[key.decode()] = Chunk(None, 0, len(value), value)
            elif "indirect_value" in entry:
                _, base_path, relative, offset, length = _split_location(entry["indirect_value"])
                path = _inside(directory, transitive + base_path + relative)
                index[key.decode()] = Chunk(path, offset, length)
            else:  # A child node.
                _, base_path, relative, offset, length = _split_location(entry["location"])
                child = f"btreenode::{transitive}{base_path}{relative}:{offset}:{length}"
                common = bytes(entry.get("subtree_common_prefix", b""))
                pending.append((child, transitive + base_path, prefix + common))
    return index


def _inside(directory: Path, relative: str) -> Path:
    """``directory / relative``, refused where ``relative`` would leave it.

    Raises:
      ValueError: an absolute path, or one with a ``..`` part.

    >>> _inside(Path("/ckpt"), "d/ab12")
    PosixPath('/ckpt/d/ab12')
    >>> _inside(Path("/ckpt"), "d/../../etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: /ckpt: the item names a file outside it, 'd/../../etc/passwd'; ...
    """
    parts = relative.split("/")
    if relative.startswith("/") or ".." in parts or "\\" in relative:
        raise ValueError(
            f"{directory}: the item names a file outside it, {relative!r}; the item is "
            "damaged or not one Orbax wrote."
        )
    return directory / relative


def _split_location(location: str) -> tuple[str, str, str, int, int]:
    """The kind, base path, relative path, offset and length of a location as
    ``tensorstore.ocdbt.dump`` gives it, ``"<kind>:<base>:<relative>:<offset>:<length>"``.

    >>> _split_location("value:ocdbt.process_0/:d/ab12:0:64")
    ('value', 'ocdbt.process_0/', 'd/ab12', 0, 64)
    """
    kind, rest = location.split(":", 1)
    rest, offset, length = rest.rsplit(":", 2)
    base, relative = rest.split(":", 1)
    return kind, base, relative, int(offset), int(length)


@dataclass(frozen=True)
class Chunking:
    """How an array's chunks are stored: what :class:`DirectArray` decodes.

    Attributes:
      shape: the array's shape.
      dtype: its stored dtype (little-endian, or one byte wide).
      chunks: the shape of a (read) chunk; edge chunks are stored whole.
      zstd: the chunks are zstd frames (else raw bytes in C order).
      key: the key of the stored value of a chunk (or of its shard), by grid index.
      shard: for zarr v3 ``sharding_indexed``: the shape of a shard (in chunks of
        ``chunks``) and whether its index is at the end; ``None`` otherwise.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    zstd: bool
    key: Callable[[tuple[int, ...]], str]
    shard: tuple[tuple[int, ...], bool] | None = None

    @classmethod
    def of(cls, name: str, meta: dict[str, Any]) -> Chunking | None:
        """The chunking of the array stored as ``name`` with zarr metadata ``meta``;
        ``None`` where it is not one this module decodes."""
        try:
            if meta.get("zarr_format") == 2:
                return cls._zarr2(name, meta)
            if meta.get("zarr_format") == 3 and meta.get("node_type", "array") == "array":
                return cls._zarr3(name, meta)
        except (KeyError, TypeError, ValueError):
            return None
        return None

    @classmethod
    def _zarr2(cls, name: str, meta: dict[str, Any]) -> Chunking | None:
        compressor = meta.get("compressor")
        if meta.get("filters") is not None or meta.get("order", "C") != "C":
            return None
        if compressor is not None and compressor.get("id") != "zstd":
            return None
        dtype = _dtype(meta.get("dtype"))
        if dtype is None:
            return None
        shape = tuple(int(n) for n in meta["shape"])
        chunks = tuple(int(n) for n in meta["chunks"])
        if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
            return None
        separator = meta.get("dimension_separator", ".")
        if not shape:
            return cls(shape, dtype, chunks, compressor is not None, lambda g: f"{name}/0")
        return cls(
            shape,
            dtype,
            chunks,
            compressor is not None,
            lambda g: f"{name}/" + separator.join(map(str, g)),
        )

    @classmethod
    def _zarr3(cls, name: str, meta: dict[str, Any]) -> Chunking | None:
        dtype = _dtype3(meta.get("data_type"))
        if dtype is None:
            return None
        shape = tuple(int(n) for n in meta["shape"])
        grid = meta.get("chunk_grid", {})
        if grid.get("name") != "regular":
            return None
        outer = tuple(int(n) for n in grid["configuration"]["chunk_shape"])
        codecs = meta.get("codecs", [])
        shard: tuple[tuple[int, ...], bool] | None = None
        chunks = outer
        if len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
            config = codecs[0].get("configuration", {})
            chunks = tuple(int(n) for n in config["chunk_shape"])
            if len(chunks) != len(outer) or any(
                c <= 0 or o % c for c, o in zip(chunks, outer, strict=True)
            ):
                return None
            index_codecs = config.get("index_codecs", [])
            # (The checksummed index Orbax writes; others go to TensorStore.)
            if [c.get("name") for c in index_codecs] != ["bytes", "crc32c"] or (
                index_codecs[0].get("configuration", {}).get("endian", "little") != "little"
            ):
                return None
            location = config.get("index_location", "end")
            if location not in ("end", "start"):
                return None
            shard = (tuple(o // c for o, c in zip(outer, chunks, strict=True)), location == "end")
            codecs = config.get("codecs", [])
        names = [c.get("name") for c in codecs]
        if names not in (["bytes"], ["bytes", "zstd"]):
            return None
        if codecs[0].get("configuration", {}).get("endian", "little") != "little" and (
            dtype.itemsize > 1
        ):
            return None
        if len(outer) != len(shape):
            return None
        encoding = meta.get("chunk_key_encoding", {"name": "default"})
        kind = encoding.get("name", "default")
        separator = encoding.get("configuration", {}).get(
            "separator", "/" if kind == "default" else "."
        )
        if kind == "default":

            def key(g: tuple[int, ...]) -> str:
                return f"{name}/" + separator.join(["c", *map(str, g)])

        elif kind == "v2":

            def key(g: tuple[int, ...]) -> str:
                return f"{name}/" + (separator.join(map(str, g)) if g else "0")

        else:
            return None
        return cls(shape, dtype, chunks, names[-1] == "zstd", key, shard)

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * self.dtype.itemsize


def _dtype(code: Any) -> np.dtype | None:
    """A zarr v2 dtype string as numpy's, if it is one read here."""
    if code == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if not isinstance(code, str) or code[:1] not in ("<", "|"):
        return None
    try:
        dtype = np.dtype(code)
    except TypeError:
        return None
    return dtype if dtype.kind in "biufc" else None


_ZARR3_DTYPES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128",
}  # fmt: skip


def _dtype3(code: Any) -> np.dtype | None:
    """A zarr v3 data type as numpy's, if it is one read here."""
    if code == "bfloat16":
        return _dtype("bfloat16")
    name = _ZARR3_DTYPES.get(code) if isinstance(code, str) else None
    return None if name is None else np.dtype(name).newbyteorder("<")


class DirectArray:
    """One stored array, read from its chunks (see the module's docstring).

    Args:
      store: the item's stored values.
      name: the array's Orbax name (the key prefix of its chunks).
      chunking: how its chunks are stored.
    """

    def __init__(self, store: ChunkStore, name: str, chunking: Chunking) -> None:
        self.store, self.name, self.chunking = store, name, chunking
        self._shards: dict[str, tuple[Chunk, bytes]] = {}  # key: (where, its index)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, store: ChunkStore, name: str, *, zarr3: bool) -> DirectArray | None:
        """The array stored as ``name``, or ``None`` where TensorStore must read it."""
        meta = store.read_json(f"{name}/zarr.json" if zarr3 else f"{name}/.zarray")
        if meta is None:
            return None
        chunking = Chunking.of(name, meta)
        return None if chunking is None else cls(store, name, chunking)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.chunking.shape

    @property
    def dtype(self) -> np.dtype:
        return self.chunking.dtype

    def read(
        self,
        region: Sequence[slice] | None = None,
        *,
        perm: Perm | None = None,
        dtype: np.dtype | None = None,
    ) -> np.ndarray:
        """``array[region]`` transposed by ``perm`` and cast to ``dtype``, in a new
        C-ordered array filled chunk by chunk on threads.

        Raises:
          ValueError: a step in ``region``; a chunk is missing, cut short or
            holds more than its size (each names the chunk's key).
        """
        chunking = self.chunking
        bounds = _bounds(region, chunking.shape)
        sub = tuple(stop - start for start, stop in bounds)
        target = chunking.dtype if dtype is None else np.dtype(dtype)
        out = empty_array(permute_shape(sub, perm), target)
        where = out if perm is None else out.transpose(inverse(perm))  # In the array's axes.
        jobs = list(self._pieces(bounds))
        if not jobs:
            return out

        def fill(job: tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]) -> None:
            grid, inside, at = job
            self._fill(grid, inside, at, where, out, perm)

        for _ in parallel_map(fill, jobs):
            pass
        return out

    def read_in_rows(self) -> tuple[np.ndarray, Iterator[np.ndarray]] | None:
        """The whole array as :meth:`read` makes it, and the bands of its rows, one
        per chunk, each handed out once decoded into it (chunks decoded in order on
        threads): a writer starts on the first while the rest are decoded. The
        array is whole once every band is taken. ``None`` where a chunk is not a
        band of whole rows.

        Raises:
          ValueError: as :meth:`read`, from the bands.
        """
        chunking = self.chunking
        if not chunking.shape or not all(
            c >= n for c, n in zip(chunking.chunks[1:], chunking.shape[1:], strict=True)
        ):
            return None
        out = empty_array(chunking.shape, chunking.dtype)
        jobs = list(self._pieces(_bounds(None, chunking.shape)))

        def fill(job: tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]) -> None:
            grid, inside, at = job
            self._fill(grid, inside, at, out, out, None)

        def bands() -> Iterator[np.ndarray]:
            for (_, _, at), _ in zip(jobs, parallel_map(fill, jobs), strict=True):
                yield out[at[0]]

        return out, bands()

    def row_blocks(
        self, perm: Perm | None = None, *, block_bytes: int = 16 * 2**20
    ) -> Iterator[np.ndarray]:
        """The whole array (transposed by ``perm``) in C order as blocks of whole
        leading-axis rows. Without ``perm``, chunk by chunk where each chunk holds
        whole rows: a raw chunk's rows as a view of the mapped file (no copy), a
        zstd chunk decoded as a stream into blocks of about ``block_bytes``, so no
        block holds more than that; else a band of chunks at a time. With
        ``perm``, the transposed array whole."""
        chunking = self.chunking
        if perm is not None or not chunking.shape or not chunking.shape[0]:
            yield self.read(perm=perm)
            return
        band = chunking.chunks[0]
        rest = chunking.shape[1:]
        whole_rows = all(c >= n for c, n in zip(chunking.chunks[1:], rest, strict=True))
        row_bytes = math.prod(chunking.chunks[1:]) * chunking.dtype.itemsize
        for start in range(0, chunking.shape[0], band):
            stop = min(start + band, chunking.shape[0])
            if not whole_rows:
                yield self.read((slice(start, stop),))
                continue
            grid = (start // band, *([0] * len(rest)))
            chunk = self._chunk(grid)
            where = self._where(chunking.key(grid))
            trim = (slice(None), *(slice(0, n) for n in rest))
            if not chunking.zstd:
                if chunk.length != chunking.chunk_bytes:
                    raise ValueError(self._raw_size(where, chunk.length))
                rows = self.store.data(chunk)[: (stop - start) * row_bytes].view(chunking.dtype)
                yield rows.reshape((stop - start, *chunking.chunks[1:]))[trim]
                continue
            step = max(1, block_bytes // max(1, row_bytes))
            source = self.store.data(chunk).data
            with zstandard.ZstdDecompressor().stream_reader(source) as reader:
                for lo in range(start, stop, step):
                    hi = min(lo + step, stop)
                    block = empty_array((hi - lo, *chunking.chunks[1:]), chunking.dtype)
                    _read_fully(reader, block.reshape(-1).view(np.uint8), where)
                    yield block[trim]
                _check_end(reader, chunking.chunk_bytes - (stop - start) * row_bytes, where)
            self.store.let_go(chunk)

    # -- the chunks ------------------------------------------------------------------

    def _pieces(
        self, bounds: Sequence[tuple[int, int]]
    ) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
        """For each chunk the region meets: its grid index, the part of it inside
        the region (in chunk coordinates) and where that goes (in the region's)."""
        chunks = self.chunking.chunks
        ranges = [
            range(start // c, -(-stop // c)) if stop > start else range(0)
            for (start, stop), c in zip(bounds, chunks, strict=True)
        ]
        for grid in itertools.product(*ranges):
            inside, at = [], []
            for g, c, (start, stop) in zip(grid, chunks, bounds, strict=True):
                lo, hi = max(g * c, start), min((g + 1) * c, stop)
                inside.append(slice(lo - g * c, hi - g * c))
                at.append(slice(lo - start, hi - start))
            yield grid, tuple(inside), tuple(at)

    def _chunk(self, grid: tuple[int, ...]) -> Chunk:
        """Where the chunk at ``grid`` lies (inside its shard, for a sharded array)."""
        chunking = self.chunking
        if chunking.shard is None:
            key = chunking.key(grid)
            chunk = self.store.get(key)
            if chunk is None:
                raise ValueError(self._missing(key))
            return chunk
        per_shard, _ = chunking.shard
        outer = tuple(g // n for g, n in zip(grid, per_shard, strict=True))
        value, index = self._shard(chunking.key(outer))
        inner = tuple(g % n for g, n in zip(grid, per_shard, strict=True))
        position = int(np.ravel_multi_index(inner, per_shard)) if per_shard else 0
        offset, length = struct.unpack_from("<QQ", index, position * _SHARD_ENTRY)
        if offset == length == _MISSING:
            raise ValueError(self._missing(f"{chunking.key(outer)} (chunk {list(inner)})"))
        if offset + length > value.length:
            raise ValueError(
                f"{self._where(chunking.key(outer))}: a chunk lies past the end of its shard."
            )
        if value.inline is not None:
            return Chunk(None, 0, length, value.inline[offset : offset + length])
        return Chunk(value.file, value.offset + offset, length)

    def _shard(self, key: str) -> tuple[Chunk, bytes]:
        """Where the shard ``key`` lies and its index (checked against its CRC-32C),
        read once."""
        with self._lock:
            found = self._shards.get(key)
        if found is not None:
            return found
        assert self.chunking.shard is not None
        per_shard, at_end = self.chunking.shard
        value = self.store.get(key)
        if value is None:
            raise ValueError(self._missing(key))
        size = math.prod(per_shard) * _SHARD_ENTRY + 4
        if value.length < size:
            raise ValueError(f"{self._where(key)}: the shard is shorter than its index.")
        raw = np.empty(size, np.uint8)
        start = value.length - size if at_end else 0
        self.store.read_into(replace(value, offset=value.offset + start, length=size), raw)
        index = raw[:-4].tobytes()
        if crc32c(index) != struct.unpack("<I", raw[-4:].tobytes())[0]:
            raise ValueError(f"{self._where(key)}: the shard index fails its CRC-32C check.")
        with self._lock:
            self._shards[key] = (value, index)
        return value, index

    def _fill(
        self,
        grid: tuple[int, ...],
        inside: tuple[slice, ...],
        at: tuple[slice, ...],
        where: np.ndarray,
        out: np.ndarray,
        perm: Perm | None,
    ) -> None:
        """Puts the part ``inside`` of the chunk at ``grid`` at ``where[at]``."""
        chunking = self.chunking
        chunk = self._chunk(grid)
        where_key = self._where(chunking.key(grid))
        if not chunking.zstd and chunk.length != chunking.chunk_bytes:
            raise ValueError(self._raw_size(where_key, chunk.length))
        target = self._contiguous(where, at, inside, out, perm)
        if target is not None:  # Its bytes go straight into place.
            if chunking.zstd:
                self._decode(chunk, target, where_key)
            else:
                self.store.read_into(replace(chunk, length=len(target)), target)
            return
        if chunking.zstd:
            data = empty_array((chunking.chunk_bytes,), np.dtype(np.uint8))
            self._decode(chunk, data, where_key)
        else:  # Read where it lies, in the mapped file: copied once, into place.
            data = self.store.data(chunk)
        piece = data.view(chunking.dtype).reshape(chunking.chunks)[inside]
        if perm is None:
            np.copyto(where[_index(at)], piece, casting="unsafe")
        else:  # Transposed into place, tile by tile.
            dest = out[_index(at[p] for p in perm)]
            src = piece if piece.dtype == out.dtype else piece.astype(out.dtype)
            contiguous_transpose(src, perm, out=dest, threads=False)  # (On parallel_map's.)
        if not chunking.zstd:
            self.store.let_go(chunk)

    def _contiguous(
        self,
        where: np.ndarray,
        at: tuple[slice, ...],
        inside: tuple[slice, ...],
        out: np.ndarray,
        perm: Perm | None,
    ) -> np.ndarray | None:
        """The bytes of ``where[at]`` as one ``uint8`` run, where the chunk's own
        bytes (from its start) are exactly those: no transpose or cast, the chunk
        whole but for rows past the array's end, and its place in the output one
        run of it; ``None`` otherwise."""
        chunking = self.chunking
        if perm is not None or out.dtype != chunking.dtype or not out.flags.c_contiguous:
            return None
        if not chunking.shape:
            return out.reshape(-1).view(np.uint8)
        if any(s.start != 0 for s in inside):
            return None
        if any(s.stop != c for s, c in zip(inside[1:], chunking.chunks[1:], strict=True)):
            return None
        # (One run: rows of the output's full width, or a layer's run of experts.)
        region = where[_index(at)]
        if not region.flags.c_contiguous:
            return None
        return region.reshape(-1).view(np.uint8)

    def _decode(self, chunk: Chunk, target: np.ndarray, where: str) -> None:
        """Decodes the zstd frame of ``chunk`` into ``target`` (``uint8``), its first
        bytes; the rest (an edge chunk's padding) is decoded and dropped, so a frame
        of another size is refused.

        The frame is read where it lies, in the mapped file: a whole frame that
        states its size (as Orbax's and jaxshare's do) and fits ``target`` is then
        decoded in one pass straight into it. From a stream, zstd decodes into its
        window and copies out, and the file's bytes are copied in first: 0.8x the
        CPU of that, and 0.8x the time from a cold file too (the mapping's
        read-around keeps ahead of two decoding threads). A frame of 1 MiB or more
        that the page cache lacks is read past it first
        (:func:`~jaxshare.io.mapped.read_direct`): here the first touch of a page the
        kernel had just read cost more CPU than the decode, and an 8 GB item went
        to a ``.safetensors`` file in 11.2-12.0 s with 7.8-8.3 s of user CPU
        against 12.6-13.0 s with 14.1-14.3 s (11.3-11.5 s against 13.5-14.2 s
        transposed into PyTorch's axis order)."""
        frame = read_direct(self.store.data(chunk))
        with zstandard.ZstdDecompressor().stream_reader(frame.data) as reader:
            _read_fully(reader, target, where)
            _check_end(reader, self.chunking.chunk_bytes - len(target), where)
        self.store.let_go(chunk)

    def _raw_size(self, where: str, size: int) -> str:
        chunking = self.chunking
        return (
            f"{where}: a raw chunk of {size} bytes, expected {chunking.chunk_bytes} (chunk "
            f"shape {list(chunking.chunks)}, {chunking.dtype}). The item is damaged."
        )

    def _missing(self, key: str) -> str:
        return (
            f"{self._where(key)}: the chunk is not stored (an item written by Orbax "
            "stores every chunk). The item is incomplete; write it again from its source."
        )

    def _where(self, key: str) -> str:
        return f"{self.store.directory}: {key}"


def _bounds(region: Sequence[slice] | None, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(start, stop)`` per axis of ``region`` (slices of step 1) within ``shape``."""
    full = list(region or ()) + [slice(None)] * (len(shape) - len(region or ()))
    if len(full) != len(shape):
        raise ValueError(f"an index of {len(full)} axes for an array of shape {shape}.")
    bounds = []
    for s, n in zip(full, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"a step of {step} in an index: only slices of step 1 are read.")
        bounds.append((start, max(start, stop)))
    return bounds


def _index(slices: Iterable[slice]) -> tuple[Any, ...]:
    """``slices`` as an index that gives a view even of a 0-d array."""
    return (*slices, Ellipsis)


def _read_fully(reader: Any, target: np.ndarray, where: str) -> None:
    """Fills ``target`` (``uint8``) from a zstd stream ``reader``."""
    view, filled = target.data, 0
    while filled < len(target):
        n = reader.readinto(view[filled:])
        if n == 0:
            raise ValueError(f"{where}: the zstd chunk ends before the bytes its array holds.")
        filled += n


def _check_end(reader: Any, rest: int, where: str) -> None:
    """Reads the last ``rest`` bytes of a zstd stream (an edge chunk's padding),
    refusing a stream that holds fewer or more."""
    scratch = bytearray(1 << 16)
    while True:
        n = reader.readinto(scratch)
        if n == 0:
            break
        rest -= n
        if rest < 0:
            raise ValueError(f"{where}: the zstd chunk holds more bytes than its chunk shape.")
    if rest:
        raise ValueError(f"{where}: the zstd chunk ends before the bytes its array holds.")
