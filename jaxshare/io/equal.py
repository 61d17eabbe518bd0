"""Bit equality of two arrays, the one test every tie by content and every
comparison of a conversion's result relies on.

A NaN equals itself and ``-0.0`` is not ``0.0``: the bytes are compared, never
the values. Large arrays are compared in blocks on a few threads (numpy lets go
of the GIL, and the page faults of mapped files overlap too), as 8-byte words
where they divide, stopping at the first block that differs; no temporary the
size of the arrays is made (``np.array_equal`` of two 300 MB tensors made a
300 MB one, every page of it fresh).
"""

from __future__ import annotations

import numpy as np

from jaxshare.io.threads import parallel_map, worker_count

__all__ = ["same_bytes", "words"]

#: Bytes compared at a time, at most.
BLOCK_BYTES = 16 * 2**20


def same_bytes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether ``x`` and ``y`` have one shape and dtype and hold the same bytes.

    >>> a = np.array([0.0, np.nan])
    >>> same_bytes(a, a.copy()), same_bytes(a, np.array([-0.0, np.nan]))
    (True, False)
    """
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    bx, by = (words(v) for v in (x, y))
    step = max(1, min(BLOCK_BYTES, -(-bx.nbytes // (4 * worker_count()))) // bx.itemsize)
    parts = [(start, start + step) for start in range(0, bx.size, step)]
    return all(
        parallel_map(lambda p: bool(np.array_equal(bx[p[0] : p[1]], by[p[0] : p[1]])), parts)
    )


def words(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` as 8-byte words where they divide (fewer, wider compares)."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return flat.view(np.uint64) if flat.size % 8 == 0 else flat
