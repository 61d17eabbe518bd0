"""One array across the boundary: bits kept, memory shared where the layout allows."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from bridge.torch.tensors import permuted_copy, to_array, to_tensor
from jaxshare.internal import inverse


@pytest.mark.parametrize(
    "shape, perm",
    [
        ((300, 257), (1, 0)),
        ((70, 3, 5, 61), (2, 3, 1, 0)),
        ((3, 70, 5, 61), (2, 3, 0, 1)),
        ((257, 300), (0, 1)),
        ((5, 7), (1, 0)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool])
def test_permuted_copy_is_permute_contiguous(shape, perm, dtype):
    t = torch.randint(0, 2 if dtype == torch.bool else 100, shape).to(dtype)
    got = permuted_copy(t, perm)
    assert got.is_contiguous() and torch.equal(got, t.permute(perm))


@pytest.mark.parametrize("perm", [(1, 2, 0), (2, 0, 1), (0, 2, 1)])
def test_inverse_undoes_the_permutation(perm):
    x = np.zeros((2, 3, 4))
    assert np.transpose(np.transpose(x, perm), inverse(perm)).shape == x.shape


def test_bfloat16_bits_cross_both_ways_without_float32():
    bits = torch.arange(-(2**15), 2**15, 7, dtype=torch.int32).to(torch.int16)
    t = bits.view(torch.bfloat16)  # every kind of value, NaNs and infinities included
    array = to_array(t)
    assert array.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(array).view(np.int16), bits.numpy())
    assert torch.equal(to_tensor(array).view(torch.int16), bits)
    back = to_tensor(np.asarray(array).view(ml_dtypes.bfloat16))
    assert torch.equal(back.view(torch.int16), bits)


def test_memory_is_shared_where_the_layout_allows_and_copied_otherwise():
    t = torch.randn(128, 64)
    same = to_array(t)
    assert same.unsafe_buffer_pointer() == t.data_ptr()
    moved = to_array(t, (1, 0))
    assert moved.unsafe_buffer_pointer() != t.data_ptr()
    # The transposed copy is made in memory JAX takes as it is: one copy, not two.
    copy = permuted_copy(t, (1, 0))
    assert to_array(copy).unsafe_buffer_pointer() == copy.data_ptr()
    assert to_tensor(same).data_ptr() == t.data_ptr()


def test_read_only_numpy_and_sharded_arrays_are_copied():
    a = np.arange(4.0)
    a.setflags(write=False)
    t = to_tensor(a)
    t[0] = 9.0
    assert a[0] == 0.0
    sharded = jax.device_put(
        jnp.arange(16.0), jax.NamedSharding(jax.make_mesh((8,), ("x",)), jax.P("x"))
    )
    assert torch.equal(to_tensor(sharded), torch.arange(16.0))


def test_zero_dim_and_zero_size():
    assert to_tensor(np.array(3, np.int64)).shape == ()
    assert to_tensor(jnp.zeros((0, 3))).shape == (0, 3)
    assert to_array(torch.zeros(0, 3), (1, 0)).shape == (3, 0)


@pytest.mark.parametrize(
    "value, error, match",
    [
        ("x", TypeError, "'k' holds a str"),
        (np.zeros(2, np.complex64).astype("V8"), TypeError, "no PyTorch equivalent"),
    ],
)
def test_to_tensor_refuses_what_it_cannot_carry(value, error, match):
    with pytest.raises(error, match=match):
        to_tensor(value, key="k")


def test_a_tracer_is_refused():
    with pytest.raises(TypeError, match="is a tracer"):
        jax.jit(lambda x: to_tensor(x, key="k"))(jnp.ones(2))
