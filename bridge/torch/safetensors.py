"""``.safetensors`` files of PyTorch tensors, each tie stored once.

A safetensors file cannot hold one tensor under two names, so
:func:`save_safetensors` writes each storage once and records the other names
in the file's metadata under ``"jaxshare.alias_map"`` (the alias-map JSON); the
file stays an ordinary safetensors file. :func:`load_safetensors` reads the
tensors and re-ties the aliases. The format itself (header checks, mapping,
streaming) is :mod:`jaxshare.formats`'; this module adds torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from bridge.torch.shared import tensor_ties
from bridge.torch.tensors import as_numpy, numpy_dtype
from jaxshare import AliasMap
from jaxshare.formats import ALIAS_MAP_KEY, SafetensorsFile, TensorSpec, write_safetensors
from jaxshare.internal import Perm

__all__ = ["load_safetensors", "save_safetensors"]


def _check_state_dict(state_dict: Any, arg: str = "state_dict") -> dict[str, torch.Tensor]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"`{arg}` must be a mapping of names to tensors, got {type(state_dict).__name__}."
        )
    bad = [
        f"{k!r} ({type(v).__name__})"
        for k, v in state_dict.items()
        if not isinstance(k, str) or not isinstance(v, torch.Tensor)
    ]
    if bad:
        raise TypeError(f"`{arg}` must map str names to tensors; not so for {', '.join(bad[:5])}.")
    return dict(state_dict)


def save_safetensors(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    /,
    *,
    metadata: Mapping[str, str] | None = None,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
) -> None:
    """Writes ``state_dict`` to a ``.safetensors`` file, each tied tensor once.

    A name whose tensor is the same memory as an earlier name's (a tie, or a
    permuted view of it as :func:`bridge.to_torch` returns for ties whose
    axis orders differ) is not stored; the file's metadata maps it to the name that
    is, under ``"jaxshare.alias_map"``. Plain ``safetensors`` loads the file (the
    stored names); :func:`load_safetensors` loads every name. The file is
    written at a temporary name beside ``path`` and appears only when complete.

    Args:
      state_dict: ``{name: tensor}``.
      path: the file to write.
      metadata: extra ``str -> str`` metadata to store.
      force: replace ``path`` if it is a ``.safetensors`` file already.
      inputs: files the state dict was read from; ``path`` may be none of them.

    Raises:
      FileExistsError: ``path`` exists and ``force`` is false.
      ValueError: two tensors overlap in memory without one being the other (or
        a permutation of it): ``.clone()`` one; ``path`` is an input or (with
        ``force``) not a safetensors file.
      TypeError: an entry is not a tensor.

    >>> import tempfile, torch
    >>> w = torch.arange(6.0).reshape(2, 3)
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> save_safetensors({"wte.weight": w, "lm_head.weight": w}, path)
    >>> from safetensors.torch import load_file
    >>> list(load_file(path))
    ['wte.weight']
    >>> sd = load_safetensors(path)
    >>> sd["lm_head.weight"] is sd["wte.weight"]
    True
    """
    state = _check_state_dict(state_dict)
    aliases, transforms = tensor_ties(state)
    meta = {"format": "pt", **(metadata or {})}
    meta[ALIAS_MAP_KEY] = AliasMap(aliases, transforms=transforms).to_json()
    stored = [k for k in state if k not in aliases]
    specs = [TensorSpec(k, tuple(state[k].shape), numpy_dtype(state[k].dtype, k)) for k in stored]
    with write_safetensors(path, specs, meta, force=force, inputs=inputs) as write:
        for key in stored:
            write((as_numpy(state[key], key),))


def _retie(path: Any, state: dict[str, torch.Tensor], amap: AliasMap) -> dict[str, torch.Tensor]:
    """Puts each alias back as its canonical's tensor (or one permuted view of it).

    Files that also store the aliases in full (``jaxshare convert`` writes them
    for plain readers) are re-tied only where the stored values agree.
    """
    views: dict[tuple[str, Perm], torch.Tensor] = {}
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        base = state[canonical]
        value = base if perm is None else views.setdefault((canonical, perm), base.permute(perm))
        held = state.get(alias)
        if held is not None and not (
            held.shape == value.shape and held.dtype == value.dtype and torch.equal(held, value)
        ):
            raise ValueError(
                f"{path}: stores {alias!r}, which its metadata ties to {canonical!r}, with "
                "different values; the file was changed after it was written."
            )
        state[alias] = value
    return state


def load_safetensors(path: str | os.PathLike, /) -> dict[str, torch.Tensor]:
    """Loads a ``.safetensors`` file, every tie it records the same tensor object
    as its canonical again (or the permuted view of it): jaxshare's alias map, and
    the names ``safetensors.torch.save_model`` dropped as duplicates.

    A file that records no tie loads as plain ``safetensors`` would. The header is
    checked against the file before any tensor is read.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is truncated or corrupt, or its alias metadata is
        invalid or does not fit it; one line naming the file.
    """
    from safetensors.torch import load_file

    with SafetensorsFile(path) as file:  # (The ties every reader sees: one place.)
        where, ties = file.header.path, file.ties
    return _retie(where, load_file(where), ties)
