"""The safetensors format, with numpy only: read and check a header, map tensors,
stream a file out one tensor at a time.

A safetensors file is an 8-byte little-endian header size ``N``, ``N`` bytes of
JSON (``{name: {"dtype", "shape", "data_offsets"}}`` plus ``"__metadata__"``, a
``str -> str`` map), then the tensors' bytes back to back; ``data_offsets`` are
relative to the end of the header and must tile the data exactly. jaxshare
records a file's ties in its metadata under :data:`ALIAS_MAP_KEY` (the alias-map
JSON of :meth:`jaxshare.AliasMap.to_json`).

:func:`read_header` checks everything the header claims against the file
before any tensor is read, so a truncated or corrupt file fails with one line
naming it; :class:`SafetensorsFile` maps the file and gives each tensor as a
read-only numpy view of the mapped pages (no copy, no anonymous memory);
:func:`write_safetensors` writes the header first and then each tensor's bytes
as they are produced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import itemsize, numpy_dtype
from jaxshare.core.manifest import Manifest, TensorHash
from jaxshare.core.naming import NamingRecord
from jaxshare.core.progress import ProgressFn
from jaxshare.core.report import METADATA, ArrayInfo, TieReport
from jaxshare.core.strict_json import loads, reading
from jaxshare.io.atomic import OutputKind, atomic_output
from jaxshare.io.mapped import FileRange, map_file
from jaxshare.io.output_file import OutputFile
from jaxshare.io.plan import Plan
from jaxshare.io.source import Index, RecordedTie, TensorSource, UnheldTies, file_part

__all__ = [
    "ALIAS_MAP_KEY",
    "MANIFEST_KEY",
    "MAX_HEADER_BYTES",
    "NAMING_KEY",
    "SAFETENSORS",
    "SafetensorsFile",
    "SafetensorsHeader",
    "TensorEntry",
    "TensorSpec",
    "alias_map_in",
    "data_offsets",
    "dtype_code",
    "inspect_safetensors",
    "is_safetensors_file",
    "manifest_in",
    "save_model_ties",
    "tie_metadata",
    "read_header",
    "save_plan",
    "write_plan",
    "write_safetensors",
]

#: The metadata key holding a file's ties, as alias-map JSON.
ALIAS_MAP_KEY = "jaxshare.alias_map"
#: The metadata key holding the naming record of a converted model (``NamingRecord`` JSON).
NAMING_KEY = "jaxshare.naming"
#: The metadata key holding the per-tensor hashes of the file (``Manifest`` JSON), when
#: it was written with ``manifest=True``.
MANIFEST_KEY = "jaxshare.manifest"
#: The origin of a tie ``safetensors.torch.save_model`` records: the name of each
#: tensor it dropped as a duplicate, a metadata key whose value is the name it kept.
SAVE_MODEL = "save_model metadata"
#: Metadata keys that are never ``save_model``'s records.
_RESERVED = frozenset({"format", ALIAS_MAP_KEY, NAMING_KEY, MANIFEST_KEY})
#: safetensors refuses headers over 100 MB; so does jaxshare, before reading one.
MAX_HEADER_BYTES = 100_000_000

# numpy dtype name <-> safetensors dtype code.
_CODES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "float16": "F16",
    "bfloat16": "BF16",
    "uint32": "U32",
    "int32": "I32",
    "float32": "F32",
    "uint64": "U64",
    "int64": "I64",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_NAMES = {code: name for name, code in _CODES.items()}


def dtype_code(dtype: np.dtype, name: str) -> str:
    """The safetensors dtype code of ``dtype``; errors name the tensor.

    >>> dtype_code(np.dtype("float32"), "w")
    'F32'
    """
    code = _CODES.get(dtype.name)
    if code is None:
        raise ValueError(
            f"{name!r} has dtype {dtype.name}, which safetensors cannot store (it stores "
            f"{', '.join(sorted(_CODES))}); pass `dtype=` to cast floating arrays, or "
            "convert this array first."
        )
    return code


@dataclass(frozen=True)
class TensorEntry(ArrayInfo):
    """One tensor of a header: its shape, dtype name and byte range in the data."""

    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked header: every tensor's entry, the metadata, where the data starts.

    Attributes:
      path: the file.
      tensors: ``{name: TensorEntry}`` in the order of their data.
      metadata: the ``"__metadata__"`` map (empty when absent).
      data_start: byte offset of the data in the file.
    """

    path: Path
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int

    @property
    def infos(self) -> dict[str, ArrayInfo]:
        return {name: entry.info for name, entry in self.tensors.items()}


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a valid safetensors file: {why}.")


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Reads and checks the header of a safetensors file, reading no tensor.

    Checks: the header size fits the file; the header is a JSON object without
    duplicate names; ``__metadata__`` maps strings to strings; each entry has a
    known dtype, a shape of non-negative ints and data offsets whose length
    matches shape and dtype; the offsets tile the data exactly and the file
    holds every byte they name.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the first problem found, in one line starting with the path.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/w.safetensors"
    >>> save_file({"w": np.zeros((2, 3), np.float32)}, path)
    >>> read_header(path).tensors["w"]
    TensorEntry(shape=(2, 3), dtype='float32', begin=0, end=24)
    """
    path = Path(path)
    if path.is_dir():
        raise _bad(path, "it is a directory")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"the file has {size} bytes, fewer than the 8 of a header size")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise _bad(path, f"the header size {n} is over the limit of {MAX_HEADER_BYTES}")
        if n > size - 8:
            raise _bad(
                path,
                f"the header size {n} runs past the end of the file ({size} bytes): "
                "the file is truncated or not safetensors",
            )
        raw = f.read(n)
    try:
        header = loads(raw, what="the header")
    except ValueError as e:
        raise _bad(path, str(e).rstrip(".")) from None
    if not isinstance(header, dict):
        raise _bad(path, f"the header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _bad(path, "'__metadata__' must map strings to strings")
    tensors: dict[str, TensorEntry] = {}
    for name, entry in header.items():
        tensors[name] = _entry(path, name, entry)
    data_start = 8 + n
    data_size = size - data_start
    expected = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != expected:
            raise _bad(
                path,
                f"tensor {name!r} starts at data offset {entry.begin}, expected {expected} "
                "(the offsets must tile the data without gaps or overlaps)",
            )
        expected = entry.end
    if expected > data_size:
        raise _bad(
            path,
            f"the tensors need {expected} bytes of data, but the file holds {data_size} after "
            f"its header: the file is truncated",
        )
    if expected < data_size:
        raise _bad(
            path,
            f"the file holds {data_size} bytes of data after its header, but its tensors "
            f"account for {expected}",
        )
    ordered = dict(sorted(tensors.items(), key=lambda item: item[1].begin))
    return SafetensorsHeader(path, ordered, dict(metadata), data_start)


def _entry(path: Path, name: str, entry: Any) -> TensorEntry:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise _bad(path, f"tensor {name!r} has no dtype, shape and data_offsets: {entry!r}")
    dtype = _NAMES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise _bad(path, f"tensor {name!r} has unknown dtype {entry['dtype']!r}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise _bad(path, f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or any(type(o) is not int or o < 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _bad(path, f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    nbytes = math.prod(shape) * itemsize(dtype)
    if offsets[1] - offsets[0] != nbytes:
        raise _bad(
            path,
            f"tensor {name!r} ({dtype}{shape}) needs {nbytes} bytes, but its data_offsets "
            f"{offsets} span {offsets[1] - offsets[0]}",
        )
    return TensorEntry(tuple(shape), dtype, offsets[0], offsets[1])


def is_safetensors_file(path: Path) -> bool:
    """Whether ``path`` is a readable safetensors file (its header checks out)."""
    try:
        read_header(path)
    except (OSError, ValueError):
        return False
    return True


def tie_metadata(alias_map: AliasMap) -> dict[str, str]:
    """The metadata entries that record ``alias_map`` (and its naming record).

    >>> tie_metadata(AliasMap({"b": "a"}))
    {'jaxshare.alias_map': '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"b": "a"}}'}
    """
    out = {ALIAS_MAP_KEY: alias_map.to_json()}
    if alias_map.naming is not None:
        out[NAMING_KEY] = alias_map.naming.to_json()
    return out


def alias_map_in(header: SafetensorsHeader) -> AliasMap:
    """The ties a file records under :data:`ALIAS_MAP_KEY` (with the naming record
    under :data:`NAMING_KEY`, if any), checked against it.

    Every canonical must be a tensor the file stores, and every transform must
    fit its canonical's rank; an alias may be stored too (a consolidated file
    writes aliases out for readers that know no ties).

    Raises:
      ValueError: the metadata is not a valid alias map, or does not fit the
        file; one line starting with the path.
    """
    text = header.metadata.get(ALIAS_MAP_KEY)
    with reading(f"{header.path}: metadata {ALIAS_MAP_KEY!r} is invalid"):
        amap = AliasMap() if text is None else AliasMap.from_json(text)
    naming = header.metadata.get(NAMING_KEY)
    if naming is not None:
        with reading(f"{header.path}: metadata {NAMING_KEY!r} is invalid"):
            amap = amap.with_naming(NamingRecord.from_json(naming))
    problems = []
    unheld = [RecordedTie(a, c, METADATA) for a, c in amap.items() if c not in header.tensors]
    for alias, canonical in amap.items():
        entry = header.tensors.get(canonical)
        if entry is None:
            problems.append(
                f"alias {alias!r} names canonical {canonical!r}, which the file does not store"
            )
            continue
        perm = amap.transform(alias)
        if perm is not None and len(perm) != len(entry.shape):
            problems.append(
                f"alias {alias!r} permutes {len(perm)} axes, but {canonical!r} has shape "
                f"{entry.shape}"
            )
    if problems:
        message = (
            f"{header.path}: metadata {ALIAS_MAP_KEY!r} does not fit the file: "
            + "; ".join(problems[:3])
            + (f"; ... ({len(problems)} problems)" if len(problems) > 3 else "")
        )
        if len(unheld) == len(problems):
            raise UnheldTies(message, header.path, "safetensors", unheld)
        raise ValueError(message)
    return amap


def save_model_ties(
    header: SafetensorsHeader, amap: AliasMap
) -> tuple[dict[str, str], list[RecordedTie]]:
    """The ties ``safetensors.torch.save_model`` records in a file's metadata: each
    name it dropped as a duplicate, as a key whose value is the name it kept
    (``{"lm_head.weight": "transformer.wte.weight"}``).

    Returns ``(applied, recorded)``: ``{dropped: kept}`` for each dropped name the
    file does not store (its tensor is the kept one's, to a canonical of ``amap``,
    the file's alias map), and the entries that cannot be applied -- a dropped name
    the file stores in its own right -- for ``check`` to hold against the values.

    The metadata does not say which entries are records, so this is a reading of
    it: an entry is one where its value names a stored tensor and its key could be
    a PyTorch name (not empty, no ``'/'``, no empty part between dots, no spaces).
    Any other entry is other metadata, and never makes the file unreadable.

    >>> from safetensors.numpy import save_file
    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/m.safetensors"
    >>> save_file({"wte.weight": np.zeros((4, 2), np.float32)}, path,
    ...           metadata={"format": "pt", "lm_head.weight": "wte.weight"})
    >>> save_model_ties(read_header(path), AliasMap())
    ({'lm_head.weight': 'wte.weight'}, [])
    """
    applied: dict[str, str] = {}
    recorded: list[RecordedTie] = []
    for key, value in header.metadata.items():
        if key in _RESERVED or key == value or value not in header.tensors or key in amap:
            continue
        if not _torch_name(key):
            continue
        if key in header.tensors:
            recorded.append(RecordedTie(key, value, SAVE_MODEL))
        else:
            applied[key] = value
    return applied, recorded


def _torch_name(key: str) -> bool:
    """Whether ``key`` could name a tensor of a PyTorch state dict."""
    return (
        bool(key)
        and "/" not in key
        and key.isprintable()
        and " " not in key
        and all(key.split("."))
    )


def manifest_in(header: SafetensorsHeader) -> Manifest | None:
    """The manifest a file records under :data:`MANIFEST_KEY` (``None``: none).

    Raises:
      ValueError: the metadata is not a valid manifest (one line naming the file).
    """
    text = header.metadata.get(MANIFEST_KEY)
    if text is None:
        return None
    with reading(f"{header.path}: metadata {MANIFEST_KEY!r} is invalid"):
        return Manifest.from_json(text)


def inspect_safetensors(path: str | os.PathLike) -> TieReport:
    """The tie report of a ``.safetensors`` file, from its header alone.

    The ties are the aliases its metadata records; an alias the file also
    stores (a consolidated file writes them out for readers that know no ties)
    counts as written out.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is truncated or corrupt, or its alias metadata does
        not fit it (one line naming the file).

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/w.safetensors"
    >>> save_file({"w": np.zeros(4, np.float32)}, path)
    >>> inspect_safetensors(path).bytes_stored
    16
    """
    with SafetensorsFile(path) as f:
        return f.report()


class SafetensorsFile(TensorSource):
    """A safetensors file mapped into memory: a :class:`TensorSource` whose tensors
    are read-only numpy views of the file's pages.

    The views share the mapped file pages, which the operating system reads on
    first touch and may drop at any time; no tensor is copied, and a slice reads
    only the pages it covers. The ties are the aliases its metadata records
    (:func:`alias_map_in`). Use it as a context manager, or call :meth:`close`
    once no view is used any more.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/w.safetensors"
    >>> save_file({"w": np.arange(6, dtype=np.int32).reshape(2, 3)}, path)
    >>> with SafetensorsFile(path) as f:
    ...     f.array("w")[1].tolist()
    [3, 4, 5]
    """

    mapped = True  # blocks are views of mapped files or tensors in memory

    kind = "safetensors"

    def __init__(self, path: str | os.PathLike) -> None:
        self.header = read_header(path)
        self.path = self.header.path
        self.infos = self.header.infos
        amap = alias_map_in(self.header)
        dropped, unapplied = save_model_ties(self.header, amap)
        self.unapplied_ties = tuple(unapplied)
        self.origins = {**dict.fromkeys(amap, METADATA), **dict.fromkeys(dropped, SAVE_MODEL)}
        # (A kept name that is itself an alias: the map collapses the chain.)
        self.ties = AliasMap(
            {**amap, **dropped},
            transforms=amap.transforms,
            naming=amap.naming,
            implicit=amap.implicit,
        )
        self.parts = (file_part(self.path, len(self.infos)),)
        mapped = map_file(self.path)
        self._map = mapped if mapped.size else None

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def manifest(self) -> Manifest | None:
        return manifest_in(self.header)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return np.array(self.array(name)[index])

    def slice_view(self, name: str, index: Index) -> np.ndarray:
        return self.array(name)[index]

    def extents(self, name: str) -> Sequence[FileRange]:
        entry = self.header.tensors[name]
        start = self.header.data_start + entry.begin
        return ((os.fspath(self.header.path), start, entry.end - entry.begin),)

    def array(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a read-only numpy array over the file's pages."""
        try:
            entry = self.header.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}.") from None
        dtype = numpy_dtype(entry.dtype)
        count = math.prod(entry.shape)
        if count == 0 or self._map is None:
            return np.zeros(entry.shape, dtype)
        offset = self.header.data_start + entry.begin
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(
            entry.shape
        )


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def data_offsets(
    specs: Sequence[TensorSpec], metadata: Mapping[str, str], *, manifest: bool = False
) -> dict[str, int]:
    """Where in the file :func:`write_safetensors` puts each tensor's bytes, by name.

    >>> data_offsets([TensorSpec("a", (3,), np.dtype("float32"))], {})
    {'a': 64}
    """
    start = 8 + len(_header(specs, metadata, manifest)[0])
    offsets, at = {}, start
    for spec in specs:
        offsets[spec.name] = at
        at += spec.nbytes
    return offsets


