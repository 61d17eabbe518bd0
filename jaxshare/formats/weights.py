"""A weights file opened by its kind: the one dispatch from a file to its reader.

``.safetensors`` files are read by :class:`~jaxshare.formats.SafetensorsFile`,
``.pt``/``.bin``/``.pth`` files by :class:`~jaxshare.formats.TorchFile`, Flax
``.msgpack`` files by :class:`~jaxshare.formats.MsgpackFile`; each maps the file
and hands out numpy views, with numpy only. A Hugging Face
directory opens each of its shards this way; ``bridge.open_source`` opens a
single file this way, once it has refused a file that is one shard of several.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxshare.formats.msgpack import MsgpackFile
from jaxshare.formats.pytorch import TORCH_SUFFIXES, TorchFile
from jaxshare.formats.safetensors import SafetensorsFile
from jaxshare.io.source import TensorSource

__all__ = ["WEIGHT_SUFFIXES", "open_weights_file"]

#: Suffixes of every weights file jaxshare reads.
WEIGHT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES, ".msgpack")


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
    if path.suffix == ".safetensors":
        return SafetensorsFile(path)
    if path.suffix in TORCH_SUFFIXES:
        return TorchFile(path)
    if path.suffix == ".msgpack":
        return MsgpackFile(path)
    raise ValueError(f"{path}: not a weights file: expected one of {', '.join(WEIGHT_SUFFIXES)}.")
