"""Pins the parameter trees of transformers 4.57's Flax model classes, for the tests.

transformers 5 (the test venv's) has no Flax classes, so the tests of the
"transformers-flax" layout read what the real classes built, recorded here by
transformers 4.57 in the bench venv. For each architecture (the folder name is its
id) the script builds a tiny config in code, instantiates the Flax class with
``seed=0`` in float32, and writes into ``<id>/``:

- ``config.json``: ``config.save_pretrained`` output, with ``architectures`` naming the
  PyTorch class of the same model (what a hub directory's config.json holds);
- ``params.safetensors``: the Flax ``params``, keyed as
  ``flax.traverse_util.flatten_dict(params, sep="/")`` names them, float32, with
  ``metadata={"format": "flax"}``;
- ``tree.json``: ``{"paths": [[path, shape, dtype], ...]}`` in ``jax.tree_util`` flatten
  order;
- ``inputs.safetensors`` and ``logits.safetensors``: the inputs (from a fixed seed) and
  the Flax model's outputs on them;
- ``torch_names.json``: ``{"names": [[name, shape], ...], "tied": {alias: canonical}}``,
  the ``state_dict()`` of the PyTorch class of the same config built on the meta
  device, and the names it ties (the same parameter object under several names; the
  canonical is the first in ``state_dict()`` order). This is what ``save_pretrained`` of
  that PyTorch model writes, less the aliases;
- for gpt2, bart and llama, ``flax_model/``: the Flax model's own ``save_pretrained``
  output (config.json, flax_model.msgpack); for bart also ``flax_model_sharded/``, the
  same with ``max_shard_size="50KB"`` (msgpack shards and their index).

It also writes ``manifest.json`` (per id: classes, model type, input and output names,
``tie_word_embeddings``) and ``make_fixtures.log``: versions and shims, and per id the
number of Flax leaves, the PyTorch names that the default PyTorch -> Flax renaming
(``.`` -> ``/``; ``weight`` -> ``kernel``, ``embedding``, ``scale`` or ``weight``) does not
find among them and the reverse, the renamings it found, counted by kind and shape
relation, and the sizes of the ``save_pretrained`` folders. Everything but the log's
``time:`` lines is byte-identical from run to run. Nothing is downloaded. Run from the
repository root (``make flax-fixtures``)::

    HF_HUB_OFFLINE=1 .venv-bench/bin/python tests/data/transformers_flax/make_fixtures.py

Given ids as arguments (``... make_fixtures.py gpt2 t5``) it rebuilds those folders
only; the manifest keeps the other ids' entries and the log covers that run.

Shims (jax 0.10 against transformers 4.57's Flax code), installed before transformers
is imported and only inside this process:

- ``jax.numpy.clip``: the T5 family (t5, mt5, longt5) computes its relative position
  buckets with ``jnp.clip(x, a_max=...)``; jax removed the ``a_min``/``a_max`` keywords
  (now ``min``/``max``), so the call raises ``TypeError``. The shim maps the old keywords
  to the new ones.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

# Sizes shared by the tiny configs. Hidden size, intermediate size, vocabulary and
# positions all differ, so a transposed kernel is told from an untransposed one by its
# shape wherever the matrix is not square (attention projections are).
HIDDEN = 16
HEADS = 2
LAYERS = 2
INTERMEDIATE = 48
VOCAB = 64
POSITIONS = 32
IMAGE = 24
PATCH = 8

SEQ_LEN = 7
DECODER_SEQ_LEN = 5
# Token ids are drawn from [FIRST_ID, vocab_size): no pad, bos, eos or unk token.
FIRST_ID = 4
SEED = 0

LM = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "intermediate_size": INTERMEDIATE,
    "max_position_embeddings": POSITIONS,
}
BART = {
    "vocab_size": VOCAB,
    "d_model": HIDDEN,
    "encoder_layers": LAYERS,
    "decoder_layers": LAYERS,
    "encoder_attention_heads": HEADS,
    "decoder_attention_heads": HEADS,
    "encoder_ffn_dim": INTERMEDIATE,
    "decoder_ffn_dim": INTERMEDIATE,
    "max_position_embeddings": POSITIONS,
}
T5 = {
    "vocab_size": VOCAB,
    "d_model": HIDDEN,
    "d_kv": HIDDEN // HEADS,
    "d_ff": INTERMEDIATE,
    "num_layers": LAYERS,
    "num_decoder_layers": LAYERS,
    "num_heads": HEADS,
    "decoder_start_token_id": 0,
}
VISION = {
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "intermediate_size": INTERMEDIATE,
    "image_size": IMAGE,
    "patch_size": PATCH,
}


@dataclass(frozen=True)
class Spec:
    """One architecture: its classes, its kind of inputs, and its tiny config."""

    config_class: str
    flax_class: str
    torch_class: str
    #: "text" (input_ids, attention_mask), "seq2seq" (+ decoder_input_ids), "speech"
    #: (input_features, decoder_input_ids), "image" (pixel_values) or "text-image"
    #: (input_ids, pixel_values).
    kind: str
    config: Mapping[str, Any] = field(default_factory=dict)
    #: "flax_model" and "flax_model_sharded": also write the Flax model's save_pretrained.
    saves: tuple[str, ...] = ()
    #: Integer inputs passed as zeros, of the shape of ``input_ids``, where the Flax class's
    #: default differs from the PyTorch class's.
    zeros: tuple[str, ...] = ()
    #: ``(head kernel, embedding)``: the head's kernel set to the embedding transposed,
    #: as ``from_pretrained(..., from_pt=True)`` of a tied PyTorch checkpoint makes it.
    head_from_embedding: tuple[str, str] | None = None


#: GPT-2's and GPT-J's config names for the sizes.
GPT2_SIZES = {
    "vocab_size": VOCAB,
    "n_positions": POSITIONS,
    "n_embd": HIDDEN,
    "n_layer": LAYERS,
    "n_head": HEADS,
    "n_inner": INTERMEDIATE,
}

SPECS: dict[str, Spec] = {
    "gpt2": Spec(
        "GPT2Config",
        "FlaxGPT2LMHeadModel",
        "GPT2LMHeadModel",
        "text",
        GPT2_SIZES,
        saves=("flax_model",),
    ),
    "gpt_neo": Spec(
        "GPTNeoConfig",
        "FlaxGPTNeoForCausalLM",
        "GPTNeoForCausalLM",
        "text",
        {
            "vocab_size": VOCAB,
            "max_position_embeddings": POSITIONS,
            "hidden_size": HIDDEN,
            "num_layers": LAYERS,
            "num_heads": HEADS,
            "intermediate_size": INTERMEDIATE,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 4,
        },
    ),
    "gptj": Spec(
        "GPTJConfig",
        "FlaxGPTJForCausalLM",
        "GPTJForCausalLM",
        "text",
        {**GPT2_SIZES, "rotary_dim": 4},
    ),
    "opt": Spec(
        "OPTConfig",
        "FlaxOPTForCausalLM",
        "OPTForCausalLM",
        "text",
        {
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "ffn_dim": INTERMEDIATE,
            "max_position_embeddings": POSITIONS,
            "word_embed_proj_dim": HIDDEN,
        },
    ),
    "bloom": Spec(
        "BloomConfig",
        "FlaxBloomForCausalLM",
        "BloomForCausalLM",
        "text",
        {"vocab_size": VOCAB, "hidden_size": HIDDEN, "n_layer": LAYERS, "n_head": HEADS},
    ),
    # FlaxLlamaForCausalLM (and Mistral's) never reads tie_word_embeddings: its lm_head
    # is a leaf of its own even here, where the PyTorch class ties it to embed_tokens.
    # A Flax Llama of a tied checkpoint (Llama 3.2 1B) holds the embedding transposed
    # there, as `from_pt=True` writes it: so does this one.
    "llama": Spec(
        "LlamaConfig",
        "FlaxLlamaForCausalLM",
        "LlamaForCausalLM",
        "text",
        {**LM, "num_key_value_heads": HEADS, "tie_word_embeddings": True},
        saves=("flax_model",),
        head_from_embedding=("lm_head/kernel", "model/embed_tokens/embedding"),
    ),
    "llama_untied": Spec(
        "LlamaConfig",
        "FlaxLlamaForCausalLM",
        "LlamaForCausalLM",
        "text",
        {**LM, "num_key_value_heads": HEADS, "tie_word_embeddings": False},
    ),
    "mistral": Spec(
        "MistralConfig",
        "FlaxMistralForCausalLM",
        "MistralForCausalLM",
        "text",
        {**LM, "num_key_value_heads": HEADS, "sliding_window": POSITIONS},
    ),
    "gemma": Spec(
        "GemmaConfig",
        "FlaxGemmaForCausalLM",
        "GemmaForCausalLM",
        "text",
        {**LM, "num_key_value_heads": HEADS, "head_dim": HIDDEN // HEADS},
    ),
    # d_model 32, so the 50 KB shards of flax_model_sharded/ are several.
    "bart": Spec(
        "BartConfig",
        "FlaxBartForConditionalGeneration",
        "BartForConditionalGeneration",
        "seq2seq",
        {**BART, "d_model": 2 * HIDDEN, "max_position_embeddings": 40},
        saves=("flax_model", "flax_model_sharded"),
    ),
    "mbart": Spec(
        "MBartConfig",
        "FlaxMBartForConditionalGeneration",
        "MBartForConditionalGeneration",
        "seq2seq",
        BART,
    ),
    "marian": Spec(
        "MarianConfig",
        "FlaxMarianMTModel",
        "MarianMTModel",
        "seq2seq",
        {
            **BART,
            "pad_token_id": VOCAB - 1,
            "decoder_start_token_id": VOCAB - 1,
            "eos_token_id": 0,
        },
    ),
    "pegasus": Spec(
        "PegasusConfig",
        "FlaxPegasusForConditionalGeneration",
        "PegasusForConditionalGeneration",
        "seq2seq",
        BART,
    ),
    "t5": Spec(
        "T5Config", "FlaxT5ForConditionalGeneration", "T5ForConditionalGeneration", "seq2seq", T5
    ),
    "mt5": Spec(
        "MT5Config", "FlaxMT5ForConditionalGeneration", "MT5ForConditionalGeneration", "seq2seq", T5
    ),
    "longt5": Spec(
        "LongT5Config",
        "FlaxLongT5ForConditionalGeneration",
        "LongT5ForConditionalGeneration",
        "seq2seq",
        {
            **T5,
            "encoder_attention_type": "transient-global",
            "local_radius": 3,
            "global_block_size": 4,
        },
    ),
    "bert": Spec("BertConfig", "FlaxBertForMaskedLM", "BertForMaskedLM", "text", LM),
    "roberta": Spec("RobertaConfig", "FlaxRobertaForMaskedLM", "RobertaForMaskedLM", "text", LM),
    "xlm_roberta": Spec(
        "XLMRobertaConfig", "FlaxXLMRobertaForMaskedLM", "XLMRobertaForMaskedLM", "text", LM
    ),
    "electra": Spec(
        "ElectraConfig",
        "FlaxElectraForMaskedLM",
        "ElectraForMaskedLM",
        "text",
        {**LM, "embedding_size": HIDDEN // 2},
        # FlaxElectraForMaskedLM.__call__ defaults token_type_ids to ones, PyTorch to zeros.
        zeros=("token_type_ids",),
    ),
    "albert": Spec(
        "AlbertConfig",
        "FlaxAlbertForMaskedLM",
        "AlbertForMaskedLM",
        "text",
        {**LM, "embedding_size": HIDDEN // 2},
    ),
    "distilbert": Spec(
        "DistilBertConfig",
        "FlaxDistilBertForMaskedLM",
        "DistilBertForMaskedLM",
        "text",
        {
            "vocab_size": VOCAB,
            "dim": HIDDEN,
            "n_layers": LAYERS,
            "n_heads": HEADS,
            "hidden_dim": INTERMEDIATE,
            "max_position_embeddings": POSITIONS,
        },
    ),
    "big_bird": Spec(
        "BigBirdConfig",
        "FlaxBigBirdForMaskedLM",
        "BigBirdForMaskedLM",
        "text",
        {**LM, "attention_type": "original_full"},
    ),
    # num_mel_bins and max_source_positions differ from every other size, so the
    # convolution kernels and position tables are not square.
    "whisper": Spec(
        "WhisperConfig",
        "FlaxWhisperForConditionalGeneration",
        "WhisperForConditionalGeneration",
        "speech",
        {
            **BART,
            "num_mel_bins": 40,
            "max_source_positions": 24,
            "max_target_positions": POSITIONS,
            "pad_token_id": VOCAB - 3,
            "bos_token_id": VOCAB - 2,
            "eos_token_id": VOCAB - 2,
            "decoder_start_token_id": VOCAB - 1,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
        },
    ),
    "vit": Spec(
        "ViTConfig",
        "FlaxViTForImageClassification",
        "ViTForImageClassification",
        "image",
        {**VISION, "num_labels": 3},
    ),
    "clip": Spec(
        "CLIPConfig",
        "FlaxCLIPModel",
        "CLIPModel",
        "text-image",
        {
            # eos_token_id 2: both frameworks pool the text at the largest id (argmax).
            "text_config": {**LM, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1},
            "vision_config": {**VISION, "hidden_size": 2 * HIDDEN, "intermediate_size": 64},
            "projection_dim": HIDDEN // 2,
        },
    ),
}


def install_jax_shims() -> list[str]:
    """Makes jax 0.10 accept the calls of transformers 4.57's Flax code; returns their names."""
    import jax.numpy as jnp

    installed = []
    if "a_max" not in inspect.signature(jnp.clip).parameters:
        new_clip = jnp.clip

        def clip(
            arr: Any = None,
            /,
            min: Any = None,
            max: Any = None,
            *,
            a_min: Any = None,
            a_max: Any = None,
        ) -> Any:
            return new_clip(arr, a_min if min is None else min, a_max if max is None else max)

        jnp.clip = clip
        installed.append("jax.numpy.clip(a_min=, a_max=)")
    return installed


