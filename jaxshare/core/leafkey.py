"""What makes two leaves "the same": object identity or the memory they occupy.

A key function maps a leaf to a hashable key, or ``None`` when the leaf can
never be an alias (not an array, or an array with no memory to share). Leaves
with equal keys are ties.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from jaxshare.core.memory import numpy_extent

__all__ = ["By", "KeyFn", "identity_key", "is_array", "key_function"]

By = Literal["identity", "buffer"]
KeyFn = Callable[[Any, Callable[[], str]], Hashable | None]


def is_array(x: Any) -> bool:
    """Arrays are the only leaves that can be tied (``jax.Array``, tracers, numpy)."""
    return isinstance(x, (jax.Array, np.ndarray))


def identity_key(leaf: Any, where: Callable[[], str]) -> Hashable | None:
    return id(leaf) if is_array(leaf) else None


def _buffer_key(leaf: Any, where: Callable[[], str]) -> Hashable | None:
    if isinstance(leaf, np.ndarray):
        return numpy_extent(leaf)  # (None for zero-size arrays.)
    if not isinstance(leaf, jax.Array):
        return None
    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(
            f"leaf at {where()!r} is a tracer, which has no device buffer: "
            "`by='buffer'` needs concrete arrays. Inside `jax.jit` use `by='identity'`."
        )
    if leaf.is_deleted():
        raise ValueError(
            f"array at {where()!r} has been deleted (donated to a jitted call?); its "
            "buffer address may already belong to another array, so ties cannot be "
            "read from it. Find ties before donating, or on the call's outputs."
        )
    if leaf.size == 0:
        return None  # Zero-size arrays have no memory; their addresses mean nothing.
    sharding = leaf.sharding
    if isinstance(sharding, SingleDeviceSharding):  # One buffer: skip the shard wrappers.
        device: Any  # jaxlib ships no type information for its Device.
        (device,) = sharding.device_set
        shards: tuple = ((device.id, leaf.unsafe_buffer_pointer()),)
    else:
        shards = tuple(
            sorted((s.device.id, s.data.unsafe_buffer_pointer()) for s in leaf.addressable_shards)
        )
    return ("jax", shards, leaf.shape, leaf.dtype, sharding)


def key_function(by: By) -> KeyFn:
    """The key function for ``by``; a clear error for anything else."""
    if by == "identity":
        return identity_key
    if by == "buffer":
        return _buffer_key
    raise ValueError(f"`by` must be 'identity' or 'buffer', got {by!r}.")
