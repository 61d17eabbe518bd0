"""What a path the user gives is, opened as a :class:`jaxshare.TensorSource`.

- an Orbax item, a ``CheckpointManager`` step holding one, (or a manager root, which
  is refused naming its steps): ``jaxshare.checkpoint.open_source``;
- a ``.safetensors`` file: ``jaxshare.formats.SafetensorsFile`` (no torch needed),
  unless an index beside it lists it as one shard of several (refused, naming
  the directory to open);
- anything PyTorch (``.pt``/``.bin``/``.pth`` files, Hugging Face directories and
  index files, DeepSpeed folders): ``bridge.open_source``, imported only then.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from jaxshare import TensorSource
from jaxshare.cli._main import CLIError
from jaxshare.formats import (
    TORCH_SUFFIXES,
    WEIGHT_SUFFIXES,
    SafetensorsFile,
    check_not_a_shard,
    is_item,
)

__all__ = ["bridge", "flax_named", "is_checkpoint", "open_input"]


def bridge() -> ModuleType:
    """The PyTorch bridge, or a usage error saying how to install it."""
    try:
        import bridge as module
    except ImportError as e:
        raise CLIError(f"PyTorch formats need the PyTorch bridge: {e}") from e
    return module


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is an Orbax item, a step directory holding items, or a
    ``CheckpointManager`` root (numbered steps holding items)."""
    if is_item(path):
        return True
    subdirs = [p for p in path.iterdir() if p.is_dir()]
    if any(is_item(p) for p in subdirs):
        return True
    steps = [p for p in subdirs if p.name.isdigit()]
    return any(is_item(q) for p in steps for q in p.iterdir() if q.is_dir())


def open_input(path: str | os.PathLike) -> TensorSource:
    """Opens ``path`` by what it is (see the module docstring).

    Raises:
      FileNotFoundError: no such path.
      CLIError: a path of no kind jaxshare reads.
      ValueError: an unreadable input (one line naming it).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    if path.is_dir() and is_checkpoint(path):
        from jaxshare import checkpoint

        return checkpoint.open_source(path)
    if path.is_file() and path.suffix == ".safetensors":
        check_not_a_shard(path)  # One shard of several is not the model.
        return SafetensorsFile(path)
    if path.is_file() and path.suffix not in (*TORCH_SUFFIXES, ".json"):
        raise CLIError(
            f"{path}: expected an Orbax checkpoint, a Hugging Face or DeepSpeed directory, "
            f"or a weights file ({', '.join(WEIGHT_SUFFIXES)})."
        )
    return bridge().open_source(path)


def flax_named(source: TensorSource) -> bool:
    """Whether ``source`` names its tensors by Flax paths (an Orbax item, or a
    ``.safetensors`` file of ``'/'``-joined names jaxshare wrote)."""
    return source.kind == "orbax" or any("/" in name for name in source.infos)
