"""Writing an item from a plan one array at a time, its bytes laid out here: the
engine of ``write_item``.

The item is the one Orbax writes for the same arrays -- zarr v2 arrays in an OCDBT
database at the item's root (``manifest.ocdbt``, data files under ``d/``), the
tree in ``_METADATA``, the ``jax.Array`` s' placement in ``_sharding``, the step's
``_CHECKPOINT_METADATA`` -- so plain Orbax and TensorStore read it as their own;
each array is stored as :func:`jaxshare.checkpoint.save` stores ``jnp.asarray``
of it (a ``jax.Array`` on the default device), an 8-byte one as a numpy array
(JAX would narrow it), a zero-size one in the empty-array record. But Orbax and
TensorStore do not write it: through TensorStore, each chunk was copied into its
buffer, compressed, written through the page cache and ``fsync`` ed file by
file, which held a 2.8 GB conversion to half the disk's speed; and importing
JAX and Orbax cost a second of every run. Here:

- each array is read from the source (cast and transposed as the plan says) in a
  background thread while the ones before it are written, at most about two of
  the largest held at once (:meth:`jaxshare.stream.Plan.arrays`); a stack of
  layers one layer at a time;
- it is cut into chunks of whole rows of at most :data:`CHUNK_BYTES` (a stack
  in per-layer chunks), each zstd-compressed at Orbax's level on a few threads
  (or stored raw), and appended to data files that go to the disk as they are
  written (:class:`jaxshare.io.output_file.OutputFile`), a large one from where it lies
  in memory, after a few zeros that line it up with the file's blocks;
- the B+tree that finds every chunk and the manifest are then encoded in
  TensorStore's format (:mod:`jaxshare.checkpoint._ocdbt`), and the metadata
  files written, every file ``fsync`` ed before the item is renamed into place.

In a multi-process job only the primary process reads and writes; the others
wait until the item is in place.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from jaxshare.checkpoint._empty import EmptyArray
from jaxshare.checkpoint._ocdbt import (
    MAX_INLINE_VALUE_BYTES,
    ValueRef,
    encode_database,
    new_data_file_name,
)
from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import numpy_dtype
from jaxshare.core.manifest import Manifest, ManifestEntry, TensorHash
from jaxshare.core.naming import stack_axis
from jaxshare.core.progress import ProgressFn
from jaxshare.formats import (
    ALIAS_MAP_FILE,
    EMPTY_ARRAYS_KEY,
    MANIFEST_FILE,
    NAMING_FILE,
    ORBAX_METADATA_FILE,
)
from jaxshare.internal import ITEM, asset_files
from jaxshare.io.ahead import ReadAhead, dwarfs
from jaxshare.io.atomic import atomic_output, fsync_dir, write_synced
from jaxshare.io.buffers import pooled
from jaxshare.io.output_file import LEND_BYTES, OutputFile
from jaxshare.io.plan import Plan, PlanEntry
from jaxshare.io.source import TensorSource
from jaxshare.io.threads import worker_count

__all__ = [
    "CHUNK_BYTES",
    "COMPRESSIONS",
    "HANDLER_TYPESTR",
    "alias_files",
    "chunk_shape",
    "write_item",
]

#: The largest chunk an array is stored in (a row, or a layer's row, may be larger).
CHUNK_BYTES = 16 * 2**20
#: A data file is closed, and the next begun, once it holds this many bytes.
DATA_FILE_BYTES = 2 * 2**30
#: zstd's level for chunks: Orbax's (TensorStore's ``zstd`` compressor, zarr v2).
ZSTD_LEVEL = 1
#: What the step metadata names as the item's handler (``SharedCheckpointHandler``).
HANDLER_TYPESTR = "jaxshare.checkpoint.SharedCheckpointHandler"
# Orbax's file of ``jax.Array`` shardings: ``{base64url(param name): sharding JSON}``;
# the default device of the host, as a CPU process of JAX records it.
_SHARDING_FILE = "_sharding"
_SHARDING = json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": "cpu:0"})
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
_COMMIT_FILE = "commit_success.txt"
_DATA_DIR = "d"


def chunk_shape(shape: tuple[int, ...], itemsize: int, stack: int | None = None) -> tuple[int, ...]:
    """The chunks an array of ``shape`` is stored in: whole rows of the first axis
    (after ``stack``, a stack's layer axis, which is cut in single layers), at most
    :data:`CHUNK_BYTES` of them, so a chunk is one run of the array's bytes; as
    many chunks as that takes, of rows shared out evenly, so the last chunk, which
    is stored whole, holds little padding.

    >>> chunk_shape((50257, 1600), 4)
    (2513, 1600)
    >>> chunk_shape((16, 4096, 11008), 2, stack=0)
    (1, 683, 11008)
    >>> chunk_shape((), 4)
    ()
    """
    chunks = list(shape)
    if stack is not None:
        chunks[stack] = 1
    split = next((a for a in range(len(shape)) if a != stack), None)
    if split is None:
        return tuple(chunks)
    unit = itemsize * math.prod(c for a, c in enumerate(chunks) if a != split)
    rows = max(1, min(shape[split], CHUNK_BYTES // max(1, unit)))
    count = -(-shape[split] // rows)
    chunks[split] = max(1, -(-shape[split] // max(1, count)))
    return tuple(chunks)


def _zarray(shape: tuple[int, ...], dtype: np.dtype, chunks: tuple[int, ...], zstd: bool) -> bytes:
    """The array's zarr v2 metadata, as TensorStore writes it for Orbax."""
    code = "bfloat16" if dtype.name == "bfloat16" else dtype.str
    meta = {
        "chunks": list(chunks),
        "compressor": {"id": "zstd", "level": ZSTD_LEVEL} if zstd else None,
        "dimension_separator": ".",
        "dtype": code,
        "fill_value": None,
        "filters": None,
        "order": "C",
        "shape": list(shape),
        "zarr_format": 2,
    }
    return json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class _Array:
    """One plan entry as it is stored: its Orbax name, chunks and value type."""

    entry: PlanEntry
    name: str
    dtype: np.dtype
    chunks: tuple[int, ...]
    stack: int | None  # The layer axis of a stack written one layer at a time.
    kind: str  # "jax.Array", or "np.ndarray" for 8-byte dtypes (JAX would narrow them)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.entry.info.shape)


class _Layers:
    """A stack of layers to write (what :class:`ReadAhead` hands over for it): each
    layer read (the array with the layer axis of length 1) when it is written."""

    def __init__(self, plan: Plan, source: TensorSource, array: _Array) -> None:
        self.plan, self.source, self.array = plan, source, array

    def layers(self) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        """Each layer, with where it starts in the stack."""
        axis = self.array.stack
        assert axis is not None
        for k in range(self.array.shape[axis]):
            index = (*(slice(None),) * axis, slice(k, k + 1))
            origin = tuple(k if a == axis else 0 for a in range(len(self.array.shape)))
            yield origin, self.plan.read_slice(self.source, self.array.entry, index)


class _DataFiles:
    """Chunks appended to data files under ``root/d/``, each handed to the disk as it
    is written (:class:`jaxshare.io.output_file.OutputFile`) and on it when closed; a new
    file is begun past :data:`DATA_FILE_BYTES`."""

    def __init__(self, root: Path) -> None:
        self._root = root
        (root / _DATA_DIR).mkdir()
        self._file: OutputFile | None = None
        self._name = ""

    def append(self, data: np.ndarray) -> ValueRef:
        """Writes ``data`` (C-contiguous, never changed after) at the end of the
        current file. A large one is written from where it lies, not copied: after a
        few zeros where its address and the file's end do not line up
        (:meth:`OutputFile.gap`; a value's reference says where it starts)."""
        if self._file is None or self._file.tell() >= DATA_FILE_BYTES:
            self._close_file()
            self._name = new_data_file_name()
            self._file = OutputFile(self._root / self._name)
        if data.nbytes >= LEND_BYTES and (gap := self._file.gap(data)):
            self._file.write(bytes(gap))
        offset = self._file.tell()
        self._file.write_array(data, kept=True)
        return ValueRef(self._name, offset, data.nbytes)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()  # (fsync)
            self._file = None

    def close(self) -> None:
        self._close_file()
        fsync_dir(self._root / _DATA_DIR)

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
            self._file = None


class _Writer:
    """Writes the arrays of one item into ``root`` (see the module's docstring).

    The caller queues each array's chunks (:meth:`write`); they are encoded on a
    few threads and written, in order, by a thread of their own, which then calls
    each array's ``done``. So an array's bytes go back to the read-ahead budget
    once it is written, whatever the caller is waiting for.
    """

    def __init__(self, root: Path, arrays: list[_Array], zstd: bool, manifest: bool) -> None:
        self.root, self.arrays, self.zstd, self.manifest = root, arrays, zstd, manifest
        self.values: dict[bytes, bytes | ValueRef] = {}
        self._hashes: dict[str, Future[str] | str | None] = {}
        self._files = _DataFiles(root)
        self._pool = ThreadPoolExecutor(worker_count(), thread_name_prefix="jaxshare-chunk")
        self._local = threading.local()
        # In order: (key, the chunk's stored bytes to be) or (None, an array's `done`).
        self._queue: queue.Queue[tuple[bytes | None, Any] | None] = queue.Queue(
            maxsize=2 * worker_count()
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._land, name="jaxshare-write", daemon=True)
        self._thread.start()

    def write(self, index: int, value: np.ndarray | _Layers, done: Callable[[], None]) -> None:
        """Queues every chunk of ``self.arrays[index]`` (its zarr metadata goes
        inline), then ``done``, called once they are all written.

        Raises:
          whatever writing an earlier chunk raised.
        """
        array = self.arrays[index]
        self.values[f"{array.name}/.zarray".encode()] = _zarray(
            array.shape, array.dtype, array.chunks, self.zstd
        )
        if isinstance(value, _Layers):
            digest = TensorHash() if self.manifest and array.stack == 0 else None
            for origin, layer in value.layers():
                if digest is not None:
                    digest.update(layer)
                self._chunks(index, _c_order(layer), origin)
                del layer
            if self.manifest:
                self._hashes[array.entry.name] = None if digest is None else digest.hexdigest()
        else:
            value = _c_order(np.asarray(value))
            if self.manifest:  # Hashed beside the chunks' encoding (hashlib lets go of the GIL).
                self._hashes[array.entry.name] = self._pool.submit(_hash, value)
            self._chunks(index, value, (0,) * value.ndim)
        self._put((None, done))

    def _chunks(self, index: int, block: np.ndarray, origin: tuple[int, ...]) -> None:
        """Queues the chunks of ``block``, the part of ``self.arrays[index]`` from
        ``origin`` on (whole chunks but at the array's end)."""
        array = self.arrays[index]
        chunks = array.chunks
        starts = [range(0, n, c) for n, c in zip(block.shape, chunks, strict=True)]
        for corner in itertools.product(*starts):
            cell = block[tuple(slice(s, s + c) for s, c in zip(corner, chunks, strict=True))]
            grid = tuple((o + s) // c for o, s, c in zip(origin, corner, chunks, strict=True))
            key = f"{array.name}/" + (".".join(map(str, grid)) if grid else "0")
            job = partial(_encode, cell, chunks, self.zstd, self._local)
            self._put((key.encode(), self._pool.submit(job)))

    def _put(self, item: tuple[bytes | None, Any]) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)  # (Waits while the chunks in flight fill the queue.)

    def _land(self) -> None:
        """The writing thread: each chunk once it is encoded, in order, then each
        array's ``done``. After an error it only calls the ``done`` s (so the reads
        waiting for their budget go on, and see the error)."""
        while (item := self._queue.get()) is not None:
            key, then = item
            if key is None:
                then()
                continue
            if self._error is not None:
                then.cancel()
                continue
            try:
                data = then.result()
                if data.nbytes <= MAX_INLINE_VALUE_BYTES:  # Inline, as TensorStore keeps them.
                    self.values[key] = data.tobytes()
                else:
                    self.values[key] = self._files.append(data)
            except BaseException as e:  # Raised to the caller at its next chunk, or at the end.
                self._error = e
            del item, then

    def finish(self) -> dict[str, str | None]:
        """Waits for every chunk to be written; closes the data files (on disk) and
        writes the B+tree and the manifest. Returns the arrays' hashes (with
        ``manifest``).

        Raises:
          whatever writing a chunk raised.
        """
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._pool.shutdown()
        self._files.close()
        node_file = new_data_file_name()
        manifest, nodes = encode_database(self.values, node_file=node_file)
        write_synced(self.root / node_file, nodes)
        fsync_dir(self.root / _DATA_DIR)
        write_synced(self.root / "manifest.ocdbt", manifest)
        return {
            name: h.result() if isinstance(h, Future) else h for name, h in self._hashes.items()
        }

    def abort(self) -> None:
        """Stops: no chunk is written after this returns."""
        if self._error is None:
            self._error = RuntimeError("the write was stopped")
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._files.abort()


def _encode(cell: np.ndarray, chunks: tuple[int, ...], zstd: bool, local: Any) -> np.ndarray:
    """The stored bytes of one chunk: ``cell`` as a whole chunk (an edge one padded
    with zeros, the fill value), zstd-compressed or raw, as a ``uint8`` array."""
    if cell.shape != chunks:
        whole = np.zeros(chunks, cell.dtype)
        whole[tuple(slice(0, n) for n in cell.shape)] = cell
        cell = whole
    raw = cell.reshape(-1).view(np.uint8)
    if not zstd:
        return raw if raw.flags.c_contiguous else np.ascontiguousarray(raw)
    compressor = getattr(local, "compressor", None)
    if compressor is None:
        compressor = local.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return np.frombuffer(compressor.compress(raw.data), np.uint8)


def _c_order(array: np.ndarray) -> np.ndarray:
    """``array`` in C order (a 0-d one stays 0-d, unlike ``np.ascontiguousarray``)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def _hash(array: np.ndarray) -> str:
    digest = TensorHash()
    digest.update(array)
    return digest.hexdigest()


def _plan_arrays(plan: Plan) -> tuple[list[_Array], dict[str, EmptyArray]]:
    """The arrays ``plan`` stores (in its order), and its zero-size outputs, which
    are recorded instead (as ``save`` records them)."""
    record = plan.alias_map.naming
    arrays: list[_Array] = []
    empty: dict[str, EmptyArray] = {}
    for entry in plan.entries:
        dtype = numpy_dtype(entry.info.dtype)
        kind = "numpy" if dtype.itemsize >= 8 else "jax"
        shape = tuple(entry.info.shape)
        if 0 in shape:
            empty[entry.name] = EmptyArray(shape, dtype, kind)
            continue
        naming = None if record is None else record.get(entry.name)
        stack = stack_axis(naming.permute) if naming is not None and naming.stacked else None
        if not shape:
            stack = None
        name = ".".join(entry.name.split("/"))
        value_type = "np.ndarray" if kind == "numpy" else "jax.Array"
        arrays.append(
            _Array(entry, name, dtype, chunk_shape(shape, dtype.itemsize, stack), stack, value_type)
        )
    return arrays, empty


def _budget(arrays: list[_Array], costs: list[int]) -> int:
    """The bytes the reads may hold at once: two of the largest whole array (the
    plan's budget), or a stack's two layers (a stack is read a layer at a time),
    among the reads that do not dwarf the rest; one that does is read alone
    (:func:`dwarfs`), once nothing else is held."""
    big = dwarfs(costs)
    return max(
        (2 * a.entry.info.nbytes if a.stack is None else c
         for i, (a, c) in enumerate(zip(arrays, costs, strict=True)) if i not in big),
        default=1,
    )  # fmt: skip


def _layer_cost(array: _Array) -> int:
    assert array.stack is not None
    return 2 * array.entry.info.nbytes // max(1, array.shape[array.stack])


#: How :func:`write_item` may store an item's chunks.
COMPRESSIONS = ("zstd", "none")


def write_item(
    directory: str | os.PathLike,
    plan: Plan,
    source: TensorSource,
    /,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
    assets: Mapping[str, str | os.PathLike | bytes] | None = None,
    manifest: bool = False,
    compression: str = "zstd",
) -> None:
    """Writes the outputs of ``plan`` (Flax paths), read from ``source``, as an item
    with the plan's alias map (and naming record), streaming; ``assets`` as for
    :func:`jaxshare.checkpoint.save` (default: the source's own, e.g. a Hugging
    Face directory's ``config.json`` and tokenizer files). With ``manifest``,
    each array is hashed as it is written and the hashes are committed with the
    item (``jaxshare_manifest.json``, see :func:`bridge.verify`).

    ``compression`` is how the chunks are stored: ``"zstd"`` (Orbax's default,
    level 1) or ``"none"``. Weights compress little (random-like float32 by about
    8%) and zstd costs far more CPU than the disk's write of the same bytes
    (``benchmarks/README.md``), so ``"none"`` is the one that runs at the disk's
    speed; Orbax and TensorStore read both.

    The model is never held: each array is read (cast and transposed as the plan
    says) while the ones before it are written, so memory holds about two of
    the largest array (:meth:`jaxshare.stream.Plan.arrays`). The item is the one
    :func:`jaxshare.checkpoint.save` writes for the same arrays (``jax.Array`` s,
    8-byte ones as numpy arrays): an ordinary Orbax checkpoint of the unique
    tree plus the alias map, written atomically; its bytes are laid out here
    (see :mod:`jaxshare.checkpoint._stream`), so neither Orbax nor JAX is
    imported. In a multi-process job every process calls it; only the primary
    one reads ``source`` and writes, and every one returns once the item is in
    place (or raises if it could not be written).

    Raises:
      FileExistsError: ``directory`` exists and ``force`` is false.
      NotADirectoryError: a parent of ``directory`` is a file.
      ValueError: ``directory`` holds something that is not a checkpoint item, or
        is an input; an unknown ``compression``; the plan stores no non-empty
        array; an asset name that is not a plain file name.

    >>> import tempfile
    >>> from jaxshare.checkpoint import restore
    >>> from jaxshare.formats import SafetensorsFile
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, d + "/in.safetensors")
    >>> with SafetensorsFile(d + "/in.safetensors") as source:
    ...     write_item(d + "/ckpt", Plan.identity(source), source)
    >>> restore(d + "/ckpt")["w"].tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    if compression not in COMPRESSIONS:
        raise ValueError(
            f"`compression` must be one of {', '.join(map(repr, COMPRESSIONS))}, "
            f"got {compression!r}."
        )
    path = Path(directory).absolute()
    files = {
        **alias_files(plan.alias_map),
        **asset_files(source.assets if assets is None else assets),
    }

    def write() -> None:
        with atomic_output(path, ITEM, force=force, inputs=inputs) as tmp:
            _write_streamed(tmp, plan, source, files=files, progress=progress,
                           manifest=manifest, compression=compression, final=str(path))  # fmt: skip

    jax = sys.modules.get("jax")
    if jax is None or jax.process_count() == 1:  # (No job of several processes without JAX.)
        write()
        return
    from jax.experimental import multihost_utils

    from jaxshare.checkpoint._agree import check_same_on_all_processes

    check_same_on_all_processes(plan.alias_map, where=str(path))
    error: BaseException | None = None
    if jax.process_index() == 0:
        try:
            write()
        except BaseException as e:  # Raised below, once every process knows.
            error = e
    ok = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(error is None))))
    if error is not None:
        raise error
    if not ok:
        raise RuntimeError(
            f"{path}: the primary process (0) could not write the item; its error says why."
        )


