"""``TieReport``: what ``jaxshare inspect`` shows of a checkpoint or weights file.

Every source (an Orbax item, a weights file, a Hugging Face, DeepSpeed or DCP
directory...) describes what it holds as ``{path: ArrayInfo}`` for the stored
(unique) arrays plus an ``AliasMap``; the report derives the aliases' shapes, the
tie groups and the byte counts, and renders them as a table or JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import itemsize
from jaxshare.core.naming import stack_axis
from jaxshare.core.perm import Perm, permute_shape

__all__ = [
    "ALIAS_MAP",
    "METADATA",
    "SHARED_PARAMS",
    "STORAGE",
    "ArrayInfo",
    "TieReport",
    "format_bytes",
]

# Where a tie comes from (a report's ``origins``): the words every reader uses, and
# ``check`` tells ties apart by.
#: jaxshare's alias map (an item's file, a DCP folder's); what an alias no reader
#: names gets.
ALIAS_MAP = "alias map"
#: jaxshare's alias map in a ``.safetensors`` file's metadata.
METADATA = "metadata"
#: DeepSpeed's record of the names it left out (``shared_params``).
SHARED_PARAMS = "shared_params"
#: Tensors over one memory (a ``torch.save`` file, a module's state dict).
STORAGE = "storage"


@dataclass(frozen=True)
class ArrayInfo:
    """Shape and dtype of one array, without its data."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)

    def permuted(self, perm: Perm | None) -> ArrayInfo:
        """The info of this array transposed by ``perm``."""
        return self if perm is None else ArrayInfo(permute_shape(self.shape, perm), self.dtype)

    @property
    def info(self) -> ArrayInfo:
        """The shape and dtype alone (of a record that says more of its array: where
        a file stores it).

        >>> ArrayInfo((2,), "float32").info
        ArrayInfo(shape=(2,), dtype='float32')
        """
        return ArrayInfo(self.shape, self.dtype)


def format_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    >>> format_bytes(0), format_bytes(1536), format_bytes(3 * 2**30)
    ('0 B', '1.5 KiB', '3.0 GiB')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class TieReport:
    """The ties of one stored item.

    Args:
      source: the file or directory described.
      kind: the source's kind: ``"orbax"``, ``"safetensors"``, ``"torch"``,
        ``"hf"``, ``"deepspeed"``, ``"dcp"``, ``"msgpack"``, ``"state dict"``...
      stored: ``{path: ArrayInfo}`` of the arrays the item stores.
      alias_map: the aliases the item records; each canonical is in ``stored``.
      written_out: aliases the item also stores as arrays of their own (a
        consolidated ``.safetensors`` does, for readers that know no ties);
        their bytes count as stored.
      origins: ``{alias: where the tie comes from}``, e.g. ``"metadata"`` (the
        file records it), ``"storage"`` (tensors over one memory),
        ``"config.json"`` (a Hugging Face config ties it); unnamed aliases get
        ``"alias map"``.
      parts: the files the item is made of (shards), one line each.
      assets: the files that travel with the arrays (``config.json``,
        tokenizer files), by name.
      other_files: files beside the arrays that are neither read nor carried.
      chunks: how the arrays are split across the files, one line per array (a
        DCP folder's chunks), where they are.
      notes: what else the input holds, left out here, one line each.

    >>> r = TieReport("ckpt", "orbax", {"wte": ArrayInfo((4, 2), "float32")},
    ...               AliasMap({"head": "wte"}, transforms={"head": (1, 0)}))
    >>> r.bytes_stored, r.bytes_total, r.bytes_saved, r.arrays["head"].shape
    (32, 64, 32, (2, 4))
    """

    source: str
    kind: str
    stored: Mapping[str, ArrayInfo]
    alias_map: AliasMap
    written_out: frozenset[str] = frozenset()
    origins: Mapping[str, str] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    assets: tuple[str, ...] = ()
    other_files: tuple[str, ...] = ()
    chunks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    arrays: Mapping[str, ArrayInfo] = field(init=False)

    def __post_init__(self) -> None:
        missing = sorted({c for c in self.alias_map.values() if c not in self.stored})
        if missing:
            raise ValueError(
                f"{self.source}: the alias map names canonical path(s) {missing[:5]} that "
                "the item does not store."
            )
        if unknown := sorted(set(self.written_out) - set(self.alias_map)):
            raise ValueError(f"{self.source}: `written_out` names non-aliases {unknown[:5]}.")
        arrays = dict(self.stored)
        for alias, canonical in self.alias_map.items():
            arrays[alias] = self.stored[canonical].permuted(self.alias_map.transform(alias))
        object.__setattr__(self, "arrays", dict(sorted(arrays.items())))

    @property
    def bytes_stored(self) -> int:
        written = sum(self.arrays[a].nbytes for a in self.written_out)
        return written + sum(info.nbytes for info in self.stored.values())

    @property
    def bytes_total(self) -> int:
        """What the item would take with every alias written out."""
        return sum(info.nbytes for info in self.arrays.values())

    @property
    def bytes_saved(self) -> int:
        return self.bytes_total - self.bytes_stored

    @property
    def stacks(self) -> dict[str, tuple[str, int, int]]:
        """``{path: (PyTorch name, layers, axis)}`` of the arrays that are stacks of
        layers, as the item's naming record says (``model.layers.{i}.mlp.weight``)."""
        naming = self.alias_map.naming
        out: dict[str, tuple[str, int, int]] = {}
        for path, info in self.arrays.items():
            n = None if naming is None else naming.get(path)
            if n is not None and n.stacked and info.shape:
                axis = stack_axis(n.permute)
                out[path] = (n.torch, info.shape[axis], axis)
        return out

    def origin(self, alias: str) -> str:
        """Where the tie of ``alias`` comes from (see ``origins``)."""
        return self.origins.get(alias, ALIAS_MAP)

    def to_dict(self) -> dict:
        groups = []
        for canonical, aliases in self.alias_map.groups().items():
            info = self.stored[canonical]
            groups.append(
                {
                    "canonical": canonical,
                    "aliases": [
                        {
                            "path": a,
                            "permute": list(p) if (p := self.alias_map.transform(a)) else None,
                            "written_out": a in self.written_out,
                            "origin": self.origin(a),
                            # (Only where it is: the model computes it, no leaf holds it.)
                            **({"implicit": True} if a in self.alias_map.implicit else {}),
                        }
                        for a in aliases
                    ],
                    "origins": sorted({self.origin(a) for a in aliases}),
                    "shape": list(info.shape),
                    "dtype": info.dtype,
                    "bytes_each": info.nbytes,
                }
            )
        return {
            "source": self.source,
            "kind": self.kind,
            "parts": list(self.parts),
            "assets": list(self.assets),
            "other_files": list(self.other_files),
            "chunks": list(self.chunks),
            "notes": list(self.notes),
            "arrays": len(self.arrays),
            "stored_arrays": len(self.stored),
            "bytes_stored": self.bytes_stored,
            "bytes_total": self.bytes_total,
            "bytes_saved": self.bytes_saved,
            "tie_groups": groups,
            "stacks": [
                {"path": path, "torch": name, "layers": layers, "axis": axis}
                for path, (name, layers, axis) in self.stacks.items()
            ],
            "alias_map": json.loads(self.alias_map.to_json()),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
