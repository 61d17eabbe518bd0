"""``bridge.check`` against reading the tensors it must read, once.

The file is a ``.safetensors`` of a Llama-shaped model whose tied pair is stored
twice: ``model.embed_tokens.weight`` (``--vocab`` x ``--hidden``, float32; 256 MiB
by default) and ``lm_head.weight``, the same bytes, with the
``{"lm_head.weight": "model.embed_tokens.weight"}`` metadata entry that
``safetensors.torch.save_model`` writes; beside them ``--layers`` (8) MLP weights of
one shape (``4 --hidden`` x ``--hidden``) with other values, so ``check``'s search
for tensors equal by content has look-alikes to sample. Side by side, with the page
cache warm, the best of ``--rounds`` (5) of:

* reading the two tied tensors once: ``np.array`` of each out of the mapped file
  (the baseline, 1.00x);
* ``bridge.check(file)``, goal at most 1.1x the baseline: it holds the alias
  against its canonical bit for bit, checks the canonical is not all zeros, and
  samples (never reads whole) the look-alike layers;
* reading every tensor of the file once, for reference.

Run: ``python benchmarks/check.py [--vocab N] [--hidden N] [--layers N]``. The file
is written under ``--workdir`` (a temp dir by default, removed afterwards). Prints
a table; a missed goal is reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import bridge
from jaxshare.formats import SafetensorsFile

GOAL = 1.1  # check at most this many times reading the tied tensors once
TIED = ("model.embed_tokens.weight", "lm_head.weight")


def build(path: Path, vocab: int, hidden: int, layers: int) -> None:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((vocab, hidden), dtype=np.float32)
    state = {TIED[0]: emb, TIED[1]: emb.copy()}
    for i in range(layers):
        state[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal(
            (4 * hidden, hidden), dtype=np.float32
        )
    save_file(state, path, metadata={TIED[1]: TIED[0], "format": "pt"})


def read(path: Path, names: tuple[str, ...] | None) -> None:
    with SafetensorsFile(path) as f:
        for name in names or tuple(f.infos):
            np.array(f.array(name))


def best_of(rounds: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="jaxshare-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model.safetensors"
    try:
        build(path, args.vocab, args.hidden, args.layers)
        report = bridge.check(path)
        assert report.kinds == ["stored-twice"] and report.tensors_read == 2, report.lines()
        for _ in range(2):  # Warm the page cache.
            read(path, None)
        base = best_of(args.rounds, lambda: read(path, TIED))
        took = best_of(args.rounds, lambda: bridge.check(path))
        everything = best_of(args.rounds, lambda: read(path, None))
        size = path.stat().st_size
        tied = report.bytes_read
        machine = platform.processor() or platform.machine()
        print(
            f"{machine}, file {size / 2**20:.0f} MiB, tied tensors {tied / 2**20:.0f} MiB, "
            f"best of {args.rounds}, warm page cache"
        )
        print(f"{'what':<36} {'seconds':>8} {'x':>6}")
        for what, seconds in (
            ("read the tied tensors once", base),
            ("bridge.check", took),
            ("read every tensor once", everything),
        ):
            print(f"{what:<36} {seconds:>8.3f} {seconds / base:>6.2f}")
        print(report.lines()[-1])
        verdict = "met" if took <= GOAL * base else "MISSED"
        print(f"goal: check <= {GOAL}x reading the tied tensors once: {verdict}")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
