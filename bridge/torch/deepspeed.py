"""DeepSpeed ZeRO folders as torch tensors: ``jaxshare.formats.DeepSpeedCheckpoint``'s
reader, handing out tensors.

The folder is read by the numpy reader of ``jaxshare.formats`` (no deepspeed,
no torch, no pickle code run); this door only turns what it assembles into
torch tensors, for code that wants the state dict ``zero_to_fp32`` gives.
"""

from __future__ import annotations

import os

import torch

from bridge.torch.tensors import to_tensor
from jaxshare import formats

__all__ = ["DeepSpeedCheckpoint", "load_deepspeed"]


class DeepSpeedCheckpoint(formats.DeepSpeedCheckpoint):
    """A DeepSpeed checkpoint folder (see :class:`jaxshare.formats.DeepSpeedCheckpoint`)
    whose :meth:`read`, :meth:`items` and :meth:`state_dict` give torch tensors;
    :meth:`array` and :meth:`pieces` still give numpy.

    >>> import pathlib, bridge
    >>> FIXTURES = pathlib.Path(bridge.__file__).parents[1] / "tests/data/deepspeed"
    >>> with DeepSpeedCheckpoint(FIXTURES / "gpt2_z3_w2_fp32") as ckpt:
    ...     w = ckpt.read("transformer.wte.weight")
    >>> w.shape, w.dtype
    (torch.Size([31, 9]), torch.float32)
    """

    def read(self, name: str, /) -> torch.Tensor:
        """:meth:`array` as a torch tensor over its memory.

        Raises:
          KeyError: no such name.
        """
        return to_tensor(self.array(name), key=name)


def load_deepspeed(
    path: str | os.PathLike, /, *, tag: str | None = None
) -> dict[str, torch.Tensor]:
    """The full state dict of a DeepSpeed checkpoint folder, equal bit for bit to
    DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``, without deepspeed
    and without running pickle code.

    Each alias in the checkpoint's ``shared_params`` is the very tensor object of
    its canonical. For one tensor at a time, use :class:`DeepSpeedCheckpoint`.

    Args:
      path: the folder ``engine.save_checkpoint`` was given, or a tag folder.
      tag: the tag folder under ``path``; default: ``latest``'s.

    Raises:
      FileNotFoundError: no such folder.
      ValueError: not a DeepSpeed checkpoint, or a file is refused or unreadable.

    >>> import pathlib, bridge
    >>> FIXTURES = pathlib.Path(bridge.__file__).parents[1] / "tests/data/deepspeed"
    >>> sd = load_deepspeed(FIXTURES / "t5_z3_w2_bf16")
    >>> sd["lm_head.weight"] is sd["encoder.embed_tokens.weight"] is sd["shared.weight"]
    True
    """
    with DeepSpeedCheckpoint(path, tag=tag) as ckpt:
        return ckpt.state_dict()
