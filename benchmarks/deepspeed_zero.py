"""``bridge``'s DeepSpeed reader beside DeepSpeed's own ``zero_to_fp32``, in one run.

A ZeRO-3 checkpoint of GPT-2 small (124M parameters, ``lm_head`` tied to
``transformer.wte``; about 1.5 GB of files) is written by the real DeepSpeed
(world size 2, gloo on CPU, one AdamW step) into a temporary folder, then read
both ways, each measurement in a fresh subprocess under
``shared/tools/peakmem`` (found beside the checkout as ``stream_convert.py`` finds
it; peak anonymous memory of the process tree), the
peers alternating over ``--rounds``:

- ``dict``: the full fp32 state dict in memory. DeepSpeed:
  ``get_fp32_state_dict_from_zero_checkpoint(root)``; ours:
  ``bridge.load_deepspeed(root)``.
- ``file``: that state dict on disk. DeepSpeed: its state dict, then
  ``torch.save`` and ``fsync`` (its ``--safe_serialization`` crashes on the
  tie); ours: ``save_plan(path, Plan.identity(ckpt), ckpt)`` (``jaxshare convert``), streamed
  (it fsyncs before renaming the file into place).
- ``zero_to_fp32`` (for information): DeepSpeed's converter
  (``convert_zero_checkpoint_to_fp32_state_dict``, what ``zero_to_fp32.py``
  runs; no fsync) beside the same streamed safetensors file.

Time is the work call alone (``call``: imports excluded) and the whole
subprocess (``process``: interpreter, imports and call). DeepSpeed imports torch
(and deepspeed) in every mode; ours reads the files without torch, and imports
it only in ``dict`` mode, whose result is torch tensors. Ratios are ours /
DeepSpeed's, the median over rounds of the paired ratios. Goals: time <= 0.5x
and peak memory <= 0.5x; a missed goal prints MISSED. Before measuring, one
subprocess checks that both give the same tensors bit for bit.

Run (DeepSpeed lives in the bench venv, see the Makefile's ``bench``)::

    DS_ACCELERATOR=cpu .venv-bench/bin/python benchmarks/deepspeed_zero.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stream_convert import PEAKMEM  # shared/tools/peakmem, found relative to the checkout

GOAL_TIME, GOAL_MEMORY = 0.5, 0.5
HERE = Path(__file__).resolve()
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0",
       "TORCH_EXTENSIONS_DIR": str(HERE.parents[1] / "build" / "torch_extensions")}  # fmt: skip


# -- the checkpoint ---------------------------------------------------------------------


def generate_worker(out: str) -> None:
    """One rank of a one-step ZeRO-3 run of GPT-2 small (under torchrun)."""
    import deepspeed
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10_000}  # fmt: skip
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    ids = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(out)


def generate(root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(port), str(HERE),
           "--generate-worker", str(root)]  # fmt: skip
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if run.returncode:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
        raise SystemExit("generating the checkpoint failed")


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- the measured children ----------------------------------------------------------------


def child(peer: str, mode: str, root: str, out: str) -> None:
    """Runs one measurement; prints ``{"import_s", "call_s", ...}`` as JSON."""
    t0 = time.perf_counter()
    if peer == "deepspeed":
        import torch
        from deepspeed.utils import zero_to_fp32
    elif mode == "dict":  # Its result is torch tensors; the files are read without torch.
        from bridge import load_deepspeed  # (Imports are not the call's time.)
    else:  # The folder to a file: numpy only.
        from jaxshare.formats import DeepSpeedCheckpoint, save_plan
        from jaxshare.stream import Plan
    t1 = time.perf_counter()
    if peer == "deepspeed" and mode == "dict":
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)
    elif peer == "deepspeed" and mode == "file":
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)
        torch.save(state, out)
        fd = os.open(out, os.O_RDONLY)  # on disk when the call returns, as ours is
        os.fsync(fd)
        os.close(fd)
    elif peer == "deepspeed":
        zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(root, out)
    elif mode == "dict":
        state = load_deepspeed(root)
    else:
        with DeepSpeedCheckpoint(root) as ckpt:
            save_plan(out, Plan.identity(ckpt), ckpt)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "call_s": t2 - t1}))


def check(root: str) -> None:
    """Both readers give the same names, dtypes, bits and ties."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    import bridge

    theirs = get_fp32_state_dict_from_zero_checkpoint(root)
    ours = bridge.load_deepspeed(root)
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for k, t in theirs.items():
        a, b = ours[k], t.detach().contiguous()
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), k
    assert ours["lm_head.weight"] is ours["transformer.wte.weight"]
    print(json.dumps({"tensors": len(ours), "bytes": sum(t.nbytes for t in theirs.values())}))


