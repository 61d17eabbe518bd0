"""A mixture of experts under both of transformers 5's namings, each read as the other.

transformers 5 holds a layer's experts fused (``model.layers.1.mlp.experts.gate_up_proj``
``(E, 2I, H)``: the experts stacked on axis 0, gate and up concatenated on axis 1;
``down_proj`` ``(E, H, I)``), and ``save_pretrained`` writes them per expert by default
(``model.layers.1.mlp.experts.0.gate_proj.weight`` ``(I, H)``, Mixtral's
``block_sparse_moe.experts.0.w1.weight``), or fused with ``save_original_format=False``.
Which names go with which is data: ``experts.toml``, by ``config.json``'s ``model_type``,
after transformers 5's ``conversion_mapping.py``.

- :class:`PerExpertView`: a source of fused tensors as its per-expert tensors, each read
  as its slice of the fused one (what a fused directory reads as, so that both namings
  of one model convert to the same item);
- :class:`FusedView`: a source of per-expert tensors as the fused ones, a layer's experts
  read into one array (what ``save_hf(fused_experts=True)`` and ``--fused-experts``
  write).

A fused tensor is the layout engine's ops (:mod:`bridge.layouts.ops`): each expert's
parts concatenated (``Concat``), the experts stacked on axis 0 (``Stack``); its shapes and
each part's place in it are theirs.

Both check that every expert of a layer is there, once, with the shape of the others.
Nothing here imports torch or transformers.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge.layouts.ops import Concat, Stack
from jaxshare import AliasMap
from jaxshare.internal import SourceView
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = [
    "EXPERTS_TABLE",
    "ExpertsFamily",
    "Fused",
    "FusedView",
    "PerExpertView",
    "experts_families",
    "experts_family",
    "per_expert",
]

#: The table of namings, by model type.
EXPERTS_TABLE = Path(__file__).with_name("experts.toml")

#: What stands for the expert's index in a per-expert name.
EXPERT = "{e}"


@dataclass(frozen=True)
class Fused:
    """One fused tensor and the per-expert tensors it holds.

    Attributes:
      fused: the end of its name after the layer's module (``mlp.experts.gate_up_proj``).
      experts: the ends of the per-expert names it holds, with :data:`EXPERT`, in the
        order they are concatenated (``mlp.experts.{e}.gate_proj.weight``, ``...up...``).
      axis: the axis of the fused tensor they are concatenated along (equal sizes).

    >>> f = Fused("mlp.experts.gate_up_proj", ("mlp.experts.{e}.gate_proj.weight",
    ...           "mlp.experts.{e}.up_proj.weight"), 1)
    >>> f.per_expert_shape((4, 16, 8))
    (8, 8)
    >>> f.index(2, 1, (4, 16, 8))
    (2, slice(8, 16, None))
    """

    fused: str
    experts: tuple[str, ...]
    axis: int = 1

    @property
    def ops(self) -> tuple[Stack, Concat]:
        """The layout engine's ops that make the fused tensor: each expert's parts
        concatenated, then the experts stacked on axis 0."""
        return Stack("e", 0), Concat("p", self.axis - 1)

    def per_expert_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of each per-expert tensor of a fused tensor of ``shape``.

        Raises:
          ValueError: the parts do not divide the fused axis.
        """
        stack, concat = self.ops
        return concat.part_shapes(stack.part_shapes(tuple(shape))[0], len(self.experts))[0]

    def fused_shape(self, experts: int, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the fused tensor of ``experts`` experts of per-expert ``shape``.

        >>> Fused("mlp.experts.gate_up_proj", ("a.{e}.w", "b.{e}.w"), 1).fused_shape(4, (8, 16))
        (4, 16, 16)
        """
        stack, concat = self.ops
        return stack.combined([concat.combined([tuple(shape)] * len(self.experts))] * experts)

    def index(self, expert: int, part: int, shape: Sequence[int]) -> tuple[Any, ...]:
        """Where per-expert tensor ``part`` of ``expert`` lies in the fused tensor (the
        expert's axis taken away)."""
        stack, concat = self.ops
        inner = stack.part_shapes(tuple(shape))[0]
        return (
            *stack.part_index(expert, tuple(shape)),
            *concat.part_index(part, inner, len(self.experts)),
        )


@dataclass(frozen=True)
class ExpertsFamily:
    """The namings of one family's experts.

    Attributes:
      model_types: the ``config.json`` ``model_type`` s of the family.
      fused: its fused tensors.
      renames: ``(per-expert form, fused form)`` parts of every other name that
        differ between the two namings (Mixtral's ``.block_sparse_moe.`` is ``.mlp.``).
      count: the ``config.json`` keys that give the number of experts of a layer.
    """

    model_types: tuple[str, ...]
    fused: tuple[Fused, ...]
    renames: tuple[tuple[str, str], ...] = ()
    count: tuple[str, ...] = ()

    def experts(self, config: Mapping[str, Any] | None) -> int | None:
        """The number of experts of a layer that ``config`` gives, if it does.

        >>> experts_family({"model_type": "mixtral"}).experts({"num_local_experts": 8})
        8
        """
        found = (v for k in self.count if type(v := (config or {}).get(k)) is int)
        return next(found, None)

    def fused_name(self, name: str) -> str:
        """A name of the per-expert naming as the fused naming spells it."""
        for per_expert, fused in self.renames:
            name = name.replace(per_expert, fused)
        return name

    def per_expert_name(self, name: str) -> str:
        """A name of the fused naming as the per-expert naming spells it."""
        for per_expert, fused in self.renames:
            name = name.replace(fused, per_expert)
        return name

    def held_name(self, name: str) -> str:
        """The name the model class holds ``name``'s values under: a per-expert
        tensor's fused tensor, any other name as the fused naming spells it.

        >>> experts_family({"model_type": "mixtral"}).held_name(
        ...     "model.layers.0.block_sparse_moe.experts.3.w1.weight")
        'model.layers.0.mlp.experts.gate_up_proj'
        """
        found = self.expert_of(name)
        if found is None:
            return self.fused_name(name)
        fused, _, prefix, _ = found
        return self.fused_name(prefix) + fused.fused

    def in_expert(self, module: str) -> bool:
        """Whether ``module`` is one expert's or inside one (``mlp.experts.3``,
        ``mlp.experts.3.gate_proj``), which a model holding its experts fused lacks.

        >>> family = experts_family({"model_type": "qwen3_moe"})
        >>> family.in_expert("model.layers.0.mlp.experts.3.gate_proj")
        True
        >>> family.in_expert("model.layers.0.mlp.experts")
        False
        """
        for fused in self.fused:
            for pattern in fused.experts:
                rest = pattern.split(EXPERT)[1].lstrip(".").split(".")
                for k in range(len(rest)):
                    if self.expert_of(f"{module}.{'.'.join(rest[k:])}") is not None:
                        return True
        return False

    def fused_of(self, name: str) -> tuple[Fused, str] | None:
        """The fused tensor ``name`` is, and its layer's module prefix (with its dot)."""
        for fused in self.fused:
            if name == fused.fused or name.endswith(f".{fused.fused}"):
                return fused, name[: len(name) - len(fused.fused)]
        return None

    def expert_of(self, name: str) -> tuple[Fused, int, str, int] | None:
        """``(fused, part, prefix, expert)`` of a per-expert ``name``."""
        for fused in self.fused:
            for part, pattern in enumerate(fused.experts):
                m = _expert_regex(pattern).fullmatch(name)
                if m is not None:
                    return fused, part, m.group("prefix"), int(m.group("e"))
        return None


@functools.cache
def _expert_regex(pattern: str) -> re.Pattern[str]:
    head, tail = pattern.split(EXPERT)
    return re.compile(
        rf"(?P<prefix>(?:.*\.)?){re.escape(head)}(?P<e>0|[1-9][0-9]*){re.escape(tail)}"
    )


@functools.cache
def experts_families(path: Path = EXPERTS_TABLE) -> tuple[ExpertsFamily, ...]:
    """The families of ``experts.toml``.

    Raises:
      ValueError: one line naming the file and the family or key that is wrong.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read the experts table ({e})") from None
    families = []
    for k, family in enumerate(data.get("family", [])):
        where = f"{path}: family {k + 1}"
        fused = []
        for f in family.get("fused", []):
            experts = tuple(f.get("experts", ()))
            if not experts or any(p.count(EXPERT) != 1 for p in experts):
                raise ValueError(f"{where}: each of `experts` holds {EXPERT} once, got {experts}")
            axis = f.get("axis", 1)
            if type(axis) is not int or axis < 1:
                raise ValueError(
                    f"{where}: `axis` is an axis after the experts' (>= 1), got {axis!r}"
                )
            fused.append(Fused(str(f["fused"]), experts, axis))
        renames = tuple((str(a), str(b)) for a, b in family.get("renames", {}).items())
        count = tuple(str(k) for k in family.get("count", ()))
        families.append(ExpertsFamily(tuple(family["model_types"]), tuple(fused), renames, count))
    return tuple(families)


def experts_family(config: Mapping[str, Any] | None) -> ExpertsFamily | None:
    """The experts' namings of the model ``config`` describes, ``None`` for a model
    without (or of a family the table lacks).

    >>> experts_family({"model_type": "qwen3_moe"}).fused[0].fused
    'mlp.experts.gate_up_proj'
    >>> experts_family({"model_type": "llama"}) is None
    True
    """
    model_type = (config or {}).get("model_type")
    return next((f for f in experts_families() if model_type in f.model_types), None)


class _View(SourceView):
    """A source's tensors under other names, each read as (a slice of) one of the
    source's, or made of several; everything else the source says of itself kept."""

    def __init__(self, source: TensorSource) -> None:
        super().__init__(source)
        self.notes, self.mapped = source.notes, source.mapped
        self.unapplied_ties = source.unapplied_ties

    def _renamed_ties(self, rename: dict[str, str]) -> None:
        ties = self._source.ties
        pairs = {rename.get(a, a): rename.get(c, c) for a, c in ties.items()}
        transforms = {rename.get(a, a): ties.transform(a) for a in ties}
        self.ties = AliasMap(pairs, transforms=transforms, naming=ties.naming)
        self.origins = {rename.get(a, a): o for a, o in self._source.origins.items()}


class PerExpertView(_View):
    """A source whose fused experts (of ``family``) are read as their per-expert
    tensors, under the per-expert naming.

    Raises:
      ValueError: one line: a fused tensor whose parts do not divide it, or a source
        that holds a layer's experts both fused and per expert.
    """

    def __init__(self, source: TensorSource, family: ExpertsFamily) -> None:
        super().__init__(source)
        self.family = family
        self._reads: dict[str, tuple[str, tuple[Any, ...] | None]] = {}
        infos: dict[str, ArrayInfo] = {}
        rename: dict[str, str] = {}
        for name, info in source.infos.items():
            found = family.fused_of(name)
            if found is None:
                own = family.per_expert_name(name)
                rename[name] = own
                infos[own], self._reads[own] = info, (name, None)
                continue
            fused, prefix = found
            shape = info.shape
            try:
                each = ArrayInfo(fused.per_expert_shape(shape), info.dtype)
            except ValueError as e:
                raise ValueError(
                    f"{source.where}: the fused experts {name!r} {shape} cannot hold "
                    f"{len(fused.experts)} part(s) of equal size along axis {fused.axis} ({e})."
                ) from None
            for e in range(shape[0]):
                for k, pattern in enumerate(fused.experts):
                    own = family.per_expert_name(prefix) + pattern.replace(EXPERT, str(e))
                    if own in source.infos:
                        raise ValueError(
                            f"{source.where}: {own!r} is stored, and {name!r} holds it fused "
                            "too; keep one naming (`jaxshare check` compares the two)."
                        )
                    infos[own], self._reads[own] = each, (name, fused.index(e, k, shape))
        self.infos = infos
        self._renamed_ties(rename)
        if source.layers is not None:
            self.layers = {family.per_expert_name(m): k for m, k in source.layers.items()}

    @property
    def stored(self) -> TensorSource:
        """The source as its files name its tensors (fused), as a manifest written
        with them lists them."""
        return self._source

    def array(self, name: str) -> np.ndarray:
        stored, index = self._reads[name]
        if index is None:
            return self._source.array(stored)
        return np.ascontiguousarray(self._source.read_slice(stored, index))

    def read_slice(self, name: str, index: Any) -> np.ndarray:
        stored, at = self._reads[name]
        if at is None:
            return self._source.read_slice(stored, index)
        return np.asarray(self.array(name)[index])


class FusedView(_View):
    """A source whose per-expert tensors (of ``family``) are read as the fused ones,
    each layer's experts read into one array, under the fused naming.

    Raises:
      ValueError: one line naming the layer: a missing expert (or part of one), or
        experts of unequal shapes or dtypes.
    """

    def __init__(self, source: TensorSource, family: ExpertsFamily) -> None:
        super().__init__(source)
        self.family = family
        groups: dict[str, dict[tuple[int, int], str]] = {}
        kinds: dict[str, Fused] = {}
        infos: dict[str, ArrayInfo] = {}
        rename: dict[str, str] = {}
        for name, info in source.infos.items():
            found = family.expert_of(name)
            if found is None:
                own = family.fused_name(name)
                rename[name] = own
                infos[own] = info
                continue
            fused, part, prefix, e = found
            own = family.fused_name(prefix) + fused.fused
            if own not in groups:
                groups[own], kinds[own] = {}, fused
                infos[own] = info  # (Its place; its shape below.)
            groups[own][(e, part)] = name
        self._members: dict[str, tuple[Fused, list[list[str]]]] = {}
        for own, members in groups.items():
            fused = kinds[own]
            count = 1 + max(e for e, _ in members)
            missing = [
                fused.experts[k].replace(EXPERT, str(e))
                for e in range(count)
                for k in range(len(fused.experts))
                if (e, k) not in members
            ]
            if missing:
                raise ValueError(
                    f"{source.where}: {own!r} fuses {count} experts, but "
                    f"{len(missing)} tensor(s) of them are missing (first: {missing[0]!r} "
                    f"of {own[: len(own) - len(fused.fused)] or 'the model'}); every expert "
                    "needs each of its tensors."
                )
            table = [[members[(e, k)] for k in range(len(fused.experts))] for e in range(count)]
            first = source.infos[table[0][0]]
            odd = next((n for row in table for n in row if source.infos[n] != first), None)
            if odd is not None:
                raise ValueError(
                    f"{source.where}: the experts of {own!r} differ: {table[0][0]!r} is "
                    f"{first.shape} {first.dtype}, {odd!r} is {source.infos[odd].shape} "
                    f"{source.infos[odd].dtype}; fused experts are of one shape."
                )
            infos[own] = ArrayInfo(fused.fused_shape(count, first.shape), first.dtype)
            self._members[own] = (fused, table)
        self.infos = infos
        self._stored = {own: name for name, own in rename.items()}
        self._renamed_ties(rename)
        if source.layers is not None:
            self.layers = {family.fused_name(m): k for m, k in source.layers.items()}

    def members(self, name: str) -> list[list[str]] | None:
        """The per-expert names fused into ``name``, by expert and part."""
        found = self._members.get(name)
        return None if found is None else found[1]

    def array(self, name: str) -> np.ndarray:
        found = self._members.get(name)
        if found is None:
            return self._source.array(self._stored[name])
        fused, table = found
        info = self.infos[name]
        out = np.empty(info.shape, self._source.array(table[0][0]).dtype)
        for e, row in enumerate(table):
            for k, member in enumerate(row):
                out[fused.index(e, k, info.shape)] = self._source.array(member)
        return out

    def read_slice(self, name: str, index: Any) -> np.ndarray:
        if name not in self._members:
            return self._source.read_slice(self._stored[name], index)
        return np.asarray(self.array(name)[index])


def per_expert(source: TensorSource) -> TensorSource:
    """``source`` in the per-expert naming where its config's family holds fused
    experts and it stores some (a directory ``save_original_format=False`` wrote);
    else ``source`` itself."""
    family = experts_family(source.config)
    if family is None or not any(family.fused_of(n) for n in source.infos):
        return source
    return PerExpertView(source, family)


def describe_experts(source: TensorSource) -> list[str]:
    """One line per layer of a mixture of experts: how many experts it holds, their
    tensors, and how the files store them (fused or per expert).

    >>> from jaxshare.stream import TensorSource, ArrayInfo
    >>> class Moe(TensorSource):
    ...     config = {"model_type": "qwen3_moe"}
    ...     infos = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": ArrayInfo((4, 2), "float32")
    ...              for e in range(3) for p in ("gate", "up", "down")}
    ...     def read(self, name): ...
    >>> print(*describe_experts(Moe()))  # doctest: +NORMALIZE_WHITESPACE
    experts: model.layers.0.mlp.experts: 3 experts (gate_proj.weight, up_proj.weight,
    down_proj.weight), stored per expert
    """
    family = experts_family(source.config)
    if family is None:
        return []
    stored = "fused" if isinstance(source, PerExpertView) else "per expert"
    layers: dict[str, tuple[set[int], list[str]]] = {}
    for name in source.infos:
        found = family.expert_of(name)
        if found is None:
            continue
        fused, part, prefix, e = found
        head, tail = fused.experts[part].split(EXPERT)
        experts, parts = layers.setdefault(prefix + head.rstrip("."), (set(), []))
        experts.add(e)
        if tail.lstrip(".") not in parts:
            parts.append(tail.lstrip("."))
    return [
        f"experts: {where}: {len(experts)} experts ({', '.join(parts)}), stored {stored}"
        for where, (experts, parts) in layers.items()
    ]
