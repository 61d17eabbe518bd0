"""PyTorch Distributed Checkpoint (DCP) folders, read with numpy only and never running pickle code.

A DCP folder is ``.metadata`` (:mod:`jaxshare.formats.dcp.metadata`: each item's
chunks and the records that hold them) and one or more ``__{rank}_{i}.distcp``
files per rank, holding the records. torch 2.x writes every record as a
``torch.save`` zip archive of its own (the chunk as a contiguous tensor); a
record exactly ``prod(sizes) * itemsize`` long is read as the chunk's raw bytes,
in C order. Records written through a stream transform (DCP's experimental
``_extensions``, e.g. ``stream.zstd/1``) are refused.

Tensor records are read by the restricted unpickler of the ``torch.save`` core
(:mod:`jaxshare.formats.torch_save.unpickle`) as numpy views of the mapped
``.distcp`` file: no copy until chunks are assembled, and a slice reads only the
chunks it overlaps. torch is never imported.

Everything is checked when a folder is opened, each problem one ``ValueError``
line naming the file: the metadata (see :func:`read_dcp_metadata`), every
record's file present, inside the folder and long enough (a truncated file
names the bytes expected and found), no two records on the same bytes. A record
is checked against its chunk (shape, dtype, length) when it is read.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import threading
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import itemsize, numpy_dtype
from jaxshare.core.naming import NamingRecord
from jaxshare.core.report import ALIAS_MAP, STORAGE, format_bytes
from jaxshare.core.strict_json import reading
from jaxshare.formats.dcp.files import DISTCP_SUFFIX
from jaxshare.formats.dcp.metadata import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    DCPChunk,
    DCPRecord,
    DCPTensor,
    read_dcp_metadata,
)
from jaxshare.formats.dcp.tiling import overlapping_spans
from jaxshare.formats.item_files import ALIAS_MAP_FILE, NAMING_FILE
from jaxshare.formats.torch_save.unpickle import unpickle_zip, unpickling
from jaxshare.formats.torch_save.zip import TorchZip
from jaxshare.io.mapped import FileRange, map_file, scattered_reads
from jaxshare.io.source import Index, TensorSource

__all__ = ["AUTO", "TRAINING_STATE_KEYS", "DCPFolder"]
#: What a record's file may be called: a name inside the folder (no separators, no
#: control characters).
_FILE_NAME = re.compile(r"[^/\\\x00-\x1f\x7f]+")
#: Why a folder written in DCP's safetensors serialization is refused.
_SAFETENSORS_HINT = (
    ": the folder was written with FileSystemWriter(serialization_format=SAFETENSORS), whose "
    "records torch's own FileSystemReader cannot read either; save it with the default "
    "(torch.save) serialization"
)
#: ``part=`` default: the model part of a training checkpoint, else everything.
AUTO = "auto"
#: Top-level keys of a training checkpoint beside its model: torchtitan's
#: (``optimizer``, ``lr_scheduler``, ``dataloader``, ``train_state``) and torchtune's.
TRAINING_STATE_KEYS = frozenset(
    {
        "optimizer", "optim", "lr_scheduler", "lr_schedulers", "dataloader", "train_state",
        "seed", "epochs_run", "total_epochs", "max_steps_per_epoch", "steps_run",
    }
)  # fmt: skip
_MODEL = "model"


# -- the folder ------------------------------------------------------------------------


def _unpickle_record(data: np.ndarray) -> Any:
    """A ``torch.save`` record (a zip archive) in ``data``, unpickled by the
    restricted unpickler of ``torch.save`` files: tensors are views of ``data``."""
    # (`TorchZip` opens the record with zipfile over `data` itself. Its directory, at
    # the record's end, and headers are read page by page: a record read past the page
    # cache reads its values again, and an 8 GB folder read 9.65 GB with the kernel's
    # read-around.)
    with scattered_reads(data):
        return unpickle_zip(TorchZip(data), {})


@dataclass(frozen=True)
class _Item:
    """One exposed tensor: its fqn in the folder and what the metadata says."""

    fqn: str
    tensor: DCPTensor


class DCPFolder(TensorSource):
    """A PyTorch Distributed Checkpoint folder, read with numpy only: a
    :class:`~jaxshare.stream.TensorSource` whose tensors are assembled from the
    chunks of any number of ranks, bit for bit, and whose slices read only the
    chunks they overlap.

    Names are DCP's flattened fqns, within ``part``: a training checkpoint
    (top-level ``model`` beside ``optimizer``, ``lr_scheduler``, ``dataloader``,
    ``train_state``, as torchtitan and torchtune save it; or the model's keys at
    the top level beside them, as newer torchtitan does) shows its model by
    default, ``model.`` stripped, and :attr:`notes` says what else it holds.
    DCP itself records no ties: two fqns over the very same records are one
    (origin ``"storage"``), and so is each alias of the alias map jaxshare writes
    beside the records (``jaxshare_alias_map.json`` and its naming record; origin
    ``"alias map"``).

    Args:
      path: the folder (holding ``.metadata`` and ``__{rank}_{i}.distcp``).
      part: the top-level key whose items to expose, its prefix stripped
        (``"optimizer"`` gives ``state.wte.weight.exp_avg``...); ``None``: every
        item, as DCP names it; :data:`AUTO` (default): ``"model"`` in a training
        checkpoint, else every item.
      max_metadata_bytes: as :func:`read_dcp_metadata`'s ``max_bytes``.

    Attributes:
      metadata: the folder's :class:`~jaxshare.formats.dcp.metadata.DCPMetadata`.
      part: the part exposed (``None``: everything).
      top_level: the top-level keys of the saved state dict.
      other_items: names of the items of ``part`` that are not tensors (read
        one with :meth:`read_item`).
      notes: one line saying what else the folder holds, where ``part`` hides
        something (for the command line to print).
      bytes_read: the data bytes of the chunks reads have used so far (a
        chunk counts whole each time a read uses it): a slice inside one chunk
        adds that chunk's bytes only.

    Raises:
      FileNotFoundError: no such folder or ``.metadata``.
      ValueError: one line naming the file: metadata refused or invalid (see
        :func:`read_dcp_metadata`); a record in a file that is missing, outside
        the folder, shorter than the record needs (truncated) or written through
        a stream transform; a ``part`` the folder does not have.

    >>> import pathlib, jaxshare
    >>> FIXTURES = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/dcp"
    >>> with DCPFolder(FIXTURES / "sharded") as ckpt:
    ...     print(ckpt.part, ckpt.top_level, ckpt.infos["fc.weight"])
    ...     print(ckpt.notes[0])
    ...     print([(offsets, sizes) for offsets, sizes, _ in ckpt.chunks("fc.weight")])
    ...     print(ckpt.array("fc.weight").shape, ckpt.read_slice("fc.weight", (slice(5, 7),)).shape)
    model ('model', 'optimizer', 'train_state') ArrayInfo(shape=(7, 6), dtype='float32')
    also holds: optimizer (21 tensors, 12 other items), train_state (1 other item)
    [((0, 0), (4, 6)), ((4, 0), (3, 6))]
    (7, 6) (2, 6)
    >>> with DCPFolder(FIXTURES / "sharded", part="train_state") as state:
    ...     print(state.other_items, state.read_item("step"))
    ('step',) 3
    """

    kind = "dcp"
    mapped = True  # chunks are views of the mapped files

    def __init__(
        self,
        path: str | os.PathLike,
        /,
        *,
        part: str | None = AUTO,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> None:
        self.folder = self.path = Path(path)
        self.bytes_read = 0
        self._lock = threading.Lock()
        self._maps: dict[str, np.ndarray] = {}
        self._arrays: dict[DCPRecord, np.ndarray] = {}
        if not self.folder.is_dir():
            raise FileNotFoundError(
                f"{self.folder}: no such folder; expected a DCP checkpoint folder (holding "
                f"{METADATA_FILE} and __RANK_I{DISTCP_SUFFIX} files)."
            )
        self.metadata = read_dcp_metadata(self.folder, max_bytes=max_metadata_bytes)
        self.top_level = self.metadata.top_level
        self._sizes = self._check_records()
        self._training = self._holds_training()
        self.part = self._choose_part(part)
        self._items: dict[str, _Item] = {}
        self._objects: dict[str, str] = {}  # name -> fqn
        for fqn, key in self.metadata.keys.items():
            name = self._name_in_part(fqn, key)
            if name is None:
                continue
            tensor = self.metadata.tensors.get(fqn)
            if tensor is not None:
                self._items[name] = _Item(fqn, tensor)
            else:
                self._objects[name] = fqn
        self.infos = {name: item.tensor.info for name, item in self._items.items()}
        self.other_items: tuple[str, ...] = tuple(self._objects)
        self.notes = self._notes()
        shared = self._ties()
        recorded = self._recorded_ties()
        aliases = {**shared, **recorded}
        try:
            self.ties = AliasMap(aliases, transforms=recorded.transforms).with_naming(
                recorded.naming
            )
        except ValueError as e:
            raise ValueError(f"{self.folder / ALIAS_MAP_FILE}: {e}") from None
        self.origins = {a: ALIAS_MAP if a in recorded else STORAGE for a in aliases}
        self._written_out = frozenset(a for a in recorded if a in self.infos and a not in shared)
        self.parts = self._part_lines()
        self.other_files = tuple(
            sorted(
                p.name
                for p in self.folder.iterdir()
                if p.name not in (METADATA_FILE, ALIAS_MAP_FILE, NAMING_FILE)
                and p.name not in self._sizes
            )
        )

    # -- opening -------------------------------------------------------------------

    def _records(self) -> Iterator[tuple[str, DCPRecord]]:
        for fqn, tensor in self.metadata.tensors.items():
            for chunk in tensor.chunks:
                yield fqn, chunk.record
        yield from self.metadata.objects.items()

    def _check_records(self) -> dict[str, int]:
        """``{file: size}``; every record's file is a file of the folder, long
        enough, and read without a transform."""
        ends: dict[str, tuple[int, str]] = {}
        for fqn, record in self._records():
            name = record.file
            if not _FILE_NAME.fullmatch(name) or name in (".", ".."):
                raise ValueError(
                    f"{self.metadata.path}: the record of {fqn!r} is in {name!r}; expected a "
                    "file name inside the folder (DCP writes __RANK_I.distcp)."
                )
            if record.transforms:
                raise ValueError(
                    f"{self.folder / name}: the record of {fqn!r} was written through the stream "
                    f"transform(s) {list(record.transforms)} (DCP's `_extensions`); jaxshare "
                    "reads untransformed records only: load the folder with torch and save it "
                    "again without `_extensions`."
                )
            end = record.offset + record.length
            if end > ends.get(name, (-1, ""))[0]:
                ends[name] = (end, fqn)
        sizes = {}
        for name, (end, fqn) in ends.items():
            file = self.folder / name
            if not file.is_file():
                raise ValueError(
                    f"{file}: no such file; the metadata puts the record of {fqn!r} in it "
                    "(a rank's file is missing)."
                )
            size = file.stat().st_size
            if size < end:
                raise ValueError(
                    f"{file}: truncated: expected at least {end} bytes (the record of {fqn!r} "
                    f"ends there), found {size}."
                )
            sizes[name] = size
        self._check_overlaps()
        self._check_raw_records()
        return sizes

    def _check_overlaps(self) -> None:
        """No two records share bytes, unless they are one record (a tie written once)."""
        spans: dict[str, dict[tuple[int, int], str]] = {}
        for fqn, record in self._records():
            if record.length:
                spans.setdefault(record.file, {}).setdefault((record.offset, record.length), fqn)
        for name, found in spans.items():
            overlap = overlapping_spans(found)
            if overlap is not None:
                last, fqn, offset, end = overlap
                raise ValueError(
                    f"{self.folder / name}: the records of {last!r} and {fqn!r} overlap "
                    f"(the second starts at byte {offset}, before the first ends at {end}); "
                    "expected each record on bytes of its own"
                    + _SAFETENSORS_HINT * self._safetensors_at(name, offset)
                    + "."
                )

    def _check_raw_records(self) -> None:
        """A raw-looking record (``prod(sizes) * itemsize`` long) is not the
        safetensors blob DCP's ``SAFETENSORS`` serialization writes."""
        for fqn, tensor in self.metadata.tensors.items():
            size = itemsize(tensor.dtype)
            for chunk in tensor.chunks:
                record = chunk.record
                if record.length == chunk.numel * size and self._safetensors_at(
                    record.file, record.offset
                ):
                    raise ValueError(
                        f"{self.folder / record.file}: a safetensors header where the metadata "
                        f"puts the raw bytes of {fqn!r}" + _SAFETENSORS_HINT + "."
                    )

    def _safetensors_at(self, name: str, offset: int) -> bool:
        """Whether a safetensors header of DCP's starts at byte ``offset`` of ``name``."""
        data = self._file(name)
        head = data[offset : offset + 9].tobytes()
        if len(head) < 9 or head[8:9] != b"{":
            return False
        n = int.from_bytes(head[:8], "little")
        header = data[offset + 8 : offset + 8 + min(n, 1 << 20)].tobytes()
        return b'"data_offsets"' in header and b'"DCP_SHARDING_INFO"' in header

    def _holds_training(self) -> bool:
        top = set(self.top_level)
        if _MODEL in top:
            return top - {_MODEL} <= TRAINING_STATE_KEYS
        return "optimizer" in top and bool(self._flat_model_fqns())

    def _flat_model_fqns(self) -> list[str]:
        """The tensors of a training checkpoint whose model keys are top level."""
        return [
            fqn for fqn in self.metadata.tensors
            if str(self.metadata.keys[fqn][0]) not in TRAINING_STATE_KEYS
        ]  # fmt: skip

    def _choose_part(self, part: str | None) -> str | None:
        if part == AUTO:
            return _MODEL if self._training else None
        if part is None:
            return None
        if not isinstance(part, str) or (
            part not in self.top_level and not (part == _MODEL and self._training)
        ):
            raise ValueError(
                f"{self.folder}: `part` {part!r} is not a top-level key of this checkpoint; "
                f"expected one of {list(self.top_level)[:12]} (or None for every item)."
            )
        return part

    def _part_of(self, key: tuple[str | int, ...]) -> str:
        top = str(key[0])
        if _MODEL not in self.top_level and top not in TRAINING_STATE_KEYS and self._training:
            return _MODEL  # newer torchtitan: the model's keys at the top level
        return top

    def _name_in_part(self, fqn: str, key: tuple[str | int, ...]) -> str | None:
        if self.part is None:
            return fqn
        if self._part_of(key) != self.part:
            return None
        if str(key[0]) != self.part or not fqn.startswith(f"{self.part}."):
            return fqn
        return fqn[len(self.part) + 1 :]

    def _notes(self) -> tuple[str, ...]:
        items = ()
        if self.other_items:  # Listed, never read as tensors.
            shown = ", ".join(self.other_items[:8])
            more = f" (+{len(self.other_items) - 8} more)" if len(self.other_items) > 8 else ""
            items = (f"items that are not tensors: {shown}{more}",)
        if self.part is None:
            return items
        counts: dict[str, list[int]] = {}
        for fqn, key in self.metadata.keys.items():
            part = self._part_of(key)
            if part != self.part:
                counts.setdefault(part, [0, 0])[fqn not in self.metadata.tensors] += 1
        if not counts:
            return items

        def what(tensors: int, others: int) -> str:
            words = [f"{tensors} tensor{'s' * (tensors != 1)}"] if tensors else []
            words += [f"{others} other item{'s' * (others != 1)}"] if others else []
            return ", ".join(words)

        held = ", ".join(f"{p} ({what(*n)})" for p, n in counts.items())
        return (*items, f"also holds: {held}")

    def _ties(self) -> dict[str, str]:
        """Names over the very same records (a tie written once); zero-size tensors
        are never tied."""
        first: dict[tuple, str] = {}
        aliases = {}
        for name, item in self._items.items():
            t = item.tensor
            if not math.prod(t.shape):
                continue
            key = (t.shape, t.dtype, tuple((c.offsets, c.sizes, c.record) for c in t.chunks))
            canonical = first.setdefault(key, name)
            if canonical != name:
                aliases[name] = canonical
        return aliases

    def _recorded_ties(self) -> AliasMap:
        """The alias map jaxshare wrote beside the records (``jaxshare_alias_map.json``,
        in the folder's fqns, with its naming record), in this part's names."""
        file = self.folder / ALIAS_MAP_FILE
        if not file.is_file():
            return AliasMap()
        naming_file = self.folder / NAMING_FILE
        with reading(file):
            recorded = AliasMap.from_json(file.read_bytes())
            naming = (
                NamingRecord.from_json(naming_file.read_bytes()) if naming_file.is_file() else None
            )
        names = {item.fqn: name for name, item in self._items.items()}
        aliases, transforms = {}, {}
        for alias, canonical in recorded.items():
            if canonical not in self.metadata.tensors:
                raise ValueError(
                    f"{file}: ties {alias!r} to {canonical!r}; expected a tensor of the folder, "
                    f"found none of that name."
                )
            if canonical not in names:
                continue  # another part's tie
            name = names.get(alias, alias)
            aliases[name] = names[canonical]
            if recorded.transform(alias) is not None:
                transforms[name] = recorded.transform(alias)
        return AliasMap(aliases, transforms=transforms, naming=naming if aliases else None)

    def _part_lines(self) -> tuple[str, ...]:
        chunks: dict[str, int] = dict.fromkeys(self._sizes, 0)
        objects: dict[str, int] = dict.fromkeys(self._sizes, 0)
        for tensor in self.metadata.tensors.values():
            for chunk in tensor.chunks:
                chunks[chunk.record.file] += 1
        for record in self.metadata.objects.values():
            objects[record.file] += 1
        lines = []
        for name in sorted(self._sizes):
            extra = f", {objects[name]} other items" if objects[name] else ""
            lines.append(f"{name}: {chunks[name]} chunks{extra}, {format_bytes(self._sizes[name])}")
        return tuple(lines)

    def chunk_lines(self) -> tuple[str, ...]:
        """One line per tensor: its chunks, each as its index range and file
        (``fc.weight: [0:4, 0:6] __0_0.distcp, [4:7, 0:6] __1_0.distcp``)."""
        lines = []
        for name in self.infos:
            cells = []
            for offsets, sizes, file in self.chunks(name):
                box = ", ".join(f"{o}:{o + n}" for o, n in zip(offsets, sizes, strict=True))
                cells.append(f"[{box}] {file}")
            lines.append(f"{name}: {', '.join(cells) or 'no chunks'}")
        return tuple(lines)

    # -- records -------------------------------------------------------------------

    def _file(self, name: str) -> np.ndarray:
        with self._lock:
            data = self._maps.get(name)
            if data is None:
                data = self._maps[name] = map_file(self.folder / name)
        return data

    def _record_bytes(self, record: DCPRecord) -> np.ndarray:
        data = self._file(record.file)
        view = data[record.offset : record.offset + record.length]
        if view.size != record.length:  # the file shrank since it was opened
            raise ValueError(
                f"{self.folder / record.file}: truncated: expected at least "
                f"{record.offset + record.length} bytes, found {data.size}."
            )
        return view

    def _chunk(self, item: _Item, chunk: DCPChunk) -> np.ndarray:
        """The values of ``chunk``, of its sizes: a read-only view of the mapped file."""
        record = chunk.record
        with self._lock:
            self.bytes_read += chunk.numel * itemsize(item.tensor.dtype)
            found = self._arrays.get(record)
        if found is not None:
            return found
        dtype = numpy_dtype(item.tensor.dtype)
        data = self._record_bytes(record)
        where = (
            f"{self.folder / record.file}: the record of {item.fqn!r} at offsets {chunk.offsets} "
            f"(bytes {record.offset}..{record.offset + record.length})"
        )
        if record.length == chunk.numel * dtype.itemsize:  # raw bytes, C order
            array = data.view(dtype).reshape(chunk.sizes)
        else:
            with unpickling(
                lambda why: (
                    f"{where}: refused: a torch.save record that would run code "
                    f"beyond rebuilding a tensor ({why})."
                ),
                lambda why: (
                    f"{where}: expected the chunk's {chunk.numel * dtype.itemsize} raw "
                    f"bytes or a torch.save record of it, found neither ({why})."
                ),
            ):
                array = _unpickle_record(data)
            if (
                not isinstance(array, np.ndarray)
                or array.dtype != dtype
                or (array.shape != chunk.sizes)
            ):
                found_text = (
                    f"a {array.dtype.name} tensor of shape {array.shape}"
                    if isinstance(array, np.ndarray)
                    else f"a {type(array).__name__}"
                )
                raise ValueError(
                    f"{where}: expected a {dtype.name} tensor of shape {chunk.sizes}, as the "
                    f"metadata says, found {found_text}."
                )
        with self._lock:
            self._arrays[record] = array
        return array

    def _item(self, name: str) -> _Item:
        try:
            return self._items[name]
        except KeyError:
            hint = (
                "it is an item that is not a tensor (see `other_items`)"
                if name in self._objects
                else f"the tensors are {list(self._items)[:5]}..."
            )
            raise KeyError(f"{self.folder}: no tensor named {name!r}; {hint}") from None

    # -- tensors -------------------------------------------------------------------

    def chunks(self, name: str, /) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
        """``(offsets, sizes, file)`` of each chunk of tensor ``name``, as stored."""
        return [(c.offsets, c.sizes, c.record.file) for c in self._item(name).tensor.chunks]

    def _filled(self, item: _Item) -> list[DCPChunk]:
        return [c for c in item.tensor.chunks if c.numel]

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` whole: a read-only view of the mapped file where one
        chunk holds it all, else its chunks assembled into memory of its own."""
        item = self._item(name)
        t = item.tensor
        filled = self._filled(item)
        if len(filled) == 1 and filled[0].sizes == t.shape:
            return self._chunk(item, filled[0])
        out = np.empty(t.shape, numpy_dtype(t.dtype))
        for chunk in filled:
            out[chunk.index()] = self._chunk(item, chunk)
        return out

    def read(self, name: str) -> np.ndarray:
        """:meth:`array`."""
        return self.array(name)

    def extents(self, name: str) -> Sequence[FileRange]:
        return [
            (os.fspath(self.folder / c.record.file), c.record.offset, c.record.length)
            for c in self._filled(self._item(name))
        ]

    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """Tensor ``name`` in C order as blocks end to end: its chunks as views
        of the mapped files where they are whole rows (one chunk, or chunks that
        split the first axis only, as FSDP shards), else the assembled array."""
        item = self._item(name)
        t = item.tensor
        filled = sorted(self._filled(item), key=lambda c: c.offsets)
        if t.shape and all(c.sizes[1:] == t.shape[1:] for c in filled):
            for chunk in filled:
                yield self._chunk(item, chunk)
        else:
            yield self.array(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]`` (one slice of step 1 per axis, as sharded loading
        asks), read from the chunks it overlaps only."""
        item = self._item(name)
        t = item.tensor
        box = _box(t.shape, index, lambda: f"{self.folder}: {name!r}")
        out = np.empty(tuple(hi - lo for lo, hi in box), numpy_dtype(t.dtype))
        for chunk in self._filled(item):
            cut = [
                (max(lo, o), min(hi, o + n))
                for (lo, hi), o, n in zip(box, chunk.offsets, chunk.sizes, strict=True)
            ]
            if any(a >= b for a, b in cut):
                continue
            values = self._chunk(item, chunk)
            src = tuple(slice(a - o, b - o) for (a, b), o in zip(cut, chunk.offsets, strict=True))
            dst = tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(cut, box, strict=True))
            out[dst] = values[src]
        return out

    # -- other items ---------------------------------------------------------------

    def read_item(self, name: str, /) -> Any:
        """The item ``name`` that is not a tensor (:attr:`other_items`), unpickled
        by the restricted unpickler of ``torch.save`` files: plain Python values
        (numbers, strings, lists, dicts) and tensors as numpy arrays; an object of
        any other class is refused, never built.

        Raises:
          KeyError: no such item.
          ValueError: one line naming the file: the record is damaged, or holds
            an object whose class would run code when unpickled.
        """
        fqn = self._objects.get(name)
        if fqn is None:
            raise KeyError(
                f"{self.folder}: no item named {name!r} that is not a tensor; they are "
                f"{list(self._objects)[:6]}"
            )
        record = self.metadata.objects[fqn]
        where = f"{self.folder / record.file}: the record of {fqn!r}"
        try:
            return _unpickle_record(self._record_bytes(record))
        except pickle.UnpicklingError as e:
            raise ValueError(
                f"{where}: refused: unpickling it would run code ({e}); load it with torch "
                "if you trust the folder."
            ) from None
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{where}: expected a torch.save record, found none ({type(e).__name__}: {e})."
            ) from None

    @property
    def written_out(self) -> frozenset[str]:
        """Aliases stored as tensors of their own (a tie across an axis-order change);
        the others share their canonical's records."""
        return self._written_out

    def close(self) -> None:
        """Lets go of the mapped files; arrays already returned stay valid."""
        with self._lock:
            self._maps, self._arrays = {}, {}

    def __repr__(self) -> str:
        return (
            f"DCPFolder({str(self.folder)!r}, part={self.part!r}, tensors={len(self.infos)}, "
            f"other_items={len(self.other_items)})"
        )


def _box(shape: tuple[int, ...], index: Index, where: Callable[[], str]) -> list[tuple[int, int]]:
    if not isinstance(index, tuple) or len(index) > len(shape):
        raise IndexError(f"{where()}: expected one slice per axis of {shape}, got {index!r}")
    box = []
    for n, s in zip(shape, index + (slice(None),) * (len(shape) - len(index)), strict=True):
        if not isinstance(s, slice):
            raise IndexError(f"{where()}: expected slices, got {index!r}")
        lo, hi, step = s.indices(n)
        if step != 1:
            raise IndexError(f"{where()}: expected slices of step 1, got {index!r}")
        box.append((lo, max(lo, hi)))
    return box
