"""What commands import: ``jaxshare --help`` and ``inspect`` of safetensors files and Orbax
items run with torch absent (``sys.modules["torch"] = None`` makes any import of it fail);
naming an Orbax item in PyTorch, or placing a safetensors file's PyTorch names in Flax,
imports no torch, and a DeepSpeed folder to safetensors neither torch nor JAX."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxshare import checkpoint

RUN = (
    "import sys; sys.modules['torch'] = None\n"
    "from jaxshare.cli import main\n"
    "status = main(sys.argv[1:])\n"
    "assert sys.modules['torch'] is None, 'torch was replaced'\n"
    "print('bridge imported:', 'bridge' in sys.modules)\n"
    "sys.exit(status)\n"
)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=300
    )


def _imports(modules: tuple[str, ...], *argv: str) -> tuple[subprocess.CompletedProcess, str]:
    """Runs ``jaxshare ARGV`` in a fresh process (torch installed); returns the run and
    which of ``modules`` it imported, as a printed sorted list."""
    code = (
        "import sys\nfrom jaxshare.cli import main\n"
        "status = main(sys.argv[2:])\n"
        "print('imported:', sorted(m for m in sys.argv[1].split(',') if m in sys.modules))\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, ",".join(modules), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    imported = next((line for line in done.stdout.splitlines() if line.startswith("imported:")), "")
    return done, imported


def test_help_needs_neither_torch_nor_jax():
    helped = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['torch'] = None\n"
            "from jaxshare.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    code = e.code\n"
            "print('jax imported:', 'jax' in sys.modules); sys.exit(code)\n",
        ],
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0, helped.stderr
    assert "inspect" in helped.stdout and "convert" in helped.stdout
    assert "jax imported: False" in helped.stdout


@pytest.mark.parametrize("kind", ["safetensors", "orbax"])
def test_inspect_runs_without_torch(tmp_path, kind):
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    if kind == "safetensors":
        path = tmp_path / "model.safetensors"
        save_file({"wte.weight": emb, "h.0.bias": np.ones(4, np.float32)}, path)
    else:
        path = tmp_path / "item"
        checkpoint.save(path, {"wte": emb, "head": emb})
    done = _run("inspect", str(path))
    assert done.returncode == 0, done.stderr
    assert "bridge imported: False" in done.stdout
    assert "2 arrays" in done.stdout or "3 arrays" in done.stdout


def test_torch_names_of_an_orbax_item_need_no_torch(tmp_path):
    """Naming an Orbax item's arrays in PyTorch reads metadata only: torch is not imported."""
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    kernel = np.arange(12, dtype=np.float32).reshape(4, 3)
    checkpoint.save(
        tmp_path / "item", {"params": {"wte": {"embedding": emb}, "fc": {"kernel": kernel}}}
    )
    out = tmp_path / "out.safetensors"
    done, imported = _imports(("torch",), "convert", str(tmp_path / "item"), str(out),
                              "--names", "torch")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert imported == "imported: []"
    from safetensors.numpy import load_file

    written = load_file(out)
    assert sorted(written) == ["fc.weight", "wte.weight"]
    np.testing.assert_array_equal(written["wte.weight"], emb)
    np.testing.assert_array_equal(written["fc.weight"], kernel.T)


def test_a_safetensors_file_in_torch_names_converts_to_orbax_without_torch(tmp_path):
    path = tmp_path / "model.safetensors"
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    save_file({"wte.weight": emb, "fc.weight": np.ones((3, 4), np.float32)}, path)
    done, imported = _imports(("torch",), "convert", str(path), str(tmp_path / "ckpt"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert imported == "imported: []"
    flat = checkpoint.consolidate(tmp_path / "ckpt")
    np.testing.assert_array_equal(flat["params/wte/embedding"], emb)
    assert flat["params/fc/kernel"].shape == (4, 3)


def test_pytorch_input_without_torch_is_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"not read: the bridge's door refuses first")
    done = _run("inspect", str(path))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "torch is not installed" in lines[0] and "pip install 'jaxshare[torch]'" in lines[0]


@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_a_deepspeed_folder_needs_neither_torch_nor_jax(repo_root, tmp_path, command):
    """Inspecting a DeepSpeed folder, or converting it to safetensors, pays for
    neither torch's nor JAX's import (a second or more each)."""
    folder = repo_root / "tests/data/deepspeed/gpt2_z3_w2_fp32"
    out = tmp_path / "out.safetensors"
    argv = ["convert", str(folder), str(out), "--quiet"] if command == "convert" else [
        "inspect", str(folder)]  # fmt: skip
    done, imported = _imports(("torch", "jax"), *argv)
    assert done.returncode == 0, done.stderr
    assert imported == "imported: []"
    if command == "convert":
        with safe_open(out, "np") as f:
            assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()
    else:
        assert "lm_head.weight" in done.stdout  # the tie, from shared_params
