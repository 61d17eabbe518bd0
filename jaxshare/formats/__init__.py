"""File formats, with numpy only: safetensors headers, mapping and streaming, and
what a PyTorch file looks like.

The layer between jaxshare's core and its framework layers: ``jaxshare inspect``
of a ``.safetensors`` file, the Orbax consolidation and the PyTorch bridge all
read and write safetensors through it, and none of it imports JAX, Orbax or
torch.
"""

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
from jaxshare.formats._safetensors import write_safetensors
from jaxshare.formats._torchfile import TORCH_SUFFIXES
from jaxshare.formats._torchfile import WEIGHT_SUFFIXES
from jaxshare.formats._torchfile import check_torch_file
from jaxshare.formats._torchfile import looks_like_torch_file

__all__ = [
    "ALIAS_MAP_KEY",
    "MAX_HEADER_BYTES",
    "NAMING_KEY",
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
    "inspect_safetensors",
    "is_safetensors_file",
    "tie_metadata",
    "looks_like_torch_file",
    "read_header",
    "write_safetensors",
]
