"""``SharedCheckpointHandler``: an Orbax handler that stores each tie once.

It pairs with :class:`SharedSave` and :class:`SharedRestore` the way Orbax's
own handlers pair with their args, so ``ocp.CheckpointManager`` (directly or
inside ``ocp.args.Composite``), async checkpointing and ``max_to_keep`` work
unchanged. See :mod:`jaxshare.formats` for what an item holds.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from jaxshare.checkpoint._agree import check_same_on_all_processes
from jaxshare.checkpoint._empty import split_empty
from jaxshare.checkpoint._item import open_item
from jaxshare.checkpoint._nested import expand
from jaxshare.checkpoint._restore import restore_item
from jaxshare.checkpoint._stream import CHUNK_BYTES, HANDLER_TYPESTR, alias_files
from jaxshare.core.alias import AliasMap
from jaxshare.core.tie import dedupe
from jaxshare.core.tied import Tied
from jaxshare.formats import EMPTY_ARRAYS_KEY
from jaxshare.internal import asset_files
from jaxshare.io.atomic import destination_of

__all__ = ["SharedCheckpointHandler", "SharedRestore", "SharedSave"]


class SharedCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Saves a tree (or a ``Tied``) as its unique tree plus its alias map.

    The unique tree is an ordinary Orbax PyTree checkpoint, so plain
    ``ocp.StandardCheckpointer().restore(item_dir)`` reads it; the alias map is
    ``jaxshare_alias_map.json`` in the same directory, written during the save
    so that Orbax commits both at once. Like every handler, use it through a
    ``Checkpointer`` or ``CheckpointManager``, which make the save atomic.

    Args:
      multiprocessing_options: as for Orbax's handlers (default: Orbax's
        defaults). Every process must take part in a save, since the processes
        check that they found the same alias map: ``active_processes`` is not
        supported.

    >>> import tempfile, jax.numpy as jnp, orbax.checkpoint as ocp
    >>> emb = jnp.ones((4, 2))
    >>> with ocp.CheckpointManager(tempfile.mkdtemp()) as mngr:
    ...     _ = mngr.save(0, args=SharedSave({"wte": emb, "head": emb}))
    ...     mngr.wait_until_finished()
    ...     restored = mngr.restore(0, args=SharedRestore())
    >>> restored["head"] is restored["wte"]
    True
    """

    def __init__(
        self,
        *,
        multiprocessing_options: ocp.options.MultiprocessingOptions | None = None,
    ) -> None:
        multiprocessing_options = multiprocessing_options or ocp.options.MultiprocessingOptions()
        if multiprocessing_options.active_processes is not None:
            raise ValueError(
                "SharedCheckpointHandler needs every process in a save, to check that "
                "they agree on the alias map; `active_processes` is not supported."
            )
        self._primary_host = multiprocessing_options.primary_host
        self._multiprocessing_options = multiprocessing_options
        self._standard = ocp.StandardCheckpointHandler(
            multiprocessing_options=multiprocessing_options
        )

    @classmethod
    def typestr(cls) -> str:
        # Recorded in checkpoint metadata: stable, whichever module defines the class.
        return HANDLER_TYPESTR

    async def async_save(
        self, directory: epath.Path, args: SharedSave
    ) -> list[ocp.future.Future] | None:
        """Starts saving ``args.item``; the returned futures finish the commit."""
        writer, orbax_args, files = self._prepare(directory, args)
        futures = list(await writer.async_save(directory, args=orbax_args) or [])
        futures.append(
            ocp.future.CommitFutureAwaitingContractedSignals(
                self._write_alias_map(directory, files), name="jaxshare_alias_map"
            )
        )
        return futures

    def save(self, directory: epath.Path, args: SharedSave) -> None:
        """Saves synchronously into an existing (temporary) directory."""
        writer, orbax_args, files = self._prepare(directory, args)
        writer.save(directory, args=orbax_args)
        if ocp.multihost.is_primary_host(self._primary_host):
            write_alias_map(directory, files)

    def _prepare(
        self, directory: epath.Path, args: SharedSave
    ) -> tuple[Any, ocp.args.CheckpointArgs, dict[str, str | bytes]]:
        """The Orbax handler that writes the unique tree, its args, and jaxshare's
        files: the JSON files of the ties, and the assets."""
        if not isinstance(args, SharedSave):
            raise TypeError(
                f"SharedCheckpointHandler saves `SharedSave(item)`, got {type(args).__name__}."
            )
        where = _final_path(directory)
        unique, alias_map = _split(args.item)
        stored, empty = split_empty(unique)
        check_same_on_all_processes(alias_map, where=where)
        if not jax.tree_util.tree_leaves(stored):
            raise ValueError(
                f"{where}: `item` holds no non-empty array or scalar to store (Orbax "
                "cannot write an empty item); save a tree with at least one."
            )
        custom = {EMPTY_ARRAYS_KEY: {p: e.to_json() for p, e in empty.items()}} if empty else None
        # Chunked storage lets `consolidate` read a large array a block at a time.
        chunked = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), stored)
        orbax_args = ocp.args.StandardSave(stored, save_args=chunked, custom_metadata=custom)
        files = {**alias_files(alias_map), **asset_files(args.assets)}
        return self._standard, orbax_args, files

    async def _write_alias_map(self, directory: epath.Path, files: dict[str, str | bytes]) -> None:
        # A commit future: runs once Orbax has created `directory` (the temporary one).
        if ocp.multihost.is_primary_host(self._primary_host):
            write_alias_map(directory, files)

    def restore(self, directory: epath.Path, args: SharedRestore | None = None) -> Any:
        """Restores the full tree, ties as identity; see :class:`SharedRestore`."""
        if args is not None and not isinstance(args, SharedRestore):
            raise TypeError(
                f"SharedCheckpointHandler restores with `SharedRestore(target)`, got "
                f"{type(args).__name__}."
            )
        target = None if args is None else args.target
        item = open_item(directory, handler=self._standard)
        return restore_item(
            item,
            target,
            lambda unique_target: self._standard.restore(
                item.directory, args=ocp.args.StandardRestore(unique_target)
            ),
        )

    def metadata(self, directory: epath.Path) -> Any:
        """Orbax's metadata of the stored (unique) tree; the ties are in
        :func:`jaxshare.checkpoint.read_alias_map`."""
        return self._standard.metadata(directory)

    def finalize(self, directory: epath.Path) -> None:
        self._standard.finalize(directory)

    def close(self) -> None:
        self._standard.close()


