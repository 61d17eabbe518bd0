"""Builds the corpus of broken checkpoints that ``jaxshare check`` must catch.

Each fixture is written by the real producer of its kind -- transformers 5's
``save_pretrained``, ``safetensors.torch.save_model``, ``torch.save``,
jaxshare's own ``bridge.save_safetensors``, a Flax model's ``flax_model.msgpack``
as transformers 4.57 wrote it (``tests/data/transformers_flax``) -- from a tiny
model built from a config in code (seed 0), then broken the way the reported
issue breaks it. ``manifest.json`` names, per fixture, the path to check, the
kinds of finding ``check`` must report (exactly those), and the issue it
reproduces; the kinds are written here by hand, never taken from ``check``.

Run from the repository root with the test venv (transformers 5, torch)::

    HF_HUB_OFFLINE=1 .venv/bin/python tests/data/check_corpus/make_corpus.py

Each fixture is at most 40 KB (most are 5-12 KB); the script replaces the fixtures it
builds, byte-identical from run to run.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers as t
from flax import serialization
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

import bridge  # noqa: E402

MANIFEST: dict[str, dict] = {}


def fixture(name: str, path: str, expect: list[str], issue: str, what: str) -> Path:
    """A fresh folder ``name`` and its manifest entry (``path`` relative to it)."""
    folder = HERE / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    MANIFEST[name] = {"path": f"{name}/{path}" if path else name, "expect": sorted(expect),
                      "issue": issue, "what": what}  # fmt: skip
    return folder


def tiny(model_class: type, config_class: type, **fields) -> torch.nn.Module:
    """A ``model_class`` of ``config_class(**fields)``, its weights drawn after
    ``torch.manual_seed(0)``, in eval mode."""
    torch.manual_seed(0)
    return model_class(config_class(**fields)).eval()


def llama(tied: bool) -> torch.nn.Module:
    return tiny(t.LlamaForCausalLM, t.LlamaConfig,
        vocab_size=32, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
        tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def t5(model_class: type, config_class: type) -> torch.nn.Module:
    return tiny(model_class, config_class,
        vocab_size=24, d_model=8, d_kv=4, d_ff=12, num_layers=1, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip


def gpt2() -> torch.nn.Module:
    return tiny(t.GPT2LMHeadModel, t.GPT2Config,
        n_layer=1, n_embd=8, n_head=2, vocab_size=24, n_positions=8,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def qwen3_moe() -> torch.nn.Module:
    return tiny(t.Qwen3MoeForCausalLM, t.Qwen3MoeConfig,
        vocab_size=32, hidden_size=8, intermediate_size=12, moe_intermediate_size=4,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
        num_experts=4, num_experts_per_tok=2, mlp_only_layers=[], max_position_embeddings=8,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def pretrained(folder: Path, model: torch.nn.Module) -> torch.nn.Module:
    """``model``, saved into ``folder`` by its ``save_pretrained``."""
    model.save_pretrained(folder)
    return model


def add_tensors(file: Path, extra: dict[str, torch.Tensor], drop: tuple[str, ...] = ()) -> None:
    """``file`` rewritten with ``extra`` added (and ``drop`` left out), its metadata kept.

    Written here, keys sorted, so that reruns are byte-identical (``save_file`` orders
    a metadata of several keys differently from run to run)."""
    with safe_open(file, "pt") as f:
        metadata = f.metadata() or {}
    state = {k: v for k, v in load_file(file).items() if k not in drop}
    state.update({k: v.detach().clone().contiguous() for k, v in extra.items()})
    header: dict = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(state):
        data = state[name].numpy()
        code = {"float32": "F32", "int64": "I64"}[data.dtype.name]
        blobs.append(data.tobytes())
        header[name] = {"dtype": code, "shape": list(data.shape),
                        "data_offsets": [offset, offset + len(blobs[-1])]}  # fmt: skip
        offset += len(blobs[-1])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def rand_like(x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(x.shape, generator=g, dtype=x.dtype)


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build() -> None:
    # transformers#48154: T5's encoder embedding loaded from lm_head.
    d = fixture("t5_encoder_embedding_from_lm_head", "", ["alias-differs"], "transformers#48154",
                "T5 ties encoder.embed_tokens to shared; the file stores encoder.embed_tokens "
                "with other values (a distinct lm_head's), as a load that took it from lm_head "
                "saved it")  # fmt: skip
    model = pretrained(d, t5(t.T5ForConditionalGeneration, t.T5Config))
    add_tensors(d / "model.safetensors",
                {"encoder.embed_tokens.weight": rand_like(model.shared.weight, 1)})  # fmt: skip

    # transformers#43429: a random lm_head while the config ties it.
    d = fixture("llama_random_lm_head", "", ["alias-differs"], "transformers#43429",
                "tie_word_embeddings: true, and the file stores a random lm_head.weight beside "
                "the embedding it is tied to (transformers 5.24 loads both, untied)")  # fmt: skip
    model = pretrained(d, llama(True))
    add_tensors(d / "model.safetensors", {"lm_head.weight": rand_like(model.lm_head.weight, 2)})

    # transformers#43880: zeroed UMT5 embeddings.
    d = fixture(
        "umt5_zeroed_embeddings",
        "",
        ["all-zero"],
        "transformers#43880",
        "UMT5's shared embedding, tied to both stacks and the head, saved as zeros",
    )
    model = t5(t.UMT5ForConditionalGeneration, t.UMT5Config)
    with torch.no_grad():
        model.shared.weight.zero_()
    model.save_pretrained(d)

    # transformers#42612: a tie overwriting a distinct stored head.
    d = fixture("mt5_tie_overwrites_head", "", ["head-overwritten"], "transformers#42612",
                "config.json says tie_word_embeddings: false and stores a distinct lm_head, but "
                "transformers 5's mT5 class ties lm_head to shared all the same: a loader that "
                "applies the tie overwrites the head")  # fmt: skip
    model = pretrained(d, t5(t.MT5ForConditionalGeneration, t.MT5Config))
    add_tensors(d / "model.safetensors", {"lm_head.weight": rand_like(model.shared.weight, 3)})
    edit_config(d, tie_word_embeddings=False)

    # transformers#45136: tie_word_embeddings diverging after a PEFT merge.
    d = fixture("llama_peft_merge_diverged", "", ["alias-differs"], "transformers#45136",
                "a LoRA merged into lm_head of a tied Llama (lm_head += B @ A), saved with both "
                "tensors while config.json still ties them")  # fmt: skip
    model = llama(True)
    model.config.save_pretrained(d)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    b, a = torch.randn(32, 2, generator=g), torch.randn(2, 8, generator=g)
    state["lm_head.weight"] = state["model.embed_tokens.weight"] + 0.01 * (b @ a)
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})

    # Flax Llama's unused lm_head/kernel written beside a tied embedding.
    d = fixture("flax_llama_unused_lm_head", "", ["alias-differs"], "jaxshare",
                "a transformers-flax Llama msgpack (tie_word_embeddings: true) holding an "
                "lm_head/kernel the tied Flax model never reads, with other values than "
                "embed_tokens/embedding.T")  # fmt: skip
    src = ROOT / "tests/data/transformers_flax/llama/flax_model"
    for f in ("config.json", "generation_config.json"):
        shutil.copy(src / f, d / f)
    params = serialization.msgpack_restore((src / "flax_model.msgpack").read_bytes())
    rows, cols = params["model"]["embed_tokens"]["embedding"].shape
    kernel = np.random.default_rng(5).standard_normal((cols, rows)).astype(np.float32)
    params["lm_head"] = {"kernel": kernel}
    (d / "flax_model.msgpack").write_bytes(serialization.msgpack_serialize(params))

    # A declared tie whose canonical is missing: the embedding saved as the head.
    d = fixture("llama_canonical_missing", "", ["canonical-missing"], "jaxshare",
                "a tied Llama whose file stores the embedding under lm_head.weight only; "
                "model.embed_tokens.weight, the tie's canonical, is missing")  # fmt: skip
    pretrained(d, llama(True))
    emb = load_file(d / "model.safetensors")["model.embed_tokens.weight"]
    add_tensors(
        d / "model.safetensors", {"lm_head.weight": emb}, drop=("model.embed_tokens.weight",)
    )

    # jaxshare's alias map naming a canonical the file lacks.
    d = fixture("alias_map_canonical_missing", "model.safetensors", ["canonical-missing"],
                "jaxshare", "bridge.save_safetensors's alias map ties lm_head.weight to "
                "transformer.wte.weight, which was stripped from the file")  # fmt: skip
    model = gpt2()
    bridge.save_safetensors(model.state_dict(), d / "model.safetensors")
    add_tensors(d / "model.safetensors", {}, drop=("transformer.wte.weight",))

    # A head the config leaves untied, missing from the files.
    d = fixture("llama_head_missing", "", ["head-missing"], "jaxshare",
                "tie_word_embeddings: false, and lm_head.weight is not in the file "
                "(transformers would initialise it at random)")  # fmt: skip
    pretrained(d, llama(False))
    add_tensors(d / "model.safetensors", {}, drop=("lm_head.weight",))

    # Another tensor of the model class missing (a weight dropped on the way).
    d = fixture("gpt2_tensor_missing", "", ["tensor-missing"], "jaxshare",
                "a GPT-2 directory whose file lacks transformer.h.0.mlp.c_fc.weight, as a "
                "partial restore or a dropped shard leaves it (transformers would initialise "
                "it at random)")  # fmt: skip
    pretrained(d, gpt2())
    add_tensors(d / "model.safetensors", {}, drop=("transformer.h.0.mlp.c_fc.weight",))

    # DeepSpeed's shared_params pointing at other values.
    d = fixture("deepspeed_shared_params_other_values", "mp_rank_00_model_states.pt",
                ["alias-differs"], "DeepSpeed _get_shared_params",
                "a DeepSpeed model-states file whose shared_params ties "
                "transformer.h.0.mlp.c_proj.weight to transformer.h.0.attn.c_proj.weight (a "
                "walk that keys by address only) though both are stored with their own "
                "values")  # fmt: skip
    model = gpt2()
    state = model.state_dict()
    torch.save(
        {
            "module": state,
            "shared_params": {
                "lm_head.weight": "transformer.wte.weight",
                "transformer.h.0.attn.c_proj.weight": "transformer.h.0.mlp.c_proj.weight",
            },
            "buffer_names": [],
            "ds_version": "0.19.8",
        },
        d / "mp_rank_00_model_states.pt",
    )
    # (c_proj of attention is (8, 8) and of the MLP (32, 8): other values and other shapes;
    # the test pins the figure.)

    # safetensors save_model metadata: the dropped name stored again with other values.
    d = fixture("save_model_alias_mismatch", "model.safetensors", ["alias-differs"],
                "keras-hub#3075", "safetensors.torch.save_model drops transformer.wte.weight "
                "as lm_head.weight's duplicate and records {dropped: kept} in the metadata; "
                "the dropped name was then written back with other values")  # fmt: skip
    model = gpt2()
    save_model(model, str(d / "model.safetensors"))
    add_tensors(d / "model.safetensors",
                {"transformer.wte.weight": rand_like(model.lm_head.weight, 6)})  # fmt: skip

    # jaxshare's alias map with the alias written out with other values.
    d = fixture("alias_map_alias_differs", "model.safetensors", ["alias-differs"], "jaxshare",
                "bridge.save_safetensors's alias map ties lm_head.weight to "
                "transformer.wte.weight, and lm_head.weight was added to the file with other "
                "values")  # fmt: skip
    model = gpt2()
    bridge.save_safetensors(model.state_dict(), d / "model.safetensors")
    add_tensors(d / "model.safetensors", {"lm_head.weight": rand_like(model.lm_head.weight, 7)})

    # A .bin whose tensors share a storage while config.json says untied.
    d = fixture("bin_storage_shared_config_untied", "", ["tie-conflict"], "jaxshare",
                "pytorch_model.bin (torch.save) stores lm_head.weight and "
                "model.embed_tokens.weight as one storage, but config.json sets "
                "tie_word_embeddings: false: loading unties them")  # fmt: skip
    model = llama(False)
    model.lm_head.weight = model.model.embed_tokens.weight
    model.config.save_pretrained(d)
    torch.save(model.state_dict(), d / "pytorch_model.bin")

    # An alias stored twice, bit for bit.
    d = fixture("llama_stored_twice", "", ["stored-twice"], "jaxshare",
                "a tied Llama whose file also stores lm_head.weight, a bit-identical copy of "
                "model.embed_tokens.weight: bytes a dedupe saves")  # fmt: skip
    pretrained(d, llama(True))
    emb = load_file(d / "model.safetensors")["model.embed_tokens.weight"]
    add_tensors(d / "model.safetensors", {"lm_head.weight": emb})

    # Tensors equal by content that nothing ties.
    d = fixture("llama_equal_untied", "", ["equal-untied"], "jaxshare",
                "an untied Llama whose lm_head.weight is a copy of model.embed_tokens.weight "
                "(initialised from it, never trained): equal, but not declared tied")  # fmt: skip
    model = llama(False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.save_pretrained(d)

    # Mixtures of experts: every expert accounted for.
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    d = fixture("qwen3_moe_expert_missing", "", ["expert-missing"], "Megatron-LM#5844",
                "a Qwen3-MoE whose layer 0 lacks expert 2's up_proj.weight, as a converter "
                "that drops experts writes it")  # fmt: skip
    pretrained(d, qwen3_moe())
    add_tensors(d / "model.safetensors", {}, drop=("model.layers.0.mlp.experts.2.up_proj.weight",))
    d = fixture("qwen3_moe_expert_twice", "", ["expert-twice"], "jaxshare",
                "a Qwen3-MoE saved per expert whose file also holds layer 0's experts fused "
                "(gate_up_proj), bit for bit alike: two namings of one layer")  # fmt: skip
    model = pretrained(d, qwen3_moe())
    add_tensors(d / "model.safetensors", {fused: model.state_dict()[fused]})
    d = fixture("qwen3_moe_experts_differ", "", ["experts-differ"], "transformers#48805",
                "a Qwen3-MoE saved per expert whose file also holds layer 0's experts fused, "
                "from before a step of training: expert 1's gate differs")  # fmt: skip
    model = pretrained(d, qwen3_moe())
    stale = model.state_dict()[fused].clone()
    stale[1, 0, 0] += 1
    add_tensors(d / "model.safetensors", {fused: stale})

    (HERE / "manifest.json").write_text(json.dumps(MANIFEST, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.logging.set_verbosity_error()
        build()
    for name, entry in sorted(MANIFEST.items()):
        size = sum(f.stat().st_size for f in (HERE / name).rglob("*") if f.is_file())
        print(f"{name}: {size} bytes, expects {entry['expect']}")
