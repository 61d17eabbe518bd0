"""``NamingRecord``: what a conversion did to each leaf, so its inverse is exact.

A conversion from PyTorch names each Flax leaf and may permute its axes (a
Linear ``weight`` becomes a transposed ``kernel``). Names alone cannot always
say which was done -- a square GPT-2 ``Conv1D`` weight and a Linear weight look
the same -- so the conversion records, per Flax path, the PyTorch name and the
PyTorch -> Flax axis permutation it applied. The record travels with the alias
map (``AliasMap.naming``) into Orbax items, safetensors metadata and Hugging
Face directories, and the way back reads it instead of guessing.

A leaf may be marked *implicit*: an alias the Flax model computes rather than
holds (GPT-2's ``lm_head/kernel``, which ``FlaxGPT2LMHeadModel`` computes from
``wte/embedding``). It has a PyTorch name, so the way out re-creates it, but it is
never a leaf of the Flax tree (see :attr:`jaxshare.AliasMap.implicit`).

JSON, strict like the alias map's (``"implicit": true`` only on such a leaf; a
record without it is read as before)::

    {"format": "jaxshare.naming", "version": 1,
     "leaves": {"transformer/wte/embedding": {"torch": "transformer.wte.weight"},
                "lm_head/kernel": {"torch": "lm_head.weight", "permute": [1, 0],
                                   "implicit": true}}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from jaxshare.core.frozen import FrozenMapping
from jaxshare.core.perm import Perm, as_perm
from jaxshare.core.strict_json import Kind, load_document

__all__ = [
    "EXPERT",
    "FORMAT",
    "LAYER",
    "STACKED",
    "MAX_JSON_BYTES",
    "VERSION",
    "Naming",
    "NamingRecord",
    "layer_name",
    "layer_perm",
    "lift",
    "stack_axis",
    "stack_levels",
    "stack_prefix",
]

FORMAT = "jaxshare.naming"
VERSION = 1
#: This document kind, for the strict parser.
DOCUMENT = Kind("naming record", FORMAT, VERSION)
#: ``from_json`` refuses larger input (a record is ~100 bytes per leaf).
MAX_JSON_BYTES = 64 * 2**20


#: What stands for the layer index in a stack's PyTorch name.
LAYER = "{i}"
#: What stands for the expert index in a stack of a mixture's experts
#: (``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``: layers on axis 0, experts on 1).
EXPERT = "{e}"
#: The placeholders of stacks, outermost first: a name holds each at most once, in this
#: order, and its tensor holds one axis for each, in this order, before the rest.
STACKED = (LAYER, EXPERT)


def layer_name(template: str, index: int, placeholder: str = LAYER) -> str:
    """The PyTorch name of layer (or expert) ``index`` of the stack ``template``.

    >>> layer_name("model.layers.{i}.mlp.weight", 3)
    'model.layers.3.mlp.weight'
    >>> layer_name("model.layers.3.mlp.experts.{e}.w1.weight", 0, EXPERT)
    'model.layers.3.mlp.experts.0.w1.weight'
    """
    return template.replace(placeholder, str(index), 1)


def stack_prefix(template: str, placeholder: str = LAYER) -> str | None:
    """The module prefix a stack's layers (or experts) are under (``None``: not one).

    >>> stack_prefix("model.layers.{i}.mlp.weight"), stack_prefix("wte.weight")
    ('model.layers', None)
    >>> stack_prefix("model.layers.{i}.mlp.experts.{e}.w1.weight", EXPERT)
    'model.layers.{i}.mlp.experts'
    """
    parts = template.split(".")
    return ".".join(parts[: parts.index(placeholder)]) if placeholder in parts else None


def stack_levels(template: str) -> int:
    """How many stacked axes the tensor of ``template`` has before its own (layers,
    experts).

    >>> stack_levels("model.layers.{i}.mlp.experts.{e}.w1.weight"), stack_levels("a.weight")
    (2, 0)
    """
    parts = template.split(".")
    return sum(p in parts for p in STACKED)


def lift(perm: Perm | None, ndim: int, axis: int) -> Perm | None:
    """The permutation of a stack ``(L, *layer)`` into Flax: each layer permuted by
    ``perm`` (of its ``ndim`` axes), the layer axis moved to ``axis``.

    >>> lift((1, 0), 2, 0), lift((1, 0), 2, 1), lift(None, 1, 0)
    ((0, 2, 1), (2, 0, 1), None)
    """
    if not 0 <= axis <= ndim:
        raise ValueError(f"stack axis {axis} is out of range for a stack of {ndim}-D layers.")
    per = list(range(ndim)) if perm is None else list(perm)
    lifted = [1 + p for p in per]
    lifted.insert(axis, 0)
    return as_perm(lifted)


def stack_axis(perm: Perm | None) -> int:
    """Where :func:`lift` put the layer axis.

    >>> stack_axis((2, 0, 1)), stack_axis(None)
    (1, 0)
    """
    return 0 if perm is None else perm.index(0)


def layer_perm(perm: Perm | None) -> Perm | None:
    """The permutation of one layer, :func:`lift` undone.

    >>> layer_perm((2, 0, 1)), layer_perm((0, 2, 1)), layer_perm(None)
    ((1, 0), (1, 0), None)
    """
    if perm is None:
        return None
    return as_perm([p - 1 for p in perm if p != 0])


class Naming(NamedTuple):
    """One leaf's PyTorch name and the PyTorch -> Flax permutation applied to it.

    A name with :data:`LAYER` (``model.layers.{i}.mlp.weight``) is a stack of
    layers: the leaf holds every layer's tensor, stacked on axis 0 and then
    permuted (the layer axis goes to ``stack_axis(permute)``, see
    :func:`stack_axis`).
    """

    torch: str
    permute: Perm | None = None

    @property
    def stacked(self) -> bool:
        """Whether the leaf is a stack of layers."""
        return stack_prefix(self.torch) is not None


#: What a record's constructor takes for one path: a Naming, ``(name, permutation)``, a name.
_Entry = Naming | tuple[str, Any] | str


def _check(path: Any, entry: Any) -> Naming:
    if not isinstance(path, str) or not path or path.startswith("/") or path.endswith("/"):
        raise ValueError(f"naming record: {path!r} is not a '/'-joined Flax path.")
    if isinstance(entry, str):
        entry = Naming(entry)
    elif isinstance(entry, tuple) and len(entry) == 2:
        entry = Naming(*entry)
    else:
        raise TypeError(
            f"naming record: {path!r} must map to a PyTorch name or (name, permutation), "
            f"got {entry!r}."
        )
    name = entry.torch
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"naming record: {path!r} names {name!r}, which is not a PyTorch name.")
    parts = name.split(".")
    at = [parts.index(p) for p in STACKED if p in parts]
    if (
        any(parts.count(p) > 1 or (p in name and p not in parts) for p in STACKED)
        or parts[-1] in STACKED
        or at != sorted(at)
    ):
        raise ValueError(
            f"naming record: {path!r} names {name!r}; a stack's name has {LAYER} (and an "
            f"expert stack's {EXPERT}, after it) once, as a module of its own "
            "(model.layers.{i}.mlp.experts.{e}.w1.weight)."
        )
    return Naming(name, as_perm(entry.permute, f"naming record: the permutation of {path!r}"))


class NamingRecord(FrozenMapping[str, Naming]):
    """An immutable map from Flax path to :class:`Naming` (PyTorch name, permutation).

    Args:
      entries: ``{Flax path: Naming | (name, permutation) | name}``.
      implicit: the paths of ``entries`` that are implicit ties: aliases the Flax
        model computes, never leaves of its tree (see the module docstring).

    Raises:
      TypeError, ValueError: a malformed path, name or permutation, two paths
        with one PyTorch name, or an implicit path the record does not name; the
        message names them.

    >>> r = NamingRecord({"params/h/0/c_attn/kernel": ("h.0.c_attn.weight", (1, 0))})
    >>> r["params/h/0/c_attn/kernel"]
    Naming(torch='h.0.c_attn.weight', permute=(1, 0))
    >>> NamingRecord.from_json(r.to_json()) == r
    True
    >>> head = NamingRecord({"lm_head/kernel": ("lm_head.weight", (1, 0))},
    ...                     implicit=["lm_head/kernel"])
    >>> sorted(NamingRecord.from_json(head.to_json()).implicit)
    ['lm_head/kernel']
    """

    __slots__ = ("_entries", "_implicit", "_hash")

    def __init__(
        self,
        entries: Mapping[str, _Entry] | Iterable[tuple[str, _Entry]] = (),
        /,
        *,
        implicit: Iterable[str] = (),
    ) -> None:
        checked: dict[str, Naming] = {}
        owners: dict[str, str] = {}
        for path, entry in dict(entries).items():
            naming = _check(path, entry)
            other = owners.setdefault(naming.torch, path)
            if other != path:
                raise ValueError(
                    f"naming record: {other!r} and {path!r} both name the PyTorch tensor "
                    f"{naming.torch!r}."
                )
            checked[path] = naming
        marked = frozenset(implicit)
        unknown = sorted(p for p in marked if p not in checked)
        if unknown:
            raise ValueError(
                f"naming record: `implicit` names {unknown[:5]}, which the record does not "
                "name; an implicit tie is one of its leaves."
            )
        self._entries = checked
        self._implicit = marked
        self._hash: int | None = None

    @property
    def implicit(self) -> frozenset[str]:
        """The Flax paths that are implicit ties: computed by the model, never leaves."""
        return self._implicit

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NamingRecord):
            return self._entries == other._entries and self._implicit == other._implicit
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((frozenset(self._entries.items()), self._implicit))
        return self._hash

    def __repr__(self) -> str:
        return f"NamingRecord({len(self)} leaves)"

    def rename(self, fn: Callable[[str], str]) -> NamingRecord:
        """A new record with every Flax path passed through ``fn``."""
        return NamingRecord(
            {fn(p): n for p, n in self._entries.items()}, implicit=map(fn, self._implicit)
        )

    def to_json(self, *, indent: int | None = None) -> str:
        """The versioned JSON format (paths in record order)."""
        leaves: dict[str, dict[str, Any]] = {}
        for path, n in self._entries.items():
            leaf: dict[str, Any] = {"torch": n.torch}
            if n.permute is not None:
                leaf["permute"] = list(n.permute)
            if path in self._implicit:
                leaf["implicit"] = True
            leaves[path] = leaf
        return json.dumps({"format": FORMAT, "version": VERSION, "leaves": leaves}, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes, /, *, max_bytes: int = MAX_JSON_BYTES) -> NamingRecord:
        """Parses :meth:`to_json` output, strictly.

        Raises:
          ValueError: input over ``max_bytes``, not JSON, duplicate keys, an
            unknown format or version, unexpected fields or types, or an invalid
            record. Nothing is returned half-loaded.
        """
        doc = load_document(text, DOCUMENT, {"leaves": dict}, max_bytes=max_bytes)
        entries: dict[str, Any] = {}
        implicit: list[str] = []
        fields = {"torch", "permute", "implicit"}
        for path, entry in doc["leaves"].items():
            if not isinstance(entry, dict) or not {"torch"} <= set(entry) <= fields:
                raise ValueError(
                    f"naming record: {path!r} must map to {{'torch': name[, 'permute': [...]]"
                    f"[, 'implicit': true]}}, got {entry!r}."
                )
            permute = entry.get("permute")
            if "permute" in entry and not isinstance(permute, list):
                raise ValueError(
                    f"naming record: 'permute' of {path!r} must be a list of ints, got {permute!r}."
                )
            if "implicit" in entry:
                if entry["implicit"] is not True:  # (Written only where it holds.)
                    raise ValueError(
                        f"naming record: 'implicit' of {path!r} must be true, got "
                        f"{entry['implicit']!r}."
                    )
                implicit.append(path)
            entries[path] = (entry["torch"], permute)
        try:
            return cls(entries, implicit=implicit)
        except TypeError as e:
            raise ValueError(str(e)) from None
