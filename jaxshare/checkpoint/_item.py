"""What a stored item holds, read without reading its arrays.

:func:`open_item` reads the alias map file and the metadata of the unique tree,
and checks that the two agree -- every canonical is stored, no alias is, every
transform fits its canonical -- before anything is restored, so a corrupt or
hostile alias map fails with the item's path and never yields a half-tied tree.

Outside Orbax's handler protocol, the tree's metadata is read as Orbax itself
reads it, without importing Orbax or JAX (a second of start-up each): the
``_METADATA`` file gives the leaves, their Orbax names and value types, and
each array's shape and dtype come from its TensorStore metadata, every array
opened at once from the spec :func:`array_spec` builds, the one Orbax's
``get_json_tspec_read`` builds for a local directory (the tests hold both to
Orbax's own). Inside the protocol (a handler given) Orbax's handler reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from jaxshare.checkpoint._chunks import Chunking, ChunkStore
from jaxshare.checkpoint._empty import EmptyArray, parse_record
from jaxshare.core.alias import MAX_JSON_BYTES, AliasMap
from jaxshare.core.naming import MAX_JSON_BYTES as MAX_NAMING_BYTES
from jaxshare.core.naming import NamingRecord
from jaxshare.core.paths import flatten_with_paths, render
from jaxshare.core.report import ArrayInfo
from jaxshare.core.strict_json import loads, reading
from jaxshare.formats import (
    ALIAS_MAP_FILE,
    EMPTY_ARRAYS_KEY,
    NAMING_FILE,
    ORBAX_METADATA_FILE,
)

if TYPE_CHECKING:
    import orbax.checkpoint as ocp
    import tensorstore as ts
    from etils import epath

__all__ = [
    "ItemDir",
    "StoredItem",
    "array_spec",
    "is_ocdbt",
    "open_item",
    "read_alias_map_file",
    "read_context",
    "sample",
]

ItemDir: TypeAlias = "Path | epath.Path"

#: The largest ``_METADATA`` file read (Orbax's metadata of a large tree is a few MB).
MAX_METADATA_BYTES = 256 * 2**20
#: The value types Orbax stores as TensorStore arrays.
_ARRAY_TYPES = frozenset({"jax.Array", "np.ndarray", "scalar"})
#: The value types of empty nodes (no leaf in the flattened tree).
_EMPTY_TYPES = frozenset({"None", "Dict", "List", "Tuple", "NamedTuple"})
# Orbax's context caches OCDBT B-tree nodes up to 100 MB; reading each array
# once needs little of that, and a long read would keep it all resident.
_OCDBT_CONTEXT = {"cache_pool#ocdbt": {"total_bytes_limit": 8 * 2**20}}

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
      names: ``{path: Orbax's name}`` of every stored array but the empty ones:
        the key of its TensorStore array (:func:`array_spec`).
      use_zarr3: whether the arrays are zarr v3 (else v2).
    """

    directory: ItemDir
    alias_map: AliasMap
    stored: dict[str, ArrayInfo]
    empty: dict[str, EmptyArray]
    other: tuple[str, ...]
    names: dict[str, str]
    use_zarr3: bool


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
    with reading(path, _FIX):
        amap = AliasMap() if data is None else AliasMap.from_json(data)
    naming_path = item_dir / NAMING_FILE
    data = _read_limited(naming_path, MAX_NAMING_BYTES, "a naming record")
    if data is None:
        return amap
    with reading(naming_path, _FIX):
        return amap.with_naming(NamingRecord.from_json(data))


def open_item(
    item_dir: ItemDir, /, *, handler: ocp.StandardCheckpointHandler | None = None
) -> StoredItem:
    """Reads and checks what the item directory ``item_dir`` holds.

    ``item_dir`` is a ``pathlib.Path`` (see :func:`find_item`), read without Orbax,
    or, inside Orbax's handler protocol, an ``etils.epath.Path`` that ``handler``
    reads.

    Raises:
      FileNotFoundError: no Orbax checkpoint in ``item_dir``.
      ValueError: the metadata is unreadable, or the alias map is invalid or does
        not fit the stored tree; every problem is listed, under the file's path.
    """
    alias_map = read_alias_map_file(item_dir)
    if not (item_dir / ORBAX_METADATA_FILE).exists():
        raise FileNotFoundError(
            f"{item_dir}: no Orbax checkpoint ({ORBAX_METADATA_FILE} is missing): the "
            "save did not finish, or files were removed. Restore from another step."
        )
    if handler is None:
        stored, other, names, use_zarr3, custom = _read_metadata(Path(item_dir))
    else:
        stored, other, names, use_zarr3, custom = _orbax_metadata(item_dir, handler)
    empty: dict[str, EmptyArray] = {}
    if EMPTY_ARRAYS_KEY in custom:
        empty = parse_record(custom[EMPTY_ARRAYS_KEY], str(item_dir / ORBAX_METADATA_FILE))
    stored.update((p, e.info) for p, e in empty.items())
    item = StoredItem(
        item_dir,
        alias_map,
        dict(sorted(stored.items())),
        empty,
        tuple(other),
        names,
        use_zarr3,
    )
    _check_fits(item)
    return item


_Metadata: TypeAlias = tuple[dict[str, ArrayInfo], list[str], dict[str, str], bool, dict]


