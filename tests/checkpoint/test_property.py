"""Property: any tied tree survives save/restore bit-exact, ties as identity."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jaxshare import checkpoint as jc
from jaxshare import find_shared

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.int8, jnp.uint8, jnp.bool_]
SPECIALS = [np.nan, np.inf, -np.inf, -0.0]


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    values = rng.standard_normal(shape).astype(np.float32)
    if values.size:  # Bit-exact includes NaN, infinities and the sign of zero.
        flat = values.reshape(-1)
        flat[rng.integers(0, flat.size, 2)] = rng.choice(SPECIALS, 2)
    return values.astype(dtype)


@st.composite
def arrays(draw: st.DrawFn, *, nonempty: bool = False) -> Any:
    sizes = st.integers(1 if nonempty else 0, 3)
    shape = tuple(draw(st.lists(sizes, max_size=3)))
    values = _values(
        np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, draw(st.sampled_from(DTYPES))
    )
    return values if draw(st.booleans()) else jnp.asarray(values)


@st.composite
def tied_trees(draw: st.DrawFn) -> dict:
    """A tree whose leaves are drawn from a small pool of arrays, so many are ties."""
    anchor = draw(arrays(nonempty=True))  # Orbax needs one non-empty array to store.
    pool = [anchor, *draw(st.lists(arrays(), min_size=1, max_size=3))]
    leaf = st.sampled_from([*pool, *pool, *pool, 7])  # Mostly arrays, so mostly ties.
    tree = draw(
        st.recursive(
            leaf,
            lambda children: st.one_of(
                st.lists(children, min_size=1, max_size=3),
                st.lists(children, min_size=1, max_size=2).map(tuple),
                st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3),
            ),
            max_leaves=10,
        )
    )
    return {"anchor": anchor, "tree": tree}


@settings(max_examples=20)  # Each example is an Orbax save and restore.
@given(tree=tied_trees())
def test_random_tied_trees_round_trip(tree: dict, flat: Callable[[Any], dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        jc.save(Path(tmp) / "ckpt", tree)
        restored = jc.restore(Path(tmp) / "ckpt")
    want, got = flat(tree), flat(restored)
    assert sorted(got) == sorted(want)
    for path, w in want.items():
        g = got[path]
        assert type(g) is type(w), path
        g_arr, w_arr = np.asarray(g), np.asarray(w)
        assert (g_arr.shape, g_arr.dtype) == (w_arr.shape, w_arr.dtype), path
        assert g_arr.tobytes() == w_arr.tobytes(), path
    alias_map = find_shared(tree)
    event("ties: " + ("3+" if len(alias_map) >= 3 else str(len(alias_map))))
    assert find_shared(restored) == alias_map
    for alias, canonical in alias_map.items():
        assert got[alias] is got[canonical], alias
