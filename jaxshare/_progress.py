"""A dependency-free progress bar for long CLI work (written to stderr)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "ProgressFn", "progress_bar"]

#: ``progress(done, total, label)``: library functions that do long work take one.
ProgressFn = Callable[[int, int, str], None]


class Progress:
    """Renders ``[#####.....]  12/50  label`` on one line of a terminal; on a pipe,
    a line at most every ``every`` seconds, and always the last one.

    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress(out, width=10, every=0)
    >>> p(1, 2, "a"); p(2, 2, "b")
    >>> print(out.getvalue(), end="")
    [#####.....] 1/2  a
    [##########] 2/2  b
    """

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, every: float = 2.0) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._width = width
        self._every = every
        self._last = float("-inf")
        self._tty = getattr(self._stream, "isatty", lambda: False)()

    def __call__(self, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        final = done >= total
        if not final and now - self._last < (0.1 if self._tty else self._every):
            return
        self._last = now
        filled = self._width if total <= 0 else min(self._width, self._width * done // total)
        line = f"[{'#' * filled}{'.' * (self._width - filled)}] {done}/{total}  {label}"
        if self._tty:
            self._stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()


def progress_bar(enabled: bool = True) -> ProgressFn | None:
    return Progress() if enabled else None
