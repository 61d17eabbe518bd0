"""PyTorch ``.pt``/``.bin`` files as torch tensors, read without ever running pickle code.

``.pt``/``.bin`` files are pickles, which can run any code when loaded.
:func:`load_torch` reads them with jaxshare's own restricted unpickler
(:func:`jaxshare.formats.unpickle_torch_file`), which rebuilds tensors and plain
containers and refuses everything else, then makes each storage one torch
tensor over the file's memory; :func:`save_torch` writes a plan's outputs with
every tie one storage again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from bridge.torch.tensors import tensor_of, tensor_over
from jaxshare.formats import unpickle_torch_file
from jaxshare.internal import TORCH_FILE, atomic_output, state_dict_in, state_dict_ties
from jaxshare.stream import Plan, ProgressFn, TensorSource

__all__ = ["load_torch", "save_torch"]


def load_torch(path: str | os.PathLike, /, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """Loads a ``.pt``/``.bin`` state dict (zip or legacy ``torch.save`` format)
    with jaxshare's restricted unpickler, so a file that would run code when
    unpickled is refused, not run.

    Tensors that share memory in the file come back as one tensor object under
    each name (a permuted view of another tensor's storage as a view of it).
    A DeepSpeed checkpoint (``{"module": state_dict, "shared_params": ...}``)
    gives its ``module``, with the names DeepSpeed recorded as shared and did not
    store added back. A consolidated ``zero_to_fp32`` file is a plain state dict.

    Args:
      path: the file.
      mmap: map the file (copy-on-write: writing a tensor never changes the
        file) instead of reading it into memory.

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
    obj = unpickle_torch_file(path, mode="copy-on-write" if mmap else "memory")
    arrays, _, _ = state_dict_in(path, obj)
    ties = state_dict_ties(arrays)
    state: dict[str, torch.Tensor] = {}
    for name, array in arrays.items():
        same = name in ties.aliases and name not in ties.transforms  # (A view is one anyway.)
        state[name] = state[ties.aliases[name]] if same else tensor_over(array, name)
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
