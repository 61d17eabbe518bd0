"""Arrays read from their stored chunks (``jaxshare.checkpoint._chunks``): the same
values as TensorStore's own read -- whole, sliced, in blocks, transposed, cast --
for every way Orbax stores an array (zarr v2 and v3, sharded; OCDBT or files; zstd or
raw; one chunk or many, edge chunks included), and damaged chunks refused in one
line naming the chunk."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxshare.checkpoint import _read
from jaxshare.checkpoint._chunks import ChunkStore, DirectArray
from jaxshare.checkpoint._item import open_item
from jaxshare.checkpoint._read import LeafReader
from jaxshare.formats import find_item

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.uint8, np.bool_]
LAYOUTS = [
    pytest.param(zarr3, ocdbt, zstd, id=f"{'zarr3' if zarr3 else 'zarr2'}-"
                 f"{'ocdbt' if ocdbt else 'files'}-{'zstd' if zstd else 'raw'}")
    for zarr3, ocdbt, zstd in itertools.product([False, True], repeat=3)
]  # fmt: skip


def _plain(
    path: Path,
    tree: dict,
    *,
    zarr3: bool = False,
    ocdbt: bool = True,
    zstd: bool = True,
    chunk_bytes: int | None = None,
) -> LeafReader:
    """``tree`` saved by plain Orbax (one chunk per array, or chunks of about
    ``chunk_bytes``), opened to read."""
    handler = ocp.PyTreeCheckpointHandler(use_zarr3=zarr3, use_ocdbt=ocdbt, use_compression=zstd)
    args = {k: ocp.SaveArgs(chunk_byte_size=chunk_bytes) for k in tree}
    with ocp.Checkpointer(handler) as checkpointer:
        checkpointer.save(path, args=ocp.args.PyTreeSave(tree, save_args=args))
    return LeafReader(open_item(find_item(path)))


def _tensorstore(reader: LeafReader, name: str) -> np.ndarray:
    """The array as TensorStore itself reads it."""
    return np.asarray(reader._open(name).read().result())


def _joined(blocks) -> np.ndarray:
    """Blocks of whole rows, end to end (a scalar's one block as it is)."""
    blocks = list(blocks)
    return blocks[0] if blocks[0].ndim == 0 else np.concatenate(blocks)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.flags.c_contiguous
    assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())


@pytest.mark.parametrize(("zarr3", "ocdbt", "zstd"), LAYOUTS)
@pytest.mark.parametrize("chunk_bytes", [None, 96], ids=["one-chunk", "chunked"])
def test_every_read_equals_tensorstores(tmp_path, zarr3, ocdbt, zstd, chunk_bytes, monkeypatch):
    monkeypatch.setattr(_read, "BLOCK_BYTES", 20)  # A large chunk streams in many blocks.
    rng = np.random.default_rng(0)
    arrays = {
        f"{np.dtype(dtype).name}_{i}": (rng.standard_normal(shape) * 8).astype(dtype)
        for dtype in DTYPES
        for i, shape in enumerate([(5, 7, 3), (33,), (9, 10)])
    }
    arrays["scalar"] = np.float32(2.5)
    reader = _plain(tmp_path / "item", arrays, zarr3=zarr3, ocdbt=ocdbt, zstd=zstd,
                    chunk_bytes=chunk_bytes)  # fmt: skip
    for name, array in arrays.items():
        direct = reader.direct(name)
        assert direct is not None, name
        assert (direct.chunking.zstd, direct.chunking.shard is not None) == (zstd, zarr3)
        want = _tensorstore(reader, name)
        np.testing.assert_array_equal(want, array)
        _same(reader.read(name), want)
        _same(_joined(reader.blocks(name)), want)
        for perm in itertools.permutations(range(want.ndim)):
            transposed = want.transpose(perm).copy()
            _same(reader.read_permuted(name, perm), transposed)
            _same(_joined(reader.blocks(name, perm)), transposed)
        if want.ndim:
            for index in [(slice(1, 3),), (slice(2, None), slice(1, 2)), (slice(0, 0),)]:
                index = index[: want.ndim]
                _same(reader.read_slice(name, index), want[index].copy())
    cast = LeafReader(reader._item, dtype=np.dtype(ml_dtypes.bfloat16))
    for name in ("float32_0", "float16_2", "int64_1"):
        want = np.asarray(cast._open(name).read().result())
        _same(cast.read(name), want)
        _same(cast.read_permuted(name, tuple(reversed(range(want.ndim)))), want.T.copy())
        _same(_joined(cast.blocks(name)), want)


