"""Builds the DeepSpeed ZeRO checkpoint fixtures with the real DeepSpeed.

Each fixture is a checkpoint folder written by ``engine.save_checkpoint`` after
two training steps of a tiny Hugging Face model (GPT-2 with ``lm_head`` tied to
``transformer.wte``, or T5 with ``shared`` = ``encoder.embed_tokens`` =
``decoder.embed_tokens`` = ``lm_head``), plus ``reference.pt``: DeepSpeed's own
``get_fp32_state_dict_from_zero_checkpoint`` of the folder, saved with
``torch.save`` (which keeps each tie as one storage). ZeRO-0 folders have no
optimizer partitions and DeepSpeed's function refuses them; their reference is
the ``module`` DeepSpeed stored. The tests compare ``bridge``'s reader with these
references; they never import deepspeed.

Every GPT-2 fixture has a frozen parameter (``transformer.wpe.weight``) and two
persistent buffers (``tokens_seen``, int64, and ``transformer.calibration``,
bfloat16, which ``zero_to_fp32`` turns into float32); the T5 fixtures freeze
``encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight``. The
optimizer is a plain ``torch.optim.AdamW`` over two parameter groups (decay and
no decay, as the Hugging Face Trainer builds them).

Run from the repository root (``make fixtures``; DeepSpeed lives in the bench
venv)::

    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=build/torch_extensions \\
        .venv-bench/bin/python tests/data/deepspeed/make_fixtures.py

World size 2 runs under ``torchrun --nproc_per_node 2`` with gloo. DeepSpeed's
CPU accelerator refuses fp16 ("Type fp16 is not supported on your device"); the
fp16 fixtures are written by the real fp16 ZeRO optimizer with only that check
answered yes (``is_fp16_supported``), so the files are what a GPU run writes.

The log (``make_fixtures.log``) also records DeepSpeed's own
``zero_to_fp32 --safe_serialization`` crashing on a tied model.
"""

from __future__ import annotations

import os
import runpy
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 2

#: name -> (model, ZeRO stage, world size, training dtype)
FIXTURES: dict[str, tuple[str, int, int, str]] = {
    "gpt2_z0_w2_bf16": ("gpt2", 0, 2, "bf16"),
    "gpt2_z1_w2_fp32": ("gpt2", 1, 2, "fp32"),
    "gpt2_z2_w1_fp32": ("gpt2", 2, 1, "fp32"),
    "gpt2_z2_w2_bf16": ("gpt2", 2, 2, "bf16"),
    "gpt2_z2_w2_fp16": ("gpt2", 2, 2, "fp16"),
    "gpt2_z3_w1_bf16": ("gpt2", 3, 1, "bf16"),
    "gpt2_z3_w2_fp32": ("gpt2", 3, 2, "fp32"),
    "gpt2_z3_w2_fp16": ("gpt2", 3, 2, "fp16"),
    "t5_z2_w2_fp32": ("t5", 2, 2, "fp32"),
    "t5_z3_w2_bf16": ("t5", 3, 2, "bf16"),
}
#: The fixture DeepSpeed's ``zero_to_fp32 --safe_serialization`` is tried on.
CRASHED = "gpt2_z2_w2_bf16"


