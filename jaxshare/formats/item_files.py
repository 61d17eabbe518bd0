"""Where a jaxshare item keeps what, and how to find the item in a directory.

An item directory holds an ordinary Orbax PyTree checkpoint of the unique tree
(``_METADATA``, ``manifest.ocdbt``, ``ocdbt.process_*/``, ...) and, beside
Orbax's files, :data:`ALIAS_MAP_FILE` with the alias map in the versioned JSON
format of :meth:`jaxshare.AliasMap.to_json`. Both are written into Orbax's
temporary directory and committed together by its rename.

The files that travel with the weights of a model directory (``config.json``,
the tokenizer's files, ...: its *assets*) are kept as they are, byte for byte,
in :data:`ASSETS_DIR` inside the item, beside Orbax's files, which Orbax never
reads.

Zero-size arrays, which Orbax refuses to store, are recorded (shape, dtype and
array type) in the PyTree checkpoint's custom metadata under
:data:`EMPTY_ARRAYS_KEY`, so they are committed with the rest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jaxshare.io.atomic import OutputKind

__all__ = [  # In the order they are defined.
    "ALIAS_MAP_FILE",
    "DCP_METADATA_FILE",
    "NAMING_FILE",
    "MANIFEST_FILE",
    "EMPTY_ARRAYS_KEY",
    "ASSETS_DIR",
    "ORBAX_METADATA_FILE",
    "is_item",
    "item_assets",
    "is_checkpoint",
    "ITEM",
    "find_item",
]

ALIAS_MAP_FILE = "jaxshare_alias_map.json"
#: A PyTorch DCP folder's metadata file: a folder that has one is no item, even with an
#: alias map beside it (jaxshare keeps one in the DCP folders it writes).
DCP_METADATA_FILE = ".metadata"
#: The naming record of a converted tree (see ``jaxshare.NamingRecord``), when it has one.
NAMING_FILE = "jaxshare_naming.json"
#: The per-tensor hashes of an item written with ``manifest=True`` (``Manifest`` JSON).
MANIFEST_FILE = "jaxshare_manifest.json"
EMPTY_ARRAYS_KEY = "jaxshare.empty_arrays"
#: The folder of an item's assets: the model directory's files that travel with it.
ASSETS_DIR = "jaxshare_assets"
#: Written by every Orbax PyTree checkpoint; marks an item directory.
ORBAX_METADATA_FILE = "_METADATA"


def is_item(path: Path) -> bool:
    """Whether ``path`` is an item directory: an Orbax PyTree checkpoint or a jaxshare
    item (not a PyTorch DCP folder, beside which jaxshare keeps an alias map too)."""
    if (path / ORBAX_METADATA_FILE).is_file():
        return True
    return (path / ALIAS_MAP_FILE).is_file() and not (path / DCP_METADATA_FILE).is_file()


def asset_files(assets: Mapping[str, str | os.PathLike | bytes]) -> dict[str, bytes]:
    """``{path in the item: bytes}`` of ``assets`` (``{file name: path or bytes}``),
    read now, so an item is written from what the files held when it started.

    Raises:
      ValueError: a name that is not a plain file name (``'/'``, ``'..'``, a
        leading dot).
      FileNotFoundError: a path that is not a file.
    """
    files = {}
    for name, data in assets.items():
        if not name or name.startswith(".") or "/" in name or "\\" in name:
            raise ValueError(
                f"asset {name!r}: an asset is a plain file name (no '/', no leading dot)."
            )
        files[f"{ASSETS_DIR}/{name}"] = data if isinstance(data, bytes) else Path(data).read_bytes()
    return files


def item_assets(item_dir: Path) -> dict[str, Path]:
    """``{file name: path}`` of the assets kept in the item ``item_dir``, sorted
    (none for an item without them)."""
    folder = item_dir / ASSETS_DIR
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file()}


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is an Orbax checkpoint directory of any kind :func:`find_item`
    answers for: an item, a step directory holding items, or a
    ``CheckpointManager`` root (numbered steps holding items), which it refuses
    naming the steps."""
    if not path.is_dir():
        return False
    if is_item(path):
        return True
    subdirs = _dirs(path)
    return any(is_item(p) for p in subdirs) or any(
        is_item(q) for p in subdirs if p.name.isdigit() for q in _dirs(p)
    )


#: A checkpoint item output: ``force`` replaces only an Orbax PyTree item or a
#: jaxshare item, never a directory of other files.
ITEM = OutputKind("an Orbax checkpoint item", True, lambda p: p.is_dir() and is_item(p))


def find_item(directory: str | os.PathLike) -> Path:
    """The item directory that ``directory`` names, as an absolute path.

    ``directory`` is an item directory (what :func:`jaxshare.checkpoint.save`
    writes), or a ``CheckpointManager`` step directory holding one jaxshare item
    (or one Orbax PyTree item) among its items.

    Raises:
      FileNotFoundError: ``directory`` does not exist, or holds no item.
      ValueError: ``directory`` is a step directory with several candidate items,
        or a ``CheckpointManager`` root; the message lists what to pass instead.
    """
    path = Path(directory).absolute()  # Orbax and TensorStore take absolute paths.
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint directory.")
    if is_item(path):
        return path
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    items = [p for p in subdirs if is_item(p)]
    shared = [p for p in items if (p / ALIAS_MAP_FILE).is_file()]
    for candidates in (shared, items):
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            names = ", ".join(str(p) for p in candidates)
            raise ValueError(
                f"{path} holds several checkpoint items ({names}); pass the item directory to use."
            )
    steps = [p.name for p in subdirs if p.name.isdigit() and any(map(is_item, _dirs(p)))]
    if steps:
        latest = max(steps, key=int)
        raise ValueError(
            f"{path} is a CheckpointManager directory with steps {sorted(map(int, steps))}; "
            f"pass one step, e.g. {path / latest}."
        )
    raise FileNotFoundError(
        f"{path}: not an Orbax checkpoint item (expected {ORBAX_METADATA_FILE} or "
        f"{ALIAS_MAP_FILE} in it, or in one of its subdirectories)."
    )


def _dirs(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_dir()]
