"""A PEFT LoRA adapter merged into its base: ``jaxshare merge`` against PEFT's own route.

A Llama-shaped Hugging Face directory -- by default hidden 2048, 16 layers, MLP 8192,
16 query heads and 4 key/value heads of 128, vocabulary 32000, untied head, bfloat16
(2.2 GB; the largest tensor, the embedding, 125 MiB) -- and a rank-16 adapter on every
layer's ``q_proj`` and ``v_proj`` (float32 factors, as PEFT makes them), made once
under ``--dir``. Each side runs in a fresh process under ``shared/tools/peakmem``
(peak RssAnon + RssShmem; a mapped file's pages do not count), the sides rotating
who goes first:

* **ours**: ``jaxshare merge MODEL ADAPTER OUT --quiet``;
* **PEFT**: ``AutoModelForCausalLM.from_pretrained`` (bfloat16) +
  ``PeftModel.from_pretrained`` + ``merge_and_unload`` + ``save_pretrained``, the route
  PEFT documents (checked against ours once, tensor by tensor);
* **the machine's limit**: the same bytes, ``model.safetensors``, copied and ``fsync``'d in a
  process of its own (start-up included, as for the other two).

``time`` is the whole process, start-up and imports included. Goals (issue 37): time
<= 0.5x PEFT's; <= 1.5x the limit; peak anonymous memory <= 2 x the largest tensor +
400 MiB.

Run (about 7 GB of free disk under ``--dir``, 6 GB of memory for PEFT)::

    .venv/bin/python benchmarks/lora_merge.py            # --rounds 3
    .venv/bin/python benchmarks/lora_merge.py --quick    # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from stream_convert import (
    GOAL_OVERHEAD_MB,
    HF_QUIET,
    MB,
    ROOT,
    child_env,
    copy_synced,
    load_average,
    measure_command,
    print_sides,
    ratio,
    remove,
    rotating_rounds,
)

PYTHON = str(ROOT / ".venv" / "bin" / "python")
GOAL_LIMIT, GOAL_PEER = 1.5, 0.5
TARGETS = ("q_proj", "v_proj")


def config_of(a: argparse.Namespace) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.hidden // 128,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": a.mlp,
        "vocab_size": a.vocab,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


def specs(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, q, kv, m = c["hidden_size"], c["hidden_size"], 4 * 128, c["intermediate_size"]
    out = [
        ("lm_head.weight", (c["vocab_size"], h)),
        ("model.embed_tokens.weight", (c["vocab_size"], h)),
        ("model.norm.weight", (h,)),
    ]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "mlp.gate_proj.weight", (m, h)),
            (p + "mlp.up_proj.weight", (m, h)),
            (p + "mlp.down_proj.weight", (h, m)),
        ]
    return sorted(out)


def build(model: Path, adapter: Path, config: dict, rank: int) -> None:
    """The directory and the adapter, with torch (random values; seed 0)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    import bridge
    from bridge.adapters.peft import LoraPair

    model.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    tensors = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in specs(config)}
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(0)
    pairs = {}
    for name, shape in specs(config):
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in TARGETS:
            a = rng.standard_normal((rank, shape[1]), dtype=np.float32) * 0.02
            b = rng.standard_normal((shape[0], rank), dtype=np.float32) * 0.02
            pairs[module] = LoraPair(a, b)
    lora = bridge.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=TARGETS, raw={"task_type": "CAUSAL_LM"}
    )
    bridge.save_adapter(adapter, lora, pairs)


def peft_merge(model: str, adapter: str, out: str) -> None:
    """PEFT's route: the base and the adapter loaded, merged, saved."""
    import peft
    import torch
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    merged = peft.PeftModel.from_pretrained(base, adapter).merge_and_unload()
    merged.save_pretrained(out)