def _write_streamed(
    root: Path,
    plan: Plan,
    source: TensorSource,
    *,
    files: dict[str, str | bytes],
    progress: ProgressFn | None = None,
    manifest: bool = False,
    compression: str = "zstd",
    final: str = "",
) -> None:
    """Writes the item of ``plan`` into the new directory ``root`` (see the module's
    docstring); ``files`` are jaxshare's own (alias map, naming record, assets),
    written last; ``final`` is the item's path as users name it (messages,
    ``commit_success.txt``).

    Raises:
      ValueError: the plan stores no non-empty array.
      Whatever a read or a write raised; ``root`` is then left to the caller.
    """
    arrays, empty = _plan_arrays(plan)
    if not arrays:
        raise ValueError(
            f"{final or root}: nothing to store: every array of the plan is zero-size, and "
            "an Orbax item holds at least one non-empty array or scalar."
        )
    started = time.time_ns()
    root.mkdir()
    writer = _Writer(root, arrays, compression == "zstd", manifest)
    total = len(plan.entries)
    done = 0
    try:
        jobs: list[tuple[int, Callable[[], Any]]] = [
            (plan.cost(source, a.entry), partial(plan.array, source, a.entry))
            if a.stack is None
            else (_layer_cost(a), partial(_Layers, plan, source, a))
            for a in arrays
        ]
        # The arrays' memory, freed, waits for the next of their size (pages resident).
        with (
            pooled(),
            plan.prefetch(
                source, [a.entry for a in arrays], whole=[a.stack is None for a in arrays]
            ) as input_ahead,
            ReadAhead(jobs, _budget(arrays, [cost for cost, _ in jobs])) as ahead,
        ):

            def written(i: int) -> None:  # Its chunks on their way to the disk.
                nonlocal done
                ahead.release(i)
                done += 1
                if progress is not None:
                    entry = arrays[i].entry
                    progress(done, total, entry.name, entry.info.nbytes)

            for i, value in ahead.held():
                input_ahead.reached(i)
                writer.write(i, value, partial(written, i))
                del value  # (Its chunks hold it until they are written.)
            hashes = writer.finish()
    except BaseException:
        writer.abort()
        raise
    _write_metadata(root, arrays, empty)
    write_synced(
        root / _SHARDING_FILE,
        json.dumps(
            {
                base64.urlsafe_b64encode(a.name.encode()).decode(): _SHARDING
                for a in arrays
                if a.kind == "jax.Array"
            }
        ).encode(),
    )
    if manifest:
        files = {**files, MANIFEST_FILE: _manifest_json(plan, hashes)}
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synced(path, data if isinstance(data, bytes) else data.encode())
    step = {
        "item_handlers": HANDLER_TYPESTR,
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": started,
        "commit_timestamp_nsecs": time.time_ns(),
        "custom_metadata": {},
    }
    write_synced(root / _STEP_METADATA_FILE, json.dumps(step).encode())
    write_synced(root / _COMMIT_FILE, f"Checkpoint commit was successful to {final}".encode())
    for directory in {(root / n).parent for n in files} | {root}:
        fsync_dir(directory)
    for entry in plan.entries:  # Zero-size arrays are recorded, not written.
        if 0 in entry.info.shape:
            done += 1
            if progress is not None:
                progress(done, total, entry.name, 0)