def build_model(kind: str):
    """A tiny tied model; odd sizes, so ZeRO pads its partitions."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)  # the same initial weights on every rank
    if kind == "gpt2":
        config = GPT2Config(vocab_size=31, n_embd=9, n_head=3, n_layer=1, n_positions=7)
        model = GPT2LMHeadModel(config)
        model.transformer.wpe.weight.requires_grad_(False)
        model.register_buffer("tokens_seen", torch.tensor(0, dtype=torch.int64))
        model.transformer.register_buffer("calibration", torch.randn(5).to(torch.bfloat16))
    else:
        config = T5Config(vocab_size=31, d_model=9, d_kv=3, d_ff=11, num_layers=1, num_heads=3,
                          decoder_start_token_id=0, tie_word_embeddings=True)  # fmt: skip
        model = T5ForConditionalGeneration(config)
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.requires_grad_(
            False
        )
    return model


def worker(name: str, out: str) -> None:
    """One rank of a training run (started by torchrun); writes the checkpoint to ``out``."""
    import deepspeed
    import torch

    kind, stage, _, dtype = FIXTURES[name]
    if dtype == "fp16":
        from deepspeed.accelerator import get_accelerator

        type(get_accelerator()).is_fp16_supported = lambda self: True
    deepspeed.init_distributed(dist_backend="gloo")
    model = build_model(kind)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in trainable if n.endswith("bias") or "ln" in n or "norm" in n]
    decay = [p for n, p in trainable if all(p is not q for q in no_decay)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-2,
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "initial_scale_power": 8},
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(1 + int(os.environ.get("RANK", "0")))
    for _ in range(STEPS):
        ids = torch.randint(0, 31, (2, 7), generator=generator)
        if kind == "gpt2":
            loss = engine(input_ids=ids, labels=ids).loss
            model.tokens_seen += ids.numel()
        else:
            loss = engine(input_ids=ids, labels=ids.flip(1)).loss
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out)


def reference(name: str, root: Path, log) -> None:
    """DeepSpeed's own consolidation of ``root``, saved as ``root/reference.pt``."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    _, stage, _, _ = FIXTURES[name]
    try:
        state = get_fp32_state_dict_from_zero_checkpoint(str(root))
    except Exception as e:  # ZeRO-0: no partitions to consolidate
        if stage != 0:
            raise
        log(f"  get_fp32_state_dict_from_zero_checkpoint: {type(e).__name__}: {e}")
        tag = (root / "latest").read_text().strip()
        state = torch.load(root / tag / "mp_rank_00_model_states.pt", weights_only=False)["module"]
        log("  reference.pt = the stored `module` (what DeepSpeed's engine loads at ZeRO-0)")
    torch.save(dict(state), root / "reference.pt")
    ties = {}
    for k, v in state.items():  # one storage at one offset
        ties.setdefault((v.untyped_storage().data_ptr(), v.storage_offset()), []).append(k)
    log(f"  {len(state)} tensors; ties: {[g for g in ties.values() if len(g) > 1]}")
    tag = (root / "latest").read_text().strip()
    model_states = sorted((root / tag).glob("*model_states.pt"))[0]
    module = torch.load(model_states, weights_only=False)["module"]
    dropped = [k for k in module if k not in state]
    if dropped:
        log(f"  in the stored module but not in DeepSpeed's result: {dropped}")


def safe_serialization_crash(names: list[str], out: Path, log) -> None:
    """``zero_to_fp32 --safe_serialization`` on a tied model (:data:`CRASHED`, where it
    was made): DeepSpeed's own crash."""
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    if CRASHED not in names:
        return
    root = out / CRASHED
    with tempfile.TemporaryDirectory() as tmp:
        try:
            convert_zero_checkpoint_to_fp32_state_dict(str(root), tmp, safe_serialization=True)
        except Exception as e:
            first = str(e).strip().splitlines()[0]
            log(f"zero_to_fp32 --safe_serialization on {root.name}: {type(e).__name__}: {first}")
        else:
            log(f"zero_to_fp32 --safe_serialization on {root.name}: no error; wrote "
                f"{sorted(os.listdir(tmp))}")  # fmt: skip


def describe(name: str) -> str:
    kind, stage, world_size, dtype = FIXTURES[name]
    return f"{name}: {kind}, ZeRO-{stage}, world size {world_size}, {dtype}, {STEPS} steps"


def main() -> None:
    """The driver both DeepSpeed fixture scripts share (``../deepspeed_fixtures.py``)."""
    run = runpy.run_path(str(HERE.parent / "deepspeed_fixtures.py"))["main"]
    run(__file__, __doc__, FIXTURES, worker, describe, reference, after=safe_serialization_crash)


if __name__ == "__main__":
    main()
