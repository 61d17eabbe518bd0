"""Weights files by suffix: the one table of which class reads which file.

``.safetensors`` files are read by :class:`~jaxshare.formats.SafetensorsFile`,
``.pt``/``.bin``/``.pth`` files by :class:`~jaxshare.formats.TorchFile`, Flax
``.msgpack`` files by :class:`~jaxshare.formats.MsgpackFile`; each maps the file
and hands out numpy views, with numpy only. The formats' registry
(``jaxshare.formats.registry``) makes its file readers from this table, and a
Hugging Face directory opens each of its shards by it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from jaxshare.formats.msgpack import MsgpackFile
from jaxshare.formats.pytorch import TORCH_SUFFIXES, TorchFile
from jaxshare.formats.safetensors import SafetensorsFile
from jaxshare.io.source import TensorSource

__all__ = ["WEIGHT_FILES", "WEIGHT_SUFFIXES", "open_weights_file"]

#: Each weights file jaxshare reads, by suffix: the class that reads it.
WEIGHT_FILES: Mapping[str, Callable[[Path], TensorSource]] = MappingProxyType(
    {
        ".safetensors": SafetensorsFile,
        **dict.fromkeys(TORCH_SUFFIXES, TorchFile),
        ".msgpack": MsgpackFile,
    }
)
#: Suffixes of every weights file jaxshare reads.
WEIGHT_SUFFIXES = tuple(WEIGHT_FILES)


def open_weights_file(path: str | os.PathLike, /) -> TensorSource:
    """The source reading the weights file ``path``, chosen by its suffix.

    Raises:
      FileNotFoundError: no such file.
      ValueError: a suffix of no weights file, or a file its reader refuses (one
        line naming it).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/w.safetensors"
    >>> save_file({"w": np.zeros(2, np.float32)}, path)
    >>> with open_weights_file(path) as f:
    ...     f.kind, list(f.infos)
    ('safetensors', ['w'])
    """
    path = Path(path)
    if path.suffix not in WEIGHT_FILES:
        raise ValueError(
            f"{path}: not a weights file: expected one of {', '.join(WEIGHT_SUFFIXES)}."
        )
    return WEIGHT_FILES[path.suffix](path)
