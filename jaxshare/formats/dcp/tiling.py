"""Boxes that tile a shape exactly once: a DCP tensor's chunks, a data file's records.

A tensor of a DCP folder is stored as chunks, each a box of the global tensor
(``sizes`` elements from ``offsets``) that one rank wrote: a DTensor ``Shard``, an
FSDP2 shard, an uneven last chunk, an empty one. :func:`tiling_problem` says why
a tensor's chunks do not cover its shape exactly once (the first gap, or the
first two chunks that overlap), and :func:`overlapping_spans` does the same for
the records of one data file, byte ranges that no two may share.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

__all__ = ["Box", "overlapping_spans", "tiling_problem"]


class Box(Protocol):
    """A box of a tensor: ``sizes`` elements from ``offsets`` (a DCP chunk)."""

    @property
    def offsets(self) -> tuple[int, ...]: ...

    @property
    def sizes(self) -> tuple[int, ...]: ...

    @property
    def numel(self) -> int: ...


#: Tiling is checked on a grid of the chunks' edges; one larger than this is refused.
_MAX_GRID_CELLS = 1 << 22


def tiling_problem(shape: tuple[int, ...], chunks: Sequence[Box]) -> str | None:
    """Why ``chunks`` do not cover ``shape`` exactly once, or ``None`` if they do.

    The chunks' edges cut each axis into intervals; a grid cell of those intervals
    lies wholly inside or outside each chunk, so counting the chunks over every
    cell finds the first element no chunk holds and the first two holds.

    >>> from types import SimpleNamespace as Chunk
    >>> top = Chunk(offsets=(0, 0), sizes=(4, 6), numel=24)
    >>> tiling_problem((7, 6), [top, Chunk(offsets=(4, 0), sizes=(3, 6), numel=18)]) is None
    True
    >>> print(tiling_problem((7, 6), [top, Chunk(offsets=(3, 0), sizes=(2, 6), numel=12)]))
    chunks 0 (offsets (0, 0), sizes (4, 6)) and 1 (offsets (3, 0), sizes (2, 6)) overlap at
    element (3, 0)
    """
    if math.prod(shape) == 0:
        return None
    filled = [c for c in chunks if c.numel]
    edges = [
        sorted(
            {0, n, *(c.offsets[d] for c in filled), *(c.offsets[d] + c.sizes[d] for c in filled)}
        )
        for d, n in enumerate(shape)
    ]
    cells = math.prod(len(e) - 1 for e in edges)
    if cells > _MAX_GRID_CELLS:
        return _pairwise_problem(shape, chunks)
    count = np.zeros([len(e) - 1 for e in edges], np.int32)
    owner = np.full(count.shape, -1, np.int32)
    for i, c in enumerate(chunks):
        if not c.numel:
            continue
        box = tuple(
            slice(bisect.bisect_left(e, o), bisect.bisect_left(e, o + n))
            for e, o, n in zip(edges, c.offsets, c.sizes, strict=True)
        )
        twice = np.flatnonzero(count[box] > 0)
        if twice.size:
            cell = np.unravel_index(twice[0], count[box].shape)
            at = tuple(e[b.start + k] for e, b, k in zip(edges, box, cell, strict=True))
            j = int(owner[box][cell])
            return (
                f"chunks {j} (offsets {chunks[j].offsets}, sizes {chunks[j].sizes}) and {i} "
                f"(offsets {c.offsets}, sizes {c.sizes}) overlap at element {at}"
            )
        count[box] += 1
        owner[box] = i
    gaps = np.flatnonzero(count == 0)
    if gaps.size:
        cell = np.unravel_index(gaps[0], count.shape)
        lo = tuple(e[k] for e, k in zip(edges, cell, strict=True))
        hi = tuple(e[k + 1] for e, k in zip(edges, cell, strict=True))
        box_text = ", ".join(f"{a}:{b}" for a, b in zip(lo, hi, strict=True))
        return (
            f"no chunk holds [{box_text}] (from element {lo}); expected chunks that cover "
            f"it exactly, found {len(chunks)}: a rank's chunk is missing"
        )
    return None


def _pairwise_problem(shape: tuple[int, ...], chunks: Sequence[Box]) -> str | None:
    """:func:`tiling_problem` for chunks too irregular for a grid: no two overlap
    (checked pairwise, one chunk against all the later ones at a time) and together
    they hold as many elements as the tensor."""
    filled = [(i, c) for i, c in enumerate(chunks) if c.numel]
    lo = np.array([c.offsets for _, c in filled], np.int64).reshape(len(filled), len(shape))
    hi = lo + np.array([c.sizes for _, c in filled], np.int64).reshape(lo.shape)
    for k, (i, c) in enumerate(filled):
        hit = np.flatnonzero(((lo[k + 1 :] < hi[k]) & (lo[k] < hi[k + 1 :])).all(axis=1))
        if hit.size:
            j, d = filled[k + 1 + hit[0]]
            at = tuple(int(n) for n in np.maximum(lo[k], lo[k + 1 + hit[0]]))
            return (
                f"chunks {i} (offsets {c.offsets}, sizes {c.sizes}) and {j} "
                f"(offsets {d.offsets}, sizes {d.sizes}) overlap at element {at}"
            )
    held, total = sum(c.numel for _, c in filled), math.prod(shape)
    if held != total:
        return (
            f"expected chunks that hold its {total} elements exactly, found {len(chunks)} "
            f"holding {held}: a rank's chunk is missing"
        )
    return None


def overlapping_spans(spans: Mapping[tuple[int, int], str]) -> tuple[str, str, int, int] | None:
    """The first two of ``spans`` (``{(offset, length): name}``: byte ranges of one
    file) that share bytes, as ``(first, second, where the second starts, where the
    first ends)``; ``None`` if no two do.

    >>> overlapping_spans({(0, 8): "a", (8, 4): "b", (10, 4): "c"})
    ('b', 'c', 10, 12)
    """
    end, last = 0, ""
    for (offset, length), name in sorted(spans.items()):
        if offset < end:
            return last, name, offset, end
        if offset + length > end:
            end, last = offset + length, name
    return None
