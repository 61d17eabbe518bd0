"""``jaxshare merge BASE ADAPTER OUT`` and ``jaxshare inspect ADAPTER``: a thin shell over
``bridge.merge_lora`` and ``bridge.inspect``. A merge that unties says so in one
warning line; ``--keep-tie`` and bad input are one line, exit status 1, nothing
written and every input byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from jaxshare.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def make(tmp: Path, targets: list[str], layers: int = 2) -> tuple[Path, Path]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=60, tie_word_embeddings=True,
    )  # fmt: skip
    base = tmp / f"base{layers}"
    transformers.LlamaForCausalLM(config).save_pretrained(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(base)
        options = dict(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
        peft.get_peft_model(model, peft.LoraConfig(**options)).save_pretrained(tmp / "adapter")
    return base, tmp / "adapter"


def digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for root in paths:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # (What building the models printed.)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_merge_unties_with_one_warning_line(tmp_path: Path, capsys: Any) -> None:
    base, adapter = make(tmp_path, ["q_proj", "lm_head"])
    before = digest(base, adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # (As the command runs outside the tests.)
        code, out, err = run(
            capsys, "merge", str(base), str(adapter), str(tmp_path / "m"), "--quiet"
        )
    assert code == 0 and out == f"wrote {tmp_path / 'm'}\n"
    assert err.count("\n") == 1 and err.startswith("jaxshare merge: warning: ")
    assert "tie_word_embeddings: false" in err
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is False
    assert digest(base, adapter) == before


def test_keep_tie_refuses(tmp_path: Path, capsys: Any) -> None:
    base, adapter = make(tmp_path, ["lm_head"])
    before = digest(base, adapter)
    argv = ("merge", str(base), str(adapter), str(tmp_path / "m"), "--keep-tie", "--quiet")
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "'lm_head.weight' and 'model.embed_tokens.weight' differ (max |delta| " in err
    assert not (tmp_path / "m").exists() and digest(base, adapter) == before


def test_a_base_that_is_not_the_adapter_s(tmp_path: Path, capsys: Any) -> None:
    _, adapter = make(tmp_path, ["q_proj"], layers=3)
    small, _ = make(tmp_path / "other", ["q_proj"], layers=2)
    code, out, err = run(capsys, "merge", str(small), str(adapter), str(tmp_path / "m"))
    assert code == 1 and err.count("\n") == 1
    assert "model.layers.2.self_attn.q_proj.weight" in err and "this adapter's base" in err
    assert not (tmp_path / "m").exists()


def test_inspect_an_adapter(tmp_path: Path, capsys: Any) -> None:
    _, adapter = make(tmp_path, ["q_proj", "lm_head"])
    code, out, _ = run(capsys, "inspect", str(adapter))
    assert code == 0 and "(peft-adapter)" in out.splitlines()[0]
    assert "PEFT LoRA adapter: r=4, lora_alpha=8, scaling 2 (lora_alpha / r)" in out
    assert "tie lm_head.weight = model.embed_tokens.weight" in out
    code, out, _ = run(capsys, "inspect", str(adapter), "--json")
    assert code == 0 and any("touches: lm_head" == n for n in json.loads(out)["notes"])
