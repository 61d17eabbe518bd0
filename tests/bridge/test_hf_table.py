"""The table of transformers' model classes (``bridge/hf/table.json``) says what the
model class built on the meta device says.

For the configs of the suite's Hugging Face models (the ``transformers_flax``
fixtures' ``config.json`` and the tiny models the other tests build), with
``tie_word_embeddings`` absent, true and false, and with one layer more than the
config has: the table gives the same ties, the same layer kind for every module
that holds a tensor, and the same ``state_dict()`` order, as ``meta_model_ties``
(the old way: the class built on the meta device), or declines (a module it never
saw) and the class is built; it is never wrong. A class the table leaves out says
why, and falls back to the model class. ``JAXSHARE_HF_TABLE_ALL=1`` checks
every class of the table the same way, from its own default config (minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.hf.config import config_ties
from bridge.hf.table import load_table, table_ties, template
from bridge.layouts.rules import Rules

transformers = pytest.importorskip("transformers")
from bridge.hf.meta import _LAYER_KEYS, generation_config, meta_model_ties  # noqa: E402

TABLE = load_table()
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "transformers_flax"


def _tiny(name: str, **kw) -> dict:
    config = getattr(transformers, name)(**kw)
    return json.loads(config.to_json_string(use_diff=False))


def _configs() -> dict[str, dict]:
    out = {p.parent.name: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*/config.json"))}
    small = {"vocab_size": 64, "hidden_size": 16, "num_attention_heads": 2}
    out["llama-tiny"] = {
        **_tiny("LlamaConfig", **small, intermediate_size=32, num_hidden_layers=2),
        "architectures": ["LlamaForCausalLM"],
    }
    out["gpt2-base"] = {**_tiny("GPT2Config", n_layer=2, n_embd=16, n_head=2), "architectures": []}
    out["t5-tiny"] = {
        **_tiny("T5Config", d_model=16, d_ff=32, num_layers=2, num_heads=2, vocab_size=64),
        "architectures": ["T5ForConditionalGeneration"],
    }
    out["qwen2"] = {
        **_tiny("Qwen2Config", **small, intermediate_size=32, num_hidden_layers=2),
        "architectures": ["Qwen2ForCausalLM"],
    }
    return out


CONFIGS = _configs()


def _more_layers(config: dict) -> dict:
    return {k: v + 1 if k in _LAYER_KEYS and isinstance(v, int) else v for k, v in config.items()}


def _variants(config: dict) -> dict[str, dict]:
    base = {k: v for k, v in config.items() if k != "tie_word_embeddings"}
    return {
        "as written": config,
        "flag absent": base,
        "tied": {**base, "tie_word_embeddings": True},
        "untied": {**base, "tie_word_embeddings": False},
        "one layer more": _more_layers(config),
    }


def _agree(config: dict) -> str:
    """Asserts the table says what the meta model says of ``config``; what decided."""
    rules = Rules()
    meta = meta_model_ties(config, rules)
    if meta is None:  # A config transformers rejects (a list of per-layer kinds too short).
        return "rejected"
    ties, layers, names, _, _ = meta
    stored = [n for n in names if n not in ties]  # What save_pretrained writes.
    if not config.get("architectures"):  # The class chosen as the meta model chooses it.
        meta = meta_model_ties(config, rules, stored)
        assert meta is not None
        ties, layers, names, _, _ = meta
        stored = [n for n in names if n not in ties]
    answer = table_ties(config, stored, rules)
    if answer is None:  # Declined: the class is built instead (never a wrong answer).
        return "model class"
    got_ties, got_layers, key = answer
    assert got_ties == ties
    assert got_layers == {p: layers[p] for p in got_layers}
    assert {p.rpartition(".")[0] for p in names} <= set(got_layers)
    assert sorted(reversed(names), key=key) == list(names)
    return "table"


#: The config keys that list a kind per layer (GPT-Neo's, Qwen2's): with one layer more
#: than they list, transformers rejects the config.
PER_LAYER_KINDS = ("attention_layers", "layer_types")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_table_says_what_the_meta_model_says(name):
    config = CONFIGS[name]
    decided = {v: _agree(c) for v, c in _variants(config).items()}
    cls = (config.get("architectures") or ["GPT2LMHeadModel"])[0]
    if cls in TABLE["models"].get(config["model_type"], {}):
        want = dict.fromkeys(decided, "table")
        if any(k in config for k in PER_LAYER_KINDS):  # One layer more: the list is short.
            want["one layer more"] = "rejected"
        assert decided == want
    else:  # Left out, with the reason why.
        assert set(decided.values()) == {"model class"}
        assert TABLE["excluded"][config["model_type"]][cls], cls


#: Every (model type, class) of the table, checked only with JAXSHARE_HF_TABLE_ALL=1
#: (about two minutes); otherwise no case at all, rather than ~500 skipped ones.
ENTRIES = sorted((t, c) for t, classes in (TABLE or {}).get("models", {}).items() for c in classes)
ALL = bool(os.environ.get("JAXSHARE_HF_TABLE_ALL"))


@pytest.mark.skipif(not ALL, reason="JAXSHARE_HF_TABLE_ALL=1 checks every class (minutes)")
@pytest.mark.parametrize("model_type, cls", ENTRIES if ALL else ENTRIES[:1])
def test_every_class_of_the_table(model_type, cls):
    for small in (True, False):  # as the table was made: few layers, else the default's
        config = {**generation_config(model_type, small=small), "architectures": [cls]}
        if _agree(config) != "rejected":
            break
    decided = {v: _agree(c) for v, c in _variants(config).items()}
    assert decided.pop("as written") == "table"
    # A flag or one layer more may switch on a module the entry never saw (DeepSeek's
    # first MoE layer): the table declines and the class decides.
    assert set(decided.values()) <= {"table", "rejected", "model class"}


def test_the_table_is_of_the_installed_transformers():
    assert TABLE is not None, "bridge/hf/table.json is missing: run `make hf-table`"
    assert TABLE["transformers"] == transformers.__version__, "run `make hf-table`"
    assert len(ENTRIES) >= 300


def test_a_config_the_table_never_saw_builds_the_model_class():
    config = {**CONFIGS["gpt2"], "add_cross_attention": True}
    meta = meta_model_ties(config, Rules())
    assert meta is not None
    stored = [n for n in meta[2] if n not in meta[0]]
    assert any("crossattention" in n for n in stored)
    assert table_ties(config, stored, Rules()) is None  # a module it has no entry for
    found = config_ties(config, stored, Rules(), need_model=False)
    assert found.exact and not found.tabulated
    assert found.layers["transformer.h.0.crossattention.c_attn"] == "conv1d"


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "llama"},  # a class of another model type
        {"architectures": ["NoSuchModel"]},
        {"tie_encoder_decoder": True},
        {"tie_word_embeddings": "yes"},
    ],
)
def test_what_the_table_does_not_answer(change):
    stored = ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"]
    assert table_ties({**CONFIGS["gpt2"], **change}, stored, Rules()) is None


def test_templates_serve_any_number_of_layers():
    entry = TABLE["models"]["gpt2"]["GPT2LMHeadModel"]
    assert template("transformer.h.40.mlp.c_fc.weight") in entry["names"]
    ties, layers, _ = table_ties(
        CONFIGS["gpt2"], ["transformer.wte.weight", "transformer.h.40.mlp.c_fc.weight"], Rules()
    )
    assert ties == {"lm_head.weight": "transformer.wte.weight"}
    assert layers["transformer.h.40.mlp.c_fc"] == "conv1d"


@pytest.mark.subprocess
def test_inspecting_a_directory_imports_neither_transformers_nor_torch(tmp_path, run_python):
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIGS["gpt2"]))
    model.save_pretrained(tmp_path / "gpt2")
    code = (
        "import sys, bridge\n"
        "report = bridge.inspect(sys.argv[1])\n"
        "print(dict(report.alias_map), 'transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    run = run_python(code, tmp_path / "gpt2")
    assert run.stdout.split("\n")[0] == "{'lm_head.weight': 'transformer.wte.weight'} False False"


@pytest.mark.subprocess
def test_an_item_to_a_directory_names_its_ties_from_the_table(tmp_path, run_python):
    """An item whose naming record names every tensor (a scanned Llama's, stacked) goes
    to a Hugging Face directory without the meta model, and loads in transformers."""
    config = transformers.LlamaConfig(**{**CONFIGS["llama"], "tie_word_embeddings": True})
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "hf")
    cli = [sys.executable, "-m", "jaxshare.cli", "convert"]
    item = tmp_path / "item"
    subprocess.run([*cli, str(tmp_path / "hf"), str(item), "--stack", "model.layers", "--quiet"],
                   check=True, capture_output=True)  # fmt: skip
    code = (
        "import sys, bridge\n"
        "bridge.convert(sys.argv[1], sys.argv[2], format='hf')\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    run = run_python(code, item, tmp_path / "back")
    assert run.stdout.split("\n")[0] == "False False"
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back")
    assert back.lm_head.weight is back.model.embed_tokens.weight
    for name, tensor in model.state_dict().items():
        assert (back.state_dict()[name] == tensor).all(), name