def _orbax_metadata(item_dir: ItemDir, handler: ocp.StandardCheckpointHandler) -> _Metadata:
    """The stored tree's metadata as Orbax's ``handler`` reads it."""
    from orbax.checkpoint import metadata as ocp_metadata

    meta = handler.metadata(item_dir)
    stored: dict[str, ArrayInfo] = {}
    other: list[str] = []
    names: dict[str, str] = {}
    for path, leaf in flatten_with_paths(meta.tree):
        if isinstance(leaf, ocp_metadata.ArrayMetadata):
            stored[render(path)] = ArrayInfo(tuple(leaf.shape), np.dtype(leaf.dtype).name)
            names[render(path)] = leaf.name
        else:
            other.append(render(path))
    return stored, other, names, bool(meta.use_zarr3), dict(meta.custom_metadata or {})


def _read_metadata(item_dir: Path) -> _Metadata:
    """The stored tree's metadata, read without Orbax: the leaves from
    ``_METADATA``, each array's shape and dtype from its TensorStore metadata."""
    import tensorstore as ts

    file = item_dir / ORBAX_METADATA_FILE
    data = _read_limited(file, MAX_METADATA_BYTES, "Orbax's metadata")
    with reading(file):
        doc = loads(data or b"", what="Orbax's metadata")
    try:
        leaves = [
            (
                tuple(str(k["key"]) for k in entry["key_metadata"]),
                str(entry["value_metadata"]["value_type"]),
            )
            for entry in doc["tree_metadata"].values()
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{file}: expected Orbax's tree metadata (an object with 'tree_metadata', each "
            f"leaf with 'key_metadata' and 'value_metadata'); found no {e} where expected."
        ) from None
    use_zarr3 = bool(doc.get("use_zarr3", False))
    use_ocdbt = is_ocdbt(item_dir)
    context = read_context(use_ocdbt)
    names: dict[str, str] = {}
    other: list[str] = []
    for keys, kind in leaves:
        path = render(keys)
        if kind in _ARRAY_TYPES:
            names[path] = ".".join(keys)
        elif kind not in _EMPTY_TYPES:
            other.append(path)
    stored: dict[str, ArrayInfo] = {}
    # Each array's zarr metadata read from the item's index where it is one read here;
    # TensorStore opens the others.
    chunks = ChunkStore(item_dir, use_ocdbt=use_ocdbt)
    for path, name in names.items():
        meta = chunks.read_json(f"{name}/zarr.json" if use_zarr3 else f"{name}/.zarray")
        chunking = None if meta is None else Chunking.of(name, meta)
        if chunking is not None:
            stored[path] = ArrayInfo(chunking.shape, chunking.dtype.name)
    opening = {
        path: ts.open(array_spec(item_dir, name, use_zarr3, use_ocdbt), open=True, context=context)
        for path, name in names.items()
        if path not in stored
    }
    for path, future in opening.items():
        try:
            store = future.result()
        except ValueError as e:
            raise ValueError(
                f"{item_dir}: the array {path!r} ({names[path]!r} in {ORBAX_METADATA_FILE}) "
                f"cannot be opened: {e}"
            ) from None
        stored[path] = ArrayInfo(tuple(store.shape), np.dtype(store.dtype.numpy_dtype).name)
    stored = {path: stored[path] for path in names}  # (In the tree's order.)
    return stored, other, names, use_zarr3, dict(doc.get("custom_metadata") or {})


def is_ocdbt(item_dir: ItemDir) -> bool:
    """Whether the item stores its arrays in OCDBT (Orbax's default): its manifest
    is there (Orbax's ``is_ocdbt_checkpoint``)."""
    return (item_dir / "manifest.ocdbt").exists()


def read_context(use_ocdbt: bool) -> ts.Context:
    """The TensorStore context the specs of :func:`array_spec` are opened in (OCDBT's
    B-tree cache kept small)."""
    import tensorstore as ts

    return ts.Context(_OCDBT_CONTEXT if use_ocdbt else {})


def array_spec(
    item_dir: str | os.PathLike, name: str, use_zarr3: bool, use_ocdbt: bool
) -> dict[str, Any]:
    """The TensorStore spec that reads the array Orbax stored as ``name`` in the
    local item directory ``item_dir``: the one Orbax's ``get_json_tspec_read``
    builds (``tests/checkpoint/test_item_metadata.py`` holds the two equal).

    >>> array_spec("/ckpt", "params.w", False, False)["kvstore"]
    {'driver': 'file', 'path': '/ckpt/params.w'}
    """
    directory = os.fspath(item_dir).rstrip("/")
    if use_ocdbt:
        kvstore: dict[str, Any] = {
            "driver": "ocdbt",
            "base": {
                "driver": "file",
                "path": directory + "/",
                "file_io_locking": {"mode": "non_atomic"},
            },
            "manifest": {"driver": "file", "path": directory + "/"},
            "path": name,
            "cache_pool": "cache_pool#ocdbt",
        }
    else:
        kvstore = {"driver": "file", "path": f"{directory}/{name}"}
    return {
        "driver": "zarr3" if use_zarr3 else "zarr",
        "kvstore": kvstore,
        "recheck_cached_data": False,
        "recheck_cached_metadata": False,
        "fill_missing_data_reads": False,
    }


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
