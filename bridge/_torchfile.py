"""PyTorch ``.pt``/``.bin`` files, read without ever running pickle code.

``.pt``/``.bin`` files are pickles, which can run any code when loaded.
:func:`load_torch` first checks that the file looks like ``torch.save`` output
(a zip archive or a pickle stream), then only ever calls
``torch.load(..., weights_only=True)``, whose unpickler rebuilds tensors and plain
containers and refuses everything else.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from bridge._shared import shared_params
from bridge._tensors import tensor_of
from jaxshare import Plan, ProgressFn, TensorSource
from jaxshare.formats import check_torch_file, looks_like_torch_file
from jaxshare.internal import OutputKind, atomic_output

__all__ = ["TORCH_FILE", "load_torch", "safe_load", "save_torch", "unpickling_reason"]


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
    check_torch_file(path)
    return _state_dict_in(path, safe_load(path, mmap=mmap))


def safe_load(path: Path, *, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors.

    Raises:
      ValueError: the pickle needs more than tensors and plain containers
        (refused, with torch's reason), or torch cannot read the file.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path}: refused: loading it would run code beyond rebuilding tensors "
            f"({unpickling_reason(e)}). jaxshare reads .pt/.bin files only with "
            "`torch.load(weights_only=True)`; if you trust this file, load it yourself and "
            "pass the state dict."
        ) from None
    except RuntimeError as e:
        if mmap and "mmap" in str(e):
            return safe_load(path, mmap=False)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a PyTorch file torch.load can read ({first}).") from None
    except (EOFError, OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"{path}: not a PyTorch file torch.load can read ({type(e).__name__}: {e})."
        ) from None


def unpickling_reason(error: BaseException) -> str:
    """torch's own reason for refusing a pickle, in one line: the global it met.

    >>> unpickling_reason(Exception("Weights only load failed.\\n\\n"
    ...     "Trying to load unsupported GLOBAL posix.system whose module posix is blocked."))
    'Trying to load unsupported GLOBAL posix.system whose module posix is blocked'
    >>> unpickling_reason(Exception("Weights only load failed.\\nPlease file an issue with the "
    ...     "following: WeightsUnpickler error: \\n\\nUnsupported operand 123\\n\\nCheck the docs"))
    'Unsupported operand 123'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "GLOBAL" in line or "Unsupported" in line or "WeightsUnpickler error" in line:
            line = line.split("WeightsUnpickler error:")[-1].strip()
            if not line and i + 1 < len(lines):  # torch puts the reason on the next line
                line = lines[i + 1]
            return line.split(". Please use")[0].rstrip(".")
    return lines[-1] if lines else type(error).__name__


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
                + (
                    "which the file does not hold."
                    if canonical not in state
                    else "a zero-size tensor; DeepSpeed keys by data_ptr(), 0 for every zero-size "
                    "tensor, so this tie is not real and the shape of "
                    f"{alias!r} is unknown."
                )
            )
        state[alias] = state[canonical]
    return state


def save_torch(
    plan: Plan,
    source: TensorSource,
    path: str | os.PathLike,
    /,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
) -> None:
    """Writes the outputs of ``plan`` (PyTorch names), read from ``source``, as a
    ``torch.save`` state dict in which every tie is one tensor again: an identical
    alias the very tensor of its canonical, one with a transform a permuted view of
    it (one storage in the file).

    A pickle holds the whole state dict, so this output is built in memory. The
    file is written at a temporary name and appears only when complete.

    Raises:
      FileExistsError: ``path`` exists and ``force`` is false.
      ValueError: ``path`` is an input, or (with ``force``) not a PyTorch file.
    """
    state: dict[str, torch.Tensor] = {}
    for entry, array in plan.arrays(source, progress):
        state[entry.name] = tensor_of(array, key=entry.name)
    amap = plan.alias_map
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        state[alias] = state[canonical] if perm is None else state[canonical].permute(perm)
    with atomic_output(path, TORCH_FILE, force=force, inputs=inputs) as tmp:
        torch.save(state, tmp)


#: A ``.pt``/``.bin`` output, for ``force``: replaces only a PyTorch file.
TORCH_FILE = OutputKind("a PyTorch weights file", False, looks_like_torch_file)
