"""A Flax tree in memory as a source: an ``nnx.Module``, an ``nnx.State``, a dict.

Writers read sources (:class:`jaxshare.stream.TensorSource`); a model held in
memory is one too, as the item it would be saved as is. :class:`TreeSource`
names each leaf by its ``/``-rendered path (``layers/0/attn/q_proj/w``) and hands
it out as numpy, one leaf at a time, gathered from its devices when it is sharded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

from jaxshare.internal import (
    PARALLEL_BYTES,
    Index,
    Perm,
    contiguous_transpose,
    empty_array,
    is_nnx_module,
    is_variable,
    keypath_to_path,
    parallel_map,
    permute_shape,
    render,
    variable_value,
)
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = ["TreeSource"]

#: A leaf at least this large has its blocks placed on a few threads.
#: About the bytes of a band of rows that :meth:`TreeSource.blocks` hands out at a time.
BAND_BYTES = 8 << 20

Bounds = tuple[tuple[int, int, int], ...]


class TreeSource(TensorSource):
    """The array leaves of a Flax tree in memory, by their rendered paths.

    Args:
      tree: an ``nnx.Module`` (its ``nnx.Param`` state), an ``nnx.State`` (NNX
        Variables are leaves), or any pytree of arrays.
      config: the model's ``config.json`` as a dict, if known.

    >>> import jax.numpy as jnp
    >>> TreeSource({"layers": [{"w": jnp.zeros((2, 3))}]}).infos
    {'layers/0/w': ArrayInfo(shape=(2, 3), dtype='float32')}
    """

    kind = "Flax tree"
    flax_named = True

    def __init__(self, tree: Any, config: Any = None) -> None:
        if is_nnx_module(tree):
            from flax import nnx

            tree = nnx.state(tree, nnx.Param)
        flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]
        self._leaves: dict[str, Any] = {}
        for keypath, leaf in flat:
            value = variable_value(leaf)
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                self._leaves[render(keypath_to_path(keypath))] = value
        self.infos = {
            name: ArrayInfo(tuple(v.shape), np.dtype(v.dtype).name)
            for name, v in self._leaves.items()
        }
        self.config = config
        self._last: tuple[str, np.ndarray] | None = None

    @property
    def where(self) -> str:
        return "the Flax tree"

    def read(self, name: str) -> np.ndarray:
        value = self._leaves[name]
        if not isinstance(value, jax.Array) or not value.is_fully_addressable:
            return np.asarray(value)
        # Each device's block copied into place (on the CPU, read where it lies): no
        # host copy of the whole array is left cached on it once it is written.
        shards = value.addressable_shards
        if value.is_fully_replicated:
            return np.asarray(shards[0].data)
        out = np.empty(value.shape, value.dtype)
        for shard in shards:
            out[shard.index] = np.asarray(shard.data)
        return out

    def permuted_array(self, name: str, perm: Perm) -> np.ndarray | None:
        """The leaf ``name`` transposed by ``perm``, each device's block transposed
        straight into its place (one pass: no gathered copy first); the blocks of a
        large leaf on a few threads."""
        value = self._leaves[name]
        if not isinstance(value, jax.Array) or not value.is_fully_addressable:
            return None
        # (Lined up with where a writer puts it, where it says: written without a copy.)
        out = empty_array(permute_shape(value.shape, perm), np.dtype(value.dtype))
        _place(_device_blocks(value), perm, out, 0)
        return out

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        """A sharded leaf in bands of its rows, each gathered from the devices' blocks
        into memory of its own (about :data:`BAND_BYTES`), so a writer starts on the
        first while the next is gathered and no copy of the whole leaf is made."""
        moved = self.permuted_blocks(name, tuple(range(len(self.infos[name].shape))))
        yield from moved if moved is not None else (self.array(name),)

    def permuted_blocks(self, name: str, perm: Perm) -> Iterable[np.ndarray] | None:
        """The leaf ``name`` transposed by ``perm`` in bands of the result's rows, each
        device's block transposed into each band it reaches (see :meth:`blocks`)."""
        value = self._leaves[name]
        if not isinstance(value, jax.Array) or not value.is_fully_addressable or not value.size:
            return None
        return _bands(value, tuple(perm))

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        # (The last leaf read is kept: the parts of a stacked leaf are read in turn.)
        if self._last is None or self._last[0] != name:
            self._last = (name, self.read(name))
        return np.array(self._last[1][index])


def _device_blocks(value: jax.Array) -> dict[Bounds, Any]:
    """The distinct blocks of a sharded array (a block several devices hold: once),
    by their bounds (``(start, stop, step)`` per axis)."""
    blocks: dict[Bounds, Any] = {}
    for shard in value.addressable_shards:
        bounds = tuple(s.indices(n) for s, n in zip(shard.index, value.shape, strict=True))
        blocks.setdefault(bounds, shard)
    return blocks


def _place(blocks: dict[Bounds, Any], perm: Perm, out: np.ndarray, row: int) -> None:
    """Each block transposed by ``perm`` into ``out``, the rows ``row ..`` of the
    result (the part of each block that falls in them); on a few threads where
    ``out`` is large."""
    rows = out.shape[0]
    same = tuple(perm) == tuple(range(len(perm)))

    def place(item: tuple[Bounds, Any]) -> None:
        bounds, shard = item
        lo, hi = bounds[perm[0]][:2]
        lo, hi = max(lo, row), min(hi, row + rows)
        if lo >= hi:
            return
        data = np.asarray(shard.data)
        start = bounds[perm[0]][0]
        if (lo, hi) != bounds[perm[0]][:2]:  # (The part of the block in these rows.)
            index = [slice(None)] * data.ndim
            index[perm[0]] = slice(lo - start, hi - start)
            data = data[tuple(index)]
        at = (slice(lo - row, hi - row), *(slice(*bounds[k][:2]) for k in perm[1:]))
        if same:  # (A plain copy: numpy's, faster than tiles that move nothing.)
            out[at] = data
        else:
            contiguous_transpose(data, perm, out=out[at], threads=False)

    items = list(blocks.items())
    if out.nbytes >= PARALLEL_BYTES:
        for _ in parallel_map(place, items):
            pass
    else:
        for item in items:
            place(item)


def _bands(value: jax.Array, perm: Perm) -> Iterator[np.ndarray]:
    """``value`` transposed by ``perm``, in C order, as bands of about
    :data:`BAND_BYTES` of the result's rows, each made in memory of its own."""
    shape = permute_shape(value.shape, perm)
    dtype = np.dtype(value.dtype)
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    step = max(1, BAND_BYTES // max(1, row_bytes))
    blocks = _device_blocks(value)
    for row in range(0, shape[0], step):
        band = empty_array((min(step, shape[0] - row), *shape[1:]), dtype)
        _place(blocks, perm, band, row)
        yield band
