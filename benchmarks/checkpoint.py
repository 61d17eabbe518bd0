"""Orbax checkpoints of a tied GPT-2: jaxshare against plain Orbax, side by side.

The model is GPT-2 small's parameter tree in Flax layout (``wte`` 50257x768,
``wpe``, 12 blocks, ``ln_f``) with ``lm_head/kernel`` (768x50257) tied to
``wte/embedding`` transposed, as a Flax GPT-2 with a Dense head holds it:

* **plain Orbax**: ``ocp.Checkpointer(ocp.StandardCheckpointHandler())`` saves
  and restores the full tree, the tie written twice;
* **jaxshare**: ``jaxshare.checkpoint.save`` of the ``Tied`` stores the unique
  tree once plus the alias map; ``restore`` gives the full tree back with
  ``lm_head/kernel`` re-created from ``wte/embedding``.

Both use synchronous checkpointers. Each operation runs for both back to back
(``--repeats`` rounds, the order alternating), so load from other processes
falls on both alike; the ratio is the median over rounds of jaxshare's time
over plain Orbax's. Reported: bytes on disk (goal: ratio <= unique/total +
0.02) and save and restore times (goal: ratio <= unique/total + 0.10);
"restore" gives the full tree, "restore into Tied" a ``Tied`` for jaxshare
(plain Orbax restores the full tree both times).

Consolidation: a ~2 GB checkpoint (a GPT-2 with width 1024 and 36 blocks, f32)
streamed to ``.safetensors`` by ``consolidate_to_safetensors`` in a fresh
process, whose peak RSS (Linux ``VmHWM``, else ``resource.getrusage``) is compared with the goal
<= 2 x the largest leaf + 200 MB; the process's RSS after imports is shown too.

Run: ``python benchmarks/checkpoint.py`` (``--help`` for sizes; ``--quick`` for a
smoke run). Prints a table; a missed goal is reported, and the exit status is 0
either way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import jaxshare
from jaxshare import AliasMap, Tied
from jaxshare import checkpoint as jc

MB = 2**20
TIE = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})


@dataclass(frozen=True)
class Shape:
    vocab: int = 50257
    width: int = 768
    blocks: int = 12
    context: int = 1024


def gpt2_unique(shape: Shape, seed: int = 0) -> dict:
    """GPT-2's parameters in Flax layout, without ``lm_head`` (it is the tie)."""
    rng = np.random.default_rng(seed)
    d = shape.width

    def w(*dims: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32) * 0.02)

    def block() -> dict:
        return {
            "ln_1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "attn": {
                "c_attn": {"kernel": w(d, 3 * d), "bias": w(3 * d)},
                "c_proj": {"kernel": w(d, d), "bias": w(d)},
            },
            "ln_2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "mlp": {
                "c_fc": {"kernel": w(d, 4 * d), "bias": w(4 * d)},
                "c_proj": {"kernel": w(4 * d, d), "bias": w(d)},
            },
        }

    return {
        "wte": {"embedding": w(shape.vocab, d)},
        "wpe": {"embedding": w(shape.context, d)},
        "h": {str(i): block() for i in range(shape.blocks)},
        "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "lm_head": {},
    }


def nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(fn: Callable[..., Any], *args: Any) -> float:
    """Seconds ``fn(*args)`` takes, its arrays ready."""
    os.sync()  # Write-back of the previous run's files must not land on this one.
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def verdict(ratio: float, goal: float) -> str:
    """``met`` or ``MISSED by x``.

    >>> verdict(0.7, 0.8), verdict(0.9, 0.8)
    ('met', 'MISSED by 0.100')
    """
    return "met" if ratio <= goal else f"MISSED by {ratio - goal:.3f}"


