"""DeepSpeed's files: what the files of a checkpoint folder are called, and how one
is read without deepspeed or torch.

``engine.save_checkpoint(root)`` writes ``root/latest`` (:data:`LATEST`, naming the
tag, e.g. ``global_step3``) and a tag folder holding the model states
(:data:`MODEL_STATES`, or one :data:`ZERO3_MODEL_STATES` per rank under ZeRO-3)
and, under ZeRO-1/2/3, one optimizer file per rank (:data:`OPTIM_STATES`). Each
is a ``torch.save`` pickle, which :func:`load_deepspeed_file` reads with the
restricted unpickler of the ``torch.save`` core and DeepSpeed's four classes as
inert stand-ins (:data:`STAND_INS`). Every reader of DeepSpeed folders
(:mod:`~jaxshare.formats.deepspeed.checkpoint`,
:mod:`~jaxshare.formats.deepspeed.training`, ``open_source``, ``check``) knows the
files by these names.
"""

from __future__ import annotations

import enum
import os
import pickle
import re
from pathlib import Path
from typing import Any

from jaxshare.formats.pytorch import unpickle_torch_file

__all__ = [
    "LATEST",
    "MODEL_STATES",
    "MODEL_STATES_GLOB",
    "OPTIM_STATES",
    "OPTIM_STATES_NAME",
    "STAND_INS",
    "ZERO3_MODEL_STATES",
    "ZERO3_MODEL_STATES_NAME",
    "FragmentAddress",
    "LossScalerState",
    "ZeroStage",
    "is_deepspeed_folder",
    "load_deepspeed_file",
    "tag_folder",
    "unsupported_parallelism",
]

#: The file beside the tag folders that names the last one saved.
LATEST = "latest"
#: The model states of ZeRO-0/1/2 (tensor-parallel rank 0).
MODEL_STATES = "mp_rank_00_model_states.pt"
#: Each data-parallel rank's model states under ZeRO-3, as a pattern and as messages name it.
ZERO3_MODEL_STATES = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt")
ZERO3_MODEL_STATES_NAME = "zero_pp_rank_R_mp_rank_00_model_states.pt"
#: Any model-states file (of any stage or parallelism).
MODEL_STATES_GLOB = "*model_states.pt"
#: Each data-parallel rank's optimizer file under ZeRO-1/2/3 (``bf16_`` under the bf16
#: optimizer), as a pattern and as messages name it.
OPTIM_STATES = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
OPTIM_STATES_NAME = "zero_pp_rank_R_mp_rank_00_optim_states.pt"
#: What a tag may be: a name inside the folder.
_TAG = re.compile(r"[^/\\\x00]+")
#: file name prefixes of the parallelisms zero_to_fp32 cannot consolidate either
_UNSUPPORTED = {"layer_": "a pipeline-parallel", "expp_rank_": "an expert-parallel (MoE)"}


def is_deepspeed_folder(path: str | os.PathLike, /) -> bool:
    """Whether ``path`` looks like a DeepSpeed checkpoint: a folder holding
    ``latest``, or a tag folder holding model-states files. Looks at names only.

    >>> import pathlib, jaxshare
    >>> DATA = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/deepspeed"
    >>> root, tag = DATA / "gpt2_z3_w2_fp32", DATA / "gpt2_z3_w2_fp32/global_step2"
    >>> is_deepspeed_folder(root), is_deepspeed_folder(tag), is_deepspeed_folder(DATA)
    (True, True, False)
    """
    path = Path(path)
    return path.is_dir() and ((path / LATEST).is_file() or any(path.glob(MODEL_STATES_GLOB)))


