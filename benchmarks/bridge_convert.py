"""The PyTorch bridge beside what users run today, in one run.

1. ``bridge.to_flax`` against Hugging Face's ``convert_pytorch_state_dict_to_flax``
   (transformers 4.57) on a GPT-2-small state dict (124M float32 parameters,
   ~500 MB), both producing the params of ``FlaxGPT2LMHeadModel`` (built from a
   ``GPT2Config()``, nothing downloaded). Each measurement runs in a fresh
   subprocess, the peers alternating over ``--rounds``: a subprocess's time is
   the best of its ``--repeat`` conversions after a warm-up one on a smaller
   model, and the ratio is the median over rounds of the paired ratios (ours /
   Hugging Face's in the same round, so both see the same load); extra peak
   memory is the largest over rounds of the peak RSS during a subprocess's first
   conversion (Linux ``VmHWM``, reset just before) minus the RSS before it, as a
   multiple of the model's bytes. Goals: time <= 0.4x Hugging Face's; extra peak
   memory <= 1.1x the model.
2. ``bridge.shared_params`` against DeepSpeed's ``DeepSpeedEngine._get_shared_params``
   on the same GPT-2-small module (DeepSpeed's method called on a minimal engine
   stand-in: it reads only ``self.module`` and ``zero_optimization_partition_weights``).
   A subprocess's time for each is the best of ``--repeat`` runs of 50 calls; the ratio
   is the median over rounds of the paired ratios, as in 1. Goal: <= 1.5x DeepSpeed's
   time.

Run (peers live in their own venv, see the Makefile's ``bench``)::

    .venv-bench/bin/python benchmarks/bridge_convert.py
    .venv-bench/bin/python benchmarks/bridge_convert.py --only shared --rounds 7  # 2. only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
import types
from pathlib import Path

GOAL_TIME, GOAL_MEMORY, GOAL_SHARED = 0.4, 1.1, 1.5


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _gpt2(n_layer: int | None = None):
    import torch
    from transformers import FlaxGPT2LMHeadModel, GPT2Config, GPT2LMHeadModel

    config = GPT2Config() if n_layer is None else GPT2Config(n_layer=n_layer, n_embd=64, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    flax_model = FlaxGPT2LMHeadModel(config, _do_init=False)
    return model, flax_model


def _converter(which: str, flax_model):
    """``convert(state_dict) -> params`` for ``which`` of "hf" and "bridge"."""
    shapes = flax_model.params_shape_tree
    if which == "hf":
        from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax

        # The converter reads only these two attributes; a model built with
        # `_do_init=False` (no random weights in memory) refuses `.params`.
        stand_in = types.SimpleNamespace(
            base_model_prefix=flax_model.base_model_prefix, params=shapes
        )
        return lambda sd: convert_pytorch_state_dict_to_flax(
            dict(sd), stand_in
        )  # it mutates its input
    import bridge

    return lambda sd: bridge.to_flax(sd, like=shapes)[0]


def child_to_flax(which: str, repeat: int) -> dict:
    import jax

    small, small_flax = _gpt2(n_layer=1)
    convert = _converter(which, small_flax)
    jax.block_until_ready(convert(small.state_dict()))  # first-call costs out of the way
    model, flax_model = _gpt2()
    state = model.state_dict()
    model_bytes = sum(t.nbytes for k, t in state.items() if k != "lm_head.weight")  # lm_head is wte
    convert = _converter(which, flax_model)
    times, extra = [], None
    for i in range(repeat):
        gc.collect()
        before = _rss_kib("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        out = jax.block_until_ready(convert(state))
        times.append(time.perf_counter() - start)
        if i == 0:
            extra = (_rss_kib("VmHWM") - before) * 1024
            leaves = {
                "/".join(str(k.key) for k in p): x
                for p, x in jax.tree_util.tree_flatten_with_path(out)[0]
            }
            check = {k: float(abs(leaves[k]).sum()) for k in sorted(leaves)[:3]}
        del out
    return {
        "which": which,
        "seconds": min(times),
        "extra_peak_bytes": extra,
        "model_bytes": model_bytes,
        "leaves": len(leaves),
        "check": check,
    }


def child_shared(repeat: int) -> dict:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    import bridge

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    model, _ = _gpt2()
    engine = types.SimpleNamespace(module=model, zero_optimization_partition_weights=lambda: False)
    theirs = DeepSpeedEngine._get_shared_params(engine)
    ours = bridge.shared_params(model)
    assert ours == theirs, (ours, theirs)
    # Each repeat times both, one after the other, so both see the same load.
    number, t_ds, t_ours = 50, [], []
    for _ in range(repeat):
        t_ds.append(
            timeit.timeit(lambda: DeepSpeedEngine._get_shared_params(engine), number=number)
        )
        t_ours.append(timeit.timeit(lambda: bridge.shared_params(model), number=number))
    return {
        "deepspeed_seconds": min(t_ds) / number,
        "bridge_seconds": min(t_ours) / number,
        "ties": ours,
    }


def _run_child(*args: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="bridge vs Hugging Face and DeepSpeed")
    parser.add_argument("--repeat", type=int, default=3, help="conversions per subprocess")
    parser.add_argument("--rounds", type=int, default=3, help="subprocesses per peer, alternated")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--only", choices=("to_flax", "shared"), default=None, help="run one of the two measures"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = (
            child_to_flax(rest[0], args.repeat) if kind == "to_flax" else child_shared(args.repeat)
        )
        print(json.dumps(result))
        return

    # Alternate the peers over rounds and pair them: on a shared machine the load
    # drifts, and this way both see the same drift.
    measures = ("to_flax", "shared") if args.only is None else (args.only,)
    runs: dict[str, list[dict]] = {"hf": [], "bridge": [], "shared": []}
    for _ in range(args.rounds):
        if "to_flax" in measures:
            for which in ("hf", "bridge"):
                runs[which].append(_run_child("to_flax", which, "--repeat", str(args.repeat)))
        if "shared" in measures:
            runs["shared"].append(_run_child("shared", "--repeat", str(args.repeat)))
    rows: list[tuple[str, ...]] = []
    goals: dict[str, bool] = {}
    results: dict[str, dict] = {}
    if "to_flax" in measures:
        hf, ours = (min(runs[w], key=lambda r: r["seconds"]) for w in ("hf", "bridge"))
        for which, best in (("hf", hf), ("bridge", ours)):  # memory: the worst first conversion
            best["extra_peak_bytes"] = max(r["extra_peak_bytes"] for r in runs[which])
        model_mb = ours["model_bytes"] / 2**20
        paired = [
            b["seconds"] / h["seconds"] for h, b in zip(runs["hf"], runs["bridge"], strict=True)
        ]
        time_ratio = statistics.median(paired)
        memory = {r["which"]: r["extra_peak_bytes"] / r["model_bytes"] for r in (hf, ours)}
        rows += [
            (
                "to_flax, GPT-2 small",
                f"{model_mb:.0f} MB",
                f"{hf['seconds']:.3f} s",
                f"{ours['seconds']:.3f} s",
                f"{time_ratio:.2f}x (paired: {', '.join(f'{r:.2f}' for r in paired)})",
                f"<= {GOAL_TIME}x",
            ),
            (
                "  extra peak memory / model bytes",
                "",
                f"{memory['hf']:.2f}x",
                f"{memory['bridge']:.2f}x",
                "",
                f"<= {GOAL_MEMORY}x",
            ),
        ]
        goals["to_flax time"] = time_ratio <= GOAL_TIME
        goals["to_flax memory"] = memory["bridge"] <= GOAL_MEMORY
        results.update(hf=hf, bridge=ours)
        print(
            f"peers: Hugging Face leaves {hf['leaves']} arrays (lm_head copied), "
            f"bridge {ours['leaves']} (lm_head an alias of wte)"
        )
    if "shared" in measures:
        shared_paired = [r["bridge_seconds"] / r["deepspeed_seconds"] for r in runs["shared"]]
        shared_ratio = statistics.median(shared_paired)
        shared = {
            "deepspeed_seconds": statistics.median(r["deepspeed_seconds"] for r in runs["shared"]),
            "bridge_seconds": statistics.median(r["bridge_seconds"] for r in runs["shared"]),
            "paired": shared_paired,
            "ties": runs["shared"][0]["ties"],
        }
        rows.append(
            (
                "shared_params, GPT-2 small",
                "",
                f"{shared['deepspeed_seconds'] * 1e3:.3f} ms",
                f"{shared['bridge_seconds'] * 1e3:.3f} ms",
                f"{shared_ratio:.2f}x (paired: {', '.join(f'{r:.2f}' for r in shared_paired)})",
                f"<= {GOAL_SHARED}x",
            )
        )
        goals["shared_params time"] = shared_ratio <= GOAL_SHARED
        results["shared"] = shared
        print("DeepSpeed and bridge agree on the ties:", shared["ties"])
    header = ("measure", "size", "peer", "bridge", "ratio", "goal")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print("goals:", ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in goals.items()))
    if args.json:
        args.json.write_text(json.dumps({**results, "goals": goals}, indent=2))


if __name__ == "__main__":
    main()
