"""Reading the stored arrays of an item one at a time, as numpy arrays.

Each array is opened with TensorStore, from the spec Orbax itself reads it with
(:func:`~jaxshare.checkpoint._item.array_spec`), so nothing but the array asked
for is read, and neither Orbax nor JAX is imported. :meth:`LeafReader.read`
fills one array; :meth:`LeafReader.blocks` streams an array (or its
transpose) in blocks of about :data:`BLOCK_BYTES`, so writing a file never
holds even one whole array. ``save`` stores arrays in
chunks of at most :data:`CHUNK_BYTES`, which keeps a block's read that small.

Plain Orbax stores an array of one process as one chunk: the whole array,
zstd-compressed. TensorStore decodes a chunk whole, holding the compressed and
the decoded copy at once, and again for every block a read asks for. Such an
array (zarr v2, or zarr v3 as one shard of one chunk; zstd or raw; not cast) is
read here instead as a stream (:class:`_OneChunk`): its stored bytes in ranges
of :data:`_RANGE_BYTES`, decoded into place, so a whole read holds the array
and a few MiB, and its blocks (untransposed) hold one block.
"""

from __future__ import annotations

import collections
import contextlib
import math
import mmap
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorstore as ts
import zstandard

from jaxshare._dtype import cast_to
from jaxshare._perm import Perm, contiguous_transpose
from jaxshare.checkpoint._item import StoredItem, array_spec, is_ocdbt, read_context

__all__ = ["BLOCK_BYTES", "CHUNK_BYTES", "LeafReader"]

#: Storage chunk size that ``save`` asks Orbax for.
CHUNK_BYTES = 16 * 2**20
#: Size of the blocks :meth:`LeafReader.blocks` yields.
BLOCK_BYTES = 16 * 2**20
_MMAP_BYTES = 2**20
#: The stored bytes of a one-chunk array are read in ranges of this size,
_RANGE_BYTES = 4 * 2**20
#: this many in flight at once.
_RANGES_AHEAD = 4


class LeafReader:
    """Reads the stored arrays of ``item``; floating ones are cast to ``dtype``."""

    def __init__(self, item: StoredItem, *, dtype: np.dtype | None = None) -> None:
        self._item = item
        self._dtype = dtype
        self._use_ocdbt = is_ocdbt(item.directory)
        self._context = read_context(self._use_ocdbt)

    def read(self, path: str) -> np.ndarray:
        """The whole array at ``path``, copied chunk by chunk into one new array."""
        store = self._open(path)
        return _whole(store, self._one_chunk(path, store))

    def read_slice(self, path: str, index: tuple[slice, ...]) -> np.ndarray:
        """``read(path)[index]``, reading only the chunks the slice covers (an
        array stored as one chunk is decoded whole, once)."""
        store = self._open(path)
        chunk = self._one_chunk(path, store)
        if chunk is not None:
            return np.array(_whole(store, chunk)[index])
        return np.asarray(store[index].read().result())

    def chunk_shape(self, path: str) -> tuple[int, ...] | None:
        """The shape of the TensorStore chunks of the array at ``path``."""
        if path in self._item.empty:
            return None
        shape = self._open(path).chunk_layout.read_chunk.shape
        return None if shape is None or None in shape else tuple(int(n or 0) for n in shape)

    def blocks(self, path: str, perm: Perm | None = None) -> Iterator[np.ndarray]:
        """The array at ``path`` (transposed by ``perm``) in C order, as blocks of
        whole leading-axis slices of about :data:`BLOCK_BYTES` each."""
        store = self._open(path)
        chunk = self._one_chunk(path, store)
        if chunk is not None and store.ndim:
            if perm is None or tuple(perm) == tuple(range(store.ndim)):
                yield from chunk.blocks(store.shape, np.dtype(store.dtype.numpy_dtype))
            else:  # Decoded whole, once, then transposed block by block, on threads.
                whole = _whole(store, chunk)
                rows = whole.transpose(perm)
                for start, stop in _row_ranges(rows.shape, rows.dtype):
                    index = [slice(None)] * whole.ndim
                    index[perm[0]] = slice(start, stop)  # The rows of the transpose.
                    yield contiguous_transpose(whole[tuple(index)], perm)
            return
        if perm is not None:
            store = store[ts.d[list(perm)].transpose[:]]
        if store.ndim == 0:
            yield store.read().result()
            return
        for start, stop in _row_ranges(store.shape, np.dtype(store.dtype.numpy_dtype)):
            yield store[start:stop].read().result()

    def _one_chunk(self, path: str, store: ts.TensorStore) -> _OneChunk | None:
        """The array at ``path`` as one stored chunk to decode as a stream, or
        ``None`` where TensorStore reads it (several chunks, a cast, other codecs)."""
        if path in self._item.empty or store.ndim == 0:
            return None
        return _OneChunk.of(store, self._context)

    def _open(self, path: str) -> ts.TensorStore:
        """The stored array (a zero-size one from its record), cast as asked."""
        if path in self._item.empty:
            empty = self._item.empty[path]
            store = ts.array(np.zeros(empty.shape, empty.dtype))
        else:
            item = self._item
            spec = array_spec(item.directory, item.names[path], item.use_zarr3, self._use_ocdbt)
            store = ts.open(spec, read=True, context=self._context).result()
        dtype = cast_to(np.dtype(store.dtype.numpy_dtype), self._dtype)
        return store if dtype == store.dtype.numpy_dtype else ts.cast(store, dtype)


