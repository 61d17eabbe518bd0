"""Zero-size arrays, which Orbax refuses to store.

``save`` takes them out of the tree Orbax writes and records each one's shape,
dtype and array type in the PyTree checkpoint's custom metadata;
``restore`` puts them back. The record, under ``"jaxshare.empty_arrays"``::

    {"params/bias": {"shape": [0], "dtype": "bfloat16", "type": "jax"}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxshare.core.dtype import numpy_dtype
from jaxshare.core.paths import flatten_with_paths, render
from jaxshare.core.report import ArrayInfo

__all__ = ["EmptyArray", "split_empty", "parse_record"]

_TYPES = ("jax", "numpy")


@dataclass(frozen=True)
class EmptyArray:
    """A zero-size array as recorded: shape, dtype, and ``"jax"`` or ``"numpy"``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    type: str

    @property
    def info(self) -> ArrayInfo:
        return ArrayInfo(self.shape, self.dtype.name)

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype.name, "type": self.type}

    def make(self, like: Any = None) -> Any:
        """The array again; ``like`` (a restore target leaf) decides type and sharding."""
        value = np.zeros(self.shape, self.dtype)
        if isinstance(like, np.ndarray) or (like is None and self.type == "numpy"):
            return value
        import jax
        import jax.numpy as jnp

        sharding = getattr(like, "sharding", None)
        return jnp.asarray(value) if sharding is None else jax.device_put(value, sharding)


def split_empty(tree: Any, /) -> tuple[Any, dict[str, EmptyArray]]:
    """``tree`` without its zero-size arrays, and the record of those removed.

    >>> import numpy as np
    >>> rest, empty = split_empty({"w": np.ones(2), "b": np.zeros((0, 3))})
    >>> sorted(rest), empty["b"].to_json()
    (['w'], {'shape': [0, 3], 'dtype': 'float64', 'type': 'numpy'})
    """
    from jaxshare.core.edit import DROP, edit_paths
    from jaxshare.core.leafkey import is_array

    empty = {
        render(path): EmptyArray(
            tuple(leaf.shape),
            np.dtype(leaf.dtype),
            "numpy" if isinstance(leaf, np.ndarray) else "jax",
        )
        for path, leaf in flatten_with_paths(tree)
        if is_array(leaf) and leaf.size == 0
    }
    if not empty:
        return tree, {}
    return edit_paths(tree, dict.fromkeys(empty, DROP)), empty


def parse_record(record: Any, where: str) -> dict[str, EmptyArray]:
    """Reads the record written at save time, strictly; errors name ``where``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: the empty-array record must be an object, got {record!r}.")
    out: dict[str, EmptyArray] = {}
    for path, entry in record.items():
        try:
            if not isinstance(entry, Mapping) or set(entry) != {"shape", "dtype", "type"}:
                raise ValueError("expected an object with fields 'shape', 'dtype', 'type'")
            shape = entry["shape"]
            if not isinstance(shape, list) or any(type(n) is not int or n < 0 for n in shape):
                raise ValueError(f"'shape' must be a list of sizes, got {shape!r}")
            if 0 not in shape:
                raise ValueError(f"shape {shape} is not zero-size")
            if entry["type"] not in _TYPES:
                raise ValueError(f"'type' must be one of {_TYPES}, got {entry['type']!r}")
            out[path] = EmptyArray(tuple(shape), numpy_dtype(entry["dtype"]), entry["type"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: empty array {path!r}: {e}.") from None
    return out
