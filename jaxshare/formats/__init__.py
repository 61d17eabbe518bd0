"""File formats, with numpy only: safetensors headers, mapping and streaming; what a
PyTorch file looks like; where a checkpoint item keeps what; which files of a
Hugging Face directory hold the weights (its index, shard names, shard sizes).

The layer between jaxshare's core and its framework layers: ``jaxshare inspect``
of a ``.safetensors`` file, the Orbax consolidation and the PyTorch bridge all
read and write safetensors through it, and none of it imports JAX, Orbax or
torch.
"""

from jaxshare.formats._hf import BIN_INDEX
from jaxshare.formats._hf import BIN_WEIGHTS
from jaxshare.formats._hf import CONFIG_FILE
from jaxshare.formats._hf import DEFAULT_MAX_SHARD_SIZE
from jaxshare.formats._hf import HF_DIRECTORY
from jaxshare.formats._hf import INDEX_SUFFIX
from jaxshare.formats._hf import SAFE_INDEX
from jaxshare.formats._hf import SAFE_WEIGHTS
from jaxshare.formats._hf import HFIndex
from jaxshare.formats._hf import HFLayout
from jaxshare.formats._hf import check_not_a_shard
from jaxshare.formats._hf import hf_layout
from jaxshare.formats._hf import is_hf_directory
from jaxshare.formats._hf import parse_size
from jaxshare.formats._hf import read_index
from jaxshare.formats._hf import shard_name
from jaxshare.formats._hf import shard_of
from jaxshare.formats._layout import ALIAS_MAP_FILE
from jaxshare.formats._layout import EMPTY_ARRAYS_KEY
from jaxshare.formats._layout import ITEM
from jaxshare.formats._layout import NAMING_FILE
from jaxshare.formats._layout import ORBAX_METADATA_FILE
from jaxshare.formats._layout import find_item
from jaxshare.formats._layout import is_item
from jaxshare.formats._safetensors import ALIAS_MAP_KEY
from jaxshare.formats._safetensors import MAX_HEADER_BYTES
from jaxshare.formats._safetensors import NAMING_KEY
from jaxshare.formats._safetensors import SAFETENSORS
from jaxshare.formats._safetensors import SafetensorsFile
from jaxshare.formats._safetensors import SafetensorsHeader
from jaxshare.formats._safetensors import TensorEntry
from jaxshare.formats._safetensors import TensorSpec
from jaxshare.formats._safetensors import alias_map_in
from jaxshare.formats._safetensors import dtype_code
from jaxshare.formats._safetensors import inspect_safetensors
from jaxshare.formats._safetensors import is_safetensors_file
from jaxshare.formats._safetensors import tie_metadata
from jaxshare.formats._safetensors import read_header
from jaxshare.formats._safetensors import save_plan
from jaxshare.formats._safetensors import write_plan
from jaxshare.formats._safetensors import write_safetensors
from jaxshare.formats._torchfile import TORCH_SUFFIXES
from jaxshare.formats._torchfile import WEIGHT_SUFFIXES
from jaxshare.formats._torchfile import check_torch_file
from jaxshare.formats._torchfile import looks_like_torch_file

__all__ = [
    "ALIAS_MAP_FILE",
    "ALIAS_MAP_KEY",
    "BIN_INDEX",
    "BIN_WEIGHTS",
    "CONFIG_FILE",
    "DEFAULT_MAX_SHARD_SIZE",
    "EMPTY_ARRAYS_KEY",
    "HF_DIRECTORY",
    "INDEX_SUFFIX",
    "ITEM",
    "MAX_HEADER_BYTES",
    "NAMING_FILE",
    "NAMING_KEY",
    "ORBAX_METADATA_FILE",
    "SAFETENSORS",
    "SAFE_INDEX",
    "SAFE_WEIGHTS",
    "TORCH_SUFFIXES",
    "WEIGHT_SUFFIXES",
    "HFIndex",
    "HFLayout",
    "SafetensorsFile",
    "SafetensorsHeader",
    "TensorEntry",
    "TensorSpec",
    "alias_map_in",
    "check_not_a_shard",
    "check_torch_file",
    "dtype_code",
    "find_item",
    "hf_layout",
    "inspect_safetensors",
    "is_hf_directory",
    "is_item",
    "is_safetensors_file",
    "looks_like_torch_file",
    "parse_size",
    "read_header",
    "read_index",
    "save_plan",
    "shard_name",
    "shard_of",
    "tie_metadata",
    "write_plan",
    "write_safetensors",
]
