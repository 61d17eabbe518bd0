"""``consolidate``: the ``zero_to_fp32`` of jaxshare -- a flat dict of every path.

Arrays are read one at a time (see :mod:`._read`), so besides the result
memory holds nothing of the model; the streaming variant writes a
``.safetensors`` file one array at a time, reading the next while it writes
one, and never holds more than about two arrays.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxshare.checkpoint._item import StoredItem, open_item, sample
from jaxshare.checkpoint._read import LeafReader
from jaxshare.checkpoint._source import CheckpointSource
from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import float_dtype
from jaxshare.core.perm import Perm
from jaxshare.core.progress import ProgressFn
from jaxshare.formats import ALIAS_MAP_KEY, find_item
from jaxshare.internal import write_plan
from jaxshare.io.plan import Plan, PlanEntry

__all__ = ["consolidate", "consolidate_to_safetensors"]


def consolidate(directory: str | os.PathLike, *, dtype: Any = None) -> dict[str, np.ndarray]:
    """Every path of the checkpoint at ``directory``, aliases included, as numpy arrays.

    An implicit alias (one the model computes, :attr:`jaxshare.AliasMap.implicit`:
    a transformers-flax GPT-2's ``lm_head/kernel``) is no path of the tree, and is
    left out: the result has exactly the model's own paths.

    Arrays are read one by one, each straight into its result array, so peak
    memory is the result plus a few storage chunks.
    An alias is its canonical's very array (or a transposed view of it): copy
    before mutating one in place.

    Args:
      directory: an item directory, or a ``CheckpointManager`` step directory
        holding one jaxshare item.
      dtype: cast floating arrays (``bfloat16`` included) to this floating
        dtype, e.g. ``"float32"``; other arrays keep theirs.

    Returns:
      ``{path: array}`` with ``'/'``-joined paths, sorted.

    Raises:
      ValueError: invalid ``dtype``; the alias map does not fit the checkpoint;
        the checkpoint stores leaves that are not arrays.

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxshare import checkpoint
    >>> emb = jnp.ones((3, 2), jnp.bfloat16)
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(path, {"wte": emb, "head": emb})
    >>> flat = consolidate(path, dtype="float32")
    >>> {k: (v.shape, v.dtype.name) for k, v in flat.items()}
    {'head': ((3, 2), 'float32'), 'wte': ((3, 2), 'float32')}
    """
    cast = float_dtype(dtype)
    item = _open_arrays(directory)
    reader = LeafReader(item, dtype=cast)
    out = {path: reader.read(path) for path in item.stored}
    amap = item.alias_map.explicit()
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        out[alias] = out[canonical] if perm is None else np.transpose(out[canonical], perm)
    return dict(sorted(out.items()))


def consolidate_to_safetensors(
    directory: str | os.PathLike,
    path: str | os.PathLike,
    *,
    dtype: Any = None,
    force: bool = False,
    progress: ProgressFn | None = None,
    manifest: bool = False,
) -> None:
    """Writes every path of the checkpoint to a ``.safetensors`` file, streaming.

    Tensors are named by Flax ``'/'`` paths. Each alias is written as a tensor
    of its own (right after its canonical, from the same read, transposed where
    it has a transform), so any safetensors reader gets the full flat dict -- but an
    implicit alias, which the model computes (as :func:`consolidate` leaves it
    out); the alias map is also in the file's metadata under
    ``"jaxshare.alias_map"`` (the JSON of :meth:`jaxshare.AliasMap.to_json`),
    implicit aliases included. Each array is read whole (its
    storage chunks decoded in parallel) while the one before is written, so
    memory holds about two arrays, however large the model. The file appears
    only once complete.

    Args:
      directory: an item directory, or a step directory with one jaxshare item.
      path: the ``.safetensors`` file to write.
      dtype: cast floating arrays to this floating dtype, e.g. ``"float32"``.
      force: replace ``path`` if it exists.
      progress: called as ``progress(done, total, name, nbytes)`` after each tensor.
      manifest: record every tensor's hash, as written, in the metadata
        (``"jaxshare.manifest"``).

    Raises:
      FileExistsError: ``path`` exists and ``force`` is false.
      ValueError: as for :func:`consolidate`, or a dtype safetensors cannot store.

    >>> import tempfile, jax.numpy as jnp
    >>> from safetensors.numpy import load_file
    >>> from jaxshare import checkpoint
    >>> emb = jnp.ones((3, 2))
    >>> ckpt = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(ckpt, {"wte": {"embedding": emb}, "head": {"kernel": emb}})
    >>> consolidate_to_safetensors(ckpt, ckpt + ".safetensors")
    >>> sorted(load_file(ckpt + ".safetensors"))
    ['head/kernel', 'wte/embedding']
    """
    item = _open_arrays(directory)
    source = CheckpointSource(item, dtype=float_dtype(dtype))
    amap = item.alias_map
    written = amap.explicit()  # (An implicit alias is no tensor of the tree.)
    entries = []
    names = sorted([*item.stored, *written])
    # Each canonical with its aliases in a row (at its first name's place): the
    # plan reads it once for all of them, the untransposed first (written as it is
    # read, while the rest is decoded).
    first: dict[str, int] = {}
    for name in names:
        first.setdefault(_source(amap, name)[0], len(first))
    for name in sorted(
        names, key=lambda n: (first[_source(amap, n)[0]], _source(amap, n)[1] is not None)
    ):
        canonical, perm = _source(amap, name)
        entries.append(PlanEntry(name, canonical, perm, source.infos[canonical].permuted(perm)))
    # Aliases are entries of their own (written out), so the plan itself has no ties.
    plan = Plan(tuple(entries), AliasMap())
    metadata = {ALIAS_MAP_KEY: amap.to_json()}
    write_plan(
        path,
        plan,
        source,
        metadata,
        force=force,
        inputs=[item.directory],
        progress=progress,
        manifest=manifest,
    )


def _source(amap: AliasMap, name: str) -> tuple[str, Perm | None]:
    """Where the tensor ``name`` is read from: its canonical and transform."""
    return (amap[name], amap.transform(name)) if name in amap else (name, None)


def _open_arrays(directory: str | os.PathLike) -> StoredItem:
    item = open_item(find_item(directory))
    if item.other:
        raise ValueError(
            f"{item.directory} stores leaves that are not arrays at {sample(item.other)}; "
            "consolidation writes arrays only. Restore it with "
            "`jaxshare.checkpoint.restore` instead."
        )
    return item