def _header(
    specs: Sequence[TensorSpec], metadata: Mapping[str, str], manifest: bool
) -> tuple[bytes, list[str]]:
    """The header, and with ``manifest`` the digests' stand-ins in it (random, of
    a fixed length: the header's length does not depend on them)."""
    metadata = dict(metadata)
    marks: list[str] = []
    if manifest:
        placeholder, marks = Manifest.placeholder((s.name, s.shape, s.dtype.name) for s in specs)
        metadata[MANIFEST_KEY] = placeholder.to_json()
    return _header_bytes(specs, metadata), marks


def _header_bytes(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": dtype_code(spec.dtype, spec.name),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)  # Align the data to 8 bytes, as safetensors does.


#: A ``.safetensors`` output, for :func:`jaxshare.io.atomic.atomic_output`.
SAFETENSORS = OutputKind("a .safetensors file", False, is_safetensors_file)


@contextlib.contextmanager
def write_safetensors(
    path: str | os.PathLike,
    specs: Sequence[TensorSpec],
    metadata: Mapping[str, str] | None = None,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    manifest: bool = False,
    kept: bool = False,
) -> Iterator[Callable[[Iterable[np.ndarray]], str | None]]:
    """Yields ``write(blocks)``, to be called once per spec, in order, with the
    tensor's bytes in C order as numpy arrays of its dtype (one array or many
    blocks). The file is written at a temporary name and appears at ``path``
    only when complete.

    ``kept``: no block's memory is changed once handed to ``write``; a large
    block that lines up with the file's blocks (see :func:`data_offsets`) is
    then written from where it lies, not copied
    (:meth:`jaxshare.io.output_file.OutputFile.write_array`).

    With ``manifest``, each tensor is hashed as it is written (``write`` returns
    its SHA-256) and the metadata records the :class:`jaxshare.internal.Manifest`
    under :data:`MANIFEST_KEY`: the header is written first with stand-ins of the
    digests' length, each put in place once its tensor is written.

    Raises:
      FileExistsError: ``path`` exists and ``force`` is false.
      ValueError: ``path`` is an input, or exists and is not a safetensors file;
        a tensor's blocks do not match its spec; fewer tensors were written than
        specs. Nothing is left behind.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/w.safetensors"
    >>> spec = TensorSpec("w", (2,), np.dtype("float32"))
    >>> with write_safetensors(path, [spec], {"format": "np"}) as write:
    ...     write([np.ones(2, np.float32)])
    >>> read_header(path).metadata
    {'format': 'np'}
    """
    header, marks = _header(specs, metadata or {}, manifest)
    # Where each digest's stand-in is in the header: hex, never escaped, and random.
    places = [8 + header.index(mark.encode()) for mark in marks]
    written = 0
    with atomic_output(path, SAFETENSORS, force=force, inputs=inputs) as tmp:
        # Handed to the disk as it is written: the disk writes while the next is read.
        with OutputFile(tmp) as f:

            def write(blocks: Iterable[np.ndarray]) -> str | None:
                nonlocal written
                if written == len(specs):
                    raise ValueError(f"{path}: more tensors written than the {len(specs)} specs.")
                spec = specs[written]
                size = 0
                digest = TensorHash() if manifest else None
                for block in blocks:
                    if block.dtype != spec.dtype:
                        raise ValueError(
                            f"{spec.name!r}: expected {spec.dtype.name}, got {block.dtype.name}."
                        )
                    data = np.ascontiguousarray(block)
                    if digest is not None:
                        digest.update(data)
                    f.write_array(data, kept=kept)
                    size += data.nbytes
                if size != spec.nbytes:
                    raise ValueError(f"{spec.name!r}: expected {spec.nbytes} bytes, got {size}.")
                written += 1
                if digest is None:
                    return None
                digests.append(digest.hexdigest())
                return digests[-1]

            digests: list[str] = []
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            yield write
            if written != len(specs):
                raise ValueError(f"{path}: wrote {written} of {len(specs)} tensors.")
            for place, digest in zip(places, digests, strict=True):  # The stand-ins replaced.
                f.patch(place, digest.encode())


def save_plan(
    path: str | os.PathLike,
    plan: Plan,
    source: TensorSource,
    *,
    metadata: Mapping[str, str] | None = None,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
    manifest: bool = False,
) -> None:
    """Writes the outputs of ``plan``, read from ``source`` one at a time, to a
    ``.safetensors`` file whose metadata records the plan's ties (and naming),
    and with ``manifest`` the hash of every tensor written (:data:`MANIFEST_KEY`).

    Memory holds about two tensors: each is read, cast and transposed as the
    plan says while the one before is written (:meth:`Plan.arrays`), and dropped
    once written. The file appears only when complete.

    >>> import tempfile
    >>> from jaxshare.stream import Plan
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> save_file({"w": np.ones((2, 3), np.float32)}, d + "/in.safetensors")
    >>> with SafetensorsFile(d + "/in.safetensors") as source:
    ...     save_plan(d + "/out.safetensors", Plan.identity(source).cast("bfloat16"), source)
    >>> read_header(d + "/out.safetensors").tensors["w"].dtype
    'bfloat16'
    """
    meta = {"format": "pt", **(metadata or {}), **tie_metadata(plan.alias_map)}
    write_plan(
        path, plan, source, meta, force=force, inputs=inputs, progress=progress, manifest=manifest
    )


def write_plan(
    path: str | os.PathLike,
    plan: Plan,
    source: TensorSource,
    metadata: Mapping[str, str],
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
    manifest: bool = False,
) -> None:
    """Writes the entries of ``plan`` with exactly ``metadata`` (:func:`save_plan`
    adds the plan's ties to it): the streaming writer under every
    ``.safetensors`` output (``manifest``: as for :func:`write_safetensors`)."""
    specs = [TensorSpec(e.name, e.info.shape, numpy_dtype(e.info.dtype)) for e in plan.entries]
    # The arrays made to line up with the file: written without a copy (`kept`).
    offsets = data_offsets(specs, metadata, manifest=manifest)
    with (
        write_safetensors(
            path, specs, metadata, force=force, inputs=inputs, manifest=manifest, kept=True
        ) as write,
        contextlib.closing(plan.outputs(source, offsets)) as outputs,  # Its threads end here.
    ):
        # No `enumerate` over the outputs: it keeps the last of them (its array with
        # it) until the next is read.
        for done, entry in enumerate(plan.entries, 1):
            _, blocks = next(outputs)
            write(blocks)
            del blocks  # Before the next is read.
            if progress is not None:
                progress(done, len(plan.entries), entry.name, entry.info.nbytes)
