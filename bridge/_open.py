"""Opening whatever a user has as a :class:`jaxshare.TensorSource`.

Every conversion reads its input through a source: names, shapes, dtypes and
ties first (no tensor read), then one tensor at a time. :func:`open_source`
takes a module, a state dict, a ``.safetensors`` / ``.pt`` / ``.bin`` file, a
Hugging Face directory or index, or a DeepSpeed folder, and opens the right one.
Only what needs torch imports it: a safetensors file or a DeepSpeed folder opens
without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge._names import Rules, as_rules
from jaxshare import TensorSource
from jaxshare.formats import (
    CONFIG_FILE,
    INDEX_SUFFIX,
    TORCH_SUFFIXES,
    WEIGHT_SUFFIXES,
    SafetensorsFile,
    check_not_a_shard,
    is_hf_directory,
)

__all__ = ["is_deepspeed_folder", "open_source"]


def is_deepspeed_folder(path: Path) -> bool:
    """Whether ``path`` looks like a DeepSpeed checkpoint: a folder holding ``latest``,
    or a tag folder holding model-states files."""
    return (path / "latest").is_file() or any(path.glob("*model_states.pt"))


def open_source(
    what: Any, rules: Rules | None = None, *, arg: str = "state_dict_or_module"
) -> TensorSource:
    """The :class:`jaxshare.TensorSource` for ``what``.

    Args:
      what: a source already; a ``torch.nn.Module`` or state dict; or a path:
        a ``.safetensors`` file (mapped, read lazily), a ``.pt``/``.bin``/``.pth``
        file (loaded with ``weights_only=True``, memory-mapped where it can be), a
        DeepSpeed checkpoint folder (:class:`bridge.DeepSpeedCheckpoint`), a
        Hugging Face directory, its ``*.index.json`` or its ``config.json``
        (:class:`bridge.HFDirectory`).
        A weights file that an index beside it lists as one shard of several is
        refused: open the directory.
      rules: the naming rules (their layer table types a module's layers).

    Raises:
      FileNotFoundError: no such path.
      ValueError: a path of a kind jaxshare does not read, or an unreadable file.
      TypeError: anything else.
    """
    if isinstance(what, TensorSource):
        return what
    rules = as_rules(rules)
    if isinstance(what, (str, os.PathLike)):
        path = Path(what)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or directory.")
        if path.is_file() and path.name.endswith(INDEX_SUFFIX):
            from bridge._hf_dir import HFDirectory

            return HFDirectory(path, rules=rules)
        if path.is_file() and path.name == CONFIG_FILE and is_hf_directory(path.parent):
            from bridge._hf_dir import HFDirectory

            return HFDirectory(path.parent, rules=rules)
        if path.suffix == ".safetensors" and path.is_file():
            check_not_a_shard(path)
            return SafetensorsFile(path)
        if path.suffix in TORCH_SUFFIXES and path.is_file():
            from bridge._sources import StateDictSource
            from bridge._torchfile import load_torch

            check_not_a_shard(path)
            state = load_torch(path, mmap=True)
            return StateDictSource(state, rules, arg=str(path), path=path)
        if path.is_dir() and is_deepspeed_folder(path):
            from bridge._zero import DeepSpeedCheckpoint

            return DeepSpeedCheckpoint(path)
        if is_hf_directory(path):
            from bridge._hf_dir import HFDirectory

            return HFDirectory(path, rules=rules)
        if path.is_dir():
            raise ValueError(
                f"{path}: not an Orbax checkpoint item, a Hugging Face directory (config.json "
                "with .safetensors or .bin weights) or a DeepSpeed checkpoint folder."
            )
        raise ValueError(
            f"{path}: expected a PyTorch weights file ({', '.join(WEIGHT_SUFFIXES)}), a "
            f"Hugging Face directory or its index (*{INDEX_SUFFIX})."
        )
    torch = sys.modules.get("torch")  # (A module exists only once torch is imported.)
    if isinstance(what, Mapping) or (torch is not None and isinstance(what, torch.nn.Module)):
        from bridge._sources import StateDictSource

        return StateDictSource(what, rules, arg=arg)
    raise TypeError(
        f"`{arg}` must be a torch.nn.Module, a state dict, a path or a jaxshare.TensorSource, "
        f"got {type(what).__name__}."
    )
