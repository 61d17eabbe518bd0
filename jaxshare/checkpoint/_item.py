"""What a stored item holds, read without reading its arrays.

:func:`open_item` reads the alias map file and Orbax's metadata of the unique
tree, and checks that the two agree -- every canonical is stored, no alias is,
every transform fits its canonical -- before anything is restored, so a
corrupt or hostile alias map fails with the item's path and never yields a
half-tied tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import metadata as ocp_metadata

from jaxshare._alias import MAX_JSON_BYTES, AliasMap
from jaxshare._naming import MAX_JSON_BYTES as MAX_NAMING_BYTES
from jaxshare._naming import NamingRecord
from jaxshare._paths import flatten_with_paths, render
from jaxshare._report import ArrayInfo
from jaxshare.checkpoint._empty import EmptyArray, parse_record
from jaxshare.formats import (
    ALIAS_MAP_FILE,
    EMPTY_ARRAYS_KEY,
    NAMING_FILE,
    ORBAX_METADATA_FILE,
)

__all__ = ["ItemDir", "StoredItem", "open_item", "read_alias_map_file", "sample"]

ItemDir: TypeAlias = Path | epath.Path

_FIX = (
    "Fix: restore this file from the checkpoint's source, or delete it to read the "
    "unique tree without ties."
)


@dataclass(frozen=True)
class StoredItem:
    """The contents of an item directory, arrays not read.

    Attributes:
      directory: the item directory.
      alias_map: the ties (empty for a checkpoint written by plain Orbax).
      stored: ``{path: ArrayInfo}`` of every stored array, zero-size ones
        included, sorted by path.
      empty: the zero-size arrays, which are not in the Orbax PyTree.
      other: paths of stored leaves that are not arrays (e.g. strings).
      metadata: Orbax's ``TreeMetadata`` of the stored tree.
    """

    directory: ItemDir
    alias_map: AliasMap
    stored: dict[str, ArrayInfo]
    empty: dict[str, EmptyArray]
    other: tuple[str, ...]
    metadata: Any


def _read_limited(path: Any, limit: int, what: str) -> bytes | None:
    """The bytes of ``path`` (``None`` if absent), refusing files over ``limit``."""
    if not path.exists():
        return None
    with path.open("rb") as f:
        data = f.read(limit + 1)  # Never more, whatever the file holds.
    if len(data) > limit:
        raise ValueError(
            f"{path}: over the limit of {limit} bytes for {what}. It is not a file jaxshare "
            "wrote; replace it with the item's real one."
        )
    return data


def read_alias_map_file(item_dir: ItemDir) -> AliasMap:
    """The alias map of one item directory, with its naming record if it has one;
    empty if it has no alias map file.

    Raises:
      ValueError: a file is oversized or not valid; the message starts with the
        file's path.
    """
    path = item_dir / ALIAS_MAP_FILE
    data = _read_limited(path, MAX_JSON_BYTES, "an alias map")
    try:
        amap = AliasMap() if data is None else AliasMap.from_json(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e} {_FIX}") from None
    naming_path = item_dir / NAMING_FILE
    data = _read_limited(naming_path, MAX_NAMING_BYTES, "a naming record")
    if data is None:
        return amap
    try:
        return amap.with_naming(NamingRecord.from_json(data))
    except ValueError as e:
        raise ValueError(f"{naming_path}: {e} {_FIX}") from None


def open_item(
    item_dir: ItemDir, /, *, handler: ocp.StandardCheckpointHandler | None = None
) -> StoredItem:
    """Reads and checks what the item directory ``item_dir`` holds.

    ``item_dir`` is a ``pathlib.Path`` (see :func:`find_item`) or, inside Orbax's
    handler protocol, an ``etils.epath.Path``.

    Raises:
      FileNotFoundError: no Orbax checkpoint in ``item_dir``.
      ValueError: the alias map is invalid or does not fit the stored tree; every
        problem is listed, under the alias map file's path.
    """
    alias_map = read_alias_map_file(item_dir)
    if not (item_dir / ORBAX_METADATA_FILE).exists():
        raise FileNotFoundError(
            f"{item_dir}: no Orbax checkpoint ({ORBAX_METADATA_FILE} is missing): the "
            "save did not finish, or files were removed. Restore from another step."
        )
    reader = handler or ocp.StandardCheckpointHandler()
    try:
        meta = reader.metadata(item_dir)
    finally:
        if handler is None:
            reader.close()
    stored: dict[str, ArrayInfo] = {}
    other: list[str] = []
    empty: dict[str, EmptyArray] = {}
    for path, leaf in flatten_with_paths(meta.tree):
        if isinstance(leaf, ocp_metadata.ArrayMetadata):
            stored[render(path)] = ArrayInfo(tuple(leaf.shape), np.dtype(leaf.dtype).name)
        else:
            other.append(render(path))
    custom = meta.custom_metadata or {}
    if EMPTY_ARRAYS_KEY in custom:
        empty = parse_record(custom[EMPTY_ARRAYS_KEY], str(item_dir / ORBAX_METADATA_FILE))
    stored.update((p, e.info) for p, e in empty.items())
    item = StoredItem(item_dir, alias_map, dict(sorted(stored.items())), empty, tuple(other), meta)
    _check_fits(item)
    return item


def _check_fits(item: StoredItem) -> None:
    amap = item.alias_map
    if not amap:
        return
    stored = set(item.stored) | set(item.other)
    parents = {p[:i] for p in stored for i in range(len(p)) if p[i] == "/"}
    problems = []
    for alias, canonical in amap.items():
        if alias in stored or alias in parents:
            problems.append(f"alias {alias!r} is also stored in the checkpoint")
        info = item.stored.get(canonical)
        if info is None:
            problems.append(
                f"alias {alias!r}: its canonical {canonical!r} is not an array the "
                "checkpoint stores"
            )
        elif (perm := amap.transform(alias)) is not None and len(perm) != len(info.shape):
            problems.append(
                f"alias {alias!r}: transform {list(perm)} permutes {len(perm)} axes, but "
                f"its canonical {canonical!r} has shape {info.shape}"
            )
    if problems:
        raise ValueError(
            f"{item.directory / ALIAS_MAP_FILE}: the alias map does not fit the checkpoint "
            f"in {item.directory}:\n  " + "\n  ".join(problems) + f"\n{_FIX}"
        )


def sample(paths: Any, n: int = 5) -> str:
    """A short listing of ``paths`` for error messages."""
    paths = sorted(paths)
    more = f", ... ({len(paths)} in all)" if len(paths) > n else ""
    return ", ".join(map(repr, paths[:n])) + more
