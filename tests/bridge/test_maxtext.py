"""MaxText's layout of Llama, Mistral, Gemma and the mixtures of experts Mixtral and
Qwen3-MoE (``bridge/layouts/maxtext.py``), against items converted by MaxText's own scripts.

The fixtures (``tests/data/maxtext/<id>/``, made by ``make_fixture.py``) hold each tiny
model's Hugging Face directory, its logits on fixed ids, and its weights converted to
MaxText's layout by a line-by-line restatement of the MaxText script for that model
(not by the code under test), written by plain Orbax as MaxText's converters write a
``TrainState`` at ``0/items``. Checked here:

- the item converts to a directory transformers 5 loads with no missing or unexpected
  keys, the original model's logits (max |Δ| at most 1e-5) and its tie; its tensors are
  the original's bit for bit wherever the mapping is exact;
- the directory converts to the very tree the script wrote, bit for bit, through
  ``write_item`` and a plain Orbax restore, and back;
- a stacked leaf is read one layer's slice at a time, and written one layer at a time;
  an expert weight (experts and layers on two axes of one array) one expert of one
  layer at a time; Mixtral's is bfloat16 (``to_maxtext.py``'s default), kept both ways;
- a bad item or config is one line naming the leaf (a wrong number of experts too).

Exact, and where not: with ``head_dim`` 16 the query's ``1/sqrt(head_dim)`` is a power of
two, so Llama's and Gemma's queries come back bit for bit; Mistral's ``head_dim`` is 8,
and dividing by ``sqrt(8)`` then multiplying by it rounds (1690 of its 12288 query
weights come back 1 ulp off); Gemma's norms are ``weight + 1`` in MaxText, and
``(w + 1) - 1`` rounds too (409 of 448 off, by at most ``2**-24``). The mixtures of
experts come back bit for bit (Mixtral's ``head_dim`` is 16; Qwen3-MoE's mapping has
no value op).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

import bridge
from bridge.layouts.maxtext import MAXTEXT_FAMILIES, MaxTextToTorch, TorchToMaxText, torch_shapes
from jaxshare import checkpoint
from jaxshare.internal import Index
from jaxshare.stream import ArrayInfo, Plan, TensorSource

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "maxtext"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
IDS = sorted(MANIFEST)
TOLERANCE = 1e-5  # max |Δ| between the logits of the directory written and the original's

#: Tensors whose round trip through MaxText's layout rounds, by id: (name part, why).
INEXACT = {
    "mistral": ("self_attn.q_proj.weight", "x / sqrt(8) * sqrt(8)"),
    "gemma": ("norm.weight", "(w + 1) - 1"),
}


def config_of(model_id: str) -> dict:
    return json.loads((FIXTURES / model_id / "hf" / "config.json").read_text())


def item_of(model_id: str) -> Path:
    return FIXTURES / model_id / "maxtext" / "0" / "items"


def hf_tensors(model_id: str) -> dict[str, np.ndarray]:
    """The fixture's Hugging Face tensors (bfloat16 as ``ml_dtypes.bfloat16``, which
    numpy knows by name once ``ml_dtypes`` is imported)."""
    return load_file(FIXTURES / model_id / "hf" / "model.safetensors")


def restore(path: Path) -> dict:
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(path.absolute())


def flat(tree: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), what


def assert_like_original(model_id: str, got: Mapping[str, np.ndarray]) -> None:
    """``got`` (Hugging Face names) is the fixture's Hugging Face model: bit for bit,
    but where :data:`INEXACT` says the mapping rounds (within 2 float32 ulp there)."""
    want = hf_tensors(model_id)
    assert set(got) == set(want)
    part, _ = INEXACT.get(model_id, ("\0", ""))
    for name, w in want.items():
        g = np.asarray(got[name])
        if part in name:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            ulp = np.spacing(np.maximum(np.abs(w), np.float32(1) if "norm" in part else 0))
            assert np.all(np.abs(g - w) <= 2 * ulp), name
        else:
            assert_bits_equal(g, w, name)


class Arrays(TensorSource):
    """Arrays in memory by name, recording which are read, and how."""

    def __init__(self, arrays: Mapping[str, np.ndarray], *, config: Any = None) -> None:
        self._arrays = dict(arrays)
        self.infos = {n: ArrayInfo(tuple(a.shape), a.dtype.name) for n, a in self._arrays.items()}
        self.config = config
        self.calls: list[tuple[str, str, Index | None]] = []

    def read(self, name: str) -> np.ndarray:
        self.calls.append(("array", name, None))
        return self._arrays[name]

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        self.calls.append(("slice", name, index))
        return np.asarray(self._arrays[name][index])


def maxtext_arrays(model_id: str, edit: Mapping[str, np.ndarray | None] = {}) -> Arrays:
    """The fixture item's arrays in memory (``step`` too), with ``edit`` applied
    (``None``: left out)."""
    with checkpoint.open_source(item_of(model_id)) as item:
        return _edited({n: item.array(n) for n in item.infos}, edit)


def _edited(arrays: dict[str, np.ndarray], edit: Mapping[str, np.ndarray | None]) -> Arrays:
    """``arrays`` with ``edit`` applied (``None``: left out), as a source."""
    for name, value in edit.items():
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value
    return Arrays(arrays)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_fixtures_cover_the_families():
    assert {MANIFEST[i]["model_type"] for i in IDS} == set(MAXTEXT_FAMILIES)
    assert {i for i in IDS if MANIFEST[i]["tied"]} == {"llama_tied", "gemma"}


@pytest.mark.parametrize("model_id", IDS)
def test_a_maxtext_item_becomes_the_hugging_face_model(model_id, tmp_path):
    config = config_of(model_id)
    with checkpoint.open_source(item_of(model_id)) as item:
        source = MaxTextToTorch(item, config)
        assert source.path == item.path and source.kind == "orbax"
        assert source.prefix == ("params", "params") and source.scanned
        out = bridge.save_hf(tmp_path / "hf", source, config=config)
    assert_like_original(model_id, load_file(out / "model.safetensors"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    assert type(model).__name__ == MANIFEST[model_id]["architecture"]
    ids = torch.from_numpy(np.load(FIXTURES / model_id / "input_ids.npy"))
    with torch.no_grad():
        logits = model(ids).logits.float().numpy()
    delta = float(np.abs(logits - np.load(FIXTURES / model_id / "logits.npy")).max())
    assert delta <= TOLERANCE, delta
    head, embedding = model.lm_head.weight, model.model.embed_tokens.weight
    assert (head.data_ptr() == embedding.data_ptr()) is MANIFEST[model_id]["tied"]


@pytest.mark.parametrize("model_id", IDS)
def test_the_head_of_a_tied_item_is_an_alias(model_id):
    with checkpoint.open_source(item_of(model_id)) as item:
        source = MaxTextToTorch(item, config_of(model_id))
    if MANIFEST[model_id]["tied"]:
        assert dict(source.ties) == {"lm_head.weight": "model.embed_tokens.weight"}
        assert "lm_head.weight" not in source.infos
    else:
        assert not source.ties and "lm_head.weight" in source.infos
    dtype = next(iter(MANIFEST[model_id]["leaves"].values())).split()[0]
    assert dict(source.infos) == {
        n: ArrayInfo(s, dtype) for n, s in torch_shapes(config_of(model_id)).items()
    }


@pytest.mark.parametrize("model_id", IDS)
def test_a_hugging_face_directory_becomes_the_scripts_tree(model_id, tmp_path):
    config = config_of(model_id)
    vocab = MANIFEST[model_id]["maxtext_vocab_size"]
    with bridge.open_source(FIXTURES / model_id / "hf") as hf:
        source = TorchToMaxText(hf, config, maxtext_vocab_size=vocab)
        assert source.flax_named and not source.ties
        checkpoint.write_item(tmp_path / "item", Plan.identity(source), source)
    ours, theirs = flat(restore(tmp_path / "item")), flat(restore(item_of(model_id)))
    assert theirs.pop("step") == 0  # (MaxText's TrainState; the params are what a run restores.)
    assert sorted(ours) == sorted(theirs) == sorted(MANIFEST[model_id]["leaves"])
    for path, want in theirs.items():
        assert_bits_equal(ours[path], want, path)
    with checkpoint.open_source(tmp_path / "item") as item:
        back = MaxTextToTorch(item)  # (The item keeps the directory's config.json.)
        assert back.config == config
        assert_like_original(model_id, {n: back.array(n) for n in back.infos})


@pytest.mark.parametrize("model_id", IDS)
@pytest.mark.parametrize(
    ("prefix", "scan_layers", "scan_axis"),
    [(("params",), True, 1), ((), False, 1), (("params", "params"), True, 0)],
)
def test_other_nestings_and_unscanned_layers_come_back(model_id, prefix, scan_layers, scan_axis):
    config = config_of(model_id)
    vocab = MANIFEST[model_id]["maxtext_vocab_size"]
    with bridge.open_source(FIXTURES / model_id / "hf") as hf:
        maxtext = TorchToMaxText(
            hf, config, prefix=prefix, scan_layers=scan_layers, scan_axis=scan_axis,
            maxtext_vocab_size=vocab,
        )  # fmt: skip
        layer = "layers/" if scan_layers else "layers_2/"
        assert "/".join((*prefix, "decoder", layer)) in "\n".join(maxtext.infos)
        back = MaxTextToTorch(maxtext, config, scan_axis=scan_axis)
        assert back.prefix == prefix and back.scanned is scan_layers
        assert_like_original(model_id, {n: back.array(n) for n in back.infos})


def test_a_stacked_leaf_is_read_one_layer_at_a_time():
    config = config_of("llama")
    source = maxtext_arrays("llama")
    maxtext = MaxTextToTorch(source, config)
    got = maxtext.array("model.layers.2.self_attn.q_proj.weight")
    assert source.calls == [
        (
            "slice",
            "params/params/decoder/layers/self_attention/query/kernel",
            (slice(None), slice(2, 3), slice(None), slice(None)),
        )
    ]
    assert_bits_equal(got, hf_tensors("llama")["model.layers.2.self_attn.q_proj.weight"], "q")


def test_a_stacked_leaf_is_written_one_layer_at_a_time():
    config = config_of("llama")
    with bridge.open_source(FIXTURES / "llama" / "hf") as hf:
        arrays = Arrays({n: hf.array(n) for n in hf.infos})
    maxtext = TorchToMaxText(arrays, config)
    path = "params/params/decoder/layers/mlp/wo/kernel"
    part = maxtext.read_slice(path, (slice(None), slice(1, 3)))
    assert [name for _, name, _ in arrays.calls] == [
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.2.mlp.down_proj.weight",
    ]
    assert_bits_equal(part, maxtext.array(path)[:, 1:3], path)
    assert part.shape == (96, 2, 64)


def test_a_runs_other_state_is_left_alone():
    """A run's items hold the optimizer's state beside the params (``opt_state/...``,
    which mirrors them) and ``step``: not the model's, never read."""
    state = np.zeros((64,), np.float32)
    source = maxtext_arrays("llama", {"opt_state/0/mu/params/decoder/decoder_norm/scale": state})
    maxtext = MaxTextToTorch(source, config_of("llama"))
    assert set(maxtext.infos) == set(hf_tensors("llama"))
    for name in maxtext.infos:
        maxtext.array(name)
    assert {c[1] for c in source.calls}.isdisjoint(
        {"step", *[n for n in source.infos if n.startswith("opt_state/")]}
    )


