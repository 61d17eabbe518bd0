"""``jaxshare inspect PATH``: the tie report of whatever ``PATH`` is.

Every input is opened as a :class:`jaxshare.TensorSource` (see ``_open``) and
described from its metadata: an Orbax item from its metadata and alias map, a
``.safetensors`` file from its header alone (checked against the file size; no
JAX, no torch), a PyTorch file or directory by ``bridge``.
"""

from __future__ import annotations

import os

from jaxshare import TieReport
from jaxshare.cli._open import open_input

__all__ = ["inspect"]


def inspect(path: str | os.PathLike) -> TieReport:
    """The tie report of the checkpoint, directory or weights file at ``path``.

    Raises:
      CLIError: ``path`` is of no kind jaxshare reads.
      FileNotFoundError, ValueError: a missing or unreadable input (one line).
    """
    with open_input(path) as source:
        return source.report()
