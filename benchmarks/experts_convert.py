"""A mixture of experts into an Orbax item with its experts stacked, and back.

A Qwen3-MoE-shaped Hugging Face directory with many small experts -- by default hidden
1024, 16 layers of 64 experts of MLP 384, 8 query heads and 4 key/value heads of 128,
vocabulary 32000, untied head, bfloat16 (2.6 GB; the largest stacked leaf, an expert
weight over every layer and expert, 768 MiB) -- in the per-expert names
``save_pretrained`` writes by default, made once with torch and kept under ``--dir``.
Each conversion runs in a fresh process under ``shared/tools/peakmem`` (peak RssAnon +
RssShmem; a mapped file's pages do not count), the sides rotating who goes first:

* **in, ours**: ``jaxshare convert MODEL ITEM --stack model.layers --stack
  'model.layers.{i}.mlp.experts'``: every expert weight one ``(L, E, in, out)`` leaf;
* **in, the peer**, the in-memory route a user writes: ``safe_open(framework="flax")``
  of every tensor into memory, ``np.stack`` of the experts and the layers (kernels
  transposed), ``ocp.StandardCheckpointer().save`` (the same tree; checked leaf by leaf
  against ours once);
* **out, ours**: ``jaxshare convert ITEM OUT --format hf`` (checked against the input
  once, tensor by tensor);
* **the machine's limit**, as ``roofline.py`` defines it: the max of the same bytes
  (``model.safetensors``) copied and ``fsync``'d, and the cores' work no pipeline avoids
  (:func:`cores`: the item's kernels transposed, plus zstd at Orbax's level compressing,
  on the way in, or decoding, on the way out, every core at once; they share the cores,
  so their times add). The ratio to the copy alone is printed too.

``time`` is the whole process, start-up and imports included, as a user runs it. Goals
(issue 36): each way <= 1.5x the limit; ours <= 0.5x the peer's time; peak anonymous
memory <= 2 x the largest stacked leaf + 400 MiB.

Run (about 9 GB of free disk under ``--dir``, 8 GB of memory for the peer)::

    .venv/bin/python benchmarks/experts_convert.py            # --rounds 3
    .venv/bin/python benchmarks/experts_convert.py --quick    # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stream_convert import (
    GOAL_OVERHEAD_MB,
    HF_QUIET,
    MB,
    ROOT,
    child_env,
    copy_synced,
    json_child,
    load_average,
    measure_command,
    remove,
)

PYTHON = str(ROOT / ".venv" / "bin" / "python")
STACKS = ("model.layers", "model.layers.{i}.mlp.experts")
GOAL_LIMIT, GOAL_PEER = 1.5, 0.5


def config_of(a: argparse.Namespace) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 4 * a.hidden,
        "moe_intermediate_size": a.moe,
        "num_local_experts": a.experts,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": a.vocab,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


def specs(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The per-expert directory's tensors, in ``save_pretrained``'s (sorted) order."""
    h, q, kv = c["hidden_size"], 8 * 128, 4 * 128
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
            (p + "mlp.gate.weight", (c["num_local_experts"], h)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (128,)),
            (p + "self_attn.k_norm.weight", (128,)),
        ]
        for e in range(c["num_local_experts"]):
            m = c["moe_intermediate_size"]
            out += [
                (f"{p}mlp.experts.{e}.gate_proj.weight", (m, h)),
                (f"{p}mlp.experts.{e}.up_proj.weight", (m, h)),
                (f"{p}mlp.experts.{e}.down_proj.weight", (h, m)),
            ]
    return sorted(out)


def build(model: Path, config: dict) -> None:
    """The directory, with torch (random bfloat16 values; seed 0)."""
    import torch
    from safetensors.torch import save_file

    model.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in specs(config)}
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps(config, indent=2))


def peer(model: str, item: str) -> None:
    """The in-memory route: every tensor read, stacked, transposed, saved by Orbax."""
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors import safe_open

    with safe_open(f"{model}/model.safetensors", framework="flax") as f:
        t = {k: np.asarray(f.get_tensor(k)) for k in f.keys()}  # noqa: SIM118
    c = json.loads(Path(model, "config.json").read_text())
    n, e = c["num_hidden_layers"], c["num_local_experts"]

    def kernel(name: str) -> np.ndarray:
        return t[name].T if t[name].ndim == 2 and "embed" not in name else t[name]

    layers: dict = {}
    keys = [k.removeprefix("model.layers.0.") for k in t if k.startswith("model.layers.0.")]
    for key in keys:
        if ".experts." in key:
            continue
        leaf = {"weight": "kernel"}.get(key.rsplit(".", 1)[1], key.rsplit(".", 1)[1])
        leaf = "scale" if "norm" in key else leaf
        path = key.rsplit(".", 1)[0].split(".")
        node = layers
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = np.stack([kernel(f"model.layers.{i}.{key}") for i in range(n)])
    experts = layers["mlp"].setdefault("experts", {})
    for w in ("gate_proj", "up_proj", "down_proj"):
        experts[w] = {
            "kernel": np.stack(
                [
                    np.stack(
                        [t[f"model.layers.{i}.mlp.experts.{x}.{w}.weight"].T for x in range(e)]
                    )
                    for i in range(n)
                ]
            )
        }
    tree = {
        "params": {
            "lm_head": {"kernel": kernel("lm_head.weight")},
            "model": {
                "embed_tokens": {"embedding": t["model.embed_tokens.weight"]},
                "norm": {"scale": t["model.norm.weight"]},
                "layers": layers,
            },
        }
    }
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(item).resolve(), tree)
        checkpointer.wait_until_finished()


