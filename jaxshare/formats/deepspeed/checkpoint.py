"""DeepSpeed ZeRO checkpoint folders, read without deepspeed, one tensor at a time.

``engine.save_checkpoint(root)`` writes ``root/latest`` (the tag, e.g.
``global_step3``) and a tag folder holding the model states
(``mp_rank_00_model_states.pt``, or one ``zero_pp_rank_R_mp_rank_00_model_states.pt``
per rank under ZeRO-3) and, under ZeRO-1/2/3, one optimizer file per rank
(``[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt``) whose flat fp32
partitions are the weights. :class:`DeepSpeedCheckpoint` rebuilds each tensor
exactly as DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` does:

- buffers come from the stored ``module``, floating ones as float32;
- frozen parameters from ``frozen_param_fragments`` (whole under ZeRO-1/2; under
  ZeRO-3 the ranks' pieces end to end, cut to the parameter's size), in the
  dtype they were stored in;
- trainable parameters from the partitions, in ``param_shapes`` order. ZeRO-1/2:
  a parameter group is the ranks' ``single_partition_of_fp32_groups`` end to
  end, parameters back to back (plus ``param_alignment_paddings``). ZeRO-3:
  each parameter is split into ``ceil(numel / world_size)`` elements per rank at
  the same offset of every rank's ``fp32_flat_groups``, the last rank padded;
- each ``shared_params`` alias whose canonical was rebuilt is that very tensor.

Beyond ``zero_to_fp32``: ZeRO-0 folders (which it refuses) give the stored
``module``, tensors over one storage tied; under ZeRO-1/2 a name the stored
``module`` holds and ``zero_to_fp32`` drops (ZeRO-1 records no frozen
parameters) is read from the module. Tensor-, pipeline- and expert-parallel
folders are refused, as ``zero_to_fp32`` cannot consolidate them either.

Files are found by the names :mod:`jaxshare.formats.deepspeed.files` gives them,
memory-mapped and unpickled without torch by its :func:`load_deepspeed_file` (the
restricted unpickler of ``torch.save`` files, with DeepSpeed's four classes as
inert stand-ins), so the partitions stay file pages; names, shapes, dtypes and
ties come from the pickles alone, and each tensor is assembled only when asked
for, as numpy arrays. Streaming a folder to a file imports neither torch nor JAX;
``bridge.DeepSpeedCheckpoint`` and ``bridge.load_deepspeed`` give torch tensors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import is_floating
from jaxshare.core.memory import array_key, memory_ties
from jaxshare.core.report import SHARED_PARAMS, STORAGE, ArrayInfo, format_bytes
from jaxshare.formats.deepspeed.files import (
    MODEL_STATES,
    OPTIM_STATES,
    OPTIM_STATES_NAME,
    ZERO3_MODEL_STATES,
    ZERO3_MODEL_STATES_NAME,
    load_deepspeed_file,
    tag_folder,
    unsupported_parallelism,
)
from jaxshare.io.mapped import FileRange, file_extent
from jaxshare.io.source import Index, RecordedTie, TensorSource
from jaxshare.io.threads import parallel_map

__all__ = ["DeepSpeedCheckpoint", "Placement", "describe", "flat_pieces"]


# -- the folder -----------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where a stored tensor's values are: ``kind`` is ``"module"`` (a tensor of
    the stored module: ZeRO-0, buffers), ``"frozen"``, ``"zero2"`` (group
    ``group``, ``offset`` into the ranks' partitions end to end) or ``"zero3"``
    (``offset`` into every rank's flat groups end to end)."""

    kind: str
    numel: int
    group: int = 0
    offset: int = 0


_FLOAT32 = np.dtype("float32")


def _one_piece(t: np.ndarray) -> list[np.ndarray]:
    return [t.reshape(-1)]


