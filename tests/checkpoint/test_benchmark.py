"""benchmarks/checkpoint.py still runs (tiny sizes; the figures are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint.py"


def test_benchmark_smoke_run() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for row in ("bytes on disk", "save (median of 1)", "restore (median of 1)", "peak RSS"):
        assert row in out.stdout, out.stdout
