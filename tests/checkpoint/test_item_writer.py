"""Items laid out by jaxshare itself (``jaxshare.checkpoint._stream``): what plain
Orbax and TensorStore read is what was written, bit for bit, in every dtype and
shape (a property law); the files are those of an Orbax item; no JAX or Orbax is
imported to write one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxshare import AliasMap
from jaxshare import checkpoint as jc
from jaxshare.checkpoint import _stream
from jaxshare.checkpoint._item import array_spec, read_context
from jaxshare.core.report import ArrayInfo
from jaxshare.stream import Plan, TensorSource

DTYPES = [
    np.float32,
    np.float16,
    ml_dtypes.bfloat16,
    np.float64,
    np.int64,
    np.int32,
    np.uint8,
    np.bool_,
]


def _arrays(dtype: type) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``dtype`` (bfloat16 ones drawn as float32, then cast)."""
    drawn = np.float32 if dtype is ml_dtypes.bfloat16 else dtype
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)
    return hnp.arrays(drawn, shapes).map(lambda a: a.astype(dtype))


class Memory(TensorSource):
    """Arrays in memory, by Flax path."""

    kind = "memory"

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.infos = {n: ArrayInfo(a.shape, np.dtype(a.dtype).name) for n, a in arrays.items()}

    def read(self, name: str) -> np.ndarray:
        return self.arrays[name]


def _tensorstore(item: Path, name: str) -> np.ndarray:
    """An array as TensorStore reads it from the item, by its Orbax name."""
    spec = array_spec(item, name, use_zarr3=False, use_ocdbt=True)
    store = ts.open(spec, read=True, context=read_context(True)).result()
    return np.asarray(store.read().result())


def test_the_files_are_an_orbax_items(tmp_path: Path) -> None:
    source = Memory({
        "params/wte/embedding": np.arange(20, dtype=np.float32).reshape(5, 4),
        "params/steps": np.array([2**40]),
        "params/scale": np.float32(1.5),
        "params/none": np.zeros((0, 3), np.float32),
    })  # fmt: skip
    plan = Plan.identity(source)
    jc.write_item(tmp_path / "ckpt", plan, source)
    item = tmp_path / "ckpt"
    names = sorted(p.name for p in item.iterdir())
    assert names == sorted([
        "_CHECKPOINT_METADATA", "_METADATA", "_sharding", "commit_success.txt", "d",
        "jaxshare_alias_map.json", "manifest.ocdbt",
    ])  # fmt: skip
    meta = json.loads((item / "_METADATA").read_text())
    kinds = {k: v["value_metadata"]["value_type"] for k, v in meta["tree_metadata"].items()}
    assert kinds == {
        "('params', 'scale')": "jax.Array",
        "('params', 'steps')": "np.ndarray",  # (8 bytes: JAX would narrow it.)
        "('params', 'wte', 'embedding')": "jax.Array",
    }
    assert meta["custom_metadata"]["jaxshare.empty_arrays"]["params/none"]["shape"] == [0, 3]
    step = json.loads((item / "_CHECKPOINT_METADATA").read_text())
    assert step["item_handlers"] == "jaxshare.checkpoint.SharedCheckpointHandler"
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(item)
        metadata = checkpointer.metadata(item)
    assert restored["params"]["steps"].dtype == np.int64 and restored["params"]["steps"][0] == 2**40
    assert float(restored["params"]["scale"]) == 1.5
    assert metadata.item_metadata.tree["params"]["wte"]["embedding"].shape == (5, 4)
    assert jc.restore(item)["params"]["none"].shape == (0, 3)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrays=st.lists(
        st.sampled_from(DTYPES).flatmap(_arrays),
        min_size=1,
        max_size=5,
    ),
    zstd=st.booleans(),
    chunk_bytes=st.sampled_from([8, 64, 2**20]),
)
def test_law_orbax_and_tensorstore_read_what_was_written(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    arrays: list[np.ndarray],
    zstd: bool,
    chunk_bytes: int,
) -> None:
    monkeypatch.setattr(_stream, "CHUNK_BYTES", chunk_bytes)
    source = Memory({"params/one": np.ones(3), **{f"params/a{i}": a for i, a in enumerate(arrays)}})
    item = tmp_path_factory.mktemp("law") / "ckpt"
    jc.write_item(item, Plan.identity(source), source, compression="zstd" if zstd else "none")
    plain = ocp.StandardCheckpointer().restore(item)["params"]  # (Zero-size ones are ours.)
    ours = jc.restore(item)["params"]
    for i, array in enumerate(arrays):
        got = ours[f"a{i}"]
        assert got.shape == array.shape and np.dtype(got.dtype) == array.dtype
        if array.size:
            assert np.asarray(plain[f"a{i}"]).tobytes() == array.tobytes()
            assert np.asarray(got).tobytes() == array.tobytes()
            assert _tensorstore(item, f"params.a{i}").tobytes() == array.tobytes()


def test_data_files_roll_over_and_every_chunk_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_stream, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(_stream, "DATA_FILE_BYTES", 10_000)
    rng = np.random.default_rng(0)
    arrays = {f"params/w{i}": rng.standard_normal((40, 64)).astype(np.float32) for i in range(3)}
    source = Memory(arrays)
    jc.write_item(tmp_path / "ckpt", Plan.identity(source), source, compression="none")
    data = sorted((tmp_path / "ckpt" / "d").iterdir())
    assert len(data) > 3  # Several data files, and the B+tree's.
    with jc.open_source(tmp_path / "ckpt") as got:
        for name, array in arrays.items():
            assert got.array(name).tobytes() == array.tobytes()


def test_a_stack_is_stored_in_per_layer_chunks(tmp_path: Path) -> None:
    from jaxshare.core.naming import NamingRecord

    stack = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    naming = NamingRecord({"params/w": "layers.{i}.w"})  # (Layers on axis 0.)
    source = Memory({"params/w": stack})
    plan = Plan(Plan.identity(source).entries, AliasMap(naming=naming))
    jc.write_item(tmp_path / "ckpt", plan, source)
    with jc.open_source(tmp_path / "ckpt") as got:
        assert got.chunk_shape("params/w") == (1, 6, 5)
        assert got.array("params/w").tobytes() == stack.tobytes()


def test_a_plan_of_zero_size_arrays_only_is_refused(tmp_path: Path) -> None:
    source = Memory({"params/none": np.zeros((0, 3), np.float32)})
    with pytest.raises(ValueError, match="nothing to store: every array of the plan is zero-size"):
        jc.write_item(tmp_path / "ckpt", Plan.identity(source), source)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_writing_an_item_imports_neither_orbax_nor_jax(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.ones((4, 2), np.float32)}, tmp_path / "in.safetensors")
    code = (
        "import sys\n"
        "from jaxshare import checkpoint\n"
        "from jaxshare.formats import SafetensorsFile\n"
        "from jaxshare.stream import Plan\n"
        f"with SafetensorsFile({str(tmp_path / 'in.safetensors')!r}) as source:\n"
        f"    checkpoint.write_item({str(tmp_path / 'ckpt')!r}, Plan.identity(source), source)\n"
        "print([m for m in ('jax', 'orbax', 'flax', 'torch', 'tensorstore') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]"]
    assert jc.restore(tmp_path / "ckpt")["w"].tolist() == [[1.0, 1.0]] * 4
