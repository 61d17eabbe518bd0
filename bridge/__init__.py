"""jaxshare's PyTorch bridge: tied weights across PyTorch and Flax, nothing lost.

``import bridge`` fails at once where torch is not installed, but imports
neither torch nor JAX; ``import jaxshare`` never imports this package. The
bridge builds on jaxshare's public API (``jaxshare``, ``jaxshare.formats``,
``jaxshare.checkpoint``) and its declared-internal ``jaxshare.internal``. Names
are imported on first use, each with what it needs: reading PyTorch files,
directories and DeepSpeed folders into safetensors files needs no JAX, and
naming an Orbax item's arrays in PyTorch (:func:`torch_plan`) needs no torch.
"""

import importlib.util as _util
import typing as _typing

from jaxshare.internal import exports as _exports

if _util.find_spec("torch") is None:  # torch's door: fail on import, not on first use.
    raise ModuleNotFoundError(
        "torch is not installed; install it with `pip install 'jaxshare[torch]'`.",
        name="torch",
    )

if _typing.TYPE_CHECKING:
    from bridge._names import DEFAULT_LAYERS as DEFAULT_LAYERS
    from bridge._names import DEFAULT_LAYER_NAMES as DEFAULT_LAYER_NAMES
    from bridge._names import DEFAULT_RULES as DEFAULT_RULES
    from bridge._zero import DeepSpeedCheckpoint as DeepSpeedCheckpoint
    from bridge._hf_dir import HFDirectory as HFDirectory
    from bridge._names import Rule as Rule
    from bridge._names import Rules as Rules
    from bridge._to_flax import flax_alias_map as flax_alias_map
    from bridge._plans import flax_plan as flax_plan
    from bridge._zero import load_deepspeed as load_deepspeed
    from bridge._safetensors import load_safetensors as load_safetensors
    from bridge._torchfile import load_torch as load_torch
    from bridge._open import open_source as open_source
    from bridge._hf_save import save_hf as save_hf
    from bridge._safetensors import save_safetensors as save_safetensors
    from bridge._torchfile import save_torch as save_torch
    from bridge._shared import shared_params as shared_params
    from bridge._to_flax import to_flax as to_flax
    from bridge._to_torch import to_torch as to_torch
    from bridge._to_torch import torch_alias_map as torch_alias_map
    from bridge._plans import torch_plan as torch_plan

__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_LAYER_NAMES",
    "DEFAULT_RULES",
    "DeepSpeedCheckpoint",
    "HFDirectory",
    "Rule",
    "Rules",
    "flax_alias_map",
    "flax_plan",
    "load_deepspeed",
    "load_safetensors",
    "load_torch",
    "open_source",
    "save_hf",
    "save_safetensors",
    "save_torch",
    "shared_params",
    "to_flax",
    "to_torch",
    "torch_alias_map",
    "torch_plan",
]

_HOMES = {
    "DEFAULT_LAYERS": "bridge._names",
    "DEFAULT_LAYER_NAMES": "bridge._names",
    "DEFAULT_RULES": "bridge._names",
    "DeepSpeedCheckpoint": "bridge._zero",
    "HFDirectory": "bridge._hf_dir",
    "Rule": "bridge._names",
    "Rules": "bridge._names",
    "flax_alias_map": "bridge._to_flax",
    "flax_plan": "bridge._plans",
    "load_deepspeed": "bridge._zero",
    "load_safetensors": "bridge._safetensors",
    "load_torch": "bridge._torchfile",
    "open_source": "bridge._open",
    "save_hf": "bridge._hf_save",
    "save_safetensors": "bridge._safetensors",
    "save_torch": "bridge._torchfile",
    "shared_params": "bridge._shared",
    "to_flax": "bridge._to_flax",
    "to_torch": "bridge._to_torch",
    "torch_alias_map": "bridge._to_torch",
    "torch_plan": "bridge._plans",
}

__getattr__, __dir__ = _exports(__name__, _HOMES)
