"""``jaxshare inspect`` and ``jaxshare convert`` on Hugging Face directories.

Tiny GPT-2 and T5 models built in code, saved by transformers 5's
``save_pretrained``; every route must load back in ``from_pretrained`` with no
missing or unexpected keys and the original's logits; bad input gets one line,
exit status 1, and leaves every input byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from jaxshare.cli import main

transformers = pytest.importorskip("transformers")

DEEPSPEED = Path(__file__).resolve().parents[1] / "data" / "deepspeed"


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 7, 3, 2, 9]])
    with torch.no_grad():
        if model.config.model_type == "t5":
            return model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {kind: build(kind) for kind in ("gpt2", "t5")}


@pytest.fixture(scope="module")
def hf(models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind, model in models.items():
        model.save_pretrained(root / kind, max_shard_size="6KB")
        out[kind] = root / kind
    return out


def tree_hash(path: Path) -> dict[str, str]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def run(*argv: str) -> int:
    return main([str(a) for a in argv])


def assert_loads(path: Path, original: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
    cls = type(original)
    loaded, info = cls.from_pretrained(path, output_loading_info=True)
    assert not {k: v for k, v in info.items() if v}, info
    expected = original if dtype is None else build(original.config.model_type).to(dtype)
    assert loaded.dtype == (dtype or torch.float32)
    assert torch.equal(logits(loaded), logits(expected))


def test_inspect_shows_every_shard_and_where_ties_come_from(hf, capsys):
    assert run("inspect", hf["t5"]) == 0
    out = capsys.readouterr().out
    shards = sorted(p.name for p in hf["t5"].glob("model-*.safetensors"))
    assert len(shards) > 1
    for shard in shards:
        assert f"  {shard}: " in out
    assert "model.safetensors.index.json" in out
    assert "config.json: T5ForConditionalGeneration" in out
    line = next(line for line in out.splitlines() if line.startswith("shared.weight"))
    assert "decoder.embed_tokens.weight, encoder.embed_tokens.weight, lm_head.weight" in line
    assert "config.json" in line
    assert run("inspect", "--json", hf["t5"] / "model.safetensors.index.json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "hf"
    (group,) = report["tie_groups"]
    assert group["origins"] == ["config.json"]
    assert report["bytes_saved"] == 3 * 40 * 16 * 4


@pytest.mark.parametrize("kind", ["gpt2", "t5"])
def test_to_orbax_and_back(hf, models, kind, tmp_path, capsys):
    before = tree_hash(hf[kind])
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    assert run("convert", "--quiet", hf[kind], ckpt) == 0
    config = hf[kind] / "config.json"
    assert run("convert", ckpt, out, "--config", config, "--max-shard-size", "5KB") == 0
    err = capsys.readouterr().err
    assert " tensors, " in err and "/s)" in err  # Progress: tensors and bytes per second.
    assert len(list(out.glob("model-*.safetensors"))) > 1
    assert (out / "config.json").read_bytes() == config.read_bytes()
    assert_loads(out, models[kind])
    assert tree_hash(hf[kind]) == before


def test_a_plain_orbax_checkpoint_is_named_after_the_config(hf, models, tmp_path, capsys):
    import bridge
    from jaxshare import checkpoint

    variables, _ = bridge.to_flax(hf["gpt2"])
    checkpoint.save(tmp_path / "plain", variables)  # No naming record.
    out = tmp_path / "out"
    with warnings.catch_warnings():  # (The command shows each warning as one line.)
        warnings.simplefilter("always")
        assert run("convert", "--quiet", tmp_path / "plain", out, "--config", hf["gpt2"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("jaxshare convert: warning: ") and "'lm_head.weight' (from" in line
    assert "is left out: config.json ties it to 'transformer.wte.weight'" in line
    assert_loads(out, models["gpt2"])


def test_through_a_safetensors_file(hf, models, tmp_path):
    file, out = tmp_path / "w.safetensors", tmp_path / "out"
    assert run("convert", "--quiet", hf["gpt2"], file) == 0
    assert run("convert", "--quiet", file, out, "--config", hf["gpt2"] / "config.json") == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert_loads(out, models["gpt2"])


def test_reshard_and_cast(hf, models, tmp_path):
    out = tmp_path / "out"
    argv = ("convert", "--quiet", hf["t5"], out, "--max-shard-size", "2KB", "--dtype", "bfloat16")
    assert run(*argv) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert len(list(out.glob("model-*.safetensors"))) > len(list(hf["t5"].glob("model-*")))
    assert_loads(out, models["t5"], torch.bfloat16)
    again = tmp_path / "again"
    assert run("convert", "--quiet", "--format", "hf", out, again) == 0
    assert_loads(again, models["t5"], torch.bfloat16)


def test_deepspeed_folder_to_a_directory(tmp_path):
    src = DEEPSPEED / "t5_z2_w2_fp32"
    before = tree_hash(src)
    config = transformers.T5Config(
        vocab_size=31, d_model=9, d_kv=3, d_ff=11, num_layers=1, num_heads=3,
        decoder_start_token_id=0, tie_word_embeddings=True,
        architectures=["T5ForConditionalGeneration"],
    )  # fmt: skip
    config.save_pretrained(tmp_path / "config")
    out = tmp_path / "out"
    assert run("convert", "--quiet", src, out, "--config", tmp_path / "config/config.json") == 0
    model, info = transformers.T5ForConditionalGeneration.from_pretrained(
        out, output_loading_info=True
    )
    assert not {k: v for k, v in info.items() if v}, info
    reference = torch.load(src / "reference.pt", weights_only=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name
    assert tree_hash(src) == before


def test_an_output_needs_a_config(hf, tmp_path, capsys):
    ckpt, file = tmp_path / "ckpt", tmp_path / "w.safetensors"
    assert run("convert", "--quiet", hf["gpt2"], file) == 0
    assert run("convert", "--quiet", file, ckpt) == 0  # A weights file: no config.json kept.
    assert run("convert", "--quiet", "--format", "hf", ckpt, tmp_path / "out") == 2
    assert "needs a config.json: pass --config" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_tie_that_cannot_be_named_is_one_warning_line(hf, tmp_path, capsys):
    import warnings

    import bridge

    path = tmp_path / "dir"
    shutil.copytree(hf["gpt2"], path)
    for shard in path.glob("model*"):
        shard.unlink()
    state = build("gpt2").state_dict()
    del state["transformer.wte.weight"], state["lm_head.weight"]
    bridge.save_safetensors(state, path / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        assert run("inspect", path) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("jaxshare inspect: warning: ") and "hold none of them" in err


def _break(path: Path, how: str) -> tuple[Path, str]:
    index = path / "model.safetensors.index.json"
    first = sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    if how == "shard alone":
        return path / first, "one shard of the"
    if how == "missing shard":
        (path / first).unlink()
        return path, "does not hold; the directory is incomplete"
    index.write_text("{not json")
    return path, "the Hugging Face index is not JSON"


@pytest.mark.parametrize("how", ["shard alone", "missing shard", "corrupt index"])
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_bad_input_gets_one_line(hf, tmp_path, capsys, how, command):
    path = tmp_path / "broken"
    shutil.copytree(hf["gpt2"], path)
    target, message = _break(path, how)
    before = tree_hash(path)
    out = tmp_path / "out"
    argv = ["inspect", target] if command == "inspect" else ["convert", "--quiet", target, out]
    assert run(*argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith(f"jaxshare {command}: error: {target}")
    assert tree_hash(path) == before
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]