def test_a_computed_rope_buffer_of_an_old_checkpoint_is_left_out():
    arrays = _hf_arrays(
        "llama", {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}
    )
    maxtext = TorchToMaxText(arrays, config_of("llama"))
    assert not any("rotary" in n or "inv_freq" in n for n in maxtext.infos)


def test_the_rope_permutation_is_the_one_that_fits():
    """Read as plain RoPE (MaxText's llama3.3), the Llama 3.1 item's queries are not the
    model's: the permutation is applied, and this test can fail."""
    config = config_of("llama")
    plain = MaxTextToTorch(maxtext_arrays("llama"), config, interleaved_rope=False)
    name = "model.layers.0.self_attn.k_proj.weight"
    assert not np.array_equal(plain.array(name), hf_tensors("llama")[name])


STACKED = "params/params/decoder/layers"


def _error(make: Any) -> str:
    with pytest.raises(ValueError) as caught:
        make()
    text = str(caught.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    ("model_id", "edit", "config_edit", "says"),
    [
        ("llama", {f"{STACKED}/mlp/wo/kernel": None}, {},
         [f"'{STACKED}/mlp/wo/kernel' (96, 3, 64) is missing"]),
        ("llama", {}, {"num_hidden_layers": 2},
         [f"'{STACKED}/self_attention/query/kernel' (64, 3, 4, 16) stacks 3 layers",
          "num_hidden_layers=2"]),
        ("mistral", {}, {"num_key_value_heads": 4},
         [f"'{STACKED}/self_attention/key/kernel' has shape (64, 3, 2, 8)",
          "makes it (64, 3, 4, 8)"]),
        ("gemma", {}, {"intermediate_size": 95},
         [f"'{STACKED}/mlp/wi_0/kernel' has shape (64, 3, 96)", "intermediate_size=95"]),
        ("llama", {f"{STACKED}/self_attention/query_norm/scale": np.ones((16, 3), np.float32)},
         {}, [f"'{STACKED}/self_attention/query_norm/scale' has no place"]),
        ("llama_tied", {}, {"tie_word_embeddings": False},
         ["'params/params/decoder/logits_dense/kernel' is missing", "tie_word_embeddings"]),
        ("llama", {}, {"model_type": "gpt2"}, ["model_type 'gpt2' has no MaxText layout"]),
        ("llama", {}, {"attention_bias": True}, ["attention_bias: true"]),
        # -- the mixtures of experts: a wrong number of experts, a missing expert weight
        ("mixtral", {}, {"num_local_experts": 3},
         [f"'{STACKED}/MoeBlock_0/gate/kernel' has shape (32, 3, 4)", "num_local_experts=3",
          "makes it (32, 3, 3)"]),
        ("mixtral", {f"{STACKED}/MoeBlock_0/wi_0": np.zeros((5, 3, 32, 24), ml_dtypes.bfloat16)},
         {}, [f"'{STACKED}/MoeBlock_0/wi_0' (5, 3, 32, 24) stacks 5 experts on its axis 0",
              "config.json has num_local_experts=4"]),
        ("qwen3_moe", {f"{STACKED}/moe_block/wo": None}, {},
         [f"'{STACKED}/moe_block/wo' (4, 3, 24, 32) is missing"]),
        ("qwen3_moe", {}, {"num_local_experts": 8},
         [f"'{STACKED}/moe_block/gate/kernel' has shape (32, 3, 4)", "num_experts=8"]),
        ("qwen3_moe", {}, {"mlp_only_layers": [1]},
         ["mlp_only_layers [1]", "MaxText's qwen3_moe layers are all mixtures of experts"]),
    ],
)  # fmt: skip
def test_a_bad_item_or_config_is_one_line_naming_the_leaf(model_id, edit, config_edit, says):
    config = {**config_of(model_id), **config_edit}
    source = maxtext_arrays(model_id, edit)
    text = _error(lambda: MaxTextToTorch(source, config))
    for words in says:
        assert words in text, text
    assert not [c for c in source.calls if c[0] == "array"]  # Nothing read to refuse it.


