"""Files mapped into memory, and where a view of one lies in its file.

Readers map their input files (:func:`map_file`) and hand out numpy views of the
pages, so reading costs no copy. A writer given such a view need not copy it
through memory either: :func:`copy_view` asks the kernel to copy the bytes from
the input file to the output file (``os.copy_file_range``), which neither
faults the mapped pages in nor touches them with the CPU. Where the kernel
cannot (another platform, a file system that refuses), it says so and the
writer writes the view as usual.

A view the CPU is about to read whole (to transpose it, cast it, compress it)
whose pages are not in the page cache is read another way: :func:`read_direct`
reads its bytes from the disk straight into memory of the process's own, past
the page cache (``O_DIRECT``). On this project's machines (a virtual machine
whose freed memory its host takes back, ``virtio_balloon`` 's free page
reporting) the first touch of a page the kernel has just read into its cache
cost 1.2 us, against 0.15 us for a page already there and 0.02 us for the
process's own reused memory after a direct read: a cold 8 GB ``.safetensors``
file went to an Orbax item in 13.0-13.8 s with 17-19 s of CPU (its transposes
10.8-11.7 s, against 5.1 s from a warm file), and in 10.4-10.6 s with 12.8 s of
CPU read directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import numpy as np

from jaxshare.io.buffers import empty_array, lined_up

__all__ = [
    "DIRECT_BYTES",
    "FileRange",
    "copy_view",
    "file_extent",
    "map_file",
    "read_direct",
    "resident",
    "scattered_reads",
    "write_array",
]

#: A range of a file: ``(path, offset, length)``.
FileRange = tuple[str, int, int]

#: id(mmap) -> (first address, length, the open file it maps, the map weakly), while
#: the map lives. There is no lock: the collector can free a map, and run
#: :func:`_forget`, inside any code that allocates -- this module's own among it, on
#: the thread that already held a lock (a deadlock, seen in a test run). So the
#: registry changes by one dict operation at a time, and lookups read a copy.
_MAPS: dict[int, tuple[int, int, BinaryIO, weakref.ref[mmap.mmap]]] = {}


def map_file(path: str | os.PathLike, *, private: bool = False) -> np.ndarray:
    """A ``uint8`` array over the whole file, mapped, not read.

    By default the array is read-only and its views are the file's pages, which
    :func:`copy_view` copies file to file. With ``private``, it is writable and
    copy-on-write: a write changes this process's copy only (never the file), as
    ``torch.load(mmap=True)`` maps; such views are never copied file to file,
    since they may differ from the file. The file stays open (the same file,
    even if ``path`` is replaced) while any view of it lives.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(b"abc")
    >>> bytes(map_file(path)[1:])
    b'bc'
    """
    f = open(path, "rb")  # noqa: SIM115 -- kept open while the map lives
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        f.close()
        return np.empty(0, np.uint8)
    access = mmap.ACCESS_COPY if private else mmap.ACCESS_READ
    m = mmap.mmap(f.fileno(), 0, access=access)
    array = np.frombuffer(m, np.uint8)
    if private:
        f.close()  # (The map keeps the file's pages; nothing copies from the file.)
        return array
    key = id(m)
    _MAPS[key] = (array.ctypes.data, size, f, weakref.ref(m))
    weakref.finalize(m, _forget, key)
    return array


@contextlib.contextmanager
def scattered_reads(data: np.ndarray) -> Iterator[None]:
    """While in it, a page of ``data`` (an array :func:`map_file` made) read from
    the disk is read alone, not with the kernel's read-around: for reading small
    pieces scattered through a large file (a zip archive's local headers).

    A fault on a mapped file's page not in the page cache reads the pages around
    it as well: ``read_ahead_kb`` of them, 8 MiB on this project's machines. A
    ``torch.save`` archive of an 8 GB model holds 570 records, each with a header
    before its bytes: reading them through the map read 4.5 GB, one fault at a
    time, in 2.1 s before the first tensor was converted (and ``jaxshare inspect``
    of it took 3.0-3.2 s, now 0.33 s). Here (``MADV_RANDOM``) each reads its page.
    Any other array: nothing to do.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(b"abc")
    >>> data = map_file(path)
    >>> with scattered_reads(data):
    ...     bytes(data[1:])
    b'bc'
    """
    base = data.base
    while isinstance(base, np.ndarray):  # (A view of a view of the map.)
        base = base.base
    m = base.obj if isinstance(base, memoryview) else base
    if not isinstance(m, mmap.mmap) or not hasattr(mmap, "MADV_RANDOM"):
        yield
        return
    m.madvise(mmap.MADV_RANDOM)
    try:
        yield
    finally:
        m.madvise(mmap.MADV_NORMAL)


def _forget(key: int) -> None:
    """A map's finalizer: its entry goes, and its file is closed."""
    entry = _MAPS.pop(key, None)
    if entry is not None:
        entry[2].close()


def _mapped_at(view: np.ndarray) -> tuple[BinaryIO, int] | None:
    """The open file a C-contiguous view of a mapped file lies in, and its offset
    there; ``None`` for any other array."""
    if not view.flags.c_contiguous or not view.nbytes:
        return None
    address = view.ctypes.data
    for start, length, f, m in tuple(_MAPS.values()):
        # (A map being freed is unmapped before its entry goes: `m()` is then None,
        # and its addresses may already hold another map.)
        if start <= address and address + view.nbytes <= start + length and m() is not None:
            return f, address - start
    return None


def _file_range(view: np.ndarray) -> tuple[int, int] | None:
    """``(fd, offset)`` of a C-contiguous view of a mapped file, else ``None``."""
    found = _mapped_at(view)
    return None if found is None else (found[0].fileno(), found[1])


def file_extent(view: np.ndarray) -> FileRange | None:
    """Where a view of a file :func:`map_file` mapped lies: ``(path, offset,
    length)``; ``None`` for an array in memory (or a copy-on-write map's).

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(b"abcdef")
    >>> file_extent(map_file(path)[2:5])[1:], file_extent(np.zeros(3))
    ((2, 3), None)
    """
    found = _mapped_at(view)
    return None if found is None else (os.fspath(found[0].name), found[1], view.nbytes)


def copy_view(view: np.ndarray, out: BinaryIO) -> bool:
    """Writes ``view`` to ``out`` at its position by copying file to file, when
    ``view`` lies in a file :func:`map_file` mapped and the kernel can copy;
    returns whether it did (else nothing is written).

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "in").write_bytes(b"0123456789")
    >>> with open(d / "out", "wb") as out:
    ...     _ = out.write(b">")
    ...     _ = copy_view(map_file(d / "in")[2:5], out) or out.write(b"234")
    ...     _ = out.write(b"<")
    >>> (d / "out").read_bytes()
    b'>234<'
    """
    found = _file_range(view)
    copy = getattr(os, "copy_file_range", None)
    if found is None or copy is None:
        return False
    fd, offset = found
    out.flush()
    start = out.tell()
    done = 0
    try:
        while done < view.nbytes:
            n = copy(fd, out.fileno(), view.nbytes - done, offset + done, start + done)
            if n == 0:  # The input is shorter than its map: cannot be.
                raise OSError("copy_file_range copied nothing")
            done += n
    except OSError:
        if done:  # Part copied: write the rest from memory, where the kernel stopped.
            out.seek(start + done)
            out.write(view.reshape(-1).view(np.uint8)[done:].data)
            return True
        return False
    out.seek(start + done)
    return True


#: Views at least this large are read past the page cache where it lacks them
#: (:func:`read_direct`); smaller ones are read ahead through it.
DIRECT_BYTES = 2**20
#: The bytes one direct read asks for, and how many such reads are in flight at
#: once for one view (the disk's reads and writes, cold, came at 1.3 GB/s
#: together with one read of 16 MiB in flight per reading thread, 1.5 GB/s read
#: ahead through the cache).
_DIRECT_STEP = 8 * 2**20
_DIRECT_CALLS = 4
#: The alignment direct reads keep (offsets, lengths, addresses): a page.
_ALIGN = mmap.PAGESIZE


def read_direct(view: np.ndarray) -> np.ndarray:
    """``view``'s values, read from the disk into memory of the process's own
    (``O_DIRECT``, :data:`_DIRECT_STEP` bytes a call, :data:`_DIRECT_CALLS` at
    once) where ``view`` is a C-contiguous view of at least
    :data:`DIRECT_BYTES` of a file :func:`map_file` mapped and fewer than half
    of its pages are in the page cache (see the module's docstring); else
    ``view`` itself.

    The copy is an :func:`~jaxshare.io.buffers.empty_array` (pooled while a
    conversion streams) of ``view``'s shape and dtype; the page cache is left
    as it was. Where the kernel refuses (no ``O_DIRECT`` on the platform or
    the file system, no ``mincore``), ``view`` is returned: it reads the same
    values through the map.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(np.arange(2**19, dtype=np.float32).tobytes())
    >>> view = map_file(path)[4:].view(np.float32)
    >>> np.array_equal(read_direct(view), view)
    True
    """
    if view.nbytes < DIRECT_BYTES or not hasattr(os, "O_DIRECT"):
        return view
    found = _mapped_at(view)
    if found is None or resident(view):
        return view
    f, offset = found
    start = offset - offset % _ALIGN
    end = offset + view.nbytes
    with lined_up(0):  # (Page-aligned, as direct reads want.)
        buffer = empty_array((-(-(end - start) // _ALIGN) * _ALIGN,), np.dtype(np.uint8))
    memory = memoryview(buffer)  # type: ignore[arg-type]  # (a uint8 array)
    try:  # (The same file as the map's, even if its path now names another.)
        fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return view

    def read(at: int) -> bool:
        """Bytes ``at..at + _DIRECT_STEP`` of the buffer read; whether all came."""
        stop = min(at + _DIRECT_STEP, end - start)
        while at < stop:
            n = os.preadv(fd, [memory[at : -(-stop // _ALIGN) * _ALIGN]], start + at)
            if n <= 0:  # The file is shorter than its map.
                return False
            at += n
        return True

    try:
        steps = range(0, end - start, _DIRECT_STEP)
        if len(steps) == 1:
            complete = read(0)
        else:
            with ThreadPoolExecutor(min(_DIRECT_CALLS, len(steps))) as pool:
                complete = all(pool.map(read, steps))
    except OSError:  # A file system that takes no direct reads.
        complete = False
    finally:
        os.close(fd)
    if not complete:  # The map reads the same values.
        return view
    skip = offset - start
    return buffer[skip : skip + view.nbytes].view(view.dtype).reshape(view.shape)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once; ``None`` where there is none to ask."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def resident(view: np.ndarray) -> bool:
    """Whether at least half of ``view``'s pages are in the page cache (``mincore``;
    ``True`` where it cannot say)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mincore"):
        return True
    first = view.ctypes.data - view.ctypes.data % _ALIGN
    length = -(-(view.ctypes.data + view.nbytes - first) // _ALIGN) * _ALIGN
    pages = np.zeros(length // _ALIGN, np.uint8)
    vector = pages.ctypes.data_as(ctypes.c_void_p)
    if libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(length), vector):
        return True
    return 2 * int(np.count_nonzero(pages & 1)) >= pages.size


#: Bytes :func:`write_array` writes between two calls of its ``after``.
WRITE_STEP = 32 * 2**20


def write_array(
    data: np.ndarray,
    out: BinaryIO,
    after: Callable[[], None] | None = None,
    *,
    step: int = WRITE_STEP,
) -> None:
    """Writes the bytes of a C-contiguous array at ``out``'s position, ``step``
    bytes at a time -- copied file to file where they lie in a mapped file
    (:func:`copy_view`) -- and calls ``after()`` after each step (a
    :class:`jaxshare.io.output_file.WriteBehind` 's ``wrote``, so the disk writes the
    first steps while the last are copied).

    >>> import io
    >>> out = io.BytesIO()
    >>> steps = []
    >>> write_array(np.arange(4, dtype=np.uint8), out, lambda: steps.append(out.tell()), step=3)
    >>> out.getvalue(), steps
    (b'\\x00\\x01\\x02\\x03', [3, 4])
    """
    raw = data.reshape(-1).view(np.uint8)
    for start in range(0, raw.size, step):
        piece = raw[start : start + step]
        if not copy_view(piece, out):
            out.write(piece.data)
        if after is not None:
            after()