def make_inputs(spec: Spec, config: Any) -> dict[str, np.ndarray]:
    """The model's inputs, drawn from a fixed seed: token ids within the vocabulary."""
    rng = np.random.default_rng(SEED)
    text = config.text_config if spec.kind == "text-image" else config
    inputs: dict[str, np.ndarray] = {}
    if spec.kind in ("text", "seq2seq", "text-image"):
        ids = rng.integers(FIRST_ID, text.vocab_size, size=(1, SEQ_LEN))
        inputs["input_ids"] = ids.astype(np.int32)
    if spec.kind in ("text", "seq2seq"):
        inputs["attention_mask"] = np.ones((1, SEQ_LEN), dtype=np.int32)
    for name in spec.zeros:
        inputs[name] = np.zeros((1, SEQ_LEN), dtype=np.int32)
    if spec.kind == "speech":
        shape = (1, config.num_mel_bins, 2 * config.max_source_positions)
        inputs["input_features"] = rng.standard_normal(shape).astype(np.float32)
    if spec.kind in ("seq2seq", "speech"):
        ids = rng.integers(FIRST_ID, config.vocab_size, size=(1, DECODER_SEQ_LEN))
        inputs["decoder_input_ids"] = ids.astype(np.int32)
    if spec.kind in ("image", "text-image"):
        vision = config.vision_config if spec.kind == "text-image" else config
        shape = (1, vision.num_channels, vision.image_size, vision.image_size)
        inputs["pixel_values"] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def outputs_of(spec: Spec, result: Any) -> dict[str, np.ndarray]:
    """The outputs kept from a model call, as float32 numpy arrays."""
    names = ["logits_per_image", "logits_per_text"] if spec.kind == "text-image" else ["logits"]
    return {name: np.asarray(getattr(result, name), dtype=np.float32) for name in names}


