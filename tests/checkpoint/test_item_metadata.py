"""An item's metadata read without Orbax is Orbax's own: the same arrays (shapes,
dtypes, names), the same other leaves, and the same TensorStore specs, for items
jaxshare and plain Orbax write (zarr v2 and v3, OCDBT or not, scalars, strings,
zero-size arrays, lists); and reading it imports neither Orbax nor JAX."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxshare import checkpoint as jc
from jaxshare.checkpoint._item import StoredItem, array_spec, open_item
from jaxshare.checkpoint._read import LeafReader
from jaxshare.formats import find_item

TREE = {
    "params": {
        "embed": np.arange(12, dtype=np.float32).reshape(3, 4),
        "blocks": [
            {"w": np.ones((2, 3), ml_dtypes.bfloat16)},
            {"w": np.full((2, 3), 2, ml_dtypes.bfloat16)},
        ],
        "step": np.int64(7),
        "flag": np.array(True),
    },
    "note": "a string leaf",
}


def _plain(path: Path, tree: dict, *, zarr3: bool, ocdbt: bool) -> Path:
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=zarr3, use_ocdbt=ocdbt))
    checkpointer.save(path, tree)
    checkpointer.close()
    return path


def _by_orbax(path: Path) -> StoredItem:
    handler = ocp.StandardCheckpointHandler()
    try:
        return open_item(epath.Path(path), handler=handler)
    finally:
        handler.close()


def _same(ours: StoredItem, orbax: StoredItem) -> None:
    assert ours.stored == orbax.stored
    assert list(ours.stored) == list(orbax.stored)
    assert ours.names == orbax.names
    assert sorted(ours.other) == sorted(orbax.other)
    assert ours.use_zarr3 == orbax.use_zarr3
    assert ours.empty == orbax.empty


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
@pytest.mark.parametrize("ocdbt", [True, False], ids=["ocdbt", "files"])
def test_a_plain_orbax_item_reads_as_orbax_reads_it(
    tmp_path: Path, zarr3: bool, ocdbt: bool
) -> None:
    path = _plain(tmp_path / "item", TREE, zarr3=zarr3, ocdbt=ocdbt)
    ours = open_item(find_item(path))
    _same(ours, _by_orbax(path))
    assert ours.other == ("note",)
    assert ours.stored["params/blocks/1/w"].dtype == "bfloat16"
    assert ours.stored["params/step"].shape == ()
    reader = LeafReader(ours)
    assert np.array_equal(reader.read("params/blocks/1/w"), TREE["params"]["blocks"][1]["w"])
    assert reader.read("params/step") == 7


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
@pytest.mark.parametrize("ocdbt", [True, False], ids=["ocdbt", "files"])
def test_the_spec_is_orbaxs(tmp_path: Path, zarr3: bool, ocdbt: bool) -> None:
    info = ocp.type_handlers.ParamInfo(
        name="params.blocks.0.w",
        parent_dir=epath.Path(tmp_path),
        use_zarr3=zarr3,
        is_ocdbt_checkpoint=ocdbt,
    )
    want = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=ocdbt)
    assert array_spec(tmp_path, "params.blocks.0.w", zarr3, ocdbt) == want


def test_a_jaxshare_item_with_ties_and_empty_arrays(tmp_path: Path) -> None:
    embed = jnp.arange(6.0).reshape(2, 3)
    tree = {"embed": embed, "head": embed, "bias": jnp.zeros((0,)), "n": np.zeros((0, 2), np.int8)}
    jc.save(tmp_path / "ckpt", tree)
    ours = open_item(find_item(tmp_path / "ckpt"))
    _same(ours, _by_orbax(find_item(tmp_path / "ckpt")))
    assert set(ours.empty) == {"bias", "n"}
    assert ours.stored["n"].dtype == "int8"
    assert dict(ours.alias_map) == {"head": "embed"}


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=st.lists(st.lists(st.integers(1, 4), max_size=3), min_size=1, max_size=4),
    dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.uint8]),
    zarr3=st.booleans(),
)
def test_law_any_tree_reads_as_orbax_reads_it(
    tmp_path_factory: pytest.TempPathFactory, shapes: list[list[int]], dtype: type, zarr3: bool
) -> None:
    tree = {f"layer{i}": {"w": np.zeros(shape, dtype)} for i, shape in enumerate(shapes)}
    path = _plain(tmp_path_factory.mktemp("law") / "item", tree, zarr3=zarr3, ocdbt=True)
    _same(open_item(find_item(path)), _by_orbax(path))


def test_a_broken_metadata_file_is_one_line(tmp_path: Path) -> None:
    path = _plain(tmp_path / "item", {"w": np.ones(2)}, zarr3=False, ocdbt=True)
    (path / "_METADATA").write_text('{"tree_metadata": {"(\'w\',)": {}}}')
    with pytest.raises(ValueError, match=r"_METADATA: expected Orbax's tree metadata") as e:
        open_item(find_item(path))
    assert "\n" not in str(e.value)
    (path / "_METADATA").write_text("not json")
    with pytest.raises(ValueError, match=r"_METADATA: Orbax's metadata is not JSON"):
        open_item(find_item(path))


def test_a_missing_array_names_it(tmp_path: Path) -> None:
    path = _plain(tmp_path / "item", {"w": np.ones(2), "v": np.ones(3)}, zarr3=False, ocdbt=False)
    for file in (path / "v").iterdir():
        file.unlink()
    with pytest.raises(ValueError, match=r"the array 'v' \('v' in _METADATA\) cannot be opened"):
        open_item(find_item(path))


@pytest.mark.subprocess
def test_reading_an_item_imports_neither_orbax_nor_jax(tmp_path: Path) -> None:
    jc.save(tmp_path / "ckpt", {"embed": np.ones((4, 2), np.float32), "b": np.zeros((0,))})
    code = (
        "import sys\n"
        "from jaxshare.checkpoint import open_source\n"
        f"source = open_source({str(tmp_path / 'ckpt')!r})\n"
        "print(sorted(source.infos), float(source.array('embed').sum()))\n"
        "print([m for m in ('jax', 'orbax', 'flax', 'torch') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["['b', 'embed'] 8.0", "[]"]
