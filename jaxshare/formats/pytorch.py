"""PyTorch files (``torch.save`` output), read with numpy only and never running pickle code.

``torch.save`` writes a zip archive (since torch 1.6), or, before, a run of
pickles followed by the storages' bytes (the legacy format). Either way a pickle
can run any code when loaded: :func:`unpickle_torch_file` maps the file and
unpickles it with the restricted unpickler of the ``torch.save`` core
(:mod:`jaxshare.formats.torch_save.unpickle`), which rebuilds tensors as numpy
views of the file's memory (no copy), allows the classes the caller maps to inert
stand-ins (``classes=``: the DeepSpeed reader's, see
:mod:`jaxshare.formats.deepspeed.files`), and refuses every other global in one
line naming it, so the file's code never runs. torch is never imported.

:class:`TorchFile` is a state-dict file as a :class:`jaxshare.stream.TensorSource`:
a tensor stored under several names (one storage) is a tie, and so is a
permuted view of another tensor's storage (what ``bridge.save_torch`` writes
for a tie whose axis orders differ).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.memory import MemoryTies, array_key, memory_ties
from jaxshare.core.report import SHARED_PARAMS, STORAGE, ArrayInfo
from jaxshare.formats.torch_save.unpickle import unpickle_torch, unpickling
from jaxshare.formats.torch_save.zip import EMPTY_ARCHIVE, LOCAL_HEADER
from jaxshare.io.atomic import OutputKind
from jaxshare.io.mapped import FileRange, file_extent, map_file
from jaxshare.io.source import Index, RecordedTie, TensorSource, file_part

__all__ = [
    "TORCH_FILE",
    "TORCH_SUFFIXES",
    "TorchFile",
    "check_torch_file",
    "looks_like_torch_file",
    "recorded_shared_params",
    "state_dict_in",
    "state_dict_ties",
    "unpickle_torch_file",
]

#: Suffixes of PyTorch pickle/zip weight files.
TORCH_SUFFIXES = (".pt", ".bin", ".pth")


def looks_like_torch_file(path: str | os.PathLike) -> bool:
    """Whether the file starts like ``torch.save`` output: a zip archive or a
    pickle stream (protocol 2 or higher, as torch writes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if head.startswith((LOCAL_HEADER, EMPTY_ARCHIVE)):
        return True
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def check_torch_file(path: str | os.PathLike) -> None:
    """Raises unless ``path`` looks like a PyTorch file.

    A file that is neither a zip archive nor a pickle stream is not a PyTorch
    file whatever its suffix says, and is refused as such before anything reads
    it: random bytes or a JSON file named ``.bin`` are not "a pickle that would
    run code".

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line: the file is not a PyTorch zip or pickle file.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/w.bin"
    >>> _ = Path(path).write_text('{"not": "weights"}')
    >>> check_torch_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...w.bin: not a PyTorch/zip/pickle file (it starts with b'{"no'...
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: expected a PyTorch weights file, found a directory.")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if not looks_like_torch_file(path):
        with open(path, "rb") as f:
            head = f.read(4)
        found = "an empty file" if not head else f"it starts with {head!r}"
        raise ValueError(
            f"{path}: not a PyTorch/zip/pickle file ({found}); expected the output of `torch.save`."
        )


#: A ``.pt``/``.bin`` output, for ``force``: replaces only a PyTorch file.
TORCH_FILE = OutputKind("a PyTorch weights file", False, looks_like_torch_file)


Mode = Literal["read", "copy-on-write", "memory"]


def unpickle_torch_file(
    path: str | os.PathLike,
    /,
    *,
    classes: Mapping[str, type] | None = None,
    mode: Mode = "read",
    fix: str = "if you trust this file, load it yourself and pass the state dict",
) -> Any:
    """A ``torch.save`` file (zip or legacy), unpickled with the restricted
    unpickler (:mod:`jaxshare.formats.torch_save.unpickle`): tensors as numpy
    arrays over the file's memory,
    ``classes`` (fully-qualified name -> stand-in) allowed too, anything else
    refused.

    Args:
      path: the file.
      classes: more globals to allow, each mapped to a stand-in of the caller's.
      mode: where the tensors' memory is: ``"read"`` (default), read-only views
        of the mapped file; ``"copy-on-write"``, writable views of a private map
        (writes never reach the file, as ``torch.load(mmap=True)``);
        ``"memory"``, the file read into memory of its own.
      fix: what a refusal suggests doing instead.

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line naming the file: not a PyTorch file, damaged, or
        refused (a global not allowed, anything that would run code), with the
        reason.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "evil.pt"
    >>> _ = path.write_bytes(b"\\x80\\x02cposix\\nsystem\\nX\\x02\\x00\\x00\\x00ls\\x85R.")
    >>> unpickle_torch_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...evil.pt: refused: loading it would run code ... GLOBAL posix.system)...
    """
    path = Path(path)
    check_torch_file(path)
    with unpickling(
        lambda why: (
            f"{path}: refused: loading it would run code beyond rebuilding tensors "
            f"({why}). jaxshare reads PyTorch files with its own restricted unpickler; {fix}."
        ),
        lambda why: f"{path}: not a PyTorch file jaxshare can read ({why}).",
    ):
        if mode == "memory":
            data = np.fromfile(path, np.uint8)
        else:
            data = map_file(path, private=mode == "copy-on-write")
        return unpickle_torch(data, classes or {}, file=path)


# -- state-dict files ------------------------------------------------------------------


def state_dict_in(
    path: Path, obj: Any
) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """The state dict a PyTorch file holds, and the ties it records: ``(state,
    applied, unapplied)``, each tie ``{alias: canonical}``.

    A DeepSpeed checkpoint (``{"module": state_dict, "shared_params": ...}``)
    gives its ``module``, with each name DeepSpeed recorded as shared and did not
    store added back as its canonical's array (``{alias: canonical}``, the second
    value); a name the file stores is kept as stored, since DeepSpeed's walk can
    be wrong (the tie is then unapplied, for ``check`` to hold against the values).
    A consolidated ``zero_to_fp32`` file is a plain state dict.

    Raises:
      ValueError: the file holds no state dict, or a recorded tie names a
        canonical it lacks or a zero-size one.
    """
    recorded = recorded_shared_params(obj)
    if isinstance(obj, Mapping) and isinstance(obj.get("module"), Mapping):  # DeepSpeed
        obj = obj["module"]
    if not isinstance(obj, Mapping) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    ):
        what = (
            f"a dict with keys {list(obj)[:8]}" if isinstance(obj, Mapping) else type(obj).__name__
        )
        raise ValueError(
            f"{path}: expected a state dict (names -> tensors) or a DeepSpeed checkpoint "
            f"with a 'module' state dict, found {what}; extract the state dict and pass it."
        )
    state = dict(obj)
    ties: dict[str, str] = {}
    unapplied = {a: c for a, c in recorded.items() if a in state}
    for alias, canonical in recorded.items():
        if alias in unapplied:
            continue  # What the file stores is the truth.
        if canonical not in state or state[canonical].size == 0:
            raise ValueError(
                f"{path}: DeepSpeed's shared_params ties {alias!r} to {canonical!r}, "
                + (
                    "which the file does not hold."
                    if canonical not in state
                    else "a zero-size tensor; DeepSpeed keys by data_ptr(), 0 for every zero-size "
                    f"tensor, so this tie is not real and the shape of {alias!r} is unknown."
                )
            )
        state[alias] = state[canonical]
        ties[alias] = canonical
    return state, ties, unapplied


def recorded_shared_params(obj: Any) -> dict[str, str]:
    """DeepSpeed's ``shared_params`` (``{alias: canonical}``) as the unpickled
    checkpoint ``obj`` records it, its string entries; none for any other file."""
    if isinstance(obj, Mapping) and isinstance(obj.get("module"), Mapping):
        found = obj.get("shared_params")
        if isinstance(found, Mapping):
            return {a: c for a, c in found.items() if isinstance(a, str) and isinstance(c, str)}
    return {}


def state_dict_ties(state: Mapping[str, np.ndarray]) -> MemoryTies:
    """The ties of a state dict read from a file: names over one storage (or one
    object, for a zero-size tensor), and permuted views of another tensor's
    storage (an alias with that permutation). Tensors whose memory overlaps
    otherwise are not tied: each is stored as it is."""
    return memory_ties({name: array_key(a) for name, a in state.items()}, views=True)


class TorchFile(TensorSource):
    """A ``.pt``/``.bin``/``.pth`` state-dict file, read without torch: a
    :class:`~jaxshare.stream.TensorSource` whose tensors are views of the mapped
    file (read only when touched).

    The ties are the tensors over one memory: a storage stored under several
    names (origin :data:`~jaxshare.core.report.STORAGE`), a permuted view of
    another tensor (an alias with that permutation), and the aliases a DeepSpeed
    file records in ``shared_params`` (origin
    :data:`~jaxshare.core.report.SHARED_PARAMS`).

    Attributes:
      state: ``{name: array}`` of every name, aliases included.

    Raises:
      FileNotFoundError, ValueError: as :func:`unpickle_torch_file`, or the file
        holds no state dict.

    >>> import tempfile, torch
    >>> w = torch.arange(6.0).reshape(2, 3)
    >>> path = tempfile.mkdtemp() + "/m.pt"
    >>> torch.save({"wte.weight": w, "lm_head.weight": w, "proj.weight": w.t()}, path)
    >>> with TorchFile(path) as f:
    ...     print(dict(f.ties), f.ties.transforms)
    ...     print(f.array("proj.weight").tolist())
    {'lm_head.weight': 'wte.weight', 'proj.weight': 'wte.weight'} {'proj.weight': (1, 0)}
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """

    mapped = True  # blocks are views of the mapped file
    kind = "torch"

    def __init__(self, path: str | os.PathLike, /) -> None:
        path = Path(path)
        self._load(path, unpickle_torch_file(path))

    def _load(self, path: Path, obj: Any) -> None:
        """Reads the state dict in ``obj``, unpickled from ``path``, and its ties."""
        self.path = path
        self.state, recorded, unapplied = state_dict_in(path, obj)
        self.infos = {k: ArrayInfo(tuple(a.shape), a.dtype.name) for k, a in self.state.items()}
        found = state_dict_ties(self.state)
        self.ties = AliasMap(found.aliases, transforms=found.transforms)
        self.origins = {a: SHARED_PARAMS if a in recorded else STORAGE for a in self.ties}
        self.unapplied_ties = tuple(RecordedTie(a, c, SHARED_PARAMS) for a, c in unapplied.items())
        self.parts = (file_part(path, len(self.state)),)

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset()  # A tie is one storage: its names share one memory.

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        try:
            return self.state[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}.") from None

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return np.array(self.array(name)[index])

    def extents(self, name: str) -> Sequence[FileRange]:
        found = file_extent(self.array(name))
        return () if found is None else (found,)

    def close(self) -> None:
        self.state = {}
