"""Streaming conversions: ``write_item`` writes the item ``save`` writes, one array
at a time; ``save_plan`` and ``ReadAhead`` hold about two arrays, never the model."""

from __future__ import annotations

import gc
import math
import os
import threading
import time
import weakref
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file

import bridge
from jaxshare import AliasMap, Tied
from jaxshare import checkpoint as jc
from jaxshare.formats import SafetensorsFile, read_header, save_plan
from jaxshare.io.ahead import BlocksAhead, ReadAhead, SharedRead
from jaxshare.stream import ArrayInfo, Plan, PlanEntry, TensorSource

# --- fixtures -----------------------------------------------------------------


def _unique_tree(plan: Plan, source: TensorSource) -> dict:
    """What a user holding the whole model would ``save``: each output array as a
    ``jax.Array`` (8-byte ones as numpy arrays, which JAX would narrow)."""
    tree: dict = {}
    for entry in plan.entries:
        array = np.array(plan.array(source, entry))
        node = tree
        *parents, last = entry.name.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = array if array.dtype.itemsize >= 8 else jnp.asarray(array)
    return tree


@pytest.fixture
def torch_file(tmp_path: Path) -> Path:
    """A PyTorch-named safetensors file: a tied head (recorded in the metadata),
    Linear weights to transpose, bf16, int64 and zero-size tensors."""
    rng = np.random.default_rng(0)
    tensors = {
        "wte.weight": rng.standard_normal((11, 4), dtype=np.float32),
        "h.0.attn.weight": rng.standard_normal((6, 4), dtype=np.float32),
        "h.0.attn.bias": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
        "h.0.ln.weight": np.ones(4, ml_dtypes.bfloat16),
        "h.0.empty.bias": np.zeros((0,), np.float32),
        "h.0.empty.weight": np.zeros((0, 4), ml_dtypes.bfloat16),
        "steps": np.array([2**40, 3], np.int64),
    }
    tie = AliasMap({"lm_head.weight": "wte.weight"})
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt", "jaxshare.alias_map": tie.to_json()})
    return path


class CountingSource(TensorSource):
    """Tensors made on demand, each tracked until it is freed: how many bytes the
    arrays read and not yet freed hold, at most, and how many reads there were."""

    kind = "counting"

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.infos = {n: ArrayInfo(s, "float32") for n, s in shapes.items()}
        self.reads: list[str] = []
        self.alive = self.peak = 0
        self._lock = threading.Lock()

    def read(self, name: str) -> np.ndarray:
        info = self.infos[name]
        with self._lock:  # (Reads may run on several threads.)
            self.reads.append(name)
            index = len(self.reads) - 1
        array = np.full(info.shape, index, np.float32)
        with self._lock:
            self.alive += array.nbytes
            self.peak = max(self.peak, self.alive)
        weakref.finalize(array, self._freed, array.nbytes)
        return array

    def _freed(self, nbytes: int) -> None:
        with self._lock:
            self.alive -= nbytes


def _many(n: int = 12, rows: int = 256) -> dict[str, tuple[int, ...]]:
    """``n`` tensors of 256 KiB each, in Flax paths."""
    return {f"params/layer_{i:02d}/kernel": (rows, 256) for i in range(n)}


# --- write_item is save, streamed ---------------------------------------------


@pytest.mark.parametrize("dtype", [None, "bfloat16", "float32"])
def test_write_item_writes_what_save_writes(
    torch_file: Path, tmp_path: Path, dtype: str | None, flat, assert_bit_exact
) -> None:
    with SafetensorsFile(torch_file) as source:
        plan = bridge.flax_plan(source).cast(dtype)
        assert any(e.perm is not None for e in plan.entries)  # Transposed kernels.
        assert plan.alias_map.transform("params/lm_head/kernel") == (1, 0)
        jc.write_item(tmp_path / "streamed", plan, source)
        jc.save(tmp_path / "saved", Tied(_unique_tree(plan, source), plan.alias_map))
    streamed, saved = jc.restore(tmp_path / "streamed"), jc.restore(tmp_path / "saved")
    assert_bit_exact(streamed, saved)
    assert streamed["params"]["lm_head"]["kernel"].shape == (4, 11)
    assert jc.read_alias_map(tmp_path / "streamed") == jc.read_alias_map(tmp_path / "saved")
    assert jc.read_alias_map(tmp_path / "streamed").naming == plan.alias_map.naming
    assert plan.alias_map.naming is not None
    leaves = flat(streamed)
    assert leaves["params/h/0/empty/kernel"].shape == (4, 0)  # Zero-size, transposed.
    assert leaves["params/steps"].dtype == np.int64 and int(leaves["params/steps"][0]) == 2**40


