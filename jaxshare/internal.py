"""Building blocks shared by jaxshare's own upper layers: declared internal.

The PyTorch bridge (``bridge``), the Orbax checkpoints and the ``jaxshare``
command are built on these, as are readers and writers of other formats. They
are documented and kept working within a release, but are not the user-facing
API (that is ``jaxshare``, ``jaxshare.stream``, ``jaxshare.checkpoint``,
``jaxshare.formats`` and ``bridge``). Upper layers import them from here, never
from ``jaxshare._*`` or ``jaxshare.formats._*`` modules; each keeps the name it
has in its home, and the list below is grouped by home.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare._alias import as_alias_map as as_alias_map
    from jaxshare._dtype import cast_to as cast_to
    from jaxshare._dtype import float_dtype as float_dtype
    from jaxshare._dtype import is_floating as is_floating
    from jaxshare._dtype import numpy_dtype as numpy_dtype
    from jaxshare._errors import UsageError as UsageError
    from jaxshare._lazy import exports as exports
    from jaxshare._lazy import missing_extra as missing_extra
    from jaxshare._manifest import Manifest as Manifest
    from jaxshare._manifest import ManifestEntry as ManifestEntry
    from jaxshare._manifest import TensorHash as TensorHash
    from jaxshare._manifest import tensor_digest as tensor_digest
    from jaxshare._mapped import FileRange as FileRange
    from jaxshare._mapped import map_file as map_file
    from jaxshare._memory import Extent as Extent
    from jaxshare._memory import MemoryTies as MemoryTies
    from jaxshare._memory import array_key as array_key
    from jaxshare._memory import memory_ties as memory_ties
    from jaxshare._memory import numpy_extent as numpy_extent
    from jaxshare._nnx import is_nnx_module as is_nnx_module
    from jaxshare._nnx import is_nnx_state as is_nnx_state
    from jaxshare._nnx import is_variable as is_variable
    from jaxshare._nnx import variable_value as variable_value
    from jaxshare._naming import LAYER as LAYER
    from jaxshare._naming import layer_name as layer_name
    from jaxshare._naming import layer_perm as layer_perm
    from jaxshare._naming import lift as lift
    from jaxshare._naming import stack_axis as stack_axis
    from jaxshare._naming import stack_prefix as stack_prefix
    from jaxshare._equal import same_bytes as same_bytes
    from jaxshare._output import OutputKind as OutputKind
    from jaxshare._output import atomic_output as atomic_output
    from jaxshare._output import check_not_an_input as check_not_an_input
    from jaxshare._paths import Path as Path
    from jaxshare._paths import keypath_to_path as keypath_to_path
    from jaxshare._paths import nest as nest
    from jaxshare._paths import render as render
    from jaxshare._paths import render_part as render_part
    from jaxshare._paths import split as split
    from jaxshare._perm import Perm as Perm
    from jaxshare._plan import PlannedSource as PlannedSource
    from jaxshare._perm import as_perm as as_perm
    from jaxshare._perm import compose as compose
    from jaxshare._perm import contiguous_transpose as contiguous_transpose
    from jaxshare._perm import inverse as inverse
    from jaxshare._perm import permute_shape as permute_shape
    from jaxshare._perm import transpose as transpose
    from jaxshare._report import format_bytes as format_bytes
    from jaxshare._source import Index as Index
    from jaxshare._stack import StackedSource as StackedSource
    from jaxshare._stack import UnstackedSource as UnstackedSource
    from jaxshare._stack import layer_prefixes as layer_prefixes
    from jaxshare._stack import per_layer as per_layer
    from jaxshare._stack import unstacked as unstacked
    from jaxshare._source import file_part as file_part
    from jaxshare._threads import parallel_map as parallel_map
    from jaxshare.formats._deepspeed import STAND_INS as STAND_INS
    from jaxshare.formats._deepspeed import load_deepspeed_file as load_deepspeed_file
    from jaxshare.formats._hf import HF_DIRECTORY as HF_DIRECTORY
    from jaxshare.formats._hf import check_not_a_shard as check_not_a_shard
    from jaxshare.formats._hf import is_hf_directory as is_hf_directory
    from jaxshare.formats._layout import ITEM as ITEM
    from jaxshare.formats._layout import asset_files as asset_files
    from jaxshare.formats._pytorch import TORCH_FILE as TORCH_FILE
    from jaxshare.formats._pytorch import looks_like_torch_file as looks_like_torch_file
    from jaxshare.formats._pytorch import state_dict_in as state_dict_in
    from jaxshare.formats._pytorch import state_dict_ties as state_dict_ties
    from jaxshare.formats._safetensors import SAFETENSORS as SAFETENSORS
    from jaxshare.formats._safetensors import data_offsets as data_offsets
    from jaxshare.formats._safetensors import tie_metadata as tie_metadata
    from jaxshare.formats._safetensors import write_plan as write_plan

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "jaxshare._alias": ["as_alias_map"],
        "jaxshare._dtype": ["cast_to", "float_dtype", "is_floating", "numpy_dtype"],
        "jaxshare._errors": ["UsageError"],
        "jaxshare._lazy": ["exports", "missing_extra"],
        "jaxshare._manifest": ["Manifest", "ManifestEntry", "TensorHash", "tensor_digest"],
        "jaxshare._mapped": ["FileRange", "map_file"],
        "jaxshare._memory": ["Extent", "MemoryTies", "array_key", "memory_ties", "numpy_extent"],
        "jaxshare._naming": [
            "LAYER",
            "layer_name",
            "layer_perm",
            "lift",
            "stack_axis",
            "stack_prefix",
        ],
        "jaxshare._nnx": ["is_nnx_module", "is_nnx_state", "is_variable", "variable_value"],
        "jaxshare._equal": ["same_bytes"],
        "jaxshare._output": ["OutputKind", "atomic_output", "check_not_an_input"],
        "jaxshare._paths": ["Path", "keypath_to_path", "nest", "render", "render_part", "split"],
        "jaxshare._perm": [
            "Perm",
            "as_perm",
            "compose",
            "contiguous_transpose",
            "inverse",
            "permute_shape",
            "transpose",
        ],
        "jaxshare._plan": ["PlannedSource"],
        "jaxshare._report": ["format_bytes"],
        "jaxshare._source": ["Index", "file_part"],
        "jaxshare._stack": [
            "StackedSource",
            "UnstackedSource",
            "layer_prefixes",
            "per_layer",
            "unstacked",
        ],
        "jaxshare._threads": ["parallel_map"],
        "jaxshare.formats._deepspeed": ["STAND_INS", "load_deepspeed_file"],
        "jaxshare.formats._hf": ["HF_DIRECTORY", "check_not_a_shard", "is_hf_directory"],
        "jaxshare.formats._layout": ["ITEM", "asset_files"],
        "jaxshare.formats._pytorch": [
            "TORCH_FILE",
            "looks_like_torch_file",
            "state_dict_in",
            "state_dict_ties",
        ],
        "jaxshare.formats._safetensors": [
            "SAFETENSORS",
            "data_offsets",
            "tie_metadata",
            "write_plan",
        ],
    },
)
