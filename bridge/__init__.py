"""jaxshare's PyTorch bridge: tied weights across PyTorch and Flax, nothing lost.

``import bridge`` imports torch; ``import jaxshare`` never imports this package.
"""

from bridge._files import load_safetensors
from bridge._files import load_torch
from bridge._files import save_safetensors
from bridge._inspect import inspect
from bridge._names import DEFAULT_LAYERS
from bridge._names import DEFAULT_RULES
from bridge._names import Rule
from bridge._names import Rules
from bridge._orbax import convert_from_orbax
from bridge._orbax import convert_to_orbax
from bridge._shared import shared_params
from bridge._to_flax import flax_alias_map
from bridge._to_flax import to_flax
from bridge._to_torch import to_torch
from bridge._to_torch import torch_alias_map
from bridge._zero import DeepSpeedCheckpoint
from bridge._zero import load_deepspeed

__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_RULES",
    "DeepSpeedCheckpoint",
    "Rule",
    "Rules",
    "convert_from_orbax",
    "convert_to_orbax",
    "flax_alias_map",
    "inspect",
    "load_deepspeed",
    "load_safetensors",
    "load_torch",
    "save_safetensors",
    "shared_params",
    "to_flax",
    "to_torch",
    "torch_alias_map",
]
