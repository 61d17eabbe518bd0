"""``inspect``: what a checkpoint, directory or weights file holds, and its ties.

Every input is opened by :func:`bridge.open_source` and described from its
metadata alone: an Orbax item from its metadata and alias map, a ``.safetensors``
file from its header (checked against the file size), a PyTorch file from its
pickle (read by the restricted unpickler), a Hugging Face directory from its
index, headers and ``config.json``, a DeepSpeed folder from its model states.
No tensor is read.
"""

from __future__ import annotations

import os

from bridge.sources.registry import opened
from jaxshare.stream import TensorSource, TieReport

__all__ = ["inspect"]


def inspect(path: str | os.PathLike | TensorSource, /) -> TieReport:
    """The tie report of the checkpoint, directory or weights file at ``path``: what
    ``jaxshare inspect PATH`` prints (``--json``: :meth:`TieReport.to_json`).

    Raises:
      UsageError: ``path`` is of no kind jaxshare reads.
      FileNotFoundError, ValueError: a missing or unreadable input (one line).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> save_file({"wte.weight": np.zeros((4, 2), np.float32)}, path)
    >>> report = inspect(path)
    >>> report.kind, report.bytes_stored, dict(report.alias_map)
    ('safetensors', 32, {})
    """
    from bridge.training.optax import training_report  # (A run file, DeepSpeed or DCP folder.)

    report = training_report(path)
    if report is not None:
        return report
    with opened(path, arg="path") as source:
        return source.report()
