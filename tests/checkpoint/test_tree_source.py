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


@pytest.mark.parametrize("spec", [P("a", "b"), P("b", None), P()], ids=str)
@pytest.mark.parametrize("perm", [(0, 1), (1, 0)])
def test_a_sharded_leaf_streams_in_bands_of_rows(monkeypatch, spec, perm) -> None:
    """Bands written end to end are the leaf (transposed), bit for bit, each band
    holding only its rows, across the devices' block boundaries."""
    from jaxshare.checkpoint import _tree

    monkeypatch.setattr(_tree, "BAND_BYTES", 3 * 24 * 2)  # (3 rows of 24: bands cut blocks.)
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    x = np.random.default_rng(1).standard_normal((24, 24)).astype(ml_dtypes.bfloat16)
    source = TreeSource({"w": jax.device_put(x, NamedSharding(mesh, spec))})
    bands = list(source.permuted_blocks("w", perm))
    assert len(bands) == 8 and all(b.shape == (3, 24) for b in bands)
    np.testing.assert_array_equal(
        np.concatenate(bands).view(np.uint16), x.transpose(perm).view(np.uint16)
    )
    if perm == (0, 1):
        np.testing.assert_array_equal(
            np.concatenate(list(source.blocks("w"))).view(np.uint16), x.view(np.uint16)
        )


def test_a_leaf_that_is_not_a_sharded_array_is_one_block() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    source = TreeSource({"w": x})
    assert source.permuted_blocks("w", (1, 0)) is None
    (block,) = source.blocks("w")
    np.testing.assert_array_equal(block, x)
