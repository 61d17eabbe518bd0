"""Tiny Hugging Face models and their MaxText checkpoints, converted as MaxText converts them.

Regenerate from the repository root (nothing is downloaded; about 10 s)::

    make maxtext-fixtures   # HF_HUB_OFFLINE=1 .venv/bin/python tests/data/maxtext/make_fixture.py

or only some of them, by id (the others' folders and manifest entries are left as
they are)::

    HF_HUB_OFFLINE=1 .venv/bin/python tests/data/maxtext/make_fixture.py mixtral qwen3_moe

For each model below (the folder name is its id) the script builds the PyTorch model
from a small config in code (float32, but Mixtral's bfloat16; ``torch.manual_seed(0)``,
the RMS norms' weights drawn at random too, so that the norm mapping is seen), and
writes into ``<id>/``:

- ``hf/``: ``save_pretrained`` (``config.json``, ``generation_config.json``,
  ``model.safetensors``);
- ``maxtext/0/items/``: the model's weights converted to MaxText's layout by the
  MaxText script named in :data:`MODELS`, re-implemented below line by line (this
  file does not import jaxshare), and written by plain Orbax
  (``ocp.StandardCheckpointer().save``) as the ``TrainState`` MaxText's converters
  save: ``{"step": 0, "params": {"params": weights}}``, at ``<dir>/0/items`` where
  MaxText's ``to_maxtext.py`` writes it;
- ``input_ids.npy`` and ``logits.npy``: fixed token ids (int64, ``(2, 8)``) and the
  logits on them (float32) of the model ``hf/`` loads as (``from_pretrained``).

``manifest.json`` records, per id, the MaxText model the conversion stands for, the
script it follows, whether RoPE is permuted, MaxText's vocabulary size and every
leaf's path, shape and dtype. Everything but Orbax's own metadata (timestamps) is
identical from run to run.

Where the scripts are followed, and how this differs from running them (MaxText needs
TPU-era JAX and its own configs, not installed here): the dense models' arrays stay
float32 (the scripts cast to bfloat16 by default: ``--save_dtype``, ``CAST_DTYPE``;
Mixtral's are bfloat16 as that default makes them, Qwen3-MoE's float32 as
``--save_dtype float32`` keeps them), the MaxText model's leaf shapes are written
out (``moe_shapes``) where ``to_maxtext.py`` reads them from the model, and the
tree is saved directly rather than through MaxText's ``CheckpointManager`` (which
writes the same PyTree item under ``0/items``). Paths are
``src/maxtext/checkpoint_conversion/...`` of github.com/AI-Hypercomputer/maxtext.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import torch
import transformers
from safetensors import safe_open

HERE = Path(__file__).resolve().parent
CAST_DTYPE = np.float32  # llama_or_mistral_ckpt.py: ml_dtypes.bfloat16; kept float32 here.
PARAM_SCAN_AXIS = 1  # configs/base.yml: param_scan_axis: 1 (scan_layers: true).

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=96,
    vocab_size=128,
    dtype="float32",
)


def small_config(
    config_class: type,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tied: bool,
    positions: int = 128,
    **more,
) -> transformers.PretrainedConfig:
    """A :data:`SMALL` model of ``config_class``; ``more``: further config fields."""
    return config_class(
        **SMALL,
        **more,
        max_position_embeddings=positions,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tied,
    )


def llama_config(tied: bool) -> transformers.PretrainedConfig:
    return small_config(
        transformers.LlamaConfig,
        heads=4,
        kv_heads=2,
        head_dim=16,
        tied=tied,
        positions=16384,  # (Llama 3's RoPE scales beyond the original 8192.)
        rope_parameters=dict(LLAMA3_ROPE),
    )


def mistral_config() -> transformers.PretrainedConfig:
    # head_dim 8: sqrt(8) is not a power of two, so the query's scaling rounds.
    return small_config(transformers.MistralConfig, heads=8, kv_heads=2, head_dim=8, tied=False)


def gemma_config() -> transformers.PretrainedConfig:
    return small_config(transformers.GemmaConfig, heads=4, kv_heads=1, head_dim=16, tied=True)


#: The mixtures of experts: smaller than SMALL, 4 experts and 3 layers (so that the
#: experts' axis and the layers' cannot be confused).
MOE = dict(
    hidden_size=32,
    num_hidden_layers=3,
    vocab_size=96,
    max_position_embeddings=128,
    num_experts_per_tok=2,
    tie_word_embeddings=False,
)


def mixtral_config() -> transformers.PretrainedConfig:
    # bfloat16, to_maxtext.py's default --save_dtype; head_dim 16: the query's scale is exact.
    return transformers.MixtralConfig(
        **MOE,
        intermediate_size=24,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_local_experts=4,
        dtype="bfloat16",
    )


def qwen3_moe_config() -> transformers.PretrainedConfig:
    # float32 (--save_dtype float32); 4 heads of 16: the query is (64, 32), not square.
    return transformers.Qwen3MoeConfig(
        **MOE,
        intermediate_size=48,
        moe_intermediate_size=24,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        mlp_only_layers=[],
        decoder_sparse_step=1,
        dtype="float32",
    )


# ---------------------------------------------------------------------------------------
# 1. LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN(saving_to_hf=False), utils/param_mapping.py, as
#    to_maxtext.py applies it: each HF tensor through its hook chain (reversed for
#    to_maxtext), with the per-layer MaxText shape as target_shape, then
#    _build_single_axis_stacked_tensor: np.stack(tensors, axis=config.param_scan_axis).
#    Names: LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING(scan_layers=True). The MaxText models:
#    llama3.1-8b (untied); a tied one is the same model with logits_via_embedding: true,
#    whose state has no logits_dense, so validate_and_filter_param_map_keys
#    (utils/utils.py) skips "params-decoder-logits_dense-kernel".
# ---------------------------------------------------------------------------------------


def llama31_to_maxtext(hf: dict[str, np.ndarray], cfg: dict, tied: bool) -> dict[str, np.ndarray]:
    head_dim = cfg["head_dim"]
    emb = cfg["hidden_size"]

    def scale_query_layer(input_tensor, target_shape):  # saving_to_hf=False branch
        depth_scale = np.dtype("float32").type(1 / np.sqrt(head_dim))
        original_dtype = input_tensor.dtype
        output_tensor = input_tensor.astype(np.float32) * depth_scale
        return output_tensor.astype(original_dtype)

    def adjust_rope(input_tensor, target_shape):  # HF's concatenated -> MaxText's interleaved
        arr = input_tensor
        half_dim = arr.shape[-1] // 2
        first_half = arr[..., :half_dim]
        second_half = arr[..., half_dim:]
        return np.stack([first_half, second_half], axis=-1).reshape(arr.shape)

    def reshape_kernel(input_tensor, target_shape):
        return input_tensor.transpose().reshape(target_shape)

    query_hook_chain = [scale_query_layer, adjust_rope, reshape_kernel]
    key_hook_chain = [adjust_rope, reshape_kernel]
    query_hook_chain.reverse()  # to_maxtext
    key_hook_chain.reverse()

    out = {
        "token_embedder/embedding": hf["model.embed_tokens.weight"],
        "decoder/decoder_norm/scale": hf["model.norm.weight"],
        **_scanned_layers(
            hf,
            cfg,
            query=query_hook_chain,
            key=key_hook_chain,
            kernel=reshape_kernel,
            norm=[],  # no hook: the norms' weights as they are
            norms=("pre_self_attention_layer_norm", "post_self_attention_layer_norm"),
        ),
    }
    if not tied:
        out["decoder/logits_dense/kernel"] = reshape_kernel(
            hf["lm_head.weight"], (emb, cfg["vocab_size"])
        )
    return out


# ---------------------------------------------------------------------------------------
# 2. _convert_huggingface_to_jax_weights, standalone_scripts/llama_or_mistral_ckpt.py,
#    model_size "mistral-7b" (--huggingface-checkpoint true): the HF names renamed by
#    _hf_to_maxtext_mapping (gate_proj -> w1, up_proj -> w2, down_proj -> w3), every
#    kernel transposed, q/k/v/o reshaped with the embedding written
#    base_num_query_heads * head_dim, stacked on axis 0 then transposed to
#    (embed, layer, ...), no RoPE permutation (model_size[:8] != "llama3.1"), and the
#    query kernel divided by np.sqrt(head_dim).astype(CAST_DTYPE).
# ---------------------------------------------------------------------------------------


def mistral_to_maxtext(hf: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    base_num_decoder_layers = cfg["num_hidden_layers"]
    base_num_query_heads = cfg["num_attention_heads"]
    head_dim = cfg["head_dim"]
    base_num_kv_heads = cfg["num_key_value_heads"]
    vocab_size = cfg["vocab_size"]
    assert base_num_query_heads * head_dim == cfg["hidden_size"]  # as the script assumes

    chkpt_vars = {}
    for key, value in hf.items():  # _hf_to_maxtext_mapping
        parts = key.split(".")
        layer = int(parts[2]) if "layers" in key else 0
        chkpt_vars[_hf_to_maxtext_mapping(layer)[key]] = value

    jax_weights: dict = {
        "decoder": {
            "layers": {
                "pre_self_attention_layer_norm": {"scale": None},
                "post_self_attention_layer_norm": {"scale": None},
                "self_attention": {
                    "query": {"kernel": None},
                    "key": {"kernel": None},
                    "value": {"kernel": None},
                    "out": {"kernel": None},
                },
                "mlp": {"wi_0": {"kernel": None}, "wi_1": {"kernel": None}, "wo": {"kernel": None}},
            },
            "decoder_norm": {"scale": None},
            "logits_dense": {"kernel": None},
        },
        "token_embedder": {"embedding": None},
    }
    jax_weights["decoder"]["decoder_norm"]["scale"] = chkpt_vars["norm.weight"].astype(CAST_DTYPE)
    jax_weights["decoder"]["logits_dense"]["kernel"] = (
        chkpt_vars["output.weight"].astype(CAST_DTYPE).transpose()[:, :vocab_size]
    )
    jax_weights["token_embedder"]["embedding"] = chkpt_vars["tok_embeddings.weight"].astype(
        CAST_DTYPE
    )[:vocab_size, :]

    self_attention = jax_weights["decoder"]["layers"]["self_attention"]
    stack_shape = (base_num_decoder_layers,)
    for layer_idx in range(base_num_decoder_layers):
        wq = chkpt_vars[f"layers.{layer_idx}.attention.wq.weight"].astype(CAST_DTYPE).transpose()
        wk = chkpt_vars[f"layers.{layer_idx}.attention.wk.weight"].astype(CAST_DTYPE).transpose()
        wv = chkpt_vars[f"layers.{layer_idx}.attention.wv.weight"].astype(CAST_DTYPE).transpose()
        wq = np.reshape(wq, [base_num_query_heads * head_dim, base_num_query_heads, head_dim])
        wk = np.reshape(wk, [base_num_query_heads * head_dim, base_num_kv_heads, head_dim])
        wv = np.reshape(wv, [base_num_query_heads * head_dim, base_num_kv_heads, head_dim])
        w_post = chkpt_vars[f"layers.{layer_idx}.attention.wo.weight"].astype(CAST_DTYPE)
        w_post = np.reshape(
            w_post, [base_num_query_heads * head_dim, base_num_query_heads, head_dim]
        )
        if self_attention["query"]["kernel"] is None:
            self_attention["query"]["kernel"] = np.zeros(stack_shape + wq.shape, dtype=CAST_DTYPE)
            self_attention["key"]["kernel"] = np.zeros(stack_shape + wk.shape, dtype=CAST_DTYPE)
            self_attention["value"]["kernel"] = np.zeros(stack_shape + wv.shape, dtype=CAST_DTYPE)
            self_attention["out"]["kernel"] = np.zeros(stack_shape + w_post.shape, dtype=CAST_DTYPE)
        self_attention["query"]["kernel"][layer_idx, ...] = wq
        self_attention["key"]["kernel"][layer_idx, ...] = wk
        self_attention["value"]["kernel"][layer_idx, ...] = wv
        self_attention["out"]["kernel"][layer_idx, ...] = w_post
    self_attention["query"]["kernel"] = np.transpose(
        self_attention["query"]["kernel"], axes=(1, 0, 2, 3)
    )
    self_attention["key"]["kernel"] = np.transpose(
        self_attention["key"]["kernel"], axes=(1, 0, 2, 3)
    )
    self_attention["value"]["kernel"] = np.transpose(
        self_attention["value"]["kernel"], axes=(1, 0, 2, 3)
    )
    self_attention["out"]["kernel"] = np.transpose(
        self_attention["out"]["kernel"], axes=(2, 0, 3, 1)
    )
    self_attention["query"]["kernel"] = self_attention["query"]["kernel"] / (
        np.sqrt(head_dim).astype(CAST_DTYPE)
    )

    layer_weight = jax_weights["decoder"]["layers"]
    for layer_idx in range(base_num_decoder_layers):
        pre = chkpt_vars[f"layers.{layer_idx}.attention_norm.weight"].astype(CAST_DTYPE)
        post = chkpt_vars[f"layers.{layer_idx}.ffn_norm.weight"].astype(CAST_DTYPE)
        if layer_weight["pre_self_attention_layer_norm"]["scale"] is None:
            layer_weight["pre_self_attention_layer_norm"]["scale"] = np.zeros(
                stack_shape + pre.shape, dtype=CAST_DTYPE
            )
            layer_weight["post_self_attention_layer_norm"]["scale"] = np.zeros(
                stack_shape + post.shape, dtype=CAST_DTYPE
            )
        layer_weight["pre_self_attention_layer_norm"]["scale"][layer_idx, ...] = pre
        layer_weight["post_self_attention_layer_norm"]["scale"][layer_idx, ...] = post
    for norm in ("pre_self_attention_layer_norm", "post_self_attention_layer_norm"):
        layer_weight[norm]["scale"] = np.transpose(layer_weight[norm]["scale"], axes=(1, 0))

    for layer_idx in range(base_num_decoder_layers):
        wi_0 = (
            chkpt_vars[f"layers.{layer_idx}.feed_forward.w1.weight"].astype(CAST_DTYPE).transpose()
        )
        wi_1 = (
            chkpt_vars[f"layers.{layer_idx}.feed_forward.w2.weight"].astype(CAST_DTYPE).transpose()
        )
        wo = chkpt_vars[f"layers.{layer_idx}.feed_forward.w3.weight"].astype(CAST_DTYPE).transpose()
        if layer_weight["mlp"]["wi_0"]["kernel"] is None:
            layer_weight["mlp"]["wi_0"]["kernel"] = np.zeros(
                stack_shape + wi_0.shape, dtype=CAST_DTYPE
            )
            layer_weight["mlp"]["wi_1"]["kernel"] = np.zeros(
                stack_shape + wi_1.shape, dtype=CAST_DTYPE
            )
            layer_weight["mlp"]["wo"]["kernel"] = np.zeros(stack_shape + wo.shape, dtype=CAST_DTYPE)
        layer_weight["mlp"]["wi_0"]["kernel"][layer_idx, ...] = wi_0
        layer_weight["mlp"]["wi_1"]["kernel"][layer_idx, ...] = wi_1
        layer_weight["mlp"]["wo"]["kernel"][layer_idx, ...] = wo
    for w in ("wi_0", "wi_1", "wo"):
        layer_weight["mlp"][w]["kernel"] = np.transpose(
            layer_weight["mlp"][w]["kernel"], axes=(1, 0, 2)
        )
    return _flat(jax_weights)


def _hf_to_maxtext_mapping(layer_idx: int) -> dict[str, str]:
    """llama_or_mistral_ckpt.py ``_hf_to_maxtext_mapping``: the entries a dense model uses."""
    hf, meta = f"model.layers.{layer_idx}.", f"layers.{layer_idx}."
    return {
        "model.embed_tokens.weight": "tok_embeddings.weight",
        "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight",
        f"{hf}input_layernorm.weight": f"{meta}attention_norm.weight",
        f"{hf}post_attention_layernorm.weight": f"{meta}ffn_norm.weight",
        f"{hf}self_attn.q_proj.weight": f"{meta}attention.wq.weight",
        f"{hf}self_attn.k_proj.weight": f"{meta}attention.wk.weight",
        f"{hf}self_attn.v_proj.weight": f"{meta}attention.wv.weight",
        f"{hf}self_attn.o_proj.weight": f"{meta}attention.wo.weight",
        f"{hf}mlp.gate_proj.weight": f"{meta}feed_forward.w1.weight",
        f"{hf}mlp.up_proj.weight": f"{meta}feed_forward.w2.weight",
        f"{hf}mlp.down_proj.weight": f"{meta}feed_forward.w3.weight",
    }


# ---------------------------------------------------------------------------------------
# 3. Gemma (1) from HF. MaxText has no HF -> MaxText script for Gemma 1 (only
#    standalone_scripts/convert_gemma_chkpt.py, from the original Flax checkpoint), so
#    this composes the two it has: convert_gemma_chkpt.py's tree and names
#    (pre_self_attention_norm, pre_ffw_norm, no logits_dense: gemma-*.yml has
#    logits_via_embedding: true) with GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN
#    (saving_to_hf=False), utils/param_mapping.py, for the values: reshape_kernel,
#    scale_query_layer, scale_rmsnorm_layer and pad_hf_embedding_layer (MaxText pads
#    the vocabulary: 256000 -> 256128 there, 128 -> MAXTEXT_GEMMA_VOCAB here).
#    convert_gemma_chkpt.py agrees: every norm "scale + 1", the embedding
#    "* jnp.sqrt(embed_dim)", the query "* head_dim**-0.5".
# ---------------------------------------------------------------------------------------

MAXTEXT_GEMMA_VOCAB = 160


def gemma_to_maxtext(hf: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    emb = cfg["hidden_size"]

    def pad_hf_embedding_layer(input_tensor, target_shape):
        normalizer = np.dtype("float32").type(cfg["hidden_size"] ** 0.5)
        target_tensor = np.zeros(target_shape, dtype=input_tensor.dtype)
        target_tensor[: input_tensor.shape[0], : input_tensor.shape[1]] = input_tensor
        target_tensor = target_tensor * normalizer
        target_tensor = target_tensor.astype(input_tensor.dtype)
        return target_tensor

    def reshape_kernel(input_tensor, target_shape):
        return input_tensor.T.reshape(target_shape)

    def scale_rmsnorm_layer(input_tensor, target_shape):
        return (input_tensor + 1.0).reshape(target_shape)

    def scale_query_layer(input_tensor, target_shape):
        depth_scale = np.dtype("float32").type(1 / np.sqrt(cfg["head_dim"]))
        return (input_tensor * depth_scale).astype(input_tensor.dtype)

    query_hook_chain = [reshape_kernel, scale_query_layer]

    return {
        "token_embedder/embedding": pad_hf_embedding_layer(
            hf["model.embed_tokens.weight"], (MAXTEXT_GEMMA_VOCAB, emb)
        ),
        "decoder/decoder_norm/scale": scale_rmsnorm_layer(hf["model.norm.weight"], (emb,)),
        **_scanned_layers(
            hf,
            cfg,
            query=query_hook_chain,
            key=reshape_kernel,
            kernel=reshape_kernel,
            norm=scale_rmsnorm_layer,
            norms=("pre_self_attention_norm", "pre_ffw_norm"),
        ),
    }


# ---------------------------------------------------------------------------------------
# 4. and 5. The mixtures of experts, as to_maxtext.py converts them (main, eager mode):
#    PARAM_MAPPING[model](hf_config, config, scan_layers=True) and
#    HOOK_FNS[model](..., saving_to_hf=False), utils/param_mapping.py; each MaxText key
#    the model has (validate_and_filter_param_map_keys, utils/utils.py, skips the
#    others) loaded by _get_hf_loading_function: one HF key through its hooks (case 1),
#    a list stacked by _build_single_axis_stacked_tensor on param_scan_axis (case 2),
#    a nested list (experts outer, layers inner) by _build_multi_axis_stacked_tensor
#    on axes 0 and 1 (case 4), each tensor from _eager_getter (bfloat16 through
#    float32 to ml_dtypes.bfloat16, or float32 as it is: --save_dtype) and hooked with
#    its slice of the MaxText shape (get_maxtext_model_info's, written out below).
# ---------------------------------------------------------------------------------------


def mixtral_mapping(config: dict, num_experts: int) -> dict:
    """MIXTRAL_MAXTEXT_TO_HF_PARAM_MAPPING, its scan_layers branch."""
    mapping: dict = {}
    mapping["params-token_embedder-embedding"] = "model.embed_tokens.weight"
    mapping["params-decoder-decoder_norm-scale"] = "model.norm.weight"
    mapping["params-decoder-logits_dense-kernel"] = "lm_head.weight"
    mapping.update(
        {
            "params-decoder-layers-self_attention-query-kernel": [],
            "params-decoder-layers-self_attention-key-kernel": [],
            "params-decoder-layers-self_attention-value-kernel": [],
            "params-decoder-layers-self_attention-out-kernel": [],
            "params-decoder-layers-pre_self_attention_layer_norm-scale": [],
            "params-decoder-layers-post_self_attention_layer_norm-scale": [],
            "params-decoder-layers-MoeBlock_0-gate-kernel": [],
            "params-decoder-layers-MoeBlock_0-wi_0": [],
            "params-decoder-layers-MoeBlock_0-wi_1": [],
            "params-decoder-layers-MoeBlock_0-wo": [],
        }
    )
    for i in range(config["num_hidden_layers"]):
        hf_prefix = f"model.layers.{i}"
        mapping["params-decoder-layers-self_attention-query-kernel"].append(
            f"{hf_prefix}.self_attn.q_proj.weight"
        )
        mapping["params-decoder-layers-self_attention-key-kernel"].append(
            f"{hf_prefix}.self_attn.k_proj.weight"
        )
        mapping["params-decoder-layers-self_attention-value-kernel"].append(
            f"{hf_prefix}.self_attn.v_proj.weight"
        )
        mapping["params-decoder-layers-self_attention-out-kernel"].append(
            f"{hf_prefix}.self_attn.o_proj.weight"
        )
        mapping["params-decoder-layers-pre_self_attention_layer_norm-scale"].append(
            f"{hf_prefix}.input_layernorm.weight"
        )
        mapping["params-decoder-layers-post_self_attention_layer_norm-scale"].append(
            f"{hf_prefix}.post_attention_layernorm.weight"
        )
        mapping["params-decoder-layers-MoeBlock_0-gate-kernel"].append(
            f"{hf_prefix}.block_sparse_moe.gate.weight"
        )
    for j in range(num_experts):  # (Experts outer, layers inner.)
        w1_layers, w3_layers, w2_layers = [], [], []
        for i in range(config["num_hidden_layers"]):
            hf_prefix = f"model.layers.{i}"
            w1_layers.append(f"{hf_prefix}.block_sparse_moe.experts.{j}.w1.weight")
            w3_layers.append(f"{hf_prefix}.block_sparse_moe.experts.{j}.w3.weight")
            w2_layers.append(f"{hf_prefix}.block_sparse_moe.experts.{j}.w2.weight")
        mapping["params-decoder-layers-MoeBlock_0-wi_0"].append(w1_layers)
        mapping["params-decoder-layers-MoeBlock_0-wi_1"].append(w3_layers)
        mapping["params-decoder-layers-MoeBlock_0-wo"].append(w2_layers)
    return mapping


def mixtral_hooks(config: dict, head_dim: int) -> dict:
    """MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN(scan_layers=True, saving_to_hf=False)."""

    def reshape_and_transpose_attention(x, target_shape):
        return x.transpose().reshape(target_shape)  # (N*D, H) -> (H, N*D) -> (H, N, D)

    def reshape_kernel(x, target_shape):
        return x.transpose()

    def scale_query_layer(input_tensor, target_shape):
        depth_scale = np.dtype("float32").type(1 / np.sqrt(head_dim))
        return (input_tensor * depth_scale).astype(input_tensor.dtype)

    query_hook_chain = [reshape_and_transpose_attention, scale_query_layer]
    return {
        "params-decoder-layers-self_attention-query-kernel": query_hook_chain,
        "params-decoder-layers-self_attention-key-kernel": reshape_and_transpose_attention,
        "params-decoder-layers-self_attention-value-kernel": reshape_and_transpose_attention,
        "params-decoder-layers-self_attention-out-kernel": reshape_and_transpose_attention,
        "params-decoder-layers-MoeBlock_0-wi_0": reshape_kernel,
        "params-decoder-layers-MoeBlock_0-wi_1": reshape_kernel,
        "params-decoder-layers-MoeBlock_0-wo": reshape_kernel,
        "params-decoder-layers-MoeBlock_0-gate-kernel": reshape_kernel,
        "params-decoder-logits_dense-kernel": reshape_kernel,
    }


def qwen_mapping(config: dict) -> dict:
    """QWEN_MAXTEXT_TO_HF_PARAM_MAPPING, its scan_layers branch with num_experts > 1."""
    n_layers = config["num_hidden_layers"]
    num_experts = config.get("num_experts", config.get("num_local_experts", 0))
    mapping: dict = {
        "params-token_embedder-embedding": "model.embed_tokens.weight",
        "params-decoder-decoder_norm-scale": "model.norm.weight",
        "params-decoder-logits_dense-kernel": "lm_head.weight",
    }
    layers = {
        "pre_self_attention_layer_norm-scale": "input_layernorm.weight",
        "self_attention-query-kernel": "self_attn.q_proj.weight",
        "self_attention-key-kernel": "self_attn.k_proj.weight",
        "self_attention-value-kernel": "self_attn.v_proj.weight",
        "self_attention-query-bias": "self_attn.q_proj.bias",
        "self_attention-key-bias": "self_attn.k_proj.bias",
        "self_attention-value-bias": "self_attn.v_proj.bias",
        "self_attention-out-kernel": "self_attn.o_proj.weight",
        "self_attention-query_norm-scale": "self_attn.q_norm.weight",
        "self_attention-key_norm-scale": "self_attn.k_norm.weight",
        "post_self_attention_layer_norm-scale": "post_attention_layernorm.weight",
    }
    for key, hf in layers.items():
        mapping[f"params-decoder-layers-{key}"] = [
            f"model.layers.{i}.{hf}" for i in range(n_layers)
        ]
    assert num_experts > 1
    mapping["params-decoder-layers-moe_block-gate-kernel"] = [
        f"model.layers.{i}.mlp.gate.weight" for i in range(n_layers)
    ]
    for key, hf in (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")):
        mapping[f"params-decoder-layers-moe_block-{key}"] = [
            [f"model.layers.{i}.mlp.experts.{e}.{hf}.weight" for i in range(n_layers)]
            for e in range(num_experts)
        ]
    return mapping


def qwen_hooks(config: dict) -> dict:
    """QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN(scan_layers=True, saving_to_hf=False)."""

    def pad_embedding_layer(input_tensor, target_shape):
        source_vocab_size = input_tensor.shape[0]
        target_vocab_size = target_shape[0]
        if source_vocab_size == target_vocab_size:
            return input_tensor
        padded_tensor = np.zeros(target_shape, dtype=input_tensor.dtype)
        padded_tensor[:source_vocab_size, :] = input_tensor
        return padded_tensor

    def reshape_kernel(input_tensor, target_shape):
        return input_tensor.T.reshape(target_shape)

    def reshape_expert_kernel(input_tensor, target_shape=None):
        if input_tensor.ndim == 3:
            return input_tensor.transpose(0, 2, 1)
        return input_tensor.transpose(1, 0)

    def reshape_bias(input_tensor, target_shape=None):
        return input_tensor.reshape(target_shape)

    mapping = {
        "params-token_embedder-embedding": pad_embedding_layer,
        "params-decoder-logits_dense-kernel": reshape_kernel,
    }
    for key in ("query", "key", "value", "out"):
        mapping[f"params-decoder-layers-self_attention-{key}-kernel"] = reshape_kernel
    for key in ("mlp-wi_0-kernel", "mlp-wi_1-kernel", "mlp-wo-kernel"):
        mapping[f"params-decoder-layers-{key}"] = reshape_kernel
    for key in ("query", "key", "value"):
        mapping[f"params-decoder-layers-self_attention-{key}-bias"] = reshape_bias
    for key in ("gate-kernel", "wi_0-kernel", "wi_1-kernel", "wo-kernel"):
        mapping[f"params-decoder-layers-moe_block-{key}"] = reshape_kernel
    for key in ("wi_0", "wi_1", "wo"):
        mapping[f"params-decoder-layers-moe_block-{key}"] = reshape_expert_kernel
    return mapping


def moe_shapes(cfg: dict, block: str, experts: int, mlp: int) -> dict[str, tuple[int, ...]]:
    """The MaxText model's scanned leaves and shapes (what get_maxtext_model_info reads
    from the model: layers/mixtral.py or qwen3.py, layers/moe.py), by MaxText key."""
    emb, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s = PARAM_SCAN_AXIS

    def scanned(*shape: int) -> tuple[int, ...]:
        return (*shape[:s], layers, *shape[s:])

    shapes = {
        "params-token_embedder-embedding": (vocab, emb),
        "params-decoder-decoder_norm-scale": (emb,),
        "params-decoder-logits_dense-kernel": (emb, vocab),
        "params-decoder-layers-self_attention-query-kernel": scanned(emb, heads, head_dim),
        "params-decoder-layers-self_attention-key-kernel": scanned(emb, kv, head_dim),
        "params-decoder-layers-self_attention-value-kernel": scanned(emb, kv, head_dim),
        "params-decoder-layers-self_attention-out-kernel": scanned(heads, head_dim, emb),
        "params-decoder-layers-pre_self_attention_layer_norm-scale": scanned(emb),
        "params-decoder-layers-post_self_attention_layer_norm-scale": scanned(emb),
        f"params-decoder-layers-{block}-gate-kernel": scanned(emb, experts),
        f"params-decoder-layers-{block}-wi_0": (experts, layers, emb, mlp),
        f"params-decoder-layers-{block}-wi_1": (experts, layers, emb, mlp),
        f"params-decoder-layers-{block}-wo": (experts, layers, mlp, emb),
    }
    if block == "moe_block":  # (Qwen3's use_qk_norm.)
        shapes["params-decoder-layers-self_attention-query_norm-scale"] = scanned(head_dim)
        shapes["params-decoder-layers-self_attention-key_norm-scale"] = scanned(head_dim)
    return shapes


def to_maxtext(
    hf: dict[str, np.ndarray], mapping: dict, hooks: dict, shapes: dict
) -> dict[str, np.ndarray]:
    """to_maxtext.py's weight transformation, eager: each MaxText key of ``shapes``
    (validate_and_filter_param_map_keys) loaded by its form of HF keys."""

    def tensor_getter(key):  # _eager_getter (hf: already in the save dtype)
        return hf[key]

    def single_axis(hf_source_keys, hook_fns, target_shape):  # _build_single_axis_stacked_tensor
        axis_to_stack = PARAM_SCAN_AXIS  # config.scan_layers
        mt_slice_shape_list = list(target_shape)
        del mt_slice_shape_list[axis_to_stack]
        mt_slice_shape = tuple(mt_slice_shape_list)
        tensors_to_stack = [
            _apply_hooks(hook_fns, tensor_getter(key), mt_slice_shape) for key in hf_source_keys
        ]
        return np.stack(tensors_to_stack, axis=axis_to_stack)

    def multi_axis(hf_source_keys, hook_fns, target_shape):  # _build_multi_axis_stacked_tensor
        outer_axis, inner_axis = 0, 1  # (MoE: experts, layers at the leading axes.)
        stacked_axes = {outer_axis, inner_axis}
        mt_slice_shape = tuple(d for i, d in enumerate(target_shape) if i not in stacked_axes)
        all_outer_tensors = []
        for inner_keys in hf_source_keys:
            inner_tensors = [
                _apply_hooks(hook_fns, tensor_getter(key), mt_slice_shape) for key in inner_keys
            ]
            all_outer_tensors.append(np.stack(inner_tensors, axis=0))
        return np.stack(all_outer_tensors, axis=0)

    out = {}
    for mt_key, hf_keys in mapping.items():
        if mt_key not in shapes:
            continue  # validate_and_filter_param_map_keys: not in the model
        hook, target = hooks.get(mt_key), shapes[mt_key]
        if not isinstance(hf_keys, list):  # case 1
            weight = _apply_hooks(hook, tensor_getter(hf_keys), target)
        elif not isinstance(hf_keys[0], list):  # case 2
            weight = single_axis(hf_keys, hook, target)
        else:  # case 4
            weight = multi_axis(hf_keys, hook, target)
        assert weight.shape == target, (mt_key, weight.shape, target)  # _get_maxtext_weight
        out[mt_key.removeprefix("params-").replace("-", "/")] = weight
    assert len(out) == len(shapes)  # (Every leaf of the model mapped.)
    return out


def mixtral_to_maxtext(hf: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    experts = cfg["num_local_experts"]  # (MaxText: num_experts, from mixtral-8x7b.yml.)
    shapes = moe_shapes(cfg, "MoeBlock_0", experts, cfg["intermediate_size"])
    return to_maxtext(
        hf, mixtral_mapping(cfg, experts), mixtral_hooks(cfg, cfg["head_dim"]), shapes
    )


def qwen3_moe_to_maxtext(hf: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    experts = cfg.get("num_experts", cfg.get("num_local_experts", 0))
    shapes = moe_shapes(cfg, "moe_block", experts, cfg["moe_intermediate_size"])
    return to_maxtext(hf, qwen_mapping(cfg), qwen_hooks(cfg), shapes)


def _scanned_layers(
    hf: dict[str, np.ndarray], cfg: dict, *, query, key, kernel, norm, norms: tuple[str, str]
) -> dict[str, np.ndarray]:
    """The decoder's scanned layers, as utils/param_mapping.py's hooks and to_maxtext.py
    make them: each layer's HF tensor through its hook chain (``query`` for q_proj, ``key``
    for k_proj, ``kernel`` for the other kernels, ``norm`` for the two norms, named
    ``norms`` in MaxText), with the per-layer MaxText shape as target_shape, then
    _build_single_axis_stacked_tensor: np.stack(tensors, axis=config.param_scan_axis)."""
    emb, head_dim, f = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    pre_norm, post_norm = norms
    #: MaxText name -> (HF name in each layer, hook chain, per-layer MaxText shape).
    table = {
        "self_attention/query/kernel": ("self_attn.q_proj.weight", query, (emb, heads, head_dim)),
        "self_attention/key/kernel": ("self_attn.k_proj.weight", key, (emb, kv, head_dim)),
        "self_attention/value/kernel": ("self_attn.v_proj.weight", kernel, (emb, kv, head_dim)),
        "self_attention/out/kernel": ("self_attn.o_proj.weight", kernel, (heads, head_dim, emb)),
        "mlp/wi_0/kernel": ("mlp.gate_proj.weight", kernel, (emb, f)),
        "mlp/wi_1/kernel": ("mlp.up_proj.weight", kernel, (emb, f)),
        "mlp/wo/kernel": ("mlp.down_proj.weight", kernel, (f, emb)),
        f"{pre_norm}/scale": ("input_layernorm.weight", norm, (emb,)),
        f"{post_norm}/scale": ("post_attention_layernorm.weight", norm, (emb,)),
    }
    return {
        f"decoder/layers/{name}": np.stack(
            [
                _apply_hooks(hooks, hf[f"model.layers.{i}.{hf_name}"], target_shape)
                for i in range(cfg["num_hidden_layers"])
            ],
            axis=PARAM_SCAN_AXIS,
        )
        for name, (hf_name, hooks, target_shape) in table.items()
    }


def _apply_hooks(hooks, x, target_shape):  # tensor_handling.apply_hook_fns
    if hooks is None:
        return x
    for hook in hooks if isinstance(hooks, list) else [hooks]:
        x = hook(x, target_shape)
    return x


def _flat(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key in sorted(tree):
        value = tree[key]
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _nest(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = np.ascontiguousarray(value)
    return tree


#: id -> (config, model class, converter, MaxText model it stands for, script, RoPE permuted).
MODELS: dict[str, tuple[Callable, type, Callable, str, str, bool]] = {
    "llama": (
        lambda: llama_config(tied=False),
        transformers.LlamaForCausalLM,
        lambda hf, cfg: llama31_to_maxtext(hf, cfg, tied=False),
        "llama3.1-8b",
        "utils/param_mapping.py LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN (to_maxtext.py)",
        True,
    ),
    "llama_tied": (
        lambda: llama_config(tied=True),
        transformers.LlamaForCausalLM,
        lambda hf, cfg: llama31_to_maxtext(hf, cfg, tied=True),
        "llama3.1 with logits_via_embedding: true, normalize_embedding_logits: false",
        "utils/param_mapping.py LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN (to_maxtext.py), "
        "no logits_dense",
        True,
    ),
    "mistral": (
        mistral_config,
        transformers.MistralForCausalLM,
        mistral_to_maxtext,
        "mistral-7b",
        "standalone_scripts/llama_or_mistral_ckpt.py _convert_huggingface_to_jax_weights",
        False,
    ),
    "gemma": (
        gemma_config,
        transformers.GemmaForCausalLM,
        gemma_to_maxtext,
        "gemma-2b",
        "standalone_scripts/convert_gemma_chkpt.py names + utils/param_mapping.py "
        "GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN values",
        False,
    ),
    "mixtral": (
        mixtral_config,
        transformers.MixtralForCausalLM,
        mixtral_to_maxtext,
        "mixtral-8x7b",
        "utils/param_mapping.py MIXTRAL_MAXTEXT_TO_HF_PARAM_MAPPING + "
        "MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN (to_maxtext.py, --save_dtype bfloat16)",
        False,
    ),
    "qwen3_moe": (
        qwen3_moe_config,
        transformers.Qwen3MoeForCausalLM,
        qwen3_moe_to_maxtext,
        "qwen3-30b-a3b",
        "utils/param_mapping.py QWEN_MAXTEXT_TO_HF_PARAM_MAPPING + "
        "QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN (to_maxtext.py, --save_dtype float32)",
        False,
    ),
}


def build(model_id: str) -> dict:
    make_config, model_class, convert, maxtext_model, script, permuted = MODELS[model_id]
    out = HERE / model_id
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    config = make_config()
    model = model_class(config).to(config.dtype).eval()  # (float32 but for Mixtral's.)
    with torch.no_grad():  # Random norms (Llama: about 1, Gemma: about 0), so the mapping shows.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                base = 0.0 if model_id == "gemma" else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))
    model.save_pretrained(out / "hf")
    cfg = json.loads((out / "hf" / "config.json").read_text())
    # (As to_maxtext.py's default eager load, safetensors' safe_open(framework="pt"): the
    # names save_pretrained writes -- the per-expert ones -- and no tied head.)
    with safe_open(out / "hf" / "model.safetensors", framework="pt") as file:
        hf = {k: _eager_getter(file.get_tensor(k)) for k in file.keys()}  # noqa: SIM118
    weights = convert(hf, cfg)
    tree = {"step": 0, "params": {"params": _nest(weights)}}  # utils.save_weights_to_checkpoint
    item = (out / "maxtext" / "0" / "items").absolute()
    item.parent.mkdir(parents=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(item, tree)
        checkpointer.wait_until_finished()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, size=(2, 8)).astype(np.int64)
    # (The directory's model as transformers loads it: one cast with .to(bfloat16) would
    # hold its RoPE inv_freq in bfloat16 too, and give other logits.)
    loaded = model_class.from_pretrained(out / "hf").eval()
    with torch.no_grad():
        logits = loaded(torch.from_numpy(ids)).logits.float().numpy()
    np.save(out / "input_ids.npy", ids)
    np.save(out / "logits.npy", logits)
    return {
        "model_type": cfg["model_type"],
        "architecture": model_class.__name__,
        "maxtext_model": maxtext_model,
        "script": script,
        "rope_permuted": permuted,
        "maxtext_vocab_size": int(weights["token_embedder/embedding"].shape[0]),
        "tied": bool(config.tie_word_embeddings),
        "leaves": {
            f"params/params/{p}": f"{a.dtype} {list(a.shape)}" for p, a in sorted(weights.items())
        },
    }


def _eager_getter(v: torch.Tensor) -> np.ndarray:
    """to_maxtext.py ``_eager_getter``: a bfloat16 tensor through float32 to
    ``ml_dtypes.bfloat16`` (--save_dtype bfloat16); a float32 one as it is."""
    v = v.detach()
    if v.dtype == torch.bfloat16:
        return v.to(torch.float32).numpy().astype(ml_dtypes.bfloat16)
    return v.numpy().copy()


def main(ids: list[str]) -> None:
    manifest_path = HERE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for model_id in ids or list(MODELS):
        manifest[model_id] = build(model_id)
        print(f"{model_id}: {HERE / model_id}")
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
