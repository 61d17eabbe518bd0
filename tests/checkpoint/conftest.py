"""Fixtures of the checkpoint tests: comparing stored trees path by path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

from jaxshare._paths import flatten_with_paths, render


def _flat(tree: Any) -> dict[str, Any]:
    return {render(p): leaf for p, leaf in flatten_with_paths(tree)}


def _assert_bit_exact(got: Any, want: Any) -> None:
    got, want = _flat(got), _flat(want)
    assert sorted(got) == sorted(want)
    for path, w in want.items():
        g = got[path]
        g_arr, w_arr = np.asarray(g), np.asarray(w)
        assert (g_arr.shape, g_arr.dtype) == (w_arr.shape, w_arr.dtype), path
        assert g_arr.tobytes() == w_arr.tobytes(), path
        assert isinstance(g, jax.Array) == isinstance(w, jax.Array), path


@pytest.fixture(scope="session")
def flat() -> Callable[[Any], dict[str, Any]]:
    """``flat(tree)``: ``{rendered path: leaf}``."""
    return _flat


@pytest.fixture(scope="session")
def assert_bit_exact() -> Callable[[Any, Any], None]:
    """``assert_bit_exact(got, want)``: same paths, and per path the same shape, dtype,
    bytes and kind (``jax.Array`` or not); tuples restore as lists and numpy scalars as
    0-d arrays, as Orbax does."""
    return _assert_bit_exact
