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
    from bridge.adapters.peft import Adapter as Adapter
    from bridge.adapters.peft import LoraConfig as LoraConfig
    from bridge.adapters.peft import read_adapter as read_adapter
    from bridge.adapters.peft import save_adapter as save_adapter
    from bridge.adapters.flax_lora import adapter_from_flax as adapter_from_flax
    from bridge.adapters.flax_lora import adapter_to_flax as adapter_to_flax
    from bridge.adapters.flax_lora import qwix_rules as qwix_rules
    from bridge.adapters.flax_lora import read_tunix_lora as read_tunix_lora
    from bridge.commands.check import CheckReport as CheckReport
    from bridge.commands.check import Finding as Finding
    from bridge.commands.check import check as check
    from bridge.commands.convert import convert as convert
    from bridge.commands.merge import merge_lora as merge_lora
    from bridge.torch.deepspeed import DeepSpeedCheckpoint as DeepSpeedCheckpoint
    from bridge.torch.deepspeed import load_deepspeed as load_deepspeed
    from bridge.naming.flax_placement import FlaxPlacement as FlaxPlacement
    from bridge.naming.flax_placement import flax_plan as flax_plan
    from bridge.hf.directory import HFDirectory as HFDirectory
    from bridge.commands.save_hf import save_hf as save_hf
    from bridge.commands.inspect import inspect as inspect
    from bridge.layouts.layout import LAYOUTS as LAYOUTS
    from bridge.layouts.layout import Layout as Layout
    from bridge.layouts.layout import detect_layout as detect_layout
    from bridge.sources.registry import open_source as open_source
    from bridge.training.to_optax import to_optax as to_optax
    from bridge.training.tx import optax_for as optax_for
    from bridge.training.from_optax import from_optax as from_optax
    from bridge.commands.outputs import FORMATS as FORMATS
    from bridge.commands.outputs import NAMES as NAMES
    from bridge.layouts.rules import DEFAULT_LAYER_NAMES as DEFAULT_LAYER_NAMES
    from bridge.layouts.rules import DEFAULT_LAYERS as DEFAULT_LAYERS
    from bridge.layouts.rules import DEFAULT_RULES as DEFAULT_RULES
    from bridge.layouts.rules import Rule as Rule
    from bridge.layouts.rules import Rules as Rules
    from bridge.torch.safetensors import load_safetensors as load_safetensors
    from bridge.torch.safetensors import save_safetensors as save_safetensors
    from bridge.torch.shared import shared_params as shared_params
    from bridge.naming.to_flax import flax_alias_map as flax_alias_map
    from bridge.naming.to_flax import to_flax as to_flax
    from bridge.naming.to_torch import to_torch as to_torch
    from bridge.naming.torch_naming import TorchNaming as TorchNaming
    from bridge.naming.torch_naming import torch_alias_map as torch_alias_map
    from bridge.naming.torch_naming import torch_plan as torch_plan
    from bridge.torch.torch_file import load_torch as load_torch
    from bridge.torch.torch_file import save_torch as save_torch
    from bridge.commands.verify import VerifyFinding as VerifyFinding
    from bridge.commands.verify import VerifyReport as VerifyReport
    from bridge.commands.verify import verify as verify

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        # Torch-free: files, plans, naming.
        "bridge.adapters.peft": ["Adapter", "LoraConfig", "read_adapter", "save_adapter"],
        "bridge.adapters.flax_lora": [
            "adapter_from_flax",
            "adapter_to_flax",
            "qwix_rules",
            "read_tunix_lora",
        ],
        "bridge.commands.check": ["CheckReport", "Finding", "check"],
        "bridge.commands.convert": ["convert"],
        "bridge.commands.merge": ["merge_lora"],
        "bridge.naming.flax_placement": ["FlaxPlacement", "flax_plan"],
        "bridge.hf.directory": ["HFDirectory"],
        "bridge.commands.save_hf": ["save_hf"],
        "bridge.commands.inspect": ["inspect"],
        "bridge.layouts.layout": ["LAYOUTS", "Layout", "detect_layout"],
        "bridge.sources.registry": ["open_source"],
        "bridge.training.to_optax": ["to_optax"],
        "bridge.training.tx": ["optax_for"],
        "bridge.commands.outputs": ["FORMATS", "NAMES"],
        "bridge.layouts.rules": [
            "DEFAULT_LAYERS",
            "DEFAULT_LAYER_NAMES",
            "DEFAULT_RULES",
            "Rule",
            "Rules",
        ],
        "bridge.naming.to_flax": ["flax_alias_map", "to_flax"],
        "bridge.naming.torch_naming": ["TorchNaming", "torch_alias_map", "torch_plan"],
        "bridge.commands.verify": ["VerifyFinding", "VerifyReport", "verify"],
        # torch: tensors and modules in and out.
        "bridge.torch.deepspeed": ["DeepSpeedCheckpoint", "load_deepspeed"],
        "bridge.training.from_optax": ["from_optax"],
        "bridge.torch.safetensors": ["load_safetensors", "save_safetensors"],
        "bridge.torch.shared": ["shared_params"],
        "bridge.naming.to_torch": ["to_torch"],
        "bridge.torch.torch_file": ["load_torch", "save_torch"],
    },
    # A placement is not a `Plan`, nor is a naming: their names say so now.
    renamed={"FlaxPlan": "FlaxPlacement", "TorchPlan": "TorchNaming"},
)