def same_dirs(a: str, b: str) -> None:
    """Ours and PEFT's merged directories, tensor by tensor, bit for bit."""
    import ml_dtypes  # noqa: F401 -- numpy's name for bfloat16
    from safetensors.numpy import load_file

    def tensors(d: str) -> dict:
        files = sorted(Path(d).glob("*.safetensors"))
        return {k: v for f in files for k, v in load_file(f).items()}

    x, y = tensors(a), tensors(b)
    differ = [k for k in sorted(x) if k not in y or x[k].tobytes() != y[k].tobytes()]
    same = sorted(x) == sorted(y)
    print(json.dumps({"tensors": len(x), "same_names": same, "differ": differ[:5]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--mlp", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        {
            "build": lambda m, ad, c, r: build(Path(m), Path(ad), json.loads(c), int(r)),
            "peft": peft_merge,
            "same_dirs": lambda key, ours, peer: same_dirs(ours, peer),
            "limit": lambda m, dst: copy_synced(Path(m) / "model.safetensors", dst),
        }[a.child[0]](*a.child[1:])
        return
    if a.quick:
        a.layers, a.hidden, a.mlp, a.vocab, a.rounds = 2, 256, 1024, 1000, 1
    c = config_of(a)
    root = Path(a.dir or tempfile.gettempdir()) / "jaxshare-bench-cache"
    name = f"llama_h{a.hidden}_l{a.layers}_m{a.mlp}_v{a.vocab}_bf16"
    model, adapter = root / name, root / f"{name}_lora_r{a.rank}"
    env = child_env(**HF_QUIET)
    if not (adapter / "adapter_config.json").exists():
        print(f"Building {model} and {adapter} (once) ...", flush=True)
        remove(model)
        remove(adapter)
        build_cmd = [PYTHON, __file__, "--child", "build", str(model), str(adapter)]
        subprocess.run([*build_cmd, json.dumps(c), str(a.rank)], check=True, env=env)
    work = Path(tempfile.mkdtemp(dir=root, prefix="lora-"))

    def run(key: str, side: str) -> tuple[dict | None, Path]:
        dst = work / side
        cmd = {
            "ours": [PYTHON, "-m", "jaxshare.cli", "merge", str(model), str(adapter), str(dst)]
            + ["--quiet"],
            "peer": [PYTHON, __file__, "--child", "peft", str(model), str(adapter), str(dst)],
            "limit": [PYTHON, __file__, "--child", "limit", str(model), str(dst)],
        }[side]
        return measure_command(cmd, dst, env), dst

    check = [PYTHON, __file__, "--child", "same_dirs"]
    results, checks, loads = rotating_rounds(a.rounds, ["merge"], run, check, env)
    remove(work)
    size = (model / "model.safetensors").stat().st_size
    largest = max(2 * s[0] * (s[1] if len(s) > 1 else 1) for _, s in specs(c))
    goal_mb = 2 * largest / MB + GOAL_OVERHEAD_MB
    print(
        f"Llama-shaped: {a.layers} layers, hidden {a.hidden}, MLP {a.mlp}, vocab {a.vocab}, "
        f"bfloat16: {size / 1e9:.2f} GB, the largest tensor {largest / MB:.0f} MiB; a rank-"
        f"{a.rank} adapter on {', '.join(TARGETS)}. {a.rounds} round(s). The peer is PEFT; "
        f"ours against its merge: {checks['merge']}. " + load_average(loads)
    )
    names = {"merge": "merge"}
    print_sides(results, names, {"merge": goal_mb}, GOAL_PEER, width=10)
    runs = results["merge"]
    rounds = [i for i in range(a.rounds) if all(runs[side][i] for side in runs)]
    if rounds:
        vs_limit = ratio(runs, rounds, "ours", "limit", "wall_s")
        verdict = "met" if vs_limit <= GOAL_LIMIT else f"MISSED by {vs_limit - GOAL_LIMIT:.2f}"
        print(f"Ours <= {GOAL_LIMIT}x the limit: {vs_limit:.2f}, {verdict}.")
    print(f"Per round: {json.dumps(results)}")


if __name__ == "__main__":
    sys.exit(main())
