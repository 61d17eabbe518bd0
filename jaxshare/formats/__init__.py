"""File formats, with numpy only: safetensors files, PyTorch files, Flax msgpack
files, DeepSpeed ZeRO folders, the files of a Hugging Face directory, and where a
checkpoint item keeps what.

The layer between jaxshare's core and its framework layers. Every reader here
maps its files and hands out numpy views, one tensor at a time, as a
:class:`jaxshare.stream.TensorSource`; none of it imports JAX, Orbax or torch, so
``jaxshare inspect`` of a file, a DeepSpeed folder to safetensors, or a
``.safetensors`` output of a conversion pays for none of them. Pickled files are
read by a restricted unpickler of jaxshare's own: a payload never runs.

These are the names ``docs/formats.md`` documents; the plumbing the upper layers
share (output kinds, shard checks) is in ``jaxshare.internal``.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare.formats.dcp.metadata import read_dcp_metadata as read_dcp_metadata
    from jaxshare.formats.dcp.reader import DCPFolder as DCPFolder
    from jaxshare.formats.dcp.files import is_dcp_folder as is_dcp_folder
    from jaxshare.formats.dcp.training import is_dcp_training_folder as is_dcp_training_folder
    from jaxshare.formats.dcp.training import read_dcp_training as read_dcp_training
    from jaxshare.formats.dcp.writer import write_dcp as write_dcp
    from jaxshare.formats.deepspeed.checkpoint import DeepSpeedCheckpoint as DeepSpeedCheckpoint
    from jaxshare.formats.deepspeed.files import is_deepspeed_folder as is_deepspeed_folder
    from jaxshare.formats.deepspeed.training import DeepSpeedSlot as DeepSpeedSlot
    from jaxshare.formats.deepspeed.training import is_deepspeed_training as is_deepspeed_training
    from jaxshare.formats.deepspeed.training import (
        read_deepspeed_training as read_deepspeed_training,
    )
    from jaxshare.formats.hf.files import ADAPTER_CONFIG as ADAPTER_CONFIG
    from jaxshare.formats.hf.files import ADAPTER_WEIGHTS as ADAPTER_WEIGHTS
    from jaxshare.formats.hf.files import BIN_INDEX as BIN_INDEX
    from jaxshare.formats.hf.files import BIN_WEIGHTS as BIN_WEIGHTS
    from jaxshare.formats.hf.files import CONFIG_FILE as CONFIG_FILE
    from jaxshare.formats.hf.files import DEFAULT_MAX_SHARD_SIZE as DEFAULT_MAX_SHARD_SIZE
    from jaxshare.formats.hf.files import FLAX_INDEX as FLAX_INDEX
    from jaxshare.formats.hf.files import FLAX_WEIGHTS as FLAX_WEIGHTS
    from jaxshare.formats.hf.files import INDEX_SUFFIX as INDEX_SUFFIX
    from jaxshare.formats.hf.files import SAFE_INDEX as SAFE_INDEX
    from jaxshare.formats.hf.files import SAFE_WEIGHTS as SAFE_WEIGHTS
    from jaxshare.formats.hf.files import HFIndex as HFIndex
    from jaxshare.formats.hf.files import HFWeights as HFWeights
    from jaxshare.formats.hf.files import MODEL_ASSETS as MODEL_ASSETS
    from jaxshare.formats.hf.files import ModelFiles as ModelFiles
    from jaxshare.formats.hf.files import hf_weights as hf_weights
    from jaxshare.formats.hf.files import model_files as model_files
    from jaxshare.formats.hf.files import parse_size as parse_size
    from jaxshare.formats.hf.files import read_index as read_index
    from jaxshare.formats.hf.files import shard_name as shard_name
    from jaxshare.formats.item_files import ALIAS_MAP_FILE as ALIAS_MAP_FILE
    from jaxshare.formats.item_files import ASSETS_DIR as ASSETS_DIR
    from jaxshare.formats.item_files import EMPTY_ARRAYS_KEY as EMPTY_ARRAYS_KEY
    from jaxshare.formats.item_files import NAMING_FILE as NAMING_FILE
    from jaxshare.formats.item_files import ORBAX_METADATA_FILE as ORBAX_METADATA_FILE
    from jaxshare.formats.item_files import find_item as find_item
    from jaxshare.formats.item_files import is_checkpoint as is_checkpoint
    from jaxshare.formats.item_files import is_item as is_item
    from jaxshare.formats.item_files import item_assets as item_assets
    from jaxshare.formats.item_files import MANIFEST_FILE as MANIFEST_FILE
    from jaxshare.formats.msgpack import MsgpackFile as MsgpackFile
    from jaxshare.formats.optim import OptimizerState as OptimizerState
    from jaxshare.formats.optim import ParamGroup as ParamGroup
    from jaxshare.formats.optim import SlotSource as SlotSource
    from jaxshare.formats.optim import is_torch_training_file as is_torch_training_file
    from jaxshare.formats.optim import optimizer_state as optimizer_state
    from jaxshare.formats.optim import read_torch_training as read_torch_training
    from jaxshare.formats.pytorch import TORCH_SUFFIXES as TORCH_SUFFIXES
    from jaxshare.formats.pytorch import TorchFile as TorchFile
    from jaxshare.formats.pytorch import check_torch_file as check_torch_file
    from jaxshare.formats.pytorch import unpickle_torch_file as unpickle_torch_file
    from jaxshare.formats.safetensors import ALIAS_MAP_KEY as ALIAS_MAP_KEY
    from jaxshare.formats.safetensors import MANIFEST_KEY as MANIFEST_KEY
    from jaxshare.formats.safetensors import MAX_HEADER_BYTES as MAX_HEADER_BYTES
    from jaxshare.formats.safetensors import NAMING_KEY as NAMING_KEY
    from jaxshare.formats.safetensors import SafetensorsFile as SafetensorsFile
    from jaxshare.formats.safetensors import SafetensorsHeader as SafetensorsHeader
    from jaxshare.formats.safetensors import TensorEntry as TensorEntry
    from jaxshare.formats.safetensors import TensorSpec as TensorSpec
    from jaxshare.formats.safetensors import alias_map_in as alias_map_in
    from jaxshare.formats.safetensors import inspect_safetensors as inspect_safetensors
    from jaxshare.formats.safetensors import manifest_in as manifest_in
    from jaxshare.formats.safetensors import read_header as read_header
    from jaxshare.formats.safetensors import save_plan as save_plan
    from jaxshare.formats.safetensors import write_safetensors as write_safetensors
    from jaxshare.formats.weights import WEIGHT_FILES as WEIGHT_FILES
    from jaxshare.formats.weights import WEIGHT_SUFFIXES as WEIGHT_SUFFIXES
    from jaxshare.formats.weights import open_weights_file as open_weights_file
    from jaxshare.formats.registry import READERS as READERS
    from jaxshare.formats.reader import Reader as Reader
    from jaxshare.formats.reader import later as later
    from jaxshare.formats.optim import TrainingState as TrainingState
    from jaxshare.formats.hf.files import is_adapter_directory as is_adapter_directory
    from jaxshare.formats.hf.files import is_hf_input as is_hf_input
    from jaxshare.formats.safetensors import save_model_ties as save_model_ties

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "jaxshare.formats.reader": ["Reader", "later"],
        "jaxshare.formats.registry": ["READERS"],
        "jaxshare.formats.dcp.metadata": ["read_dcp_metadata"],
        "jaxshare.formats.dcp.files": ["is_dcp_folder"],
        "jaxshare.formats.dcp.reader": ["DCPFolder"],
        "jaxshare.formats.dcp.training": ["is_dcp_training_folder", "read_dcp_training"],
        "jaxshare.formats.dcp.writer": ["write_dcp"],
        "jaxshare.formats.deepspeed.checkpoint": ["DeepSpeedCheckpoint"],
        "jaxshare.formats.deepspeed.files": ["is_deepspeed_folder"],
        "jaxshare.formats.deepspeed.training": [
            "DeepSpeedSlot",
            "is_deepspeed_training",
            "read_deepspeed_training",
        ],
        "jaxshare.formats.hf.files": [
            "ADAPTER_CONFIG",
            "ADAPTER_WEIGHTS",
            "BIN_INDEX",
            "BIN_WEIGHTS",
            "CONFIG_FILE",
            "DEFAULT_MAX_SHARD_SIZE",
            "FLAX_INDEX",
            "FLAX_WEIGHTS",
            "INDEX_SUFFIX",
            "MODEL_ASSETS",
            "SAFE_INDEX",
            "SAFE_WEIGHTS",
            "HFIndex",
            "HFWeights",
            "ModelFiles",
            "hf_weights",
            "model_files",
            "parse_size",
            "read_index",
            "shard_name",
            "is_hf_input",
            "is_adapter_directory",
        ],
        "jaxshare.formats.item_files": [
            "ALIAS_MAP_FILE",
            "ASSETS_DIR",
            "EMPTY_ARRAYS_KEY",
            "MANIFEST_FILE",
            "NAMING_FILE",
            "ORBAX_METADATA_FILE",
            "find_item",
            "is_checkpoint",
            "is_item",
            "item_assets",
        ],
        "jaxshare.formats.msgpack": ["MsgpackFile"],
        "jaxshare.formats.optim": [
            "OptimizerState",
            "ParamGroup",
            "SlotSource",
            "is_torch_training_file",
            "optimizer_state",
            "read_torch_training",
            "TrainingState",
        ],
        "jaxshare.formats.pytorch": [
            "TORCH_SUFFIXES",
            "TorchFile",
            "check_torch_file",
            "unpickle_torch_file",
        ],
        "jaxshare.formats.safetensors": [
            "ALIAS_MAP_KEY",
            "MANIFEST_KEY",
            "MAX_HEADER_BYTES",
            "NAMING_KEY",
            "SafetensorsFile",
            "SafetensorsHeader",
            "TensorEntry",
            "TensorSpec",
            "alias_map_in",
            "inspect_safetensors",
            "manifest_in",
            "read_header",
            "save_plan",
            "write_safetensors",
            "save_model_ties",
        ],
        "jaxshare.formats.weights": ["WEIGHT_FILES", "WEIGHT_SUFFIXES", "open_weights_file"],
    },
    # "Layout" is a model family's convention (bridge.Layout): these say what they are.
    renamed={"HFLayout": "HFWeights", "hf_layout": "hf_weights"},
)
