"""``bridge.check`` and ``jaxshare check``: declared ties held against stored tensors.

Three kinds of evidence: the committed corpus of broken checkpoints
(``tests/data/check_corpus``, one per kind and per reported issue), each caught with
exactly the kinds its manifest names; a zoo of real transformers 5 directories
(``save_pretrained`` of tiny models, safetensors and ``.bin``), the committed
DeepSpeed folders and a jaxshare Orbax item, all without a finding; and what
``check`` reads (the ties' tensors, samples of the rest) and prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import bridge
from bridge import CheckReport, Finding
from jaxshare import AliasMap
from jaxshare.cli import main
from jaxshare.formats import ALIAS_MAP_KEY

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/data/check_corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


# -- the corpus: each broken fixture caught with exactly its kinds ----------------------


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_each_broken_fixture_is_caught_with_its_kinds(name):
    entry = MANIFEST[name]
    report = bridge.check(CORPUS / entry["path"])
    assert report.kinds == entry["expect"], report.lines()
    errors = [k for k in entry["expect"] if k not in ("equal-untied", "stored-twice")]
    assert report.ok == (not errors)
    for finding in report.findings:
        assert "\n" not in finding.render()
        assert finding.severity == (
            "info" if finding.kind in ("equal-untied", "stored-twice") else "error"
        )


def test_the_corpus_covers_every_kind_and_every_reported_issue():
    from bridge.commands.check import KINDS as kinds

    assert len(MANIFEST) >= 12
    found = {k for e in MANIFEST.values() for k in e["expect"]}
    assert found == set(kinds)
    issues = {e["issue"] for e in MANIFEST.values()}
    for issue in ("transformers#48154", "transformers#43429", "transformers#43880",
                  "transformers#42612", "transformers#45136", "keras-hub#3075"):  # fmt: skip
        assert issue in issues
    for entry in MANIFEST.values():  # Tiny, committed.
        files = [p for p in (CORPUS / entry["path"].split("/")[0]).rglob("*") if p.is_file()]
        assert sum(p.stat().st_size for p in files) < 64_000


HEAD = ("lm_head.weight", "model.embed_tokens.weight")


@pytest.mark.parametrize(
    ("name", "names", "figure"),
    [
        # A LoRA delta of 0.01 * B @ A: small, but not zero.
        ("llama_peft_merge_diverged", HEAD, "max |Δ| = 0.0493"),
        ("llama_stored_twice", HEAD, "1.0 KiB"),
        ("umt5_zeroed_embeddings", ("shared.weight",), "192 elements, all 0"),
        ("llama_head_missing", ("lm_head.weight",), "shape (32, 8)"),
        ("deepspeed_shared_params_other_values",
         ("transformer.h.0.attn.c_proj.weight", "transformer.h.0.mlp.c_proj.weight"),
         "shapes (8, 8) and (32, 8)"),
        ("flax_llama_unused_lm_head", HEAD, "max |Δ| = 3.3"),
        ("save_model_alias_mismatch", ("transformer.wte.weight", "lm_head.weight"),
         "max |Δ| = 3.14"),
    ],
)  # fmt: skip
def test_findings_name_the_tensors_and_give_the_figure(name, names, figure):
    (finding,) = bridge.check(CORPUS / MANIFEST[name]["path"]).findings
    assert (finding.names, finding.figure) == (names, figure)


# -- the zoo: real transformers 5 directories have no findings --------------------------


def _zoo(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    t = transformers
    small = dict(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                 decoder_ffn_dim=24, pad_token_id=0, bos_token_id=0, eos_token_id=1,
                 decoder_start_token_id=0)  # fmt: skip
    if kind == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(
            n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0,
            eos_token_id=0))  # fmt: skip
    if kind.startswith("llama"):
        return t.LlamaForCausalLM(t.LlamaConfig(
            vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
            tie_word_embeddings=kind == "llama_tied", bos_token_id=0, eos_token_id=0))  # fmt: skip
    if kind == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(
            vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=2,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))  # fmt: skip
    if kind == "bart":
        return t.BartForConditionalGeneration(t.BartConfig(max_position_embeddings=16, **small))
    if kind == "whisper":
        return t.WhisperForConditionalGeneration(t.WhisperConfig(
            num_mel_bins=8, max_source_positions=8, max_target_positions=16,
            suppress_tokens=None, begin_suppress_tokens=None, **small))  # fmt: skip
    assert kind == "bert"
    model = t.BertForMaskedLM(t.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=16, pad_token_id=0))  # fmt: skip
    with torch.no_grad():
        model.cls.predictions.bias.normal_()
    return model


ZOO = ("gpt2", "llama_tied", "llama_untied", "t5", "bart", "bert", "whisper")


@pytest.mark.parametrize("flavour", ["safetensors", "sharded", "bin"])
@pytest.mark.parametrize("kind", ZOO)
def test_real_transformers_directories_have_no_findings(kind, flavour, tmp_path):
    model = _zoo(kind).eval()
    if flavour == "safetensors":
        model.save_pretrained(tmp_path)
    elif flavour == "sharded":
        model.save_pretrained(tmp_path, max_shard_size="6KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:  # As transformers 4 wrote .bin: every name, each storage once.
        model.config.save_pretrained(tmp_path)
        torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    report = bridge.check(tmp_path)
    assert report.findings == (), report.lines()
    assert report.ok and bool(report.ties) == (kind != "llama_untied")
    assert report.lines()[-1].startswith(f"{tmp_path}: clean: ")


@pytest.mark.parametrize(
    "folder", sorted(p.name for p in (ROOT / "tests/data/deepspeed").iterdir() if p.is_dir())
)
def test_deepspeed_folders_have_no_findings(folder):
    report = bridge.check(ROOT / "tests/data/deepspeed" / folder)
    assert report.findings == () and report.ties, report.lines()
    # ZeRO-0's model states record no ``shared_params`` (None): its tie is the storage
    # the two tensors share. Every other stage records the tie.
    origin = "storage" if "_z0_" in folder else "shared_params"
    assert {o for _, o in report.ties.values()} == {origin}, report.lines()


def test_a_jaxshare_orbax_item_has_no_findings_and_its_alias_map_is_checked(tmp_path):
    import jax.numpy as jnp

    from jaxshare import checkpoint, tie

    emb = jnp.arange(12.0).reshape(3, 4)
    checkpoint.save(tmp_path / "ckpt", tie({"params": {"wte": {"embedding": emb}, "head": emb}}))
    report = bridge.check(tmp_path / "ckpt")
    assert report.findings == ()
    # (The canonical is the first path in flatten order: params/head.)
    assert dict(report.ties) == {"params/wte/embedding": ("params/head", "jaxshare_alias_map.json")}


@pytest.mark.parametrize("kind", ["gpt2", "t5", "bert"])
def test_orbax_items_converted_from_the_zoo_have_no_findings(kind, tmp_path):
    _zoo(kind).save_pretrained(tmp_path / "hf")
    bridge.convert(tmp_path / "hf", tmp_path / "ckpt")
    report = bridge.check(tmp_path / "ckpt")
    assert report.findings == () and report.ties, report.lines()
    assert all("/" not in a for a in report.ties)  # Checked in PyTorch names, by the record.


def test_the_flax_llama_head_is_caught_in_an_orbax_item_too(tmp_path):
    # The broken msgpack, converted as it is: the item keeps lm_head/kernel and config.json.
    bridge.convert(CORPUS / "flax_llama_unused_lm_head", tmp_path / "ckpt")
    (finding,) = bridge.check(tmp_path / "ckpt").findings
    assert (finding.kind, finding.names) == ("alias-differs", HEAD)
    assert "stored as lm_head/kernel" in finding.line


# -- what check reads ---------------------------------------------------------------------


def test_only_the_tied_tensors_and_samples_of_look_alikes_are_read(tmp_path):
    rng = np.random.default_rng(0)
    state = {f"layer{i}.weight": rng.standard_normal((64, 32)).astype(np.float32) for i in range(6)}
    state["wte.weight"] = rng.standard_normal((50, 32)).astype(np.float32)
    state |= {
        f"odd{i}.weight": rng.standard_normal((i + 1, 3)).astype(np.float32) for i in range(4)
    }
    save_file(state, tmp_path / "m.safetensors", metadata={"lm_head.weight": "wte.weight"})
    report = bridge.check(tmp_path / "m.safetensors")
    # The six look-alike layers differ in their samples: none is read whole.
    assert (report.findings, report.tensors_read) == ((), 1)
    assert report.bytes_read == state["wte.weight"].nbytes


def test_equal_tensors_found_by_content_but_constants_are_not(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    state = {
        "a.weight": a,
        "b.weight": a.copy(),
        "c.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "norm1.weight": np.ones(8, np.float32),
        "norm2.weight": np.ones(8, np.float32),
        "bias1": np.zeros(16, np.float32),
        "bias2": np.zeros(16, np.float32),
    }
    c = state["c.weight"].copy()
    c[3, 3] = np.nextafter(c[3, 3], np.inf)  # One ulp apart: not equal.
    state["d.weight"] = c
    save_file(state, tmp_path / "m.safetensors")
    report = bridge.check(tmp_path / "m.safetensors")
    assert [(f.kind, f.names) for f in report.findings] == [
        ("equal-untied", ("a.weight", "b.weight"))
    ]
    assert report.ok


def test_equal_untied_sees_equal_samples_with_different_tails(tmp_path):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = a.copy()
    b[1, 1] += 1.0  # Off the strided sample (every 8th row and column).
    save_file({"a.weight": a, "b.weight": b}, tmp_path / "m.safetensors")
    report = bridge.check(tmp_path / "m.safetensors")
    assert report.findings == () and report.tensors_read == 2  # Samples collided: read whole.


@pytest.mark.subprocess
def test_check_of_files_imports_no_torch():
    st_file = CORPUS / MANIFEST["save_model_alias_mismatch"]["path"]
    ds_file = CORPUS / MANIFEST["deepspeed_shared_params_other_values"]["path"]
    code = (
        "import sys, bridge\n"
        f"r = bridge.check({str(st_file)!r})\n"
        f"d = bridge.check({str(ds_file)!r})\n"
        "assert r.kinds == d.kinds == ['alias-differs'], (r.kinds, d.kinds)\n"
        f"assert bridge.check({str(ROOT / 'tests/data/deepspeed/gpt2_z2_w2_bf16')!r}).ok\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules\n"
    )  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 6),
    at=st.integers(0, 35),
    delta=st.sampled_from(["one ulp", 0.5, -3.0]),
)
def test_any_stored_alias_off_by_one_element_is_an_error(tmp_path_factory, rows, cols, at, delta):
    path = tmp_path_factory.mktemp("p") / "m.safetensors"
    emb = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + 0.25
    head = emb.copy()
    flat = head.reshape(-1)
    i = at % head.size
    # The smallest change float32 holds (a fixed tiny delta vanishes next to 32.25).
    flat[i] = np.nextafter(flat[i], np.float32(np.inf)) if delta == "one ulp" else flat[i] + delta
    save_file({"wte.weight": emb, "lm_head.weight": head}, path,
              metadata={"lm_head.weight": "wte.weight"})  # fmt: skip
    (finding,) = bridge.check(path).findings
    assert finding.kind == "alias-differs" and finding.figure.startswith("max |Δ| = ")
    want = np.abs(head.astype(np.float64) - emb).max()  # (The float32 step, not delta itself.)
    assert float(finding.figure.split("= ")[1]) == pytest.approx(want, rel=1e-2)
    save_file({"wte.weight": emb, "lm_head.weight": emb.copy()}, path,
              metadata={"lm_head.weight": "wte.weight"})  # fmt: skip
    assert bridge.check(path).kinds == ["stored-twice"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_the_difference_is_measured_in_any_dtype(dtype, tmp_path):
    from safetensors.torch import save_file as save_torch_file

    emb = torch.arange(12).reshape(4, 3).to(dtype)
    head = emb.clone()
    head[1, 2] += 2
    save_torch_file({"wte.weight": emb, "lm_head.weight": head}, tmp_path / "m.safetensors",
                    metadata={"lm_head.weight": "wte.weight"})  # fmt: skip
    (finding,) = bridge.check(tmp_path / "m.safetensors").findings
    assert (finding.kind, finding.figure) == ("alias-differs", "max |Δ| = 2")


def test_config_names_ties_of_a_file_without_its_own(tmp_path):
    model = _zoo("llama_tied")
    model.save_pretrained(tmp_path / "hf")
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1  # (save_pretrained left it out)
    save_file(state, tmp_path / "m.safetensors")
    assert bridge.check(tmp_path / "m.safetensors").findings == ()  # No declaration: no tie.
    report = bridge.check(tmp_path / "m.safetensors", config=tmp_path / "hf/config.json")
    assert report.kinds == ["alias-differs"]


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_tie_to_a_tensor_not_stored_is_reported_on_the_input_given(where, tmp_path):
    """The record names a canonical no shard stores: no reader can apply it, and the
    report names the input as given -- the directory, not its shard."""
    folder = tmp_path / "hf"
    folder.mkdir()
    metadata = {ALIAS_MAP_KEY: AliasMap({"lm_head.weight": "gone.weight"}).to_json()}
    save_file({"w": np.ones(2, np.float32)}, folder / "model.safetensors", metadata=metadata)
    path = folder / "model.safetensors" if where == "file" else folder
    report = bridge.check(path)
    assert (report.source, report.kind) == (
        (str(path), "safetensors") if where == "file" else (str(folder), "hf")
    )
    assert report.kinds == ["canonical-missing"] and not report.ok


def test_report_objects():
    f = Finding("alias-differs", "error", ("a", "b"), "max |Δ| = 1", "x ties a to b")
    r = CheckReport("p", "safetensors", (f,), {"a": ("b", "metadata")}, 2, 64)
    assert not r.ok and r.errors == (f,) and r.kinds == ["alias-differs"]
    assert r.lines() == [
        "alias-differs  a, b  max |Δ| = 1  (x ties a to b)",
        "p: 1 error(s): 1 ties checked, 2 tensors read (64 B)",
    ]
    assert json.loads(r.to_json())["findings"][0]["figure"] == "max |Δ| = 1"


# -- the command ---------------------------------------------------------------------------


def test_the_command_exits_0_when_clean_and_1_on_errors(capsys):
    assert main(["check", str(CORPUS / "llama_stored_twice")]) == 0  # An info finding only.
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("stored-twice  lm_head.weight, model.embed_tokens.weight  1.0 KiB")
    assert "clean, 1 note(s)" in out[-1]
    assert main(["check", str(CORPUS / "llama_random_lm_head")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("alias-differs  lm_head.weight")


def test_the_command_prints_json(capsys):
    assert main(["check", str(CORPUS / "umt5_zeroed_embeddings"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [f["kind"] for f in report["findings"]] == ["all-zero"]


def test_the_command_takes_a_config(tmp_path, capsys):
    model = _zoo("llama_untied")
    model.save_pretrained(tmp_path / "hf")
    state = {k: v.detach().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "m.safetensors")
    assert main(["check", str(tmp_path / "m.safetensors")]) == 0
    capsys.readouterr()
    args = ["check", str(tmp_path / "m.safetensors"), "--config", str(tmp_path / "hf/config.json")]
    assert main(args) == 1
    assert capsys.readouterr().out.startswith("head-missing  lm_head.weight  shape (48, 16)")


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["notes.txt"], 2, "notes.txt: expected an Orbax checkpoint"),
        (["missing.safetensors"], 1, "missing.safetensors: no such file or directory."),
        (["broken.safetensors"], 1, "broken.safetensors"),
    ],
)
def test_bad_input_is_one_line(args, status, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("not weights")
    Path("broken.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    assert main(["check", *args]) == status
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxshare check: ") and message in err and "\n" not in err


def test_the_path_is_positional_only_and_options_keyword_only():
    import inspect

    path, config = inspect.signature(bridge.check).parameters.values()
    assert (path.kind, config.kind) == (path.POSITIONAL_ONLY, config.KEYWORD_ONLY)
