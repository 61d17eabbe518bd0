"""Reading the stored arrays of an item one at a time, as numpy arrays.

An array stored in the formats Orbax writes (zarr v2 or v3, sharded or not; raw
or zstd) is read from its chunks directly (:mod:`jaxshare.checkpoint._chunks`):
each chunk decoded or copied into place on a few threads, a transposed read
transposing each chunk into place, a large chunk streamed into blocks. Any
other array is opened with TensorStore, from the spec Orbax itself reads it with
(:func:`~jaxshare.checkpoint._item.array_spec`). Either way nothing but the
array asked for is read, and neither Orbax nor JAX is imported.
:meth:`LeafReader.read` fills one array; :meth:`LeafReader.blocks` streams an
array (or its transpose) in blocks, so writing a file need not hold it whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import tensorstore as ts

from jaxshare.checkpoint._chunks import ChunkStore, DirectArray
from jaxshare.checkpoint._item import StoredItem, array_spec, is_ocdbt, read_context
from jaxshare.core.dtype import cast_to
from jaxshare.core.perm import Perm
from jaxshare.io.buffers import empty_array

__all__ = ["BLOCK_BYTES", "LeafReader"]

#: Size of the blocks :meth:`LeafReader.blocks` yields.
BLOCK_BYTES = 16 * 2**20


class LeafReader:
    """Reads the stored arrays of ``item``; floating ones are cast to ``dtype``."""

    def __init__(self, item: StoredItem, *, dtype: np.dtype | None = None) -> None:
        self._item = item
        self._dtype = dtype
        self._use_ocdbt = is_ocdbt(item.directory)
        self._context = read_context(self._use_ocdbt)
        self._chunks = ChunkStore(item.directory, use_ocdbt=self._use_ocdbt)
        self._direct: dict[str, DirectArray | None] = {}

    def read(self, path: str) -> np.ndarray:
        """The whole array at ``path``, in one new array."""
        direct = self.direct(path)
        if direct is not None:
            return direct.read(dtype=self._cast(direct))
        store = self._open(path)
        out = empty_array(store.shape, np.dtype(store.dtype.numpy_dtype))
        ts.array(out, copy=False, write=True).write(store).result()
        return out

    def read_in_rows(self, path: str) -> tuple[np.ndarray, Iterator[np.ndarray]] | None:
        """``read(path)`` and its bands of rows as they are decoded into it
        (:meth:`DirectArray.read_in_rows`); ``None`` where it is not read so (cast,
        read by TensorStore, chunks that split its rows)."""
        direct = self.direct(path)
        if direct is None or self._cast(direct) != direct.dtype:
            return None
        return direct.read_in_rows()

    def read_permuted(self, path: str, perm: Perm) -> np.ndarray | None:
        """``read(path)`` transposed by ``perm`` into one new C-ordered array, each
        chunk transposed into place; ``None`` where TensorStore reads the array
        (the caller transposes what :meth:`read` gives)."""
        direct = self.direct(path)
        return None if direct is None else direct.read(perm=perm, dtype=self._cast(direct))

    def read_slice(self, path: str, index: tuple[slice, ...]) -> np.ndarray:
        """``read(path)[index]``, reading only the chunks the slice covers."""
        direct = self.direct(path)
        if direct is not None and all(s.step in (None, 1) for s in index):
            return direct.read(index, dtype=self._cast(direct))
        return np.asarray(self._open(path)[index].read().result())

    def read_slice_permuted(
        self, path: str, index: tuple[slice, ...], perm: Perm
    ) -> np.ndarray | None:
        """``read_slice(path, index)`` transposed by ``perm`` into one new C-ordered
        array, each chunk transposed into place as it is decoded, on threads; ``None``
        where TensorStore reads the array (the caller transposes)."""
        direct = self.direct(path)
        if direct is None or any(s.step not in (None, 1) for s in index):
            return None
        return direct.read(index, perm=perm, dtype=self._cast(direct))

    def chunk_shape(self, path: str) -> tuple[int, ...] | None:
        """The shape of the stored (read) chunks of the array at ``path``."""
        if path in self._item.empty:
            return None
        direct = self.direct(path)
        if direct is not None:
            return direct.chunking.chunks
        shape = self._open(path).chunk_layout.read_chunk.shape
        return None if shape is None or None in shape else tuple(int(n or 0) for n in shape)

    def blocks(self, path: str, perm: Perm | None = None) -> Iterator[np.ndarray]:
        """The array at ``path`` (transposed by ``perm``) in C order, as blocks of
        whole leading-axis slices: chunk by chunk (views of the item's files where
        they are raw, of about :data:`BLOCK_BYTES` where they are zstd), or the
        transposed array whole, where it is read from its chunks; else blocks of
        about :data:`BLOCK_BYTES` that TensorStore reads."""
        direct = self.direct(path)
        if direct is not None:
            if self._cast(direct) == direct.dtype:
                yield from direct.row_blocks(perm, block_bytes=BLOCK_BYTES)
            else:
                yield direct.read(perm=perm, dtype=self._cast(direct))
            return
        store = self._open(path)
        if perm is not None:
            store = store[ts.d[list(perm)].transpose[:]]
        if store.ndim == 0:
            yield store.read().result()
            return
        for start, stop in _row_ranges(store.shape, np.dtype(store.dtype.numpy_dtype)):
            yield store[start:stop].read().result()

    def direct(self, path: str) -> DirectArray | None:
        """The array at ``path`` as read from its chunks, ``None`` where TensorStore
        reads it (a zero-size array, a codec or dtype not decoded here)."""
        if path not in self._direct:
            found = None
            if path not in self._item.empty and path in self._item.names:
                found = DirectArray.of(
                    self._chunks, self._item.names[path], zarr3=self._item.use_zarr3
                )
            self._direct[path] = found
        return self._direct[path]

    def close(self) -> None:
        """Lets go of the item's mapped files (arrays already read stay valid)."""
        self._chunks.close()

    def _cast(self, direct: DirectArray) -> np.dtype:
        return cast_to(direct.dtype, self._dtype)

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


def _row_ranges(shape: tuple[int, ...], dtype: np.dtype) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the leading-axis blocks of about :data:`BLOCK_BYTES`."""
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    rows = max(1, BLOCK_BYTES // max(1, row_bytes))
    for start in range(0, shape[0], rows):
        yield start, min(start + rows, shape[0])
