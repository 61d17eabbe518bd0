"""PyTorch weights as :class:`jaxshare.TensorSource`: modules, state dicts, files.

Every conversion reads its input through a source: names, shapes, dtypes and
ties first (no tensor read), then one tensor at a time. :func:`open_source`
takes whatever a user has -- a module, a state dict, a ``.safetensors`` /
``.pt`` / ``.bin`` file, a Hugging Face directory or index, a DeepSpeed folder --
and opens the right one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bridge._names import Rules, layer_kind
from bridge._shared import shared_params, state_dict_of
from bridge._tensors import numpy_dtype, numpy_view
from jaxshare import AliasMap, ArrayInfo, TensorSource
from jaxshare.formats import (
    CONFIG_FILE,
    INDEX_SUFFIX,
    TORCH_SUFFIXES,
    WEIGHT_SUFFIXES,
    SafetensorsFile,
    check_not_a_shard,
    is_hf_directory,
)
from jaxshare.internal import Index, file_part

__all__ = ["StateDictSource", "as_numpy", "is_deepspeed_folder", "open_source"]


class StateDictSource(TensorSource):
    """A module's state dict (or a state dict) in memory.

    The ties are the tensors over one memory (:func:`bridge.shared_params`); a
    module also tells every tensor's layer type and which entries are buffers.

    Attributes:
      state: the state dict (a module's with ``keep_vars=True``, so ZeRO-3's
        ``ds_id`` survives).
      buffers: names of buffers, ``None`` when unknown (a plain state dict).
    """

    mapped = True  # blocks are views of mapped files or tensors in memory

    kind = "state dict"

    def __init__(
        self,
        module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
        rules: Rules,
        *,
        arg: str = "state_dict_or_module",
        path: Path | None = None,
        extra_ties: Mapping[str, str] | None = None,
    ) -> None:
        state = state_dict_of(module_or_state_dict, arg)
        for key, value in state.items():
            if "/" in key:
                raise ValueError(
                    f"`{arg}` name {key!r} contains '/', which Flax paths use to join keys; "
                    "rename it (PyTorch names join with '.')."
                )
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"`{arg}` entry {key!r} is a {type(value).__name__}, not a tensor; drop it "
                    "(e.g. a module's extra state) before converting."
                )
        self.path = path
        self.state = state
        self.infos = {
            k: ArrayInfo(tuple(t.shape), numpy_dtype(t.dtype, k).name) for k, t in state.items()
        }
        ties = shared_params(state)
        self.origins = dict.fromkeys(ties, "storage")
        for alias, canonical in (extra_ties or {}).items():
            if alias not in ties:
                ties[alias] = canonical
                self.origins[alias] = "recorded"
        self.ties = AliasMap(ties)
        self.buffers: frozenset[str] | None = None
        if isinstance(module_or_state_dict, torch.nn.Module):
            module = module_or_state_dict
            params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
            self.buffers = frozenset(k for k in state if k not in params)
            self.layers = {
                p: layer_kind(m, rules) for p, m in module.named_modules(remove_duplicate=False)
            }
        if path is not None:
            self.kind = "torch"
            self.parts = (file_part(path, len(state)),)

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset()  # A tie is one tensor: its names share one memory.

    def read(self, name: str) -> torch.Tensor:
        return self.state[name]

    def array(self, name: str) -> np.ndarray:
        return as_numpy(self.state[name], name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return as_numpy(self.state[name][index], name)


def as_numpy(value: Any, name: str = "?") -> np.ndarray:
    """A numpy array of ``value`` (a tensor becomes a view of its memory where it can)."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return numpy_view(t.contiguous(), name)
    return np.asarray(value)


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
    from bridge._names import as_rules

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
            from bridge._torchfile import load_torch

            check_not_a_shard(path)
            return StateDictSource(load_torch(path, mmap=True), rules, arg=str(path), path=path)
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
    if isinstance(what, (torch.nn.Module, Mapping)):
        return StateDictSource(what, rules, arg=arg)
    raise TypeError(
        f"`{arg}` must be a torch.nn.Module, a state dict, a path or a jaxshare.TensorSource, "
        f"got {type(what).__name__}."
    )