def torch_names(torch_class: Any, config: Any) -> tuple[dict[str, Any], list[str]]:
    """The PyTorch model's ``state_dict()`` names and shapes, and the names it ties.

    Returns the ``torch_names.json`` record and the class's ``_tied_weights_keys``.
    """
    import torch

    with torch.device("meta"):
        model = torch_class(copy.deepcopy(config))
    state = model.state_dict()
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    canonical: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name in state:
        key = id(tensors[name])
        if key in canonical:
            tied[name] = canonical[key]
        else:
            canonical[key] = name
    record = {
        "names": [[name, list(tensor.shape)] for name, tensor in state.items()],
        "tied": tied,
    }
    return record, list(getattr(model, "_tied_weights_keys", None) or [])


def flax_candidates(torch_name: str) -> list[str]:
    """The Flax paths the default renaming gives a PyTorch name (``a.b.weight`` -> ...)."""
    *parents, last = torch_name.split(".")
    leaves = ["kernel", "embedding", "scale", "weight"] if last == "weight" else [last]
    return ["/".join([*parents, leaf]) for leaf in leaves]


def shape_relation(torch_shape: list[int], flax_shape: list[int]) -> str:
    """How a Flax leaf's shape relates to the PyTorch tensor's it was renamed from."""
    if torch_shape == flax_shape:
        square = len(torch_shape) == 2 and torch_shape[0] == torch_shape[1]
        return "square" if square else "same"
    if len(torch_shape) == 2 and torch_shape[::-1] == flax_shape:
        return "transposed"
    if len(torch_shape) > 2 and [*torch_shape[2:], torch_shape[1], torch_shape[0]] == flax_shape:
        return "conv (O,I,*S) -> (*S,I,O)"
    return f"other: {torch_shape} -> {flax_shape}"


