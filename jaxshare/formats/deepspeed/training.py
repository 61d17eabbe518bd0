"""The optimizer state of a DeepSpeed ZeRO checkpoint folder, read without deepspeed.

Under ZeRO-1/2/3 each rank's ``*optim_states.pt`` holds, beside its flat fp32
partitions of the weights, the state of the torch optimizer that DeepSpeed runs
over those partitions: one entry per flat tensor (``exp_avg``, ``exp_avg_sq``, a
``step``), each moment laid out element for element like the partition it
belongs to, and the torch ``param_groups`` with their hyper-parameters.

- ZeRO-1/2: ``base_optimizer_state`` is ``optimizer.state_dict()`` over one flat
  partition per parameter group, shaped like ``single_partition_of_fp32_groups``.
- ZeRO-3: ``optimizer_state_dict`` holds one entry per sub-group (a parameter
  group is one or more sub-groups; ``sub_group_size``), shaped like
  ``fp32_flat_groups``, and each group's ``params`` list its sub-groups.

:func:`read_deepspeed_training` cuts each parameter's moments out of the ranks'
flat tensors partitioned exactly as :class:`~jaxshare.formats.DeepSpeedCheckpoint`
uses for the fp32 masters (``param_shapes`` order, the ranks end to end), so a
moment and its weight always agree. Files are unpickled by the same restricted
unpickler (no pickle code runs), mapped, and tensors assembled only when asked
for. Frozen parameters have no state; a tie is one parameter to DeepSpeed and
has one entry, under its canonical name (the checkpoint's ``ties`` carry the
alias).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxshare.core.report import ArrayInfo
from jaxshare.formats.deepspeed.checkpoint import (
    DeepSpeedCheckpoint,
    Placement,
    describe,
    flat_pieces,
)
from jaxshare.formats.deepspeed.files import MODEL_STATES, OPTIM_STATES, tag_folder
from jaxshare.formats.optim import OptimizerState, ParamGroup, TrainingState
from jaxshare.io.source import Index, TensorSource

__all__ = ["DeepSpeedSlot", "is_deepspeed_training", "read_deepspeed_training"]

#: what ``base_optimizer_state`` / ``optimizer_state_dict`` is called, by stage
_STATE_KEY = {1: "base_optimizer_state", 2: "base_optimizer_state", 3: "optimizer_state_dict"}


class DeepSpeedSlot(TensorSource):
    """One kind of per-parameter optimizer tensor (``exp_avg``, ...) of a ZeRO
    folder, in the parameters' PyTorch names and shapes, float32 as stored: a
    :class:`jaxshare.stream.TensorSource` (``kind`` ``"deepspeed-optimizer"``)
    whose tensors are cut out of the ranks' mapped flat tensors when asked for.

    Made by :func:`read_deepspeed_training`; holds only its own views of the
    files, so it stays valid after the checkpoint is closed.

    Attributes:
      slot: the entry's name in the optimizer state (``"exp_avg"``).

    >>> import pathlib, jaxshare
    >>> FOLDER = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/deepspeed_optim"
    >>> params, state = read_deepspeed_training(FOLDER / "llama_z3_w3_fp32")
    >>> params.close()  # the slots keep their own views of the files
    >>> exp_avg_sq = state.slots["exp_avg_sq"]
    >>> exp_avg_sq.infos["lm_head.weight"], len(exp_avg_sq.pieces("lm_head.weight"))  # 3 ranks
    (ArrayInfo(shape=(61, 9), dtype='float32'), 3)
    >>> bool((exp_avg_sq.array("model.norm.weight") >= 0).all())
    True
    """

    mapped = True
    kind = "deepspeed-optimizer"

    def __init__(
        self,
        path: Path,
        slot: str,
        places: Mapping[str, Placement],
        shapes: Mapping[str, tuple[int, ...]],
        parts: list[list[np.ndarray]],
        world_size: int,
    ) -> None:
        self.path, self.slot = path, slot
        self._places, self._parts, self._world = dict(places), parts, world_size
        dtype = parts[0][0].dtype.name if parts and parts[0] else "float32"
        self._shapes = {n: shapes[n] for n in self._places}
        self.infos: dict[str, ArrayInfo] = {n: ArrayInfo(s, dtype) for n, s in self._shapes.items()}

    def pieces(self, name: str, /) -> list[np.ndarray]:
        """The 1-D read-only views of the mapped files that, end to end, are
        tensor ``name`` in C order.

        Raises:
          KeyError: ``name`` has no such state (a frozen parameter, an alias).
        """
        try:
            source = self._places[name]
        except KeyError:
            raise KeyError(
                f"{self.path}: {name!r} has no `{self.slot}`; the parameters that have "
                f"are {list(self._places)[:5]}..."
            ) from None
        return flat_pieces(source, self._parts, self._world)

    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """:meth:`pieces`: writers stream them with no copy."""
        return iter(self.pieces(name))

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a numpy array in memory of its own."""
        pieces = self.pieces(name)
        flat = np.concatenate(pieces) if len(pieces) != 1 else pieces[0].copy()
        return flat.reshape(self._shapes[name])

    def read(self, name: str, /) -> np.ndarray:
        """:meth:`array`."""
        return self.array(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]``."""
        return self.array(name)[index]

    def close(self) -> None:
        """Lets go of the mapped files; arrays already returned stay valid."""
        self._parts = []

    def __repr__(self) -> str:
        return f"DeepSpeedSlot({str(self.path)!r}, {self.slot!r}, tensors={len(self.infos)})"


def is_deepspeed_training(path: str | os.PathLike, /, *, tag: str | None = None) -> bool:
    """Whether ``path`` is a DeepSpeed checkpoint folder (or tag folder) holding
    ZeRO optimizer files, the state :func:`read_deepspeed_training` reads. Looks at
    names only.

    >>> import pathlib, jaxshare
    >>> DATA = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data"
    >>> is_deepspeed_training(DATA / "deepspeed_optim/gpt2_z3_w2_fp32")
    True
    >>> is_deepspeed_training(DATA / "deepspeed/gpt2_z0_w2_bf16")  # ZeRO-0: no partitions
    False
    """
    try:
        folder, _ = tag_folder(Path(path), tag)
    except (OSError, ValueError):
        return False
    return any(OPTIM_STATES.fullmatch(p.name) for p in folder.iterdir())


def read_deepspeed_training(path: str | os.PathLike, /, *, tag: str | None = None) -> TrainingState:
    """The fp32 master weights and the optimizer state of a ZeRO-1/2/3 folder.

    Args:
      path: the folder ``engine.save_checkpoint`` was given (holding ``latest``)
        or one tag folder in it.
      tag: the tag folder to read under ``path``; default: ``latest``'s.

    Returns:
      ``(params, state)``: ``params`` is the folder's
      :class:`~jaxshare.formats.DeepSpeedCheckpoint` (the fp32 masters, bit for
      bit DeepSpeed's own consolidation, with the ties; close it when done);
      ``state`` an :class:`~jaxshare.formats.OptimizerState` (producer
      ``"deepspeed"``): one :class:`DeepSpeedSlot` per moment in ``slots``, the
      step of every trainable parameter in ``steps``, the torch parameter groups
      in ``groups`` with their names (``param_shapes`` order) and hyper-parameters.

    Raises:
      FileNotFoundError: ``path`` (or the tag folder) does not exist.
      ValueError: one line naming the file: not a ZeRO-1/2/3 folder (ZeRO-0 keeps
        no partitions), a rank's file missing or damaged, a moment whose size
        does not match its partition.

    >>> import pathlib, jaxshare
    >>> FOLDER = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/deepspeed_optim"
    >>> params, state = read_deepspeed_training(FOLDER / "gpt2_z3_w2_fp32")
    >>> sorted(state.slots), state.steps["transformer.wte.weight"], dict(params.ties)
    (['exp_avg', 'exp_avg_sq'], 3, {'lm_head.weight': 'transformer.wte.weight'})
    >>> state.slots["exp_avg"].array("transformer.wte.weight").shape
    (61, 9)
    >>> [(len(g.names), g.hyper["weight_decay"], g.hyper["betas"]) for g in state.groups]
    [(9, 0.1, (0.9, 0.95)), (18, 0.0, (0.9, 0.95))]
    >>> params.close()
    """
    ckpt = DeepSpeedCheckpoint(path, tag=tag)
    try:
        return TrainingState(ckpt, _read_state(ckpt))
    except BaseException:
        ckpt.close()
        raise


def _read_state(ckpt: DeepSpeedCheckpoint) -> OptimizerState:
    if ckpt.stage == 0:
        raise ValueError(
            f"{ckpt.folder}: a ZeRO-0 checkpoint keeps no ZeRO optimizer partitions (its "
            f"optimizer state is DeepSpeed's own wrapper in {MODEL_STATES}); "
            "expected a ZeRO-1, 2 or 3 folder."
        )
    stage, files = ckpt.stage, ckpt.optim_files
    if any("ds_zero_partition_groups" in inner for inner in ckpt.optim_states):
        raise ValueError(
            f"{files[0]}: a ZeRO-3 checkpoint with expert partition groups "
            "(`ds_zero_partition_groups`), whose sub-groups span different ranks; only "
            "data-parallel ZeRO checkpoints are read (as by zero_to_fp32)."
        )
    shapes = ckpt.group_shapes()  # one dict per flat group (ZeRO-3: per sub-group)
    places = {n: s for n, s in ckpt.placements.items() if s.kind in ("zero2", "zero3")}
    entries: list[list[Mapping[str, Any]]] = []  # [rank][flat group]
    hypers: list[dict[str, Any]] = []
    members: list[list[int]] = []  # [torch group] -> its flat groups
    for rank, (file, inner) in enumerate(zip(files, ckpt.optim_states, strict=True)):
        key = _STATE_KEY[stage]
        sd = inner.get(key)
        if not (isinstance(sd, Mapping) and isinstance(sd.get("state"), Mapping)
                and isinstance(sd.get("param_groups"), list)):  # fmt: skip
            raise ValueError(
                f"{file}: expected `{key}` (a torch optimizer state dict with `state` and "
                f"`param_groups`), found {describe(sd)}; an elastic or offloaded "
                "checkpoint is not read."
            )
        groups = [g for g in sd["param_groups"] if isinstance(g, Mapping)]
        if len(groups) != len(sd["param_groups"]) or not all(
            isinstance(g.get("params"), list) and all(type(i) is int for i in g["params"])
            for g in groups
        ):
            raise ValueError(
                f"{file}: expected `{key}.param_groups` to be groups with `params` (a list of "
                f"indices), found {sd['param_groups']!r:.80}."
            )
        index: list[list[int]] = [list(g["params"]) for g in groups]
        order = [i for ix in index for i in ix]
        flat = ckpt.partitions[rank]
        if order != list(range(len(flat))):
            raise ValueError(
                f"{file}: `{key}.param_groups` hold the flat groups {order}, expected each of "
                f"the {len(flat)} partitions once, in order."
            )
        state = sd["state"]
        missing = [i for i in order if not isinstance(state.get(i), Mapping)]
        if missing:
            raise ValueError(
                f"{file}: `{key}.state` has no entry for flat group(s) {missing}; the optimizer "
                "never stepped them, or the file is damaged: save after a step, or copy the "
                "file again."
            )
        entries.append([state[i] for i in order])
        if rank == 0:
            members = index
            hypers = [{k: _plain(v) for k, v in g.items() if k not in ("params", "param_names")}
                      for g in groups]  # fmt: skip
    if len(shapes) != len(entries[0]):
        raise ValueError(
            f"{files[0]}: {len(entries[0])} flat groups, but param_shapes lists {len(shapes)}."
        )
    pairs = zip(files, ckpt.optim_states, strict=True)
    paddings = [_paddings(f, inner, len(entries[0])) for f, inner in pairs]
    slots, steps, unknown = _slots(ckpt, files, shapes, entries, paddings)
    names_of = [tuple(n for s in flat_ids for n in shapes[s]) for flat_ids in members]
    return OptimizerState(
        path=ckpt.folder,
        producer="deepspeed",
        groups=tuple(ParamGroup(n, h) for n, h in zip(names_of, hypers, strict=True)),
        steps=steps,
        slots={
            k: DeepSpeedSlot(
                ckpt.folder, k, {n: places[n] for n in have}, ckpt.shapes, parts, ckpt.world_size
            )
            for k, (have, parts) in slots.items()
        },
        unknown=tuple(unknown),
    )


def _slots(
    ckpt: DeepSpeedCheckpoint,
    files: Sequence[Path],
    shapes: list[dict[str, tuple[int, ...]]],
    entries: list[list[Mapping[str, Any]]],
    paddings: list[list[int]],
) -> tuple[dict[str, tuple[list[str], list[list[np.ndarray]]]], dict[str, int], list[str]]:
    """``{slot: (names, parts[rank][flat group])}``, the steps and the unknown entries
    of the ranks' per-flat-group ``entries``, checked against the fp32 partitions and
    the ranks' ``paddings[rank][flat group]``."""
    have: dict[str, list[str]] = {}
    steps: dict[str, int] = {}
    unknown: list[str] = []
    for g, group_shapes in enumerate(shapes):
        names = list(group_shapes)
        keys = set(entries[0][g])
        for rank, file in enumerate(files):
            if set(entries[rank][g]) != keys:
                raise ValueError(
                    f"{file}: flat group {g} holds {sorted(entries[rank][g])}, rank 0's "
                    f"{sorted(keys)}; the files come from different runs."
                )
        for key in sorted(keys):
            values = [entries[rank][g][key] for rank in range(len(files))]
            if key == "step":
                found = [_step(v, files[rank], g) for rank, v in enumerate(values)]
                if len(set(found)) > 1:
                    raise ValueError(
                        f"{files[0]}: flat group {g} is at steps {found} on the ranks; the "
                        "files come from different runs."
                    )
                steps.update(dict.fromkeys(names, found[0]))
            elif len(set(kinds := [_what(v, short=True) for v in values])) > 1:
                rank = next(r for r, k in enumerate(kinds) if k != kinds[0])
                raise ValueError(
                    f"{files[rank]}: `{key}` of flat group {g} is {_what(values[rank])} on rank "
                    f"{rank}, a {_what(values[0])} on rank 0; the files come from different runs."
                )
            elif not all(isinstance(v, np.ndarray) and v.ndim == 1 for v in values):
                unknown += [f"{n}: `{key}` ({_what(values[0])}) is not a moment" for n in names]
            else:
                for rank, v in enumerate(values):
                    # DeepSpeed stores the fp32 partitions without, the moments with
                    # the padding (ZeRO-1/2: at the end of the last rank's partition).
                    want = ckpt.partitions[rank][g].size + paddings[rank][g]
                    if v.size != want:
                        raise ValueError(
                            f"{files[rank]}: `{key}` of flat group {g} has {v.size} elements, "
                            f"expected {want} (its fp32 partition and the padding); the file "
                            "is damaged or truncated: copy it again from the training run."
                        )
                have.setdefault(key, []).extend(names)
    slots = {}
    for key, names in have.items():
        # A flat group without the slot gets a stand-in of its size that takes no
        # memory (none of its names is in the slot, so it is never read): the
        # layout's offsets over the ranks' groups end to end hold.
        parts = [
            [
                e[key] if isinstance(e.get(key), np.ndarray) else _absent(p.size)
                for e, p in zip(rank_entries, ckpt.partitions[rank], strict=True)
            ]
            for rank, rank_entries in enumerate(entries)
        ]
        slots[key] = (names, parts)
    return slots, steps, unknown


def _absent(size: int) -> np.ndarray:
    return np.broadcast_to(np.float32(0), (size,))


def _paddings(file: Path, inner: Mapping[str, Any], groups: int) -> list[int]:
    """The rank's ``group_paddings`` (ZeRO-1/2; ZeRO-3 keeps none), one per group."""
    pads = inner.get("group_paddings")
    if pads is None:
        return [0] * groups
    if not (isinstance(pads, list) and len(pads) == groups
            and all(type(n) is int and n >= 0 for n in pads)):  # fmt: skip
        raise ValueError(
            f"{file}: expected `group_paddings`, one count per parameter group ({groups}), "
            f"found {pads!r:.80}."
        )
    return pads


def _step(value: Any, file: Path, group: int) -> int:
    v = value.item() if isinstance(value, np.ndarray) and value.size == 1 else value
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        raise ValueError(
            f"{file}: flat group {group}'s `step` is {_what(value)}, expected a whole number."
        )
    return int(v)


def _plain(value: Any) -> Any:
    """A hyper-parameter as a plain Python value (a 0-d array as its number)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return value


def _what(value: Any, short: bool = False) -> str:
    """How messages describe a stored value (``short``: its kind only, to compare
    the ranks' values, whose sizes differ)."""
    if isinstance(value, np.ndarray):
        if short:
            return f"{value.dtype} array of {value.ndim} dimensions"
        return f"{value.dtype} array of shape {list(value.shape)}"
    return type(value).__name__ if short else f"{type(value).__name__} {value!r}"[:80]
