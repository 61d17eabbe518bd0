"""Fixtures of the bridge tests: random tied state dicts, and state-dict equality that
compares bits and ties."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from bridge import shared_params

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.uint8,
]
LEAVES = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked", "emb"]


@pytest.fixture(scope="session")
def deepspeed_shared_params(load_script: Callable) -> Callable:
    """DeepSpeed's ``_get_shared_params`` walk, restated (``tests/_support/deepspeed_walk.py``):
    the oracle of what DeepSpeed records, right and wrong."""
    return load_script("tests/_support/deepspeed_walk.py").deepspeed_shared_params


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so NaNs compare by their bits."""
    return t.detach().clone().reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0)


def _assert_same_state(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert torch.equal(_bits(got[key]), _bits(tensor)), key
    for alias, canonical in shared_params(want).items():
        assert got[alias] is got[canonical], alias


@pytest.fixture(scope="session")
def assert_same_state() -> Callable[[dict, dict], None]:
    """``assert_same_state(got, want)``: names, shapes, dtypes and bits equal; every tie
    of ``want`` one object in ``got``."""
    return _assert_same_state


@st.composite
def _tied_state_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    n = draw(st.integers(1, 5))
    state: dict[str, torch.Tensor] = {}
    for i in range(n):
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        width = torch.tensor([], dtype=dtype).element_size()
        size = width * int(np.prod(shape))
        raw = torch.tensor(list(draw(st.binary(min_size=size, max_size=size))), dtype=torch.uint8)
        tensor = (
            raw.view(dtype).reshape(shape)
            if dtype != torch.bool
            else (raw % 2).bool().reshape(shape)
        )
        leaf = draw(st.sampled_from(LEAVES))
        state[f"m{i}.{leaf}"] = tensor
        for j in range(draw(st.integers(0, 2))):
            # Another module, or the same module under another name (`self.b = self.a`).
            place = draw(st.sampled_from(["other module", "same module", "root"]))
            alias = {
                "other module": f"t{i}_{j}.{draw(st.sampled_from(LEAVES))}",
                "same module": f"m{i}.{leaf}{j + 2}",
                "root": f"{leaf}_{i}_{j}",
            }[place]
            state[alias] = tensor if draw(st.booleans()) else tensor.view(shape)
    return state


@pytest.fixture(scope="session")
def tied_state_dicts() -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """A strategy: 1-5 tensors of any bits, several dtypes and ranks (zero-size
    included), some under more names -- in another module, in the same module
    (``lin.weight2 = lin.weight``) or at the root -- the very tensor or another view
    of its memory.
    Draw from it with ``hypothesis.strategies.data()``."""
    return _tied_state_dicts()
