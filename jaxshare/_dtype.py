"""Dtypes by name, and the ``dtype=`` option that casts floating arrays only.

numpy knows ``bfloat16`` and the float8 types once ``ml_dtypes`` is imported;
nothing here needs JAX.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["cast_to", "float_dtype", "is_floating", "numpy_dtype"]


def numpy_dtype(name: Any) -> np.dtype:
    """The numpy dtype called ``name`` (``"bfloat16"`` included), or of a dtype-like.

    >>> numpy_dtype("bfloat16").itemsize
    2
    """
    return np.dtype(name)


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating type, ``bfloat16`` and float8 included.

    >>> is_floating(np.dtype("bfloat16")), is_floating(np.dtype("int32"))
    (True, False)
    """
    if dtype.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


def float_dtype(dtype: Any) -> np.dtype | None:
    """Parses a ``dtype=`` option: a floating dtype (``"float32"``, ``jnp.bfloat16``) or ``None``.

    >>> float_dtype("bfloat16"), float_dtype(None)
    (dtype(bfloat16), None)
    """
    if dtype is None:
        return None
    try:
        parsed = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"`dtype` {dtype!r} is not a dtype ({e}); e.g. 'float32'.") from None
    if not is_floating(parsed):
        raise ValueError(
            f"`dtype` must be a floating dtype such as 'float32' or 'bfloat16' (it casts "
            f"floating arrays only), got {parsed.name!r}."
        )
    return parsed


def cast_to(stored: np.dtype, dtype: np.dtype | None) -> np.dtype:
    """The dtype a stored array is read as: ``dtype`` for floating arrays."""
    return dtype if dtype is not None and is_floating(np.dtype(stored)) else np.dtype(stored)