def save_restore(root: Path, shape: Shape, repeats: int) -> list[tuple[str, str, str, str, str]]:
    tied = Tied(gpt2_unique(shape), TIE)
    full = tied.tree  # lm_head/kernel materialised: what plain Orbax has to write.
    unique_share = nbytes(tied.unique) / nbytes(full)
    plain = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    target = jax.eval_shape(lambda: tied)
    # Per round, (plain seconds, jaxshare seconds) of each operation, run back to back.
    pairs: dict[str, list[tuple[float, float]]] = {
        "save": [],
        "restore": [],
        "restore into Tied": [],
    }

    def plain_save(directory: Path) -> None:
        plain.save(directory, args=ocp.args.StandardSave(full))

    for r in range(repeats):
        plain_dir, js_dir = root / f"plain{r}", root / f"js{r}"
        ops = [
            ("save", (plain_save, plain_dir), (jc.save, js_dir, tied)),
            ("restore", (plain.restore, plain_dir), (jc.restore, js_dir)),
            ("restore into Tied", (plain.restore, plain_dir), (jc.restore, js_dir, target)),
        ]
        for what, plain_op, js_op in ops:
            first, second = (plain_op, js_op) if r % 2 == 0 else (js_op, plain_op)
            a, b = timed(*first), timed(*second)
            pairs[what].append((a, b) if r % 2 == 0 else (b, a))
    plain.close()
    restored = jc.restore(root / "js0")
    assert restored["lm_head"]["kernel"].shape == (shape.width, shape.vocab)

    rows = []
    plain_bytes, js_bytes = dir_bytes(root / "plain0"), dir_bytes(root / "js0")
    goal = unique_share + 0.02
    rows.append(
        (
            "bytes on disk",
            f"{plain_bytes / MB:.1f} MB",
            f"{js_bytes / MB:.1f} MB",
            f"{js_bytes / plain_bytes:.3f} (goal <= {goal:.3f})",
            verdict(js_bytes / plain_bytes, goal),
        )
    )
    goal = unique_share + 0.10
    for what, times in pairs.items():
        ratio = statistics.median(j / p for p, j in times)
        rows.append(
            (
                f"{what} (median of {repeats})",
                f"{statistics.median(p for p, _ in times):.2f} s",
                f"{statistics.median(j for _, j in times):.2f} s",
                f"{ratio:.3f} (goal <= {goal:.3f})",
                verdict(ratio, goal),
            )
        )
    print(
        f"unique/total bytes of the tree: {unique_share:.3f} "
        f"({nbytes(tied.unique) / MB:.1f} MB of {nbytes(full) / MB:.1f} MB)"
    )
    return rows


def consolidation(root: Path, shape: Shape) -> tuple[str, str, str, str, str]:
    unique = gpt2_unique(shape)
    largest = max(x.nbytes for x in jax.tree_util.tree_leaves(unique))
    jc.save(root / "big", Tied(unique, TIE))
    del unique
    size = dir_bytes(root / "big")
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child-consolidate",
            str(root / "big"),
            str(root / "big.safetensors"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    child = json.loads(out.stdout.strip().splitlines()[-1])
    goal = 2 * largest + 200 * MB
    written = (root / "big.safetensors").stat().st_size
    print(
        f"consolidation: checkpoint {size / MB:.0f} MB on disk, largest leaf "
        f"{largest / MB:.0f} MB, .safetensors {written / MB:.0f} MB written in "
        f"{child['seconds']:.1f} s; RSS after imports {child['baseline'] / MB:.0f} MB"
    )
    return (
        "consolidate_to_safetensors peak RSS",
        "-",
        f"{child['peak'] / MB:.0f} MB",
        f"goal <= {goal / MB:.0f} MB (2 x {largest / MB:.0f} + 200)",
        verdict(child["peak"] / MB, goal / MB) + ("" if child["peak"] <= goal else " MB"),
    )


def peak_rss() -> int:
    """This process's peak resident set size in bytes.

    Linux's ``VmHWM`` is the high-water mark of this program's own memory;
    ``getrusage``'s ``ru_maxrss`` also keeps the RSS the process had before
    ``exec`` (a forked copy of the parent), so it is only the fallback.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def child_consolidate(src: str, dst: str) -> None:
    """Runs in a fresh process: streams ``src`` to ``dst`` and reports peak RSS."""
    baseline = peak_rss()
    start = time.perf_counter()
    jc.consolidate_to_safetensors(src, dst)
    seconds = time.perf_counter() - start
    print(json.dumps({"baseline": baseline, "peak": peak_rss(), "seconds": seconds}))


def table(rows: list[tuple[str, ...]]) -> str:
    header = ("", "plain Orbax", "jaxshare", "ratio jaxshare/plain", "verdict")
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--no-consolidation", action="store_true")
    parser.add_argument("--no-save-restore", action="store_true")
    parser.add_argument(
        "--child-consolidate", nargs=2, metavar=("SRC", "DST"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child_consolidate:
        child_consolidate(*args.child_consolidate)
        return
    small = Shape(vocab=1000, width=64, blocks=2, context=128) if args.quick else Shape()
    big = (
        Shape(vocab=5000, width=128, blocks=4, context=128)
        if args.quick
        else Shape(width=1024, blocks=36)
    )
    machine = platform.processor() or platform.machine()
    print(
        f"jaxshare {jaxshare.__version__}, jax {jax.__version__}, orbax-checkpoint "
        f"{ocp.__version__}, {jax.devices()[0].platform}, {machine}"
    )
    with tempfile.TemporaryDirectory(prefix="jaxshare-bench-") as tmp:
        root = Path(tmp)
        rows = [] if args.no_save_restore else save_restore(root, small, args.repeats)
        if not args.no_consolidation:
            rows.append(consolidation(root, big))
    print(table(rows))


if __name__ == "__main__":
    main()
