"""Writing an item from a plan one array at a time: the engine of ``write_item``.

Orbax writes a PyTree checkpoint from a tree whose leaves it serializes through
type handlers. :class:`StreamedItem` hands it a tree of placeholders instead of
arrays, each with its output's shape and dtype, and registers a handler for the
placeholders that makes each array only when it is written: read from the source
(cast and transposed as the plan says) in a background thread while the arrays
before it are written, with at most about two of the largest array held at once
(:class:`jaxshare.ReadAhead`). Everything else is Orbax's own save -- the
TensorStore specs, the OCDBT files and their merge, ``_METADATA``, the commit --
so the item is the one :func:`jaxshare.checkpoint.save` writes for the same
arrays: each array is stored as ``save`` stores ``jnp.asarray`` of it (a
``jax.Array`` on the default device, its sharding recorded), an 8-byte one as a
numpy array (JAX would narrow it), a zero-size one in the empty-array record.
Only Orbax's optional per-array "write shape" record is not kept (restores do
without it, as for checkpoints of older Orbax versions).

Only the primary process reads and writes arrays, as Orbax does for numpy
arrays; every process takes part in the save's barriers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from jaxshare._alias import AliasMap
from jaxshare._dtype import numpy_dtype
from jaxshare._manifest import Manifest, ManifestEntry, TensorHash
from jaxshare._naming import stack_axis
from jaxshare._output import DropWritten
from jaxshare._paths import nest
from jaxshare._plan import Plan, PlanEntry, ReadAhead
from jaxshare._progress import ProgressFn
from jaxshare._source import TensorSource
from jaxshare.checkpoint._empty import EmptyArray

__all__ = ["StreamedItem"]

#: Bytes of one array written (and committed) at a time.
WRITE_BLOCK_BYTES = 64 * 2**20
# Orbax's file of ``jax.Array`` shardings: ``{base64url(param name): sharding JSON}``.
_SHARDING_FILE = "_sharding"


class _Leaf:
    """A placeholder Orbax serializes through :class:`_LeafHandler`: one plan entry."""

    __slots__ = ("entry", "index")

    def __init__(self, index: int, entry: PlanEntry) -> None:
        self.index = index
        self.entry = entry

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.entry.info.shape)

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.entry.info.dtype)


class _JaxLeaf(_Leaf):
    """Stored as a ``jax.Array`` (what ``save`` stores for ``jnp.asarray`` of it)."""

    __slots__ = ()


class _NumpyLeaf(_Leaf):
    """Stored as a numpy array (8-byte dtypes, which JAX would narrow)."""

    __slots__ = ()


@dataclass
class StreamedItem:
    """What :class:`SharedSave` carries for ``write_item``: the outputs of ``plan``,
    read from ``source`` while Orbax writes them.

    Attributes:
      plan: the outputs (Flax paths) and their ties.
      source: where they are read from.
      progress: called after each array is written (from Orbax's writing thread).
      manifest: hash each array as it is written, for :meth:`manifest`.
      compression: ``"zstd"`` (Orbax's default, level 1) or ``"none"``: how the
        arrays' chunks are stored.
    """

    plan: Plan
    source: TensorSource
    progress: ProgressFn | None = None
    manifest: bool = False
    compression: str = "zstd"
    _hashes: dict[str, str | None] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _done: int = field(default=0, repr=False)

    @property
    def alias_map(self) -> AliasMap:
        return self.plan.alias_map

    def split(self) -> tuple[dict[str, Any], dict[str, EmptyArray]]:
        """The unique tree of placeholders Orbax writes, and the zero-size outputs,
        which it cannot store (recorded instead, as ``save`` does)."""
        leaves: dict[str, _Leaf] = {}
        empty: dict[str, EmptyArray] = {}
        for index, entry in enumerate(self.plan.entries):
            dtype = numpy_dtype(entry.info.dtype)
            kind = "numpy" if dtype.itemsize >= 8 else "jax"
            if 0 in entry.info.shape:
                empty[entry.name] = EmptyArray(tuple(entry.info.shape), dtype, kind)
            else:
                leaves[entry.name] = (_NumpyLeaf if kind == "numpy" else _JaxLeaf)(index, entry)
        return nest(leaves), empty

    def handler(self, **kwargs: Any) -> ocp.PyTreeCheckpointHandler:
        """Orbax's PyTree handler, writing placeholders through this item."""
        registry = ocp.type_handlers.create_type_handler_registry(
            (_JaxLeaf, _LeafHandler(self, "jax.Array")),
            (_NumpyLeaf, _LeafHandler(self, "np.ndarray")),
            # Where Orbax looks for its per-array metadata store: none is kept (it
            # records write shapes, which restores do without).
            (jax.Array, ocp.type_handlers.ArrayHandler(array_metadata_store=None)),
        )
        return ocp.PyTreeCheckpointHandler(
            type_handler_registry=registry, use_compression=self.compression == "zstd", **kwargs
        )

    def manifest_json(self) -> str:
        """The :class:`jaxshare.internal.Manifest` of the arrays written, as JSON (a
        zero-size array hashes to the digest of no bytes; a stack written on an
        axis other than the first, one layer at a time, is not hashed)."""
        empty = TensorHash().hexdigest()
        entries = {
            e.name: ManifestEntry(
                tuple(e.info.shape),
                e.info.dtype,
                empty if 0 in e.info.shape else self._hashes.get(e.name),
            )
            for e in self.plan.entries
        }
        return Manifest(entries).to_json(indent=1)

    def _hash(self, entry: PlanEntry, array: np.ndarray) -> None:
        h = TensorHash()
        h.update(array)
        self._hashes[entry.name] = h.hexdigest()

    def report(self, entry: PlanEntry) -> None:
        self._done += 1
        if self.progress is not None:
            self.progress(self._done, len(self.plan.entries), entry.name, entry.info.nbytes)

    def stack_axis(self, entry: PlanEntry) -> int | None:
        """The layer axis of a stack of layers (its naming record says so), which is
        written in per-layer chunks, one layer at a time; ``None`` otherwise."""
        record = self.plan.alias_map.naming
        naming = None if record is None else record.get(entry.name)
        if naming is None or not naming.stacked or not entry.info.shape:
            return None
        return stack_axis(naming.permute)

    def budget(self) -> int:
        """The bytes the reads may hold at once: the plan's budget (two of the largest
        output), a stack counted as the two layers it holds at a time, not whole."""
        whole = [e.info.nbytes for e in self.plan.entries if self.stack_axis(e) is None]
        stacked = [self._job(e)[0] for e in self.plan.entries if self.stack_axis(e) is not None]
        return max(2 * max(whole, default=0), *stacked, 1)

    def _job(self, entry: PlanEntry) -> tuple[int, Callable[[], Any]]:
        """The read of one entry: its array, or for a stack, what reads its layers
        (two layers counted: one read while the one before is written)."""
        plan, source = self.plan, self.source
        axis = self.stack_axis(entry)
        if axis is None:
            return plan.cost(source, entry), partial(plan.array, source, entry)
        layer = entry.info.nbytes // max(1, entry.info.shape[axis])
        # Layers on the first axis are the stack's bytes in order: hashed as they come.
        hashed = TensorHash() if self.manifest and axis == 0 else None
        return 2 * layer, partial(_Layers, plan, source, entry, axis, hashed)

    async def write(
        self,
        handler: _LeafHandler,
        leaves: Sequence[_Leaf],
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[ocp.SaveArgs],
    ) -> None:
        """Makes and writes the arrays of ``leaves`` in order: the next is read
        while those before it are written, within the plan's byte budget."""
        if jax.process_index() != 0:  # Orbax writes numpy arrays from process 0 only.
            return
        jobs = [self._job(leaf.entry) for leaf in leaves]
        # Orbax serializes each handler's leaves in a thread of their own: one at a time.
        # TensorStore's files leave the page cache as they reach the disk (the write
        # goes 2-3x faster here than with them kept).
        with (
            self._lock,
            DropWritten(infos[0].parent_dir),
            ReadAhead(jobs, self.budget()) as ahead,
        ):
            arrays = ahead.held()
            pending: set[asyncio.Task[None]] = set()

            async def write_one(i: int, array: np.ndarray | _Layers) -> None:
                try:
                    if self.manifest and not isinstance(array, _Layers):
                        # Hashed beside the write (hashlib lets go of the GIL).
                        await asyncio.gather(
                            handler.write_array(array, infos[i], args[i]),
                            asyncio.to_thread(self._hash, leaves[i].entry, array),
                        )
                    else:
                        await handler.write_array(array, infos[i], args[i])
                        if isinstance(array, _Layers) and array.hashed is not None:
                            self._hashes[leaves[i].entry.name] = array.hashed.hexdigest()
                finally:  # Even a failed write frees its bytes: the next read goes on.
                    del array  # Freed before its bytes go back to the budget.
                    ahead.release(i)
                self.report(leaves[i].entry)

            try:
                while (got := await asyncio.to_thread(next, arrays, None)) is not None:
                    i, array = got
                    pending.add(asyncio.create_task(write_one(i, array)))
                    del got, array
                    for task in [t for t in pending if t.done()]:
                        pending.discard(task)
                        task.result()  # An error stops the save.
                await asyncio.gather(*pending)
            except BaseException:
                # The writes under way end (TensorStore would finish them anyway)
                # before the error is raised: none lands after the cleanup.
                await asyncio.gather(*pending, return_exceptions=True)
                raise
        if handler.typestr() == "jax.Array" and ocp.multihost.is_primary_host(0):
            _write_shardings(infos)


def _write_shardings(infos: Sequence[ocp.type_handlers.ParamInfo]) -> None:
    """Records the sharding ``jnp.asarray`` gives (the default device), as Orbax
    does for the ``jax.Array`` leaves it saves, so a restore without a target
    gives ``jax.Array`` s as it does for ``save``."""
    device = jax.local_devices()[0]
    sharding = ocp.metadata.SingleDeviceShardingMetadata.from_jax_sharding(
        jax.sharding.SingleDeviceSharding(device)
    ).to_serialized_string()
    path = infos[0].parent_dir / _SHARDING_FILE
    record = json.loads(path.read_text()) if path.exists() else {}
    for info in infos:
        record[base64.urlsafe_b64encode(info.name.encode()).decode()] = sharding
    path.write_text(json.dumps(record))


class _Layers(_Leaf):
    """A stack of layers to write: each layer read (``read(k)``, the array with the
    layer axis of length 1) only when it is written."""

    __slots__ = ("axis", "hashed", "plan", "source")

    def __init__(
        self,
        plan: Plan,
        source: TensorSource,
        entry: PlanEntry,
        axis: int,
        hashed: TensorHash | None = None,
    ) -> None:
        super().__init__(-1, entry)
        self.plan, self.source, self.axis, self.hashed = plan, source, axis, hashed

    def layer_index(self, k: int) -> tuple[slice, ...]:
        return (*(slice(None),) * self.axis, slice(k, k + 1))

    def read(self, k: int) -> np.ndarray:
        """Layer ``k``, hashed (layers on the first axis, read in order) when asked."""
        layer = self.plan.read_slice(self.source, self.entry, self.layer_index(k))
        if self.hashed is not None:
            self.hashed.update(layer)
        return layer


class _LeafHandler(ocp.type_handlers.NumpyHandler):
    """Orbax's numpy handler, writing each placeholder's array when its turn comes.

    Recorded as ``typestr`` (``"jax.Array"`` or ``"np.ndarray"``); the arrays
    are written with Orbax's own TensorStore specs (chunks, compression, OCDBT
    files), so a restore reads them as it reads those it saved itself. Only the
    primary process writes (see :meth:`StreamedItem.write`).
    """

    def __init__(self, item: StreamedItem, typestr: str) -> None:
        super().__init__(deepcopy_host_arrays=False)
        self._item = item
        self._typestr = typestr

    def typestr(self) -> str:
        return self._typestr

    async def serialize(
        self,
        values: Sequence[_Leaf],
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[ocp.SaveArgs] | None = None,
    ) -> list[ocp.future.Future]:
        args = list(args or [ocp.SaveArgs()] * len(values))
        return [
            ocp.future.CommitFutureAwaitingContractedSignals(
                self._item.write(self, values, infos, args), name="jaxshare_streamed_arrays"
            )
        ]

    async def write_array(
        self, array: np.ndarray | _Layers, info: ocp.type_handlers.ParamInfo, arg: ocp.SaveArgs
    ) -> None:
        """Writes one array where and as Orbax writes a numpy array, in blocks of
        whole storage chunks of about :data:`WRITE_BLOCK_BYTES`, each committed
        before the next: TensorStore buffers a write's encoded chunks until it
        commits, so a large array written at once would hold about its size again.
        A stack of layers is stored in per-layer chunks (so a later read takes
        one layer at a time), each layer read and written in turn."""
        await info.await_path_creation()
        use_ocdbt = bool(info.is_ocdbt_checkpoint)
        spec = ocp.type_handlers.get_json_tspec_write(
            info,
            use_ocdbt=use_ocdbt,
            global_shape=array.shape,
            local_shape=array.shape,
            dtype=array.dtype,
            process_index=jax.process_index() if use_ocdbt else None,
            arg=arg,
        )
        if isinstance(array, _Layers):
            chunks = list(array.shape)
            chunks[array.axis] = 1
            _set_chunks(spec, chunks)
        store = await ts.open(ts.Spec(spec), create=True, open=True, context=info.ts_context)
        if isinstance(array, _Layers):
            for k in range(array.shape[array.axis]):
                layer = await asyncio.to_thread(array.read, k)
                await store[array.layer_index(k)].write(
                    layer, can_reference_source_data_indefinitely=True
                )
                del layer
            return
        if array.ndim == 0:
            await store.write(array, can_reference_source_data_indefinitely=True)
            return
        chunk_shape = store.chunk_layout.write_chunk.shape
        chunk_rows = (chunk_shape[0] if chunk_shape else None) or array.shape[0]
        chunk_bytes = chunk_rows * (array.nbytes // array.shape[0])
        rows = chunk_rows * max(1, WRITE_BLOCK_BYTES // max(1, chunk_bytes))
        for start in range(0, array.shape[0], rows):
            stop = min(start + rows, array.shape[0])
            await store[start:stop].write(
                array[start:stop], can_reference_source_data_indefinitely=True
            )


def _set_chunks(spec: dict[str, Any], chunks: list[int]) -> None:
    """Sets the chunk shape of a TensorStore zarr spec that Orbax built."""
    metadata = spec.setdefault("metadata", {})
    if spec.get("driver") == "zarr3":
        metadata["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": chunks}}
    else:
        metadata["chunks"] = chunks