def cores(model: str) -> None:
    """The cores' work no pipeline avoids, as ``roofline.py`` measures it (every core at
    once, into buffers kept hot): each 2-D weight transposed as the item holds it
    (jaxshare's tiled copy on threads), and the model's bytes through zstd at Orbax's
    level 1 in 16 MiB chunks, compressed (the way in) and decoded (the way out). Prints
    JSON seconds; the stages share the cores, so a route's cores limit is their sum."""
    import concurrent.futures as cf
    import threading

    import numpy as np
    import zstandard

    from jaxshare.formats.safetensors import SafetensorsFile
    from jaxshare.io.transpose import contiguous_transpose

    with SafetensorsFile(f"{model}/model.safetensors") as f:
        arrays = {n: np.array(f.array(n)) for n in f.infos}
    flat = b"".join(a.tobytes() for a in arrays.values())
    chunks = [flat[k : k + (16 << 20)] for k in range(0, len(flat), 16 << 20)]
    # Every 2-D weight but the embedding is a kernel, transposed (the peer's `kernel`).
    mats = [a for n, a in arrays.items() if a.ndim == 2 and "embed" not in n]
    hot = {a.shape: np.empty(a.shape[::-1], a.dtype) for a in mats}
    pool = cf.ThreadPoolExecutor(os.cpu_count() or 1)
    local = threading.local()

    def transpose(a: np.ndarray) -> None:  # (Each on one core, the cores all at once.)
        outs = local.__dict__.setdefault("outs", {})  # (This thread's buffers, kept hot.)
        if a.shape not in outs:
            outs[a.shape] = hot[a.shape].copy()
        contiguous_transpose(a, (1, 0), out=outs[a.shape], threads=False)

    def compress(raw: bytes) -> bytes:
        local.c = getattr(local, "c", None) or zstandard.ZstdCompressor(level=1)
        return local.c.compress(raw)

    def decompress(frame: bytes) -> None:
        zstandard.ZstdDecompressor().decompress(frame)

    def best(fn) -> float:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    frames = list(pool.map(compress, chunks))
    print(
        json.dumps(
            {
                "transpose_s": best(lambda: list(pool.map(transpose, mats))),
                "zstd_compress_s": best(lambda: list(pool.map(compress, chunks))),
                "zstd_decode_s": best(lambda: list(pool.map(decompress, frames))),
            }
        )
    )


