"""Orbax checkpoints that store each tied array once and restore the ties.

An item is an ordinary Orbax PyTree checkpoint of the unique tree plus the
alias map (``jaxshare_alias_map.json``), committed together. Use
:func:`save`/:func:`restore` for one item, or :class:`SharedSave` /
:class:`SharedRestore` with ``ocp.CheckpointManager``; :func:`consolidate` is
the ``zero_to_fp32`` of this world.
"""

from jaxshare.checkpoint._api import read_alias_map
from jaxshare.checkpoint._api import restore
from jaxshare.checkpoint._api import save
from jaxshare.checkpoint._api import write_item
from jaxshare.checkpoint._consolidate import consolidate
from jaxshare.checkpoint._consolidate import consolidate_to_safetensors
from jaxshare.checkpoint._handler import SharedCheckpointHandler
from jaxshare.checkpoint._handler import SharedRestore
from jaxshare.checkpoint._handler import SharedSave
from jaxshare.checkpoint._inspect import inspect
from jaxshare.checkpoint._source import CheckpointSource
from jaxshare.checkpoint._source import open_source

__all__ = [
    "CheckpointSource",
    "SharedCheckpointHandler",
    "SharedRestore",
    "SharedSave",
    "consolidate",
    "consolidate_to_safetensors",
    "inspect",
    "open_source",
    "read_alias_map",
    "restore",
    "save",
    "write_item",
]
