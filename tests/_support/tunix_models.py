"""Tunix (google-tunix 0.1.7) model classes beside ours: tiny Hugging Face models written
by transformers 5, loaded by Tunix's own ``create_model_from_safe_tensors``.

Loaded by the ``load_script`` fixture (test modules never import helper modules)::

    tm = load_script("tests/_support/tunix_models.py")
    config = tm.write_hf_dir(tmp_path, "qwen3", tied=True)
    model = tm.tunix_load(tmp_path, config)
    tm.flat_params(model)["layers/0/attn/q_proj/w"]  # (E, N, D), as stored (bf16)

Tunix is imported with its package ``__init__`` bypassed (that one imports the trainers):
:func:`tunix` puts a bare ``tunix`` package in ``sys.modules`` and imports only the model
and loader modules (about 1 s, jax and flax included).

The paths of the tiny models (:func:`tiny_hf_config`: E=64 hidden, N=4 heads, K=2 KV heads
(4 with ``fused_qkv``), D=16 head dim, MLP 128, vocabulary 256; layers ``{i}`` 0 and 1) as
:func:`flat_params` names them, their shapes, and the Hugging Face tensor Tunix makes each of
(``L.`` is ``model.layers.{i}.``; each name's ``.weight`` left out). Every leaf keeps the
stored dtype (bf16 here). Gemma 3's norms (``scale``) are HF's weights as stored: both apply
``1 + w``; its embedding is stored unscaled by both (both scale by sqrt(E) when embedding).

PATHS
qwen3 tied:
  embedder/input_embedding               (256, 64)    <- model.embed_tokens
  final_norm/w                           (64,)        <- model.norm
  layers/{i}/attn/k_norm/w               (16,)        <- L.self_attn.k_norm
  layers/{i}/attn/k_proj/w               (64, 2, 16)  <- L.self_attn.k_proj.T.reshape(E, K, D)
  layers/{i}/attn/o_proj/w               (4, 16, 64)  <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/q_norm/w               (16,)        <- L.self_attn.q_norm
  layers/{i}/attn/q_proj/w               (64, 4, 16)  <- L.self_attn.q_proj.T.reshape(E, N, D)
  layers/{i}/attn/v_proj/w               (64, 2, 16)  <- L.self_attn.v_proj.T.reshape(E, K, D)
  layers/{i}/input_layernorm/w           (64,)        <- L.input_layernorm
  layers/{i}/mlp/down_proj/kernel        (128, 64)    <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel        (64, 128)    <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel          (64, 128)    <- L.mlp.up_proj.T
  layers/{i}/post_attention_layernorm/w  (64,)        <- L.post_attention_layernorm
qwen3 untied:
  embedder/input_embedding               (256, 64)    <- model.embed_tokens
  final_norm/w                           (64,)        <- model.norm
  layers/{i}/attn/k_norm/w               (16,)        <- L.self_attn.k_norm
  layers/{i}/attn/k_proj/w               (64, 2, 16)  <- L.self_attn.k_proj.T.reshape(E, K, D)
  layers/{i}/attn/o_proj/w               (4, 16, 64)  <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/q_norm/w               (16,)        <- L.self_attn.q_norm
  layers/{i}/attn/q_proj/w               (64, 4, 16)  <- L.self_attn.q_proj.T.reshape(E, N, D)
  layers/{i}/attn/v_proj/w               (64, 2, 16)  <- L.self_attn.v_proj.T.reshape(E, K, D)
  layers/{i}/input_layernorm/w           (64,)        <- L.input_layernorm
  layers/{i}/mlp/down_proj/kernel        (128, 64)    <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel        (64, 128)    <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel          (64, 128)    <- L.mlp.up_proj.T
  layers/{i}/post_attention_layernorm/w  (64,)        <- L.post_attention_layernorm
  lm_head/w                              (64, 256)    <- lm_head.T
llama3 tied:
  embedder/input_embedding               (256, 64)    <- model.embed_tokens
  final_norm/w                           (64,)        <- model.norm
  layers/{i}/attn/k_proj/w               (64, 2, 16)  <- L.self_attn.k_proj.T.reshape(E, K, D)
  layers/{i}/attn/o_proj/w               (4, 16, 64)  <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/q_proj/w               (64, 4, 16)  <- L.self_attn.q_proj.T.reshape(E, N, D)
  layers/{i}/attn/v_proj/w               (64, 2, 16)  <- L.self_attn.v_proj.T.reshape(E, K, D)
  layers/{i}/input_layernorm/w           (64,)        <- L.input_layernorm
  layers/{i}/mlp/down_proj/kernel        (128, 64)    <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel        (64, 128)    <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel          (64, 128)    <- L.mlp.up_proj.T
  layers/{i}/post_attention_layernorm/w  (64,)        <- L.post_attention_layernorm
llama3 untied:
  embedder/input_embedding               (256, 64)    <- model.embed_tokens
  final_norm/w                           (64,)        <- model.norm
  layers/{i}/attn/k_proj/w               (64, 2, 16)  <- L.self_attn.k_proj.T.reshape(E, K, D)
  layers/{i}/attn/o_proj/w               (4, 16, 64)  <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/q_proj/w               (64, 4, 16)  <- L.self_attn.q_proj.T.reshape(E, N, D)
  layers/{i}/attn/v_proj/w               (64, 2, 16)  <- L.self_attn.v_proj.T.reshape(E, K, D)
  layers/{i}/input_layernorm/w           (64,)        <- L.input_layernorm
  layers/{i}/mlp/down_proj/kernel        (128, 64)    <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel        (64, 128)    <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel          (64, 128)    <- L.mlp.up_proj.T
  layers/{i}/post_attention_layernorm/w  (64,)        <- L.post_attention_layernorm
  lm_head/w                              (64, 256)    <- lm_head.T
gemma3 tied:
  embedder/input_embedding              (256, 64)       <- model.embed_tokens
  final_norm/scale                      (64,)           <- model.norm
  layers/{i}/attn/_key_norm/scale       (16,)           <- L.self_attn.k_norm
  layers/{i}/attn/_query_norm/scale     (16,)           <- L.self_attn.q_norm
  layers/{i}/attn/attn_vec_einsum/w     (4, 16, 64)     <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/kv_einsum/w           (2, 2, 64, 16)  <- [b]
  layers/{i}/attn/q_einsum/w            (4, 64, 16)     <- [a]
  layers/{i}/mlp/down_proj/kernel       (128, 64)       <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel       (64, 128)       <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel         (64, 128)       <- L.mlp.up_proj.T
  layers/{i}/post_attention_norm/scale  (64,)           <- L.post_attention_layernorm
  layers/{i}/post_ffw_norm/scale        (64,)           <- L.post_feedforward_layernorm
  layers/{i}/pre_attention_norm/scale   (64,)           <- L.input_layernorm
  layers/{i}/pre_ffw_norm/scale         (64,)           <- L.pre_feedforward_layernorm
gemma3 tied fused_qkv:
  embedder/input_embedding              (256, 64)       <- model.embed_tokens
  final_norm/scale                      (64,)           <- model.norm
  layers/{i}/attn/_key_norm/scale       (16,)           <- L.self_attn.k_norm
  layers/{i}/attn/_query_norm/scale     (16,)           <- L.self_attn.q_norm
  layers/{i}/attn/attn_vec_einsum/w     (4, 16, 64)     <- L.self_attn.o_proj.T.reshape(N, D, E)
  layers/{i}/attn/qkv_einsum/w          (3, 4, 64, 16)  <- [c]
  layers/{i}/mlp/down_proj/kernel       (128, 64)       <- L.mlp.down_proj.T
  layers/{i}/mlp/gate_proj/kernel       (64, 128)       <- L.mlp.gate_proj.T
  layers/{i}/mlp/up_proj/kernel         (64, 128)       <- L.mlp.up_proj.T
  layers/{i}/post_attention_norm/scale  (64,)           <- L.post_attention_layernorm
  layers/{i}/post_ffw_norm/scale        (64,)           <- L.post_feedforward_layernorm
  layers/{i}/pre_attention_norm/scale   (64,)           <- L.input_layernorm
  layers/{i}/pre_ffw_norm/scale         (64,)           <- L.pre_feedforward_layernorm

[a] L.self_attn.q_proj.T.reshape(E, N, D).transpose(1, 0, 2): (N, E, D)
[b] stack([k, v]), each L.self_attn.{k,v}_proj.T.reshape(E, K, D).transpose(1, 0, 2)
[c] stack([q, k, v]), each L.self_attn.{q,k,v}_proj.T.reshape(E, N, D).transpose(1, 0, 2)
END PATHS

What Tunix 0.1.7's loader does beyond the table (the harness tests hold each):

- Qwen 3 and Llama 3 with a tied head have no ``lm_head`` leaf; a ``lm_head.weight`` stored
  anyway is read and dropped, silently. Gemma 3 is always tied: its loader maps a stored
  ``lm_head.weight`` to an ``unused`` key and drops it (:func:`tunix_config` refuses an
  untied Gemma 3 config for that reason). An untied config whose files lack
  ``lm_head.weight`` fails with a pytree structure error, not a missing-key one.
- ``mode="auto"`` (outside Google, without Pathways) is the ``optimized`` loader: it reads
  each file as one array of the dtype of the file's first tensor, so a file mixing dtypes
  (bf16 weights, f32 norms) fails to load (or misreads); ``mode="original"`` reads one
  tensor at a time. Neither casts where ``dtype`` is None: the leaves are as stored,
  whatever the config's ``param_dtype``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np

#: The Tunix release this harness is written against (constraints/test.txt pins it).
TUNIX_VERSION = "0.1.7"
#: Our family names, by the ``model_type`` of a Hugging Face config.
FAMILIES = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "llama": "llama3", "gemma3_text": "gemma3"}
#: Tunix's modules of each family: the model, and the loader from safetensors.
_MODULES = {
    "qwen3": ("tunix.models.qwen3.model", "tunix.models.qwen3.params"),
    "llama3": ("tunix.models.llama3.model", "tunix.models.llama3.params"),
    "gemma3": ("tunix.models.gemma3.model", "tunix.models.gemma3.params_safetensors"),
}
#: What Tunix 0.1.7 warns of under jax 0.10 and flax 0.12 (the suite turns warnings into
#: errors): at import, a jax name; loading, flax's ``sharding=`` and ``State.to_pure_dict``.
_IMPORT_WARNINGS = r"jax\.experimental\.shard_map is deprecated"
_LOAD_WARNINGS = (r"'sharding' is deprecated, use 'out_sharding'", r"`flax\.nnx\.State` will be")

_loaded: types.SimpleNamespace | None = None


def tunix() -> types.SimpleNamespace:
    """Tunix's model modules, as ``tunix().qwen3.model``, ``tunix().qwen3.params`` (the
    same for ``llama3`` and ``gemma3``; gemma3's ``params`` is ``params_safetensors``).

    Imported once, with the package ``__init__`` bypassed. Tunix's model modules set
    ``flax.config.flax_always_shard_variable`` to False when imported; the flag is put
    back as it was (:func:`tunix_load` sets it for its own call only). Raises
    RuntimeError where google-tunix 0.1.7 is not installed: it is a pinned test
    dependency, never a reason to skip."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        version = importlib.metadata.version("google-tunix")
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = importlib.util.find_spec("tunix")  # (Finds the package; runs nothing of it.)
    if version != TUNIX_VERSION or spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"google-tunix {TUNIX_VERSION} is a pinned test dependency, found "
            f"{version or 'none'}: `make venv` installs it (constraints/test.txt)"
        )
    if "tunix" not in sys.modules:
        bare = types.ModuleType("tunix")
        bare.__path__ = list(spec.submodule_search_locations)
        bare.__spec__ = importlib.util.spec_from_loader("tunix", None, is_package=True)
        bare.__spec__.submodule_search_locations = bare.__path__
        sys.modules["tunix"] = bare
    import flax

    always_shard = flax.config.flax_always_shard_variable
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _IMPORT_WARNINGS, DeprecationWarning)
            families = {
                family: types.SimpleNamespace(
                    model=importlib.import_module(model), params=importlib.import_module(params)
                )
                for family, (model, params) in _MODULES.items()
            }
    finally:
        flax.config.update("flax_always_shard_variable", always_shard)
    _loaded = types.SimpleNamespace(**families)
    return _loaded


