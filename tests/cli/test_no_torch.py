"""Torch only where torch is. With torch absent (``sys.modules["torch"] = None`` makes any
import of it fail, as if it were not installed): ``import bridge`` and every torch-free name
work; ``jaxshare --help``, ``inspect`` of every kind of file, a DeepSpeed folder to
safetensors, a Hugging Face safetensors directory to an Orbax item, and an Orbax item to
safetensors in PyTorch names all run; a name or an output that needs torch says so in one
line. A DeepSpeed folder to safetensors imports no JAX either."""

from __future__ import annotations

import json
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
    "print('jax imported:', 'jax' in sys.modules)\n"
    "sys.exit(status)\n"
)


def _run(*argv: str) -> subprocess.CompletedProcess:
    """``jaxshare ARGV`` in a fresh process where torch cannot be imported; its stdout
    ends with whether it imported JAX."""
    return subprocess.run(
        [sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=300
    )


@pytest.mark.subprocess
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


@pytest.mark.subprocess
@pytest.mark.parametrize(("kind", "stored"), [("safetensors", 2), ("orbax", 1)])
def test_inspect_runs_without_torch(tmp_path, kind, stored):
    """Two arrays either way: the file's two distinct tensors, both stored; the item's
    two leaves, one array object, so ``save`` stored it once (the tie)."""
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    if kind == "safetensors":
        path = tmp_path / "model.safetensors"
        save_file({"wte.weight": emb, "h.0.bias": np.ones(4, np.float32)}, path)
    else:
        path = tmp_path / "item"
        checkpoint.save(path, {"wte": emb, "head": emb})
    done = _run("inspect", str(path))
    assert done.returncode == 0, done.stderr
    heading = done.stdout.splitlines()[0]
    assert heading == f"{path} ({kind}): 2 arrays, {stored} stored", done.stdout


TORCH_FREE = sorted(
    {"FORMATS", "NAMES", "DEFAULT_LAYERS", "DEFAULT_LAYER_NAMES", "DEFAULT_RULES", "Rule", "Rules"}
    | {
        "FlaxPlacement",
        "TorchNaming",
        "HFDirectory",
        "convert",
        "inspect",
        "open_source",
        "save_hf",
    }
    | {"flax_alias_map", "flax_plan", "to_flax", "torch_alias_map", "torch_plan"}
    | {"LAYOUTS", "Layout", "detect_layout"}
    | {"VerifyFinding", "VerifyReport", "verify"}
    | {"CheckReport", "Finding", "check"}
    | {"optax_for", "to_optax"}
    | {"Adapter", "LoraConfig", "merge_lora", "read_adapter", "save_adapter"}
    | {"adapter_from_flax", "adapter_to_flax", "qwix_rules", "read_tunix_lora"}
)


@pytest.mark.subprocess
def test_import_bridge_and_every_torch_free_name_need_no_torch():
    """The bridge imports without torch; each torch-free name imports too, and each name that
    hands out torch tensors says in one line which extra installs torch."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import bridge\n"
        f"free = {TORCH_FREE!r}\n"
        "for name in free: getattr(bridge, name)\n"
        "for name in sorted(set(bridge.__all__) - set(free)):\n"
        "    try:\n        getattr(bridge, name)\n"
        "    except ModuleNotFoundError as e:\n        print(name, '|', e)\n"
        "    else:\n        print(name, '| imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" | ") for line in done.stdout.splitlines())
    assert set(lines) == {
        "DeepSpeedCheckpoint", "load_deepspeed", "load_safetensors", "save_safetensors",
        "load_torch", "save_torch", "shared_params", "to_torch",
        "from_optax",
    }  # fmt: skip
    for name, message in lines.items():
        assert message == (
            f"`bridge.{name}` needs torch, which is not installed; install it with "
            "`pip install 'jaxshare[torch]'`."
        ), name


@pytest.mark.subprocess
def test_an_orbax_item_in_torch_names_needs_no_torch(tmp_path):
    """Naming an Orbax item's arrays in PyTorch reads metadata only."""
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    kernel = np.arange(12, dtype=np.float32).reshape(4, 3)
    checkpoint.save(
        tmp_path / "item", {"params": {"wte": {"embedding": emb}, "fc": {"kernel": kernel}}}
    )
    out = tmp_path / "out.safetensors"
    done = _run("convert", str(tmp_path / "item"), str(out), "--names", "torch", "--quiet")
    assert done.returncode == 0, done.stderr
    from safetensors.numpy import load_file

    written = load_file(out)
    assert sorted(written) == ["fc.weight", "wte.weight"]
    np.testing.assert_array_equal(written["wte.weight"], emb)
    np.testing.assert_array_equal(written["fc.weight"], kernel.T)


@pytest.mark.subprocess
def test_a_safetensors_file_in_torch_names_converts_to_orbax_without_torch(tmp_path):
    path = tmp_path / "model.safetensors"
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    save_file({"wte.weight": emb, "fc.weight": np.ones((3, 4), np.float32)}, path)
    done = _run("convert", str(path), str(tmp_path / "ckpt"), "--quiet")
    assert done.returncode == 0, done.stderr
    flat = checkpoint.consolidate(tmp_path / "ckpt")
    np.testing.assert_array_equal(flat["params/wte/embedding"], emb)
    assert flat["params/fc/kernel"].shape == (4, 3)


@pytest.mark.subprocess
def test_a_hugging_face_safetensors_directory_converts_to_orbax_without_torch(tmp_path):
    """The config's tie (the head ``save_pretrained`` left out) comes from jaxshare's table,
    since transformers cannot build the model class without torch."""
    hf = tmp_path / "gpt2"
    hf.mkdir()
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 4}
    (hf / "config.json").write_text(json.dumps(config))
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    save_file(
        {"transformer.wte.weight": emb, "transformer.ln_f.weight": np.ones(4, np.float32)},
        hf / "model.safetensors",
        metadata={"format": "pt"},
    )
    done = _run("convert", str(hf), str(tmp_path / "ckpt"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert dict(checkpoint.read_alias_map(tmp_path / "ckpt")) == {
        "params/lm_head/kernel": "params/transformer/wte/embedding"
    }
    restored = checkpoint.restore(tmp_path / "ckpt")
    np.testing.assert_array_equal(restored["params"]["lm_head"]["kernel"], emb.T)


@pytest.mark.subprocess
def test_a_pytorch_file_is_read_without_torch_and_a_pytorch_output_says_it_needs_torch(tmp_path):
    import torch

    w = torch.arange(6.0).reshape(2, 3)
    torch.save({"wte.weight": w, "lm_head.weight": w}, tmp_path / "model.pt")
    done = _run("inspect", str(tmp_path / "model.pt"))
    assert done.returncode == 0, done.stderr
    assert "lm_head.weight" in done.stdout and "storage" in done.stdout
    done = _run("convert", str(tmp_path / "model.pt"), str(tmp_path / "out.safetensors"), "--quiet")
    assert done.returncode == 0, done.stderr
    done = _run("convert", str(tmp_path / "out.safetensors"), str(tmp_path / "o.pt"), "--quiet")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "needs torch, which is not installed" in lines[0], lines
    assert "pip install 'jaxshare[torch]'" in lines[0]
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_a_deepspeed_folder_needs_neither_torch_nor_jax(repo_root, tmp_path, command):
    """Inspecting a DeepSpeed folder, or converting it to safetensors, needs no torch and
    pays for neither torch's nor JAX's import (a second or more each)."""
    folder = repo_root / "tests/data/deepspeed/gpt2_z3_w2_fp32"
    out = tmp_path / "out.safetensors"
    argv = ["convert", str(folder), str(out), "--quiet"] if command == "convert" else [
        "inspect", str(folder)]  # fmt: skip
    done = _run(*argv)
    assert done.returncode == 0, done.stderr
    assert "jax imported: False" in done.stdout
    if command == "convert":
        with safe_open(out, "np") as f:
            assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()
    else:
        assert "lm_head.weight" in done.stdout  # the tie, from shared_params
