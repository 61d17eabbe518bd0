"""Axis permutations: the one home of ``Perm`` and everything done with one.

A tie across a layout change (PyTorch ``lm_head.weight`` tied to ``wte.weight``
is Flax ``lm_head/kernel == wte/embedding.T``) carries an axis permutation, in
the convention of ``numpy.transpose``: ``out.shape[i] == x.shape[perm[i]]``.
The identity is always normalised to ``None``, so "no transform" has one
spelling. Nothing here imports JAX: ``jaxshare inspect`` of a file uses
permutations without paying for it, and a JAX array can only be handed in once
JAX is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from jaxshare._buffers import empty_array
from jaxshare._threads import worker_count

__all__ = [
    "Perm",
    "as_perm",
    "compose",
    "contiguous_transpose",
    "inverse",
    "permute_shape",
    "transpose",
]

Perm = tuple[int, ...]


def as_perm(value: Any, what: str = "permutation") -> Perm | None:
    """Validates a permutation given as any sequence of ints; the identity is ``None``.

    Raises:
      TypeError: ``value`` is not a sequence.
      ValueError: ``value`` is not a permutation of ``0..n-1``.

    >>> as_perm([1, 0]), as_perm((0, 1)), as_perm(None)
    ((1, 0), None, None)
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{what} must be a sequence of axis indices, got {type(value).__name__}: {value!r}"
        )
    perm = tuple(value)
    if any(type(i) is not int for i in perm) or sorted(perm) != list(range(len(perm))):
        raise ValueError(
            f"{what} must be a permutation of 0..n-1 (as for `numpy.transpose`), "
            f"got {list(value)!r}."
        )
    return None if perm == tuple(range(len(perm))) else perm


def compose(outer: Perm | None, inner: Perm | None, where: str = "") -> Perm | None:
    """The permutation of ``transpose(transpose(x, inner), outer)`` as one transpose.

    Raises:
      ValueError: the two permute a different number of axes; ``where`` is
        appended to the message.

    >>> compose((1, 0), (1, 0)) is None
    True
    >>> compose((2, 0, 1), None)
    (2, 0, 1)
    """
    if outer is None:
        return inner
    if inner is None:
        return outer
    if len(outer) != len(inner):
        raise ValueError(
            f"cannot compose transforms {list(outer)} and {list(inner)}{where}: they "
            "permute a different number of axes."
        )
    perm = tuple(inner[i] for i in outer)
    return None if perm == tuple(range(len(perm))) else perm


def inverse(perm: Perm | None) -> Perm | None:
    """The permutation that undoes ``perm``.

    >>> inverse((2, 0, 1)), inverse(None)
    ((1, 2, 0), None)
    """
    if perm is None:
        return None
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def permute_shape(shape: Sequence[int], perm: Perm | None) -> tuple[int, ...]:
    """``shape`` after ``transpose(perm)``.

    Raises:
      ValueError: ``perm`` permutes another number of axes than ``shape`` has.

    >>> permute_shape((2, 3, 5), (2, 0, 1))
    (5, 2, 3)
    """
    if perm is None:
        return tuple(shape)
    if len(perm) != len(shape):
        raise ValueError(
            f"transform {list(perm)} permutes {len(perm)} axes, but the shape "
            f"{tuple(shape)} has {len(shape)}."
        )
    return tuple(shape[i] for i in perm)


def transpose(x: Any, perm: Perm | None, where: str = "the array") -> Any:
    """``x`` transposed by ``perm``: a numpy or JAX array, or a ``jax.ShapeDtypeStruct``
    (a restore target; permuted abstractly, its sharding dropped, as it does not
    carry over to the transposed layout).

    Raises:
      TypeError: ``x`` is not an array.
      ValueError: ``perm`` does not fit ``x``'s rank; messages start with ``where``
        (e.g. ``"alias 'lm_head/kernel'"``).

    >>> import numpy as np
    >>> transpose(np.zeros((2, 3)), (1, 0)).shape
    (3, 2)
    """
    if perm is None:
        return x
    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        raise TypeError(
            f"{where} has transform {list(perm)}, which applies to arrays; its "
            f"canonical is a {type(x).__name__}."
        )
    try:
        new_shape = permute_shape(shape, perm)
    except ValueError:
        raise ValueError(
            f"{where} has transform {list(perm)} for {len(perm)} axes, but its "
            f"canonical has shape {tuple(shape)}."
        ) from None
    if isinstance(x, np.ndarray):
        return np.transpose(x, perm)
    jax = sys.modules.get("jax")  # A JAX value means JAX is imported already.
    if jax is not None and isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(new_shape, x.dtype)
    if jax is not None and isinstance(x, jax.Array):
        return jax.numpy.transpose(x, perm)
    raise TypeError(
        f"{where} has transform {list(perm)}, which applies to arrays; its "
        f"canonical is a {type(x).__name__}."
    )


#: Arrays at least this large are transposed on several threads.
_PARALLEL_BYTES = 8 << 20
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
    # The output axis that runs along the input's memory: where it is not the last,
    # a plain copy strides through memory, and tiles over the two keep it in cache.
    inner = int(np.argmin(np.abs(view.strides))) if view.ndim > 1 else 0
    tiled = inner != view.ndim - 1 and view.shape[inner] > 1 and view.shape[-1] > 1
    workers = worker_count()
    rows, cols = view.shape[0], view.shape[-1]
    if x.nbytes < _PARALLEL_BYTES or workers < 2 or not threads:
        _copy_band(out, view, inner, 0, rows, tiled)
        return out
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
        return out

    def copy(piece: tuple[int, int]) -> None:
        lo, b = piece
        _copy_band(out, view, inner, lo, min(lo + step, rows), tiled, (b, min(b + width, cols)))

    with ThreadPoolExecutor(workers, thread_name_prefix="jaxshare-transpose") as pool:
        list(pool.map(copy, pieces))
    return out


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
