"""``open_source``: the one answer to "what is this path", as a ``TensorSource``.

Every conversion, report and check reads its input through a source: names,
shapes, dtypes and ties first (no tensor read), then one tensor at a time.
:func:`open_source` decides what a path is, in this order:

- an Orbax checkpoint: an item, a ``CheckpointManager`` step holding one, or a
  manager root, which is refused naming its steps (``jaxshare.checkpoint``;
  JAX and Orbax are imported only then);
- a Hugging Face directory, its ``*.index.json`` or its ``config.json``
  (:class:`bridge.HFDirectory`), a Flax model's ``flax_model.msgpack`` directory
  included;
- a DeepSpeed checkpoint folder (:class:`jaxshare.formats.DeepSpeedCheckpoint`);
- a weights file, ``.safetensors``, ``.pt``/``.bin``/``.pth`` or a Flax
  ``.msgpack`` (:func:`jaxshare.formats.open_weights_file`), unless an index beside it lists it
  as one shard of several;

and in memory, a source as it is, or a torch module or state dict
(``StateDictSource``). Only that last kind needs torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.layouts.rules import Rules, as_rules
from jaxshare.formats import (
    CONFIG_FILE,
    INDEX_SUFFIX,
    WEIGHT_SUFFIXES,
    DCPFolder,
    is_checkpoint,
    is_dcp_folder,
    open_weights_file,
)
from jaxshare.internal import UsageError, check_not_a_shard, is_hf_directory
from jaxshare.stream import TensorSource

__all__ = ["EXPECTED", "Source", "is_deepspeed_folder", "open_source", "opened"]

if TYPE_CHECKING:
    import torch

    #: What :func:`open_source` takes (for the type checker; torch types stay behind it).
    Source = torch.nn.Module | Mapping[str, torch.Tensor] | str | os.PathLike | TensorSource

#: What a path may be, for the one error that lists it.
EXPECTED = (
    "an Orbax checkpoint, a Hugging Face, DeepSpeed or PyTorch DCP directory, a Hugging Face index "
    f"(*{INDEX_SUFFIX}) or a weights file ({', '.join(WEIGHT_SUFFIXES)})"
)


def is_deepspeed_folder(path: Path) -> bool:
    """Whether ``path`` looks like a DeepSpeed checkpoint: a folder holding ``latest``,
    or a tag folder holding model-states files."""
    return path.is_dir() and ((path / "latest").is_file() or any(path.glob("*model_states.pt")))


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
        return _open_path(Path(what), rules)
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


def _open_path(path: Path, rules: Rules) -> TensorSource:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory.")
    if is_dcp_folder(path):
        return DCPFolder(path)
    if is_checkpoint(path):
        from jaxshare import checkpoint  # (JAX and Orbax)

        return checkpoint.open_source(path)
    hf_file = path.is_file() and (
        path.name.endswith(INDEX_SUFFIX)
        or (path.name == CONFIG_FILE and is_hf_directory(path.parent))
    )
    if hf_file or (is_hf_directory(path) and not is_deepspeed_folder(path)):
        from bridge.hf.directory import HFDirectory

        return HFDirectory(path.parent if path.name == CONFIG_FILE else path, rules=rules)
    if is_deepspeed_folder(path):
        from jaxshare.formats import DeepSpeedCheckpoint

        return DeepSpeedCheckpoint(path)
    if path.is_file() and path.suffix in WEIGHT_SUFFIXES:
        check_not_a_shard(path)  # One shard of several is not the model.
        return open_weights_file(path)
    found = "a directory" if path.is_dir() else f"a {path.suffix or 'suffix-less'} file"
    raise UsageError(f"{path}: expected {EXPECTED}; found {found}.")
