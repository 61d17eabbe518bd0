"""The outputs :func:`bridge.convert` writes: its formats and namings, by name.

Kept apart, with no imports, so the ``jaxshare`` command can offer them as
choices in ``--help`` without importing anything else.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["FORMATS", "NAMES", "Format"]

Format = Literal["orbax", "safetensors", "torch", "hf", "dcp"]
#: The output formats, as ``format=`` (and ``--format``) names them.
FORMATS: tuple[Format, ...] = ("orbax", "safetensors", "torch", "hf", "dcp")
#: The namings of a ``.safetensors`` output (``names=``, ``--names``).
NAMES = ("flax", "torch")
