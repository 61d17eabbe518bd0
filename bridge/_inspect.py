"""``inspect``: the tie groups of a PyTorch weights file, for ``jaxshare inspect``."""

from __future__ import annotations

import os
from pathlib import Path

from jaxshare._alias import AliasMap
from jaxshare._report import ArrayInfo, TieReport
from bridge._files import (
    TORCH_SUFFIXES,
    WEIGHT_SUFFIXES,
    alias_map_of,
    load_torch,
    read_safetensors_header,
)
from bridge._shared import shared_params
from bridge._tensors import numpy_dtype

__all__ = ["inspect"]


def inspect(path: str | os.PathLike) -> TieReport:
    """The ties of a ``.safetensors``, ``.pt``, ``.bin`` or ``.pth`` file.

    A safetensors file is described from its header alone (no tensor is read);
    its ties are the aliases in its ``"jaxshare.alias_map"`` metadata. A torch
    file is loaded (memory-mapped where it can be, ``weights_only=True``) and its
    ties are the tensors that share memory. Names are PyTorch names.

    Raises:
      FileNotFoundError: no such file.
      ValueError: an unknown suffix, an unreadable file, or (torch files) one
        that would run code when loaded.

    >>> import tempfile, torch
    >>> from bridge import save_safetensors
    >>> w = torch.zeros(4, 2)
    >>> path = tempfile.mkdtemp() + "/m.safetensors"
    >>> save_safetensors({"wte.weight": w, "lm_head.weight": w}, path)
    >>> report = inspect(path)
    >>> report.alias_map, report.bytes_stored, report.bytes_saved
    (AliasMap({'lm_head.weight': 'wte.weight'}), 32, 32)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if path.suffix == ".safetensors":
        infos, metadata = read_safetensors_header(path)
        amap = alias_map_of(path, metadata, infos)
        stored = {k: v for k, v in infos.items() if k not in amap}
        written_out = frozenset(a for a in amap if a in infos)  # e.g. a consolidated file
        return TieReport(str(path), "safetensors", stored, amap, written_out)
    if path.suffix in TORCH_SUFFIXES:
        state = load_torch(path, mmap=True)
        aliases = shared_params(state)
        stored = {
            k: ArrayInfo(tuple(t.shape), numpy_dtype(t.dtype, k).name)
            for k, t in state.items()
            if k not in aliases
        }
        return TieReport(str(path), "torch", stored, AliasMap(aliases))
    raise ValueError(f"{path}: expected a PyTorch weights file ({', '.join(WEIGHT_SUFFIXES)}).")