def write_alias_map(directory: epath.Path, files: dict[str, str | bytes]) -> None:
    """Writes the alias map file, the naming record and the assets (a function of
    its own so a test can stall it)."""
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def _final_path(directory: epath.Path) -> str:
    """``directory`` as users named it: without Orbax's or jaxshare's temporary names."""
    return destination_of(re.sub(r"\.orbax-checkpoint-tmp[^/]*", "", str(directory)))


def _split(item: Any) -> tuple[Any, AliasMap]:
    """The unique tree to store and its alias map: the ties of every ``Tied`` in
    ``item`` plus any leaf that is the same array object as another."""
    if isinstance(item, Tied):
        return item.unique, item.alias_map
    full, declared = expand(item)
    unique, alias_map = dedupe(full, declared)
    unique, found = dedupe(unique)
    if not found:
        return unique, alias_map
    return unique, AliasMap(
        {**alias_map, **found},
        transforms=alias_map.transforms,
        naming=alias_map.naming,
        implicit=alias_map.implicit,
    )


@ocp.args.register_with_handler(SharedCheckpointHandler, for_save=True)
@dataclasses.dataclass
class SharedSave(ocp.args.CheckpointArgs):
    """Saves ``item``, a tree or a ``jaxshare.Tied``, each tie stored once.

    A ``Tied`` is stored as its unique tree and alias map. In a tree, the ties
    are those of every ``Tied`` node in it (e.g. the params and optimizer
    moments of a train state), under the node's path, plus every leaf that is
    the same array object as another (:func:`jaxshare.find_shared`).

    Attributes:
      item: the tree or ``Tied`` to save.
      assets: files to keep with it, ``{file name: path or bytes}`` (a model
        directory's ``config.json`` and tokenizer files), copied byte for byte
        into the item's ``jaxshare_assets/``.
    """

    item: Any
    assets: Mapping[str, str | os.PathLike | bytes] = dataclasses.field(default_factory=dict)


@ocp.args.register_with_handler(SharedCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class SharedRestore(ocp.args.CheckpointArgs):
    """Restores the full tree, every alias the same array as its canonical.

    Attributes:
      target: ``None`` restores the tree as saved (arrays on the devices they
        were saved from). A full tree of ``jax.ShapeDtypeStruct`` (or arrays),
        e.g. ``jax.eval_shape`` of the model's init with shardings, restores
        into that structure, each array sharded as its leaf asks (a mesh other
        than the one saved from is fine); its aliased paths must agree with the
        stored alias map. A ``Tied`` (e.g. ``jax.eval_shape`` of a function that
        returns one) restores a ``Tied`` and must carry the stored alias map.
    """

    target: Any = None
