"""The ``progress=`` callback that long-running functions take.

Functions that move many tensors (consolidation, conversions) report after each
tensor; the ``jaxshare`` command renders the reports as a progress bar. Any
callable with this signature works, e.g. to log or to drive a notebook widget.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ProgressFn"]


class ProgressFn(Protocol):
    """``progress(done, total, name, nbytes)``: called after each tensor is written.

    ``done`` of ``total`` tensors are written, the last one named ``name``
    (``nbytes`` bytes), so a reporter can show counts and bytes per second.

    >>> seen = []
    >>> def log(done: int, total: int, name: str, nbytes: int) -> None:
    ...     seen.append(f"{done}/{total} {name}")
    >>> reporter: ProgressFn = log
    >>> reporter(1, 2, "wte.weight", 64); seen
    ['1/2 wte.weight']
    """

    def __call__(self, done: int, total: int, name: str, nbytes: int, /) -> None: ...
