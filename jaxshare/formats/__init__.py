"""File formats, with numpy only: safetensors headers, mapping and streaming; what a
PyTorch file looks like; where a checkpoint item keeps what.

The layer between jaxshare's core and its framework layers: ``jaxshare inspect``
of a ``.safetensors`` file, the Orbax consolidation and the PyTorch bridge all
read and write safetensors through it, and none of it imports JAX, Orbax or
torch.
"""

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
    "EMPTY_ARRAYS_KEY",
    "ITEM",
    "MAX_HEADER_BYTES",
    "NAMING_FILE",
    "NAMING_KEY",
    "ORBAX_METADATA_FILE",
    "SAFETENSORS",
    "TORCH_SUFFIXES",
    "WEIGHT_SUFFIXES",
    "SafetensorsFile",
    "SafetensorsHeader",
    "TensorEntry",
    "TensorSpec",
    "alias_map_in",
    "check_torch_file",
    "dtype_code",
    "find_item",
    "inspect_safetensors",
    "is_item",
    "is_safetensors_file",
    "looks_like_torch_file",
    "read_header",
    "save_plan",
    "tie_metadata",
    "write_plan",
    "write_safetensors",
]
