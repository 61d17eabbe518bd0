"""Builds the DeepSpeed ZeRO training-state fixtures with the real DeepSpeed.

Each fixture is a checkpoint folder written by ``engine.save_checkpoint`` after
three AdamW steps of a tiny Hugging Face model -- GPT-2 (``lm_head`` tied to
``transformer.wte``, ``transformer.wpe`` frozen) or Llama (untied, nothing
frozen) -- and, beside the checkpoint in the same folder, what the tests need to
check a reader and a resumed run without deepspeed:

``reference.pt``
    DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` of the folder
    (as under ``tests/data/deepspeed``; each tie one storage).
``config.json``
    the model's Hugging Face config (``model_type`` names the class).
``optimizer_reference.pt``
    the optimizer state as DeepSpeed's engine holds it at the checkpoint,
    gathered on the ranks with DeepSpeed's own API (``safe_get_full_optimizer_state``,
    ``safe_get_full_fp32_param``; no reader of the files involved), in the
    model's parameter names (each tie once, under ``named_parameters``' name):
    ``{"exp_avg": {name: tensor}, "exp_avg_sq": {...}, "fp32_params": {...},
    "step": {name: int}, "groups": [{"names": [...], "lr": ..., "betas": (..),
    "eps": .., "weight_decay": .., ...every entry of the torch group but
    params}], "frozen": [names], "ties": {alias: canonical}, "train": {...}}``.
``continuation.pt``
    five more DeepSpeed steps after the checkpoint:
    ``{"batches": int64 [5, world, micro, seq], "first_batches": int64 [3, ...],
    "grads": [{name: tensor}] * 5, "params": [{name: tensor}] * 5,
    "losses": float32 [5, world]}``. Rank ``r`` trains step ``k`` on
    ``batches[k, r]`` as ``input_ids`` and ``labels`` (the Hugging Face causal-LM
    loss, each rank's mean; DeepSpeed averages the ranks' gradients).
    ``grads[k]`` is DeepSpeed's full averaged gradient (``safe_get_full_grad``
    after ``engine.backward``, before ``engine.step``; gradient clipping is off),
    ``params[k]`` the fp32 master weights after ``engine.step``
    (``safe_get_full_fp32_param``).

The optimizer is ``torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)`` over
two groups built as the Hugging Face Trainer builds them (weight decay 0.1, and
0.0 for biases and norms); dropout is 0 and gradient clipping off, so the five
steps are reproducible from the batches alone. ``make_fixtures.log`` records
the versions and a replay of the five steps with plain ``torch.optim.AdamW`` from
``optimizer_reference.pt`` and the recorded gradients (it matches DeepSpeed's
fp32 parameters bit for bit, in every fixture).

DeepSpeed 0.19.8's ZeRO-1/2 optimizer links each parameter to its moments after
its first step, when only the first group's state exists, so
``safe_get_full_optimizer_state`` raises "exp_avg not found" for the other groups;
the worker links them again (``_lazy_init_hp_params_optimizer_state``) first.

Run from the repository root (``make optim-fixtures``; DeepSpeed lives in the
bench venv)::

    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=build/torch_extensions \\
        .venv-bench/bin/python tests/data/deepspeed_optim/make_fixtures.py

The ranks run under ``torchrun`` with gloo on the CPU.
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 3  # before the checkpoint
MORE = 5  # after it
MICRO, SEQ = 2, 8
HYPER = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8}
DECAY = 0.1

#: name -> (model, ZeRO stage, world size, training dtype, more zero_optimization settings)
FIXTURES: dict[str, tuple[str, int, int, str, dict]] = {
    "gpt2_z2_w2_fp32": ("gpt2", 2, 2, "fp32", {}),
    "gpt2_z3_w2_fp32": ("gpt2", 3, 2, "fp32", {}),
    "gpt2_z2_w2_bf16": ("gpt2", 2, 2, "bf16", {}),
    "llama_z2_w2_fp32": ("llama", 2, 2, "fp32", {}),
    "llama_z3_w2_fp32": ("llama", 3, 2, "fp32", {}),
    # an odd world size, and ZeRO-3 sub-groups: several flat groups per parameter group
    "llama_z3_w3_fp32": ("llama", 3, 3, "fp32", {"sub_group_size": 150}),
    "gpt2_z1_w3_fp32": ("gpt2", 1, 3, "fp32", {}),
}


def build_model(kind: str):
    """A tiny model; odd sizes, so ZeRO pads its partitions (ZeRO-1/2: the decay group
    of GPT-2, the norms of Llama, at world sizes 2 and 3; ZeRO-3: every odd parameter)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # the same initial weights on every rank
    if kind == "gpt2":
        config = GPT2Config(vocab_size=61, n_embd=9, n_head=3, n_layer=2, n_positions=16,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)  # fmt: skip
        model = GPT2LMHeadModel(config)
        model.transformer.wpe.weight.requires_grad_(False)
    else:
        config = LlamaConfig(vocab_size=61, hidden_size=9, intermediate_size=20,
                             num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                             head_dim=4, max_position_embeddings=16,
                             tie_word_embeddings=False)  # fmt: skip
        model = LlamaForCausalLM(config)
    return model


