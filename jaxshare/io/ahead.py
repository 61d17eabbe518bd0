"""Reading ahead: arrays and blocks made on threads while the caller writes the one
before, within a memory budget.

A conversion's writer takes one output at a time. :class:`ReadAhead` makes the
next ones on a few threads, holding at most a budget of bytes (about two of the
largest tensor); :class:`BlocksAhead` makes one tensor's blocks on a thread of its
own, a few ahead; :class:`SharedRead` reads one array once for the several outputs
that take it (an embedding and its tied head). :func:`dwarfs` names the few
tensors that would hold the rest at bay, :func:`beside_values` the bytes of a
record beside a tensor's values, and :func:`made_at` / :func:`lined_up_blocks`
make arrays where a file writes them without a copy.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from jaxshare.core.perm import Perm
from jaxshare.io.buffers import lined_up
from jaxshare.io.mapped import FileRange
from jaxshare.io.transpose import contiguous_transpose

__all__ = [
    "BlocksAhead",
    "ReadAhead",
    "SharedRead",
    "beside_values",
    "dwarfs",
    "lined_up_blocks",
    "made_at",
]

T = TypeVar("T")


def dwarfs(sizes: Sequence[int]) -> set[int]:
    """The indices of the few sizes that dwarf the rest: over twice the fourth
    largest (an embedding and its head beside a model's layers).

    Read ahead within a budget of two of the largest, they would hold many of the
    rest at once, in memory made fresh for them, where two are all that keeps the
    cores busy: conversions budget for the others and read these alone.

    >>> sorted(dwarfs([10, 300, 12, 11, 10, 290]))
    [1, 5]
    """
    if not sizes:
        return set()
    fourth = sorted(sizes, reverse=True)[min(3, len(sizes) - 1)]
    return {i for i, n in enumerate(sizes) if n > 2 * fourth}


def beside_values(extents: Sequence[FileRange], nbytes: int) -> list[FileRange]:
    """The bytes at either end of ``extents`` that hold something beside a
    tensor's ``nbytes`` of values: as many at each end of each range as the
    ranges hold beyond the values (a record's headers before them and its
    directory after them, wherever they split); none where the ranges are the
    values alone.

    >>> beside_values([("f", 4096, 1000)], 1000)
    []
    >>> beside_values([("f", 4096, 1200)], 1000)
    [('f', 4096, 200), ('f', 5096, 200)]
    """
    extra = sum(n for _, _, n in extents) - nbytes
    if extra <= 0:
        return []
    out: list[FileRange] = []
    for path, offset, length in extents:
        n = min(extra, length)  # (0 only for an empty range.)
        if n:
            out.append((path, offset, n))
        if n < length:
            out.append((path, offset + length - n, n))
    return out


def made_at(offset: int | None, make: Callable[[], T]) -> T:
    """``make()``, its arrays made to line up with ``offset`` (:func:`lined_up`)."""
    if offset is None:
        return make()
    with lined_up(offset):
        return make()


def lined_up_blocks(blocks: Iterable[np.ndarray], offset: int) -> Iterator[np.ndarray]:
    """``blocks``, each made (on the thread that takes it) to line up with where it
    goes in a file: from ``offset`` on, end to end (:func:`lined_up`)."""
    made = iter(blocks)
    try:
        while True:
            with lined_up(offset):
                block = next(made, None)
            if block is None:
                return
            offset += block.nbytes
            yield block
    finally:  # (Stopped early: the blocks' own generator ends too.)
        close = getattr(made, "close", None)
        if close is not None:
            close()


class SharedRead:
    """One source array read once, whole, for ``users`` outputs that each take it
    in blocks (:meth:`blocks`, transposed or as it is); it is let go once the last
    of them has taken its blocks.

    Args:
      read: reads the array (called once, by the first to ask for blocks).
      users: how many will call :meth:`blocks`.
      in_rows: reads the array and its bands of rows as they are read into it
        (:meth:`TensorSource.array_in_rows`), or ``None``: where the first to ask
        takes the array as it is, it takes those bands, and the writer starts on
        the first while the rest are read; the others wait for the array whole.

    >>> shared = SharedRead(lambda: np.arange(6, dtype=np.float32).reshape(2, 3), users=2)
    >>> [b.tolist() for b in shared.blocks((1, 0), block_bytes=8)]
    [[[0.0, 3.0]], [[1.0, 4.0]], [[2.0, 5.0]]]
    >>> [b.shape for b in shared.blocks(None)]
    [(2, 3)]
    """

    def __init__(
        self,
        read: Callable[[], np.ndarray],
        users: int,
        in_rows: Callable[[], tuple[np.ndarray, Iterator[np.ndarray]] | None] | None = None,
    ) -> None:
        self._read = read
        self._in_rows = in_rows
        self._users = users
        self._array: np.ndarray | None = None
        self._lock = threading.Lock()
        self._whole = threading.Event()  # Set once the array is read whole, or is not.
        self._filled = False

    def blocks(self, perm: Perm | None, *, block_bytes: int = 16 * 2**20) -> Iterator[np.ndarray]:
        """The array (transposed by ``perm``) in C order: itself whole (or its bands
        as they are read), or its transpose in bands of the output's first axis of
        about ``block_bytes``."""
        bands = None
        with self._lock:
            if self._array is None and not self._whole.is_set():
                made = self._in_rows() if perm is None and self._in_rows is not None else None
                if made is None:
                    self._array, self._filled = self._read(), True
                    self._whole.set()
                else:
                    self._array, bands = made
            x = self._array
            self._users -= 1
            if not self._users:  # The last: the array goes once its blocks are written.
                self._array = None
        if bands is not None:  # Filled as its bands are taken; the others wait for it.
            try:
                yield from bands
                self._filled = True
            finally:
                self._whole.set()
            return
        self._whole.wait()
        if x is None or not self._filled:  # Its filling stopped: read again, whole.
            x = self._read()
        if perm is None or x.ndim == 0:
            yield x
            return
        axis = perm[0]  # The axis of `x` along the output's first.
        rows = max(1, block_bytes // max(1, x.nbytes // max(1, x.shape[axis])))
        for lo in range(0, x.shape[axis], rows):
            band = x[(slice(None),) * axis + (slice(lo, lo + rows),)]
            yield contiguous_transpose(band, perm)


class BlocksAhead(Iterator[np.ndarray]):
    """The blocks of ``blocks`` (an iterable), made on a thread of their own at most
    ``depth`` ahead of the caller. The thread stops, and closes ``blocks``, once
    they are all taken, on :meth:`close`, or once this is dropped; an error in
    making a block is raised to the caller in its place.

    >>> list(BlocksAhead(iter([np.zeros(1), np.ones(1)])))
    [array([0.]), array([1.])]
    """

    def __init__(self, blocks: Iterable[np.ndarray], depth: int = 2) -> None:
        self._queue: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_make_blocks, args=(blocks, self._queue, self._stop),
            name="jaxshare-blocks", daemon=True,
        )  # fmt: skip
        self._thread.start()
        # Dropped unfinished (a writer that failed): the thread stops, freeing its blocks.
        self._finalizer = weakref.finalize(self, self._stop.set)

    def __next__(self) -> np.ndarray:
        if self._done:
            raise StopIteration
        ok, value = self._queue.get()
        if ok and value is not None:
            return value
        self._done = True
        self._thread.join()
        if not ok:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stops the thread (its current block made first) and drops what it made."""
        self._stop.set()
        self._done = True
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)