def test_raw_chunks_of_whole_rows_are_views_of_the_file(tmp_path):
    array = np.arange(256, dtype=np.float32).reshape(64, 4)
    reader = _plain(tmp_path / "item", {"w": array}, zstd=False, chunk_bytes=128)
    rows, width = reader.chunk_shape("w")
    assert width == 4 and rows < 64
    blocks = list(reader.blocks("w"))
    assert len(blocks) == -(-64 // rows) and all(not b.flags.writeable for b in blocks)
    assert all(b.base is not None for b in blocks)  # (Views, not copies.)
    assert np.concatenate(blocks).tolist() == array.tolist()


def test_an_index_of_many_nodes_is_followed_down(tmp_path):
    """TensorStore splits a large B+tree into interior and leaf nodes (here forced
    small): every chunk is still found, with its key's full prefix."""
    array = np.arange(40 * 30, dtype=np.int32).reshape(40, 30)
    kvstore = {"driver": "ocdbt", "base": f"file://{tmp_path}/",
               "config": {"max_decoded_node_bytes": 500}}  # fmt: skip
    spec = {"driver": "zarr", "kvstore": {**kvstore, "path": "params.w/"},
            "metadata": {"shape": [40, 30], "chunks": [3, 4], "dtype": "<i4",
                         "compressor": {"id": "zstd", "level": 1}}}  # fmt: skip
    ts.open(spec, create=True).result().write(array).result()
    base = ts.KvStore.open(f"file://{tmp_path}/").result()
    manifest = ts.ocdbt.dump(base).result()
    assert manifest["versions"][-1]["root_height"] >= 1
    store = ChunkStore(tmp_path, use_ocdbt=True)
    direct = DirectArray.of(store, "params.w", zarr3=False)
    assert direct is not None
    assert direct.read().tolist() == array.tolist()
    assert direct.read(perm=(1, 0)).tolist() == array.T.tolist()


def test_an_item_of_two_processes_reads_through_its_base_paths(tmp_path):
    """Orbax merges the processes' databases under the item's manifest, their
    files named through base paths (``ocdbt.process_0/``)."""
    array = np.random.default_rng(0).random((32, 32))  # (Out of line: over 1024 bytes.)
    reader = _plain(tmp_path / "item", {"w": array})
    assert (tmp_path / "item" / "ocdbt.process_0").is_dir()
    chunk = reader._chunks.get("w/0.0")
    assert chunk is not None and "ocdbt.process_0" in str(chunk.file)
    assert reader.read("w").tolist() == array.tolist()


def _damage(tmp_path: Path, **kwargs) -> tuple[LeafReader, Path]:
    """An item whose one array is stored in a file of its own, and that file."""
    reader = _plain(tmp_path / "item", {"w": np.arange(64, dtype=np.float32)}, ocdbt=False,
                    **kwargs)  # fmt: skip
    meta = (".zarray", "zarr.json")
    files = sorted(p for p in (tmp_path / "item" / "w").rglob("*") if p.is_file())
    return reader, [p for p in files if p.name not in meta][-1]


@pytest.mark.parametrize(
    ("damage", "kwargs", "message"),
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-3]), {}, "ends before"),
        (lambda f: f.write_bytes(f.read_bytes() + b"\0" * 9), {"zstd": False}, "a raw chunk of"),
        (lambda f: f.unlink(), {}, "not stored"),
        (lambda f: f.write_bytes(f.read_bytes()[:-1] + b"\x55"), {"zarr3": True}, "CRC-32C"),
    ],
    ids=["truncated-zstd", "raw-too-long", "missing", "shard-index"],
)
def test_a_damaged_chunk_is_one_line_naming_it(tmp_path, damage, kwargs, message):
    reader, file = _damage(tmp_path, **kwargs)
    damage(file)
    with pytest.raises(ValueError, match=message) as error:
        reader.read("w")
    assert "\n" not in str(error.value) and "w/" in str(error.value)


