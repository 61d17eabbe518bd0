"""The formats' readers, in the order a path is tried: the one table of them.

Each row is a :class:`~jaxshare.formats.Reader` built from what its format's module
defines: the test of a path, imported with the table and cheap (file names only);
the source class and the training state where the format holds one, imported
only when a path of the kind is opened (:func:`~jaxshare.formats.reader.later`),
so asking what a path is costs no reader's code. ``bridge.open_source`` walks this
table, with the Orbax item's reader (:data:`jaxshare.checkpoint.READER`) before it
and the Hugging Face directory's after it; the one error for a path no reader
accepts lists what each reader's ``what`` says. A new format is its module and one
row here (a weights file: and its suffix in
:data:`~jaxshare.formats.weights.WEIGHT_FILES`; see ``docs/architecture.md``,
"Adding a reader").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from jaxshare.formats.dcp.files import is_dcp_folder
from jaxshare.formats.deepspeed.files import is_deepspeed_folder
from jaxshare.formats.hf.files import check_not_a_shard
from jaxshare.formats.msgpack import MsgpackFile
from jaxshare.formats.pytorch import TORCH_SUFFIXES, TorchFile
from jaxshare.formats.reader import Reader, later
from jaxshare.formats.safetensors import SafetensorsFile
from jaxshare.formats.weights import WEIGHT_FILES
from jaxshare.io.source import TensorSource

if TYPE_CHECKING:
    from jaxshare.formats.optim import TrainingState

_DCP, _DEEPSPEED = "jaxshare.formats.dcp", "jaxshare.formats.deepspeed"

__all__ = ["READERS", "file_reader"]


def file_reader(
    name: str,
    what: str,
    opener: Callable[[Path], TensorSource],
    *,
    holds_training: Callable[[Path], bool] | None = None,
    open_training: Callable[[Path], TrainingState] | None = None,
) -> Reader:
    """The reader of one kind of weights file: those whose suffix
    :data:`~jaxshare.formats.weights.WEIGHT_FILES` gives to ``opener``. A file that
    an index beside it lists as one shard of several is refused in one line: alone
    it is not the model (a Hugging Face directory opens its shards itself).

    >>> file_reader("msgpack", "a Flax .msgpack file", MsgpackFile).accepts(Path("w.pt"))
    False
    """
    suffixes = frozenset(s for s, reads in WEIGHT_FILES.items() if reads is opener)
    if not suffixes:
        raise ValueError(f"{opener!r} reads no suffix of WEIGHT_FILES; add it there.")

    def accepts(path: Path) -> bool:
        return path.suffix in suffixes and path.is_file()

    def open_alone(path: Path) -> TensorSource:
        check_not_a_shard(path)
        return opener(path)

    return Reader(
        name,
        what,
        accepts,
        open_alone,
        holds_training=holds_training,
        open_training=open_training,
    )


#: The formats' readers, in the order a path is tried.
READERS: tuple[Reader, ...] = (
    Reader(
        "dcp",
        "a PyTorch DCP directory",
        is_dcp_folder,
        later(f"{_DCP}.reader", "DCPFolder"),
        ties_from_config=True,
        holds_training=later(f"{_DCP}.training", "is_dcp_training_folder"),
        open_training=later(f"{_DCP}.training", "read_dcp_training"),
    ),
    Reader(
        "deepspeed",
        "a DeepSpeed directory",
        is_deepspeed_folder,
        later(f"{_DEEPSPEED}.checkpoint", "DeepSpeedCheckpoint"),
        holds_training=later(f"{_DEEPSPEED}.training", "is_deepspeed_training"),
        open_training=later(f"{_DEEPSPEED}.training", "read_deepspeed_training"),
    ),
    file_reader("safetensors", "a .safetensors file", SafetensorsFile),
    file_reader(
        "torch",
        f"a PyTorch file ({', '.join(TORCH_SUFFIXES)})",
        TorchFile,
        holds_training=later("jaxshare.formats.optim", "is_torch_training_file"),
        open_training=later("jaxshare.formats.optim", "read_torch_training"),
    ),
    file_reader("msgpack", "a Flax .msgpack file", MsgpackFile),
)
