"""A few threads for copies: how many, and ``map`` over them.

numpy and torch release the GIL while they copy, so copies and the page faults
of mapped files overlap on a few threads. Every pool jaxshare starts for such
work is sized by :func:`worker_count`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["MAX_WORKERS", "parallel_map", "worker_count"]

#: Threads copying at once: more gain nothing on memory-bound copies.
MAX_WORKERS = 4

_T = TypeVar("_T")
_R = TypeVar("_R")


def worker_count(items: int | None = None) -> int:
    """Threads to copy ``items`` things with: the CPUs this process may run on,
    at most :data:`MAX_WORKERS` (and at most ``items``), at least 1.

    >>> 1 <= worker_count() <= MAX_WORKERS, worker_count(1)
    (True, 1)
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(MAX_WORKERS, cpus or 1)
    return max(1, workers if items is None else min(workers, items))


def parallel_map(fn: Callable[[_T], _R], items: Sequence[_T]) -> Iterator[_R]:
    """``map(fn, items)`` on :func:`worker_count` threads, results in order as they
    come; an error is raised at its item, and the items not started are dropped.

    >>> list(parallel_map(lambda x: x * 2, [1, 2, 3]))
    [2, 4, 6]
    """
    workers = worker_count(len(items))
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="jaxshare-copy") as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
