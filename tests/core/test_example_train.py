"""``examples/train_tied_lm.py``: the tied LM trains, keeps its tie and saves Adam state.

The example runs once, from its command line (``main``) in this process, in a short
setting with the default (transposed) tie: the tests check both what ``run`` returned
and what the script printed. The identity tie's alias map is checked on its own, and
the file once more as ``__main__`` (``--help`` only: the run is the one above).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

STEPS = 40


@pytest.fixture(scope="module")
def example(load_script) -> ModuleType:
    return load_script("examples/train_tied_lm.py")


@pytest.fixture(scope="module")
def ran(example: ModuleType, run_example):
    """``python examples/train_tied_lm.py --steps 40``, with ``run``'s result kept."""
    done = run_example(example, "--steps", str(STEPS))
    assert done.status == 0
    return done


@pytest.fixture(scope="module")
def config(ran) -> Any:
    """The ``Config`` that ``main`` ran the example with (``run(steps, config)``)."""
    return ran.args[1]


def test_loss_falls(ran) -> None:
    losses = np.asarray(ran.result.losses)
    assert losses.shape == (STEPS,) and np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.5 * losses[0], (losses[0], losses[-5:])
    assert f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {STEPS} steps" in ran.output


def test_tie_holds_after_training(ran, config) -> None:
    result = ran.result
    assert config.tie == "transpose"
    assert result.tie_error == 0.0
    assert result.tie_is_identity is False  # a transposed tie is a new array, equal in value
    # One leaf for the tie: the Tied lacks exactly the alias, and Adam its mu and nu.
    assert result.leaves["tied"] == result.leaves["duplicated"] - 1
    assert result.opt_leaves["tied"] == result.opt_leaves["duplicated"] - 2
    # Without jaxshare the two copies are trained apart.
    assert result.duplicated_drift > 1e-3
    assert (
        "tie after training: params/lm_head/kernel == transpose of params/wte/embedding "
        "(max diff 0)" in ran.output
    )


def test_optimizer_state_smaller_by_twice_the_tied_bytes(ran, config) -> None:
    result = ran.result
    tied_bytes = config.vocab * config.dim * np.dtype(np.float32).itemsize
    assert result.tied_bytes == tied_bytes
    assert result.params_bytes["tied"] == result.params_bytes["duplicated"] - tied_bytes
    assert result.opt_bytes["tied"] == result.opt_bytes["duplicated"] - 2 * tied_bytes
    saved = next(line for line in ran.output.splitlines() if line.startswith("saved by the tie"))
    assert saved.split()[-2:] == [f"{tied_bytes:,}", f"{2 * tied_bytes:,}"], ran.output


def test_tied_gradient_sums_both_uses(ran) -> None:
    assert ran.result.grad_error < 1e-5


def test_donating_one_buffer_twice_fails(ran) -> None:
    assert "same buffer twice" in ran.result.donation_error


def test_alias_map_names_the_tie(example: ModuleType) -> None:
    m = example.alias_map("transpose")
    assert dict(m) == {"params/lm_head/kernel": "params/wte/embedding"}
    assert m.transform("params/lm_head/kernel") == (1, 0)
    identity = example.alias_map("identity")
    assert dict(identity) == {"params/lm_head/embedding": "params/wte/embedding"}
    assert identity.transform("params/lm_head/embedding") is None


def test_the_file_runs_as_a_script(run_as_main, capsys) -> None:
    assert run_as_main("examples/train_tied_lm.py", "--steps", "5") == 2
    assert "--steps must be at least 10" in capsys.readouterr().err
