"""Plan from metadata, then move bytes: the pipeline under every conversion.

A :class:`TensorSource` describes what it stores (names, shapes, dtypes, ties,
a naming record) before any tensor is read, and then hands out one tensor (or
one slice) at a time. A :class:`Plan` decides, from that description alone,
every output: its name, axis order and dtype, and the output's ties. A writer then
streams the plan's outputs from the source, reading ahead on a few threads
(:class:`ReadAhead`) within a memory budget of about two tensors.
:class:`TieReport` is what a source says of itself (``jaxshare inspect``), and a
:class:`ProgressFn` hears of each tensor written.

The readers (``jaxshare.formats``, ``jaxshare.checkpoint``, ``bridge``) are
sources; the writers take a plan and a source.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare.core.progress import ProgressFn as ProgressFn
    from jaxshare.core.report import ArrayInfo as ArrayInfo
    from jaxshare.core.report import TieReport as TieReport
    from jaxshare.io.ahead import ReadAhead as ReadAhead
    from jaxshare.io.plan import Plan as Plan
    from jaxshare.io.plan import PlanEntry as PlanEntry
    from jaxshare.io.source import TensorSource as TensorSource

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "jaxshare.io.plan": ["Plan", "PlanEntry"],
        "jaxshare.io.ahead": ["ReadAhead"],
        "jaxshare.core.progress": ["ProgressFn"],
        "jaxshare.core.report": ["ArrayInfo", "TieReport"],
        "jaxshare.io.source": ["TensorSource"],
    },
)
