"""PyTorch Distributed Checkpoint (DCP) folders, written with numpy only.

A folder that ``torch.distributed.checkpoint.FileSystemWriter`` writes, and
stock ``dcp.load`` reads, is

- ``__0_0.distcp``: one record per stored tensor, back to back. A record is a
  complete ``torch.save`` zip archive of the one tensor (``archive/data.pkl``,
  the raw bytes in ``archive/data/0``, ...), because
  ``FileSystemReader.read_data`` hands the bytes ``offset:offset + length`` of
  the file to ``torch.load`` for every tensor it reads;
- ``.metadata``: a pickle of ``torch.distributed.checkpoint.metadata.Metadata``:
  for each fully qualified name (FQN) its dtype, size and chunks, and, keyed by
  ``MetadataIndex(fqn, chunk offsets)``, the ``_StorageInfo(relative_path,
  offset, length)`` of the record that holds it.

:func:`write_dcp` writes such a folder from a plan, without torch: each stored
tensor of the plan is one record, streamed from the source a block at a time;
an alias of the plan's tie map is one more FQN whose ``_StorageInfo`` is its
canonical's, so the tie is stored once and ``dcp.load`` fills both names from
the same bytes. DCP itself records no ties: jaxshare's alias map stands beside
the files (:data:`ALIAS_MAP_FILE`), with the naming record if the plan has one.

The records are written by the ``torch.save`` core
(:func:`~jaxshare.formats.torch_save.zip.write_tensor_archive`), and the metadata
pickle is assembled opcode by opcode
(:func:`~jaxshare.formats.torch_save.emit.torch_pickle`): the pickle names torch's
classes (``torch.Size``, ``torch.float32``, DCP's dataclasses), which torch's
unpickler resolves, but nothing here imports torch to name them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxshare.core.perm import Perm, permute_shape
from jaxshare.core.progress import ProgressFn
from jaxshare.core.report import ArrayInfo
from jaxshare.formats.dcp.files import DISTCP_SUFFIX
from jaxshare.formats.dcp.metadata import METADATA_FILE, METADATA_MODULE
from jaxshare.formats.item_files import ALIAS_MAP_FILE, NAMING_FILE
from jaxshare.formats.torch_save.emit import Global, NewObject, Reduce, torch_pickle
from jaxshare.formats.torch_save.tables import DCP_DTYPES
from jaxshare.formats.torch_save.zip import Record, write_tensor_archive
from jaxshare.io.atomic import OutputKind, atomic_output, fsync_dir, write_synced
from jaxshare.io.output_file import WriteBehind
from jaxshare.io.plan import Plan, PlanEntry
from jaxshare.io.source import TensorSource
from jaxshare.io.transpose import contiguous_transpose

__all__ = ["DCP_DATA_FILE", "DCP_FOLDER", "DCP_VERSION", "holds_only_dcp", "write_dcp"]

#: The one data file :func:`write_dcp` writes (rank 0's first file, as DCP names it).
DCP_DATA_FILE = "__0_0.distcp"
#: The version the metadata records:
#: ``torch.distributed.checkpoint.filesystem.CURRENT_DCP_VERSION`` of torch 2.13.
DCP_VERSION = "1.0.0"

_FILESYSTEM = "torch.distributed.checkpoint.filesystem"


# -- the metadata, named as torch names it -----------------------------------------------


def _size(shape: Sequence[int]) -> Reduce:
    return Reduce(Global("torch", "Size"), (tuple(shape),))


def _check_dtype(info: ArrayInfo, name: str) -> None:
    if info.dtype not in DCP_DTYPES:
        raise ValueError(
            f"{name!r} has dtype {info.dtype}, which a DCP folder cannot store (torch has no "
            f"such dtype); it stores {', '.join(sorted(DCP_DTYPES))}. Pass `dtype=` to cast "
            "floating arrays, or convert this array first."
        )


def _tensor_metadata(info: ArrayInfo) -> NewObject:
    """``TensorStorageMetadata`` of a tensor stored whole: one chunk at offset 0."""
    properties = NewObject(
        Global(METADATA_MODULE, "TensorProperties"),
        (  # TensorProperties.__getstate__: dtype, layout, requires_grad, memory format, pinned.
            Global("torch", info.dtype),
            Reduce(Global("torch.serialization", "_get_layout"), ("torch.strided",)),
            False,
            Reduce(Global(METADATA_MODULE, "_MEM_FORMAT_ENCODING"), (0,)),  # contiguous_format
            False,
        ),
    )
    zeros = _size((0,) * len(info.shape))
    chunk = NewObject(
        Global(METADATA_MODULE, "ChunkStorageMetadata"),
        {"offsets": zeros, "sizes": _size(info.shape)},
    )
    return NewObject(
        Global(METADATA_MODULE, "TensorStorageMetadata"),
        {"properties": properties, "size": _size(info.shape), "chunks": [chunk]},
    )


def _metadata_pickle(fqns: dict[str, tuple[ArrayInfo, Record]]) -> bytes:
    """The ``.metadata`` pickle: ``Metadata`` of every FQN, each over its record."""
    storage = {}
    for fqn, (info, record) in fqns.items():
        index = NewObject(
            Global(METADATA_MODULE, "MetadataIndex"),
            {"fqn": fqn, "offset": _size((0,) * len(info.shape)), "index": 0},
        )
        storage[index] = NewObject(  # _StorageInfo.__getstate__ leaves out a None field.
            Global(_FILESYSTEM, "_StorageInfo"),
            {"relative_path": DCP_DATA_FILE, "offset": record.offset, "length": record.length},
        )
    metadata = NewObject(
        Global(METADATA_MODULE, "Metadata"),
        {
            "state_dict_metadata": {fqn: _tensor_metadata(info) for fqn, (info, _) in fqns.items()},
            "planner_data": {fqn: (fqn,) for fqn in fqns},  # A flat state dict: one key each.
            "storage_data": storage,
            "storage_meta": NewObject(
                Global(METADATA_MODULE, "StorageMeta"),
                {"checkpoint_id": None, "save_id": None, "load_id": None, "modules": []},
            ),
            "version": DCP_VERSION,
        },
    )
    return torch_pickle(metadata)


# -- the folder ----------------------------------------------------------------------------

_KNOWN = (METADATA_FILE, ALIAS_MAP_FILE, NAMING_FILE)


def holds_only_dcp(path: Path) -> bool:
    """Whether ``path`` is a DCP folder and nothing else: a ``.metadata`` file beside
    only DCP's files (``*.distcp``, ``__N.metadata``) and jaxshare's JSON files, so
    ``--force`` never replaces a directory that holds something more.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> holds_only_dcp(d), (d / ".metadata").touch(), holds_only_dcp(d)
    (False, None, True)
    """
    if not path.is_dir() or path.is_symlink() or not (path / METADATA_FILE).is_file():
        return False
    for child in path.iterdir():
        name = child.name
        dcp_file = name.endswith(DISTCP_SUFFIX) or (
            name.startswith("__") and name.endswith(METADATA_FILE)
        )
        if not child.is_file() or not (name in _KNOWN or dcp_file):
            return False
    return True


#: A DCP folder output, for :func:`jaxshare.io.atomic.atomic_output`.
DCP_FOLDER = OutputKind("a PyTorch DCP folder", True, holds_only_dcp)


@dataclass(frozen=True)
class _Copy:
    """An alias written out as a tensor of its own: its canonical, permuted."""

    name: str
    perm: Perm
    info: ArrayInfo


def _records_of(plan: Plan) -> tuple[dict[str, list[str]], dict[str, list[_Copy]]]:
    """``(aliases sharing each entry's record, aliases written out after it)``, checked."""
    stored = {e.name: e for e in plan.entries}
    shared: dict[str, list[str]] = {name: [] for name in stored}
    copies: dict[str, list[_Copy]] = {name: [] for name in stored}
    problems = []
    if len(stored) != len(plan.entries):
        counts = Counter(e.name for e in plan.entries)
        twice = sorted(name for name, n in counts.items() if n > 1)
        problems.append(f"the plan stores {twice[:3]} more than once")
    for canonical, aliases in plan.alias_map.groups().items():
        entry = stored.get(canonical)
        if entry is None:
            problems.append(
                f"alias {aliases[0]!r} names {canonical!r}, which the plan does not store"
            )
            continue
        for alias in aliases:
            if alias in stored:
                problems.append(f"{alias!r} is both stored and an alias of {canonical!r}")
                continue
            perm = plan.alias_map.transform(alias)
            if perm is None:
                shared[canonical].append(alias)
            else:
                info = ArrayInfo(permute_shape(entry.info.shape, perm), entry.info.dtype)
                copies[canonical].append(_Copy(alias, perm, info))
    if problems:
        raise ValueError("cannot write a DCP folder of this plan: " + "; ".join(problems) + ".")
    for entry in plan.entries:
        _check_dtype(entry.info, entry.name)
    return shared, copies


def _entries_with_arrays(
    plan: Plan, source: TensorSource, copies: dict[str, list[_Copy]]
) -> Iterator[tuple[PlanEntry, Iterable[np.ndarray], np.ndarray | None]]:
    """Each entry with its blocks, and its whole array where an alias is written out
    from it: the source's own blocks where it maps them (no copy, no read-ahead),
    else arrays read ahead on a thread (:meth:`Plan.arrays`)."""
    if source.mapped:
        for entry in plan.entries:
            array = plan.array(source, entry) if copies[entry.name] else None
            blocks = plan.blocks(source, entry) if array is None else (array,)
            yield entry, blocks, array
        return
    for entry, array in plan.arrays(source):
        yield entry, (array,), array
        del array  # Before the next is read.


def write_dcp(
    directory: str | os.PathLike,
    plan: Plan,
    source: TensorSource,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
) -> Path:
    """Writes the outputs of ``plan``, read from ``source`` one at a time, as a
    PyTorch Distributed Checkpoint folder that stock ``dcp.load`` reads.

    Each entry of the plan is stored once, in :data:`DCP_DATA_FILE`, as the
    ``torch.save`` archive of that one tensor (its raw little-endian bytes in C
    order, 64-byte aligned). Each alias of ``plan.alias_map`` is a second FQN
    whose storage info names its canonical's bytes (same file, offset and
    length), so ``dcp.load`` fills both names and the tie costs no bytes; an
    alias with a transform (a tie across an axis-order change) cannot share bytes,
    and is written out as a record of its own, its canonical permuted, right
    after it (the alias map file still records it, so a reader that knows ties
    reports it as written out). Beside the data: :data:`METADATA_FILE`, and
    :data:`ALIAS_MAP_FILE` (``plan.alias_map.to_json()``), with
    :data:`NAMING_FILE` if the plan carries a naming record.

    Memory holds about one tensor (two where an alias is written out from it,
    or a non-mapped source is read ahead). Every file is fsynced, and the
    folder is written at a temporary name and renamed into place when
    complete: a failure leaves nothing at ``directory``.

    Args:
      directory: the folder to write (a ``checkpoint_id`` for ``dcp.load``).
      plan: the outputs: names are the FQNs (PyTorch names, as
        ``module.state_dict()`` has them).
      source: what the plan reads.
      force: replace an existing DCP folder at ``directory``.
      inputs: paths the output is made from; ``directory`` may be none of them.
      progress: called after each record (``done, total, name, nbytes``).

    Returns:
      ``directory``, as a :class:`~pathlib.Path`.

    Raises:
      FileExistsError: ``directory`` exists and ``force`` is false.
      ValueError: a dtype torch has no name for; a plan whose aliases do not
        fit its entries; ``directory`` is an input, or (with ``force``) not a
        DCP folder.

    >>> import tempfile, json
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import ALIAS_MAP_KEY, SafetensorsFile
    >>> d = tempfile.mkdtemp()
    >>> tie = '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"head": "wte"}}'
    >>> save_file({"wte": np.ones((4, 2), np.float32)}, d + "/m.safetensors", {ALIAS_MAP_KEY: tie})
    >>> with SafetensorsFile(d + "/m.safetensors") as source:
    ...     out = write_dcp(d + "/dcp", Plan.identity(source), source)
    >>> sorted(p.name for p in out.iterdir())
    ['.metadata', '__0_0.distcp', 'jaxshare_alias_map.json']
    >>> json.loads((out / "jaxshare_alias_map.json").read_text())["aliases"]
    {'head': 'wte'}
    """
    shared, copies = _records_of(plan)
    total = len(plan.entries) + sum(map(len, copies.values()))
    fqns: dict[str, tuple[ArrayInfo, Record]] = {}
    done = 0
    with atomic_output(directory, DCP_FOLDER, force=force, inputs=inputs) as tmp:
        tmp.mkdir()
        with open(tmp / DCP_DATA_FILE, "wb") as f:
            behind = WriteBehind(f)  # The disk writes each record while the next is read.
            for entry, blocks, array in _entries_with_arrays(plan, source, copies):
                record = write_tensor_archive(f, entry.info, blocks, entry.name, behind.wrote)
                fqns[entry.name] = (entry.info, record)
                for alias in shared[entry.name]:
                    fqns[alias] = (entry.info, record)
                done += 1
                if progress is not None:
                    progress(done, total, entry.name, entry.info.nbytes)
                for copy in copies[entry.name]:
                    assert array is not None  # (Read whole for its copies.)
                    permuted = contiguous_transpose(array, copy.perm)
                    record = write_tensor_archive(
                        f, copy.info, (permuted,), copy.name, behind.wrote
                    )
                    del permuted
                    fqns[copy.name] = (copy.info, record)
                    done += 1
                    if progress is not None:
                        progress(done, total, copy.name, copy.info.nbytes)
                del array, blocks
            behind.close()
        files = {METADATA_FILE: _metadata_pickle(fqns)}
        files[ALIAS_MAP_FILE] = plan.alias_map.to_json(indent=1).encode()
        if plan.alias_map.naming is not None:
            files[NAMING_FILE] = plan.alias_map.naming.to_json(indent=1).encode()
        for name, data in files.items():
            write_synced(tmp / name, data)
        fsync_dir(tmp)
    return Path(directory)