def family_of(hf_config: dict) -> str:
    """``qwen3``, ``llama3`` or ``gemma3`` for a config's ``model_type``; ValueError else."""
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(
            f"no Tunix model for model_type {model_type!r} (known: {', '.join(FAMILIES)})"
        )
    return FAMILIES[model_type]


def _full_config(hf_config: dict) -> dict:
    """The config as transformers reads it (its defaults filled in, a transformers 4
    ``rope_theta``/``rope_scaling`` read into ``rope_parameters``)."""
    import transformers

    fields = {k: v for k, v in hf_config.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(hf_config["model_type"], **fields).to_dict()


def _require(ok: bool, family: str, what: str) -> None:
    if not ok:
        raise ValueError(f"Tunix's {family} has no {what}")


def _theta(rope: dict) -> int | float:
    """A rope base frequency, an int where it is one (Tunix annotates ``int``)."""
    theta = rope["rope_theta"]
    return int(theta) if float(theta).is_integer() else theta


def _scale(rope: dict, family: str) -> float:
    """Gemma 3's rope scale factor: 1 for default rope, the factor of linear rope."""
    kind = rope.get("rope_type", "default")
    _require(kind in ("default", "linear"), family, f"rope of type {kind!r}")
    return float(rope.get("factor", 1.0)) if kind == "linear" else 1.0


def tunix_config(hf_config: dict) -> Any:
    """Tunix's ``ModelConfig`` of a Hugging Face ``config.json`` (a dict) of model_type
    ``qwen3``, ``llama`` (Llama 3) or ``gemma3_text``, field for field; ValueError for
    another model type, or a feature the Tunix class cannot hold (biases, soft-capping,
    an untied Gemma 3 head, another layer pattern...).

    The stored dtype (``dtype``) becomes the parameter dtype (and Qwen 3's compute dtype);
    Llama 3's config has no dtype field. Tunix's Llama 3 applies plain rope: a ``llama3``
    rope scaling is accepted (as Tunix's Llama 3.2 presets do) and not kept."""
    import jax.numpy as jnp

    family = family_of(hf_config)
    t = tunix()
    c = _full_config(hf_config)
    rope = c["rope_parameters"]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    stored = jnp.dtype(c["dtype"]) if c.get("dtype") else None
    _require(not c.get("attention_bias"), family, "attention biases")
    common = dict(
        num_layers=c["num_hidden_layers"],
        embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"],
        num_heads=c["num_attention_heads"],
        head_dim=head_dim,
        num_kv_heads=c["num_key_value_heads"],
    )
    if family == "qwen3":
        _require(c["hidden_act"] == "silu", family, f"activation {c['hidden_act']!r}")
        _require(not c.get("use_sliding_window"), family, "sliding window")
        _require(rope.get("rope_type", "default") == "default", family, "rope scaling")
        if c["model_type"] == "qwen3_moe":  # (Every layer a mixture: Tunix's MoELayer.)
            every = c.get("decoder_sparse_step", 1) == 1 and not c.get("mlp_only_layers")
            _require(every, family, "dense layers among the experts' (mlp_only_layers)")
            common.update(
                hidden_dim=c["moe_intermediate_size"],
                num_experts=c.get("num_experts") or c["num_local_experts"],
                num_experts_per_tok=c["num_experts_per_tok"],
            )
        return t.qwen3.model.ModelConfig(
            **common,
            vocab_size=c["vocab_size"],
            rope_theta=_theta(rope),
            norm_eps=c["rms_norm_eps"],
            use_tied_embedding=c["tie_word_embeddings"],
            **({"dtype": stored, "param_dtype": stored} if stored else {}),
        )
    if family == "llama3":
        _require(c["hidden_act"] == "silu", family, f"activation {c['hidden_act']!r}")
        _require(not c.get("mlp_bias"), family, "MLP biases")
        kind = rope.get("rope_type", "default")
        _require(kind in ("default", "llama3"), family, f"rope of type {kind!r}")
        return t.llama3.model.ModelConfig(
            **common,
            vocab_size=c["vocab_size"],
            rope_theta=_theta(rope),
            norm_eps=c["rms_norm_eps"],
            weight_tying=c["tie_word_embeddings"],
        )
    # gemma3: the embedding is always the head, every 6th layer global, eps 1e-6.
    model = t.gemma3.model
    _require(c["tie_word_embeddings"], family, "untied head (it drops lm_head.weight)")
    kinds = itertools.islice(
        itertools.cycle(model.GEMMA3_ATTENTION_PATTERN), c["num_hidden_layers"]
    )
    pattern = [
        "full_attention" if kind == model.AttentionType.GLOBAL else "sliding_attention"
        for kind in kinds
    ]
    _require(c["layer_types"] == pattern, family, f"layer pattern {c['layer_types']}")
    _require(c["rms_norm_eps"] == 1e-6, family, f"norm eps {c['rms_norm_eps']} (1e-6 only)")
    _require(not c.get("attn_logit_softcapping"), family, "attention soft-capping")
    _require(not c.get("final_logit_softcapping"), family, "final soft-capping")
    _require(not c.get("use_bidirectional_attention"), family, "bidirectional attention")
    act = c["hidden_activation"]
    _require(act == "gelu_pytorch_tanh", family, f"activation {act!r}")
    norm = model.QueryPreAttentionNormalisation
    scalars = {  # (Where the two are one number, Tunix's default: by head_dim.)
        c["hidden_size"] // c["num_attention_heads"]: (
            norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
        ),
        head_dim: norm.BY_ONE_OVER_SQRT_HEAD_DIM,
    }
    scalar = c["query_pre_attn_scalar"]
    _require(scalar in scalars, family, f"query_pre_attn_scalar {scalar}")
    local, glob = rope["sliding_attention"], rope["full_attention"]
    return model.ModelConfig(
        **common,
        num_embed=c["vocab_size"],
        sliding_window_size=c["sliding_window"],
        local_base_frequency=_theta(local),
        global_base_frequency=_theta(glob),
        local_scale_factor=_scale(local, family),
        global_scale_factor=_scale(glob, family),
        query_pre_attn_norm=scalars[scalar],
        **({"param_dtype": stored} if stored else {}),
    )


