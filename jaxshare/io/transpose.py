"""Transposing copies: an array made C-ordered in a permuted axis order, fast.

A conversion between PyTorch's and Flax's axis orders transposes every Linear weight; a
plain ``np.ascontiguousarray(x.T)`` strides through memory at about 1.4 GB/s a
core here. :func:`contiguous_transpose` moves cache-sized tiles instead, on a few
threads for a large array, into pooled memory (:mod:`jaxshare.io.buffers`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from jaxshare.core.perm import Perm
from jaxshare.io.buffers import empty_array
from jaxshare.io.threads import worker_count

__all__ = ["PARALLEL_BYTES", "contiguous_transpose"]


#: Arrays at least this large are transposed on several threads.
PARALLEL_BYTES = 8 << 20
#: The tiles a transposing copy moves at a time, in elements: along the axis that
#: runs along the input's memory, and along the output's last axis.
_TILE = 256
_TILE_LAST = 512


def contiguous_transpose(
    x: np.ndarray, perm: Perm | None, *, out: np.ndarray | None = None, threads: bool = True
) -> np.ndarray:
    """A C-ordered numpy array holding ``x`` transposed by ``perm`` (``x`` itself,
    made C-ordered, for ``None``); or ``out`` filled instead: an array (or a view
    of one, e.g. a region of a larger array) of the transposed shape and ``x``'s
    dtype. ``threads=False``: on the calling thread alone (a caller that already
    runs such copies on several threads: more threads than cores only contend).

    A transposing copy done in one sweep reads memory with large strides and
    moves about 1.4 GB/s on a core here; so it moves tiles (:data:`_TILE` by
    :data:`_TILE_LAST` elements), each read and written within the caches
    (about 4 GB/s a core), and a large array is split in bands of the output's
    first axis over a few threads (numpy copies release the GIL).

    >>> x = np.arange(6).reshape(2, 3)
    >>> contiguous_transpose(x, (1, 0)).tolist()
    [[0, 3], [1, 4], [2, 5]]
    """
    view = x if perm is None else np.transpose(x, perm)
    if out is None:
        if perm is None:
            return np.ascontiguousarray(x)
        out = empty_array(view.shape, view.dtype)
    elif out.shape != view.shape or out.dtype != view.dtype:
        raise ValueError(
            f"`out` must be a {view.dtype} array of shape {view.shape}, got a {out.dtype} "
            f"array of shape {out.shape}."
        )
    if view.ndim == 0 or out.size == 0:
        out[...] = view
        return out
    whole, lead = out, 0
    while lead < view.ndim - 1 and view.shape[lead] == 1:  # (A layer of a stack: its bands.)
        lead += 1
    view, out = view[(0,) * lead], out[(0,) * lead]
    # The output axis that runs along the input's memory: where it is not the last,
    # a plain copy strides through memory, and tiles over the two keep it in cache.
    inner = int(np.argmin(np.abs(view.strides))) if view.ndim > 1 else 0
    tiled = inner != view.ndim - 1 and view.shape[inner] > 1 and view.shape[-1] > 1
    workers = worker_count()
    rows, cols = view.shape[0], view.shape[-1]
    if x.nbytes < PARALLEL_BYTES or workers < 2 or not threads:
        _copy_band(out, view, inner, 0, rows, tiled)
        return whole
    # More pieces than threads, so that they share the work evenly: bands of the
    # first axis (of whole tiles where the tiles run along it), and where those are
    # too few (a band of a transposed matrix's rows), split along the last axis too.
    step = -(-rows // (4 * workers))
    if tiled and inner == 0:
        step = -(-step // _TILE) * _TILE
    width = cols
    if -(-rows // step) < 2 * workers and tiled and inner == 0:
        width = -(-cols // (4 * workers))
        width = -(-width // _TILE_LAST) * _TILE_LAST
    pieces = [(lo, b) for lo in range(0, rows, step) for b in range(0, cols, width)]
    if len(pieces) < 2:
        _copy_band(out, view, inner, 0, rows, tiled)
        return whole

    def copy(piece: tuple[int, int]) -> None:
        lo, b = piece
        _copy_band(out, view, inner, lo, min(lo + step, rows), tiled, (b, min(b + width, cols)))

    with ThreadPoolExecutor(workers, thread_name_prefix="jaxshare-transpose") as pool:
        list(pool.map(copy, pieces))
    return whole


def _copy_band(
    out: np.ndarray,
    view: np.ndarray,
    inner: int,
    lo: int,
    hi: int,
    tiled: bool,
    cols: tuple[int, int] | None = None,
) -> None:
    """``out[lo:hi] = view[lo:hi]`` (along the first axis; ``cols``: only that
    range of the last); ``tiled``: in tiles over the axes ``inner`` and the last."""
    last = view.ndim - 1
    start, stop = cols if cols is not None else (0, view.shape[last])
    index: list[slice] = [slice(None)] * view.ndim
    index[0] = slice(lo, hi)
    if not tiled:
        if last:
            index[last] = slice(start, stop)
        where = tuple(index)
        out[where] = view[where]
        return
    first, end = (lo, hi) if inner == 0 else (0, view.shape[inner])
    for a in range(first, end, _TILE):
        index[inner] = slice(a, min(a + _TILE, end))
        for b in range(start, stop, _TILE_LAST):
            index[last] = slice(b, min(b + _TILE_LAST, stop))
            where = tuple(index)
            out[where] = view[where]
