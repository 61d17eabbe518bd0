"""``TensorSource``: stored tensors, described from metadata, read one at a time.

Every input jaxshare converts -- a safetensors file, a PyTorch file, a Hugging
Face directory, a DeepSpeed folder, an Orbax item, a state dict in memory -- is
opened as a source. A conversion first plans from what a source tells without
reading any tensor (names, shapes, dtypes, ties, a recorded naming), then
reads each tensor (or a slice of it, for sharded loading) and hands it to a
writer before reading the next, so memory holds about one tensor.

Names are the source's own: PyTorch names (``h.0.attn.weight``) for PyTorch
formats, ``'/'``-joined Flax paths for Orbax items and jaxshare's Flax-named
files.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.manifest import Manifest
from jaxshare.core.perm import Perm
from jaxshare.core.report import ALIAS_MAP, ArrayInfo, TieReport
from jaxshare.io.mapped import FileRange

__all__ = ["Index", "RecordedTie", "RetiedSource", "TensorSource", "UnheldTies", "file_part"]

#: A basic index into an array: one slice per axis, as ``jax.make_array_from_callback``
#: hands them out.
Index = tuple[slice, ...]


@dataclass(frozen=True)
class RecordedTie:
    """One tie as an input records it, whether or not its source applies it.

    Attributes:
      alias: the name the tie says is the canonical's tensor.
      canonical: the name it is tied to.
      origin: where the input records it (``"metadata"``, ``"save_model metadata"``,
        ``"shared_params"``, ``"storage"``, ``"config.json"``, ...).
      transform: the permutation from the canonical to the alias, if any.
    """

    alias: str
    canonical: str
    origin: str
    transform: Perm | None = None


class UnheldTies(ValueError):
    """An input records ties to tensors it does not store, so no source can apply
    them: the one-line message names the file and the first such tie; ``ties``
    holds every one, and ``kind`` what the input is, for ``check`` to report."""

    def __init__(self, message: str, path: Path, kind: str, ties: Sequence[RecordedTie]) -> None:
        super().__init__(message)
        self.path, self.kind, self.ties = path, kind, tuple(ties)


class TensorSource(abc.ABC):
    """Named tensors read one at a time, with their ties.

    Subclasses set :attr:`path`, :attr:`kind` and :attr:`infos`, and implement
    :meth:`read`; the rest has defaults. Conversions read ahead on two threads,
    so :meth:`read`, :meth:`array` and :meth:`blocks` may run at once for
    different names.

    Attributes:
      path: the file or directory the tensors come from (``None`` in memory).
      kind: what the source is, e.g. ``"safetensors"``, ``"hf"``, ``"orbax"``.
      infos: ``{name: ArrayInfo}`` of the stored tensors, in the source's order
        (an alias the source also stores, e.g. written out for readers that know
        no ties, is listed too).
      ties: ``{alias: canonical}`` in the source's names, with transforms; every
        canonical is in :attr:`infos`. The map's ``naming`` is the naming record
        the source carries, if any.
      origins: ``{alias: where the tie comes from}`` (see ``TieReport``).
      parts: the files the source is made of, one line each, for reports.
      layers: ``{module prefix: layer kind}`` where the source knows the layer
        types (a module, a Hugging Face config); ``None`` otherwise.
      mapped: whether :meth:`blocks` are views of memory the source already
        holds (a mapped file, tensors in memory), so reading costs no copy and
        a writer gains nothing by reading ahead.
      assets: ``{file name: path}`` of the files that travel with the tensors
        (a model directory's ``config.json``, tokenizer files; an item's kept
        copies of them), copied byte for byte by conversions that keep them.
      other_files: files beside the tensors that are neither assets nor read
        (``README.md``, code): listed by reports, never run or carried.
      notes: what else the input holds that its tensors here leave out (a
        training checkpoint's optimizer state), one line each, for reports and
        conversions to say.
      config: the model's ``config.json`` the input declares, as a dict (a
        Hugging Face directory's own, an Orbax item's kept copy of it); ``None``
        where it declares none.
      buffers: the names that are buffers, not parameters, where the source
        knows (a module's); ``None`` otherwise.
      unapplied_ties: ties the input records that the source does not apply (an
        alias the input also stores in its own right, a canonical it lacks):
        held against the stored values by ``check``, never used to convert.
      live: whether the tensors are a live model's, in memory (a module's state
        dict): arrays made over their memory see what the model does to them
        next, so one that is to outlive the call is a copy.
    """

    path: Path | None = None
    kind: str = "tensors"
    infos: Mapping[str, ArrayInfo]
    ties: AliasMap = AliasMap()
    origins: Mapping[str, str] = {}
    parts: tuple[str, ...] = ()
    layers: Mapping[str, str | None] | None = None
    mapped: bool = False
    assets: Mapping[str, Path] = {}
    other_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    config: Mapping[str, Any] | None = None
    buffers: frozenset[str] | None = None
    unapplied_ties: tuple[RecordedTie, ...] = ()
    live: bool = False

    @abc.abstractmethod
    def read(self, name: str) -> Any:
        """The whole tensor ``name``: a numpy array (read-only where it maps a
        file), or a ``torch.Tensor`` for in-memory PyTorch sources."""

    def array(self, name: str) -> np.ndarray:
        """The whole tensor ``name`` as a numpy array (no copy where it can be)."""
        return np.asarray(self.read(name))

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        """The tensor ``name`` in C order as numpy blocks written end to end: views
        of the source's own memory where it has them (a mapped partition, a chunk),
        so a writer that streams bytes needs no copy of the whole tensor."""
        yield self.array(name)

    def extents(self, name: str) -> Sequence[FileRange]:
        """Where the bytes a read of ``name`` lies in the source's files, as
        ``(path, offset, length)`` ranges, so that a conversion can have the
        kernel read them ahead (:class:`jaxshare.io.prefetch.Prefetch`); none where
        the source does not say (the default: it holds them in memory, or reads
        them otherwise)."""
        return ()

    def array_in_rows(self, name: str) -> tuple[np.ndarray, Iterator[np.ndarray]] | None:
        """The whole tensor ``name`` as :meth:`array` gives it, and the bands of
        its leading rows, end to end, each handed out once read into it, where the
        source reads it so (an Orbax item, chunk by chunk): a writer starts on the
        first while the rest are read. The array is whole once the bands are all
        taken. ``None`` (the default) where it does not."""
        return None

    def permuted_array(self, name: str, perm: Perm) -> np.ndarray | None:
        """The tensor ``name`` transposed by ``perm`` into one new C-ordered array,
        made in one pass where the source can (an Orbax item transposes each stored
        chunk into place); ``None`` where it cannot, and the tensor is read and then
        transposed."""
        return None

    def permutes_as_read(self, name: str) -> bool:
        """Whether :meth:`permuted_array` makes the transposed ``name`` without
        holding the stored array beside it (each chunk transposed into place), so
        a transposed read costs its output's bytes alone."""
        return False

    def permuted_blocks(self, name: str, perm: Perm) -> Iterable[np.ndarray] | None:
        """The tensor ``name`` transposed by ``perm``, in C order as blocks, read a
        block at a time, where the source can (an Orbax item's TensorStore view);
        ``None`` where it cannot, and the whole transposed array is made instead."""
        return None

    def permuted_slice(self, name: str, index: Index, perm: Perm) -> np.ndarray | None:
        """``read_slice(name, index)`` transposed by ``perm`` into one new C-ordered
        array, made in one pass where the source can (a stack: each member's slice
        transposed straight into its place, from the source's memory, on a few
        threads); ``None`` where it cannot, and the slice is read, then transposed."""
        return None

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``read(name)[index]`` as a numpy array; sources that can read part of
        a tensor without the rest (a mapped file) read only those bytes."""
        return np.asarray(self.read(name)[index])

    def slice_view(self, name: str, index: Index) -> np.ndarray:
        """``read(name)[index]``, a view of the source's own memory where it has it (a
        mapped file's pages): valid while the source is open, and never to be
        written to. Where it holds none, what :meth:`read_slice` reads (the default).
        A reader that hands the block on to be copied once (a device's block of a
        sharded array) reads through it; one that keeps what it reads, through
        :meth:`read_slice`."""
        return self.read_slice(name, index)

    def chunk_lines(self) -> tuple[str, ...]:
        """How the tensors are split across the files, one line per tensor, for
        reports (a DCP folder's chunks); none where each is stored whole."""
        return ()

    def chunk_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of the chunks the source stores ``name`` in, where a read of
        part of a chunk decodes all of it (an Orbax item's TensorStore chunks);
        ``None`` where any part is read alone (a mapped file, memory)."""
        return None

    def manifest(self) -> Manifest | None:
        """The per-tensor hashes the input carries (written by ``convert --manifest``:
        an Orbax item's ``jaxshare_manifest.json``, a ``.safetensors`` file's
        metadata, a Hugging Face directory's index); ``None`` where it has none.

        Raises:
          ValueError: a manifest that is not one (one line naming the file).
        """
        return None

    @property
    def recorded_ties(self) -> tuple[RecordedTie, ...]:
        """Every tie the input records, as it records it: those the source applies
        (:attr:`ties`, with their :attr:`origins`), then :attr:`unapplied_ties`."""
        applied = tuple(
            RecordedTie(a, c, self.origins.get(a, ALIAS_MAP), self.ties.transform(a))
            for a, c in self.ties.items()
        )
        return applied + tuple(self.unapplied_ties)

    def close(self) -> None:  # noqa: B027 -- optional: most sources hold no file open.
        """Releases files; arrays already returned stay valid."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def flax_named(self) -> bool:
        """Whether the names are Flax paths (``'/'``-joined: an Orbax item, a
        ``.safetensors`` file jaxshare wrote in Flax names) rather than PyTorch
        names (``'.'``-joined, no ``'/'``)."""
        return any("/" in name for name in self.infos)

    @property
    def where(self) -> str:
        """How messages name this source."""
        return str(self.path) if self.path is not None else f"the {self.kind}"

    @property
    def written_out(self) -> frozenset[str]:
        """Aliases the source stores a second time (in :attr:`infos`, e.g. for
        readers that know no ties); sources whose aliases share their canonical's
        memory (a ``torch.save`` file) override this with none."""
        return frozenset(a for a in self.ties if a in self.infos)

    def report(self) -> TieReport:
        """The tie report of this source (what ``jaxshare inspect`` prints)."""
        stored = {k: v for k, v in self.infos.items() if k not in self.ties}
        return TieReport(
            self.where,
            self.kind,
            stored,
            self.ties,
            self.written_out,
            dict(self.origins),
            tuple(self.parts),
            tuple(self.assets),
            self.other_files,
            self.chunk_lines(),
            tuple(self.notes),
        )


class SourceView(TensorSource):
    """A view of ``source``: its tensors named, cut or joined otherwise (a subclass
    gives ``infos`` and :meth:`array`), the rest of what it says of itself kept -- its
    path, kind, parts, assets and config -- and closing it closes ``source``."""

    def __init__(self, source: TensorSource) -> None:
        self._source = source
        self.path, self.kind = source.path, source.kind
        self.parts, self.assets, self.other_files = source.parts, source.assets, source.other_files
        self.config, self.live = source.config, source.live

    @property
    def where(self) -> str:
        return self._source.where

    def read(self, name: str) -> Any:
        return self.array(name)

    def close(self) -> None:
        self._source.close()


class RetiedSource(TensorSource):
    """``source`` with other ties (and more assets): the same tensors, read through
    it; everything else the source says of itself is kept. Conversions that are
    told of ties an input does not record (``--tie``, a config's) read it so.

    Args:
      source: the source read.
      ties: its ties now (every canonical stored; an alias it also stores is
        written out).
      origins: where the new ties come from, by alias (the source's own kept).
      assets: more files that travel with the tensors, by name.
      config: the model's config now, where one is given for an input that
        declares none (a DCP folder converted with ``--config``); the source's
        own otherwise.
    """

    def __init__(
        self,
        source: TensorSource,
        ties: AliasMap,
        origins: Mapping[str, str] | None = None,
        assets: Mapping[str, Path] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._source = source
        self.path, self.kind, self.infos = source.path, source.kind, source.infos
        self.ties, self.origins = ties, {**source.origins, **(origins or {})}
        self.layers, self.buffers = source.layers, source.buffers
        self.config = source.config if config is None else config
        self.parts, self.other_files, self.notes = source.parts, source.other_files, source.notes
        self.assets = {**source.assets, **(assets or {})}
        self.mapped, self.unapplied_ties, self.live = (
            source.mapped,
            source.unapplied_ties,
            source.live,
        )

    @property
    def where(self) -> str:
        return self._source.where

    @property
    def flax_named(self) -> bool:
        return self._source.flax_named

    @property
    def written_out(self) -> frozenset[str]:
        shared = self._source.ties
        own = {a for a in self._source.written_out if a in self.ties}
        return frozenset(own | {a for a in self.ties if a in self.infos and a not in shared})

    def read(self, name: str) -> Any:
        return self._source.read(name)

    def array(self, name: str) -> np.ndarray:
        return self._source.array(name)

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        return self._source.blocks(name)

    def extents(self, name: str) -> Sequence[FileRange]:
        return self._source.extents(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return self._source.read_slice(name, index)

    def permuted_slice(self, name: str, index: Index, perm: Perm) -> np.ndarray | None:
        return self._source.permuted_slice(name, index, perm)

    def array_in_rows(self, name: str) -> tuple[np.ndarray, Iterator[np.ndarray]] | None:
        return self._source.array_in_rows(name)

    def permuted_array(self, name: str, perm: Perm) -> np.ndarray | None:
        return self._source.permuted_array(name, perm)

    def permutes_as_read(self, name: str) -> bool:
        return self._source.permutes_as_read(name)

    def permuted_blocks(self, name: str, perm: Perm) -> Iterable[np.ndarray] | None:
        return self._source.permuted_blocks(name, perm)

    def chunk_shape(self, name: str) -> tuple[int, ...] | None:
        return self._source.chunk_shape(name)

    def chunk_lines(self) -> tuple[str, ...]:
        return self._source.chunk_lines()

    def manifest(self) -> Manifest | None:
        return self._source.manifest()

    def close(self) -> None:
        self._source.close()


def file_part(path: str | os.PathLike, tensors: int) -> str:
    """One line of :attr:`TensorSource.parts`: a file's name, size and tensor count."""
    from jaxshare.core.report import format_bytes

    path = Path(path)
    return f"{path.name}: {tensors} tensors, {format_bytes(path.stat().st_size)}"