def _write_metadata(root: Path, arrays: list[_Array], empty: dict[str, EmptyArray]) -> None:
    """Orbax's ``_METADATA``: the tree's leaves in its flatten order (keys sorted at
    each level), with their value types; the zero-size arrays' record."""
    leaves = sorted(arrays, key=lambda a: tuple(a.entry.name.split("/")))
    tree = {
        str(tuple(a.entry.name.split("/"))): {
            "key_metadata": [{"key": k, "key_type": 2} for k in a.entry.name.split("/")],
            "value_metadata": {"value_type": a.kind, "skip_deserialize": False},
        }
        for a in leaves
    }
    custom = {EMPTY_ARRAYS_KEY: {p: e.to_json() for p, e in empty.items()}} if empty else None
    document = {
        "tree_metadata": tree,
        "use_ocdbt": True,
        "use_zarr3": False,
        "store_array_data_equal_to_fill_value": True,
        "custom_metadata": custom,
    }
    write_synced(root / ORBAX_METADATA_FILE, json.dumps(document).encode())


def _manifest_json(plan: Plan, hashes: dict[str, str | None]) -> str:
    """The :class:`jaxshare.internal.Manifest` of the arrays written, as JSON (a
    zero-size array hashes to the digest of no bytes; a stack written on an axis
    other than the first, one layer at a time, is not hashed)."""
    empty = TensorHash().hexdigest()
    entries = {
        e.name: ManifestEntry(
            tuple(e.info.shape),
            e.info.dtype,
            empty if 0 in e.info.shape else hashes.get(e.name),
        )
        for e in plan.entries
    }
    return Manifest(entries).to_json(indent=1)


def alias_files(alias_map: AliasMap) -> dict[str, str | bytes]:
    """jaxshare's JSON files of the ties: the alias map and its naming record."""
    files: dict[str, str | bytes] = {ALIAS_MAP_FILE: alias_map.to_json(indent=1)}
    if alias_map.naming is not None:
        files[NAMING_FILE] = alias_map.naming.to_json(indent=1)
    return files
