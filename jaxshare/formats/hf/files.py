"""The files of a Hugging Face model directory, with the standard library only.

``save_pretrained`` writes ``config.json`` and the weights: ``model.safetensors``
alone, or shards ``model-0000k-of-0000N.safetensors`` listed in
``model.safetensors.index.json``; older directories hold ``pytorch_model.bin``
or ``pytorch_model-0000k-of-0000N.bin`` shards with ``pytorch_model.bin.index.json``,
and a Flax model's ``flax_model.msgpack`` or ``flax_model-0000k-of-0000N.msgpack``
shards with ``flax_model.msgpack.index.json`` (its names ``'/'``-joined Flax paths).
An index is ``{"metadata": {"total_size": ...}, "weight_map": {name: shard file}}``.

:func:`hf_weights` finds which of these a directory holds, :func:`read_index`
reads and checks an index, :func:`shard_of` tells whether a weights file is one
shard of several (opening it alone would drop the others), and
:func:`parse_size` reads a ``max_shard_size`` as transformers does. Nothing here
reads a tensor or imports torch.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from jaxshare.core.strict_json import loads
from jaxshare.io.atomic import OutputKind

__all__ = [  # In the order they are defined.
    "CONFIG_FILE",
    "SAFE_WEIGHTS",
    "SAFE_INDEX",
    "BIN_WEIGHTS",
    "BIN_INDEX",
    "FLAX_WEIGHTS",
    "FLAX_INDEX",
    "INDEX_SUFFIX",
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DEFAULT_MAX_SHARD_SIZE",
    "parse_size",
    "shard_name",
    "HFIndex",
    "read_index",
    "HFWeights",
    "MODEL_ASSETS",
    "ModelFiles",
    "model_files",
    "hf_weights",
    "is_hf_directory",
    "is_hf_input",
    "is_adapter_directory",
    "shard_of",
    "check_not_a_shard",
    "HF_DIRECTORY",
]

CONFIG_FILE = "config.json"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
FLAX_WEIGHTS = "flax_model.msgpack"
FLAX_INDEX = "flax_model.msgpack.index.json"
INDEX_SUFFIX = ".index.json"
#: A PEFT adapter directory's config and tensors, as PEFT names them.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The weights files of a directory, in the order a PyTorch loader prefers them:
#: safetensors, then ``.bin``, then Flax msgpack; an index before a single file.
_WEIGHT_FILES = (SAFE_INDEX, SAFE_WEIGHTS, BIN_INDEX, BIN_WEIGHTS, FLAX_INDEX, FLAX_WEIGHTS)
#: ``save_pretrained``'s default in transformers 5 (1000-based units).
DEFAULT_MAX_SHARD_SIZE = "50GB"
#: An index is names and file names; a real one is a few megabytes.
MAX_INDEX_BYTES = 256 * 2**20

_UNITS = {
    "TIB": 2**40,
    "GIB": 2**30,
    "MIB": 2**20,
    "KIB": 2**10,
    "TB": 10**12,
    "GB": 10**9,
    "MB": 10**6,
    "KB": 10**3,
}
_SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.(safetensors|bin|msgpack)$")
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_size(size: int | str) -> int:
    """A shard size in bytes, read as transformers' ``convert_file_size_to_int``:
    ``"5GB"`` is 5 * 10**9 bytes, ``"10KiB"`` 10 * 2**10, ``"1Gb"`` (bits) an
    eighth of ``"1GB"``; an int (or a string of digits) is bytes.

    Raises:
      ValueError: not a positive size with one of those units.

    >>> parse_size("50GB"), parse_size("10KiB"), parse_size("8Mb"), parse_size(1000)
    (50000000000, 10240, 1000000, 1000)
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"`max_shard_size` must be an int or a str like '5GB', got {size!r}.")
    if isinstance(size, int):
        value = size
    else:
        m = _SIZE.match(size)
        unit = m.group(2).upper() if m else ""
        if m is None or (unit and unit not in _UNITS):
            raise ValueError(
                f"`max_shard_size` {size!r} is not a size: expected an integer followed by a "
                "unit, e.g. '5GB', '500MB' or '10KiB' (KB/MB/GB/TB are 1000-based, KiB/MiB/GiB "
                "1024-based, as in transformers)."
            )
        value = int(m.group(1)) * (_UNITS[unit] if unit else 1)
        if unit and not unit.endswith("IB") and m.group(2).endswith("b"):
            value //= 8  # transformers reads "Gb" as gigabits.
    if value <= 0:
        raise ValueError(f"`max_shard_size` must be positive, got {size!r}.")
    return value


def shard_name(weights: str, k: int, n: int) -> str:
    """The file name of shard ``k`` of ``n`` (1-based) for ``weights``, as
    ``save_pretrained`` names it; one shard keeps the plain name.

    >>> shard_name("model.safetensors", 2, 3), shard_name("model.safetensors", 1, 1)
    ('model-00002-of-00003.safetensors', 'model.safetensors')
    """
    if n == 1:
        return weights
    stem, dot, suffix = weights.rpartition(".")
    return f"{stem}-{k:05d}-of-{n:05d}{dot}{suffix}"


