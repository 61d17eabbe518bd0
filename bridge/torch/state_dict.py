"""PyTorch state dicts in memory as a :class:`jaxshare.stream.TensorSource`: a
module's, or a state dict (:func:`bridge.open_source` opens whatever a user has;
a ``.pt``/``.bin`` file is read without torch, by ``jaxshare.formats.TorchFile``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from bridge.layouts.rules import Rules, layer_kind
from bridge.torch.shared import shared_params, state_dict_of
from bridge.torch.tensors import as_numpy, numpy_dtype
from jaxshare import AliasMap
from jaxshare.internal import STORAGE, Index
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = ["StateDictSource"]


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
    live = True  # a module's own tensors: arrays over them see its updates

    kind = "state dict"

    def __init__(
        self,
        module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
        rules: Rules,
        *,
        arg: str = "state_dict_or_module",
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
        self.state = state
        self.infos = {
            k: ArrayInfo(tuple(t.shape), numpy_dtype(t.dtype, k).name) for k, t in state.items()
        }
        ties = shared_params(state)
        self.origins = dict.fromkeys(ties, STORAGE)
        self.ties = AliasMap(ties)
        self.buffers: frozenset[str] | None = None
        if isinstance(module_or_state_dict, torch.nn.Module):
            module = module_or_state_dict
            params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
            self.buffers = frozenset(k for k in state if k not in params)
            self.layers = {
                p: layer_kind(m, rules) for p, m in module.named_modules(remove_duplicate=False)
            }

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset()  # A tie is one tensor: its names share one memory.

    def read(self, name: str) -> torch.Tensor:
        return self.state[name]

    def array(self, name: str) -> np.ndarray:
        return as_numpy(self.state[name], name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return as_numpy(self.state[name][index], name)
