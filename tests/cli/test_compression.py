"""`jaxshare convert SRC ITEM --compression none`: an item whose chunks are stored
raw, which plain Orbax restores and every jaxshare reader reads, bit for bit, the tie
kept; the option is refused in one line where it does not apply."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from safetensors.numpy import load_file, save_file

from jaxshare import AliasMap
from jaxshare import checkpoint as jc
from jaxshare.checkpoint._item import array_spec, is_ocdbt, open_item, read_context
from jaxshare.cli import main
from jaxshare.formats import find_item, read_header

RNG = np.random.default_rng(0)
TENSORS = {
    "model.embed_tokens.weight": RNG.standard_normal((64, 16)).astype(np.float32),
    "model.layers.0.mlp.up_proj.weight": RNG.standard_normal((48, 16)).astype(ml_dtypes.bfloat16),
    "model.norm.weight": np.ones(16, np.float32),
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    ties = AliasMap({"lm_head.weight": "model.embed_tokens.weight"})
    save_file(TENSORS, path, metadata={"jaxshare.alias_map": ties.to_json()})
    return path


def _compressors(item: Path) -> set[str | None]:
    """The compressor of every stored array, from its zarr metadata in the item."""
    stored = open_item(item)
    out = set()
    for name in stored.names.values():
        spec = array_spec(item, name, stored.use_zarr3, is_ocdbt(item))
        store = ts.open(spec, open=True, context=read_context(is_ocdbt(item))).result()
        compressor = store.spec().to_json()["metadata"].get("compressor")
        out.add(None if compressor is None else compressor["id"])
    return out


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_an_item_written_raw_reads_back_bit_for_bit(
    model: Path, tmp_path: Path, compression: str
) -> None:
    item = tmp_path / "ckpt"
    assert main(["convert", str(model), str(item), "--compression", compression, "--quiet"]) == 0
    assert _compressors(find_item(item)) == {None if compression == "none" else "zstd"}
    plain = ocp.StandardCheckpointer().restore(find_item(item).absolute())
    assert np.array_equal(
        plain["params"]["model"]["embed_tokens"]["embedding"],
        TENSORS["model.embed_tokens.weight"],
    )
    back = tmp_path / "back.safetensors"
    assert main(["convert", str(item), str(back), "--names", "torch", "--quiet"]) == 0
    tensors = load_file(back)
    ties = AliasMap.from_json(read_header(back).metadata["jaxshare.alias_map"])
    assert dict(ties) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert len(jc.read_alias_map(item)) == 1  # The tie, stored once.
    for name, value in TENSORS.items():
        assert tensors[name].dtype == value.dtype
        assert tensors[name].tobytes() == value.tobytes(), name
    assert main(["verify", str(model), str(item)]) == 0


def test_raw_is_larger_than_zstd_only_by_what_zstd_saves(model: Path, tmp_path: Path) -> None:
    sizes = {}
    for compression in ("zstd", "none"):
        item = tmp_path / compression
        main(["convert", str(model), str(item), "--compression", compression, "--quiet"])
        sizes[compression] = sum(p.stat().st_size for p in item.rglob("*") if p.is_file())
    assert sizes["zstd"] < sizes["none"]


@pytest.mark.parametrize("dst", ["out.safetensors", "out.pt"])
def test_compression_is_for_item_outputs(
    model: Path, tmp_path: Path, dst: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", str(model), str(tmp_path / dst), "--compression", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compression is how an Orbax item stores its chunks" in err[0]
    assert not (tmp_path / dst).exists()


def test_write_item_refuses_an_unknown_compression(model: Path, tmp_path: Path) -> None:
    from jaxshare.formats import SafetensorsFile
    from jaxshare.stream import Plan

    with SafetensorsFile(model) as source, pytest.raises(ValueError, match="`compression` must"):
        jc.write_item(tmp_path / "ckpt", Plan.identity(source), source, compression="lz4")
    assert not (tmp_path / "ckpt").exists()