def tag_folder(path: Path, tag: str | None) -> tuple[Path, str]:
    """``(folder, tag)``: the tag folder to read under ``path`` (``tag``, else the one
    ``latest`` names), or ``path`` itself when it holds no ``latest`` and no ``tag``
    is given (a tag folder).

    Raises:
      FileNotFoundError: no folder ``path``, or no such tag folder in it.
      ValueError: ``latest`` names no folder beside it.
    """
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: no such folder; expected a DeepSpeed checkpoint folder (the one "
            "`engine.save_checkpoint` was given, holding `latest`) or one of its tag folders."
        )
    if tag is None and (path / LATEST).is_file():
        tag = (path / LATEST).read_text(errors="replace").strip()
        if not _TAG.fullmatch(tag) or tag in (".", ".."):
            raise ValueError(
                f"{path / LATEST}: expected the name of a tag folder beside it, found {tag!r}."
            )
    if tag is None:
        return path, path.name
    folder = path / tag
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: no such tag folder; the tags in {path} are "
            f"{sorted(p.name for p in path.iterdir() if p.is_dir())}."
        )
    return folder, tag


def unsupported_parallelism(name: str) -> str | None:
    """The parallelism a file named ``name`` belongs to if ``zero_to_fp32`` cannot
    consolidate it either (``"a tensor-parallel"``, ``"a pipeline-parallel"``, ...);
    ``None`` for a data-parallel file.

    >>> unsupported_parallelism("layer_01-model_00-model_states.pt")
    'a pipeline-parallel'
    >>> unsupported_parallelism(MODEL_STATES) is None
    True
    """
    kind = next((v for k, v in _UNSUPPORTED.items() if name.startswith(k)), None)
    mp = re.search(r"mp_rank_(\d+)", name)
    if mp and int(mp[1]) != 0:
        kind = "a tensor-parallel"
    return kind


# -- DeepSpeed's classes, as inert stand-ins --------------------------------------------


class ZeroStage(enum.IntEnum):
    """Stand-in for ``deepspeed.runtime.zero.config.ZeroStageEnum`` (pickled as
    ``ZeroStageEnum(stage)``; only the values 0-4 load)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 4


class _Inert:
    """A stand-in that keeps the state pickle hands it and does nothing else."""

    __slots__ = ("state",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # DeepSpeed's files rebuild these from attributes only
            raise pickle.UnpicklingError(
                f"{type(self).__name__} is rebuilt from its attributes only; this file calls "
                "it with arguments"
            )
        self.state: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]  # (None, slots) from a class with __slots__
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise pickle.UnpicklingError(
                f"{type(self).__name__} expects a dict of attributes, got {type(state).__name__}"
            )
        self.state = dict(state)

    def __getattr__(self, name: str) -> Any:
        if name == "state":  # not yet set: built by NEWOBJ without __init__
            raise AttributeError(name)
        try:
            return self.state[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.state.items())
        return f"{type(self).__name__}({items})"


class LossScalerState(_Inert):
    """Stand-in for DeepSpeed's ``LossScaler`` and ``DynamicLossScaler``: their
    attributes (``cur_scale``, ``dynamic``, ...), nothing more."""

    __slots__ = ()


class FragmentAddress(_Inert):
    """Stand-in for ``deepspeed.utils.tensor_fragment.fragment_address``
    (``numel``, ``start``: where a parameter's piece lies in a rank's partition)."""

    __slots__ = ()


#: DeepSpeed's fully-qualified class names (as its files spell them) -> stand-in.
STAND_INS: dict[str, type] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": LossScalerState,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": LossScalerState,
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStage,
    "deepspeed.utils.tensor_fragment.fragment_address": FragmentAddress,
}


def load_deepspeed_file(path: str | os.PathLike, /) -> Any:
    """A DeepSpeed checkpoint file (``torch.save`` output), unpickled without torch
    (:func:`jaxshare.formats.unpickle_torch_file`): tensors as read-only numpy
    arrays over the mapped file, DeepSpeed's classes as the inert stand-ins in
    :data:`STAND_INS`, anything else refused.

    Raises:
      ValueError: one line naming the file: not a PyTorch file, damaged, or
        refused (any other class, anything that would run code), with the reason.

    >>> for name in sorted(STAND_INS):  # all that is allowed beyond tensors and containers
    ...     print(name)
    deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
    deepspeed.runtime.fp16.loss_scaler.LossScaler
    deepspeed.runtime.zero.config.ZeroStageEnum
    deepspeed.utils.tensor_fragment.fragment_address
    """
    return unpickle_torch_file(
        path,
        classes=STAND_INS,
        fix="if you trust this file, consolidate it with DeepSpeed's zero_to_fp32",
    )