def tiny_hf_config(family: str, tied: bool, fused_qkv: bool = False) -> dict:
    """A small transformers 5 config (as ``config.json`` holds it) of ``family``
    (``qwen3``, ``llama3``, ``gemma3``): hidden 64, 2 layers, 4 query heads of 16, 2 KV
    heads (4 with ``fused_qkv``, Gemma 3 only: Tunix then fuses q, k and v into one
    ``qkv_einsum``), MLP 128, vocabulary 256, the head tied where ``tied``."""
    import transformers

    if fused_qkv and family != "gemma3":
        raise ValueError("fused_qkv: only Tunix's Gemma 3 fuses q, k and v")
    # (qwen3_moe: Qwen3-MoE, 4 experts of MLP 32 in every layer, 2 a token.)
    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4 if fused_qkv else 2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    if family == "qwen3":
        config = transformers.Qwen3Config(
            **common,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **common,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    elif family == "llama3":
        # Llama 3.2 1B's rope (its scaling, over a shorter original context).
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        config = transformers.LlamaConfig(
            **common, rms_norm_eps=1e-5, rope_parameters=rope, bos_token_id=1, eos_token_id=2
        )
    elif family == "gemma3":
        # Gemma 3 4B's rope: local 10k, global 1M with linear scaling 8.
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
        }
        config = transformers.Gemma3TextConfig(
            **common,
            rms_norm_eps=1e-6,
            query_pre_attn_scalar=16,
            sliding_window=16,
            rope_parameters=rope,
        )
    else:
        raise ValueError(f"no tiny config for family {family!r}")
    return json.loads(config.to_json_string(use_diff=False))