def test_a_cold_input_is_read_past_the_page_cache_into_what_save_writes(
    tmp_path: Path, assert_bit_exact, drop_cache, cached_mib
) -> None:
    """A mapped input the page cache lacks: its large tensors are read past the
    cache (``read_direct``), and not read ahead into it as well."""
    rng = np.random.default_rng(1)
    tensors = {
        "wte.weight": rng.standard_normal((1024, 512), dtype=np.float32),  # as stored
        "h.0.attn.weight": rng.standard_normal((768, 512), dtype=np.float32),  # transposed
        "h.0.mlp.weight": rng.standard_normal((2048, 384)).astype(ml_dtypes.bfloat16),
        "h.0.ln.weight": np.ones(512, np.float32),  # small: read ahead through the cache
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("direct reads (O_DIRECT) are Linux's")
    with SafetensorsFile(drop_cache(path)) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(tmp_path / "streamed", plan, source)
        assert not any(cached_mib(path)[:-1])  # (The last MiB holds the small tensor.)
        jc.save(tmp_path / "saved", Tied(_unique_tree(plan, source), plan.alias_map))
    assert_bit_exact(jc.restore(tmp_path / "streamed"), jc.restore(tmp_path / "saved"))


def test_plain_orbax_restores_the_unique_tree(
    torch_file: Path, tmp_path: Path, assert_bit_exact
) -> None:
    with SafetensorsFile(torch_file) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(tmp_path / "streamed", plan, source)
        jc.save(tmp_path / "saved", Tied(_unique_tree(plan, source), plan.alias_map))
    with ocp.StandardCheckpointer() as checkpointer:
        streamed = checkpointer.restore(tmp_path / "streamed")
        saved = checkpointer.restore(tmp_path / "saved")
    assert_bit_exact(streamed, saved)  # jax.Arrays on the device saved from, as `save`.
    assert "lm_head" not in streamed["params"]  # The tie is stored once.
    assert isinstance(streamed["params"]["wte"]["embedding"], jax.Array)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_large_chunks_are_written_where_they_lie_and_orbax_restores_them(
    tmp_path: Path, copied: list[int], compression: str, assert_bit_exact
) -> None:
    """Chunks of a MiB or more go to the disk from where they lie (a few zeros
    before each in its data file line it up with the file's blocks): only their
    partial first and last blocks are copied, and plain Orbax reads every value."""
    rng = np.random.default_rng(1)
    tensors = {
        "a.weight": rng.standard_normal((700, 900), dtype=np.float32),
        "b.weight": rng.standard_normal((900, 700), dtype=np.float32),
        "b.bias": rng.standard_normal(700, dtype=np.float32),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, path)
    with SafetensorsFile(path) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(tmp_path / "item", plan, source, compression=compression)
        want = _unique_tree(plan, source)
    with ocp.StandardCheckpointer() as checkpointer:
        assert_bit_exact(checkpointer.restore(tmp_path / "item"), want)
    assert sum(copied) < 5 * 2 * 4096 + 700 * 4 * 2, copied  # Blocks at the edges, the bias.


@pytest.mark.parametrize("manifest", [False, True])
@pytest.mark.parametrize("names", ["flax", "torch"])
@pytest.mark.parametrize("embedding", [False, True])
def test_arrays_read_into_a_safetensors_file_are_made_where_the_file_writes_them(
    tmp_path: Path, copied: list[int], names: str, manifest: bool, embedding: bool
) -> None:
    """Each array a plan reads ahead (decoded, transposed) is made to line up with
    its place in the file, which then writes it without a copy: only the header,
    the arrays' partial first and last blocks, and the small arrays are copied. So
    is a streamed embedding that dwarfs the rest, and the bands of its tied head
    transposed."""
    rng = np.random.default_rng(2)
    tensors = {
        f"h.{i}.weight": rng.standard_normal((600 + 8 * i, 700), dtype=np.float32) for i in range(4)
    } | {"h.0.bias": rng.standard_normal(9, dtype=np.float32)}
    metadata = None
    if embedding:
        tensors["wte.weight"] = rng.standard_normal((6000, 700), dtype=np.float32)
        tie = AliasMap({"lm_head.weight": "wte.weight"})
        metadata = {"format": "pt", "jaxshare.alias_map": tie.to_json()}
    save_file(tensors, tmp_path / "m.safetensors", metadata=metadata)
    with SafetensorsFile(tmp_path / "m.safetensors") as source:
        jc.write_item(tmp_path / "ckpt", bridge.flax_plan(source), source)
    copied.clear()
    out = tmp_path / "out.safetensors"
    with jc.open_source(tmp_path / "ckpt") as source:
        plan = bridge.torch_plan(source)
        if names == "torch":  # The tie recorded, its head not written.
            save_plan(out, plan, source, manifest=manifest)
            want = {e.name: np.asarray(plan.array(source, e)) for e in plan.entries}
        else:  # Every path, the head written out (the command's Flax names).
            jc.consolidate_to_safetensors(tmp_path / "ckpt", out, manifest=manifest)
            want = {n: np.asarray(source.array(n)) for n in source.infos}
            for alias, canonical in source.ties.items():
                want[alias] = np.transpose(want[canonical], source.ties.transform(alias))
    assert len(want) == 5 + embedding + (embedding and names == "flax")
    # Copied: the header, the bias, a last band of one row, and the blocks at the edges.
    assert sum(copied) < read_header(out).data_start + 2**16 < out.stat().st_size / 100, copied
    with SafetensorsFile(out) as got:
        assert {n: got.array(n).tobytes() for n in want} == {
            n: a.tobytes() for n, a in want.items()
        }


def test_write_item_restores_sharded_into_a_target(torch_file: Path, tmp_path: Path) -> None:
    with SafetensorsFile(torch_file) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(tmp_path / "ckpt", plan, source)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    like = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array)
            else x
        ),
        jc.restore(tmp_path / "ckpt"),
    )
    like["params"]["h"]["0"]["attn"]["bias"] = jax.ShapeDtypeStruct(
        (6,), jnp.bfloat16, sharding=sharding
    )
    got = jc.restore(tmp_path / "ckpt", like)
    assert got["params"]["h"]["0"]["attn"]["bias"].sharding == sharding
    assert got["params"]["lm_head"]["kernel"].shape == (4, 11)