def test_an_item_with_no_maxtext_weights_is_one_line():
    text = _error(
        lambda: MaxTextToTorch(Arrays({"wte/embedding": np.zeros(3)}), config_of("llama"))
    )
    assert "no MaxText weights" in text and "'wte/embedding'" in text


def _hf_arrays(model_id: str, edit: Mapping[str, np.ndarray | None]) -> Arrays:
    return _edited(dict(hf_tensors(model_id)), edit)


@pytest.mark.parametrize(
    ("edit", "config_edit", "says"),
    [
        ({"model.layers.1.mlp.up_proj.weight": None}, {},
         ["'model.layers.1.mlp.up_proj.weight'", "is missing"]),
        ({}, {"num_attention_heads": 8},
         ["'model.layers.0.self_attn.q_proj.weight' has shape (64, 64)", "makes it (128, 64)"]),
        ({"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}, {},
         ["'model.layers.0.self_attn.q_proj.bias' has no place"]),
        ({"model.layers.2.mlp.up_proj.weight": np.zeros((96, 64), np.float16)}, {},
         ["'model.layers.2.mlp.up_proj.weight' is float16, but layer 0's is float32"]),
    ],
)  # fmt: skip
def test_a_bad_hugging_face_model_is_one_line_naming_the_tensor(edit, config_edit, says):
    config = {**config_of("llama"), **config_edit}
    text = _error(lambda: TorchToMaxText(_hf_arrays("llama", edit), config))
    for words in says:
        assert words in text, text


def test_the_families_are_the_ones_maxtext_names():
    assert {f.decoder_block for f in MAXTEXT_FAMILIES.values()} == {
        *("llama2", "mistral", "gemma", "mixtral", "qwen3_moe")
    }
    assert {m: f.experts for m, f in MAXTEXT_FAMILIES.items() if f.experts} == {
        "mixtral": "num_local_experts",
        "qwen3_moe": "num_experts",
    }
    gemma = MAXTEXT_FAMILIES["gemma"]
    assert gemma.norm_offset == 1.0 and gemma.scaled_embedding and gemma.tied


# -- the mixtures of experts ---------------------------------------------------------

MOE = [i for i in IDS if MAXTEXT_FAMILIES[MANIFEST[i]["model_type"]].experts]

#: id -> (MaxText's block, the HF name of an expert weight after model.layers.{i}.,
#: MaxText's leaf -> HF's weight).
EXPERT_NAMES = {
    "mixtral": ("MoeBlock_0", "block_sparse_moe.experts.{e}.{w}.weight",
                {"wi_0": "w1", "wi_1": "w3", "wo": "w2"}),
    "qwen3_moe": ("moe_block", "mlp.experts.{e}.{w}.weight",
                  {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}),
}  # fmt: skip


def expert(model_id: str, layer: int, e: int, leaf: str) -> str:
    _, pattern, weights = EXPERT_NAMES[model_id]
    return f"model.layers.{layer}." + pattern.format(e=e, w=weights[leaf])


def test_the_fixtures_cover_the_mixtures_of_experts():
    assert sorted(MOE) == sorted(EXPERT_NAMES)
    assert MANIFEST["mixtral"]["leaves"][f"{STACKED}/MoeBlock_0/wi_0"] == "bfloat16 [4, 3, 32, 24]"


@pytest.mark.parametrize("model_id", MOE)
@pytest.mark.parametrize("leaf", ["wi_0", "wo"])
def test_an_expert_is_read_as_one_slice_of_its_stack(model_id, leaf):
    """Expert 1 of layer 2: the stacked array's ``[1, 2]``, read as that slice alone."""
    source = maxtext_arrays(model_id)
    maxtext = MaxTextToTorch(source, config_of(model_id))
    name = expert(model_id, 2, 1, leaf)
    got = maxtext.array(name)
    block = EXPERT_NAMES[model_id][0]
    whole = (slice(1, 2), slice(2, 3), slice(None), slice(None))
    assert source.calls == [("slice", f"{STACKED}/{block}/{leaf}", whole)]
    assert_bits_equal(got, hf_tensors(model_id)[name], name)


@pytest.mark.parametrize("model_id", MOE)
def test_experts_are_written_the_experts_and_layers_a_slice_covers(model_id):
    config = config_of(model_id)
    with bridge.open_source(FIXTURES / model_id / "hf") as hf:
        arrays = Arrays({n: hf.array(n) for n in hf.infos})
    maxtext = TorchToMaxText(arrays, config)
    path = f"{STACKED}/{EXPERT_NAMES[model_id][0]}/wi_1"
    part = maxtext.read_slice(path, (slice(1, 3), slice(0, 2)))
    assert sorted(name for _, name, _ in arrays.calls) == sorted(
        expert(model_id, i, e, "wi_1") for i in (0, 1) for e in (1, 2)
    )
    assert_bits_equal(part, maxtext.array(path)[1:3, 0:2], path)
    assert part.shape == (2, 2, 32, 24)


@pytest.mark.parametrize("model_id", MOE)
def test_a_fused_directory_gives_the_scripts_tree_and_goes_back_fused(model_id, tmp_path):
    """transformers 5's other naming (``save_original_format=False``: a layer's experts
    fused, ``mlp.experts.gate_up_proj``) converts to the same tree, bit for bit, and
    the item goes back to it; transformers loads both."""
    config = config_of(model_id)
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURES / model_id / "hf")
    model.save_pretrained(tmp_path / "fused", save_original_format=False)
    fused = load_file(tmp_path / "fused" / "model.safetensors")
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in fused)
    with bridge.open_source(tmp_path / "fused") as hf:
        source = TorchToMaxText(hf, config)
        checkpoint.write_item(tmp_path / "item", Plan.identity(source), source)
    ours, theirs = flat(restore(tmp_path / "item")), flat(restore(item_of(model_id)))
    theirs.pop("step")
    assert sorted(ours) == sorted(theirs)
    for path, want in theirs.items():
        assert_bits_equal(ours[path], want, path)
    with checkpoint.open_source(item_of(model_id)) as item:
        out = bridge.save_hf(
            tmp_path / "back", MaxTextToTorch(item, config), config=config, fused_experts=True
        )
    assert sorted(load_file(out / "model.safetensors")) == sorted(fused)
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    for key, value in model.state_dict().items():
        got = loaded.state_dict()[key]
        assert got.dtype == value.dtype and torch.equal(
            got.view(torch.uint8), value.view(torch.uint8)
        ), key


