"""``jaxshare inspect`` and ``jaxshare convert`` on PyTorch files."""

import json
import os
import pickle

import pytest
import torch
from torch import nn

from bridge import load_safetensors, load_torch, save_safetensors
from jaxshare import AliasMap, checkpoint
from jaxshare.cli import main


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(10, 4)
        self.ln = nn.LayerNorm(4)
        self.bn = nn.BatchNorm1d(4)
        self.lm_head = nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.wte.weight


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TiedLM().to(torch.bfloat16)


@pytest.fixture(params=[".pt", ".bin", ".safetensors"])
def weights(request, tmp_path, model):
    path = tmp_path / f"model{request.param}"
    if request.param == ".safetensors":
        save_safetensors(model.state_dict(), path)
    else:
        torch.save(model.state_dict(), path)
    return path


def test_inspect_a_weights_file(weights, capsys):
    assert main(["inspect", str(weights)]) == 0
    out = capsys.readouterr().out
    origin = "metadata" if weights.suffix == ".safetensors" else "storage"
    assert f"wte.weight  lm_head.weight  {origin}  (10, 4)  bfloat16" in out
    assert main(["inspect", "--json", str(weights)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tie_groups"][0]["canonical"] == "wte.weight"
    assert report["bytes_saved"] == 10 * 4 * 2


@pytest.mark.parametrize("back", [".safetensors", ".pt"])
def test_convert_to_orbax_and_back_keeps_every_tie(weights, tmp_path, model, back, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--quiet", str(weights), str(ckpt)]) == 0
    assert checkpoint.read_alias_map(ckpt) == AliasMap(
        {"params/lm_head/kernel": "params/wte/embedding"},
        transforms={"params/lm_head/kernel": (1, 0)},
    )
    restored = checkpoint.restore(ckpt)
    assert str(restored["params"]["wte"]["embedding"].dtype) == "bfloat16"
    out = tmp_path / f"back{back}"
    names = ["--names", "torch"] if back == ".safetensors" else []
    assert main(["convert", "--quiet", str(ckpt), str(out), *names]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    state = load_safetensors(out) if back == ".safetensors" else load_torch(out)
    assert state["lm_head.weight"] is state["wte.weight"]
    fresh = TiedLM().to(torch.bfloat16)
    fresh.load_state_dict(state, strict=True)
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor) and state[key].dtype == tensor.dtype, key


def test_convert_casts_with_dtype_and_shows_progress(tmp_path, model, capsys):
    src = tmp_path / "model.pt"
    torch.save(model.state_dict(), src)
    assert main(["convert", str(src), str(tmp_path / "ckpt"), "--dtype", "float32"]) == 0
    err = capsys.readouterr().err
    assert "8 tensors" in err  # The progress summary (stderr is no terminal).
    out = tmp_path / "back.pt"
    assert (
        main(["convert", str(tmp_path / "ckpt"), str(out), "--dtype", "bfloat16", "--quiet"]) == 0
    )
    state = load_torch(out)
    assert state["wte.weight"].dtype == torch.bfloat16
    assert state["bn.num_batches_tracked"].dtype == torch.int64  # integers are not cast
    assert torch.equal(state["wte.weight"], model.wte.weight)  # bf16 -> f32 -> bf16 is exact


def test_convert_refuses_to_overwrite_without_force(weights, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--quiet", str(weights), str(ckpt)]) == 0
    assert main(["convert", "--quiet", str(weights), str(ckpt)]) == 1
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main(["convert", "--quiet", "--force", str(weights), str(ckpt)]) == 0


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_convert_refuses_a_hostile_pickle(tmp_path, capsys):
    src = tmp_path / "evil.bin"
    with open(src, "wb") as f:
        pickle.dump({"w": _RunsCode()}, f, protocol=2)
    assert main(["convert", "--quiet", str(src), str(tmp_path / "ckpt")]) == 1
    captured = capsys.readouterr()
    assert "evil.bin: refused" in captured.err and "pwned" not in captured.out
    assert not (tmp_path / "ckpt").exists()


def test_convert_names_a_bad_dtype(weights, tmp_path, capsys):
    assert main(["convert", "--quiet", str(weights), str(tmp_path / "c"), "--dtype", "int8"]) == 1
    assert "`dtype` must be a floating dtype" in capsys.readouterr().err


def test_inspect_of_a_consolidated_file_counts_written_out_aliases(tmp_path, capsys):
    import jax.numpy as jnp

    emb = jnp.ones((8, 4))
    checkpoint.save(tmp_path / "ckpt", {"wte": emb, "head": emb})
    checkpoint.consolidate_to_safetensors(tmp_path / "ckpt", tmp_path / "full.safetensors")
    assert main(["inspect", str(tmp_path / "full.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "(written out)" in out and "saved by dedupe: 0 B" in out