def test_write_item_holds_about_two_arrays_never_the_model(tmp_path: Path, flat) -> None:
    source = CountingSource(_many())
    plan = Plan.identity(source)
    largest = max(e.info.nbytes for e in plan.entries)
    jc.write_item(tmp_path / "ckpt", plan, source)
    assert sorted(source.reads) == sorted(source.infos)  # Each array read once.
    assert source.peak <= 2 * largest < plan.nbytes / 4
    restored = flat(jc.restore(tmp_path / "ckpt"))
    for i, name in enumerate(source.reads):
        assert float(restored[name][0, 0]) == i


def test_write_item_with_transposes_stays_within_the_budget(tmp_path: Path, flat) -> None:
    shapes = _many(8)
    source = CountingSource(shapes)
    plan = Plan(
        tuple(PlanEntry(n, n, (1, 0), ArrayInfo(s[::-1], "bfloat16")) for n, s in shapes.items()),
        AliasMap(),
    )
    jc.write_item(tmp_path / "ckpt", plan, source)
    # Source arrays only: float32 copies freed once cast and transposed.
    assert source.peak <= plan.budget(source)
    assert flat(jc.restore(tmp_path / "ckpt"))["params/layer_00/kernel"].shape == (256, 256)


def test_a_transposed_read_costs_the_source_only_where_it_is_held(tmp_path: Path) -> None:
    """A transposed entry's read holds the stored array beside its output only
    where the source makes it whole first: an item transposes chunk by chunk
    into the output, so there the read costs its output alone, and the budget of
    two of the largest tensor lets the next one be read while this one is
    written."""
    source = CountingSource({"params/w": (64, 32)})
    entry = PlanEntry("w", "params/w", (1, 0), source.infos["params/w"].permuted((1, 0)))
    plan, nbytes = Plan((entry,), AliasMap()), 64 * 32 * 4
    assert not source.permutes_as_read("params/w")
    assert plan.cost(source, entry) == 2 * nbytes  # Read whole, then transposed.
    jc.write_item(tmp_path / "ckpt", Plan.identity(source), source)
    with jc.open_source(tmp_path / "ckpt") as item:
        assert item.permutes_as_read("params/w")
        assert plan.cost(item, entry) == nbytes
    assert plan.budget(source) == 2 * nbytes


