"""``contiguous_transpose``: the same array as numpy's transposed copy, on threads or not."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxshare import _perm
from jaxshare._perm import contiguous_transpose


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_equals_numpys_transposed_copy_on_threads(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, max_side=7))
    x = data.draw(hnp.arrays(np.int32, shape))
    perm = data.draw(st.permutations(range(len(shape))))
    saved, _perm._PARALLEL_BYTES = _perm._PARALLEL_BYTES, 0  # every array on threads
    try:
        got = contiguous_transpose(x, tuple(perm))
    finally:
        _perm._PARALLEL_BYTES = saved
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.ascontiguousarray(np.transpose(x, perm)))


@pytest.mark.parametrize(
    "shape, dtype",
    [((1536, 6144), np.float32), ((64, 3, 3, 2048), ml_dtypes.bfloat16), ((4097, 1025), np.int64)],
)
def test_large_arrays_of_every_layout(shape, dtype):
    x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    assert x.nbytes >= _perm._PARALLEL_BYTES or dtype is ml_dtypes.bfloat16
    for perm in itertools.islice(itertools.permutations(range(len(shape))), 6):
        got = contiguous_transpose(x, perm)
        assert got.tobytes() == np.ascontiguousarray(np.transpose(x, perm)).tobytes()


def test_none_gives_a_c_ordered_array():
    x = np.arange(6).reshape(2, 3).T
    got = contiguous_transpose(x, None)
    assert got.flags.c_contiguous and got.tolist() == x.tolist()
