"""jaxshare: find tied weights in JAX pytrees and NNX graphs, and keep them.

The tie API, re-exported here; each name lives in a ``jaxshare.core`` module
with one concept. Names are imported on first use, so ``import jaxshare`` (and
the ``jaxshare`` command's start-up) does not pay for JAX until it is needed.
The public faces beside it: ``jaxshare.checkpoint`` (Orbax),
``jaxshare.formats`` (files, with numpy only), ``jaxshare.stream`` (plans,
sources and the streaming of tensors between them) and ``jaxshare.cli`` (the
command). Nothing in ``jaxshare`` imports torch but the command's demo of a
torch model.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports
from jaxshare._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from jaxshare import checkpoint as checkpoint
    from jaxshare import formats as formats
    from jaxshare import stream as stream
    from jaxshare.core.alias import AliasMap as AliasMap
    from jaxshare.core.find import find_shared as find_shared
    from jaxshare.core.naming import Naming as Naming
    from jaxshare.core.naming import NamingRecord as NamingRecord
    from jaxshare.core.tie import dedupe as dedupe
    from jaxshare.core.tie import retie as retie
    from jaxshare.core.tied import Tied as Tied
    from jaxshare.core.tied import tie as tie

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "jaxshare.core.alias": ["AliasMap"],
        "jaxshare.core.find": ["find_shared"],
        "jaxshare.core.naming": ["Naming", "NamingRecord"],
        "jaxshare.core.tie": ["dedupe", "retie"],
        "jaxshare.core.tied": ["Tied", "tie"],
        "jaxshare._version": ["__version__"],
    },
    submodules=["checkpoint", "formats", "stream"],
    moved=dict.fromkeys(
        ["ArrayInfo", "Plan", "PlanEntry", "ProgressFn", "TensorSource", "TieReport"],
        "jaxshare.stream",
    ),
)
