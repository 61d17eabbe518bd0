"""Building blocks shared by jaxshare's own upper layers: declared internal.

The PyTorch bridge (``bridge``) and the ``jaxshare`` command are built on these,
as are readers and writers of other formats. They are documented and kept
working within a release, but are not the user-facing API (that is
``jaxshare``, ``jaxshare.checkpoint``, ``jaxshare.formats`` and ``bridge``);
upper layers import them from here, never from ``jaxshare._*`` modules.
"""

from jaxshare._alias import as_alias_map
from jaxshare._dtype import cast_to
from jaxshare._dtype import float_dtype
from jaxshare._dtype import is_floating
from jaxshare._dtype import numpy_dtype
from jaxshare._lazy import exports
from jaxshare._mapped import map_file
from jaxshare._nnx import is_module as is_nnx_module
from jaxshare._nnx import is_state as is_nnx_state
from jaxshare._nnx import is_variable
from jaxshare._nnx import variable_value
from jaxshare._output import OutputKind
from jaxshare._output import atomic_output
from jaxshare._output import check_not_an_input
from jaxshare._paths import Path
from jaxshare._paths import keypath_to_path
from jaxshare._paths import nest
from jaxshare._paths import render
from jaxshare._perm import Perm
from jaxshare._perm import as_perm
from jaxshare._perm import compose
from jaxshare._perm import inverse
from jaxshare._perm import permute_shape
from jaxshare._perm import transpose
from jaxshare._report import format_bytes
from jaxshare._source import Index
from jaxshare._source import file_part

__all__ = [
    "Index",
    "OutputKind",
    "Path",
    "Perm",
    "as_alias_map",
    "as_perm",
    "atomic_output",
    "cast_to",
    "check_not_an_input",
    "compose",
    "exports",
    "float_dtype",
    "file_part",
    "format_bytes",
    "inverse",
    "is_floating",
    "is_nnx_module",
    "is_nnx_state",
    "is_variable",
    "keypath_to_path",
    "map_file",
    "nest",
    "numpy_dtype",
    "permute_shape",
    "render",
    "transpose",
    "variable_value",
]
