"""``jaxshare verify`` against reading both of its inputs once.

The issue's goals for ``verify``: it streams, peak anonymous memory <= 2 x the
largest tensor + 400 MB, and time <= 1.2x reading both inputs once. The model is
Llama-shaped, in Hugging Face names and Linear layouts (``q/k/v/o_proj`` d x d,
``gate/up/down_proj`` d x inner), ``lm_head`` tied to the embedding (recorded in
the file's ``jaxshare.alias_map`` metadata), float32 with random values: by
default width 2048, 6 blocks, inner 5504, vocabulary 32000 (1.47 GB; the largest
tensor, the embedding, 250 MiB), written by numpy into a temporary directory
(``--dir``). Set-up, untimed: ``B.safetensors``, a byte copy of the file; ``ckpt``,
the Orbax item ``jaxshare convert A ckpt`` makes (its kernels transposed, so
``verify`` reads them whole); ``hf``, a Hugging Face directory (the file
hard-linked + a Llama ``config.json``); ``out.safetensors``, ``jaxshare convert A
out.safetensors --manifest``. Cases, each ``jaxshare verify ...`` as a user runs
it, a fresh process under ``shared/tools/peakmem`` (peak RssAnon + RssShmem of the
process tree; mapped file pages do not count):

* ``A B``: two ``.safetensors`` files, the same bytes;
* ``A ckpt``: the file against the item made of it;
* ``hf ckpt``: the Hugging Face directory against the same item;
* ``out.safetensors``: one side, against its manifest (every tensor hashed).

The limit of each is reading its inputs once, by two baselines, each warm
(read just before) and cold (pages dropped with ``posix_fadvise(DONTNEED)`` after
a ``sync``):

* ``cat`` of every file of both inputs (one process): the bytes, no decoding;
* ``read``: each input read once by the reader a user would otherwise use, in
  one fresh process, imports included (as ``verify``'s *time*):
  ``safetensors.numpy.load_file`` of a ``.safetensors`` file (and of each of an
  HF directory's), ``orbax.checkpoint.StandardCheckpointer().restore`` of the
  whole item, every leaf as a numpy array.

``verify`` runs warm and cold likewise; ``work`` is ``bridge.verify`` alone,
timed in a fresh process after its imports (warm), held against ``cat`` (no
imports either). Each figure is the median over ``--rounds`` (3); the ratios are
medians of per-round ratios.

Run (about 6 GB of free disk under ``--dir``)::

    python benchmarks/verify.py             # --rounds 3
    python benchmarks/verify.py --quick     # a small smoke run

Prints a table; a missed goal is reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from roofline import drop_cache, llama_config, model_specs, write_model
from roofline import files_of as path_files
from stream_convert import (
    GOAL_OVERHEAD_MB,
    MB,
    child_env,
    flatten,
    float32_sizes,
    last_json,
    load_average,
    model_arguments,
    peakmem,
)

GOAL_TIME = 1.2
ENV = child_env(HF_HUB_OFFLINE="1")
JAXSHARE = [sys.executable, "-m", "jaxshare.cli"]


def jaxshare(*args: str) -> subprocess.CompletedProcess:
    run = subprocess.run([*JAXSHARE, *args], capture_output=True, text=True, env=ENV)
    if run.returncode:
        raise RuntimeError(f"jaxshare {' '.join(args)} failed:\n{run.stdout}{run.stderr[-3000:]}")
    return run


# --- the limit ----------------------------------------------------------------------


def files_of(paths: list[Path]) -> list[Path]:
    """Every file under each of ``paths``."""
    return [file for path in paths for file in path_files(path)]


def cat(paths: list[Path]) -> float:
    """Seconds of ``cat`` of every file under ``paths`` (one process) to /dev/null."""
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, files_of(paths))], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def read_child(paths: list[str]) -> None:
    """Each of ``paths`` read once by its usual reader (see the module's ``read``),
    one after the other; prints ``{"work_s": ..., "tensors": ...}``."""
    import numpy as np
    from safetensors.numpy import load_file

    start = time.perf_counter()
    tensors = 0
    for path in map(Path, paths):
        if path.is_file() or not (path / "_METADATA").exists():  # .safetensors, HF directory
            for file in [path] if path.is_file() else sorted(path.glob("*.safetensors")):
                tensors += len(load_file(file))
            continue
        import orbax.checkpoint as ocp

        restored = ocp.StandardCheckpointer().restore(path.absolute())
        tensors += len({k: np.asarray(v) for k, v in flatten(restored).items()})
        del restored
    print(json.dumps({"work_s": time.perf_counter() - start, "tensors": tensors}))


def read(paths: list[Path]) -> float:
    """Seconds of :func:`read_child` of ``paths``: a fresh process, imports included."""
    cmd = [sys.executable, __file__, "--read", *map(str, paths)]
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=False)
    seconds = time.perf_counter() - start
    if run.returncode != 0 or '"tensors"' not in run.stdout:
        raise RuntimeError(f"reading {tuple(map(str, paths))} failed:\n{run.stderr[-3000:]}")
    return seconds


def prepare(paths: list[Path], state: str) -> None:
    if state == "cold":
        for path in paths:
            drop_cache(path)
    else:
        cat(paths)


# --- the processes measured ---------------------------------------------------------


def child(paths: list[str]) -> None:
    """``bridge.verify`` alone, timed after its imports; prints ``{"work_s": ...}``."""
    import bridge
    from jaxshare.checkpoint import open_source  # noqa: F401 -- an item's reader (Orbax,
    # TensorStore, JAX), imported lazily: not timed, as the imports are not

    start = time.perf_counter()
    report = bridge.verify(*paths)
    seconds = time.perf_counter() - start
    print(json.dumps({"work_s": seconds, "ok": report.ok}))


def verify_cli(paths: list[Path]) -> dict:
    """``jaxshare verify PATHS`` in a fresh process under peakmem: its figures."""
    cmd = [*JAXSHARE, "verify", *map(str, paths)]
    run, stats = peakmem(cmd, ENV)
    if run.returncode != 0 or stats is None or not run.stdout.startswith("equal: "):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr[-3000:]}")
    return stats


def verify_work(paths: list[Path]) -> float:
    cmd = [sys.executable, __file__, "--child", *map(str, paths)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=False)
    out = last_json(run.stdout)
    if run.returncode != 0 or out is None or not out["ok"]:
        raise RuntimeError(f"bridge.verify{tuple(map(str, paths))} failed:\n{run.stderr[-3000:]}")
    return out["work_s"]


def sha256_seconds(path: Path) -> float:
    """Seconds of SHA-256 of the file's bytes, mapped (what a manifest check hashes)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        start = time.perf_counter()
        hashlib.sha256(mapped).hexdigest()
        return time.perf_counter() - start


def measure(paths: list[Path]) -> dict:
    """One round of a case: the limits (``cat``, ``read``) and ``verify``, warm and cold."""
    row = {}
    for state in ("warm", "cold"):
        prepare(paths, state)
        row[f"cat_{state}"] = cat(paths)
        prepare(paths, state)
        row[f"read_{state}"] = read(paths)
        prepare(paths, state)
        stats = verify_cli(paths)
        row[f"time_{state}"] = stats["wall_s"]
        row[f"peak_{state}"] = stats["peak_anon_mb"]
    prepare(paths, "warm")
    row["work_warm"] = verify_work(paths)
    return row


# --- the run ------------------------------------------------------------------------


def main() -> None:
    ap = model_arguments(__doc__, context=False)
    ap.set_defaults(vocab=32000, width=2048, blocks=6)
    ap.add_argument("--inner", type=int, default=5504)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--read", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.read:
        return read_child(args.read)
    if args.quick:
        args.vocab, args.width, args.blocks, args.inner, args.rounds = 5000, 256, 2, 688, 1
    specs = model_specs(args.vocab, args.width, args.blocks, args.inner)
    largest, total, goal_mb = float32_sizes(specs)
    root = Path(tempfile.mkdtemp(prefix="verify_", dir=args.dir))
    free = shutil.disk_usage(root).free
    if free < 4.5 * total:
        raise SystemExit(f"{root}: {free / 1e9:.1f} GB free, the run needs {4.5 * total / 1e9:.1f}")
    try:
        names = ("A.safetensors", "B.safetensors", "ckpt", "hf", "out.safetensors")
        a, b, item, hf, out = (root / n for n in names)
        write_model(a, specs)
        shutil.copyfile(a, b)
        jaxshare("convert", str(a), str(item), "--quiet")
        hf.mkdir()
        os.link(a, hf / "model.safetensors")
        config = llama_config(args.width, args.blocks, args.vocab, args.inner)
        (hf / "config.json").write_text(json.dumps(config))
        jaxshare("convert", str(a), str(out), "--quiet", "--manifest")
        cases = {
            "verify A B (safetensors, same bytes)": [a, b],
            "verify A ckpt (Orbax item of A)": [a, item],
            "verify hf ckpt (HF directory, item)": [hf, item],
            "verify out.safetensors (manifest)": [out],
        }
        loads = [os.getloadavg()]
        rows: dict[str, list[dict]] = {case: [] for case in cases}
        for _ in range(args.rounds):
            for case, paths in cases.items():
                rows[case].append(measure(paths))
                print(f"  {case}: {rows[case][-1]}", flush=True)
            loads.append(os.getloadavg())
        prepare([out], "warm")
        hashed = min(sha256_seconds(out) for _ in range(2))
        sizes_in = {case: sum(p.stat().st_size for p in files_of(ps)) for case, ps in cases.items()}
        report(args, rows, sizes_in, largest, total, goal_mb, loads)
        print(
            f"For the manifest: hashlib.sha256 of out.safetensors's {out.stat().st_size / MB:.0f} "
            f"MiB (mapped, warm, one thread) took {hashed:.2f} s."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(
    args: argparse.Namespace,
    rows: dict[str, list[dict]],
    sizes_in: dict[str, int],
    largest: int,
    total: int,
    goal_mb: float,
    loads: list[tuple[float, float, float]],
) -> None:
    med = statistics.median
    n = len(model_specs(1, 1, args.blocks, 1))
    print(
        f"\nModel: Llama-shaped, width {args.width}, {args.blocks} blocks, inner {args.inner}, "
        f"vocabulary {args.vocab}, float32: {total / MB:.0f} MiB in {n} tensors, largest "
        f"{largest / MB:.0f} MiB; {args.rounds} round(s)."
    )
    print(
        f"Goals: peak anon <= 2 x largest + {GOAL_OVERHEAD_MB} MiB = {goal_mb:.0f} MiB; "
        f"time <= {GOAL_TIME:.1f}x reading both inputs once, held against `read` (each input "
        f"by its usual reader, a fresh process) and against `cat`. {load_average(loads)}\n"
    )
    head = (
        f"{'case':38} {'MiB in':>6} {'peak MiB':>8} {'cat warm':>8} {'read warm':>9} "
        f"{'time warm':>9} {'x cat':>6} {'x read':>6} {'work warm':>9} {'x cat':>6} "
        f"{'cat cold':>8} {'read cold':>9} {'time cold':>9} {'x cat':>6} {'x read':>6}  verdict"
    )
    print(head)
    print("-" * len(head))
    for case, runs in rows.items():
        peak = max(r[f"peak_{s}"] for r in runs for s in ("warm", "cold"))
        x = {
            (what, base, state): med(r[f"{what}_{state}"] / r[f"{base}_{state}"] for r in runs)
            for what, base, state in (
                ("time", "cat", "warm"), ("time", "read", "warm"), ("work", "cat", "warm"),
                ("time", "cat", "cold"), ("time", "read", "cold"),
            )
        }  # fmt: skip
        memory = f"MISSED by {peak - goal_mb:.0f} MiB" if peak > goal_mb else "met"
        verdict = [f"memory {memory}"]
        for base in ("read", "cat"):
            missed = [f"{what} {state}" for (what, b, state), v in x.items()
                      if b == base and v > GOAL_TIME]  # fmt: skip
            verdict.append(f"vs {base}: " + (", ".join(missed) + " MISSED" if missed else "met"))
        print(
            f"{case:38} {sizes_in[case] / MB:6.0f} {peak:8.0f} "
            f"{med(r['cat_warm'] for r in runs):8.2f} {med(r['read_warm'] for r in runs):9.2f} "
            f"{med(r['time_warm'] for r in runs):9.2f} {x['time', 'cat', 'warm']:6.2f} "
            f"{x['time', 'read', 'warm']:6.2f} {med(r['work_warm'] for r in runs):9.2f} "
            f"{x['work', 'cat', 'warm']:6.2f} {med(r['cat_cold'] for r in runs):8.2f} "
            f"{med(r['read_cold'] for r in runs):9.2f} {med(r['time_cold'] for r in runs):9.2f} "
            f"{x['time', 'cat', 'cold']:6.2f} {x['time', 'read', 'cold']:6.2f}  "
            + "; ".join(verdict)
        )
    print(
        "\npeak: the highest over rounds, warm and cold (peakmem, 10 ms samples); seconds: "
        "medians over rounds; time: the whole `jaxshare verify` process (start-up and "
        "imports included); work: `bridge.verify` alone, after imports; read: the inputs "
        "read once by their usual readers (safetensors.numpy.load_file, Orbax's "
        "StandardCheckpointer().restore), a fresh process, imports included; x cat, x read: "
        "medians of per-round ratios to `cat` or `read` of the same files, warm or cold "
        "(work against `cat` only: neither imports anything)."
    )


if __name__ == "__main__":
    main()
