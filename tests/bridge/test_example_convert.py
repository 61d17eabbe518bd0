"""``examples/convert_torch_checkpoint.py``: the tie survives PyTorch -> Flax -> Orbax -> PyTorch.

Run in-process through its ``run`` function, and once as a script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from _examples import load_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "convert_torch_checkpoint.py"


def _load_example() -> ModuleType:
    return load_example("convert_torch_checkpoint")


def test_run_keeps_the_tie_and_the_outputs(tmp_path: Path) -> None:
    example = _load_example()
    lines: list[str] = []
    result = example.run(tmp_path, log=lines.append)
    assert dict(result.aliases) == {"params/lm_head/kernel": "params/wte/embedding"}
    assert result.aliases.transform("params/lm_head/kernel") == (1, 0)
    assert result.flax_vs_torch < 1e-5
    assert result.head_is_embedding and result.back_vs_torch == 0.0
    assert result.safetensors_saved_bytes == example.VOCAB * example.DIM * 4
    assert (tmp_path / "ckpt").is_dir() and (tmp_path / "back.safetensors").is_file()
    assert any("load_state_dict(strict=True) ok" in line for line in lines)


def test_script_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: the tie survived PyTorch -> Flax -> Orbax -> PyTorch" in proc.stdout
    assert (tmp_path / "work" / "model.pt").is_file()
