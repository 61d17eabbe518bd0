"""``open_source``: the one answer to "what is this input", as a ``TensorSource``.

Every conversion, report and check reads its input through a source: names,
shapes, dtypes and ties first (no tensor read), then one tensor at a time.
:data:`READERS` is the registry: every kind of input, in the order a path is
tried, each a :class:`jaxshare.formats.Reader` that knows itself (whether a path
is its kind, how to open it, what it records, its training state):

- an Orbax checkpoint (:data:`jaxshare.checkpoint.READER`): an item, a
  ``CheckpointManager`` step holding one, or a manager root, which is refused
  naming its steps (TensorStore is imported only then);
- the formats' own (:data:`jaxshare.formats.READERS`): a PyTorch DCP directory, a
  DeepSpeed directory, a ``.safetensors``, PyTorch or Flax ``.msgpack`` file
  (unless an index beside it lists it as one shard of several);
- a Hugging Face directory, its ``*.index.json`` or its ``config.json``
  (:class:`bridge.HFDirectory`), a Flax model's ``flax_model.msgpack`` directory
  included.

In memory, a source is taken as it is, and a torch module or state dict is a
``StateDictSource`` (only that kind needs torch). :func:`open_training` opens
an input's training state through the same readers.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.hf.reader import READER as HF_READER
from bridge.layouts.rules import Rules, as_rules
from jaxshare import checkpoint, formats
from jaxshare.formats import Reader
from jaxshare.internal import UsageError
from jaxshare.stream import TensorSource

__all__ = [
    "READERS",
    "expected",
    "find_reader",
    "open_source",
    "open_training",
    "opened",
    "reader_of",
]

if TYPE_CHECKING:
    import torch

    from jaxshare.formats import TrainingState

    #: What :func:`open_source` takes (for the type checker; torch types stay behind it).
    Source = torch.nn.Module | Mapping[str, torch.Tensor] | str | os.PathLike | TensorSource

#: Every kind of input a path may be, in the order they are tried.
READERS: tuple[Reader, ...] = (checkpoint.READER, *formats.READERS, HF_READER)


def expected(readers: tuple[Reader, ...] = READERS) -> str:
    """What a path may be, as the one error that lists it says.

    >>> expected(READERS[-2:])
    'a Flax .msgpack file or a Hugging Face directory (or its *.index.json)'
    """
    whats = [r.what for r in readers]
    return whats[0] if len(whats) == 1 else f"{', '.join(whats[:-1])} or {whats[-1]}"


def find_reader(path: str | os.PathLike) -> Reader | None:
    """The first of :data:`READERS` that accepts ``path``; ``None`` where none does
    (or nothing is there)."""
    path = Path(path)
    return next((reader for reader in READERS if reader.accepts(path)), None)


def reader_of(path: str | os.PathLike) -> Reader:
    """The reader of the input at ``path``: the first of :data:`READERS` that
    accepts it.

    Raises:
      FileNotFoundError: no such path.
      UsageError: a path of no kind jaxshare reads (one line listing the kinds).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> save_file({"w": np.zeros(2, np.float32)}, path)
    >>> reader_of(path).name
    'safetensors'
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    reader = find_reader(path)
    if reader is not None:
        return reader
    raise UsageError(f"{path}: expected {expected()}; found {_found(path)}.")


def open_source(
    what: Any, rules: Rules | None = None, *, arg: str = "state_dict_or_module"
) -> TensorSource:
    """The :class:`~jaxshare.stream.TensorSource` for ``what``.

    Args:
      what: a source already; a ``torch.nn.Module`` or state dict; or a path (see
        the module docstring for the kinds, tried in order). Files are mapped and
        read lazily; pickled files by jaxshare's restricted unpickler, never
        running their code.
      rules: the naming rules (their layer table types a module's layers and a
        Hugging Face model class's).
      arg: the argument's name, for messages.

    Raises:
      FileNotFoundError: no such path.
      UsageError: a path of no kind jaxshare reads (the one line lists them).
      ValueError: an unreadable input, one line naming it.
      TypeError: anything else.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> save_file({"wte.weight": np.zeros((4, 2), np.float32)}, path)
    >>> with open_source(path) as source:
    ...     source.kind, source.infos["wte.weight"].shape
    ('safetensors', (4, 2))
    """
    if isinstance(what, TensorSource):
        return what
    rules = as_rules(rules)
    if isinstance(what, (str, os.PathLike)):
        return reader_of(what).open(Path(what), rules=rules)
    torch = sys.modules.get("torch")  # (A module exists only once torch is imported.)
    if isinstance(what, Mapping) or (torch is not None and isinstance(what, torch.nn.Module)):
        from bridge.torch.state_dict import StateDictSource  # (torch: tensors in memory)

        return StateDictSource(what, rules, arg=arg)
    raise TypeError(
        f"`{arg}` must be a path, a torch.nn.Module, a state dict or a "
        f"jaxshare.stream.TensorSource, got {type(what).__name__}."
    )


@contextlib.contextmanager
def opened(
    what: Any, rules: Rules | None = None, *, arg: str = "state_dict_or_module"
) -> Iterator[TensorSource]:
    """:func:`open_source` of ``what`` for a ``with`` block, closed at its end if it
    was opened here (a source given as one stays the caller's to close)."""
    source = open_source(what, rules, arg=arg)
    try:
        yield source
    finally:
        if source is not what:
            source.close()


def open_training(source: Any, rules: Rules | None = None) -> TrainingState:
    """The weights and the optimizer state of a training checkpoint: a path, read by
    its reader (a ``torch.save`` of ``{"model": ..., "optimizer": ...}``, a DeepSpeed
    or DCP folder), or ``(model_or_state_dict, optimizer_or_its_state_dict)`` in
    memory. Metadata only: no tie is checked by content here.

    Raises:
      FileNotFoundError: no such path.
      ValueError: a path of a kind that holds no training state (one line listing
        those that do), or as the reader says.
      TypeError: anything else.
    """
    if isinstance(source, tuple) and len(source) == 2:
        from bridge.torch.optimizer import training_in_memory  # (torch objects)
        from jaxshare.formats import TrainingState

        return TrainingState(*training_in_memory(*source, as_rules(rules)))
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            "`source` must be a path (a torch.save run file, a DeepSpeed or DCP folder) or a "
            "pair (model_or_state_dict, optimizer_or_its_state_dict), got "
            f"{type(source).__name__}."
        )
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    reader = find_reader(path)
    if reader is None or reader.open_training is None:
        training = expected(tuple(r for r in READERS if r.open_training is not None))
        raise ValueError(
            f"{path}: expected a training checkpoint -- {training} holding a model's and an "
            f"optimizer's state -- found {_found(path)}."
        )
    return reader.open_training(path)


def _found(path: Path) -> str:
    """What ``path`` is, for an error that says what was expected instead."""
    if formats.is_adapter_directory(path):
        return (
            "a PEFT adapter directory, not a model: merge it into its base with `jaxshare "
            "merge BASE ADAPTER OUT`, or read it with bridge.read_adapter / adapter_to_flax"
        )
    return "a directory" if path.is_dir() else f"a {path.suffix or 'suffix-less'} file"