@pytest.mark.parametrize("head_dim", [8, 32])
def test_mixtrals_query_is_scaled_as_to_maxtext_scales_it(head_dim, load_script):
    """Where ``1/sqrt(head_dim)`` is not a power of two, bfloat16 rounds: every leaf is
    the fixture script's (``to_maxtext.py``'s arithmetic), bit for bit; dividing by
    ``sqrt(head_dim)`` in bfloat16 (``llama_or_mistral_ckpt.py``'s) would not be."""
    script = load_script("tests/data/maxtext/make_fixture.py")
    config = {**config_of("mixtral"), "head_dim": head_dim}
    rng = np.random.default_rng(head_dim)
    hf = {
        n: rng.standard_normal(s).astype(ml_dtypes.bfloat16)
        for n, s in torch_shapes(config).items()
    }
    want = script.mixtral_to_maxtext(hf, config)
    got = TorchToMaxText(Arrays(hf), config)
    assert sorted(got.infos) == sorted(f"params/params/{p}" for p in want)
    for path, w in want.items():
        assert_bits_equal(got.array(f"params/params/{path}"), np.ascontiguousarray(w), path)
    query = got.array(f"{STACKED}/self_attention/query/kernel")[:, 0]  # (Layer 0's.)
    x = hf["model.layers.0.self_attn.q_proj.weight"].T.reshape(query.shape)
    divided = x / np.sqrt(head_dim).astype(ml_dtypes.bfloat16)
    assert not np.array_equal(divided.view(np.uint16), query.view(np.uint16))


