"""``inspect`` of a PEFT adapter directory: recognised as an adapter (not as a
safetensors file whose names fit no model), with its rank, alpha, scaling, target
modules, the modules it touches per layer, modules_to_save, base model, and which
side of each of its base's ties it changes.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import bridge  # noqa: E402

LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
)


def adapter_of(tmp: Path, tied: bool, **options: Any) -> Path:
    """A base saved at ``tmp/base`` and PEFT's adapter of it (loaded from there, so
    PEFT records it as ``base_model_name_or_path``) at ``tmp/adapter``."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA, tie_word_embeddings=tied)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp / "base")
        options = {"r": 4, "lora_alpha": 8, "init_lora_weights": False, **options}
        peft.get_peft_model(model, peft.LoraConfig(**options)).save_pretrained(tmp / "adapter")
    return tmp / "adapter"


def test_an_adapter_on_the_tied_head(tmp_path: Path) -> None:
    path = adapter_of(tmp_path, True, target_modules=["q_proj", "v_proj", "lm_head"])
    report = bridge.inspect(path)
    assert report.kind == "peft-adapter"
    notes = report.notes
    assert notes[0] == "PEFT LoRA adapter: r=4, lora_alpha=8, scaling 2 (lora_alpha / r)"
    assert "target modules: lm_head, q_proj, v_proj" in notes
    assert "touches in model.layers.{0-1}: self_attn.q_proj, self_attn.v_proj" in notes
    assert "touches: lm_head" in notes
    assert f"base model: {tmp_path / 'base'}" in notes
    ties = [n for n in notes if n.startswith("tie ")]
    assert ties == [
        # (PEFT saves the head's base weight beside its adapter: "replaced", by itself.)
        "tie lm_head.weight = model.embed_tokens.weight: the adapter changes lm_head.weight "
        "(replaced + LoRA) but not model.embed_tokens.weight; merged, they differ: "
        "`jaxshare merge` unties them (tie_word_embeddings: false), --keep-tie refuses"
    ]
    # A and B of 2 x 2 attention modules and of the head, and the head's base weight.
    assert len(report.stored) == 2 * 5 + 1
    assert report.source == str(path)


def test_the_base_from_config(tmp_path: Path) -> None:
    path = adapter_of(tmp_path, True, target_modules=["q_proj"], modules_to_save=["lm_head"])
    doc = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**doc, "base_model_name_or_path": None}))
    unknown = bridge.inspect(path).notes
    assert unknown[-1].startswith("ties of the base: unknown")
    assert "base model: not recorded" in unknown
    notes = bridge.inspect(path, config=tmp_path / "base").notes
    assert "modules_to_save: lm_head" in notes
    assert any(n.startswith("whole tensors it carries") and "lm_head.weight" in n for n in notes)
    assert notes[-1].startswith(
        "tie lm_head.weight = model.embed_tokens.weight: the adapter changes lm_head.weight "
        "(replaced) but not model.embed_tokens.weight"
    )


def test_untied_base_rslora_patterns(tmp_path: Path) -> None:
    path = adapter_of(
        tmp_path,
        False,
        target_modules=r".*\.(q|v)_proj",
        use_rslora=True,
        lora_alpha=16,
        rank_pattern={"layers.1.self_attn.v_proj": 2},
    )
    notes = bridge.inspect(path).notes
    assert (
        notes[0]
        == "PEFT LoRA adapter: r=4, lora_alpha=16, scaling 8 (lora_alpha / sqrt(r), rsLoRA)"
    )
    assert "target modules (regex): .*\\.(q|v)_proj" in notes
    assert "scalings by module: 8, 11.3137" in notes
    assert "ties of the base: none" in notes


def test_the_weights_file_alone_is_still_a_safetensors_file(tmp_path: Path) -> None:
    path = adapter_of(tmp_path, False, target_modules=["q_proj"])
    assert bridge.inspect(path / "adapter_model.safetensors").kind == "safetensors"


@pytest.mark.parametrize("command", ["convert", "check", "verify"])
def test_an_adapter_where_a_model_is_expected_is_one_line_naming_it(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``convert``, ``check`` and ``verify`` read models: an adapter directory given to
    them is named as one, with the routes that take it, in one line; nothing written."""
    from jaxshare.cli import main

    path = adapter_of(tmp_path, False, target_modules=["q_proj"])
    out = tmp_path / "out.safetensors"
    args = {"convert": [str(path), str(out)], "check": [str(path)]}
    args["verify"] = [str(path), str(tmp_path / "base")]
    capsys.readouterr()  # (Making the adapter printed transformers' progress.)
    assert main([command, *args[command]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{path}: expected" in err
    assert "found a PEFT adapter directory, not a model: merge it" in err
    assert not out.exists()