@dataclass(frozen=True)
class HFIndex:
    """A checked index file.

    Attributes:
      path: the index file.
      weight_map: ``{tensor name: shard file name}`` in the file's order.
      metadata: its ``"metadata"`` object (``total_size``...), possibly empty.
    """

    path: Path
    weight_map: dict[str, str]
    metadata: dict

    @property
    def files(self) -> list[str]:
        """The shard files, each once, sorted (``-00001-of-`` first)."""
        return sorted(set(self.weight_map.values()))


def read_index(path: str | os.PathLike) -> HFIndex:
    """Reads and checks a Hugging Face index file (``*.index.json``).

    Checks: a JSON object whose ``weight_map`` maps names to file names in the
    same directory (no path separators), without duplicate names.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the first problem, in one line starting with the path.

    >>> import json, tempfile
    >>> p = Path(tempfile.mkdtemp()) / SAFE_INDEX
    >>> _ = p.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    >>> read_index(p).files
    ['model-00001-of-00001.safetensors']
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: not an index file: it is a directory.")
    size = path.stat().st_size
    if size > MAX_INDEX_BYTES:  # (Before reading it.)
        raise ValueError(f"{path}: not an index file: {size} bytes, over {MAX_INDEX_BYTES}.")

    data = loads(path.read_bytes(), what=f"{path}: the Hugging Face index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(
            f"{path}: not a Hugging Face index: expected a JSON object with a 'weight_map' of "
            "tensor names to shard files."
        )
    for name, file in weight_map.items():
        if not isinstance(file, str) or file in ("", ".", "..") or "/" in file or "\\" in file:
            raise ValueError(
                f"{path}: 'weight_map' maps {name!r} to {file!r}, not a file name in the "
                "index's directory."
            )
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}: 'metadata' must be a JSON object, got {metadata!r}.")
    return HFIndex(path, dict(weight_map), dict(metadata))


@dataclass(frozen=True)
class HFWeights:
    """Where a Hugging Face directory keeps its weights.

    Attributes:
      directory: the directory.
      flavour: ``"safetensors"``, ``"bin"`` or ``"msgpack"``.
      index: the index file, ``None`` for one weights file.
      files: the weight files, in order.
      config: ``config.json``, ``None`` when the directory has none.
    """

    directory: Path
    flavour: str
    index: Path | None
    files: tuple[Path, ...]
    config: Path | None

    def model_files(self) -> ModelFiles:
        """The directory's other files: those that travel with the weights, and the rest."""
        return model_files(self.directory, {*self.files, *([self.index] if self.index else [])})


#: The files of a model directory that travel with its weights (config, generation
#: config, tokenizer, preprocessor), by name or ``fnmatch`` pattern.
MODEL_ASSETS = (
    CONFIG_FILE,
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "feature_extractor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab.*",
    "vocab-*",
    "merges.txt",
    "*.model",  # SentencePiece: spiece.model, sentencepiece.bpe.model, tokenizer.model
    "*.spm",  # Marian's source.spm, target.spm
    "*.tiktoken",
)


@dataclass(frozen=True)
class ModelFiles:
    """The files of a model directory besides its weights.

    Attributes:
      assets: ``{file name: path}`` of the files that travel with the weights
        (:data:`MODEL_ASSETS`), sorted by name: regular files (a link to one, as
        in the Hugging Face cache, too), copied byte for byte, never parsed.
      other: the names of everything else beside the weights (``README.md``, a
        ``modeling_*.py``, subdirectories): listed, never read, run or carried.
    """

    assets: Mapping[str, Path]
    other: tuple[str, ...]


def model_files(directory: Path, weights: Collection[Path] = ()) -> ModelFiles:
    """The assets and other files of ``directory`` (its top level), ``weights``
    (and index files) left out.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> for name in ("config.json", "tokenizer.json", "README.md", "model.safetensors"):
    ...     _ = (d / name).write_text("{}")
    >>> files = model_files(d, [d / "model.safetensors"])
    >>> list(files.assets), files.other
    (['config.json', 'tokenizer.json'], ('README.md',))
    """
    assets: dict[str, Path] = {}
    other: list[str] = []
    weights = {Path(w).name for w in weights}
    for path in sorted(directory.iterdir()):
        name = path.name
        if name in weights or name.startswith("."):
            continue
        if path.is_file() and any(fnmatch.fnmatchcase(name, p) for p in MODEL_ASSETS):
            assets[name] = path
        else:
            other.append(name + ("/" if path.is_dir() else ""))
    return ModelFiles(assets, tuple(other))


def _flavour(name: str) -> str:
    for flavour in ("bin", "msgpack"):
        if name.endswith((f".{flavour}", f".{flavour}{INDEX_SUFFIX}")):
            return flavour
    return "safetensors"


