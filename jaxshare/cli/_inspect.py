"""``jaxshare inspect PATH``: the tie report of whatever ``PATH`` is.

- an Orbax item or step directory: ``jaxshare.checkpoint.inspect`` (metadata and
  the alias map only);
- a ``.safetensors`` file: ``jaxshare.formats.inspect_safetensors`` (its header
  alone, checked against the file size; no JAX, no torch);
- a ``.pt``/``.bin``/``.pth`` file: loaded with ``weights_only=True`` and mapped
  where it can be; the ties are the tensors that share memory (needs torch).
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxshare import ArrayInfo, TieReport
from jaxshare.cli._main import CLIError
from jaxshare.formats import TORCH_SUFFIXES, WEIGHT_SUFFIXES, inspect_safetensors

__all__ = ["inspect", "torch_report"]


def inspect(path: str | os.PathLike) -> TieReport:
    """The tie report of the checkpoint or weights file at ``path``.

    Raises:
      CLIError: ``path`` is neither a directory nor a weights file.
      FileNotFoundError, ValueError: a missing or unreadable input (one line).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    if path.is_dir():
        from jaxshare import checkpoint

        return checkpoint.inspect(path)
    if path.suffix == ".safetensors":
        return inspect_safetensors(path)
    if path.suffix in TORCH_SUFFIXES:
        return torch_report(path)
    raise CLIError(
        f"{path}: expected an Orbax checkpoint directory or a weights file "
        f"({', '.join(WEIGHT_SUFFIXES)})."
    )


def torch_report(path: Path) -> TieReport:
    """The report of a ``.pt``/``.bin`` file: its ties are tensors over one memory."""
    from jaxshare.cli._convert import bridge

    b = bridge()
    state = b.load_torch(path, mmap=True)
    aliases = b.shared_params(state)
    stored = {
        k: ArrayInfo(tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for k, t in state.items()
        if k not in aliases
    }
    from jaxshare import AliasMap

    return TieReport(
        str(path), "torch", stored, AliasMap(aliases), origins=dict.fromkeys(aliases, "storage")
    )
