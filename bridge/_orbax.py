"""``jaxshare convert`` for PyTorch files: to an Orbax checkpoint and back.

A PyTorch file becomes an Orbax item in Flax names whose alias map records the
ties (:func:`convert_to_orbax`); an item becomes a ``.safetensors``/``.pt``/
``.bin`` file in PyTorch names with every tie one tensor again
(:func:`convert_from_orbax`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jaxshare._dtype import cast_to, float_dtype
from jaxshare._progress import ProgressFn
from jaxshare._tied import Tied
from bridge._to_flax import flax_conversion, nest
from bridge._to_torch import torch_conversion
from bridge._files import WEIGHT_SUFFIXES, load_file, save_safetensors

__all__ = ["convert_from_orbax", "convert_to_orbax"]


def _check_dst(dst: Path, force: bool) -> None:
    if dst.exists() and not force:
        raise FileExistsError(f"{dst} already exists; pass `force=True` (--force) to replace it.")


def _cast(array: Any, dtype: np.dtype | None) -> Any:
    target = cast_to(array.dtype, dtype)
    return array if array.dtype == target else array.astype(target)


def convert_to_orbax(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: Any = None,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> None:
    """Converts a PyTorch weights file to an Orbax checkpoint in Flax names.

    ``src`` is a ``.safetensors`` file (aliases in its metadata re-tied) or a
    ``.pt``/``.bin``/``.pth`` state dict (read with ``weights_only=True``; a
    DeepSpeed checkpoint or consolidated ``zero_to_fp32`` state dict included).
    The checkpoint stores each tie once, with its alias map, as
    :func:`bridge.to_flax` names them; ``jaxshare.checkpoint.restore(dst)`` gives
    the variables back, ties as identity.

    Args:
      src: the PyTorch file.
      dst: the Orbax item directory to create.
      dtype: cast floating arrays to this floating dtype (``"bfloat16"``).
      force: replace ``dst`` if it exists.
      progress: called as ``progress(done, total, name)`` per tensor.

    Raises:
      FileExistsError: ``dst`` exists and ``force`` is false.
      ValueError: an unknown suffix, a refused or unreadable file, a bad ``dtype``.
    """
    from jaxshare import checkpoint

    src, dst = Path(src), Path(dst)
    _check_dst(dst, force)
    cast = float_dtype(dtype)
    state = load_file(src, mmap=True)
    stored, amap, _ = flax_conversion(state, progress=progress)
    unique = nest({path: _cast(array, cast) for path, array in stored.items()})
    checkpoint.save(dst, Tied(unique, amap), force=force)


def convert_from_orbax(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: Any = None,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> None:
    """Converts an Orbax checkpoint (Flax names) to a PyTorch weights file.

    Names and layouts follow :func:`bridge.to_torch`; every alias in the
    checkpoint's alias map is present again, as the same tensor as its canonical
    where the layouts cancel. A ``.safetensors`` file stores each tie once with
    the aliases in its metadata (:func:`bridge.save_safetensors`); a ``.pt``/
    ``.bin`` file is a ``torch.save`` of the state dict, one storage per tie.

    Args:
      src: an Orbax item directory written by ``jaxshare.checkpoint.save`` (or by
        plain Orbax: then without ties).
      dst: the file to write, ``.safetensors``, ``.pt``, ``.bin`` or ``.pth``.
      dtype: cast floating arrays to this floating dtype.
      force: replace ``dst`` if it exists.
      progress: called as ``progress(done, total, name)`` per tensor.

    Raises:
      FileExistsError: ``dst`` exists and ``force`` is false.
      ValueError: an unknown suffix, an invalid checkpoint, a bad ``dtype``.
    """
    from jaxshare import checkpoint

    src, dst = Path(src), Path(dst)
    if dst.suffix not in WEIGHT_SUFFIXES:
        raise ValueError(f"{dst}: expected a weights file suffix ({', '.join(WEIGHT_SUFFIXES)}).")
    _check_dst(dst, force)
    float_dtype(dtype)
    flat = checkpoint.consolidate(src, dtype=dtype)
    amap = checkpoint.read_alias_map(src)
    unique = nest({p: a for p, a in flat.items() if p not in amap})
    state = torch_conversion(unique, amap, progress=progress)
    if dst.suffix == ".safetensors":
        save_safetensors(state, dst)
        return
    partial = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    try:
        torch.save(state, partial)
        os.replace(partial, dst)
    finally:
        partial.unlink(missing_ok=True)
