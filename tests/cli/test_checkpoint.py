"""`jaxshare inspect` and `jaxshare convert` on Orbax checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxshare import checkpoint as jc
from jaxshare.cli import main

EMBEDDING = (np.arange(50 * 8) % 200).reshape(50, 8).astype(np.float32)  # Exact in bf16.


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    emb = jnp.asarray(EMBEDDING, jnp.bfloat16)
    tree = {"wte": {"embedding": emb}, "lm_head": {"kernel": emb}, "ln_f": {"scale": jnp.ones(8)}}
    jc.save(tmp_path / "ckpt", tree)
    return tmp_path / "ckpt"


def test_inspect_prints_the_tie_table(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert f"{ckpt} (orbax): 3 arrays, 2 stored" in out
    row = next(line for line in out.splitlines() if line.startswith("lm_head/kernel"))
    assert row.split() == [
        "lm_head/kernel",
        "wte/embedding",
        "jaxshare_alias_map.json",
        "(50,",
        "8)",
        "bfloat16",
        "800",
        "B",
    ]
    assert "saved by dedupe: 800 B" in out


def test_inspect_json(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(ckpt), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "orbax"
    assert (report["bytes_stored"], report["bytes_total"], report["bytes_saved"]) == (
        832,
        1632,
        800,
    )
    [group] = report["tie_groups"]
    assert group["canonical"] == "lm_head/kernel"
    assert group["aliases"] == [
        {
            "path": "wte/embedding",
            "permute": None,
            "written_out": False,
            "origin": "jaxshare_alias_map.json",
        }
    ]
    assert report["alias_map"]["aliases"] == {"wte/embedding": "lm_head/kernel"}


def test_convert_to_safetensors_with_a_cast(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(ckpt), str(out), "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out
    assert "3 tensors" in captured.err  # The progress summary (stderr is no terminal).
    tensors = load_file(out)
    assert sorted(tensors) == ["lm_head/kernel", "ln_f/scale", "wte/embedding"]
    assert tensors["wte/embedding"].dtype == np.float32
    assert np.array_equal(tensors["wte/embedding"], tensors["lm_head/kernel"])
    assert np.array_equal(tensors["lm_head/kernel"], EMBEDDING)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "{ckpt}", "{tmp}/exists.safetensors"], "already exists; pass --force"),
        (
            ["convert", "{ckpt}", "{tmp}/x.safetensors", "--dtype", "int8"],
            "must be a floating dtype",
        ),
    ],
    ids=["exists", "bad_dtype"],
)
def test_errors_are_one_line_with_status_1(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "exists.safetensors").write_text("")
    (tmp_path / "empty").mkdir()
    argv = [a.format(ckpt=ckpt, tmp=tmp_path) for a in args] + (
        ["--quiet"] if args[0] == "convert" else []
    )
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"jaxshare {args[0]}: error:")
    assert (tmp_path / "exists.safetensors").read_text() == ""
