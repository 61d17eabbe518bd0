"""``Plan``: every output tensor of a conversion, decided before any is read.

A conversion first reads only names, shapes and dtypes (safetensors headers, an
index, ``config.json``, an Orbax item's metadata, DeepSpeed's ``param_shapes``)
and decides each output's name, axis order and dtype, and the ties of the output:
the plan. Then writers (an Orbax item, a safetensors file, a Hugging Face
directory) ask it for one output array at a time, read from the source with
:meth:`Plan.array`, so memory holds about two tensors (one read while the one
before is written).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from mmap import PAGESIZE
from typing import Any, TypeVar

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import cast_to, numpy_dtype
from jaxshare.core.perm import Perm, permute_shape
from jaxshare.core.report import ArrayInfo
from jaxshare.io.ahead import (
    BlocksAhead,
    ReadAhead,
    SharedRead,
    beside_values,
    dwarfs,
    lined_up_blocks,
    made_at,
)
from jaxshare.io.buffers import pooled
from jaxshare.io.mapped import DIRECT_BYTES, FileRange, read_direct
from jaxshare.io.prefetch import Prefetch
from jaxshare.io.source import Index, TensorSource
from jaxshare.io.transpose import contiguous_transpose

__all__ = ["Plan", "PlanEntry", "PlannedSource"]

T = TypeVar("T")


@dataclass(frozen=True)
class PlanEntry:
    """One stored output tensor.

    Attributes:
      name: its name in the output.
      source: the name of the tensor it is read from.
      perm: the axis permutation from the source's axis order to the output's.
      info: its shape and dtype in the output.
    """

    name: str
    source: str
    perm: Perm | None
    info: ArrayInfo


@dataclass(frozen=True)
class Plan:
    """The stored outputs, in order, and the output's ties (in output names).

    An alias of ``alias_map`` is not an entry: writers store it once, as its
    canonical, and record the tie; those that cannot record one (a reader that
    knows no ties) write it out from its canonical's entry.

    >>> from jaxshare.stream import ArrayInfo
    >>> e = PlanEntry("w", "params/w", (1, 0), ArrayInfo((3, 2), "float32"))
    >>> Plan((e,), AliasMap()).cast("bfloat16").entries[0].info
    ArrayInfo(shape=(3, 2), dtype='bfloat16')
    """

    entries: tuple[PlanEntry, ...]
    alias_map: AliasMap

    @classmethod
    def identity(cls, source: TensorSource) -> Plan:
        """The plan that keeps every name and axis order of ``source``; an alias the
        source also stores (written out) is an alias again, stored once."""
        entries = tuple(
            PlanEntry(name, name, None, info)
            for name, info in source.infos.items()
            if name not in source.ties
        )
        return cls(entries, source.ties)

    def cast(self, dtype: Any) -> Plan:
        """This plan with floating outputs cast to ``dtype`` (``None``: unchanged)."""
        if dtype is None:
            return self
        target = numpy_dtype(dtype)
        return replace(
            self,
            entries=tuple(
                replace(
                    e, info=ArrayInfo(e.info.shape, cast_to(numpy_dtype(e.info.dtype), target).name)
                )
                for e in self.entries
            ),
        )

    @property
    def nbytes(self) -> int:
        return sum(e.info.nbytes for e in self.entries)

    def array(self, source: TensorSource, entry: PlanEntry) -> np.ndarray:
        """The output array of ``entry``: read from ``source``, cast, transposed
        into a new C-ordered array (or the source's own array where nothing
        changes); transposed as it is read where the source can. A large view of
        a mapped file not in the page cache is read past it first
        (:func:`~jaxshare.io.mapped.read_direct`)."""
        if entry.perm is not None and source.infos[entry.source].dtype == entry.info.dtype:
            permuted = source.permuted_array(entry.source, entry.perm)
            if permuted is not None:
                return self._converted(source, entry, permuted, transposed=True)
        return self._converted(source, entry, read_direct(source.array(entry.source)))

    def _converted(
        self, source: TensorSource, entry: PlanEntry, x: np.ndarray, *, transposed: bool = False
    ) -> np.ndarray:
        """``x``, the array of ``entry.source`` (``transposed`` already), as
        ``entry`` wants it."""
        dtype = numpy_dtype(entry.info.dtype)
        if x.dtype != dtype:
            x = x.astype(dtype)
        if entry.perm is not None and not transposed:
            x = contiguous_transpose(x, entry.perm)
        if tuple(x.shape) != tuple(entry.info.shape):
            raise ValueError(
                f"{source.where}: {entry.source!r} gives shape {tuple(x.shape)}, but the plan "
                f"for {entry.name!r} expects {tuple(entry.info.shape)}."
            )
        return x

    def read_slice(self, source: TensorSource, entry: PlanEntry, index: Index) -> np.ndarray:
        """``array(source, entry)[index]`` (``index``: slices), reading only that
        part of the source: the index is taken back through the permutation.

        >>> from jaxshare.stream import TensorSource
        >>> class One(TensorSource):
        ...     infos = {"w": ArrayInfo((2, 3), "float32")}
        ...     def read(self, name):
        ...         return np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> e = PlanEntry("k", "w", (1, 0), ArrayInfo((3, 2), "float32"))
        >>> Plan((e,), AliasMap()).read_slice(One(), e, (slice(2, 3),)).tolist()
        [[2.0, 5.0]]
        """
        full = (*index, *(slice(None),) * (len(entry.info.shape) - len(index)))
        perm = entry.perm
        inner = full if perm is None else tuple(full[perm.index(j)] for j in range(len(full)))
        dtype = numpy_dtype(entry.info.dtype)
        if perm is not None and numpy_dtype(source.infos[entry.source].dtype) == dtype:
            made = source.permuted_slice(entry.source, inner, perm)
            if made is not None:
                return made
        x = source.read_slice(entry.source, inner)
        if x.dtype != dtype:
            x = x.astype(dtype)
        return x if perm is None else contiguous_transpose(x, perm)

    def blocks(self, source: TensorSource, entry: PlanEntry) -> Iterable[np.ndarray]:
        """The output of ``entry`` as blocks in C order: the source's own blocks
        where the plan neither casts nor transposes, its transposed blocks where it
        can read them a block at a time (an Orbax item), else the one array."""
        same = source.infos[entry.source].dtype == entry.info.dtype
        if entry.perm is None and same:
            return source.blocks(entry.source)
        if entry.perm is not None and same:
            blocks = source.permuted_blocks(entry.source, entry.perm)
            if blocks is not None:
                return blocks
        return (self.array(source, entry),)

    def arrays(
        self, source: TensorSource, progress: Callable[[int, int, str, int], None] | None = None
    ) -> Generator[tuple[PlanEntry, np.ndarray], None, None]:
        """Each entry with its array, in order, reporting progress after each.

        The next array is read (cast, transposed) in a background thread while
        the caller handles the current one, so reading overlaps writing; at most
        :meth:`budget` bytes are held at once (see :class:`ReadAhead`): about
        two of the largest tensor, never the model. An array counts as held until
        the next one is asked for: a caller that drops it then (``del``) keeps
        memory within the budget. Entries in a row with one source (a canonical
        and an alias written out transposed) read it once.
        """
        # The arrays' memory, freed, waits for the next of their size (pages resident).
        with pooled(), self.prefetch(source) as input_ahead, self._read_ahead(source) as ahead:
            arrays = iter(ahead)  # No zip: it would keep the last array until the next.
            for done, entry in enumerate(self.entries, 1):
                input_ahead.reached(done - 1)
                array = next(arrays)
                yield entry, array
                del array
                if progress is not None:
                    progress(done, len(self.entries), entry.name, entry.info.nbytes)

    def prefetch(
        self,
        source: TensorSource,
        entries: Sequence[PlanEntry] | None = None,
        *,
        whole: Sequence[bool] | None = None,
    ) -> Prefetch:
        """Has the kernel read the input of ``entries`` (by default the plan's), in
        order, ahead of a conversion that calls :meth:`Prefetch.reached` as it
        starts each (see :mod:`jaxshare.io.prefetch`); closed at the end.

        ``whole[i]``: whether the conversion reads entry ``i`` whole, past the page
        cache where it lacks it (by default every one; not so a layer of a stack,
        read as slices, or a tensor written from the cache's pages). Such an
        entry's input in a mapped file, at least
        :data:`~jaxshare.io.mapped.DIRECT_BYTES` of it, is not read ahead: where
        the page cache lacks it, it is read past the cache, and reading it into
        the cache first would read it twice. Only the bytes its ranges hold
        beyond its values are (:func:`beside_values`): a record's headers (a DCP
        ``torch.save`` record), which finding the values reads page by page."""
        chosen = self.entries if entries is None else tuple(entries)
        direct = [
            source.mapped
            and source.infos[e.source].nbytes >= DIRECT_BYTES
            and (whole is None or whole[i])
            for i, e in enumerate(chosen)
        ]

        def ranges(i: int) -> Sequence[FileRange]:
            name = chosen[i].source
            extents = source.extents(name)
            return beside_values(extents, source.infos[name].nbytes) if direct[i] else extents

        return Prefetch(ranges, [source.infos[e.source].nbytes for e in chosen])

    def _read_ahead(
        self, source: TensorSource, offsets: Mapping[str, int] | None = None
    ) -> ReadAhead[np.ndarray]:
        """The entries' arrays read on threads, in order, within :meth:`budget`
        (started at once; see :meth:`arrays`); each made to line up with its
        output's ``offsets[name]`` where given (:func:`lined_up`)."""
        entries = self.entries
        again = [i + 1 < len(entries) and entries[i + 1].source == e.source
                 for i, e in enumerate(entries)]  # fmt: skip
        kept: dict[str, np.ndarray] = {}  # The source array the next entry reads too.
        read_done = [threading.Event() for _ in entries]

        def read(i: int) -> np.ndarray:
            at = None if offsets is None else offsets.get(entries[i].name)
            return made_at(at, partial(made, i))

        def made(i: int) -> np.ndarray:
            entry = entries[i]
            if not again[i] and not (i and again[i - 1]):  # Its source read for it alone.
                try:
                    return self.array(source, entry)
                finally:
                    read_done[i].set()
            try:
                if i and again[i - 1]:  # The entry before reads this source: share it.
                    read_done[i - 1].wait()
                x = kept.pop(entry.source, None)
                if x is None:
                    x = read_direct(source.array(entry.source))
                if again[i]:  # (Counted in the next entry's cost, which holds it.)
                    kept[entry.source] = x
            finally:
                read_done[i].set()
            return self._converted(source, entry, x)

        jobs = [(self.cost(source, e), partial(read, i)) for i, e in enumerate(entries)]
        return ReadAhead(jobs, self.budget(source))

    def outputs(
        self, source: TensorSource, offsets: Mapping[str, int] | None = None
    ) -> Generator[tuple[PlanEntry, Iterable[np.ndarray]], None, None]:
        """Each entry with its bytes to write, in order: a mapped source's blocks
        as they lie (:meth:`blocks`, no copy), else its array, read ahead on
        threads while the caller writes the one before (:meth:`arrays`; a caller
        that drops the blocks before asking for the next keeps to the budget).
        No block is changed once handed out. ``offsets``: where each entry's
        bytes go in the output file, by name: its array is made to line up
        with them, so that the file writes it without a copy (:func:`lined_up`).

        The few tensors that dwarf the rest -- over twice the fourth largest: an
        embedding and its head beside a model's layers, or beside an unstacked
        stack's -- stream as the source's blocks instead, in their turn, while the
        others are read ahead: memory then holds about two of those, not two of
        the largest tensor. Their blocks are made on a thread of their own
        (:class:`BlocksAhead`) from the time the entry before them is handed out,
        so the disk writes while they are decoded. Streamed entries in a row with
        one source (an embedding and its tied head written out transposed) decode
        it once.

        >>> from jaxshare.stream import TensorSource
        >>> class Src(TensorSource):
        ...     infos = {"big": ArrayInfo((64, 4), "float32"), "w": ArrayInfo((2, 3), "float32")}
        ...     def read(self, name):
        ...         return np.ones(self.infos[name].shape, np.float32)
        >>> w = PlanEntry("k", "w", (1, 0), ArrayInfo((3, 2), "float32"))
        >>> big = PlanEntry("big", "big", None, ArrayInfo((64, 4), "float32"))
        >>> [(e.name, type(b).__name__) for e, b in Plan((w, big), AliasMap()).outputs(Src())]
        [('k', 'tuple'), ('big', 'BlocksAhead')]
        """
        if source.mapped:
            # A tensor that lies in its file as it lies in the output is written from
            # the page cache, read ahead into it; any other is read past the cache
            # where it lacks it (cast, transposed, or as it is): it is copied anyway.
            # Those are read on a thread of their own, from the time the entry before
            # them is handed out, so the disk reads the next while this one is written.
            lent = [offsets is not None and self._lent(source, e, offsets[e.name])
                    for e in self.entries]  # fmt: skip

            def direct(entry: PlanEntry) -> Iterator[np.ndarray]:
                yield from map(read_direct, self.blocks(source, entry))

            following: BlocksAhead | None = None  # The next entry's, read ahead.
            reading: BlocksAhead | None = None  # This entry's; closed once the caller moves on.
            with self.prefetch(source, whole=[not x for x in lent]) as input_ahead:
                try:
                    for i, entry in enumerate(self.entries):
                        input_ahead.reached(i)
                        if reading is not None:
                            reading.close()
                        reading, following = following, None
                        if i + 1 < len(self.entries) and not lent[i + 1]:
                            following = BlocksAhead(direct(self.entries[i + 1]))
                        made = self.blocks(source, entry) if lent[i] else reading
                        yield entry, made if made is not None else direct(entry)
                        del made
                finally:
                    for ahead_blocks in (reading, following):
                        if ahead_blocks is not None:
                            ahead_blocks.close()
            return
        streamed = dwarfs([e.info.nbytes for e in self.entries])
        ahead = replace(self, entries=tuple(e for i, e in enumerate(self.entries)
                                            if i not in streamed))  # fmt: skip
        make_blocks = self._streamed_blocks(source, streamed, offsets)
        # The others are read ahead once the first of them is asked for (from the
        # start, it held two more of them beside a streamed embedding: unstacking
        # went over its memory bound); their memory, freed, waits for the next of
        # their size (pages resident).
        reader: ReadAhead[np.ndarray] | None = None
        arrays: Iterator[np.ndarray] = iter(())
        with pooled(), self.prefetch(source) as input_ahead:
            # A streamed entry's blocks are read on a thread of their own, from the time
            # the entry before it is handed out: the disk writes while they are decoded.
            next_blocks: BlocksAhead | None = None
            current: BlocksAhead | None = None  # Closed once the caller moves on, or stops.
            try:
                for i, entry in enumerate(self.entries):
                    input_ahead.reached(i)
                    if current is not None:
                        current.close()
                        current = None
                    if i in streamed:
                        current = next_blocks or BlocksAhead(make_blocks(i))
                        blocks: Iterable[np.ndarray] = current
                        next_blocks = None
                    else:
                        if reader is None:
                            reader = ahead._read_ahead(source, offsets)
                            arrays = iter(reader)  # No zip: it would keep the last array.
                        array = next(arrays)
                        blocks = (array,)
                        del array  # Before the next is read.
                    if i + 1 in streamed:
                        next_blocks = BlocksAhead(make_blocks(i + 1))
                    yield entry, blocks
                    del blocks
            finally:
                for ahead_blocks in (current, next_blocks):
                    if ahead_blocks is not None:
                        ahead_blocks.close()
                if reader is not None:
                    reader.close()

    def _streamed_blocks(
        self, source: TensorSource, streamed: set[int], offsets: Mapping[str, int] | None
    ) -> Callable[[int], Iterable[np.ndarray]]:
        """``blocks(i)``: the blocks of the streamed entry ``i``. Streamed entries in
        a row that read one source (an embedding and its tied head written out
        transposed) read it once, whole, and each makes its blocks from it
        (:class:`SharedRead`): the source is decoded once, not once per entry.
        With ``offsets``, each block is made to line up with where it goes (the
        source read once, with the entry that writes it as it is)."""
        entries = self.entries
        shared: dict[int, SharedRead] = {}
        runs = itertools.groupby(
            range(len(entries)), key=lambda k: entries[k].source if k in streamed else None
        )
        for name, run in runs:
            group = list(run)
            if (
                name is not None
                and len(group) > 1
                and all(source.infos[name].dtype == entries[k].info.dtype for k in group)
            ):
                whole = [entries[k].name for k in group if entries[k].perm is None]
                at = (offsets or {}).get(whole[0]) if whole else None
                read = SharedRead(
                    partial(made_at, at, partial(source.array, name)),
                    len(group),
                    partial(made_at, at, partial(source.array_in_rows, name)),
                )
                shared.update(dict.fromkeys(group, read))

        def blocks(i: int) -> Iterable[np.ndarray]:
            entry = entries[i]
            made = shared[i].blocks(entry.perm) if i in shared else self.blocks(source, entry)
            at = (offsets or {}).get(entry.name)
            return made if at is None else lined_up_blocks(made, at)

        return blocks

    def _lent(self, source: TensorSource, entry: PlanEntry, offset: int) -> bool:
        """Whether ``entry`` is its source's tensor as stored, in one range of a
        mapped file that lies as far into a page as ``offset`` (its place in the
        output) into a block: the output then writes it from the file's pages
        (:meth:`jaxshare.io.output_file.OutputFile.gap`), no copy made."""
        extents = source.extents(entry.source) if self._as_stored(source, entry) else ()
        return len(extents) == 1 and (extents[0][1] - offset) % PAGESIZE == 0

    def _as_stored(self, source: TensorSource, entry: PlanEntry) -> bool:
        """Whether ``entry`` is its source's tensor as stored (no cast, no transpose)."""
        return entry.perm is None and source.infos[entry.source].dtype == entry.info.dtype

    def cost(self, source: TensorSource, entry: PlanEntry) -> int:
        """The most bytes reading ``entry`` holds at once: its output array, plus
        the source's array while a cast or transpose copies it -- unless that is
        a view of a mapped file, or the source transposes as it reads (an item's
        chunks, each transposed into place). (A mapped file's tensor read past the
        page cache, :meth:`array`, lives only while its reader copies it: one per
        reading thread. Counted until its output is written, it halved the reads
        in flight, and a cold 8 GB model took 16-18 s to an item, not 12.)"""
        out = entry.info.nbytes
        if self._as_stored(source, entry) or source.mapped:
            return out
        same = source.infos[entry.source].dtype == entry.info.dtype
        if same and source.permutes_as_read(entry.source):
            return out
        return out + source.infos[entry.source].nbytes

    def budget(self, source: TensorSource) -> int:
        """The bytes :meth:`arrays` may hold at once: twice the largest tensor (a
        transposed one counted with its source), so one tensor can be read while
        the one before is written."""
        return 2 * max((e.info.nbytes for e in self.entries), default=0) or 1


class PlannedSource(TensorSource):
    """The outputs of a plan over a source, as a source of their own: each tensor
    read from ``source`` (cast, transposed) when asked for, plus ``extra`` arrays,
    so one conversion's outputs feed another's plan without being held.

    Args:
      source: the source the plan reads.
      plan: its outputs are this source's tensors, its alias map the ties.
      extra: more tensors, ``{name: array}``, after the plan's (e.g. ones a
        format computes rather than stores).

    >>> from jaxshare.formats import SafetensorsFile
    >>> from safetensors.numpy import save_file
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> save_file({"w": np.zeros((2, 3), np.float32)}, d + "/w.safetensors")
    >>> with SafetensorsFile(d + "/w.safetensors") as file:
    ...     e = PlanEntry("k", "w", (1, 0), file.infos["w"].permuted((1, 0)))
    ...     PlannedSource(file, Plan((e,), AliasMap())).array("k").shape
    (3, 2)
    """

    def __init__(
        self,
        source: TensorSource,
        plan: Plan,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        extra = dict(extra or {})
        self._source, self._plan, self._extra = source, plan, extra
        self._entries = {e.name: e for e in plan.entries}
        taken = [name for name in extra if name in self._entries]
        if taken:
            raise ValueError(f"{source.where}: the plan already names {taken[:3]}.")
        self.path, self.kind = source.path, source.kind
        self.infos = {
            **{e.name: e.info for e in plan.entries},
            **{n: ArrayInfo(tuple(a.shape), a.dtype.name) for n, a in extra.items()},
        }
        self.ties = plan.alias_map
        self.parts, self.assets, self.other_files = source.parts, source.assets, source.other_files
        self.config, self.buffers, self.live = source.config, source.buffers, source.live

    @property
    def where(self) -> str:
        return self._source.where

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        if name in self._extra:
            return self._extra[name]
        return self._plan.array(self._source, self._entry(name))

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        if name in self._extra:
            return (self._extra[name],)
        return self._plan.blocks(self._source, self._entry(name))

    def origin(self, name: str) -> tuple[TensorSource, PlanEntry]:
        """The source and the plan entry the tensor ``name`` is read through."""
        return self._source, self._entry(name)

    def chunk_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self._extra:
            return None
        entry = self._entry(name)
        chunks = self._source.chunk_shape(entry.source)
        return None if chunks is None else permute_shape(chunks, entry.perm)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]``, reading only that part of the planned source."""
        if name in self._extra:
            return np.asarray(self._extra[name][index])
        return self._plan.read_slice(self._source, self._entry(name), index)

    def _entry(self, name: str) -> PlanEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{self.where}: no tensor named {name!r}.") from None