def test_arrays_are_stored_in_chunks_of_whole_rows_written_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jaxshare.checkpoint import _stream
    from jaxshare.checkpoint._chunks import ChunkStore

    monkeypatch.setattr(_stream, "CHUNK_BYTES", 4 * 2**10)  # Rows of 256 float32: 1 KiB.
    source = CountingSource({"params/w": (37, 256), "params/b": (256,)})
    jc.write_item(tmp_path / "ckpt", Plan.identity(source), source, compression="none")
    meta = ocp.StandardCheckpointHandler().metadata(tmp_path / "ckpt").tree["params"]
    assert meta["w"].storage.chunk_shape == (4, 256)  # 4 whole rows: 4 KiB.
    assert meta["b"].storage.chunk_shape == (256,)
    store = ChunkStore(tmp_path / "ckpt", use_ocdbt=True)
    chunks = [store.get(f"params.w/{k}.0") for k in range(10)]
    assert all(c is not None and c.file == chunks[0].file for c in chunks)  # type: ignore[union-attr]
    # One run of the file, in the array's order; the last chunk padded to 4 rows.
    assert [c.offset for c in chunks] == [chunks[0].offset + k * 4096 for k in range(10)]  # type: ignore[union-attr]
    restored = ocp.StandardCheckpointer().restore(tmp_path / "ckpt")
    assert np.array_equal(
        restored["params"]["w"], np.full((37, 256), source.reads.index("params/w"))
    )


