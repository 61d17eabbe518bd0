"""Orbax checkpoints that store each tied array once and restore the ties.

An item is an ordinary Orbax PyTree checkpoint of the unique tree plus the
alias map (``jaxshare_alias_map.json``), committed together. Use
:func:`save`/:func:`restore` for one item, or :class:`SharedSave` /
:class:`SharedRestore` with ``ocp.CheckpointManager``; :func:`consolidate` is
the ``zero_to_fp32`` of this world. Names are imported on first use, so
``from jaxshare import checkpoint`` imports Orbax only when a name is used.
"""

import typing as _typing

from jaxshare._lazy import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare.checkpoint._api import read_alias_map as read_alias_map
    from jaxshare.checkpoint._api import restore as restore
    from jaxshare.checkpoint._api import save as save
    from jaxshare.checkpoint._consolidate import consolidate as consolidate
    from jaxshare.checkpoint._consolidate import (
        consolidate_to_safetensors as consolidate_to_safetensors,
    )
    from jaxshare.checkpoint._handler import SharedCheckpointHandler as SharedCheckpointHandler
    from jaxshare.checkpoint._handler import SharedRestore as SharedRestore
    from jaxshare.checkpoint._handler import SharedSave as SharedSave
    from jaxshare.checkpoint._inspect import inspect as inspect
    from jaxshare.checkpoint._source import CheckpointSource as CheckpointSource
    from jaxshare.checkpoint._source import open_source as open_source
    from jaxshare.checkpoint._tree import TreeSource as TreeSource
    from jaxshare.checkpoint._stream import write_item as write_item
    from jaxshare.checkpoint._reader import READER as READER

__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "jaxshare.checkpoint._reader": ["READER"],
        "jaxshare.checkpoint._api": ["read_alias_map", "restore", "save"],
        "jaxshare.checkpoint._consolidate": ["consolidate", "consolidate_to_safetensors"],
        "jaxshare.checkpoint._handler": ["SharedCheckpointHandler", "SharedRestore", "SharedSave"],
        "jaxshare.checkpoint._inspect": ["inspect"],
        "jaxshare.checkpoint._source": ["CheckpointSource", "open_source"],
        "jaxshare.checkpoint._tree": ["TreeSource"],
        "jaxshare.checkpoint._stream": ["write_item"],
    },
)
