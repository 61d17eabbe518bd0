"""``Plan``: every output tensor of a conversion, decided before any is read.

A conversion first reads only names, shapes and dtypes (safetensors headers, an
index, ``config.json``, an Orbax item's metadata, DeepSpeed's ``param_shapes``)
and decides each output's name, layout and dtype, and the ties of the output:
the plan. Then writers (an Orbax item, a safetensors file, a Hugging Face
directory) ask it for one output array at a time, read from the source with
:meth:`Plan.array`, so memory holds about one tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from jaxshare._alias import AliasMap
from jaxshare._dtype import cast_to, numpy_dtype
from jaxshare._perm import Perm
from jaxshare._report import ArrayInfo
from jaxshare._source import TensorSource

__all__ = ["Plan", "PlanEntry"]


@dataclass(frozen=True)
class PlanEntry:
    """One stored output tensor.

    Attributes:
      name: its name in the output.
      source: the name of the tensor it is read from.
      perm: the axis permutation from the source's layout to the output's.
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

    >>> from jaxshare import ArrayInfo
    >>> e = PlanEntry("w", "params/w", (1, 0), ArrayInfo((3, 2), "float32"))
    >>> Plan((e,), AliasMap()).cast("bfloat16").entries[0].info
    ArrayInfo(shape=(3, 2), dtype='bfloat16')
    """

    entries: tuple[PlanEntry, ...]
    alias_map: AliasMap

    @classmethod
    def identity(cls, source: TensorSource) -> Plan:
        """The plan that keeps every name and layout of ``source``; an alias the
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
        changes)."""
        x = source.array(entry.source)
        dtype = numpy_dtype(entry.info.dtype)
        if x.dtype != dtype:
            x = x.astype(dtype)
        if entry.perm is not None:
            x = np.ascontiguousarray(np.transpose(x, entry.perm))
        if tuple(x.shape) != tuple(entry.info.shape):
            raise ValueError(
                f"{source.where}: {entry.source!r} gives shape {tuple(x.shape)}, but the plan "
                f"for {entry.name!r} expects {tuple(entry.info.shape)}."
            )
        return x

    def blocks(self, source: TensorSource, entry: PlanEntry) -> Iterable[np.ndarray]:
        """The output of ``entry`` as blocks in C order: the source's own blocks
        where the plan neither casts nor transposes, else the one array."""
        if entry.perm is None and source.infos[entry.source].dtype == entry.info.dtype:
            return source.blocks(entry.source)
        return (self.array(source, entry),)

    def arrays(
        self, source: TensorSource, progress: Callable[[int, int, str, int], None] | None = None
    ) -> Iterator[tuple[PlanEntry, np.ndarray]]:
        """Each entry with its array, one at a time, reporting progress after each."""
        for done, entry in enumerate(self.entries, 1):
            yield entry, self.array(source, entry)
            if progress is not None:
                progress(done, len(self.entries), entry.name, entry.info.nbytes)
