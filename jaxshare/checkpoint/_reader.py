"""The Orbax item's reader: what ``bridge.open_source`` tries first.

A path is an Orbax checkpoint when it is an item directory, a ``CheckpointManager``
step holding one, or a manager root (which the opener refuses, naming its steps):
told from the names of the files in it and its folders, with no import of
TensorStore, which only reading the item needs. A PyTorch DCP folder is DCP's
whatever its subfolders hold, so no path is both readers'.
"""

from __future__ import annotations

from pathlib import Path

from jaxshare.formats import Reader, is_checkpoint, is_dcp_folder, later

__all__ = ["READER"]


def _accepts(path: Path) -> bool:
    return is_checkpoint(path) and not is_dcp_folder(path)


#: The reader of Orbax items (a jaxshare item, or a plain Orbax PyTree checkpoint).
READER = Reader(
    "orbax",
    "an Orbax checkpoint",
    _accepts,
    later("jaxshare.checkpoint._source", "open_source"),  # (TensorStore: only to read it.)
)
