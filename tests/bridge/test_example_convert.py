"""``examples/convert_torch_checkpoint.py``: the tie survives PyTorch -> Flax -> Orbax -> PyTorch.

The example runs once, from its command line (``main``) in this process: the tests
check what ``run`` returned, what the script printed and the files it left. The file
is run once more as ``__main__`` (``--help`` only).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def example(load_script) -> ModuleType:
    return load_script("examples/convert_torch_checkpoint.py")


@dataclass
class Run:
    result: Any
    output: str
    workdir: Path


@pytest.fixture(scope="module")
def ran(example: ModuleType, tmp_path_factory) -> Run:
    """``python examples/convert_torch_checkpoint.py --workdir DIR``, ``run``'s result kept."""
    workdir = tmp_path_factory.mktemp("convert") / "work"
    seen: list[Any] = []
    real_run = example.run

    def spy(*args: Any) -> Any:
        seen.append(real_run(*args))
        return seen[-1]

    output = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(output):
        mp.setattr(example, "run", spy)
        mp.setattr(sys, "argv", ["convert_torch_checkpoint.py", "--workdir", str(workdir)])
        example.main()
    (result,) = seen
    return Run(result, output.getvalue(), workdir)


def test_the_tie_and_the_outputs_survive(ran: Run, example: ModuleType) -> None:
    result = ran.result
    assert dict(result.aliases) == {"params/lm_head/kernel": "params/wte/embedding"}
    assert result.aliases.transform("params/lm_head/kernel") == (1, 0)
    assert result.flax_vs_torch < 1e-5
    assert result.head_is_embedding and result.back_vs_torch == 0.0
    assert result.safetensors_saved_bytes == example.VOCAB * example.DIM * 4


def test_the_script_says_so_and_leaves_its_files(ran: Run) -> None:
    assert "load_state_dict(strict=True) ok" in ran.output
    assert "done: the tie survived PyTorch -> Flax -> Orbax -> PyTorch" in ran.output
    assert (ran.workdir / "model.pt").is_file()
    assert (ran.workdir / "ckpt").is_dir() and (ran.workdir / "back.safetensors").is_file()


def test_the_file_runs_as_a_script(repo_root: Path, monkeypatch, capsys) -> None:
    script = repo_root / "examples" / "convert_torch_checkpoint.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    assert "--workdir" in capsys.readouterr().out
