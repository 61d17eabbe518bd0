"""Large arrays in memory of their own, kept hot for the next while a conversion
streams.

A conversion makes an array per tensor (read, decoded, transposed), writes it and
frees it. Memory the kernel hands a process fresh costs it a page fault and the
page's zeroing on first touch -- on this project's machines about a quarter of
the CPU of reading an Orbax item into a ``.safetensors`` file. So while a
conversion streams (:func:`pooled`), an array freed gives its memory back to a
pool, and the next array of that size (or up to half of it) takes it, its pages
resident and already mapped; at most :data:`POOL_BYTES` of them wait there, and
the pool is emptied once no conversion streams. A model's layers repeat a few
sizes, and the pool holds about a layer's worth: with 64 MiB, a 2.8 GB model
went to Orbax with 1.0-1.2 GB of its arrays in fresh memory; with 128 MiB, 48 MB.

An array from :func:`empty_array` is an ordinary numpy array over a mapping of
its own; its memory goes back when the array and every view of it are gone,
never before. It is not asked for in huge pages, as numpy asks for its own large
arrays (``MADV_HUGEPAGE``): a huge page is freed whole, and a virtual machine
that hands free memory back to its host (``virtio_balloon``'s free page
reporting, as on this project's machines) gives the next one to a process
fresh from the host. 321 MiB first touched in a new process took 0.05-0.82 s
in huge pages here (0.38 and 0.82 s in two runs of four) and 0.13-0.16 s in
pages of 4 KiB; reading a 2.8 GB Orbax item into a ``.safetensors`` file (its
tied head written out transposed) took 1.5 s of system CPU, and 0.5-0.7 s once
its arrays were in pages of 4 KiB.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import threading
import weakref
from collections.abc import Iterator

import numpy as np

__all__ = ["POOL_BYTES", "empty_array", "lined_up", "pooled"]

#: Arrays at least this large get a mapping of their own (smaller ones: numpy's heap).
MAP_BYTES = 2**20
#: The most bytes of freed arrays kept for reuse while conversions stream.
POOL_BYTES = 128 * 2**20

_LOCK = threading.Lock()
_FREE: dict[int, list[mmap.mmap]] = {}  # size: freed mappings of that size
_STATE = {"free": 0, "scopes": 0}  # bytes in _FREE; conversions streaming
_HOLDER: list[int | None] = [None]  # the thread holding _LOCK (in `_locked`)
_PLACE = threading.local()  # .skew: where in its page this thread's next arrays start


@contextlib.contextmanager
def lined_up(offset: int) -> Iterator[None]:
    """While in it, the large arrays :func:`empty_array` makes on this thread start
    as far into a page as ``offset`` lies into one (where their dtype allows it):
    an output that will hold one at ``offset`` writes it from where it lies, not
    copied (:meth:`jaxshare.io.output_file.OutputFile.gap`).

    >>> with lined_up(4096 + 24):
    ...     a = empty_array((2**20,), np.dtype(np.float32))
    >>> a.ctypes.data % mmap.PAGESIZE
    24
    """
    before = getattr(_PLACE, "skew", None)
    _PLACE.skew = offset % mmap.PAGESIZE
    try:
        yield
    finally:
        _PLACE.skew = before


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with _LOCK:
        _HOLDER[0] = threading.get_ident()
        try:
            yield
        finally:
            _HOLDER[0] = None


def empty_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array; a large one in a mapping of its own, taken from the
    pool while a conversion streams (see the module's docstring).

    >>> with pooled():
    ...     a = empty_array((1024, 1024), np.dtype(np.float32))
    ...     address = a.ctypes.data
    ...     del a
    ...     b = empty_array((1024, 1024), np.dtype(np.float32))
    ...     b.ctypes.data == address
    True
    """
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes < MAP_BYTES:
        return np.empty(shape, dtype)
    skew = getattr(_PLACE, "skew", None)
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    if skew is not None:  # A page more, whatever the skew: one size for a tensor's arrays.
        size += mmap.PAGESIZE
        skew = 0 if skew % dtype.alignment else skew
    memory = None
    with _locked():  # The smallest waiting that holds it, at most twice its size.
        fits = [n for n, free in _FREE.items() if size <= n <= 2 * size and free]
        if fits:
            size = min(fits)
            memory = _FREE[size].pop()
            _STATE["free"] -= size
    if memory is None:  # In pages of 4 KiB: not huge pages (see the module's docstring).
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block = (ctypes.c_char * size).from_buffer(memory)
    # Once the array and its views are gone (they hold `block`), its memory is free.
    weakref.finalize(block, _give_back, memory, size)
    return np.frombuffer(block, dtype, count=count, offset=skew or 0).reshape(shape)  # type: ignore[call-overload]


def _give_back(memory: mmap.mmap, size: int) -> None:
    """Keeps ``memory`` for the next array of its size, if the pool takes it; else
    it is unmapped once its last view is gone (this runs while that view still
    holds it).

    A finalizer: the collector may run it inside any code that allocates, this
    module's own among it, on the thread that holds the lock already -- where it
    would wait for itself. There, the memory is unmapped, not kept.
    """
    if _HOLDER[0] == threading.get_ident():
        return
    with _locked():
        if _STATE["scopes"] and _STATE["free"] + size <= POOL_BYTES:
            _FREE.setdefault(size, []).append(memory)
            _STATE["free"] += size


@contextlib.contextmanager
def pooled() -> Iterator[None]:
    """While in it (in any thread), freed arrays of :func:`empty_array` wait for the
    next of their size; when the last such block ends, the waiting ones are given
    back to the operating system."""
    with _locked():
        _STATE["scopes"] += 1
    try:
        yield
    finally:
        with _locked():
            _STATE["scopes"] -= 1
            if not _STATE["scopes"]:  # (Unmapped as they are dropped: no view is left.)
                _FREE.clear()
                _STATE["free"] = 0
