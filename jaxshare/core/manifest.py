"""``Manifest``: per-tensor hashes of what a writer wrote, so one side can be verified.

A conversion run with ``manifest=True`` (``jaxshare convert ... --manifest``)
hashes each tensor's bytes as the writer writes them -- in the axis order and dtype
they are stored in, in C order, no second read -- and records, per stored name,
shape, dtype and the SHA-256 of those bytes. ``jaxshare verify OUT`` then reads
OUT once and holds every tensor against its manifest.

JSON, strict like the alias map's::

    {"format": "jaxshare.manifest", "version": 1, "algorithm": "sha256",
     "tensors": {"wte.weight": {"shape": [10, 4], "dtype": "float32", "sha256": "9f86..."}}}

A ``"sha256"`` of ``null`` is a tensor the writer could not hash as it wrote it
(a stack of layers written on an axis other than the first): verification names
it and checks its shape and dtype only.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from jaxshare.core.frozen import FrozenMapping
from jaxshare.core.strict_json import Kind, load_document

__all__ = [
    "ALGORITHM",
    "FORMAT",
    "MAX_JSON_BYTES",
    "VERSION",
    "Manifest",
    "ManifestEntry",
    "TensorHash",
    "tensor_digest",
]

FORMAT = "jaxshare.manifest"
VERSION = 1
#: This document kind, for the strict parser.
DOCUMENT = Kind("manifest", FORMAT, VERSION)
ALGORITHM = "sha256"
#: ``from_json`` refuses larger input (an entry is ~150 bytes per tensor).
MAX_JSON_BYTES = 64 * 2**20
_DIGEST_CHARS = 64  # hex digits of a SHA-256


class TensorHash:
    """The SHA-256 of one tensor's bytes in C order, fed block by block.

    >>> h = TensorHash()
    >>> h.update(np.arange(3, dtype=np.int8)); h.update(np.arange(3, 6, dtype=np.int8))
    >>> h.hexdigest() == tensor_digest([np.arange(6, dtype=np.int8)])
    True
    """

    __slots__ = ("_hash",)

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, block: np.ndarray) -> None:
        """Adds ``block``'s elements, in C order (hashlib lets go of the GIL)."""
        data = np.ascontiguousarray(block)
        if data.size:
            self._hash.update(data.reshape(-1).view(np.uint8).data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def tensor_digest(blocks: Iterable[np.ndarray]) -> str:
    """The SHA-256 (hex) of a tensor given as C-order blocks written end to end.

    >>> tensor_digest([np.zeros(0, np.float32)])[:12]
    'e3b0c44298fc'
    """
    h = TensorHash()
    for block in blocks:
        h.update(block)
    return h.hexdigest()


class ManifestEntry(NamedTuple):
    """One stored tensor: its shape, dtype name and SHA-256 (``None``: not hashed)."""

    shape: tuple[int, ...]
    dtype: str
    sha256: str | None


def _check(name: object, entry: object) -> ManifestEntry:
    if not isinstance(name, str) or not name:
        raise ValueError(f"manifest: {name!r} is not a tensor name.")
    if not isinstance(entry, ManifestEntry):
        raise TypeError(f"manifest: {name!r} must map to a ManifestEntry, got {entry!r}.")
    shape, dtype, digest = entry
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"manifest: the shape of {name!r} must be ints >= 0, got {shape!r}.")
    if not isinstance(dtype, str) or not dtype:
        raise ValueError(f"manifest: the dtype of {name!r} must be a dtype name, got {dtype!r}.")
    if digest is not None and (
        not isinstance(digest, str)
        or len(digest) != _DIGEST_CHARS
        or any(c not in "0123456789abcdef" for c in digest)
    ):
        raise ValueError(
            f"manifest: the sha256 of {name!r} must be 64 lowercase hex digits or null, "
            f"got {digest!r}."
        )
    return entry


class Manifest(FrozenMapping[str, ManifestEntry]):
    """An immutable map from stored tensor name to :class:`ManifestEntry`.

    Raises:
      TypeError, ValueError: a malformed name, shape, dtype or digest; the
        message names the tensor.

    >>> m = Manifest({"w": ManifestEntry((2,), "float32", tensor_digest([np.ones(2, np.float32)]))})
    >>> Manifest.from_json(m.to_json()) == m
    True
    >>> m["w"].shape
    (2,)
    """

    __slots__ = ("_entries",)

    def __init__(
        self, entries: Mapping[str, ManifestEntry] | Iterable[tuple[str, ManifestEntry]] = (), /
    ) -> None:
        self._entries = {name: _check(name, e) for name, e in dict(entries).items()}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Manifest):
            return self._entries == other._entries
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (Mutable-looking: compared, not hashed.)

    def __repr__(self) -> str:
        return f"Manifest({len(self)} tensors)"

    def to_dict(self) -> dict[str, object]:
        """The versioned document as a dict (for a JSON file's object, an index's metadata)."""
        tensors = {
            name: {"shape": list(e.shape), "dtype": e.dtype, "sha256": e.sha256}
            for name, e in self._entries.items()
        }
        return {"format": FORMAT, "version": VERSION, "algorithm": ALGORITHM, "tensors": tensors}

    def to_json(self, *, indent: int | None = None) -> str:
        """The versioned JSON format (names in manifest order)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes, /, *, max_bytes: int = MAX_JSON_BYTES) -> Manifest:
        """Parses :meth:`to_json` output, strictly.

        Raises:
          ValueError: input over ``max_bytes``, not JSON, duplicate keys, an
            unknown format, version or algorithm, unexpected fields or types.
            Nothing is returned half-loaded.
        """
        doc = load_document(
            text,
            DOCUMENT,
            {"algorithm": str, "tensors": dict},
            max_bytes=max_bytes,
        )
        if doc["algorithm"] != ALGORITHM:
            raise ValueError(
                f"manifest JSON hashes with {doc['algorithm']!r}; this jaxshare reads "
                f"{ALGORITHM!r}."
            )
        entries = {}
        for name, entry in doc["tensors"].items():
            if not isinstance(entry, dict) or set(entry) != {"shape", "dtype", "sha256"}:
                raise ValueError(
                    f"manifest: {name!r} must map to {{'shape', 'dtype', 'sha256'}}, got {entry!r}."
                )
            shape = entry["shape"]
            if not isinstance(shape, list):
                raise ValueError(f"manifest: the shape of {name!r} must be a list, got {shape!r}.")
            entries[name] = ManifestEntry(tuple(shape), entry["dtype"], entry["sha256"])
        try:
            return cls(entries)
        except TypeError as e:
            raise ValueError(str(e)) from None

    @classmethod
    def placeholder(
        cls, specs: Iterable[tuple[str, tuple[int, ...], str]], /
    ) -> tuple[Manifest, list[str]]:
        """A manifest of ``(name, shape, dtype)`` whose digests are random
        stand-ins, and the stand-ins in order: a writer that must put the manifest
        before the data (a safetensors header) writes this one and puts each
        tensor's digest in its stand-in's place, byte for byte, once written."""
        specs = list(specs)
        marks = [secrets.token_hex(_DIGEST_CHARS // 2) for _ in specs]
        return cls(
            {n: ManifestEntry(tuple(s), d, m) for (n, s, d), m in zip(specs, marks, strict=True)}
        ), marks
