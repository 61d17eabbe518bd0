"""Fixtures of the checkpoint tests: comparing stored trees path by path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest


def _assert_bit_exact(flat: Callable[[Any], dict[str, Any]], got: Any, want: Any) -> None:
    got, want = flat(got), flat(want)
    assert sorted(got) == sorted(want)
    for path, w in want.items():
        g = got[path]
        g_arr, w_arr = np.asarray(g), np.asarray(w)
        assert (g_arr.shape, g_arr.dtype) == (w_arr.shape, w_arr.dtype), path
        assert g_arr.tobytes() == w_arr.tobytes(), path
        assert isinstance(g, jax.Array) == isinstance(w, jax.Array), path


@pytest.fixture(scope="session")
def assert_bit_exact(flat: Callable[[Any], dict[str, Any]]) -> Callable[[Any, Any], None]:
    """``assert_bit_exact(got, want)``: same paths, and per path the same shape, dtype,
    bytes and kind (``jax.Array`` or not); tuples restore as lists and numpy scalars as
    0-d arrays, as Orbax does."""
    return lambda got, want: _assert_bit_exact(flat, got, want)
