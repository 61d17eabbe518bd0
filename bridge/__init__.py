"""jaxshare's PyTorch bridge: tied weights across PyTorch and Flax, nothing lost.

``import bridge`` imports torch; ``import jaxshare`` never imports this package.
The bridge builds on jaxshare's public API (``jaxshare``, ``jaxshare.formats``,
``jaxshare.checkpoint``) and its declared-internal ``jaxshare.internal``.
"""

from bridge._names import DEFAULT_LAYERS
from bridge._names import DEFAULT_LAYER_NAMES
from bridge._names import DEFAULT_RULES
from bridge._names import Rule
from bridge._names import Rules
from bridge._plans import flax_plan
from bridge._plans import torch_plan
from bridge._safetensors import load_safetensors
from bridge._safetensors import save_safetensors
from bridge._shared import shared_params
from bridge._sources import open_source
from bridge._to_flax import flax_alias_map
from bridge._to_flax import to_flax
from bridge._to_torch import to_torch
from bridge._to_torch import torch_alias_map
from bridge._torchfile import load_torch
from bridge._torchfile import save_torch
from bridge._zero import DeepSpeedCheckpoint
from bridge._zero import load_deepspeed

__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_LAYER_NAMES",
    "DEFAULT_RULES",
    "DeepSpeedCheckpoint",
    "Rule",
    "Rules",
    "flax_alias_map",
    "flax_plan",
    "load_deepspeed",
    "load_safetensors",
    "load_torch",
    "open_source",
    "save_safetensors",
    "save_torch",
    "shared_params",
    "to_flax",
    "to_torch",
    "torch_alias_map",
    "torch_plan",
]
