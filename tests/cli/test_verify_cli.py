"""``jaxshare verify A [B]`` and ``jaxshare convert --manifest``: the command renders
``bridge.verify``'s report, one line per finding, and exits 0 when equal, 1 otherwise."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxshare.cli import main

TIE = '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"lm_head.weight": "wte.weight"}}'


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shapes = {"wte.weight": (10, 4), "fc.weight": (4, 4), "fc.bias": (4,)}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _file(path: Path, tensors: dict, tied: bool = True) -> Path:
    save_file(
        tensors,
        str(path),
        metadata={"format": "pt", **({"jaxshare.alias_map": TIE} if tied else {})},
    )
    return path


def run(*argv: object) -> int:
    return main([str(a) for a in argv])


def tree_hash(path: Path) -> dict[str, str]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


@pytest.fixture
def model(tmp_path) -> Path:
    return _file(tmp_path / "model.safetensors", _tensors())


def test_equal_inputs_exit_0_with_the_summary(model, tmp_path, capsys):
    assert run("convert", "--quiet", model, tmp_path / "ckpt") == 0
    capsys.readouterr()
    assert run("verify", model, tmp_path / "ckpt") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"equal: {model} and {tmp_path / 'ckpt'}, 4 tensors compared in PyTorch names"]


@pytest.mark.parametrize(
    ("damage", "lines"),
    [
        (
            lambda t: {**t, "fc.weight": np.ascontiguousarray(t["fc.weight"].T)},
            ["values  fc.weight  12 of 16 elements differ, first at [0, 1], max |Δ| "],
        ),
        (
            lambda t: {k: v for k, v in t.items() if k != "fc.bias"},
            ["missing  fc.bias  stored in A, not in B"],
        ),
        (
            lambda t: {**t, "fc.bias": t["fc.bias"].astype("float16")},
            ["dtype  fc.bias  expected float32, B stores float16; "],
        ),
    ],
)
def test_a_difference_is_one_line_and_exit_1(model, tmp_path, capsys, damage, lines):
    other = _file(tmp_path / "other.safetensors", damage(_tensors()))
    before = tree_hash(tmp_path)
    assert run("verify", model, other) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(lines) + 1
    for got, want in zip(out, lines, strict=False):
        assert got.startswith(want), out
    assert out[-1].startswith("1 difference: ")
    assert tree_hash(tmp_path) == before  # Inputs are read only.


def test_json_limit_and_dtype(model, tmp_path, capsys):
    shifted = _file(tmp_path / "shifted.safetensors", {k: v + 1 for k, v in _tensors().items()})
    assert run("verify", model, shifted, "--limit", "1") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "... and 2 more differences (--limit to show them)"
    assert run("verify", model, shifted, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["equal"] is False and [d["kind"] for d in doc["differences"]] == ["values"] * 3
    assert (
        run("convert", "--quiet", model, tmp_path / "bf16.safetensors", "--dtype", "bfloat16") == 0
    )
    capsys.readouterr()
    assert run("verify", model, tmp_path / "bf16.safetensors") == 1
    assert run("verify", model, tmp_path / "bf16.safetensors", "--dtype", "bfloat16") == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(", B cast to bfloat16")


@pytest.mark.parametrize("dst", ["ckpt", "out.safetensors"])
def test_convert_manifest_then_verify_the_output_alone(model, tmp_path, capsys, dst):
    out = tmp_path / dst
    assert run("convert", "--quiet", "--manifest", model, out) == 0
    capsys.readouterr()
    assert run("verify", out) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1].endswith("against its manifest, 3 tensors hashed")
    )


def test_a_tampered_output_fails_its_manifest(model, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    assert run("convert", "--quiet", "--manifest", model, out) == 0
    data = bytearray(out.read_bytes())
    data[-1] ^= 0x80  # The sign of the last element.
    out.write_bytes(bytes(data))
    capsys.readouterr()
    assert run("verify", out) == 1
    (line, summary) = capsys.readouterr().out.splitlines()
    assert line.startswith("hash  ") and summary.startswith("1 difference: ")


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (
            ["verify", "{model}"],
            1,
            "expected a manifest (written by `jaxshare convert --manifest`)",
        ),
        (["verify", "{tmp}/nope.safetensors", "{model}"], 1, "nope.safetensors: no such file"),
        (
            ["verify", "{model}", "--dtype", "bfloat16"],
            2,
            "a check against the manifest has one input",
        ),
        (["verify", "{model}", "{model}", "--dtype", "int8"], 2, "must be a floating dtype"),
        (
            ["convert", "--quiet", "--manifest", "{model}", "{tmp}/out.pt"],
            2,
            "--manifest is written into",
        ),
    ],
)
def test_bad_input_is_one_line(model, tmp_path, capsys, argv, status, message):
    before = tree_hash(tmp_path)
    assert run(*(a.format(model=model, tmp=tmp_path) for a in argv)) == status
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert tree_hash(tmp_path) == before


@pytest.mark.subprocess
def test_verify_needs_neither_torch_nor_jax_for_files(model, tmp_path):
    """Two files and a manifest are compared with numpy alone."""
    import subprocess
    import sys

    out = tmp_path / "out.safetensors"
    assert run("convert", "--quiet", "--manifest", model, out) == 0
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['jax'] = None\n"
        "from jaxshare.cli import main\n"
        f"sys.exit(main(['verify', {str(model)!r}, {str(out)!r}])\n"
        f"         or main(['verify', {str(out)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("against its manifest, 3 tensors hashed")
