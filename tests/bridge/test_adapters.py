"""PEFT LoRA adapter directories, read and written (``bridge.adapters.peft``), held
against the real PEFT 0.21: what it writes we read bit for bit, what we write it loads
with the same outputs, and read -> save -> read is the identity.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from bridge import LoraConfig, read_adapter, save_adapter  # noqa: E402
from bridge.adapters.peft import LoraPair  # noqa: E402

LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
)

#: (name, tied base, LoraConfig keywords): every kind of adapter PEFT writes that we read.
CASES = [
    ("list", False, dict(target_modules=["q_proj", "v_proj"])),
    ("regex", True, dict(target_modules=r".*\.(q|k)_proj")),
    ("modules_to_save", True, dict(target_modules=["q_proj"], modules_to_save=["lm_head"])),
    ("rslora", False, dict(target_modules=["v_proj", "down_proj"], use_rslora=True, lora_alpha=16)),
    (
        "patterns",
        False,
        dict(
            target_modules=["q_proj", "v_proj", "o_proj"],
            rank_pattern={"layers.1.self_attn.q_proj": 2},
            alpha_pattern={"v_proj": 3},
        ),
    ),
    ("embedding", True, dict(target_modules=["q_proj", "embed_tokens"])),
    ("lm_head", True, dict(target_modules=["v_proj", "lm_head"])),
    (
        "weight_tying",
        True,
        dict(target_modules=["q_proj", "embed_tokens"], ensure_weight_tying=True),
    ),
    ("qwen3", False, dict(target_modules=["q_proj", "gate_proj"], model="qwen3")),
]


def base_model(tied: bool, seed: int = 0, model: str = "llama") -> Any:
    """A tiny causal LM built from a config (nothing downloads), seeded."""
    torch.manual_seed(seed)
    if model == "qwen3":
        config = transformers.Qwen3Config(**LLAMA, head_dim=16, tie_word_embeddings=tied)
        return transformers.Qwen3ForCausalLM(config).eval()
    config = transformers.LlamaConfig(**LLAMA, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(config).eval()


def peft_adapter(out: Path, tied: bool, options: dict) -> Any:
    """The PeftModel of ``options`` on a tiny base, its LoRA weights random (not PEFT's
    zero B), saved by PEFT's ``save_pretrained`` at ``out``."""
    options = dict(options)
    model = options.pop("model", "llama")
    options = {"r": 4, "lora_alpha": 8, "init_lora_weights": False, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's notes on tied layers, transformers' deprecations
        pm = peft.get_peft_model(base_model(tied, model=model), peft.LoraConfig(**options))
        torch.manual_seed(1)
        with torch.no_grad():  # modules_to_save start as the base's copy: make them differ.
            for name, p in pm.named_parameters():
                if "modules_to_save" in name:
                    p.add_(torch.randn_like(p))
        pm.save_pretrained(out)
    return pm.eval()


def lora_layers(pm: Any) -> dict[str, Any]:
    """PEFT's LoRA layers by base module name."""
    out = {}
    for name, module in pm.named_modules():
        if hasattr(module, "lora_A") and "default" in (
            module.lora_A.keys() | module.lora_embedding_A.keys()
        ):
            out[name.removeprefix("base_model.model.")] = module
    return out


def _bytes(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().view(torch.uint8).numpy()
    return np.ascontiguousarray(x).tobytes()


@pytest.mark.parametrize(("case", "tied", "options"), CASES, ids=[c[0] for c in CASES])
def test_reads_what_peft_writes(tmp_path: Path, case: str, tied: bool, options: dict) -> None:
    pm = peft_adapter(tmp_path / "a", tied, options)
    adapter = read_adapter(tmp_path / "a")
    config = pm.peft_config["default"]
    assert adapter.config.r == config.r and adapter.config.lora_alpha == config.lora_alpha
    assert adapter.config.use_rslora is config.use_rslora
    targets = adapter.config.target_modules
    want = config.target_modules
    assert (targets == want) if isinstance(want, str) else (set(targets) == set(want))
    assert set(adapter.config.modules_to_save) == set(config.modules_to_save or ())
    assert adapter.config.base_model_name_or_path == config.base_model_name_or_path

    layers = lora_layers(pm)
    modules = adapter.modules()
    assert set(modules) == set(layers)
    for name, layer in layers.items():
        pair = modules[name]
        if pair.embedding:
            a, b = layer.lora_embedding_A["default"], layer.lora_embedding_B["default"]
        else:
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert _bytes(pair.A) == _bytes(a) and _bytes(pair.B) == _bytes(b), name
        assert pair.A.dtype.name == str(a.dtype).removeprefix("torch.")
        assert pair.rank == layer.r["default"]
        assert adapter.scaling_of(name) == layer.scaling["default"], name  # exactly

    # Whole tensors: modules_to_save, and the embedding layers PEFT saves beside them.
    saved = adapter.saved()
    wrapped = {
        n.removeprefix("base_model.model.").replace(".modules_to_save.default", ""): p
        for n, p in pm.named_parameters()
        if ".modules_to_save.default." in n
    }
    embedded = {
        f"{name}.weight": layer.base_layer.weight
        for name, layer in layers.items()
        if f"{name}.weight" in saved
    }
    assert set(saved) == set(wrapped) | set(embedded)
    for name, value in {**wrapped, **embedded}.items():
        assert _bytes(saved[name]) == _bytes(value), name
    if case == "modules_to_save":
        assert "lm_head.weight" in saved
    if case == "embedding":
        assert "model.embed_tokens.weight" in saved


def _logits(model: Any) -> Any:
    ids = torch.arange(24).reshape(2, 12) % 100
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize(("case", "tied", "options"), CASES, ids=[c[0] for c in CASES])
def test_peft_loads_what_we_write(tmp_path: Path, case: str, tied: bool, options: dict) -> None:
    pm = peft_adapter(tmp_path / "a", tied, options)
    adapter = read_adapter(tmp_path / "a")
    out = save_adapter(tmp_path / "ours", adapter.config, adapter.modules(), adapter.saved())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = base_model(tied, model=options.get("model", "llama"))
        loaded = peft.PeftModel.from_pretrained(base, out).eval()
    assert torch.equal(_logits(loaded), _logits(pm))
    # And the adapter's tensors are the same bytes under the same names as PEFT's.
    from safetensors.numpy import load_file

    theirs = load_file(tmp_path / "a" / "adapter_model.safetensors")
    ours = load_file(out / "adapter_model.safetensors")
    assert set(ours) == set(theirs)
    assert all(_bytes(ours[k]) == _bytes(theirs[k]) for k in theirs)


def test_refuses_other_types_and_variants(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(
            base_model(False), peft.LoraConfig(target_modules=["q_proj"], use_dora=True)
        )
        pm.save_pretrained(tmp_path / "dora")
        pm = peft.get_peft_model(
            base_model(False),
            peft.IA3Config(
                target_modules=["q_proj", "down_proj"], feedforward_modules=["down_proj"]
            ),
        )
        pm.save_pretrained(tmp_path / "ia3")
    with pytest.raises(ValueError, match=r"dora/adapter_config.json: key 'use_dora' is True: DoRA"):
        read_adapter(tmp_path / "dora")
    with pytest.raises(ValueError, match=r"ia3/adapter_config.json: key 'peft_type' is 'IA3'"):
        read_adapter(tmp_path / "ia3")


def _write(tmp_path: Path, doc: dict, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    d = tmp_path / "adapter"
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps(doc))
    save_file(tensors, d / "adapter_model.safetensors")
    return d


A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
GOOD = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
PAIR = {A: np.ones((2, 8), np.float32), B: np.ones((8, 2), np.float32)}


@pytest.mark.parametrize(
    ("doc", "tensors", "match"),
    [
        ({**GOOD, "peft_type": "ADALORA"}, PAIR, r"key 'peft_type' is 'ADALORA'"),
        ({**GOOD, "init_lora_weights": "pissa"}, PAIR, r"key 'init_lora_weights' is 'pissa'"),
        ({**GOOD, "lora_bias": True}, PAIR, r"key 'lora_bias' is True"),
        ({**GOOD, "r": 3}, PAIR, r"q_proj' has A \(2, 8\) and B \(8, 2\), expected rank 3"),
        ({**GOOD, "r": "2"}, PAIR, r"key 'r' must be a rank >= 1, found '2'"),
        ({**GOOD, "r": True}, PAIR, r"key 'r' must be a rank"),
        (GOOD, {A: PAIR[A]}, r"q_proj' has no LoRA B tensor"),
        (GOOD, {**PAIR, "lm_head.weight": PAIR[A]}, r"'lm_head.weight' does not start with"),
        (
            GOOD,
            {**PAIR, B.replace("weight", "bias"): np.ones(8, np.float32)},
            r"a LoRA bias \(lora_bias\), a LoRA variant",
        ),
    ],
)
def test_bad_adapters_are_one_line(tmp_path: Path, doc: dict, tensors: dict, match: str) -> None:
    d = _write(tmp_path, doc, tensors)
    with pytest.raises(ValueError, match=match) as info:
        read_adapter(d)
    assert "\n" not in str(info.value) and str(d) in str(info.value)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="expected a PEFT adapter directory"):
        read_adapter(tmp_path / "nothing")
    (tmp_path / "adapter_config.json").write_text(json.dumps(GOOD))
    with pytest.raises(FileNotFoundError, match="found no adapter_model.safetensors"):
        read_adapter(tmp_path)


def test_save_refuses_a_rank_the_config_does_not_say(tmp_path: Path) -> None:
    pair = LoraPair(np.ones((2, 4), np.float32), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"'m' has A \(2, 4\) and B \(3, 2\), expected rank 4"):
        save_adapter(tmp_path / "out", LoraConfig(r=4, lora_alpha=8), {"m": pair})
    assert not (tmp_path / "out").exists()


DTYPES = ["float32", "bfloat16", "float16"]


@st.composite
def adapters(draw: st.DrawFn) -> tuple[LoraConfig, dict[str, LoraPair], dict[str, np.ndarray]]:
    from jaxshare.internal import numpy_dtype

    r = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(["q", "k", "v", "o", "emb", "head"]), unique=True))
    modules = {}
    for i, name in enumerate(names):
        dtype = numpy_dtype(draw(st.sampled_from(DTYPES)))
        rank = draw(st.sampled_from([r, r + 1])) if i else r
        inn, out = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        bits = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        a, b = (bits.integers(0, 2**16, s, dtype=np.uint16) for s in ((rank, inn), (out, rank)))
        if dtype.itemsize == 2:  # Every bit pattern, NaNs included.
            a, b = a.view(dtype), b.view(dtype)
        else:
            a, b = a.astype(dtype), b.astype(dtype)
        modules[f"model.layers.{i}.{name}"] = LoraPair(a, b, name == "emb")
    pattern = {m.split(".", 1)[1]: p.rank for m, p in modules.items() if p.rank != r}
    saved = {"lm_head.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    if draw(st.booleans()) and "model.layers.0.emb" in modules:
        saved["model.layers.0.emb.weight"] = np.ones((2, 2), numpy_dtype("bfloat16"))
    config = LoraConfig(
        r=r,
        lora_alpha=draw(st.sampled_from([1, 8, 16.0, 0.5])),
        use_rslora=draw(st.booleans()),
        target_modules=draw(st.sampled_from([tuple(n for n in names), r".*\.(q|v)"])),
        modules_to_save=("lm_head",),
        base_model_name_or_path=draw(st.sampled_from([None, "tiny/llama"])),
        raw={"rank_pattern": pattern, "task_type": "CAUSAL_LM"},
    )
    return config, modules, saved


@settings(max_examples=25, deadline=None)
@given(adapters())
def test_read_save_read_is_the_identity(tmp_path_factory: Any, drawn: tuple) -> None:
    config, modules, saved = drawn
    first = read_adapter(save_adapter(tmp_path_factory.mktemp("a") / "a", config, modules, saved))
    second = read_adapter(
        save_adapter(
            tmp_path_factory.mktemp("b") / "b", first.config, first.modules(), first.saved()
        )
    )
    for got in (first, second):
        assert got.config == config and got.config.document() == config.document()
        assert list(got.modules()) == sorted(modules)
        for name, pair in got.modules().items():
            want = modules[name]
            assert pair.embedding == want.embedding
            for x, y in ((pair.A, want.A), (pair.B, want.B)):
                assert (x.shape, x.dtype) == (y.shape, y.dtype) and _bytes(x) == _bytes(y)
            assert got.scaling_of(name) == config.scaling_of(name)
        assert set(got.saved()) == set(saved)
        for name, value in got.saved().items():
            assert value.dtype == saved[name].dtype and _bytes(value) == _bytes(saved[name])
    a, b = (Path(x.path) / "adapter_model.safetensors" for x in (first, second))
    assert a.read_bytes() == b.read_bytes()
