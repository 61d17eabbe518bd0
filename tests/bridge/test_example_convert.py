"""``examples/convert_torch_checkpoint.py``: the tie survives PyTorch -> Flax -> Orbax -> PyTorch.

The example runs once, from its command line (``main``) in this process: the tests
check what ``run`` returned, what the script printed and the files it left. The file
is run once more as ``__main__`` (``--help`` only).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def example(load_script) -> ModuleType:
    return load_script("examples/convert_torch_checkpoint.py")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("convert") / "work"


@pytest.fixture(scope="module")
def ran(example: ModuleType, run_example, workdir: Path):
    """``python examples/convert_torch_checkpoint.py --workdir DIR``, ``run``'s result kept."""
    return run_example(example, "--workdir", str(workdir))


def test_the_tie_and_the_outputs_survive(ran, example: ModuleType) -> None:
    result = ran.result
    assert dict(result.aliases) == {"params/lm_head/kernel": "params/wte/embedding"}
    assert result.aliases.transform("params/lm_head/kernel") == (1, 0)
    assert result.flax_vs_torch < 1e-5
    assert result.head_is_embedding and result.back_vs_torch == 0.0
    assert result.safetensors_saved_bytes == example.VOCAB * example.DIM * 4


def test_the_script_says_so_and_leaves_its_files(ran, workdir: Path) -> None:
    assert "load_state_dict(strict=True) ok" in ran.output
    assert "done: the tie survived PyTorch -> Flax -> Orbax -> PyTorch" in ran.output
    assert (workdir / "model.pt").is_file()
    assert (workdir / "ckpt").is_dir() and (workdir / "back.safetensors").is_file()


def test_the_file_runs_as_a_script(run_as_main, capsys) -> None:
    assert run_as_main("examples/convert_torch_checkpoint.py", "--help") == 0
    assert "--workdir" in capsys.readouterr().out