def _window(parts: Sequence[np.ndarray], start: int, numel: int) -> list[np.ndarray]:
    """1-D views covering ``[start, start + numel)`` of ``parts`` end to end."""
    out, pos, end = [], 0, start + numel
    for part in parts:
        n = part.size
        lo, hi = max(start, pos), min(end, pos + n)
        if lo < hi:
            out.append(part[lo - pos : hi - pos])
        pos += n
        if pos >= end:
            break
    return out


def flat_pieces(
    source: Placement, parts: Sequence[Sequence[np.ndarray]], world_size: int
) -> list[np.ndarray]:
    """The 1-D pieces that, end to end, are the trainable parameter laid out as
    ``source`` (``"zero2"`` or ``"zero3"``) in ``parts``, the ranks' flat groups
    (``parts[rank][group]``): the fp32 partitions, or anything DeepSpeed lays out
    as they are (the optimizer's moments, ``_deepspeed_optim``).

    ZeRO-1/2: the ranks' partitions of the group end to end, the parameter at
    ``offset``. ZeRO-3: ``ceil(numel / world_size)`` elements at ``offset`` of
    every rank's flat groups end to end, the last rank's padded.
    """
    if source.kind == "zero2":
        return _window([p[source.group] for p in parts], source.offset, source.numel)
    per_rank = -(-source.numel // world_size)
    padded = [p for rank in parts for p in _window(rank, source.offset, per_rank)]
    return _window(padded, 0, source.numel)


def _numel(shape: Any) -> int:
    return math.prod(int(n) for n in shape)


def _memory_ties(module: Mapping[str, np.ndarray]) -> dict[str, str]:
    """``{alias: canonical}`` of the module's tensors over one memory (the same place
    in the mapped file, shape, strides and dtype), canonical the first name in the
    module's order."""
    return memory_ties({name: array_key(t) for name, t in module.items()}).aliases


class DeepSpeedCheckpoint(TensorSource):
    """A DeepSpeed checkpoint folder: names, shapes, dtypes and ties first, then
    tensors one at a time, rebuilt bit-exactly as DeepSpeed's ``zero_to_fp32``.

    A :class:`jaxshare.stream.TensorSource` (``kind`` ``"deepspeed"``):
    conversions plan from :attr:`infos` and :attr:`ties` and read one tensor at a
    time, as numpy arrays (``bridge.DeepSpeedCheckpoint``, the same reader, gives
    torch tensors).

    Args:
      path: the folder ``engine.save_checkpoint`` was given (holding ``latest``)
        or one tag folder in it (e.g. ``ckpt/global_step3``).
      tag: the tag folder to read under ``path``; default: ``latest``'s.

    Attributes:
      folder: the tag folder read.
      tag: its name.
      stage: the ZeRO stage, 0 to 3.
      world_size: the data-parallel ranks that wrote it.
      ds_version: the DeepSpeed version that wrote it.
      names: every name of the state dict, aliases included, in the model's
        ``state_dict()`` order.
      infos: ``{name: ArrayInfo}`` of the tensors that are stored, in that order
        (the aliases' are their canonical's).
      ties: the ties, an :class:`~jaxshare.AliasMap` alias -> canonical
        (also :attr:`shared_params`, DeepSpeed's name for them).
      origins: ``{alias: "shared_params"}`` for the ties DeepSpeed recorded,
        ``"storage"`` for tensors the module stores over one memory.
      recovered: names ``zero_to_fp32`` leaves out that the stored ``module``
        holds (ZeRO-1/2 only): DeepSpeed records no frozen parameters under
        ZeRO-1, and its ``shared_params`` walk misses some ties.
      placements: ``{name: Placement}``: where each stored tensor's elements
        lie (in the ranks' flat partitions, or in the stored ``module``).
      partitions: ``[rank][flat group]``: the ranks' fp32 partitions, mapped.
      shapes: ``{name: shape}`` of the stored tensors.
      optim_files: the ranks' optimizer-state files, in rank order.
      optim_states: their unpickled ``optimizer_state_dict``, in rank order (what
        :func:`jaxshare.formats.read_deepspeed_training` cuts the moments from).

    Raises:
      FileNotFoundError: ``path`` (or the tag folder) does not exist.
      ValueError: the folder is not a DeepSpeed checkpoint this reader knows, a
        file is missing or unreadable, or one would run code when unpickled
        (refused, never run). Files are only read.

    >>> import pathlib, jaxshare
    >>> FIXTURES = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/deepspeed"
    >>> with DeepSpeedCheckpoint(FIXTURES / "gpt2_z3_w2_fp32") as ckpt:
    ...     print(ckpt.tag, ckpt.stage, ckpt.world_size, dict(ckpt.shared_params))
    ...     print(ckpt.infos["transformer.wte.weight"])
    ...     a = ckpt.array("transformer.wte.weight")
    global_step2 3 2 {'lm_head.weight': 'transformer.wte.weight'}
    ArrayInfo(shape=(31, 9), dtype='float32')
    >>> a.dtype, a.shape
    (dtype('float32'), (31, 9))
    """

    mapped = True  # blocks are views of mapped files or tensors in memory

    kind = "deepspeed"

    def __init__(self, path: str | os.PathLike, /, *, tag: str | None = None) -> None:
        self.path = Path(path)
        self.folder, self.tag = tag_folder(self.path, tag)
        self.optim_files: list[Path] = []
        self.optim_states: list[dict[str, Any]] = []  # [rank]: `optimizer_state_dict`
        self.placements: dict[str, Placement] = {}
        self._module: Mapping[str, np.ndarray] = {}
        self._frozen: list[Mapping[str, np.ndarray]] = []
        self.partitions: list[list[np.ndarray]] = []  # [rank][group]
        self._dtypes: dict[str, np.dtype] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.recovered: tuple[str, ...] = ()
        self._read_model_states()
        self._index_partitions()
        self._order_and_ties()

    # -- metadata ------------------------------------------------------------------

    def _read_model_states(self) -> None:
        folder = self.folder
        for p in sorted(folder.iterdir()):
            parallelism = unsupported_parallelism(p.name)
            if parallelism:
                raise ValueError(
                    f"{folder}: holds {p.name}, a file of {parallelism} checkpoint; only "
                    "data-parallel ZeRO checkpoints are supported (as by zero_to_fp32)."
                )
        zero3 = sorted(
            (int(m[1]), p) for p in folder.iterdir() if (m := ZERO3_MODEL_STATES.fullmatch(p.name))
        )
        if (folder / MODEL_STATES).is_file():
            self._model_files = [folder / MODEL_STATES]
        elif zero3:
            self._model_files = _by_rank(folder, zero3, ZERO3_MODEL_STATES_NAME)
        else:
            found = sorted(p.name for p in folder.iterdir())[:6]
            raise ValueError(
                f"{folder}: expected a DeepSpeed checkpoint tag folder holding "
                f"{MODEL_STATES} (ZeRO-0/1/2) or {ZERO3_MODEL_STATES_NAME} "
                f"(ZeRO-3), found {found or 'nothing'}; pass the folder `save_checkpoint` "
                "wrote (with `latest`), one of its tag folders, or `tag=`."
            )
        first = self._model_file(0)
        self._first_file = self._model_files[0]
        self.ds_version = str(first.get("ds_version"))
        mp = first.get("mp_world_size", 1)
        if mp not in (None, 1):
            raise ValueError(
                f"{self._first_file}: a tensor-parallel checkpoint (mp_world_size={mp}); "
                "only data-parallel ZeRO checkpoints are supported (as by zero_to_fp32)."
            )
        module = first.get("module")
        if not isinstance(module, Mapping) or not all(
            isinstance(k, str) and isinstance(v, np.ndarray) for k, v in module.items()
        ):
            raise ValueError(
                f"{self._first_file}: expected DeepSpeed model states with a `module` state "
                f"dict, found {describe(module if module is not None else first)}."
            )
        self._module = module
        self._param_shapes = first.get("param_shapes")
        self._shared = first.get("shared_params") or {}
        self._first = first
        buffer_names = first.get("buffer_names") or []
        for name in module:
            if name in buffer_names and self._param_shapes is not None:  # not ZeRO-0
                t = module[name]
                dtype = _FLOAT32 if is_floating(t.dtype) else t.dtype  # as zero_to_fp32
                self._add(name, Placement("module", t.size), tuple(t.shape), dtype)

    def _model_file(self, rank: int) -> dict[str, Any]:
        path = self._model_files[rank]
        state = load_deepspeed_file(path)
        if not isinstance(state, dict):
            raise ValueError(
                f"{path}: expected DeepSpeed model states (a dict), found {describe(state)}."
            )
        return state

    def _add(self, name: str, source: Placement, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if name in self.placements:
            raise ValueError(
                f"{self._first_file}: {name!r} is listed twice (as a buffer, frozen or "
                "trainable parameter); the model states are inconsistent."
            )
        if _numel(shape) != source.numel:
            raise ValueError(
                f"{self._first_file}: {name!r} has shape {list(shape)} but {source.numel} "
                "elements are stored for it."
            )
        self.placements[name], self.shapes[name], self._dtypes[name] = source, shape, dtype

    def _index_partitions(self) -> None:
        optim = sorted(
            (int(m[2]), p, m[1] or "")
            for p in self.folder.iterdir()
            if (m := OPTIM_STATES.fullmatch(p.name))
        )
        if self._param_shapes is None:  # ZeRO-0: the module is the model
            self.stage = 0
            self.world_size = int(self._first.get("dp_world_size") or 1)
            self._shared = _memory_ties(self._module)  # DeepSpeed records none here
            for name, t in self._module.items():
                if name not in self.placements and name not in self._shared:
                    self._add(name, Placement("module", t.size), tuple(t.shape), t.dtype)
            return
        if not optim:
            raise ValueError(
                f"{self.folder}: expected the ZeRO optimizer files "
                f"({OPTIM_STATES_NAME}), which hold the weights, found "
                "none; copy them from the training run (the model states alone hold no "
                "fp32 weights)."
            )
        prefixes = {prefix for _, _, prefix in optim}
        if len(prefixes) > 1:
            raise ValueError(
                f"{self.folder}: holds optimizer files both with and without the `bf16_` "
                "prefix, from two runs; keep one run's files."
            )
        paths = _by_rank(self.folder, [(r, p) for r, p, *_ in optim], OPTIM_STATES_NAME)
        self.optim_files = paths
        states = [self._optimizer_state(p) for p in paths]
        self.optim_states = states
        stage = _as_int(states[0].get("zero_stage"), paths[0], "zero_stage")
        counts = states[0].get("partition_count")
        world = max(counts) if isinstance(counts, list) and counts else counts
        world = _as_int(world, paths[0], "partition_count")
        if world != len(paths):
            raise ValueError(
                f"{self.folder}: expected {world} optimizer files (partition_count), found "
                f"{len(paths)}; a rank's file is missing or left over from another run."
            )
        self.stage, self.world_size = stage, world
        zero3_files = self._model_files[0].name != MODEL_STATES
        if (
            stage not in (1, 2, 3)
            or (stage == 3) != zero3_files
            or (zero3_files and len(self._model_files) != world)
        ):
            raise ValueError(
                f"{paths[0]}: zero_stage {stage} does not fit the model states files "
                f"({', '.join(p.name for p in self._model_files)})."
            )
        key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
        for path, state in zip(paths, states, strict=True):
            groups = state.get(key)
            if not isinstance(groups, list) or not all(
                isinstance(t, np.ndarray) and t.ndim == 1 for t in groups
            ):
                raise ValueError(
                    f"{path}: expected `{key}` (a list of flat tensors) in the optimizer "
                    f"state, found {describe(groups)}."
                )
            self.partitions.append(groups)
        self._frozen_params()
        if stage == 3:
            self._zero3_partitions(paths)
        else:
            self._zero2_partitions(paths, states[0].get("param_alignment_paddings"))

    def _optimizer_state(self, path: Path) -> dict[str, Any]:
        state = load_deepspeed_file(path)
        inner = state.get("optimizer_state_dict") if isinstance(state, dict) else None
        if not isinstance(inner, dict) or "zero_stage" not in inner:
            raise ValueError(
                f"{path}: expected a ZeRO optimizer state (`optimizer_state_dict` with "
                f"`zero_stage`), found {describe(inner if isinstance(state, dict) else state)}."
            )
        return inner

    def _frozen_params(self) -> None:
        shapes = self._first.get("frozen_param_shapes") or {}
        if not shapes:
            return
        ranks = range(len(self._model_files)) if self.stage == 3 else range(1)
        self._frozen = [
            (self._first if r == 0 else self._model_file(r)).get("frozen_param_fragments") or {}
            for r in ranks
        ]
        for name, shape in shapes.items():
            frags = [f.get(name) for f in self._frozen]
            where = self._model_files[0]
            if not all(isinstance(t, np.ndarray) for t in frags):
                raise ValueError(
                    f"{where}: frozen parameter {name!r} has no fragment in every rank's "
                    "`frozen_param_fragments`."
                )
            frags = cast(list[np.ndarray], frags)  # (checked above)
            if self.stage == 3:
                if any(t.ndim != 1 or t.dtype != frags[0].dtype for t in frags):
                    raise ValueError(
                        f"{where}: frozen parameter {name!r}: expected one flat fragment of one "
                        "dtype per rank."
                    )
                numel = _numel(shape)
                if sum(t.size for t in frags) < numel:
                    raise ValueError(
                        f"{where}: frozen parameter {name!r} of shape {list(shape)} has only "
                        f"{sum(t.size for t in frags)} elements stored."
                    )
                self._add(name, Placement("frozen", numel), tuple(shape), frags[0].dtype)
            else:  # DeepSpeed takes the stored fragment as it is.
                t = frags[0]
                self._add(name, Placement("frozen", t.size), tuple(t.shape), t.dtype)

    def group_shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """``param_shapes``: one ``{name: shape}`` per flat group (ZeRO-3: per
        sub-group), in the order the ranks' partitions hold them.

        Raises:
          ValueError: ``param_shapes`` is not that (one line naming the file).
        """
        shapes = self._param_shapes
        if not isinstance(shapes, list) or not all(isinstance(g, Mapping) for g in shapes):
            raise ValueError(
                f"{self._first_file}: expected `param_shapes` (a list of name -> shape dicts), "
                f"found {describe(shapes)}."
            )
        return [{n: tuple(int(d) for d in s) for n, s in g.items()} for g in shapes]

    def _zero2_partitions(self, paths: list[Path], paddings: Any) -> None:
        groups = self.group_shapes()
        for path, parts in zip(paths, self.partitions, strict=True):
            if len(parts) != len(groups):
                raise ValueError(
                    f"{path}: {len(parts)} partition groups, but param_shapes lists "
                    f"{len(groups)} parameter groups."
                )
        align = 2 * self.world_size
        for g, shapes in enumerate(groups):
            pads = None if paddings is None else list(paddings[g])
            if pads is not None and len(pads) != len(shapes):
                raise ValueError(
                    f"{paths[0]}: group {g} has {len(pads)} alignment paddings for "
                    f"{len(shapes)} parameters."
                )
            dtype = self.partitions[0][g].dtype
            offset = 0
            for i, (name, shape) in enumerate(shapes.items()):
                numel = _numel(shape)
                self._add(name, Placement("zero2", numel, g, offset), shape, dtype)
                offset += numel + (int(pads[i]) if pads is not None else 0)
            available = sum(parts[g].size for parts in self.partitions)
            # DeepSpeed's own check, and the last parameter must be there whole.
            if offset > available or -(-offset // align) != -(-available // align):
                raise ValueError(
                    f"{self.folder}: parameter group {g} needs {offset} elements but the "
                    f"ranks' partitions hold {available}; a file is damaged or from another run."
                )

    def _zero3_partitions(self, paths: list[Path]) -> None:
        groups = self.group_shapes()
        sizes = [t.size for t in self.partitions[0]]
        for path, parts in zip(paths, self.partitions, strict=True):
            if [t.size for t in parts] != sizes or any(t.dtype != parts[0].dtype for t in parts):
                raise ValueError(
                    f"{path}: its flat groups differ from rank 0's in size or dtype; a file is "
                    "damaged or from another run."
                )
        dtype = self.partitions[0][0].dtype if sizes else _FLOAT32
        offset = 0
        for shapes in groups:
            for name, shape in shapes.items():
                numel = _numel(shape)
                self._add(name, Placement("zero3", numel, 0, offset), shape, dtype)
                offset += -(-numel // self.world_size)
        if offset != sum(sizes):  # DeepSpeed's own check
            raise ValueError(
                f"{self.folder}: the parameters need {offset} elements per rank but each rank's "
                f"flat groups hold {sum(sizes)}; a file is damaged or from another run."
            )

    def _order_and_ties(self) -> None:
        if not isinstance(self._shared, Mapping):
            raise ValueError(
                f"{self._first_file}: expected `shared_params` (alias -> name), found "
                f"{describe(self._shared)}."
            )
        # As zero_to_fp32: an alias of a rebuilt tensor is that tensor. A name
        # stored in its own right keeps its own values.
        aliases = {
            a: c
            for a, c in self._shared.items()
            if c in self.placements and a not in self.placements
        }
        self.origins: dict[str, str] = dict.fromkeys(
            aliases, STORAGE if self.stage == 0 else SHARED_PARAMS
        )
        if self.stage in (1, 2):
            self._recover(aliases)
        try:
            self.ties = AliasMap(aliases)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self._first_file}: invalid `shared_params`: {e}") from None
        # What DeepSpeed records and the weights do not take: for `check` to hold.
        self.unapplied_ties = tuple(
            RecordedTie(a, c, SHARED_PARAMS)
            for a, c in self._shared.items()
            if isinstance(a, str) and isinstance(c, str) and a not in self.ties
        )
        self.parts = tuple(
            f"{p.parent.name}/{p.name}: {format_bytes(p.stat().st_size)}"
            for p in [*self._model_files, *self.optim_files]
        )
        wanted = self.placements.keys() | aliases.keys()
        order = [n for n in self._module if n in wanted]
        seen = set(order)
        order += [n for n in [*self.placements, *aliases] if n not in seen]
        self.names: tuple[str, ...] = tuple(order)
        self.infos: dict[str, ArrayInfo] = {
            n: ArrayInfo(self.shapes[n], self._dtypes[n].name)
            for n in order
            if n in self.placements
        }

    def _recover(self, aliases: dict[str, str]) -> None:
        """Adds what the stored module holds and ``zero_to_fp32`` leaves out.

        Under ZeRO-1/2 ``module`` holds every tensor (in the training dtype).
        DeepSpeed records frozen parameters only under ZeRO-2/3, and its
        ``shared_params`` walk misses some ties (a module registered twice):
        such a name is tied to the name it shares memory with, or else read
        from ``module`` as stored.
        """
        ties = _memory_ties(self._module)
        for name, t in self._module.items():
            if name in self.placements or name in aliases:
                continue
            canonical = ties.get(name)
            if canonical is not None:  # earlier in the module, so already placed
                aliases[name] = aliases.get(canonical, canonical)
                self.origins[name] = STORAGE
            else:
                self._add(name, Placement("module", t.size), tuple(t.shape), t.dtype)
            self.recovered += (name,)

    @property
    def shared_params(self) -> AliasMap:
        """The ties (:attr:`ties`) under DeepSpeed's name: alias -> canonical."""
        return self.ties

    # -- tensors -------------------------------------------------------------------

    def pieces(self, name: str, /) -> list[np.ndarray]:
        """The values of stored tensor ``name`` as 1-D pieces that, end to end,
        are the tensor in C order: read-only views of the mapped files where
        they can be (no copy). Writers stream them; :meth:`array` joins them.

        Raises:
          KeyError: ``name`` is not a stored tensor (aliases are not).
        """
        source = self._source(name)
        if source.kind == "module":
            t = self._module[name]
            return _one_piece(t.astype(self._dtypes[name], copy=False))
        if source.kind == "frozen":
            frags = [f[name] for f in self._frozen]
            return _one_piece(frags[0]) if self.stage < 3 else _window(frags, 0, source.numel)
        return flat_pieces(source, self.partitions, self.world_size)

    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """:meth:`pieces`: writers stream them with no copy."""
        return iter(self.pieces(name))

    def extents(self, name: str) -> Sequence[FileRange]:
        return [e for e in map(file_extent, self.pieces(name)) if e is not None]

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` (or, for an alias, its canonical's values) as a numpy
        array assembled into memory of its own; no torch needed.

        Raises:
          KeyError: no such name.
        """
        name = self.shared_params.get(name, name)
        pieces = self.pieces(name)
        if not pieces:
            return np.empty(self.shapes[name], self._dtypes[name])
        flat = np.concatenate(pieces) if len(pieces) > 1 else pieces[0].copy()
        return flat.reshape(self.shapes[name])

    def read(self, name: str, /) -> Any:
        """:meth:`array`, a numpy array (``bridge.DeepSpeedCheckpoint`` gives torch
        tensors)."""
        return self.array(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]``."""
        return self.array(name)[index]

    def items(self) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` for each stored tensor, in state-dict order, each
        assembled only when the one before has been handed on (aliases are not
        repeated; see :attr:`shared_params`)."""
        for name in self.infos:
            yield name, self.read(name)

    def state_dict(self) -> dict[str, Any]:
        """Every name, in state-dict order; an alias is the very object of its
        canonical (as ``zero_to_fp32`` returns it). Tensors are assembled on a few
        threads at once."""
        names = list(self.infos)
        stored = dict(zip(names, parallel_map(self.read, names), strict=True))
        return {n: stored[self.shared_params.get(n, n)] for n in self.names}

    def _source(self, name: str) -> Placement:
        try:
            return self.placements[name]
        except KeyError:
            hint = (
                f"it is an alias of {self.shared_params[name]!r}"
                if name in self.shared_params
                else f"the stored names are {list(self.infos)[:5]}..."
            )
            raise KeyError(f"{self.folder}: {name!r} is not a stored tensor; {hint}") from None

    def close(self) -> None:
        """Lets go of the mapped files (also done on leaving a ``with`` block);
        tensors already returned stay valid."""
        self._module, self._frozen, self.partitions, self._first = {}, [], [], {}
        self.optim_states = []

    def __repr__(self) -> str:
        return (
            f"DeepSpeedCheckpoint({str(self.folder)!r}, stage={self.stage}, "
            f"world_size={self.world_size}, tensors={len(self.infos)}, "
            f"aliases={len(self.shared_params)})"
        )


# -- helpers -------------------------------------------------------------------------


def _by_rank(folder: Path, ranked: list[tuple[int, Path]], pattern: str) -> list[Path]:
    ranks = [r for r, _ in ranked]
    if ranks != list(range(len(ranks))):
        raise ValueError(
            f"{folder}: expected {pattern} for ranks 0..{len(ranks) - 1} exactly once, "
            f"found ranks {ranks}; a rank's file is missing or duplicated."
        )
    return [p for _, p in ranked]


def _as_int(value: Any, path: Path, key: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: expected an integer `{key}`, found {value!r}.") from None


def describe(obj: Any) -> str:
    """How a message names what was found where a dict of DeepSpeed's was expected:
    a dict by its keys, anything else by its type."""
    if isinstance(obj, Mapping):
        return f"a dict with keys {list(obj)[:8]}"
    return type(obj).__name__
