"""jaxshare: find tied weights in JAX pytrees and NNX graphs, and keep them.

The public API, re-exported here; each name lives in a private module with one
concept. Names are imported on first use, so ``import jaxshare`` (and the
``jaxshare`` command's start-up) does not pay for JAX until it is needed;
``jaxshare.checkpoint`` (Orbax) and ``jaxshare.formats`` are subpackages, and
nothing in ``jaxshare`` imports torch.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports
from jaxshare._version import __version__

if _typing.TYPE_CHECKING:
    from jaxshare import checkpoint as checkpoint
    from jaxshare import formats as formats
    from jaxshare._alias import AliasMap as AliasMap
    from jaxshare._find import find_shared as find_shared
    from jaxshare._naming import Naming as Naming
    from jaxshare._naming import NamingRecord as NamingRecord
    from jaxshare._plan import Plan as Plan
    from jaxshare._plan import PlanEntry as PlanEntry
    from jaxshare._progress import ProgressFn as ProgressFn
    from jaxshare._report import ArrayInfo as ArrayInfo
    from jaxshare._report import TieReport as TieReport
    from jaxshare._source import TensorSource as TensorSource
    from jaxshare._tie import dedupe as dedupe
    from jaxshare._tie import retie as retie
    from jaxshare._tied import Tied as Tied
    from jaxshare._tied import tie as tie

__all__ = [
    "AliasMap",
    "ArrayInfo",
    "Naming",
    "NamingRecord",
    "Plan",
    "PlanEntry",
    "ProgressFn",
    "TensorSource",
    "TieReport",
    "Tied",
    "__version__",
    "checkpoint",
    "dedupe",
    "find_shared",
    "formats",
    "retie",
    "tie",
]

# name -> the module that defines it (a subpackage stands for itself).
_HOMES = {
    "AliasMap": "jaxshare._alias",
    "ArrayInfo": "jaxshare._report",
    "Naming": "jaxshare._naming",
    "NamingRecord": "jaxshare._naming",
    "Plan": "jaxshare._plan",
    "PlanEntry": "jaxshare._plan",
    "ProgressFn": "jaxshare._progress",
    "TensorSource": "jaxshare._source",
    "TieReport": "jaxshare._report",
    "Tied": "jaxshare._tied",
    "checkpoint": "jaxshare.checkpoint",
    "dedupe": "jaxshare._tie",
    "find_shared": "jaxshare._find",
    "formats": "jaxshare.formats",
    "retie": "jaxshare._tie",
    "tie": "jaxshare._tied",
}


__getattr__, __dir__ = _exports(__name__, _HOMES)