def test_a_codec_not_decoded_here_is_left_to_tensorstore(tmp_path):
    spec = {"driver": "zarr", "kvstore": f"file://{tmp_path}/a/",
            "metadata": {"shape": [6], "chunks": [4], "dtype": "<f4",
                         "compressor": {"id": "zlib", "level": 1}}}  # fmt: skip
    ts.open(spec, create=True).result().write(np.arange(6, dtype=np.float32)).result()
    assert DirectArray.of(ChunkStore(tmp_path, use_ocdbt=False), "a", zarr3=False) is None


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    array=hnp.arrays(
        st.sampled_from([np.float32, np.int16, np.uint8]),
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=9),
    ),
    zarr3=st.booleans(),
    zstd=st.booleans(),
    chunk_bytes=st.sampled_from([None, 7, 40, 200]),
    data=st.data(),
)
def test_read_law(tmp_path_factory, array, zarr3, zstd, chunk_bytes, data):
    """Any region, transposed any way, is the array's, whatever the chunks."""
    path = tmp_path_factory.mktemp("law") / "item"
    reader = _plain(path, {"a": array}, zarr3=zarr3, zstd=zstd, chunk_bytes=chunk_bytes)
    region = tuple(
        slice(*sorted(data.draw(st.tuples(st.integers(0, n), st.integers(0, n)))))
        for n in array.shape
    )
    perm = tuple(data.draw(st.permutations(range(array.ndim))))
    got = reader.direct("a").read(region, perm=perm)
    _same(got, array[region].transpose(perm).copy())
    assert b"".join(b.tobytes() for b in reader.blocks("a")) == array.tobytes()
    shutil.rmtree(path)


def test_an_index_naming_a_file_outside_the_item_is_refused(tmp_path):
    """A hostile B+tree's data file path may not leave the item (as TensorStore's
    file store refuses such keys)."""
    from jaxshare.checkpoint._ocdbt import ValueRef, encode_database, new_data_file_name

    (tmp_path / "secret").write_bytes(b"\0" * 16)
    item = tmp_path / "item"
    (item / "d").mkdir(parents=True)
    meta = {"chunks": [4], "compressor": None, "dtype": "<f4", "filters": None,
            "order": "C", "shape": [4], "zarr_format": 2}  # fmt: skip
    node = new_data_file_name()
    manifest, nodes = encode_database(
        {b"w/.zarray": json.dumps(meta).encode(), b"w/0": ValueRef("../secret", 0, 16)},
        node_file=node,
    )
    (item / node).write_bytes(nodes)
    (item / "manifest.ocdbt").write_bytes(manifest)
    with pytest.raises(ValueError, match=r"names a file outside it, '\.\./secret'"):
        ChunkStore(item, use_ocdbt=True).get("w/0")


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
def test_a_cold_items_large_frames_are_read_past_the_page_cache(
    tmp_path, zarr3, drop_cache, cached_mib
):
    """A zstd frame of a MiB or more that the page cache lacks is read past it
    (``read_direct``) and decoded from there, bit for bit, leaving the cache as it
    was; a warm one is decoded where it lies."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("direct reads (O_DIRECT) are Linux's")
    rng = np.random.default_rng(3)
    arrays = {
        "w": rng.standard_normal((1024, 768), dtype=np.float32),  # 3 MiB, barely compressed
        "b": rng.standard_normal((2048, 512)).astype(ml_dtypes.bfloat16),  # 2 MiB
    }
    reader = _plain(tmp_path / "item", arrays, zarr3=zarr3)
    files = [p for p in (tmp_path / "item").rglob("*") if p.is_file() and p.stat().st_size > 2**20]
    assert files  # (The OCDBT data file.)
    for name in arrays:  # The item's index read first (its nodes lie in the data file).
        _same(reader.read(name), arrays[name])
    for path in files:
        drop_cache(path)
    got = {name: reader.read(name) for name in arrays}
    got_t = {name: reader.read_permuted(name, (1, 0)) for name in arrays}
    for path in files:
        assert not any(cached_mib(path)[:-1]), path  # (The last MiB: the index.)
    for name, array in arrays.items():
        _same(got[name], array)
        _same(got_t[name], array.T.copy())
    for path in files:  # Warm: decoded where it lies, in the page cache.
        path.read_bytes()
    for name, array in arrays.items():
        _same(reader.read(name), array)
