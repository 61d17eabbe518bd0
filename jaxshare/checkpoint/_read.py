"""Reading the stored arrays of an item one at a time, as numpy arrays.

Each array is opened with TensorStore, from the spec Orbax itself reads it with
(``ocp.type_handlers.get_json_tspec_read``), so nothing but the array asked
for is read. :meth:`LeafReader.read` fills one array; :meth:`LeafReader.blocks`
streams an array (or its transpose) in blocks of about :data:`BLOCK_BYTES`,
so writing a file never holds even one whole array. ``save`` stores arrays in
chunks of at most :data:`CHUNK_BYTES`, which keeps a block's read that small;
an array stored as one chunk (as plain Orbax may) is decoded whole per block.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator

import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

from jaxshare._dtype import cast_to
from jaxshare._paths import flatten_with_paths, render
from jaxshare._perm import Perm
from jaxshare.checkpoint._item import StoredItem

__all__ = ["BLOCK_BYTES", "CHUNK_BYTES", "LeafReader"]

#: Storage chunk size that ``save`` asks Orbax for.
CHUNK_BYTES = 16 * 2**20
#: Size of the blocks :meth:`LeafReader.blocks` yields.
BLOCK_BYTES = 16 * 2**20
_MMAP_BYTES = 2**20
# Orbax's context caches OCDBT B-tree nodes up to 100 MB; reading each array
# once needs little of that, and a long read would keep it all resident.
_CONTEXT = {"cache_pool#ocdbt": {"total_bytes_limit": 8 * 2**20}}


class LeafReader:
    """Reads the stored arrays of ``item``; floating ones are cast to ``dtype``."""

    def __init__(self, item: StoredItem, *, dtype: np.dtype | None = None) -> None:
        self._item = item
        self._dtype = dtype
        self._directory = epath.Path(item.directory)
        tree = item.metadata.tree
        self._names = {render(p): leaf.name for p, leaf in flatten_with_paths(tree)}
        self._use_zarr3 = item.metadata.use_zarr3
        self._use_ocdbt = ocp.type_handlers.is_ocdbt_checkpoint(self._directory)
        self._context = ts.Context(_CONTEXT if self._use_ocdbt else {})

    def read(self, path: str) -> np.ndarray:
        """The whole array at ``path``, copied chunk by chunk into one new array."""
        store = self._open(path)
        out = _empty(store.shape, np.dtype(store.dtype.numpy_dtype))
        ts.array(out, copy=False, write=True).write(store).result()
        return out

    def read_slice(self, path: str, index: tuple[slice, ...]) -> np.ndarray:
        """``read(path)[index]``, reading only the chunks the slice covers."""
        return np.asarray(self._open(path)[index].read().result())

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
        if perm is not None:
            store = store[ts.d[list(perm)].transpose[:]]
        if store.ndim == 0:
            yield store.read().result()
            return
        row_bytes = math.prod(store.shape[1:]) * store.dtype.numpy_dtype.itemsize
        rows = max(1, BLOCK_BYTES // max(1, row_bytes))
        for start in range(0, store.shape[0], rows):
            yield store[start : min(start + rows, store.shape[0])].read().result()

    def _open(self, path: str) -> ts.TensorStore:
        """The stored array (a zero-size one from its record), cast as asked."""
        if path in self._item.empty:
            empty = self._item.empty[path]
            store = ts.array(np.zeros(empty.shape, empty.dtype))
        else:
            info = ocp.type_handlers.ParamInfo(
                name=self._names[path],
                parent_dir=self._directory,
                use_zarr3=self._use_zarr3,
                is_ocdbt_checkpoint=self._use_ocdbt,
                ts_context=self._context,
            )
            spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=self._use_ocdbt)
            store = ts.open(spec, read=True, context=self._context).result()
        dtype = cast_to(np.dtype(store.dtype.numpy_dtype), self._dtype)
        return store if dtype == store.dtype.numpy_dtype else ts.cast(store, dtype)


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array; a large one in its own memory mapping, which goes
    back to the operating system as soon as the array is freed (freed heap
    memory may stay with the process, so a long read would keep growing)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _MMAP_BYTES:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)