def write_hf_dir(
    path: str | os.PathLike,
    family: str,
    tied: bool,
    dtype: str = "bfloat16",
    seed: int = 0,
    **kw: Any,
) -> dict:
    """A transformers 5 model of :func:`tiny_hf_config` (``**kw`` goes there), saved
    with ``save_pretrained(path)`` (safetensors) in ``dtype``; its ``config.json``.

    Weights from ``torch.manual_seed(seed)``, every parameter then moved by
    ``0.1 * randn`` (no norm all ones or zeros; an untied head unlike the embedding)."""
    import torch
    import transformers

    hf_config = tiny_hf_config(family, tied, **kw)
    config = transformers.AutoConfig.for_model(**hf_config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():  # (A tied head is the embedding: moved once.)
            param.add_(0.1 * torch.randn_like(param))
    model.to(getattr(torch, dtype)).save_pretrained(path)
    return json.loads((Path(path) / "config.json").read_text())


def tunix_load(
    hf_dir: str | os.PathLike, hf_config: dict, mesh: Any = None, mode: str = "auto"
) -> Any:
    """The NNX model Tunix's own ``create_model_from_safe_tensors`` loads from
    ``hf_dir`` (of :func:`tunix_config` of ``hf_config``), on ``mesh`` where given (its
    axes named as Tunix's sharding configs name them: ``fsdp``, ``tp``); the dtype left
    as stored. ``mode="auto"`` is Tunix's ``optimized`` loader outside Google."""
    from flax import nnx

    loader = getattr(tunix(), family_of(hf_config)).params
    config = tunix_config(hf_config)
    # (Eager sharding off: what Tunix's modules set for the whole process at import.)
    with nnx.use_eager_sharding(False), warnings.catch_warnings():
        for message in _LOAD_WARNINGS:
            warnings.filterwarnings("ignore", message, DeprecationWarning)
        return loader.create_model_from_safe_tensors(
            str(hf_dir), config, mesh=mesh, dtype=None, mode=mode
        )


def tunix_params(model: Any) -> dict:
    """``nnx.to_pure_dict(nnx.state(model, nnx.Param))``, its leaves numpy arrays."""
    import jax
    from flax import nnx

    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def flat_params(model: Any) -> dict[str, np.ndarray]:
    """``{"layers/0/attn/q_proj/w": array}``: :func:`tunix_params`, its paths joined by
    ``/``, in the state's order."""
    flat: dict[str, np.ndarray] = {}

    def walk(tree: Any, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, sub in tree.items():
                walk(sub, f"{prefix}{key}/")
        else:
            flat[prefix[:-1]] = tree

    walk(tunix_params(model), "")
    return flat
