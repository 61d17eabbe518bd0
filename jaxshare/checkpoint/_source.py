"""An Orbax item as a :class:`jaxshare.stream.TensorSource`: Flax paths, read leaf by leaf.

Conversions out of a checkpoint (to safetensors, PyTorch files, Hugging Face
directories) plan from the item's metadata and alias map (with its naming
record), then read one array -- or one slice of it, through TensorStore, which
reads only the chunks the slice covers -- at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.checkpoint._item import StoredItem, open_item, sample
from jaxshare.checkpoint._read import LeafReader
from jaxshare.core.dtype import float_dtype
from jaxshare.core.manifest import Manifest
from jaxshare.core.strict_json import loads, reading
from jaxshare.formats import ALIAS_MAP_FILE, CONFIG_FILE, MANIFEST_FILE, find_item, item_assets
from jaxshare.io.source import Index, TensorSource

__all__ = ["CheckpointSource", "open_source"]


class CheckpointSource(TensorSource):
    """The arrays of one Orbax item, by Flax path; floating ones cast to ``dtype``.

    Attributes:
      item: what the item holds (metadata, alias map, zero-size arrays).
      assets: the files kept with the arrays (see ``jaxshare.formats.item_assets``).
      config: the ``config.json`` asset as a dict, ``None`` when the item has none.
    """

    kind = "orbax"
    flax_named = True  # (A tree of one leaf has no '/' in its path, and is still Flax.)

    def __init__(self, item: StoredItem, *, dtype: Any = None) -> None:
        if item.other:
            raise ValueError(
                f"{item.directory} stores leaves that are not arrays at {sample(item.other)}; "
                "only arrays can be read one by one. Restore it with "
                "`jaxshare.checkpoint.restore` instead."
            )
        self.item = item
        self.path = item.directory
        cast = float_dtype(dtype)
        self._reader = LeafReader(item, dtype=cast)
        self.infos = {
            p: info if cast is None else type(info)(info.shape, _cast_name(info.dtype, cast))
            for p, info in item.stored.items()
        }
        self.ties = item.alias_map
        self.origins = dict.fromkeys(self.ties, ALIAS_MAP_FILE)
        self.assets = item_assets(item.directory)
        self.config = _config(self.assets.get(CONFIG_FILE))

    def manifest(self) -> Manifest | None:
        """The item's ``jaxshare_manifest.json`` (``convert --manifest``), if any."""
        file = self.item.directory / MANIFEST_FILE
        if not file.is_file():
            return None
        with reading(file):
            return Manifest.from_json(file.read_bytes())

    def read(self, name: str) -> np.ndarray:
        return self._reader.read(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return self._reader.read_slice(name, index)

    def permuted_slice(self, name: str, index: Index, perm: Any) -> np.ndarray | None:
        return self._reader.read_slice_permuted(name, index, perm)

    def chunk_shape(self, name: str) -> tuple[int, ...] | None:
        return self._reader.chunk_shape(name)

    def permuted_array(self, name: str, perm: Any) -> np.ndarray | None:
        return self._reader.read_permuted(name, perm)

    def array_in_rows(self, name: str) -> tuple[np.ndarray, Iterator[np.ndarray]] | None:
        return self._reader.read_in_rows(name)

    def permutes_as_read(self, name: str) -> bool:
        return self._reader.direct(name) is not None

    def permuted_blocks(self, name: str, perm: Any) -> Any:
        return self._reader.blocks(name, perm)

    def close(self) -> None:
        self._reader.close()

    def blocks(self, name: str, perm: Any = None) -> Any:
        """The array at ``name`` (transposed by ``perm``) in C order, as blocks of
        whole leading-axis slices (see ``LeafReader.blocks``)."""
        return self._reader.blocks(name, perm)


def _config(path: Path | None) -> dict | None:
    """A ``config.json`` asset as a dict (strict JSON, an object)."""
    if path is None:
        return None
    config = loads(path.read_bytes(), what=str(path))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a config is a JSON object, got a {type(config).__name__}.")
    return config


def _cast_name(dtype: str, cast: np.dtype) -> str:
    from jaxshare.core.dtype import cast_to, numpy_dtype

    return cast_to(numpy_dtype(dtype), cast).name


def open_source(directory: str | os.PathLike, *, dtype: Any = None) -> CheckpointSource:
    """Opens the item at ``directory`` (an item or a step directory) to read it
    leaf by leaf.

    Raises:
      FileNotFoundError: no checkpoint at ``directory``.
      ValueError: an invalid alias map; leaves that are not arrays; a bad ``dtype``.

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxshare import checkpoint
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> emb = jnp.arange(6.0).reshape(3, 2)
    >>> checkpoint.save(path, {"wte": emb, "head": emb})
    >>> with open_source(path) as source:
    ...     dict(source.ties), source.read_slice("head", (slice(1, 2), slice(None))).tolist()
    ({'wte': 'head'}, [[2.0, 3.0]])
    """
    return CheckpointSource(open_item(find_item(directory)), dtype=dtype)