def same_items(ours: str, theirs: str) -> None:
    """Ours and the peer's item, restored with plain Orbax, leaf for leaf."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as c:
        a, b = c.restore(Path(ours).resolve()), c.restore(Path(theirs).resolve())
    fa = dict(jax.tree_util.tree_leaves_with_path(a))
    fb = dict(jax.tree_util.tree_leaves_with_path(b))
    bad = [
        jax.tree_util.keystr(k)
        for k in fa
        if k not in fb or np.asarray(fa[k]).tobytes() != np.asarray(fb[k]).tobytes()
    ]
    print(
        json.dumps(
            {"leaves": len(fa), "differ": bad[:5] + sorted(map(str, fb.keys() - fa.keys()))[:5]}
        )
    )


def same_dirs(a: str, b: str) -> None:
    from safetensors import safe_open

    with (
        safe_open(f"{a}/model.safetensors", "flax") as x,
        safe_open(f"{b}/model.safetensors", "flax") as y,
    ):
        import numpy as np

        keys = sorted(x.keys())
        bad = [
            k
            for k in keys
            if np.asarray(x.get_tensor(k)).tobytes() != np.asarray(y.get_tensor(k)).tobytes()
        ]
        print(
            json.dumps(
                {"tensors": len(keys), "same_names": keys == sorted(y.keys()), "differ": bad[:5]}
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--moe", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        {
            "build": lambda m, c: build(Path(m), json.loads(c)),
            "peer": peer,
            "same_items": same_items,
            "same_dirs": same_dirs,
            "cores": cores,
        }[a.child[0]](*a.child[1:])
        return
    if a.quick:
        a.layers, a.experts, a.hidden, a.moe, a.vocab, a.rounds = 2, 4, 256, 64, 1000, 1
    c = config_of(a)
    root = Path(a.dir or tempfile.gettempdir()) / "jaxshare-bench-cache"
    model = root / f"qwen3moe_h{a.hidden}_l{a.layers}_e{a.experts}_m{a.moe}_v{a.vocab}_bf16"
    env = child_env(**HF_QUIET)
    if not (model / "config.json").exists():
        print(f"Building {model} (once) ...", flush=True)
        subprocess.run(
            [PYTHON, __file__, "--child", "build", str(model), json.dumps(c)], check=True, env=env
        )
    work = Path(tempfile.mkdtemp(dir=root, prefix="experts-"))
    stacks = [x for s in STACKS for x in ("--stack", s)]
    cli = [PYTHON, "-m", "jaxshare.cli", "convert"]
    item = work / "item"
    subprocess.run([*cli, str(model), str(item), *stacks, "--quiet"], check=True, env=env)
    sides = {
        "in, ours": ([*cli, str(model), str(work / "in"), *stacks, "--quiet"], work / "in"),
        "in, the peer": (
            [PYTHON, __file__, "--child", "peer", str(model), str(work / "peer")],
            work / "peer",
        ),
        "out, ours": (
            [*cli, str(item), str(work / "out"), "--format", "hf", "--quiet"],
            work / "out",
        ),
    }
    results: dict[str, list[dict]] = {k: [] for k in [*sides, "limit"]}
    loads = []
    for r in range(a.rounds):
        order = list(results)[r % 4 :] + list(results)[: r % 4]
        for side in order:
            if side == "limit":
                dst = work / "copy.safetensors"
                remove(dst)
                os.sync()
                t0 = time.perf_counter()
                copy_synced(model / "model.safetensors", dst)
                results[side].append({"wall_s": time.perf_counter() - t0})
                remove(dst)
                continue
            cmd, dst = sides[side]
            figures = measure_command(cmd, dst, env)
            results[side].append(figures or {})
            if r == 0 and side == "in, the peer":
                check = json_child(
                    [PYTHON, __file__, "--child", "same_items", str(item), str(dst)], env
                )
                print(f"peer's item against ours: {check}")
            if r == 0 and side == "out, ours":
                check = json_child(
                    [PYTHON, __file__, "--child", "same_dirs", str(model), str(dst)], env
                )
                print(f"ours out against the input: {check}")
            remove(dst)
        loads.append(os.getloadavg())
    remove(item)
    remove(work)
    size = (model / "model.safetensors").stat().st_size
    largest = a.layers * a.experts * a.hidden * a.moe * 2
    goal_mb = 2 * largest / MB + GOAL_OVERHEAD_MB

    def med(side: str, key: str) -> float:
        vals = [f[key] for f in results[side] if key in f]
        return statistics.median(vals) if vals else float("nan")

    copy = med("limit", "wall_s")
    work = json_child([PYTHON, __file__, "--child", "cores", str(model)], env)
    if isinstance(work, str):
        raise SystemExit(f"the cores' measure {work}")
    # The roofline (roofline.py): the max of the disk's copy and the cores' work, the
    # transposes plus zstd compressing (the way in) or decoding (the way out).
    limits = {
        "in, ours": max(copy, work["transpose_s"] + work["zstd_compress_s"]),
        "in, the peer": max(copy, work["transpose_s"] + work["zstd_compress_s"]),
        "out, ours": max(copy, work["transpose_s"] + work["zstd_decode_s"]),
    }
    print(
        f"Qwen3-MoE-shaped: {a.layers} layers x {a.experts} experts, hidden {a.hidden}, MLP "
        f"{a.moe}, vocab {a.vocab}, bfloat16: {size / 1e9:.2f} GB; the largest stacked leaf "
        f"{largest / MB:.0f} MiB. {a.rounds} round(s). " + load_average([os.getloadavg(), *loads])
    )
    print(
        f"The cores, every one at once: transposes {work['transpose_s']:.2f} s, zstd "
        f"(level 1) compressing {work['zstd_compress_s']:.2f} s, decoding "
        f"{work['zstd_decode_s']:.2f} s; the copy + fsync {copy:.2f} s."
    )
    print(
        f"{'side':<14} {'time s':>7} {'limit s':>8} {'/limit':>7} {'/copy':>6} {'/peer':>6} "
        f"{'peak MiB':>9}"
    )
    for side in sides:
        t = med(side, "wall_s")
        peak = (
            med(side, "peak_anon_mb")
            if "peak_anon_mb" in (results[side][0] or {})
            else float("nan")
        )
        peer_ratio = t / med("in, the peer", "wall_s") if side == "in, ours" else float("nan")
        print(
            f"{side:<14} {t:7.2f} {limits[side]:8.2f} {t / limits[side]:7.2f} {t / copy:6.2f} "
            f"{peer_ratio:6.2f} {peak:9.0f}"
        )
    print(
        f"Goals: each way <= {GOAL_LIMIT}x the limit; in, ours <= {GOAL_PEER}x the peer; "
        f"peak <= {goal_mb:.0f} MiB. Per round: {json.dumps(results)}"
    )


if __name__ == "__main__":
    sys.exit(main())
