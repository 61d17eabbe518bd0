"""``benchmarks/checkpoint.py`` at its ``--quick`` sizes, in this process: its figures
are numbers, sane, and the ratios it reports are the ones its measurements give."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
from pathlib import Path
from types import ModuleType, SimpleNamespace

import jax
import pytest


@pytest.fixture(scope="module")
def bench(load_script) -> ModuleType:
    return load_script("benchmarks/checkpoint.py")


def _number(cell: str, unit: str) -> float:
    match = re.fullmatch(rf"(\d+(?:\.\d+)?) {unit}", cell)
    assert match, f"{cell!r} is not a number of {unit}"
    return float(match.group(1))


def test_save_and_restore_figures(bench: ModuleType, tmp_path: Path, monkeypatch) -> None:
    measured: list[float] = []
    real_timed = bench.timed

    def timed(*args):
        measured.append(real_timed(*args))
        return measured[-1]

    monkeypatch.setattr(bench, "timed", timed)
    monkeypatch.setattr(bench.os, "sync", lambda: None)  # Not the figures under test.
    shape = bench.Shape(vocab=1000, width=64, blocks=2, context=128)  # as --quick
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = bench.save_restore(tmp_path, shape, repeats=2)
    assert [r[0] for r in rows] == [
        "bytes on disk",
        "save (median of 2)",
        "restore (median of 2)",
        "restore into Tied (median of 2)",
    ]
    share = float(re.search(r"unique/total bytes of the tree: (\d\.\d+)", printed.getvalue())[1])
    tied = bench.Tied(bench.gpt2_unique(shape), bench.TIE)
    unique_share = bench.nbytes(tied.unique) / bench.nbytes(tied.tree)
    assert share == pytest.approx(unique_share, abs=5e-4) and 0.5 < share < 1

    # Bytes: jaxshare writes the unique share of plain Orbax's bytes (goal: + 0.02).
    _, plain, js, ratio, verdict = rows[0]
    assert 0 < _number(js, "MB") <= _number(plain, "MB")
    on_disk = bench.dir_bytes(tmp_path / "js0") / bench.dir_bytes(tmp_path / "plain0")
    assert ratio.startswith(f"{on_disk:.3f} (goal <= {share + 0.02:.3f})")
    assert share - 0.02 < on_disk <= share + 0.02 and verdict == "met"

    # Times: 2 rounds x 3 operations x (plain, jaxshare), each a positive duration,
    # and each ratio the median over rounds of jaxshare's time over plain Orbax's.
    assert len(measured) == 12 and all(0 < t < 120 and math.isfinite(t) for t in measured)
    for i, (_, plain, js, ratio, verdict) in enumerate(rows[1:]):
        pairs = []
        for r in range(2):
            a, b = measured[6 * r + 2 * i], measured[6 * r + 2 * i + 1]
            pairs.append((a, b) if r % 2 == 0 else (b, a))  # (plain, jaxshare)
        want = sorted(j / p for p, j in pairs)
        median, goal = (want[0] + want[1]) / 2, unique_share + 0.10
        assert ratio.startswith(f"{median:.3f} (goal <= {share + 0.10:.3f})")
        assert _number(plain, "s") >= 0 and _number(js, "s") >= 0
        # The verdict the measured times give (a time, so either, but never both).
        assert verdict == ("met" if median <= goal else f"MISSED by {median - goal:.3f}")
    restored = bench.jc.restore(tmp_path / "js1")
    assert restored["lm_head"]["kernel"] is not restored["wte"]["embedding"]
    assert (restored["lm_head"]["kernel"] == restored["wte"]["embedding"].T).all()


@pytest.mark.subprocess
def test_consolidation_figures(bench: ModuleType, tmp_path: Path, monkeypatch) -> None:
    children: list[subprocess.CompletedProcess] = []

    def run(*args, **kwargs):  # The child's own report: its peak RSS in bytes.
        children.append(subprocess.run(*args, **kwargs))
        return children[-1]

    monkeypatch.setattr(bench, "subprocess", SimpleNamespace(run=run))
    shape = bench.Shape(vocab=5000, width=128, blocks=4, context=128)  # as --quick
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        label, plain, peak, goal, verdict = bench.consolidation(tmp_path, shape)
    unique = bench.gpt2_unique(shape)
    largest = max(x.nbytes for x in jax.tree_util.tree_leaves(unique))
    full = bench.nbytes(unique) + shape.width * shape.vocab * 4  # lm_head written out again
    assert label == "consolidate_to_safetensors peak RSS" and plain == "-"
    assert (tmp_path / "big.safetensors").stat().st_size >= full
    baseline = _number(re.search(r"RSS after imports (\d+ MB)", printed.getvalue())[1], "MB")
    assert 0 < baseline <= _number(peak, "MB") < 4096
    mb = 2**20
    assert goal == f"goal <= {(2 * largest + 200 * mb) / mb:.0f} MB (2 x {largest / mb:.0f} + 200)"
    # The verdict the child's measured peak gives (a measurement, so either, never both).
    (child,) = children
    over = json.loads(child.stdout.splitlines()[-1])["peak"] / mb - (2 * largest + 200 * mb) / mb
    assert verdict == ("met" if over <= 0 else f"MISSED by {over:.3f} MB")