def test_write_item_reports_each_array_once(torch_file: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    with SafetensorsFile(torch_file) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(
            tmp_path / "ckpt", plan, source, progress=lambda d, t, n, b: seen.append((d, t, n))
        )
    assert [d for d, _, _ in seen] == list(range(1, len(plan.entries) + 1))
    assert {t for _, t, _ in seen} == {len(plan.entries)}
    assert sorted(n for _, _, n in seen) == sorted(e.name for e in plan.entries)


class FailingSource(CountingSource):
    def read(self, name: str) -> np.ndarray:
        if len(self.reads) == 5:
            raise OSError(f"disk error reading {name}")
        return super().read(name)


def test_a_failed_read_leaves_no_item_and_keeps_the_old_one(tmp_path: Path, flat) -> None:
    jc.save(tmp_path / "ckpt", {"old": jnp.ones(3)})
    source = FailingSource(_many())
    with pytest.raises(Exception, match="disk error"):
        jc.write_item(tmp_path / "ckpt", Plan.identity(source), source, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert list(flat(jc.restore(tmp_path / "ckpt"))) == ["old"]


def test_a_failed_write_stops_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxshare.checkpoint import _stream

    append = _stream._DataFiles.append
    calls: list[int] = []

    def full_disk(self: Any, data: np.ndarray) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return append(self, data)

    monkeypatch.setattr(_stream._DataFiles, "append", full_disk)
    source = CountingSource(_many(40, rows=64))
    plan = Plan.identity(source)
    with pytest.raises(OSError, match="No space left"):  # (Raw: no chunk small enough to inline.)
        jc.write_item(tmp_path / "ckpt", plan, source, compression="none")
    assert list(tmp_path.iterdir()) == []
    assert len(source.reads) < len(plan.entries)  # Stopped early, not at the end.


def test_write_item_refuses_an_existing_item_without_force(tmp_path: Path) -> None:
    jc.save(tmp_path / "ckpt", {"old": jnp.ones(3)})
    source = CountingSource(_many(2))
    with pytest.raises(FileExistsError, match="ckpt"):
        jc.write_item(tmp_path / "ckpt", Plan.identity(source), source)
    assert source.reads == []


# --- the way back ---------------------------------------------------------------


def test_save_plan_holds_about_two_arrays(tmp_path: Path) -> None:
    source = CountingSource(_many())
    plan = Plan.identity(source)
    save_plan(tmp_path / "out.safetensors", plan, source)
    assert source.peak <= 2 * max(e.info.nbytes for e in plan.entries) < plan.nbytes / 4
    assert list(read_header(tmp_path / "out.safetensors").tensors) == list(source.infos)


def test_a_large_tensor_stored_as_it_is_streams_while_the_small_made_ones_read_ahead() -> None:
    # An unstacked stack's layers (transposed, made anew) beside an embedding many
    # times larger (written as stored): the embedding is not read ahead with them,
    # so memory holds about two layers and the embedding, not two embeddings' worth
    # of layers read ahead while a slow writer writes.
    import time
    import tracemalloc

    shapes = {f"params/layer_{i:02d}/kernel": (64, 256) for i in range(40)}
    shapes["params/embedding"] = (2048, 256)  # 2 MiB; the layers 64 KiB each
    source = CountingSource(shapes)
    entries = [
        PlanEntry(n if "layer" not in n else n + "_t", n, None if "layer" not in n else (1, 0),
                  source.infos[n] if "layer" not in n else source.infos[n].permuted((1, 0)))
        for n in shapes
    ]  # fmt: skip
    plan = Plan(tuple(entries[:4] + [entries[-1]] + entries[4:-1]), AliasMap())
    names = []
    tracemalloc.start()  # (numpy reports its arrays' memory to it.)
    try:
        for entry, blocks in plan.outputs(source):
            names.append(entry.name)
            for block in blocks:
                assert block.nbytes
            del blocks, block
            time.sleep(0.01)  # A slow writer: what is read ahead fills the budget.
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    layer, embedding = 64 * 256 * 4, 2048 * 256 * 4
    assert names == [e.name for e in plan.entries]
    assert peak <= embedding + 8 * layer < 2 * embedding


def test_entries_in_a_row_with_one_source_read_it_once(tmp_path: Path) -> None:
    shapes = _many(6)
    source = CountingSource(shapes)
    names = list(shapes)
    info = source.infos[names[0]]
    entries = []
    for name in names:  # each tensor, then its transposed copy (an alias written out)
        entries.append(PlanEntry(name, name, None, source.infos[name]))
        entries.append(PlanEntry(name + "_T", name, (1, 0), info.permuted((1, 0))))
    plan = Plan(tuple(entries), AliasMap())
    save_plan(tmp_path / "out.safetensors", plan, source)
    assert source.reads == names
    assert source.peak <= plan.budget(source)
    with SafetensorsFile(tmp_path / "out.safetensors") as got:
        for name in names:
            np.testing.assert_array_equal(got.array(name + "_T"), got.array(name).T)


def test_a_checkpoint_source_streams_into_safetensors_in_torch_names(
    torch_file: Path, tmp_path: Path
) -> None:
    with SafetensorsFile(torch_file) as source:
        jc.write_item(tmp_path / "ckpt", bridge.flax_plan(source), source)
    with jc.open_source(tmp_path / "ckpt") as source:
        save_plan(tmp_path / "back.safetensors", bridge.torch_plan(source), source)
    with SafetensorsFile(torch_file) as want, SafetensorsFile(tmp_path / "back.safetensors") as got:
        assert set(got.infos) == set(want.infos)
        assert dict(got.ties) == {"lm_head.weight": "wte.weight"}
        for name in want.infos:
            assert got.array(name).tobytes() == want.array(name).tobytes(), name


def test_streamed_entries_in_a_row_with_one_source_decode_it_once(tmp_path: Path) -> None:
    # An embedding that dwarfs the layers, written out twice in a row (as a tied head,
    # transposed, then itself): streamed in blocks, from one read of the source.
    shapes = {**{f"layer_{i}": (16, 16) for i in range(6)}, "wte": (2048, 48)}

    class Ranged(CountingSource):  # Values that tell a transpose from its source.
        def read(self, name: str) -> np.ndarray:
            x = super().read(name)
            return x + np.arange(x.size, dtype=np.float32).reshape(x.shape)

    source = Ranged(shapes)
    wte = source.infos["wte"]
    entries = [
        PlanEntry("head", "wte", (1, 0), wte.permuted((1, 0))),
        PlanEntry("wte", "wte", None, wte),
        *(PlanEntry(n, n, None, source.infos[n]) for n in shapes if n != "wte"),
    ]
    plan = Plan(tuple(entries), AliasMap())
    kinds = {e.name: type(b).__name__ for e, b in plan.outputs(source)}
    assert kinds["head"] == kinds["wte"] == "BlocksAhead"
    source.reads.clear()
    save_plan(tmp_path / "out.safetensors", plan, source)
    assert source.reads.count("wte") == 1 and len(source.reads) == 7
    with SafetensorsFile(tmp_path / "out.safetensors") as got:
        want = np.arange(2048 * 48, dtype=np.float32).reshape(2048, 48) + source.reads.index("wte")
        np.testing.assert_array_equal(got.array("wte"), want)
        np.testing.assert_array_equal(got.array("head"), want.T)


class InRows(CountingSource):
    """Reads in bands of rows as well (``array_in_rows``): each band filled when
    it is taken, after ``gate`` is passed; records what it was asked."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], band: int) -> None:
        super().__init__(shapes)
        self.band, self.gate, self.asked = band, threading.Event(), []
        self.gate.set()

    def read(self, name: str) -> np.ndarray:
        self.asked.append("whole")
        shape = self.infos[name].shape
        return np.arange(math.prod(shape), dtype=np.float32).reshape(shape)

    def array_in_rows(self, name: str) -> tuple[np.ndarray, Any]:
        self.asked.append("in rows")
        shape = self.infos[name].shape
        want = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
        out = np.full_like(want, np.nan)

        def bands() -> Any:
            for lo in range(0, len(out), self.band):
                self.gate.wait()
                out[lo : lo + self.band] = want[lo : lo + self.band]
                yield out[lo : lo + self.band]

        return out, bands()


@pytest.mark.parametrize("first", ["as it is", "transposed"])
def test_a_shared_read_hands_out_bands_as_read_and_the_others_wait_for_the_whole(
    first: str,
) -> None:
    source = InRows({"wte": (12, 5)}, band=4)
    read = SharedRead(partial(source.array, "wte"), 2, partial(source.array_in_rows, "wte"))
    want = np.arange(60, dtype=np.float32).reshape(12, 5)
    perms = [None, (1, 0)] if first == "as it is" else [(1, 0), None]
    firsts = read.blocks(perms[0])
    block = next(firsts)  # The first band (or the whole, read first for a transpose).
    source.gate.clear()  # The rest of the bands wait...
    others = BlocksAhead(read.blocks(perms[1]))  # ... and the other user for them.
    time.sleep(0.05)
    source.gate.set()
    got = [block, *firsts]
    if first == "as it is":
        assert source.asked == ["in rows"] and [b.shape for b in got] == [(4, 5)] * 3
        np.testing.assert_array_equal(np.concatenate(got), want)
        np.testing.assert_array_equal(np.concatenate(list(others), axis=0), want.T)
    else:
        assert source.asked == ["whole"]
        np.testing.assert_array_equal(np.concatenate(got, axis=0), want.T)
        np.testing.assert_array_equal(np.concatenate(list(others)), want)


def test_a_shared_read_stopped_while_filled_is_read_again_whole() -> None:
    source = InRows({"wte": (12, 5)}, band=4)
    read = SharedRead(partial(source.array, "wte"), 2, partial(source.array_in_rows, "wte"))
    firsts = read.blocks(None)
    next(firsts)
    firsts.close()  # (A write failed: the array is not whole.)
    transposed = np.concatenate(list(read.blocks((1, 0))), axis=0)
    assert source.asked == ["in rows", "whole"]
    np.testing.assert_array_equal(transposed, np.arange(60, dtype=np.float32).reshape(12, 5).T)


def test_an_item_array_is_read_in_bands_of_rows_one_per_chunk(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tensors = {"wte.weight": rng.standard_normal((5000, 900), dtype=np.float32)}
    save_file(tensors, tmp_path / "m.safetensors")
    with SafetensorsFile(tmp_path / "m.safetensors") as source:
        jc.write_item(tmp_path / "ckpt", bridge.flax_plan(source), source)
    with jc.open_source(tmp_path / "ckpt") as source:
        (name,) = source.infos
        chunks = source.chunk_shape(name)
        made = source.array_in_rows(name)
        assert made is not None and chunks is not None and chunks[0] < 5000
        whole, bands = made
        got = list(bands)
        assert [len(b) for b in got[:-1]] == [chunks[0]] * (len(got) - 1)
        assert all(np.shares_memory(b, whole) for b in got)
        np.testing.assert_array_equal(whole, source.array(name))
        np.testing.assert_array_equal(whole, tensors["wte.weight"])


def test_consolidating_a_streamed_item_gives_every_path(torch_file: Path, tmp_path: Path) -> None:
    with SafetensorsFile(torch_file) as source:
        plan = bridge.flax_plan(source)
        jc.write_item(tmp_path / "ckpt", plan, source)
    jc.consolidate_to_safetensors(tmp_path / "ckpt", tmp_path / "flat.safetensors")
    want = jc.consolidate(tmp_path / "ckpt")
    ties = jc.open_source(tmp_path / "ckpt").ties
    assert ties, "the model is tied"
    with SafetensorsFile(tmp_path / "flat.safetensors") as got:
        assert sorted(got.infos) == sorted(want)
        # Each canonical and its aliases in a row (one read for all of them), in
        # the order of each group's first name.
        groups = [ties.get(name, name) for name in got.infos]
        runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
        assert len(runs) == len(set(runs))
        firsts = [min(n for n in want if ties.get(n, n) == g) for g in runs]
        assert firsts == sorted(firsts)
        for name, array in want.items():
            assert got.array(name).tobytes() == np.ascontiguousarray(array).tobytes(), name


# --- ReadAhead ---------------------------------------------------------------------


def _blocks_made(n: int, made: list[int], fail_at: int | None = None):
    try:
        for i in range(n):
            if i == fail_at:
                raise OSError(f"block {i} unreadable")
            made.append(i)
            yield np.full(4, i)
    finally:
        made.append(-1)  # Closed.


def test_blocks_ahead_gives_every_block_in_order_made_at_most_depth_ahead() -> None:
    made: list[int] = []
    ahead = BlocksAhead(_blocks_made(6, made), depth=2)
    first = next(ahead)
    deadline = time.monotonic() + 5
    while len(made) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert made == [0, 1, 2, 3]  # One taken, two queued, one waiting to be queued.
    assert [int(b[0]) for b in [first, *ahead]] == list(range(6))
    assert made[-1] == -1 and next(ahead, None) is None


def test_blocks_ahead_raises_an_error_in_place_and_stops_when_closed_or_dropped() -> None:
    made: list[int] = []
    ahead = BlocksAhead(_blocks_made(6, made, fail_at=2))
    assert [int(next(ahead)[0]) for _ in range(2)] == [0, 1]
    with pytest.raises(OSError, match="block 2 unreadable"):
        next(ahead)
    before = threading.active_count()
    for stop in ("close", "drop"):
        made = []
        ahead = BlocksAhead(_blocks_made(1000, made), depth=1)
        next(ahead)
        thread = ahead._thread
        if stop == "close":
            ahead.close()
        del ahead
        gc.collect()
        thread.join(timeout=5)
        assert not thread.is_alive() and made[-1] == -1 and len(made) < 10
    assert threading.active_count() <= before


def test_read_ahead_gives_values_in_order_within_its_budget() -> None:
    held, peak, lock = [0], [0], threading.Lock()

    def job(i: int) -> Any:
        def make() -> int:
            with lock:
                held[0] += 1
                peak[0] = max(peak[0], held[0])
            return i

        return make

    with ReadAhead([(10, job(i)) for i in range(20)], budget=20) as ahead:
        out = []
        for value in ahead:
            out.append(value)
            with lock:
                held[0] -= 1  # The caller is done with it once it asks for the next.
    assert out == list(range(20))
    assert peak[0] <= 2


def test_read_ahead_runs_a_job_over_the_budget_alone() -> None:
    with ReadAhead([(1, lambda: "a"), (100, lambda: "b"), (1, lambda: "c")], budget=10) as ahead:
        assert list(ahead) == ["a", "b", "c"]


def test_read_ahead_raises_a_job_error_to_the_caller() -> None:
    def boom() -> int:
        raise ValueError("bad tensor")

    with ReadAhead([(1, lambda: 1), (1, boom), (1, lambda: 3)], budget=10) as ahead:
        it = iter(ahead)
        assert next(it) == 1
        with pytest.raises(ValueError, match="bad tensor"):
            next(it)


@pytest.mark.parametrize("cost, together", [(1, True), (2, False)])
def test_read_ahead_runs_jobs_at_once_within_the_budget(cost: int, together: bool) -> None:
    both = threading.Barrier(2, timeout=10 if together else 0.5)  # Each waits for the other.

    def job(i: int) -> Any:
        def make() -> int:
            both.wait()
            return i

        return make

    with ReadAhead([(cost, job(0)), (cost, job(1))], budget=2, workers=2) as ahead:
        if together:
            assert list(ahead) == [0, 1]
        else:  # Two jobs of cost 2 never run at once within a budget of 2.
            with pytest.raises(threading.BrokenBarrierError):
                list(ahead)


def test_read_ahead_stops_when_closed() -> None:
    started = []
    gate = threading.Event()

    def job(i: int) -> Any:
        def make() -> int:
            started.append(i)
            gate.wait(5)
            return i

        return make

    ahead = ReadAhead([(1, job(i)) for i in range(100)], budget=1)
    gate.set()
    assert next(iter(ahead)) == 0
    ahead.close()  # Waits for the job under way, if any.
    assert not any(t.is_alive() for t in ahead._threads)
    assert len(started) <= 2


# --- several processes -----------------------------------------------------------


@pytest.mark.subprocess
def test_two_processes_write_one_item_read_by_the_primary_only(
    run_processes: Any, tmp_path: Path
) -> None:
    import json

    worker = Path(__file__).with_name("_streaming_worker.py")
    results = []
    for process, (status, output) in enumerate(run_processes(worker, str(tmp_path))):
        assert status == 0, f"process {process} failed:\n{output[-4000:]}"
        result = json.loads(output.strip().splitlines()[-1])
        assert "crash" not in result, f"process {process} crashed:\n{result['crash']}"
        results.append(result)
    assert [r["reads"] for r in results] == [5, 0]  # Only the primary reads and writes.
    for result in results:
        assert result["alias_map"] == {"head/kernel": "layer_0/kernel"}
        assert result["values_equal"] is True
    written = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".safetensors")]
    assert written == ["ckpt"]  # No temporary left.
