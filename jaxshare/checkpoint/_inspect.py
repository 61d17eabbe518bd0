"""``inspect``: what ``jaxshare inspect DIR`` shows of an Orbax item."""

from __future__ import annotations

import os

from jaxshare.checkpoint._item import open_item
from jaxshare.core.report import TieReport
from jaxshare.formats import ALIAS_MAP_FILE, find_item, item_assets

__all__ = ["inspect"]


def inspect(directory: str | os.PathLike) -> TieReport:
    """The tie groups, shapes, dtypes and byte counts of the checkpoint at ``directory``.

    Reads metadata and the alias map only, never the arrays.

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxshare import checkpoint
    >>> emb = jnp.ones((4, 2))
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(path, {"wte": emb, "head": emb})
    >>> report = inspect(path)
    >>> report.alias_map, report.bytes_stored, report.bytes_saved
    (AliasMap({'wte': 'head'}), 32, 32)
    """
    item = open_item(find_item(directory))
    origins = dict.fromkeys(item.alias_map, ALIAS_MAP_FILE)
    assets = tuple(item_assets(item.directory))
    return TieReport(
        str(item.directory), "orbax", item.stored, item.alias_map, origins=origins, assets=assets
    )