def _make_blocks(
    blocks: Iterable[np.ndarray], out: queue.Queue[tuple[bool, Any]], stop: threading.Event
) -> None:
    """:class:`BlocksAhead`'s thread: each block into ``out``, then ``(True, None)``,
    or ``(False, error)``; it holds no reference to its :class:`BlocksAhead`."""

    def put(item: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                out.put(item, timeout=0.05)
                return True
        return False

    try:
        for block in blocks:
            if not put((True, block)):
                return
            del block
        put((True, None))
    except BaseException as e:  # Raised to the caller at its next block.
        put((False, e))
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


class ReadAhead(Generic[T]):
    """Runs ``jobs`` in order on a few background threads, ahead of the caller,
    holding at most ``budget`` bytes of results the caller has not released.

    Each job is ``(cost, fn)``: ``fn()`` makes a value that holds about ``cost``
    bytes while it is made and until it is released. Jobs start in order, each
    once its cost fits the budget beside the values not yet released (a job
    costlier than the whole budget starts once nothing is held, so the budget is
    never a deadlock); up to ``workers`` run at once, so small reads overlap.
    Iterating gives the values in order; by default a value is released when
    the next one is asked for. A caller that keeps values longer (e.g. until an
    asynchronous write is done) iterates :meth:`held` and calls :meth:`release`
    itself. Closing stops the threads; an error in a job is raised to the
    caller, and no job starts after it.

    >>> with ReadAhead([(1, lambda: "a"), (1, lambda: "b")], budget=2) as ahead:
    ...     list(ahead)
    ['a', 'b']
    """

    def __init__(
        self, jobs: Sequence[tuple[int, Callable[[], T]]], budget: int, *, workers: int = 2
    ) -> None:
        self._jobs = list(jobs)
        self._budget = budget
        self._held: dict[int, int] = {}  # Job index -> cost, until released.
        self._done: dict[int, tuple[bool, Any]] = {}  # Job index -> (ok, value or error).
        self._next = 0  # The next job to start.
        self._failed = False
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name="jaxshare-read-ahead", daemon=True)
            for _ in range(max(1, min(workers, len(self._jobs))))
        ]
        for thread in self._threads:
            thread.start()

    def _claim(self) -> int | None:
        """The next job to run once the budget allows it (its cost then held);
        ``None`` when there is none left or the reader stops."""
        with self._cond:
            while True:
                if self._closed or self._failed or self._next >= len(self._jobs):
                    return None
                i, cost = self._next, self._jobs[self._next][0]
                if not self._held or sum(self._held.values()) + cost <= self._budget:
                    self._next += 1
                    self._held[i] = cost
                    return i
                self._cond.wait()

    def _run(self) -> None:
        while (i := self._claim()) is not None:
            try:
                result: tuple[bool, Any] = (True, self._jobs[i][1]())
            except BaseException as e:  # Handed to the caller, whatever it is.
                result = (False, e)
            with self._cond:
                if self._closed:
                    return
                self._done[i] = result
                self._failed = self._failed or not result[0]
                self._cond.notify_all()
            # Not kept past its release while the next job waits for the budget.
            del result

    def held(self) -> Iterator[tuple[int, T]]:
        """``(index, value)`` of each job in order; the caller releases each."""
        for i in range(len(self._jobs)):
            yield i, self._take(i)

    def __iter__(self) -> Iterator[T]:
        for i in range(len(self._jobs)):
            value = self._take(i)
            yield value
            del value
            self.release(i)  # Asked for the next: done with this one.

    def _take(self, i: int) -> T:
        with self._cond:
            while i not in self._done:
                self._cond.wait()
            ok, value = self._done.pop(i)
        if not ok:
            raise value
        return value

    def release(self, index: int) -> None:
        """The caller is done with the value of job ``index``: its bytes are free."""
        with self._cond:
            self._held.pop(index, None)
            self._cond.notify_all()

    def close(self) -> None:
        """Stops the thread and waits for its current job to end (so the source is
        no longer read once this returns); values not taken are dropped."""
        with self._cond:
            self._closed = True
            self._done.clear()
            self._held.clear()
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
