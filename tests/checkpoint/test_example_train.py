"""``examples/train_tied_lm.py``: the tied LM trains, keeps its tie and saves Adam state.

The example is run in a short setting twice: in-process through its ``run``
function with the default (transposed) tie, and as a script with ``--tie
identity`` to check its command line and the other kind of tie.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from _examples import load_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tied_lm.py"
STEPS = 50


def _load_example() -> ModuleType:
    return load_example("train_tied_lm")


example = _load_example()


@pytest.fixture(scope="module")
def config() -> Any:
    return example.Config(tie="transpose")


@pytest.fixture(scope="module")
def result(config: Any) -> Any:
    return example.run(STEPS, config, log=lambda line: None)


def test_loss_falls(result: Any) -> None:
    losses = np.asarray(result.losses)
    assert losses.shape == (STEPS,) and np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.5 * losses[0], (losses[0], losses[-5:])


def test_tie_holds_after_training(result: Any) -> None:
    assert result.tie_error == 0.0
    assert result.tie_is_identity is False  # a transposed tie is a new array, equal in value
    # One leaf for the tie: the Tied lacks exactly the alias, and Adam its mu and nu.
    assert result.leaves["tied"] == result.leaves["duplicated"] - 1
    assert result.opt_leaves["tied"] == result.opt_leaves["duplicated"] - 2
    # Without jaxshare the two copies are trained apart.
    assert result.duplicated_drift > 1e-3


def test_optimizer_state_smaller_by_twice_the_tied_bytes(result: Any, config: Any) -> None:
    tied_bytes = config.vocab * config.dim * np.dtype(np.float32).itemsize
    assert result.tied_bytes == tied_bytes
    assert result.params_bytes["tied"] == result.params_bytes["duplicated"] - tied_bytes
    assert result.opt_bytes["tied"] == result.opt_bytes["duplicated"] - 2 * tied_bytes


def test_tied_gradient_sums_both_uses(result: Any) -> None:
    assert result.grad_error < 1e-5


def test_donating_one_buffer_twice_fails(result: Any) -> None:
    assert "same buffer twice" in result.donation_error


def test_alias_map_names_the_tie() -> None:
    m = example.alias_map("transpose")
    assert dict(m) == {"params/lm_head/kernel": "params/wte/embedding"}
    assert m.transform("params/lm_head/kernel") == (1, 0)
    assert example.alias_map("identity").transform("params/lm_head/embedding") is None


def test_script_runs_with_an_identity_tie(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "30", "--vocab", "64", "--tie", "identity"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = next(line for line in proc.stdout.splitlines() if line.startswith("saved by the tie"))
    tied_bytes = 64 * example.Config().dim * 4
    assert saved.split()[-2:] == [f"{tied_bytes:,}", f"{2 * tied_bytes:,}"], proc.stdout
    assert "params/lm_head/embedding is the same object as params/wte/embedding" in proc.stdout
    assert "done in" in proc.stdout
