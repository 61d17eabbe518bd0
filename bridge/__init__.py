"""jaxshare's PyTorch bridge: tied weights across PyTorch and Flax, nothing lost.

Torch only where torch is: ``import bridge`` needs neither torch nor JAX, and
so do the names that read files, plan conversions and name tensors -- a
DeepSpeed folder to safetensors, a Hugging Face directory to an Orbax item, an
Orbax item to safetensors in PyTorch names, ``inspect``. The names that hand out
or take torch tensors and modules (:func:`to_torch`, :func:`shared_params`,
:func:`load_torch`, ...) need torch installed, and say so in one line on first
use where it is not. The bridge builds on jaxshare's public API (``jaxshare``,
``jaxshare.stream``, ``jaxshare.formats``, ``jaxshare.checkpoint``) and its
declared-internal ``jaxshare.internal``; ``import jaxshare`` never imports it.
"""

import typing as _typing

from jaxshare.internal import exports as _exports

if _typing.TYPE_CHECKING:
    from bridge._check import CheckReport as CheckReport
    from bridge._check import Finding as Finding
    from bridge._check import check as check
    from bridge._convert import convert as convert
    from bridge._deepspeed import DeepSpeedCheckpoint as DeepSpeedCheckpoint
    from bridge._deepspeed import load_deepspeed as load_deepspeed
    from bridge._flax_placement import FlaxPlan as FlaxPlan
    from bridge._flax_placement import flax_plan as flax_plan
    from bridge._hf_dir import HFDirectory as HFDirectory
    from bridge._hf_save import save_hf as save_hf
    from bridge._inspect import inspect as inspect
    from bridge._layouts import LAYOUTS as LAYOUTS
    from bridge._layouts import Layout as Layout
    from bridge._layouts import detect_layout as detect_layout
    from bridge._open import open_source as open_source
    from bridge._optax import optax_for as optax_for
    from bridge._optax import to_optax as to_optax
    from bridge._optax_torch import from_optax as from_optax
    from bridge._outputs import FORMATS as FORMATS
    from bridge._outputs import NAMES as NAMES
    from bridge._rules import DEFAULT_LAYER_NAMES as DEFAULT_LAYER_NAMES
    from bridge._rules import DEFAULT_LAYERS as DEFAULT_LAYERS
    from bridge._rules import DEFAULT_RULES as DEFAULT_RULES
    from bridge._rules import Rule as Rule
    from bridge._rules import Rules as Rules
    from bridge._safetensors import load_safetensors as load_safetensors
    from bridge._safetensors import save_safetensors as save_safetensors
    from bridge._shared import shared_params as shared_params
    from bridge._to_flax import flax_alias_map as flax_alias_map
    from bridge._to_flax import to_flax as to_flax
    from bridge._to_torch import to_torch as to_torch
    from bridge._torch_naming import TorchPlan as TorchPlan
    from bridge._torch_naming import torch_alias_map as torch_alias_map
    from bridge._torch_naming import torch_plan as torch_plan
    from bridge._torchfile import load_torch as load_torch
    from bridge._torchfile import save_torch as save_torch
    from bridge._verify import VerifyFinding as VerifyFinding
    from bridge._verify import VerifyReport as VerifyReport
    from bridge._verify import verify as verify

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        # Torch-free: files, plans, naming.
        "bridge._check": ["CheckReport", "Finding", "check"],
        "bridge._convert": ["convert"],
        "bridge._flax_placement": ["FlaxPlan", "flax_plan"],
        "bridge._hf_dir": ["HFDirectory"],
        "bridge._hf_save": ["save_hf"],
        "bridge._inspect": ["inspect"],
        "bridge._layouts": ["LAYOUTS", "Layout", "detect_layout"],
        "bridge._open": ["open_source"],
        "bridge._optax": ["optax_for", "to_optax"],
        "bridge._outputs": ["FORMATS", "NAMES"],
        "bridge._rules": [
            "DEFAULT_LAYERS",
            "DEFAULT_LAYER_NAMES",
            "DEFAULT_RULES",
            "Rule",
            "Rules",
        ],
        "bridge._to_flax": ["flax_alias_map", "to_flax"],
        "bridge._torch_naming": ["TorchPlan", "torch_alias_map", "torch_plan"],
        "bridge._verify": ["VerifyFinding", "VerifyReport", "verify"],
        # torch: tensors and modules in and out.
        "bridge._deepspeed": ["DeepSpeedCheckpoint", "load_deepspeed"],
        "bridge._optax_torch": ["from_optax"],
        "bridge._safetensors": ["load_safetensors", "save_safetensors"],
        "bridge._shared": ["shared_params"],
        "bridge._to_torch": ["to_torch"],
        "bridge._torchfile": ["load_torch", "save_torch"],
    },
)