def test_bfloat16_is_kept_both_ways(tmp_path):
    """Mixtral's fixture is bfloat16, as ``to_maxtext.py`` saves by default: its item's
    leaves are, the tree we write from the directory is, and so is the directory we
    write from the item, every tensor the original's bits."""
    config = config_of("mixtral")
    with checkpoint.open_source(item_of("mixtral")) as item:
        assert {i.dtype for n, i in item.infos.items() if n != "step"} == {"bfloat16"}
        out = bridge.save_hf(tmp_path / "hf", MaxTextToTorch(item, config), config=config)
    with safe_open(out / "model.safetensors", framework="pt") as file:
        assert {file.get_slice(n).get_dtype() for n in file.keys()} == {"BF16"}  # noqa: SIM118
    assert_like_original("mixtral", load_file(out / "model.safetensors"))
    with bridge.open_source(FIXTURES / "mixtral" / "hf") as hf:
        maxtext = TorchToMaxText(hf, config)
        assert {i.dtype for i in maxtext.infos.values()} == {"bfloat16"}
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    ("edit", "config_edit", "says"),
    [
        ({"model.layers.1.block_sparse_moe.experts.2.w3.weight": None}, {},
         ["'model.layers.1.block_sparse_moe.experts.2.w3.weight' (24, 32) is missing"]),
        ({}, {"num_local_experts": 3},
         ["'model.layers.0.block_sparse_moe.gate.weight' has shape (4, 32)",
          "num_local_experts=3", "makes it (3, 32)"]),
        ({}, {"num_local_experts": 5},
         ["'model.layers.0.block_sparse_moe.gate.weight' has shape (4, 32)", "makes it (5, 32)"]),
        ({"model.layers.2.block_sparse_moe.experts.1.w1.weight": np.zeros((24, 32), np.float32)},
         {}, ["'model.layers.2.block_sparse_moe.experts.1.w1.weight' is float32, but layer 0, "
              "expert 0's is bfloat16"]),
    ],
)  # fmt: skip
def test_a_bad_mixture_of_experts_is_one_line_naming_the_tensor(edit, config_edit, says):
    config = {**config_of("mixtral"), **config_edit}
    with bridge.open_source(FIXTURES / "mixtral" / "hf") as hf:
        arrays = _edited({n: hf.array(n) for n in hf.infos}, edit)
    text = _error(lambda: TorchToMaxText(arrays, config))
    for words in says:
        assert words in text, text


