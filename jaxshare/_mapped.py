"""Files mapped into memory, and where a view of one lies in its file.

Readers map their input files (:func:`map_file`) and hand out numpy views of the
pages, so reading costs no copy. A writer given such a view need not copy it
through memory either: :func:`copy_view` asks the kernel to copy the bytes from
the input file to the output file (``os.copy_file_range``), which neither
faults the mapped pages in nor touches them with the CPU. Where the kernel
cannot (another platform, a file system that refuses), it says so and the
writer writes the view as usual.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np

__all__ = ["FileRange", "copy_view", "file_extent", "map_file", "scattered_reads", "write_array"]

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
    m = data.base.obj if isinstance(data.base, memoryview) else data.base
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
    :class:`jaxshare._output.WriteBehind` 's ``wrote``, so the disk writes the
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
