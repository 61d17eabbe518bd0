"""Dtypes by name, and the ``dtype=`` option that casts floating arrays only.

numpy knows ``bfloat16`` and the float8 types once ``ml_dtypes`` is imported; that
import is slow, so it happens only when such a dtype is actually needed as a
numpy dtype: sizes and kinds of dtype names come from tables, and describing a
file (``jaxshare inspect``) never pays for it. Nothing here needs JAX.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["cast_to", "float_dtype", "is_floating", "itemsize", "numpy_dtype"]

#: Floating types that numpy knows only through ``ml_dtypes``.
_ML_FLOATS = frozenset(
    {
        "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn",
        "float6_e2m3fn", "float6_e3m2fn",
    }
)  # fmt: skip
_ITEMSIZES = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
    "uint32": 4, "int32": 4, "float32": 4,
    "uint64": 8, "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}  # fmt: skip


def numpy_dtype(name: Any) -> np.dtype:
    """The numpy dtype called ``name`` (``"bfloat16"`` included), or of a dtype-like.

    >>> numpy_dtype("bfloat16").itemsize
    2
    """
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401 -- registers bfloat16 and float8 names with numpy.

        return np.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of the dtype called ``name``, without importing ``ml_dtypes``.

    >>> itemsize("bfloat16"), itemsize("int64")
    (2, 8)
    """
    size = _ITEMSIZES.get(name)
    return size if size is not None else numpy_dtype(name).itemsize


def is_floating(dtype: np.dtype | str) -> bool:
    """Whether ``dtype`` is a floating type, ``bfloat16`` and float8 included.

    >>> is_floating(np.dtype("float32")), is_floating("bfloat16"), is_floating("int32")
    (True, True, False)
    """
    name = dtype if isinstance(dtype, str) else dtype.name
    return (
        name in _ML_FLOATS
        or (name in _ITEMSIZES and name.startswith("float"))
        or (not isinstance(dtype, str) and dtype.kind == "f")
    )


def float_dtype(dtype: Any) -> np.dtype | None:
    """Parses a ``dtype=`` option: a floating dtype (``"float32"``, ``jnp.bfloat16``) or ``None``.

    >>> float_dtype("bfloat16"), float_dtype(None)
    (dtype(bfloat16), None)
    """
    if dtype is None:
        return None
    try:
        parsed = numpy_dtype(dtype)
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