def compare(
    record: dict[str, Any], flax_shapes: dict[str, list[int]], log: Callable[[str], None]
) -> None:
    """Logs the PyTorch names with no Flax leaf by the default renaming, and the reverse.

    Also logs the PyTorch aliases that the Flax tree holds as leaves of their own (the
    Flax class does not tie them), and counts the renamings found, by leaf name and shape
    relation (``weight -> kernel: transposed``), with the first PyTorch name of each.
    """
    found: set[str] = set()
    missing = []
    untied = []
    renamings: dict[str, list[str]] = {}
    for name, shape in record["names"]:
        match = [path for path in flax_candidates(name) if path in flax_shapes]
        if not match:
            missing.append(f"{name} {shape}")
            continue
        if name in record["tied"]:
            untied.append(f"{name} -> {match[0]}")
        found.add(match[0])
        relation = shape_relation(shape, flax_shapes[match[0]])
        leaf = match[0].rsplit("/", 1)[-1]
        renamings.setdefault(f"{name.rsplit('.', 1)[-1]} -> {leaf}: {relation}", []).append(name)
    log(f"  torch names with no Flax leaf by the default renaming: {missing or 'none'}")
    extra = [f"{path} {shape}" for path, shape in flax_shapes.items() if path not in found]
    log(f"  Flax leaves no torch name renames to: {extra or 'none'}")
    if untied:
        log(f"  tied in PyTorch, yet a Flax leaf of its own (Flax does not tie it): {untied}")
    for renaming, examples in sorted(renamings.items()):
        log(f"    {renaming} x{len(examples)} (e.g. {examples[0]})")


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def build(name: str, spec: Spec, log: Callable[[str], None]) -> dict[str, Any]:
    """Writes the fixture folder of one architecture; returns its manifest entry."""
    import jax
    import transformers
    from flax.traverse_util import flatten_dict
    from safetensors.numpy import save_file

    start = time.perf_counter()
    root = HERE / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()

    config = getattr(transformers, spec.config_class)(**spec.config)
    config.architectures = [spec.torch_class]
    config.save_pretrained(root)

    model = getattr(transformers, spec.flax_class)(config, seed=SEED, dtype=jax.numpy.float32)
    params = model.params
    if spec.head_from_embedding is not None:
        from flax.traverse_util import unflatten_dict

        head, embedding = spec.head_from_embedding
        flat = flatten_dict(params, sep="/")
        flat[head] = flat[embedding].T
        model.params = params = unflatten_dict(flat, sep="/")
    flat = flatten_dict(params, sep="/")
    flat = {path: np.asarray(leaf, dtype=np.float32) for path, leaf in flat.items()}
    save_file(flat, root / "params.safetensors", metadata={"format": "flax"})
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    paths = [
        ["/".join(str(key.key) for key in keys), list(leaf.shape), str(leaf.dtype)]
        for keys, leaf in leaves
    ]
    write_json(root / "tree.json", {"paths": paths})

    inputs = make_inputs(spec, config)
    save_file(inputs, root / "inputs.safetensors")
    outputs = outputs_of(spec, model(**inputs))
    save_file(outputs, root / "logits.safetensors")

    record, tied_keys = torch_names(getattr(transformers, spec.torch_class), config)
    write_json(root / "torch_names.json", record)

    log(
        f"{name}: {spec.flax_class}, {len(paths)} Flax leaves, "
        f"{len(record['names'])} torch names, tied {record['tied'] or 'none'}"
    )
    # _tied_weights_keys may be relative to the base model ("encoder.embed_tokens.weight").
    aliases = record["tied"]
    untied = [k for k in tied_keys if not any(a == k or a.endswith(f".{k}") for a in aliases)]
    if untied:
        log(f"  _tied_weights_keys the model does not tie: {untied}")
    compare(record, {path: shape for path, shape, _ in paths}, log)
    for save in spec.saves:
        shard = {"max_shard_size": "50KB"} if save == "flax_model_sharded" else {}
        model.save_pretrained(root / save, **shard)
        files = sorted(root.joinpath(save).iterdir())
        sizes = ", ".join(f"{p.name} {p.stat().st_size} B" for p in files)
        log(f"  {save}/: {sizes}")
    log(f"  time: {time.perf_counter() - start:.1f} s")
    return {
        "flax_class": spec.flax_class,
        "torch_class": spec.torch_class,
        "model_type": config.model_type,
        "inputs": list(inputs),
        "outputs": list(outputs),
        "tie_word_embeddings": bool(config.tie_word_embeddings),
    }


def main(names: list[str]) -> None:
    """Writes the fixtures of ``names`` (ids of ``SPECS``), the manifest and the log."""
    unknown = [name for name in names if name not in SPECS]
    if unknown:
        raise SystemExit(f"unknown ids {unknown}; expected some of {list(SPECS)}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    shims = install_jax_shims()
    import flax
    import jax
    import transformers

    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"transformers {transformers.__version__}, flax {flax.__version__}, jax {jax.__version__}")
    log(f"shims: {shims or 'none'}")
    start = time.perf_counter()
    built = {name: build(name, SPECS[name], log) for name in names}
    log(f"time: {time.perf_counter() - start:.1f} s")
    # A run for some ids only keeps the other ids' entries.
    manifest_path = HERE / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest = {name: built.get(name, old.get(name)) for name in SPECS}
    write_json(manifest_path, {name: entry for name, entry in manifest.items() if entry})
    (HERE / "make_fixtures.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:] or list(SPECS))
