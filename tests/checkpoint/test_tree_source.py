"""A Flax tree in memory as a source: its sharded leaves read and transposed bit for bit,
each block once, small leaves and large ones (whose blocks go to a few threads) alike."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxshare.checkpoint import TreeSource


@pytest.mark.parametrize("rows", [8, 4096], ids=["small", "large"])  # (large: >= 8 MiB)
@pytest.mark.parametrize("spec", [P("a", "b", None), P(None, "b"), P()], ids=str)
@pytest.mark.parametrize("perm", [(0, 1, 2), (1, 2, 0), (2, 0, 1)])
def test_a_sharded_leaf_is_read_transposed_bit_for_bit(rows, spec, perm) -> None:
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    x = np.random.default_rng(rows).standard_normal((rows, 8, 128)).astype(ml_dtypes.bfloat16)
    leaf = jax.device_put(x, NamedSharding(mesh, spec))
    source = TreeSource({"w": leaf})
    out = source.permuted_array("w", perm)
    assert out.shape == x.transpose(perm).shape and out.dtype == x.dtype
    np.testing.assert_array_equal(out.view(np.uint16), x.transpose(perm).view(np.uint16))
    np.testing.assert_array_equal(source.read("w").view(np.uint16), x.view(np.uint16))
