"""``save``, ``restore`` and ``read_alias_map``: one item, without a CheckpointManager."""

from __future__ import annotations

import glob
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxshare.checkpoint._handler import SharedCheckpointHandler, SharedRestore, SharedSave
from jaxshare.checkpoint._item import read_alias_map_file
from jaxshare.core.alias import AliasMap
from jaxshare.formats import find_item
from jaxshare.internal import ITEM
from jaxshare.io.atomic import atomic_output, remove_path

__all__ = ["read_alias_map", "restore", "save"]


def save(
    directory: str | os.PathLike,
    item: Any,
    /,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    assets: Mapping[str, str | os.PathLike | bytes] | None = None,
) -> None:
    """Saves ``item`` (a tree or a ``jaxshare.Tied``) with each tie stored once.

    The write is atomic: the item is written beside ``directory`` under a
    temporary name and renamed into place when everything, alias map included,
    is on disk; with ``force`` an existing item is replaced only then, so a
    failed save leaves it intact. In a multi-process job every process calls
    ``save``; they check that they found the same ties.

    Args:
      directory: the item directory to create.
      item: the tree to save. A ``Tied`` is saved as its unique tree and alias
        map; in any other tree, the ties are those of every ``Tied`` in it
        (e.g. a train state's params and optimizer moments) plus the leaves
        that are one array object (:func:`jaxshare.find_shared`).
      force: replace ``directory`` if it is a checkpoint item already (never a
        directory of other files).
      inputs: paths ``item`` was read from; ``directory`` may be none of them.
      assets: files to keep with the arrays, ``{file name: path or bytes}``
        (``config.json``, the tokenizer's files), copied byte for byte into the
        item's ``jaxshare_assets/``, where Orbax never looks; a Hugging Face
        directory written from the item gets them back.

    Raises:
      FileExistsError: ``directory`` exists and ``force`` is false.
      NotADirectoryError: a parent of ``directory`` is a file.
      ValueError: ``directory`` holds something that is not a checkpoint item, or
        is an input; the processes of a multi-process job found different ties;
        an asset name that is not a plain file name.

    >>> import tempfile, jax.numpy as jnp
    >>> emb = jnp.arange(6.0).reshape(3, 2)
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> save(path, {"wte": {"embedding": emb}, "head": {"kernel": emb}})
    >>> read_alias_map(path)
    AliasMap({'wte/embedding': 'head/kernel'})
    >>> restored = restore(path)
    >>> restored["wte"]["embedding"] is restored["head"]["kernel"]
    True
    """
    path = Path(directory).absolute()  # Orbax and TensorStore take absolute paths.
    processes = jax.process_count()
    primary = jax.process_index() == 0
    with atomic_output(
        path, ITEM, force=force, inputs=inputs, token=_shared_token(), commit=primary
    ) as tmp:
        try:
            with ocp.Checkpointer(SharedCheckpointHandler()) as checkpointer:
                checkpointer.save(tmp, args=SharedSave(item, dict(assets or {})))
        except BaseException:
            if primary:  # Orbax leaves its own temporary directory when a save fails.
                for stray in tmp.parent.glob(f"{glob.escape(tmp.name)}.orbax-checkpoint-tmp*"):
                    remove_path(stray)
            raise
    if processes > 1:  # Every process returns once the item is in place.
        multihost_utils.sync_global_devices(f"jaxshare.checkpoint.save:{path}")


def _shared_token() -> str | None:
    """In a multi-process job, the temporary name every process writes to (the
    primary's choice); ``None`` in a single process."""
    if jax.process_count() == 1:
        return None
    mine = np.frombuffer(f"{os.getpid():010d}{secrets.token_hex(3)}".encode(), np.uint8)
    agreed = np.asarray(multihost_utils.broadcast_one_to_all(mine)).astype(np.uint8).tobytes()
    return f"{int(agreed[:10])}-{agreed[10:].decode()}"


def restore(directory: str | os.PathLike, target: Any = None) -> Any:
    """Restores the tree saved at ``directory``, every tie the same array again.

    Args:
      directory: an item directory (as :func:`save` writes), or a
        ``CheckpointManager`` step directory holding one jaxshare item. A
        checkpoint written by plain Orbax restores too, with no ties.
      target: ``None``, a full tree of ``jax.ShapeDtypeStruct`` with shardings
        (e.g. from ``jax.eval_shape``), or a ``Tied``; see
        :class:`SharedRestore`.

    Returns:
      The full tree (a ``Tied`` for a ``Tied`` target), each alias the same
      ``jax.Array`` object as its canonical, or its transform.

    Raises:
      FileNotFoundError: no checkpoint at ``directory``.
      ValueError: the alias map file is invalid or does not fit the checkpoint,
        or ``target`` disagrees with the stored ties or shapes. Nothing is
        returned half-tied.
    """
    handler = SharedCheckpointHandler()
    try:
        return handler.restore(find_item(directory), SharedRestore(target))
    finally:
        handler.close()


def read_alias_map(directory: str | os.PathLike) -> AliasMap:
    """The alias map stored at ``directory``, read from its JSON file only.

    Empty for a checkpoint written by plain Orbax.

    Raises:
      FileNotFoundError: no checkpoint at ``directory``.
      ValueError: the file is not a valid alias map (message names the file).
    """
    return read_alias_map_file(find_item(directory))
