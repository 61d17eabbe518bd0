"""``contiguous_transpose``: the same array as numpy's transposed copy, on threads or not."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxshare.io import transpose as _transpose
from jaxshare.io.transpose import contiguous_transpose


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    threads=st.booleans(),
    tiles=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    into=st.booleans(),
)
def test_equals_numpys_transposed_copy_in_tiles_on_threads(data, threads, tiles, into):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=11))
    x = data.draw(hnp.arrays(np.int32, shape))
    if data.draw(st.booleans()) and x.ndim:  # a strided input
        x = x[::-1] if data.draw(st.booleans()) else np.asfortranarray(x)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    want = np.ascontiguousarray(np.transpose(x, perm))
    out = np.full(want.shape, -1, np.int32) if into else None
    saved = _transpose.PARALLEL_BYTES, _transpose._TILE, _transpose._TILE_LAST
    # Small tiles, so that tiles end inside the array and bands split them.
    _transpose.PARALLEL_BYTES = 0 if threads else saved[0]
    _transpose._TILE, _transpose._TILE_LAST = tiles
    try:
        got = contiguous_transpose(x, perm, out=out)
    finally:
        _transpose.PARALLEL_BYTES, _transpose._TILE, _transpose._TILE_LAST = saved
    assert got.flags.c_contiguous and (out is None or got is out)
    np.testing.assert_array_equal(got, want)


def test_out_of_another_shape_or_dtype_is_refused():
    x = np.zeros((2, 3), np.float32)
    for out in (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float64)):
        with pytest.raises(ValueError, match=r"`out` must be a float32 array of shape \(3, 2\)"):
            contiguous_transpose(x, (1, 0), out=out)


def test_out_may_be_a_region_of_a_larger_array():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    big = np.full((6, 5), -1, np.int32)
    contiguous_transpose(x, (1, 0), out=big[1:5, 2:5])
    assert (big[1:5, 2:5] == x.T).all() and (big[0] == -1).all() and (big[:, :2] == -1).all()


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1536, 6144), np.float32),
        ((64, 3, 3, 2048), ml_dtypes.bfloat16),
        ((4097, 1025), np.int64),
        ((50257, 83), np.float32),  # a band of a transposed embedding: few rows out
    ],
)
def test_large_arrays_of_every_layout(shape, dtype):
    x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    assert x.nbytes >= _transpose.PARALLEL_BYTES or dtype is ml_dtypes.bfloat16
    for perm in itertools.islice(itertools.permutations(range(len(shape))), 6):
        got = contiguous_transpose(x, perm)
        assert got.tobytes() == np.ascontiguousarray(np.transpose(x, perm)).tobytes()


def test_none_gives_a_c_ordered_array():
    x = np.arange(6).reshape(2, 3).T
    got = contiguous_transpose(x, None)
    assert got.flags.c_contiguous and got.tolist() == x.tolist()