def _whole(store: ts.TensorStore, chunk: _OneChunk | None) -> np.ndarray:
    """The whole array of ``store`` in one new array: decoded as a stream from its
    one ``chunk``, else copied chunk by chunk by TensorStore."""
    out = _empty(store.shape, np.dtype(store.dtype.numpy_dtype))
    if chunk is not None:
        chunk.decode_into(out.reshape(-1).view(np.uint8))
    else:
        ts.array(out, copy=False, write=True).write(store).result()
    return out


def _row_ranges(shape: tuple[int, ...], dtype: np.dtype) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the leading-axis blocks of about :data:`BLOCK_BYTES`."""
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    rows = max(1, BLOCK_BYTES // max(1, row_bytes))
    for start in range(0, shape[0], rows):
        yield start, min(start + rows, shape[0])


class _OneChunk:
    """The stored bytes of an array kept as one chunk, decoded as a stream.

    The chunk's bytes (a zstd frame, or the raw array) are read from the item's
    key-value store in ranges of :data:`_RANGE_BYTES`, a few ranges ahead, and
    decoded into place, so nothing holds the compressed chunk whole.
    """

    def __init__(
        self, kvstore: ts.KvStore, key: bytes, start: int, stop: int | None, *, zstd: bool
    ) -> None:
        self._kvstore, self._key, self._start, self._stop = kvstore, key, start, stop
        self._zstd = zstd

    @classmethod
    def of(cls, store: ts.TensorStore, context: ts.Context) -> _OneChunk | None:
        """The one chunk of ``store`` (opened, uncast), or ``None`` where it is not
        an array this class decodes (several chunks, filters, other codecs)."""
        spec = store.spec().to_json()
        meta, ndim = spec.get("metadata", {}), store.ndim
        if spec.get("driver") == "zarr":
            chunks, dtype = meta.get("chunks"), meta.get("dtype")
            compressor = meta.get("compressor")
            if (
                meta.get("filters") is not None
                or meta.get("order") != "C"
                or not isinstance(dtype, str)
                or dtype[0] == ">"
                or (compressor is not None and compressor.get("id") != "zstd")
            ):
                return None
            key = meta.get("dimension_separator", ".").join("0" * ndim)
            where: Any = None
            zstd = compressor is not None
        elif spec.get("driver") == "zarr3":
            chunks = meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
            codecs = meta.get("codecs", [])
            if len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
                shard = codecs[0].get("configuration", {})
                if shard.get("chunk_shape") != chunks or shard.get("index_location") != "end":
                    return None
                codecs, where = shard.get("codecs", []), "index"
            else:
                where = None
            zstd = [c.get("name") for c in codecs] == ["bytes", "zstd"]
            if not zstd and [c.get("name") for c in codecs] != ["bytes"]:
                return None
            if codecs[0].get("configuration", {}).get("endian", "little") != "little":
                return None
            encoding = meta.get("chunk_key_encoding", {})
            separator = encoding.get("configuration", {}).get(
                "separator", "/" if encoding.get("name") == "default" else "."
            )
            zeros = ["0"] * ndim
            key = separator.join(["c", *zeros] if encoding.get("name") == "default" else zeros)
        else:
            return None
        if chunks is None or list(chunks) != list(store.shape):
            return None
        kvstore = ts.KvStore.open(spec["kvstore"], context=context).result()
        start, stop = 0, None
        if where == "index":  # One inner chunk: (offset, nbytes) then a CRC32C, at the end.
            result = kvstore.read(key.encode(), byte_range=slice(-20, None)).result()
            if result.state != "value" or len(result.value) != 20:
                return None
            start, nbytes = (int(n) for n in np.frombuffer(result.value[:16], "<u8"))
            if start == nbytes == 2**64 - 1:
                return None  # (Not stored: the fill value.)
            stop = start + nbytes
        elif not zstd:
            stop = math.prod(store.shape) * np.dtype(store.dtype.numpy_dtype).itemsize
        return cls(kvstore, key.encode(), start, stop, zstd=zstd)

    def _ranges(self) -> Iterator[bytes]:
        """The stored bytes, range after range, the next :data:`_RANGES_AHEAD` read
        while one is decoded (so a cold disk has several requests to serve). The
        first short range is the last: reads past it are dropped unread."""
        pending: collections.deque[tuple[int, Any]] = collections.deque()
        ahead = self._start  # Where the next range to ask for starts.
        while True:
            while len(pending) < _RANGES_AHEAD and (self._stop is None or ahead < self._stop):
                pending.append(self._read(ahead))
                ahead += _RANGE_BYTES
            if not pending:
                return
            offset, _ = pending[0]
            data = self._result(pending.popleft(), offset)
            if data:
                yield data
            if len(data) < _RANGE_BYTES:
                return

    def _read(self, offset: int) -> Any:
        stop = offset + _RANGE_BYTES
        if self._stop is not None:
            stop = min(stop, self._stop)
        return offset, self._kvstore.read(self._key, byte_range=slice(offset, stop))

    def _result(self, pending: tuple[int, Any], offset: int) -> bytes:
        """The bytes of one range read; the last range of a chunk whose length
        the store does not tell is read again as "to the end"."""
        _, future = pending
        try:
            result = future.result()
        except ValueError as error:
            if "OUT_OF_RANGE" not in str(error):
                raise
            result = self._kvstore.read(self._key, byte_range=slice(offset, None)).result()
        if result.state != "value":
            raise FileNotFoundError(f"{self._key.decode()}: the array's stored chunk is missing.")
        return bytes(result.value)

    def decoded(self) -> Iterator[bytes]:
        """The array's bytes in C order, piece after piece."""
        if not self._zstd:
            yield from self._ranges()
            return
        decoder = zstandard.ZstdDecompressor().decompressobj()
        for data in self._ranges():
            if decoder.eof:
                if data:
                    raise ValueError(f"{self._key.decode()}: bytes after the array's zstd frame.")
                break
            piece = decoder.decompress(data)
            if piece:
                yield piece
        if not decoder.eof:
            raise ValueError(f"{self._key.decode()}: the array's zstd chunk is truncated.")

    def decode_into(self, out: np.ndarray) -> None:
        """Decodes the whole array into ``out``, its bytes (1-D, ``uint8``)."""
        filled = 0
        for piece in self.decoded():
            if filled + len(piece) > len(out):
                raise ValueError(f"{self._key.decode()}: the chunk holds more than the array.")
            out[filled : filled + len(piece)] = np.frombuffer(piece, np.uint8)
            filled += len(piece)
        if filled != len(out):
            raise ValueError(
                f"{self._key.decode()}: the chunk holds {filled} bytes, the array {len(out)}."
            )

    def blocks(self, shape: tuple[int, ...], dtype: np.dtype) -> Iterator[np.ndarray]:
        """The array as blocks of whole leading-axis slices (see :func:`_row_ranges`),
        each decoded into its own new array."""
        pieces = self.decoded()
        rest = np.empty(0, np.uint8)
        for start, stop in _row_ranges(shape, dtype):
            block = np.empty((stop - start, *shape[1:]), dtype)
            out = block.reshape(-1).view(np.uint8)
            filled = 0
            while filled < len(out):
                if not len(rest):
                    piece = next(pieces, None)
                    if piece is None:
                        raise ValueError(f"{self._key.decode()}: the chunk ends before the array.")
                    rest = np.frombuffer(piece, np.uint8)
                n = min(len(rest), len(out) - filled)
                out[filled : filled + n] = rest[:n]
                filled, rest = filled + n, rest[n:]
            yield block
        if len(rest) or next(pieces, None):
            raise ValueError(f"{self._key.decode()}: the chunk holds more than the array.")


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array; a large one in its own memory mapping, which goes
    back to the operating system as soon as the array is freed (freed heap
    memory may stay with the process, so a long read would keep growing)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _MMAP_BYTES:
        return np.empty(shape, dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # In huge pages where the kernel has them (as numpy asks for its own large
    # arrays): 512x fewer page faults filling it (here 3.3 GB read took 850k).
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)
