"""PyTorch weight files: ``.safetensors`` with ties, and ``.pt``/``.bin`` read safely.

A safetensors file cannot hold one tensor under two names, so
:func:`save_safetensors` writes each storage once and records the other names
in the file's metadata, as jaxshare's alias-map JSON under
``"jaxshare.alias_map"``; the file stays an ordinary safetensors file.
:func:`load_safetensors` reads the tensors and re-ties the aliases.

``.pt``/``.bin`` files are pickles, which can run any code when loaded;
:func:`load_torch` only ever calls ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Collection, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jaxshare._alias import AliasMap
from jaxshare._report import ArrayInfo
from bridge._shared import shared_params
from bridge._tensors import Perm, numpy_dtype, numpy_view

__all__ = [
    "METADATA_KEY",
    "TORCH_SUFFIXES",
    "WEIGHT_SUFFIXES",
    "alias_map_of",
    "load_file",
    "load_safetensors",
    "load_torch",
    "read_safetensors_header",
    "save_safetensors",
]

#: The safetensors metadata key holding the alias map (PyTorch names).
METADATA_KEY = "jaxshare.alias_map"
TORCH_SUFFIXES = (".pt", ".bin", ".pth")
WEIGHT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)
#: safetensors refuses headers over 100 MB; so do we, before reading them.
MAX_HEADER_BYTES = 100 * 2**20

_DTYPE_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "F16": "float16", "BF16": "bfloat16", "U32": "uint32", "I32": "int32",
    "F32": "float32", "U64": "uint64", "I64": "int64", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip


def _ties(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, str], dict[str, Perm]]:
    """``({alias: canonical}, {alias: permutation})`` of tensors over the same memory.

    Same storage key: an identical alias. Same storage and offset, shape and
    strides a permutation of an earlier tensor's: an alias with that permutation
    (``to_torch`` gives such views). Any other overlap cannot be written once.
    """
    aliases = shared_params(state)
    transforms: dict[str, Perm] = {}
    by_storage: dict[Hashable, list[str]] = {}
    for name, t in state.items():
        if name in aliases or not t.numel() or t.is_meta or t.layout != torch.strided:
            continue  # Tied by identity only (see storage_key): shared_params found those.
        by_storage.setdefault((t.untyped_storage().data_ptr(), t.device), []).append(name)
    for names in by_storage.values():
        kept: list[str] = []
        for name in names:
            t = state[name]
            for other in kept:
                perm = _permutation_of(state[other], t)
                if perm is not None:
                    aliases[name], transforms[name] = other, perm
                    break
                if _overlap(state[other], t):
                    raise ValueError(
                        f"{name!r} and {other!r} share memory but neither is the other or a "
                        "permutation of it, so the file cannot store that memory once; "
                        f"`.clone()` one of them (e.g. state_dict[{name!r}] = "
                        f"state_dict[{name!r}].clone())."
                    )
            else:
                kept.append(name)
    return aliases, transforms


def _permutation_of(base: torch.Tensor, t: torch.Tensor) -> Perm | None:
    """``perm`` with ``t`` the very view ``base.permute(perm)``, if there is one."""
    if (
        t.dtype != base.dtype
        or t.ndim != base.ndim
        or t.storage_offset() != base.storage_offset()
        or t.ndim < 2
    ):
        return None
    free = list(range(base.ndim))
    perm = []
    for size, stride in zip(t.shape, t.stride()):
        j = next((j for j in free if (base.shape[j], base.stride(j)) == (size, stride)), None)
        if j is None:
            return None
        free.remove(j)
        perm.append(j)
    return tuple(perm) if perm != list(range(t.ndim)) else None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    start = t.storage_offset() * size
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) + 1
    return start, start + span * size


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < b1 and b0 < a1


def _check_state_dict(state_dict: Any, arg: str = "state_dict") -> dict[str, torch.Tensor]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"`{arg}` must be a mapping of names to tensors, got {type(state_dict).__name__}."
        )
    bad = [f"{k!r} ({type(v).__name__})" for k, v in state_dict.items()
           if not isinstance(k, str) or not isinstance(v, torch.Tensor)]  # fmt: skip
    if bad:
        raise TypeError(f"`{arg}` must map str names to tensors; not so for {', '.join(bad[:5])}.")
    return dict(state_dict)


def save_safetensors(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    /,
    *,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes ``state_dict`` to a ``.safetensors`` file, each tied tensor once.

    A name whose tensor is the same memory as an earlier name's (a tie, or a
    permuted view of it as :func:`bridge.to_torch` returns for ties whose
    layouts differ) is not stored; the file's metadata maps it to the name that
    is, under ``"jaxshare.alias_map"``. Plain ``safetensors`` loads the file (the
    stored names); :func:`load_safetensors` loads every name. The file appears
    only when complete (written beside it, then renamed).

    Args:
      state_dict: ``{name: tensor}``.
      path: the file to write (replaced if it exists).
      metadata: extra ``str -> str`` metadata to store.

    Raises:
      ValueError: two tensors overlap in memory without one being the other (or
        a permutation of it): ``.clone()`` one.
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
    from jaxshare.checkpoint._safetensors import TensorSpec, stream_safetensors

    state = _check_state_dict(state_dict)
    aliases, transforms = _ties(state)
    meta = {"format": "pt", **(metadata or {})}
    meta[METADATA_KEY] = AliasMap(aliases, transforms=transforms).to_json()
    stored = [k for k in state if k not in aliases]
    specs = [TensorSpec(k, tuple(state[k].shape), numpy_dtype(state[k].dtype, k)) for k in stored]
    with stream_safetensors(Path(path), specs, meta, force=True) as write:
        for key in stored:
            write((_to_numpy(state[key], key),))


def _to_numpy(t: torch.Tensor, key: str) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return numpy_view(t.contiguous(), key)


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, ArrayInfo], dict[str, str]]:
    """``({name: ArrayInfo}, metadata)`` of a safetensors file, reading only its header.

    Raises:
      ValueError: the file is not a safetensors file.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes).")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER_BYTES or size > path.stat().st_size - 8:
            raise ValueError(f"{path}: not a safetensors file (header size {size} is invalid).")
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (header is not JSON: {e}).") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (header is not a JSON object).")
    metadata = header.pop("__metadata__", None) or {}
    infos: dict[str, ArrayInfo] = {}
    for name, entry in header.items():
        try:
            shape = tuple(int(n) for n in entry["shape"])
            infos[name] = ArrayInfo(shape, _DTYPE_NAMES[entry["dtype"]])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}: tensor {name!r} has an unreadable header entry {entry!r}."
            ) from None
    return infos, metadata


