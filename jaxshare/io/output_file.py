"""The files of an output, handed to the disk while they are written.

A large output is written without the page cache (:class:`OutputFile`,
``O_DIRECT``: arrays gathered from where they lie, through staging buffers lined
up with the file's blocks) or leaving it once on disk (:class:`WriteBehind`,
where a file system refuses ``O_DIRECT``, and for the DCP writer's records), so a
conversion of a model larger than memory neither evicts its own input nor waits
on a flood of dirty pages at the end. Each file lies inside an output that
:func:`jaxshare.io.atomic.atomic_output` commits by a rename.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from jaxshare.io.mapped import write_array

__all__ = ["DIRECT_STEP", "LEND_BYTES", "OutputFile", "WriteBehind"]


#: Bytes a sequential writer hands to the disk at a time (:class:`WriteBehind`).
WRITE_BEHIND_STEP = 32 * 2**20
#: Steps in flight before the writer waits for the oldest to reach the disk.
WRITE_BEHIND_LAG = 2

# sync_file_range(2)'s flags.
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` through ctypes (Python's ``os`` lacks it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()


def _drop(fd: int, offset: int, length: int) -> None:
    """``POSIX_FADV_DONTNEED`` of a range: its clean pages leave the page cache and
    its dirty ones start their write-back. Advice only: never a reason to fail."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class WriteBehind:
    """Keeps a file flowing to disk as a sequential writer fills it.

    Written through the page cache and ``fsync`` ed at the end, a large output
    reaches the disk only in the kernel's time, and its pages crowd out
    everything else in memory meanwhile: here, writing 3 GB that way took 4-10 s
    where the same bytes handed to the disk as they came took 1.2-2.2 s. So each
    :data:`WRITE_BEHIND_STEP` bytes written start their write-back at once
    (``sync_file_range``), and once :data:`WRITE_BEHIND_LAG` steps are in flight
    the writer waits for the oldest to be on disk and drops its pages: the disk
    always has work, the writer holds at most a few steps of dirty pages, and
    the ``fsync`` before the rename has little left to do. Where
    ``sync_file_range`` is missing, ``posix_fadvise`` starts the write-back and
    drops the pages a lag later, without waiting; elsewhere it does nothing.

    Args:
      f: the file being written from its start, position at its end (its
        buffered writes are flushed before each step is handed on).

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     behind = WriteBehind(f)
    ...     for _ in range(3):
    ...         _ = f.write(b"x" * 1000)
    ...         behind.wrote()
    ...     behind.close()
    ...     f.tell()
    3000
    """

    def __init__(self, f: BinaryIO, *, step: int = WRITE_BEHIND_STEP) -> None:
        self._f = f
        self._step = step
        self._handed = f.tell()  # Bytes from here on are not yet handed to the disk.
        self._flight: deque[tuple[int, int]] = deque()

    def wrote(self) -> None:
        """Called after each write: hands the bytes since the last step to the
        disk once there are a step's worth."""
        end = self._f.tell()
        if end - self._handed < self._step:
            return
        self._f.flush()
        fd = self._f.fileno()
        offset, length = self._handed, end - self._handed
        if _SYNC_FILE_RANGE is not None:
            _SYNC_FILE_RANGE(fd, offset, length, _WRITE)
        else:
            _drop(fd, offset, length)
        self._flight.append((offset, length))
        self._handed = end
        while len(self._flight) > WRITE_BEHIND_LAG:
            old, size = self._flight.popleft()
            if _SYNC_FILE_RANGE is not None:
                _SYNC_FILE_RANGE(fd, old, size, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            _drop(fd, old, size)

    def close(self) -> None:
        """``fsync`` s the file (wherever its position now is); its pages then
        leave the page cache."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._flight.clear()
        _drop(self._f.fileno(), 0, 0)


#: The staging buffers of :class:`OutputFile`: their size, how many, and the
#: threads writing them (the writes in flight). A write is of about
#: :data:`DIRECT_STEP` bytes too, gathered from staging buffers and kept arrays.
DIRECT_STEP = 32 * 2**20
DIRECT_BUFFERS = 3
DIRECT_WRITERS = 2
#: The smallest array written from where it lies, not copied (``kept``).
LEND_BYTES = 2**20
# What O_DIRECT asks of a write's offset, length and memory (a logical block; any
# file system's is at most a page).
_ALIGN = 4096


class _Staging:
    """A staging buffer: its memory, and the writes in flight that hold part of it."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, DIRECT_STEP)
        self.holders = 0
        self.full = False  # Filled to its end: free again once no write holds it.


class OutputFile:
    """A new file written from its start to its end, on the disk when closed.

    The bytes bypass the page cache (``O_DIRECT``): each write is copied into one
    of :data:`DIRECT_BUFFERS` staging buffers of :data:`DIRECT_STEP` bytes, kept
    hot, and :data:`DIRECT_WRITERS` threads hand them to the disk, about
    :data:`DIRECT_STEP` bytes a write, while the next fill, so the disk always
    has work and the kernel neither copies the bytes again nor keeps them.
    Through the page cache, the kernel's copy of 2.8 GB took about a second of
    CPU here, on top of the writer's own. Two writes of 32 MiB in flight wrote 3
    GB in 1.42-1.53 s here where one of 8 MiB took 1.79-1.93 s (and ``dd bs=16M
    oflag=direct`` 2.1-2.8 s). Where a file system refuses ``O_DIRECT``, the file
    is written through the page cache and handed on as it is written
    (:class:`WriteBehind`).

    An array its writer will not change again (``write_array(data, kept=True)``)
    whose address lies as far into a page as the file's end lies into a block
    (:meth:`gap` says how far to move the end) is not copied: its whole blocks
    are written from where they lie, gathered into one write with the staged
    bytes around them (``pwritev``), and only its first and last partial blocks
    are staged. Copying 2.8 GB into the buffers took 0.5 s of CPU here; small
    writes of their own took 7 ms each, behind the large ones.

    Args:
      path: the file to create (or truncate).

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> with OutputFile(path) as out:
    ...     out.write(b"header..")
    ...     out.write_array(np.arange(3, dtype=np.uint8))
    ...     out.patch(6, b"!!")
    >>> path.read_bytes()
    b'header!!\\x00\\x01\\x02'
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._size = 0  # Bytes written.
        self._patches: list[tuple[int, bytes]] = []
        self._file: BinaryIO | None = None
        self._behind: WriteBehind | None = None
        self._fd = -1
        direct = getattr(os, "O_DIRECT", 0)
        if direct:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if self._fd < 0:  # No O_DIRECT here: through the page cache.
            self._file = open(self.path, "wb")  # noqa: SIM115 -- closed by close()
            self._behind = WriteBehind(self._file)
            return
        self._free = [_Staging() for _ in range(DIRECT_BUFFERS)]
        self._buffer = self._free.pop()
        # The current buffer's bytes [_cut, _filled) are the file's from _open on, not
        # yet in a write; those before _cut are in one.
        self._cut = self._filled = self._open = 0
        # The next write: its parts (memory and the staging buffer it lies in, if
        # any), in the file's order from _gathered on.
        self._parts: list[tuple[memoryview, _Staging | None]] = []
        self._gathered = self._batched = 0  # (_batched: the bytes of _parts.)
        self._writes = 0  # Writes handed on and not yet done.
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._pending: deque[tuple[list[tuple[memoryview, _Staging | None]], int] | None] = deque()
        self._threads = [
            threading.Thread(target=self._run, name="jaxshare-write", daemon=True)
            for _ in range(DIRECT_WRITERS)
        ]
        for thread in self._threads:
            thread.start()

    def tell(self) -> int:
        """The bytes written so far (where the next write goes)."""
        return self._size

    def write(self, data: bytes | memoryview) -> None:
        """Appends ``data``."""
        if self._file is not None:
            self._file.write(data)
            assert self._behind is not None
            self._behind.wrote()
        else:
            self._append(memoryview(data).cast("B"))
        self._size += len(data) if isinstance(data, bytes) else memoryview(data).nbytes

    def write_array(self, data: np.ndarray, *, kept: bool = False) -> None:
        """Appends the bytes of a C-contiguous array (through the page cache: file to
        file where they lie in a mapped file, :func:`jaxshare.io.mapped.write_array`).

        ``kept``: the caller never changes ``data``'s memory again (it may let go of
        the array at once). Its whole blocks are then written from where they lie
        where they line up with the file's (:meth:`gap` is 0), not copied."""
        if self._file is not None:
            assert self._behind is not None
            write_array(data, self._file, self._behind.wrote)
        else:
            view = data.reshape(-1).view(np.uint8)
            if kept and data.nbytes >= LEND_BYTES and self.gap(data) == 0:
                self._lend(view)
            else:
                self._append(view.data)
        self._size += data.nbytes

    def gap(self, data: np.ndarray) -> int:
        """How many bytes to write before ``data`` so that it is written without a
        copy (``write_array(data, kept=True)``): from the file's end to the next
        offset that lies as far into a block as ``data``'s address lies into a page;
        0 where this file is written through the page cache."""
        if self._file is not None:
            return 0
        return (data.__array_interface__["data"][0] - self._size) % _ALIGN

    def patch(self, offset: int, data: bytes) -> None:
        """Puts ``data`` at ``offset`` in place of bytes already written (a header's
        stand-ins); on disk when the file is closed."""
        if offset + len(data) > self._size:
            raise ValueError(f"{self.path}: a patch past the bytes written ({offset}).")
        if self._file is not None:
            self._file.seek(offset)
            self._file.write(data)
            self._file.seek(self._size)
        else:  # Bytes in a write already: after close; the rest in the current buffer.
            split = min(len(data), max(0, self._open - offset))
            if split:
                self._patches.append((offset, data[:split]))
            if split < len(data):  # (Split: a later patch over these bytes wins either way.)
                start = self._cut + offset + split - self._open
                self._buffer.memory[start : start + len(data) - split] = data[split:]

    def close(self) -> None:
        """Writes what is left, then ``fsync`` s: the file is on disk, whole."""
        if self._file is not None:
            assert self._behind is not None
            try:
                self._behind.close()
            finally:
                self._file.close()
            return
        try:
            # The last bytes, to a whole block; the file is cut to size after.
            self._filled = min(DIRECT_STEP, -(-self._filled // _ALIGN) * _ALIGN)
            self._seal()
            self._hand_on()
            self._stop()
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        if self._patches:  # Written through the page cache, over the blocks on disk.
            fd = os.open(self.path, os.O_WRONLY)
            try:
                for offset, data in self._patches:
                    os.pwrite(fd, data, offset)
                os.fsync(fd)
            finally:
                os.close(fd)

    def abort(self) -> None:
        """Stops writing (the file is left as it is, for its caller to remove)."""
        if self._file is not None:
            self._file.close()
            return
        if self._fd < 0:
            return
        with contextlib.suppress(BaseException):
            self._stop()
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _append(self, view: memoryview) -> None:
        """Copies ``view`` into the staging buffers, the next taken as each fills."""
        data = np.frombuffer(view, np.uint8)
        while len(data):
            n = min(len(data), DIRECT_STEP - self._filled)
            # (A numpy copy: it lets go of the GIL, where a map's slice assignment holds it.)
            np.frombuffer(self._buffer.memory, np.uint8)[self._filled : self._filled + n] = data[:n]
            self._filled += n
            data = data[n:]
            if self._filled == DIRECT_STEP:
                self._seal(full=True)
                self._hand_on()  # (No write waiting to be handed on holds a full buffer.)
                self._buffer = self._take()
                self._cut = self._filled = 0

    def _lend(self, view: np.ndarray) -> None:
        """Appends ``view`` (``uint8``, lined up with the file's blocks): its first
        partial block staged, its whole blocks gathered where they lie into the
        writes, its last partial block staged."""
        head = -self._size % _ALIGN  # (The file's end: `_size` counts `view` after this.)
        self._append(view[:head].data)
        self._seal()
        end = head + (len(view) - head) // _ALIGN * _ALIGN
        start = head
        while start < end:  # In writes of DIRECT_STEP (the disk's best, and memory held).
            stop = min(end, start + DIRECT_STEP - self._batched)
            self._gather(view[start:stop].data, None)
            start = stop
        self._open += end - head
        self._append(view[end:].data)

    def _seal(self, *, full: bool = False) -> None:
        """Puts the current buffer's bytes not yet in a write (whole blocks, but at
        the file's end) into the next; ``full``: the buffer is filled to its end,
        and goes back to the free once the writes that hold it are done."""
        buffer = self._buffer
        if self._filled > self._cut:
            part = memoryview(buffer.memory)[self._cut : self._filled]
            self._open += self._filled - self._cut
            self._cut = self._filled
            with self._cond:  # (With the flag: a write done now sees both.)
                buffer.holders += 1
                buffer.full = full
            self._gather(part, buffer)
        elif full:
            with self._cond:
                buffer.full = True
                if not buffer.holders:
                    self._free.append(buffer)
                    self._cond.notify_all()

    def _gather(self, part: memoryview, staging: _Staging | None) -> None:
        """Adds ``part`` (of ``staging``, which counts it among its holders) to
        the next write, handing that on once it holds :data:`DIRECT_STEP` bytes."""
        self._parts.append((part, staging))
        self._batched += part.nbytes
        if self._batched >= DIRECT_STEP:
            self._hand_on()

    def _hand_on(self) -> None:
        """Hands the next write to the writing threads, waiting while each of them
        has one."""
        if not self._parts:
            return
        parts, offset = self._parts, self._gathered
        self._parts = []
        self._gathered += self._batched
        self._batched = 0
        with self._cond:
            while self._writes >= DIRECT_WRITERS and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            self._writes += 1
            self._pending.append((parts, offset))
            self._cond.notify_all()

    def _take(self) -> _Staging:
        """A free staging buffer, waiting for the disk if none is."""
        with self._cond:
            while not self._free and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            buffer = self._free.pop()
        buffer.full = False
        return buffer

    def _run(self) -> None:
        """A writing thread: each write handed on, at its offset (the threads' writes
        in flight at once); then its staging buffers, once free, back to the free."""
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                item = self._pending.popleft()
            if item is None:
                return
            parts, offset = item
            del item
            try:
                views = [p for p, _ in parts]
                while views:  # (A short write: the rest again, from where it stopped.)
                    done = os.pwritev(self._fd, views, offset)
                    offset += done
                    while views and done >= views[0].nbytes:
                        done -= views.pop(0).nbytes
                    if views and done:
                        views[0] = views[0][done:]
            except BaseException as e:  # Raised to the writer at its next step.
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            finally:
                del views
            with self._cond:
                for _, staging in parts:
                    if staging is not None:
                        staging.holders -= 1
                        if staging.full and not staging.holders:
                            self._free.append(staging)
                self._writes -= 1
                self._cond.notify_all()
            del parts  # (The kept arrays' memory let go of here.)

    def _stop(self) -> None:
        with self._cond:
            self._pending.extend([None] * len(self._threads))
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error
