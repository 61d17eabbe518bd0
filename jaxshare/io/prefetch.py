"""Reading a conversion's input ahead of it: the kernel asked to read the bytes of
the next tensors while the current ones are converted.

A conversion reads most inputs through mapped files, page fault by page fault:
from a cold file the kernel's read-ahead then keeps one stream of reads in
flight, and the disk idles between them. Here a 2.8 GB file read through its
mapping in order came at 0.44-0.47 GB/s, where a thread asking the kernel
(``posix_fadvise(WILLNEED)``, 16 MiB at a time) for the next 32-128 MiB ahead
of the reader made it 0.96-1.41 GB/s; and a safetensors file converted to an
Orbax item from a cold cache took 4.3-4.5 s instead of 5.1-5.3 s, with 4.8 s of
CPU instead of 8.0 (the transposes read pages the kernel had read in large
folios). A warm file costs a few system calls: the kernel skips the pages it
holds.

:class:`Prefetch` walks the tensors of a plan in its order, each as the file
ranges its source says it reads (:meth:`jaxshare.stream.TensorSource.extents`),
at most :data:`WINDOW` bytes of them past the end of the tensor the conversion
has reached. Pages read ahead are the page cache's, which the kernel reclaims as it
needs: not the conversion's memory. A tensor the conversion reads whole from a
file the page cache lacks is read past the cache instead
(:func:`jaxshare.io.mapped.read_direct`), and its plan gives only the ranges
beside its values here, which finding them reads page by page (a DCP record's
headers; :meth:`jaxshare.io.plan.Plan.prefetch`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence

from jaxshare.io.mapped import FileRange

__all__ = ["STEP", "WINDOW", "Prefetch"]

#: How far ahead of the tensor a conversion has reached its input is read.
WINDOW = 128 * 2**20
#: The bytes asked for in one call.
STEP = 16 * 2**20


class Prefetch:
    """Asks the kernel to read the input of tensors ``0, 1, ...`` ahead of the
    conversion (see the module's docstring), on a thread of its own.

    Args:
      extents: ``extents(i)``, the file ranges tensor ``i`` is read from (asked
        on the thread, in order; none: nothing to read ahead).
      sizes: the bytes each tensor reads, in order (how far ahead is measured).
      window: at most this many bytes of the tensors after the one reached.

    The conversion calls :meth:`reached` as it starts on each tensor, and
    :meth:`close` at its end. An error in reading ahead (a file gone) only stops
    it: the conversion's own reads say what is wrong.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(bytes(100))
    >>> with Prefetch(lambda i: [(str(path), 50 * i, 50)], [50, 50]) as ahead:
    ...     ahead.reached(1)
    """

    def __init__(
        self,
        extents: Callable[[int], Sequence[FileRange]],
        sizes: Sequence[int],
        *,
        window: int = WINDOW,
    ) -> None:
        self._extents = extents
        self._starts = [0, *itertools.accumulate(sizes)]
        self._window = window
        self._reached = 0
        self._closed = False
        self._cond = threading.Condition()
        self._files: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="jaxshare-prefetch", daemon=True)
        self._thread.start()

    def reached(self, i: int) -> None:
        """The conversion starts on tensor ``i``: read up to :data:`WINDOW` past its
        end."""
        with self._cond:
            if i > self._reached:
                self._reached = i
                self._cond.notify_all()

    def close(self) -> None:
        """Stops reading ahead (after the call in flight) and waits for the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        advise = getattr(os, "posix_fadvise", None)  # (Not on every platform.)
        if advise is None:
            return
        try:
            for i in range(len(self._starts) - 1):
                with self._cond:  # Tensor i within the window past the end of the one
                    # reached (from its start, nothing past an embedding larger than the
                    # window was read while it was converted: the disk's reads stopped).
                    while not self._closed and (
                        self._starts[i] > self._starts[self._reached + 1] + self._window
                    ):
                        self._cond.wait()
                    if self._closed:
                        return
                for path, offset, length in self._extents(i):
                    for start in range(offset, offset + length, STEP):
                        if self._closed:
                            return
                        n = min(STEP, offset + length - start)
                        advise(self._fd(path), start, n, os.POSIX_FADV_WILLNEED)
        except (OSError, ValueError, KeyError):
            return  # The conversion's own reads say what is wrong.
        finally:
            for fd in self._files.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _fd(self, path: str) -> int:
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY)
        return fd
