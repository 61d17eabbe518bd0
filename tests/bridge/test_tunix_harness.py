"""The Tunix harness (``tests/_support/tunix_models.py``) itself: tiny Hugging Face models
of each family, loaded by Tunix 0.1.7's own loader, checked by hand against the
safetensors file; Tunix's configs against its own presets; the path table of the
harness's docstring against what Tunix loads; and what Tunix's loader does with a head
stored where none is asked for, a head asked for but not stored, and mixed dtypes.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

E, N, K, D = 64, 4, 2, 16  # hidden, heads, KV heads, head dim of the tiny models

#: (family, tied, fused_qkv): the tiny models the harness documents.
CASES = [
    ("qwen3", True, False),
    ("qwen3", False, False),
    ("llama3", True, False),
    ("llama3", False, False),
    ("gemma3", True, False),
    ("gemma3", True, True),
]

ROOT = Path(__file__).resolve().parents[2]


def _name(case: tuple) -> str:
    family, tied, fused = case
    return f"{family} {'tied' if tied else 'untied'}" + (" fused_qkv" if fused else "")


@pytest.fixture(scope="module")
def tm(load_script: Callable) -> ModuleType:
    return load_script("tests/_support/tunix_models.py")


@dataclasses.dataclass(frozen=True)
class Loaded:
    hf_dir: Path
    config: dict
    stored: dict[str, np.ndarray]
    flat: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def loaded(tm: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Loaded]:
    """Each case written by transformers and loaded by Tunix, once for the module."""
    out = {}
    for family, tied, fused in CASES:
        hf_dir = tmp_path_factory.mktemp(family)
        kw = {"fused_qkv": True} if fused else {}
        config = tm.write_hf_dir(hf_dir, family, tied, **kw)
        stored = load_file(hf_dir / "model.safetensors")
        flat = tm.flat_params(tm.tunix_load(hf_dir, config))
        out[_name((family, tied, fused))] = Loaded(hf_dir, config, stored, flat)
    return out


def _raises(error: type[Exception], match: str, load: Callable[[], object]) -> None:
    """``load()`` raises ``error``. Tunix's optimized loader leaves its files open when it
    fails: they are closed here (the exception dropped, then collected), their
    ResourceWarning kept from the suite, which makes every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(error, match=match) as raised:
            load()
        del raised
        gc.collect()


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Dtype, shape and bits equal."""
    return (
        got.dtype == want.dtype
        and got.shape == want.shape
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    )


@pytest.mark.subprocess
def test_tunix_imports_without_its_package_init_and_leaves_flax_as_it_was(tm):
    import flax

    before = flax.config.flax_always_shard_variable
    t = tm.tunix()
    assert tm.tunix() is t
    assert flax.config.flax_always_shard_variable == before
    assert t.gemma3.params.__name__ == "tunix.models.gemma3.params_safetensors"
    assert not hasattr(sys.modules["tunix"], "__file__")  # the bare package
    # Its trainers are not imported by it (in a process of its own: a test of Tunix's
    # CheckpointManager, tests/bridge/test_adapters_jax.py, imports tunix.sft itself).
    code = (
        "import runpy, sys\n"
        "tm = runpy.run_path('tests/_support/tunix_models.py')\n"
        "tm['tunix']()\n"
        "print([n for n in sys.modules if n.startswith(('tunix.sft', 'tunix.rl'))])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


@pytest.mark.parametrize("case", ["qwen3 tied", "qwen3 untied", "llama3 tied", "llama3 untied"])
def test_qwen3_and_llama3_load_as_stored(loaded, case):
    m = loaded[case]
    s, f = m.stored, m.flat
    q = s["model.layers.0.self_attn.q_proj.weight"]
    assert _same(f["layers/0/attn/q_proj/w"], q.T.reshape(E, N, D))
    k = s["model.layers.1.self_attn.k_proj.weight"]
    assert _same(f["layers/1/attn/k_proj/w"], k.T.reshape(E, K, D))
    o = s["model.layers.0.self_attn.o_proj.weight"]
    assert _same(f["layers/0/attn/o_proj/w"], o.T.reshape(N, D, E))
    assert _same(f["layers/0/mlp/down_proj/kernel"], s["model.layers.0.mlp.down_proj.weight"].T)
    assert _same(f["layers/1/input_layernorm/w"], s["model.layers.1.input_layernorm.weight"])
    assert _same(f["final_norm/w"], s["model.norm.weight"])
    embedding = s["model.embed_tokens.weight"]
    assert _same(f["embedder/input_embedding"], embedding)
    if case.endswith(" tied"):
        assert "lm_head.weight" not in s and not [p for p in f if "lm_head" in p]
    else:
        head = s["lm_head.weight"]
        assert not np.array_equal(head, embedding)  # (write_hf_dir moves each apart)
        assert _same(f["lm_head/w"], head.T)
    assert {a.dtype for a in f.values()} == {np.dtype("bfloat16")}


@pytest.mark.parametrize("case", ["gemma3 tied", "gemma3 tied fused_qkv"])
def test_gemma3_loads_as_stored(loaded, case):
    m = loaded[case]
    s, f = m.stored, m.flat
    kv_heads = m.config["num_key_value_heads"]

    def per_head(name: str, heads: int) -> np.ndarray:  # (out, E) -> (heads, E, D)
        w = s[f"model.layers.1.self_attn.{name}.weight"]
        return w.T.reshape(E, heads, D).transpose(1, 0, 2)

    q, k, v = per_head("q_proj", N), per_head("k_proj", kv_heads), per_head("v_proj", kv_heads)
    if case.endswith("fused_qkv"):
        assert kv_heads == N and "layers/1/attn/q_einsum/w" not in f
        assert _same(f["layers/1/attn/qkv_einsum/w"], np.stack([q, k, v]))
    else:
        assert kv_heads == K and "layers/1/attn/qkv_einsum/w" not in f
        assert _same(f["layers/1/attn/q_einsum/w"], q)
        assert _same(f["layers/1/attn/kv_einsum/w"], np.stack([k, v]))
    o = s["model.layers.0.self_attn.o_proj.weight"]
    assert _same(f["layers/0/attn/attn_vec_einsum/w"], o.T.reshape(N, D, E))
    # Norms as stored (Tunix's RMSNorm applies 1 + scale, as Gemma's does), the
    # embedding unscaled, no head.
    norms = {
        "pre_attention_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "pre_ffw_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
    for ours, theirs in norms.items():
        assert _same(f[f"layers/0/{ours}/scale"], s[f"model.layers.0.{theirs}.weight"])
    assert _same(f["layers/0/attn/_query_norm/scale"], s["model.layers.0.self_attn.q_norm.weight"])
    assert _same(f["final_norm/scale"], s["model.norm.weight"])
    assert _same(f["embedder/input_embedding"], s["model.embed_tokens.weight"])
    assert "lm_head.weight" not in s and not [p for p in f if "lm_head" in p]


def test_written_tensors_are_all_non_trivial(loaded):
    for case in loaded.values():
        for name, tensor in case.stored.items():
            values = tensor.astype(np.float32)
            assert not np.all(values == values.flat[0]), name


def _documented(doc: str) -> dict[str, set[tuple[str, tuple]]]:
    """The harness's docstring table: ``{case: {(path with {i}, shape)}}``."""
    table = doc.split("\nPATHS\n", 1)[1].split("\nEND PATHS", 1)[0]
    out: dict[str, set] = {}
    for line in table.splitlines():
        if head := re.fullmatch(r"(\w+ \w+(?: fused_qkv)?):", line):
            rows = out.setdefault(head[1], set())
        elif row := re.match(r"  (\S+)\s+(\([\d, ]*\))\s+<- ", line):
            rows.add((row[1], tuple(int(n) for n in re.findall(r"\d+", row[2]))))
    return out