def param_groups(model) -> list[dict]:
    """The decay and no-decay groups, as the Hugging Face Trainer builds them."""
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    patterns = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay = set(get_parameter_names(model, [nn.LayerNorm], patterns))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"names": [n for n, _ in named if n in decay], "weight_decay": DECAY},
        {"names": [n for n, _ in named if n not in decay], "weight_decay": 0.0},
    ]


def worker(name: str, out: str) -> None:
    """One rank of a training run (started by torchrun)."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.utils import (
        safe_get_full_fp32_param,
        safe_get_full_grad,
        safe_get_full_optimizer_state,
    )

    kind, stage, world, dtype, extra = FIXTURES[name]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = build_model(kind)
    named = dict(model.named_parameters())
    groups = param_groups(model)
    optimizer = torch.optim.AdamW(
        [{"params": [named[n] for n in g["names"]], "weight_decay": g["weight_decay"]}
         for g in groups],
        **HYPER,
    )  # fmt: skip
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, **extra},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
        "bf16": {"enabled": dtype == "bf16"},
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(1234)  # the same batches on every rank
    batches = torch.randint(0, vocab, (STEPS + MORE, world, MICRO, SEQ), generator=generator)

    def train_step(k: int) -> float:
        ids = batches[k, rank]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        return float(loss.detach())

    for k in range(STEPS):
        train_step(k)
        engine.step()
    engine.save_checkpoint(out)

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def full(get, *args) -> dict:  # collective under ZeRO-3: every rank calls it
        return {n: get(p, *args).detach().float().cpu().clone() for n, p in trainable}

    if hasattr(engine.optimizer, "_hp_optimizer_states_linked"):  # ZeRO-1/2
        # DeepSpeed links the parameters to their moments after its first step,
        # when only the first group's state exists (the others then have none
        # and safe_get_full_optimizer_state raises "exp_avg not found"): link again.
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    moments = {k: full(safe_get_full_optimizer_state, k) for k in ("exp_avg", "exp_avg_sq")}
    masters = full(safe_get_full_fp32_param)
    base = engine.optimizer.optimizer  # the torch AdamW over DeepSpeed's flat partitions
    steps = {int(float(s["step"])) for s in base.state.values()}
    assert len(steps) == 1, steps
    step = steps.pop()
    hypers = [{k: v for k, v in g.items() if k != "params"} for g in base.param_groups]
    grads, params, losses = [], [], []
    for k in range(STEPS, STEPS + MORE):
        losses.append(train_step(k))
        grads.append(full(safe_get_full_grad))
        engine.step()
        params.append(full(safe_get_full_fp32_param))
    gathered = [None] * world
    dist.all_gather_object(gathered, losses)
    if rank == 0:
        by_name = dict(model.named_parameters(remove_duplicate=False))
        ties = {a: c for a, p in by_name.items() for c, q in named.items() if p is q and a != c}
        torch.save(
            {
                "exp_avg": moments["exp_avg"],
                "exp_avg_sq": moments["exp_avg_sq"],
                "fp32_params": masters,
                "step": {n: step for n, _ in trainable},
                "groups": [{"names": g["names"], **h} for g, h in zip(groups, hypers, strict=True)],
                "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
                "ties": ties,
                "train": {"model": kind, "stage": stage, "world_size": world, "dtype": dtype,
                          "micro_batch": MICRO, "seq": SEQ, "steps_done": STEPS,
                          "gradient_clipping": 0.0, **extra},
            },
            Path(out) / "optimizer_reference.pt",
        )  # fmt: skip
        torch.save(
            {
                "batches": batches[STEPS:].clone(),
                "first_batches": batches[:STEPS].clone(),
                "grads": grads,
                "params": params,
                "losses": torch.tensor(gathered, dtype=torch.float32).T.contiguous(),
            },
            Path(out) / "continuation.pt",
        )
        (Path(out) / "config.json").write_text(model.config.to_json_string())
    dist.barrier()
    dist.destroy_process_group()  # gloo torn down before exit (else an abort, now and then)


def check(name: str, root: Path, log) -> None:
    """DeepSpeed's consolidation as ``reference.pt``, and the five steps replayed
    with plain ``torch.optim.AdamW`` from the recorded state and gradients."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(root))
    torch.save(dict(state), root / "reference.pt")
    ref = torch.load(root / "optimizer_reference.pt", weights_only=True)
    cont = torch.load(root / "continuation.pt", weights_only=True)
    same = all(torch.equal(state[n], t) for n, t in ref["fp32_params"].items())
    log(f"  {len(state)} tensors; ties {ref['ties']}; frozen {ref['frozen']}; step "
        f"{set(ref['step'].values())}; fp32_params == zero_to_fp32's: {same}")  # fmt: skip
    params = {n: torch.nn.Parameter(t.clone()) for n, t in ref["fp32_params"].items()}
    hypers = [{k: v for k, v in g.items() if k != "names"} for g in ref["groups"]]
    named = [(g["names"], h) for g, h in zip(ref["groups"], hypers, strict=True)]
    order = [n for g in ref["groups"] for n in g["names"]]
    opt = torch.optim.AdamW([{**h, "params": [params[n] for n in names]} for names, h in named])
    state = {
        i: {"step": torch.tensor(float(ref["step"][n]))}
        | {k: ref[k][n].clone() for k in ("exp_avg", "exp_avg_sq")}
        for i, n in enumerate(order)
    }
    opt.load_state_dict({
        "state": state,
        "param_groups": [{**h, "params": [order.index(n) for n in names]} for names, h in named],
    })  # fmt: skip
    worst = []
    for grads, want in zip(cont["grads"], cont["params"], strict=True):
        for n, p in params.items():
            p.grad = grads[n].clone()
        opt.step()
        rel = [(p.detach() - want[n]).abs() / want[n].abs().clamp_min(1e-30) for n, p in
               params.items()]  # fmt: skip
        worst.append(max(float(r.max()) for r in rel))
    log(
        f"  losses {[round(float(x), 4) for x in cont['losses'].mean(1)]}; torch AdamW replay "
        f"from the recorded grads, max rel diff per step: {[f'{w:.1e}' for w in worst]}"
    )


def describe(name: str) -> str:
    kind, stage, world, dtype, extra = FIXTURES[name]
    return f"{name}: {kind}, ZeRO-{stage}, world size {world}, {dtype} {extra or ''}"


def main() -> None:
    """The driver both DeepSpeed fixture scripts share (``../deepspeed_fixtures.py``);
    a training run that fails is run once more (a rank of gloo on a busy CPU aborts,
    now and then)."""
    run = runpy.run_path(str(HERE.parent / "deepspeed_fixtures.py"))["main"]
    adamw = f"AdamW {json.dumps(HYPER)}, weight decay {DECAY} / 0.0, {STEPS} steps, then {MORE}"
    run(__file__, __doc__, FIXTURES, worker, describe, check, heading=[adamw], sizes=True, tries=2)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
