"""A streaming ``.safetensors`` writer: the header first, then one tensor at a time.

The safetensors format is an 8-byte little-endian header size, a JSON header
(``{name: {"dtype", "shape", "data_offsets"}}`` plus ``"__metadata__"``, a
``str -> str`` map), then the tensors' bytes back to back. Since every shape
and dtype is known up front, the header is written first and each tensor's
bytes follow as they are produced: memory never holds more than one tensor.
The file appears at its path only once complete (written beside it, then
renamed).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TensorSpec", "dtype_code", "stream_safetensors"]

_CODES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "float16": "F16",
    "bfloat16": "BF16",
    "uint32": "U32",
    "int32": "I32",
    "float32": "F32",
    "uint64": "U64",
    "int64": "I64",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def dtype_code(dtype: np.dtype, name: str) -> str:
    """The safetensors dtype code of ``dtype``; errors name the tensor.

    >>> dtype_code(np.dtype("float32"), "w")
    'F32'
    """
    code = _CODES.get(dtype.name)
    if code is None:
        raise ValueError(
            f"{name!r} has dtype {dtype.name}, which safetensors cannot store (it stores "
            f"{', '.join(sorted(_CODES))}); pass `dtype=` to cast floating arrays, or "
            "convert this array first."
        )
    return code


def _header(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": dtype_code(spec.dtype, spec.name),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)  # Align the data to 8 bytes, as safetensors does.


@contextmanager
def stream_safetensors(
    path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str], *, force: bool
) -> Iterator[Callable[[Iterable[np.ndarray]], None]]:
    """Yields ``write(blocks)``, to be called once per spec, in order, with the
    tensor's bytes in C order as numpy arrays of its dtype.

    Raises:
      FileExistsError: ``path`` exists and ``force`` is false.
      ValueError: a tensor's blocks do not match its spec, or fewer tensors were
        written than specs; the partial file is removed.
    """
    if path.exists() and not force:
        raise FileExistsError(f"{path} already exists; pass `force=True` to replace it.")
    header = _header(specs, metadata)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    written = 0

    def write(blocks: Iterable[np.ndarray]) -> None:
        nonlocal written
        spec = specs[written]
        size = 0
        for block in blocks:
            if block.dtype != spec.dtype:
                raise ValueError(
                    f"{spec.name!r}: expected {spec.dtype.name}, got {block.dtype.name}."
                )
            np.ascontiguousarray(block).tofile(f)
            size += block.nbytes
        if size != spec.nbytes:
            raise ValueError(f"{spec.name!r}: expected {spec.nbytes} bytes, got {size}.")
        written += 1

    try:
        with open(partial, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            yield write
            if written != len(specs):
                raise ValueError(f"{path}: wrote {written} of {len(specs)} tensors.")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