def alias_map_of(path: Path, metadata: Mapping[str, str], names: Collection[str]) -> AliasMap:
    """The alias map in a safetensors file's metadata, checked against the names
    the file stores (every canonical must be one)."""
    text = metadata.get(METADATA_KEY)
    if text is None:
        return AliasMap()
    try:
        amap = AliasMap.from_json(text)
    except ValueError as e:
        raise ValueError(f"{path}: metadata {METADATA_KEY!r} is invalid: {e}") from None
    missing = sorted({c for c in amap.values() if c not in names})
    if missing:
        raise ValueError(
            f"{path}: metadata {METADATA_KEY!r} names canonical(s) {missing[:5]} that the "
            "file does not store; the file was changed after it was written."
        )
    return amap


def _retie(path: Path, state: dict[str, torch.Tensor], amap: AliasMap) -> dict[str, torch.Tensor]:
    """Puts each alias back as its canonical's tensor (or one permuted view of it).

    Files that also store the aliases in full (``jaxshare convert --names flax``
    writes them for plain readers) are re-tied only where the stored values agree.
    """
    views: dict[tuple[str, Perm], torch.Tensor] = {}
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        base = state[canonical]
        if perm is not None and base.ndim != len(perm):
            raise ValueError(
                f"{path}: alias {alias!r} permutes {len(perm)} axes, but {canonical!r} has "
                f"shape {tuple(base.shape)}."
            )
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
    """Loads a ``.safetensors`` file, every alias in its metadata the same tensor
    object as its canonical again (or the permuted view of it).

    A file without jaxshare metadata loads as plain ``safetensors`` would.

    Raises:
      ValueError: the alias metadata is invalid or does not fit the file.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    state = load_file(path)
    return _retie(path, state, alias_map_of(path, metadata, state))


def load_torch(path: str | os.PathLike, /, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """Loads a ``.pt``/``.bin`` state dict with ``torch.load(weights_only=True)``,
    so a file that would run code when unpickled is refused, not run.

    Tensors that share memory come back as one tensor object under each name.
    A DeepSpeed checkpoint (``{"module": state_dict, "shared_params": ...}``)
    gives its ``module``, with the names DeepSpeed recorded as shared and did not
    store added back. A consolidated ``zero_to_fp32`` file is a plain state dict.

    Args:
      path: the file.
      mmap: map the file instead of reading it (zip-format files only).

    Raises:
      ValueError: the file needs more than tensors and plain containers to load
        (refused), or holds no state dict.

    >>> import io, os, tempfile, torch
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.getcwd, ())
    >>> path = tempfile.mkdtemp() + "/evil.pt"
    >>> torch.save({"w": torch.zeros(1), "x": Evil()}, path)
    >>> load_torch(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...evil.pt: refused: ...
    """
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        reason = str(e).strip().splitlines()
        globals_ = [line for line in reason if "Unsupported global" in line]
        detail = (globals_ or reason or [""])[0]
        raise ValueError(
            f"{path}: refused: loading it would run code beyond rebuilding tensors "
            f"({detail.strip()}). jaxshare reads .pt/.bin files only with "
            "`torch.load(weights_only=True)`. If you trust this file, load it yourself "
            "with `torch.load(path, weights_only=False)` and pass the state dict."
        ) from None
    except RuntimeError as e:
        if mmap and "mmap" in str(e):
            return load_torch(path, mmap=False)
        raise ValueError(f"{path}: not a PyTorch file torch.load can read: {e}") from None
    return _state_dict_in(path, obj)


def _state_dict_in(path: Path, obj: Any) -> dict[str, torch.Tensor]:
    recorded: Mapping[str, str] = {}
    if isinstance(obj, Mapping) and isinstance(obj.get("module"), Mapping):  # DeepSpeed
        recorded = obj.get("shared_params") or {}
        obj = obj["module"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        what = (
            f"a dict with keys {list(obj)[:8]}" if isinstance(obj, Mapping) else type(obj).__name__
        )
        raise ValueError(
            f"{path}: expected a state dict (names -> tensors) or a DeepSpeed checkpoint "
            f"with a 'module' state dict, found {what}; extract the state dict and pass it."
        )
    state = dict(obj)
    for alias, canonical in shared_params(state).items():
        state[alias] = state[canonical]
    for alias, canonical in recorded.items():
        if alias in state:
            continue  # What the file stores is the truth; DeepSpeed's walk can be wrong.
        if canonical not in state or state[canonical].numel() == 0:
            raise ValueError(
                f"{path}: DeepSpeed's shared_params ties {alias!r} to {canonical!r}, "
                + ("which the file does not hold." if canonical not in state else
                   "a zero-size tensor; DeepSpeed keys by data_ptr(), 0 for every zero-size "
                   "tensor, so this tie is not real and the shape of "
                   f"{alias!r} is unknown.")
            )
        state[alias] = state[canonical]
    return state


def load_file(path: str | os.PathLike, /, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """:func:`load_safetensors` or :func:`load_torch`, by the file's suffix."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_safetensors(path)
    if path.suffix in TORCH_SUFFIXES:
        return load_torch(path, mmap=mmap)
    raise ValueError(
        f"{path}: expected a PyTorch weights file ({', '.join(WEIGHT_SUFFIXES)})."
    )
