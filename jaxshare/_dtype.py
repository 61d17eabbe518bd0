"""The ``dtype=`` option of consolidation and conversion: cast floating arrays only."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = ["cast_to", "float_dtype"]


def float_dtype(dtype: Any) -> np.dtype | None:
    """Parses a ``dtype=`` option: a floating dtype (``"float32"``, ``jnp.bfloat16``) or ``None``.

    >>> float_dtype("bfloat16"), float_dtype(None)
    (dtype(bfloat16), None)
    """
    if dtype is None:
        return None
    try:
        parsed = jnp.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"`dtype` {dtype!r} is not a dtype ({e}); e.g. 'float32'.") from None
    if not jnp.issubdtype(parsed, jnp.floating):
        raise ValueError(
            f"`dtype` must be a floating dtype such as 'float32' or 'bfloat16' (it casts "
            f"floating arrays only), got {parsed.name!r}."
        )
    return parsed


def cast_to(stored: np.dtype, dtype: np.dtype | None) -> np.dtype:
    """The dtype a stored array is read as: ``dtype`` for floating arrays."""
    return dtype if dtype is not None and jnp.issubdtype(stored, jnp.floating) else stored