def run_convert(*argv: object) -> tuple[int, str]:
    """``jaxshare convert --quiet *argv``: its exit status and stderr."""
    import contextlib
    import io

    from jaxshare.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["convert", "--quiet", *map(str, argv)])
    return status, err.getvalue()


@pytest.mark.parametrize("model_id", IDS)
def test_the_command_converts_a_maxtext_item_to_a_directory_and_back(model_id, tmp_path):
    """``--layout maxtext`` both ways: the item to a directory with the model's logits,
    the directory to the tree MaxText's script wrote."""
    out, item = tmp_path / "hf", tmp_path / "item"
    config = FIXTURES / model_id / "hf" / "config.json"
    argv = (item_of(model_id), out, "--format", "hf", "--config", config, "--layout", "maxtext")
    assert run_convert(*argv) == (0, "")
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    ids = np.load(FIXTURES / model_id / "input_ids.npy")
    logits = model(torch.tensor(ids)).logits.detach().float().numpy()
    assert np.abs(logits - np.load(FIXTURES / model_id / "logits.npy")).max() <= TOLERANCE
    if MANIFEST[model_id]["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if model_id == "gemma":
        return  # (MaxText pads Gemma's vocabulary, which the config does not say.)
    assert run_convert(FIXTURES / model_id / "hf", item, "--layout", "maxtext") == (0, "")
    want = flat(restore(item_of(model_id)))
    got = flat(restore(item))
    assert set(got) == set(want) - {"step"}
    for path, value in got.items():  # (This way is exact: MaxText's own arithmetic.)
        assert value.dtype == want[path].dtype and np.array_equal(value, want[path]), path


def test_the_maxtext_layout_is_refused_where_rules_place(tmp_path):
    """The layout reshapes tensors: rule-based routes say where to convert it instead."""
    with pytest.raises(ValueError, match="reshapes tensors, which naming rules cannot"):
        bridge.to_torch({"params": {"w": np.zeros(2, np.float32)}}, layout="maxtext")