def measure(peer: str, mode: str, root: Path, scratch: Path) -> dict:
    suffix = {"dict": "", "file": ".safetensors" if peer == "ours" else ".bin"}.get(mode, "")
    out = scratch / f"{peer}-{mode}{suffix}"
    cmd = [sys.executable, str(PEAKMEM), "--json", "--", sys.executable, str(HERE), "--child",
           peer, mode, str(root), str(out)]  # fmt: skip
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if run.returncode:
        sys.stderr.write(run.stdout[-3000:] + run.stderr[-3000:])
        raise SystemExit(f"{peer} {mode} failed")
    fig = json.loads(run.stderr.strip().splitlines()[-1])
    fig.update(json.loads(run.stdout.strip().splitlines()[-1]))
    if out.is_dir():
        shutil.rmtree(out)
    else:
        out.unlink(missing_ok=True)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checkpoint", type=Path, help="reuse this generated checkpoint folder")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--check", help=argparse.SUPPRESS)
    ap.add_argument("--generate-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    if args.check:
        return check(args.check)
    if args.generate_worker:
        return generate_worker(args.generate_worker)
    if not PEAKMEM.exists():
        raise SystemExit(f"{PEAKMEM}: missing; put shared/tools/peakmem in or beside the checkout.")

    with tempfile.TemporaryDirectory(prefix="ds-zero-bench-") as tmp:
        scratch = Path(tmp)
        root = args.checkpoint
        if root is None or not (root / "latest").is_file():
            root = root or scratch / "ckpt"
            t = time.perf_counter()
            generate(root)
            print(f"generated {root} in {time.perf_counter() - t:.0f} s")
        size = folder_bytes(root)
        print(f"checkpoint: ZeRO-3, world size 2, GPT-2 small, {size / 1e9:.2f} GB of files")
        run = subprocess.run([sys.executable, str(HERE), "--check", str(root)], env=ENV,
                             capture_output=True, text=True)  # fmt: skip
        if run.returncode:
            sys.stderr.write(run.stderr[-3000:])
            raise SystemExit("the readers disagree")
        facts = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"bit-exact: {facts['tensors']} tensors, {facts['bytes'] / 1e6:.0f} MB of fp32, "
              "ties identical")  # fmt: skip
        for p in root.rglob("*.pt"):  # both peers start from a warm page cache
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass

        modes = {"dict": "deepspeed", "file": "deepspeed", "zero_to_fp32": "deepspeed"}
        figs: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            for mode in modes:
                peers = ("ours", "deepspeed") if r % 2 == 0 else ("deepspeed", "ours")
                for peer in peers:
                    ours_mode = "file" if (peer == "ours" and mode == "zero_to_fp32") else mode
                    fig = measure(peer, ours_mode, root, scratch)
                    figs.setdefault((peer, mode), []).append(fig)
                    print(f"  round {r} {mode:12s} {peer:9s} call {fig['call_s']:6.2f} s  "
                          f"process {fig['wall_s']:6.2f} s  peak {fig['peak_anon_mb']:7.1f} MB",
                          flush=True)  # fmt: skip
        print()
        print(f"{'':14s}{'':10s}{'call s':>9s}{'process s':>11s}{'peak MB':>10s}")
        for mode in modes:
            for peer in ("deepspeed", "ours"):
                f = figs[(peer, mode)]
                print(f"{mode:14s}{peer:10s}"
                      f"{statistics.median(x['call_s'] for x in f):9.2f}"
                      f"{statistics.median(x['wall_s'] for x in f):11.2f}"
                      f"{statistics.median(x['peak_anon_mb'] for x in f):10.1f}")  # fmt: skip
        print()
        for mode in modes:
            ours, theirs = figs[("ours", mode)], figs[("deepspeed", mode)]
            for what, key, goal in (("call time", "call_s", GOAL_TIME),
                                    ("process time", "wall_s", GOAL_TIME),
                                    ("peak memory", "peak_anon_mb", GOAL_MEMORY)):  # fmt: skip
                pairs = zip(ours, theirs, strict=True)
                ratio = statistics.median(a[key] / b[key] for a, b in pairs)
                verdict = "" if mode == "zero_to_fp32" else (
                    "ok" if ratio <= goal else "MISSED")  # fmt: skip
                print(f"{mode:14s}{what:14s}{ratio:6.2f}x  (goal <= {goal}x) {verdict}")


if __name__ == "__main__":
    main()
