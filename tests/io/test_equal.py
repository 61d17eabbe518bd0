"""``same_bytes``: bit equality -- NaNs by their bits, -0.0 apart from 0.0 -- whatever
the blocks and threads, and a difference anywhere found."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.io import equal as _equal
from jaxshare.io.equal import same_bytes


@settings(max_examples=60, deadline=None)
@given(
    a=hnp.arrays(
        st.sampled_from([np.float32, np.uint8, np.int64, np.float16]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
    ),
    block=st.integers(1, 64),
    data=st.data(),
)
def test_equal_bytes_and_any_flipped_bit(a, block, data):
    saved, _equal.BLOCK_BYTES = _equal.BLOCK_BYTES, block  # blocks end inside the array
    try:
        assert same_bytes(a, a.copy())
        if a.nbytes:
            b = a.copy()
            raw = b.reshape(-1).view(np.uint8)
            at = data.draw(st.integers(0, raw.size - 1))
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
            assert not same_bytes(a, b)
    finally:
        _equal.BLOCK_BYTES = saved


@pytest.mark.parametrize(
    "a, b",
    [
        (np.zeros(3, np.float32), np.zeros(3, np.int32)),  # same bytes, another dtype
        (np.zeros((2, 3)), np.zeros((3, 2))),  # another shape
        (np.array([0.0]), np.array([-0.0])),  # equal values, other bits
    ],
)
def test_other_dtypes_shapes_or_bits_differ(a, b):
    assert not same_bytes(a, b)


def test_a_large_array_strided_or_not():
    a = np.random.default_rng(0).random((1024, 1536))  # 12 MiB: several blocks, threads
    assert same_bytes(a, a.copy()) and same_bytes(a.T, np.ascontiguousarray(a.T))
    b = a.copy()
    b[-1, -1] = np.nextafter(b[-1, -1], 2)
    assert not same_bytes(a, b)