def test_docstring_path_table_is_what_tunix_loads(tm, loaded):
    actual = {
        case: {(re.sub(r"^layers/\d+/", "layers/{i}/", p), a.shape) for p, a in m.flat.items()}
        for case, m in loaded.items()
    }
    assert _documented(tm.__doc__) == actual


#: Real models' config.json (as their repositories hold them, transformers 4 keys).
QWEN3_0P6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}  # fmt: skip
LLAMA3P2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3",
    },
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
}  # fmt: skip


def test_configs_of_real_models_are_tunix_presets(tm):
    import jax.numpy as jnp

    t = tm.tunix()
    bf16 = jnp.dtype("bfloat16")
    qwen3 = t.qwen3.model.ModelConfig.qwen3_0p6b()
    assert tm.tunix_config(QWEN3_0P6B) == dataclasses.replace(qwen3, dtype=bf16, param_dtype=bf16)
    assert tm.tunix_config(LLAMA3P2_1B) == t.llama3.model.ModelConfig.llama3p2_1b()
    assert tm.tunix_config(GEMMA3_1B) == t.gemma3.model.ModelConfig.gemma3_1b_it()


def test_tiny_configs_map_field_for_field(tm, loaded):
    gemma = tm.tunix_config(loaded["gemma3 tied"].config)
    assert (gemma.num_embed, gemma.embed_dim, gemma.hidden_dim) == (256, 64, 128)
    assert (gemma.num_heads, gemma.num_kv_heads, gemma.head_dim) == (N, K, D)
    assert (gemma.sliding_window_size, gemma.local_base_frequency) == (16, 10_000)
    assert (gemma.global_base_frequency, gemma.global_scale_factor) == (1_000_000, 8.0)
    assert gemma.local_scale_factor == 1.0
    llama = tm.tunix_config(loaded["llama3 untied"].config)
    assert (llama.norm_eps, llama.rope_theta, llama.weight_tying) == (1e-5, 500_000, False)
    qwen = tm.tunix_config(loaded["qwen3 tied"].config)
    assert (qwen.vocab_size, qwen.num_layers, qwen.use_tied_embedding) == (256, 2, True)