def hf_weights(path: str | os.PathLike) -> HFWeights:
    """The weights of the Hugging Face directory ``path`` (or of the directory
    of the index file ``path``): safetensors, then ``.bin``, then Flax
    ``.msgpack``, as a PyTorch loader prefers; within each, an index before a
    single file.

    Raises:
      FileNotFoundError: no such path.
      ValueError: no weights, an unreadable index, or an index that lists a
        file the directory lacks (one line naming them).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    config = (path.parent if path.is_file() else path) / CONFIG_FILE
    config_file = config if config.is_file() else None
    if path.is_file():
        if not path.name.endswith(INDEX_SUFFIX):
            raise ValueError(f"{path}: not a Hugging Face index file (*{INDEX_SUFFIX}).")
        directory, index = path.parent, path
    else:
        directory = path
        found = [path / n for n in _WEIGHT_FILES]
        found = [p for p in found if p.is_file()]
        if found and not found[0].name.endswith(INDEX_SUFFIX):
            single = found[0]
            return HFWeights(directory, _flavour(single.name), None, (single,), config_file)
        if found:
            index = found[0]
        else:
            others = sorted(p.name for p in path.glob(f"*{INDEX_SUFFIX}"))
            if len(others) != 1:
                raise ValueError(
                    f"{path}: no Hugging Face weights: expected {SAFE_WEIGHTS}, {SAFE_INDEX}, "
                    f"{BIN_WEIGHTS}, {BIN_INDEX}, {FLAX_WEIGHTS} or {FLAX_INDEX}"
                    + (f" (found index files {others}; pass the one to read)" if others else "")
                    + "."
                )
            index = path / others[0]
    parsed = read_index(index)
    if not parsed.weight_map:
        raise ValueError(f"{index}: the index lists no tensors.")
    missing = [f for f in parsed.files if not (directory / f).is_file()]
    if missing:
        raise ValueError(
            f"{index}: lists shard(s) {missing[:3]}"
            + (f" ... ({len(missing)} missing)" if len(missing) > 3 else "")
            + f" that {directory} does not hold; the directory is incomplete (copy every shard)."
        )
    suffixes = {_flavour(f) for f in parsed.files}
    if len(suffixes) != 1:
        kinds = ", ".join(f".{s}" for s in sorted(suffixes))
        raise ValueError(f"{index}: lists shards of several kinds ({kinds}); expected one kind.")
    files = tuple(directory / f for f in parsed.files)
    return HFWeights(directory, suffixes.pop(), index, files, config_file)


def is_hf_directory(path: Path) -> bool:
    """Whether ``path`` is a directory holding Hugging Face weights (a
    ``config.json``, or the standard weights or index files)."""
    if not path.is_dir():
        return False
    return any((path / name).is_file() for name in (CONFIG_FILE, *_WEIGHT_FILES))


def is_adapter_directory(path: Path) -> bool:
    """Whether ``path`` is a PEFT adapter directory, from its file names alone (an
    ``adapter_config.json``): read by ``bridge.read_adapter``, not as a model.

    >>> is_adapter_directory(Path("/nonexistent"))
    False
    """
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file()


def is_hf_input(path: Path) -> bool:
    """Whether ``path`` names a Hugging Face directory: the directory itself (see
    :func:`is_hf_directory`), its ``*.index.json`` or its ``config.json``."""
    if path.is_file():
        return path.name.endswith(INDEX_SUFFIX) or (
            path.name == CONFIG_FILE and is_hf_directory(path.parent)
        )
    return is_hf_directory(path)


def shard_of(path: str | os.PathLike) -> Path | None:
    """The index file that lists the weights file ``path`` as one shard among
    several (reading it alone would drop the rest of the model), or ``None``.

    An unreadable index beside it is no evidence either way (``None``).
    """
    path = Path(path)
    for index in sorted(path.parent.glob(f"*{INDEX_SUFFIX}")):
        try:
            files = set(read_index(index).weight_map.values())
        except (OSError, ValueError):
            continue
        if path.name in files and len(files) > 1:
            return index
    return None


def check_not_a_shard(path: str | os.PathLike) -> None:
    """Refuses a weights file that is one shard of several (see :func:`shard_of`).

    Raises:
      ValueError: one line naming the index and the directory to open instead.
    """
    index = shard_of(path)
    if index is not None:
        n = len(read_index(index).files)
        raise ValueError(
            f"{path}: one shard of the {n} that {index.name} lists; alone it holds only part "
            f"of the model. Open the directory {index.parent} (or the index {index}) instead."
        )
    m = _SHARD_NAME.search(Path(path).name)
    if (
        m is not None
        and int(m.group(2)) > 1
        and not any(Path(path).parent.glob(f"*{INDEX_SUFFIX}"))
    ):
        raise ValueError(
            f"{path}: named as shard {int(m.group(1))} of {int(m.group(2))}, but no index "
            f"(*{INDEX_SUFFIX}) beside it lists the shards; alone it holds only part of the "
            "model. Open the directory holding every shard and its index."
        )


def _is_output(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and any((path / n).is_file() for n in _WEIGHT_FILES)


#: A Hugging Face directory output, for ``atomic_output``: ``force`` replaces only
#: a directory holding a ``config.json`` and Hugging Face weights.
HF_DIRECTORY = OutputKind("a Hugging Face model directory", True, _is_output)
