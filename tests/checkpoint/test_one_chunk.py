"""Arrays that plain Orbax stores as one chunk are decoded as a stream: the same
values as TensorStore's own read, whole, sliced and in blocks (transposed too),
for zarr v2 and zarr v3 items, while chunked items keep TensorStore's reads."""

from __future__ import annotations

from pathlib import Path

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxshare import checkpoint as jc
from jaxshare.checkpoint import _read
from jaxshare.checkpoint._item import open_item
from jaxshare.checkpoint._read import LeafReader
from jaxshare.formats import find_item

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.uint8, np.bool_]


def _plain(path: Path, tree: dict, *, zarr3: bool) -> LeafReader:
    """``tree`` saved by plain Orbax (one chunk per array), opened to read."""
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=zarr3))
    checkpointer.save(path, tree)
    checkpointer.close()
    return LeafReader(open_item(find_item(path)))


def _tensorstore(reader: LeafReader, name: str) -> np.ndarray:
    """The array as TensorStore itself reads it."""
    return np.asarray(reader._open(name).read().result())


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges and blocks of a few bytes, so every array spans many of each."""
    monkeypatch.setattr(_read, "_RANGE_BYTES", 64)
    monkeypatch.setattr(_read, "BLOCK_BYTES", 20)


@pytest.mark.usefixtures("small_ranges")
@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_one_chunk_reads_as_tensorstore_does(tmp_path: Path, zarr3: bool, dtype: type) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "w": (rng.standard_normal((5, 7, 3)) * 8).astype(dtype),
        "v": (rng.standard_normal((33,)) * 8).astype(dtype),
        "zero": np.zeros((6, 4), dtype),
    }
    reader = _plain(tmp_path / "item", arrays, zarr3=zarr3)
    for name, array in arrays.items():
        assert reader._one_chunk(name, reader._open(name)) is not None, name
        want = _tensorstore(reader, name)
        np.testing.assert_array_equal(want, array)
        got = reader.read(name)
        assert (got.dtype, got.tobytes()) == (want.dtype, want.tobytes())
        blocks = list(reader.blocks(name))
        assert len(blocks) > 1
        assert np.concatenate(blocks).tobytes() == want.tobytes()
        perm = tuple(reversed(range(array.ndim)))
        transposed = np.concatenate(list(reader.blocks(name, perm)))
        assert transposed.tobytes() == np.ascontiguousarray(want.transpose(perm)).tobytes()
        index = (slice(1, 3),) + (slice(None),) * (array.ndim - 1)
        assert reader.read_slice(name, index).tobytes() == want[index].tobytes()


def test_chunked_and_scalar_arrays_keep_tensorstore_reads(tmp_path: Path) -> None:
    """jaxshare's items are stored in chunks, which TensorStore reads one by one."""
    jc.save(tmp_path / "ours", {"w": np.ones((8, 1024, 1024), np.float32)})
    ours = LeafReader(open_item(find_item(tmp_path / "ours")))
    assert ours.chunk_shape("w") != (8, 1024, 1024)
    assert ours._one_chunk("w", ours._open("w")) is None
    plain = _plain(tmp_path / "plain", {"s": np.float32(3), "w": np.ones(3)}, zarr3=False)
    assert plain._one_chunk("s", plain._open("s")) is None
    assert plain.read("s") == 3
    cast = LeafReader(open_item(find_item(tmp_path / "plain")), dtype=np.dtype(ml_dtypes.bfloat16))
    assert cast._one_chunk("w", cast._open("w")) is None  # (A cast is TensorStore's.)
    assert cast.read("w").dtype == ml_dtypes.bfloat16


def test_a_chunk_shorter_than_its_array_is_refused(tmp_path: Path) -> None:
    reader = _plain(tmp_path / "item", {"w": np.arange(64, dtype=np.float32)}, zarr3=False)
    store = reader._open("w")
    chunk = reader._one_chunk("w", store)
    assert chunk is not None
    kvstore = ts.KvStore.open(store.spec().to_json()["kvstore"]).result()
    kvstore[b"0"] = kvstore[b"0"][:-3]  # (The zstd frame, cut short.)
    with pytest.raises(ValueError, match="truncated"):
        reader.read("w")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    array=hnp.arrays(
        st.sampled_from([np.float32, np.int16, np.uint8]),
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=9),
    ),
    zarr3=st.booleans(),
    range_bytes=st.integers(1, 200),
    block_bytes=st.integers(1, 300),
)
def test_stream_law(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    array: np.ndarray,
    zarr3: bool,
    range_bytes: int,
    block_bytes: int,
) -> None:
    """Whatever the range and block sizes, the blocks are the array, end to end."""
    monkeypatch.setattr(_read, "_RANGE_BYTES", range_bytes)
    monkeypatch.setattr(_read, "BLOCK_BYTES", block_bytes)
    reader = _plain(tmp_path_factory.mktemp("law") / "item", {"a": array}, zarr3=zarr3)
    assert reader.read("a").tobytes() == array.tobytes()
    assert b"".join(b.tobytes() for b in reader.blocks("a")) == array.tobytes()