def test_configs_tunix_cannot_hold_are_refused(tm):
    with pytest.raises(ValueError, match="model_type 'mistral'"):
        tm.tunix_config({**tm.tiny_hf_config("llama3", True), "model_type": "mistral"})
    with pytest.raises(ValueError, match="untied head"):
        tm.tunix_config(tm.tiny_hf_config("gemma3", False))
    with pytest.raises(ValueError, match="attention biases"):
        tm.tunix_config({**tm.tiny_hf_config("qwen3", True), "attention_bias": True})
    with pytest.raises(ValueError, match="layer pattern"):
        tm.tunix_config({**GEMMA3_1B, "sliding_window_pattern": 4})
    with pytest.raises(ValueError, match="fused_qkv"):
        tm.tiny_hf_config("qwen3", True, fused_qkv=True)


def test_a_head_stored_for_a_tied_config_is_dropped(tm, loaded):
    untied = loaded["qwen3 untied"]
    config = {**untied.config, "tie_word_embeddings": True}
    flat = tm.flat_params(tm.tunix_load(untied.hf_dir, config))
    assert not [p for p in flat if "lm_head" in p]
    assert _same(flat["embedder/input_embedding"], untied.stored["model.embed_tokens.weight"])


def test_a_head_asked_for_but_not_stored_fails_as_a_tree_mismatch(tm, loaded):
    tied = loaded["llama3 tied"]
    untied = {**tied.config, "tie_word_embeddings": False}
    _raises(ValueError, "pytree structure", lambda: tm.tunix_load(tied.hf_dir, untied))


def test_the_optimized_loader_reads_a_file_in_its_first_tensors_dtype(tm, loaded, tmp_path):
    tied = loaded["qwen3 tied"]
    mixed = {k: v.astype(np.float32) if "norm" in k else v for k, v in tied.stored.items()}
    save_file(mixed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _raises(ValueError, "reshape", lambda: tm.tunix_load(tmp_path, tied.config))
    flat = tm.flat_params(tm.tunix_load(tmp_path, tied.config, mode="original"))
    assert _same(flat["final_norm/w"], mixed["model.norm.weight"])
    assert _same(flat["embedder/input_embedding"], mixed["model.embed_tokens.weight"])


def test_loads_onto_a_mesh(tm, loaded):
    mesh = jax.make_mesh((4, 2), ("fsdp", "tp"))
    for case in ("qwen3 untied", "gemma3 tied"):
        m = loaded[case]
        model = tm.tunix_load(m.hf_dir, m.config, mesh=mesh)
        from flax import nnx

        state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        embedding = state["embedder"]["input_embedding"]
        assert embedding.sharding.spec == P("tp", "fsdp")
        assert _same(np.asarray(embedding), m.flat["embedder/input_embedding"])
        assert tm.flat_params(model).keys() == m.flat.keys()
