"""Building blocks shared by jaxshare's own upper layers: declared internal.

The PyTorch bridge (``bridge``), the Orbax checkpoints and the ``jaxshare``
command are built on these, as are readers and writers of other formats. They
are documented and kept working within a release, but are not the user-facing
API (that is ``jaxshare``, ``jaxshare.stream``, ``jaxshare.checkpoint``,
``jaxshare.formats`` and ``bridge``). Upper layers import them from here, never
from the modules of ``jaxshare.core``, ``jaxshare.io`` or ``jaxshare.formats``
themselves; each keeps the name it has in its home, and the list below is grouped
by layer and home.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare._lazy import exports as exports
    from jaxshare._lazy import missing_extra as missing_extra
    from jaxshare.core.alias import as_alias_map as as_alias_map
    from jaxshare.core.dtype import cast_to as cast_to
    from jaxshare.core.dtype import float_dtype as float_dtype
    from jaxshare.core.dtype import is_floating as is_floating
    from jaxshare.core.dtype import numpy_dtype as numpy_dtype
    from jaxshare.core.errors import UsageError as UsageError
    from jaxshare.core.manifest import Manifest as Manifest
    from jaxshare.core.manifest import ManifestEntry as ManifestEntry
    from jaxshare.core.manifest import TensorHash as TensorHash
    from jaxshare.core.manifest import tensor_digest as tensor_digest
    from jaxshare.core.memory import Extent as Extent
    from jaxshare.core.memory import MemoryTies as MemoryTies
    from jaxshare.core.memory import array_key as array_key
    from jaxshare.core.memory import memory_ties as memory_ties
    from jaxshare.core.memory import numpy_extent as numpy_extent
    from jaxshare.core.naming import EXPERT as EXPERT
    from jaxshare.core.naming import LAYER as LAYER
    from jaxshare.core.naming import STACKED as STACKED
    from jaxshare.core.naming import layer_name as layer_name
    from jaxshare.core.naming import layer_perm as layer_perm
    from jaxshare.core.naming import lift as lift
    from jaxshare.core.naming import stack_axis as stack_axis
    from jaxshare.core.naming import stack_levels as stack_levels
    from jaxshare.core.naming import stack_prefix as stack_prefix
    from jaxshare.core.nnx import is_nnx_module as is_nnx_module
    from jaxshare.core.nnx import is_nnx_state as is_nnx_state
    from jaxshare.core.nnx import is_variable as is_variable
    from jaxshare.core.nnx import variable_value as variable_value
    from jaxshare.core.paths import Path as Path
    from jaxshare.core.paths import flatten_with_paths as flatten_with_paths
    from jaxshare.core.paths import keypath_to_path as keypath_to_path
    from jaxshare.core.paths import nest as nest
    from jaxshare.core.paths import render as render
    from jaxshare.core.paths import render_part as render_part
    from jaxshare.core.paths import split as split
    from jaxshare.core.perm import Perm as Perm
    from jaxshare.core.perm import as_perm as as_perm
    from jaxshare.core.perm import compose as compose
    from jaxshare.core.perm import inverse as inverse
    from jaxshare.core.perm import permute_shape as permute_shape
    from jaxshare.core.perm import transpose as transpose
    from jaxshare.core.report import ALIAS_MAP as ALIAS_MAP
    from jaxshare.core.report import METADATA as METADATA
    from jaxshare.core.report import SHARED_PARAMS as SHARED_PARAMS
    from jaxshare.core.report import STORAGE as STORAGE
    from jaxshare.core.report import format_bytes as format_bytes
    from jaxshare.core.strict_json import reading as reading
    from jaxshare.io.atomic import OutputKind as OutputKind
    from jaxshare.io.buffers import empty_array as empty_array
    from jaxshare.io.atomic import atomic_output as atomic_output
    from jaxshare.io.atomic import check_not_an_input as check_not_an_input
    from jaxshare.io.equal import same_bytes as same_bytes
    from jaxshare.io.equal import words as words
    from jaxshare.io.mapped import FileRange as FileRange
    from jaxshare.io.mapped import map_file as map_file
    from jaxshare.io.plan import PlannedSource as PlannedSource
    from jaxshare.io.source import Index as Index
    from jaxshare.io.source import RecordedTie as RecordedTie
    from jaxshare.io.source import RetiedSource as RetiedSource
    from jaxshare.io.source import SourceView as SourceView
    from jaxshare.io.source import UnheldTies as UnheldTies
    from jaxshare.io.source import file_part as file_part
    from jaxshare.io.stack import StackedSource as StackedSource
    from jaxshare.io.stack import UnstackedSource as UnstackedSource
    from jaxshare.io.stack import layer_prefixes as layer_prefixes
    from jaxshare.io.stack import per_layer as per_layer
    from jaxshare.io.stack import unstacked as unstacked
    from jaxshare.io.threads import parallel_map as parallel_map
    from jaxshare.io.transpose import PARALLEL_BYTES as PARALLEL_BYTES
    from jaxshare.io.transpose import contiguous_transpose as contiguous_transpose
    from jaxshare.formats.deepspeed.files import STAND_INS as STAND_INS
    from jaxshare.formats.deepspeed.files import load_deepspeed_file as load_deepspeed_file
    from jaxshare.formats.hf.files import HF_DIRECTORY as HF_DIRECTORY
    from jaxshare.formats.hf.files import check_not_a_shard as check_not_a_shard
    from jaxshare.formats.hf.files import is_hf_directory as is_hf_directory
    from jaxshare.formats.item_files import ITEM as ITEM
    from jaxshare.formats.item_files import asset_files as asset_files
    from jaxshare.formats.pytorch import TORCH_FILE as TORCH_FILE
    from jaxshare.formats.pytorch import looks_like_torch_file as looks_like_torch_file
    from jaxshare.formats.pytorch import state_dict_in as state_dict_in
    from jaxshare.formats.pytorch import state_dict_ties as state_dict_ties
    from jaxshare.formats.safetensors import SAFETENSORS as SAFETENSORS
    from jaxshare.formats.safetensors import data_offsets as data_offsets
    from jaxshare.formats.safetensors import tie_metadata as tie_metadata
    from jaxshare.formats.safetensors import write_plan as write_plan

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        # The core.
        "jaxshare._lazy": ["exports", "missing_extra"],
        "jaxshare.core.alias": ["as_alias_map"],
        "jaxshare.core.dtype": ["cast_to", "float_dtype", "is_floating", "numpy_dtype"],
        "jaxshare.core.errors": ["UsageError"],
        "jaxshare.core.manifest": ["Manifest", "ManifestEntry", "TensorHash", "tensor_digest"],
        "jaxshare.core.memory": [
            "Extent",
            "MemoryTies",
            "array_key",
            "memory_ties",
            "numpy_extent",
        ],
        "jaxshare.core.naming": [
            "EXPERT",
            "LAYER",
            "STACKED",
            "layer_name",
            "layer_perm",
            "lift",
            "stack_axis",
            "stack_levels",
            "stack_prefix",
        ],
        "jaxshare.core.nnx": ["is_nnx_module", "is_nnx_state", "is_variable", "variable_value"],
        "jaxshare.core.paths": [
            "Path",
            "flatten_with_paths",
            "keypath_to_path",
            "nest",
            "render",
            "render_part",
            "split",
        ],
        "jaxshare.core.perm": [
            "Perm",
            "as_perm",
            "compose",
            "inverse",
            "permute_shape",
            "transpose",
        ],
        "jaxshare.core.report": [
            "ALIAS_MAP",
            "METADATA",
            "SHARED_PARAMS",
            "STORAGE",
            "format_bytes",
        ],
        "jaxshare.core.strict_json": ["reading"],
        # The I/O engine.
        "jaxshare.io.atomic": ["OutputKind", "atomic_output", "check_not_an_input"],
        "jaxshare.io.buffers": ["empty_array"],
        "jaxshare.io.equal": ["same_bytes", "words"],
        "jaxshare.io.mapped": ["FileRange", "map_file"],
        "jaxshare.io.plan": ["PlannedSource"],
        "jaxshare.io.source": [
            *("Index", "RecordedTie", "RetiedSource", "SourceView", "UnheldTies", "file_part"),
        ],
        "jaxshare.io.stack": [
            "StackedSource",
            "UnstackedSource",
            "layer_prefixes",
            "per_layer",
            "unstacked",
        ],
        "jaxshare.io.threads": ["parallel_map"],
        "jaxshare.io.transpose": ["PARALLEL_BYTES", "contiguous_transpose"],
        # The formats.
        "jaxshare.formats.deepspeed.files": ["STAND_INS", "load_deepspeed_file"],
        "jaxshare.formats.hf.files": ["HF_DIRECTORY", "check_not_a_shard", "is_hf_directory"],
        "jaxshare.formats.item_files": ["ITEM", "asset_files"],
        "jaxshare.formats.pytorch": [
            "TORCH_FILE",
            "looks_like_torch_file",
            "state_dict_in",
            "state_dict_ties",
        ],
        "jaxshare.formats.safetensors": [
            "SAFETENSORS",
            "data_offsets",
            "tie_metadata",
            "write_plan",
        ],
    },
)
