"""A layout as a table: entries from PyTorch names to Flax paths, the ops between.

A :class:`Table` is an ordered list of :class:`Entry`, each a PyTorch name
pattern, the Flax path pattern it maps to, and the tensor ops between the two
(:mod:`bridge.layouts.ops`), plus the ties the model keeps (:class:`TableTie`).
Patterns hold placeholders: ``{i}`` (any placeholder without listed ``parts``)
stands for a number, a layer's or an expert's; a placeholder with ``parts``
(``p = ["q", "k", "v"]``) for one of the names listed. A placeholder of the
PyTorch pattern that the Flax pattern lacks is one the entry stacks or
concatenates over: the Flax leaf holds every value's tensor (stacks one right
after another, over two placeholders: every combination's, the experts of each
layer on one axis and the layers on another). A stack with a
``when`` and ``unstacked`` stacks only where its condition holds; elsewhere each
part is a leaf of its own, at the Flax path with one segment spelled as
``unstacked`` says (MaxText's layers, scanned into ``decoder/layers/...`` or not,
``decoder/layers_{i}/...``: one entry for both).

Sizes and conditions (``when``) are expressions over the model's config
(:mod:`bridge.layouts.sizes`), so one table serves every size of a family; a
caller's options (MaxText's ``scan_layers``) are seen beside the config. The
way back is derived from the same entries (each op's inverse), never written
twice; :meth:`Table.bind` evaluates a table for one config, and the views of
:mod:`bridge.layouts.view` read a source through it, either way.

Where an entry gives its PyTorch ``shape`` and the table the ``ranges`` of its
numbered placeholders, the table knows every tensor of the config's model:
:meth:`Bound.torch_shapes` lists them, binding checks that the ops invert on
those shapes, and the views name what is missing ("the tensor
'model.layers.1.mlp.up_proj.weight' (96, 64) is missing"), what does not fit
("has shape A, but config.json (...) makes it B") and a stack of the wrong
length ("stacks 3 layers ..., but config.json has num_hidden_layers=2").

A table loads from a mapping -- Python, a TOML or JSON file -- of this form::

    name = "my-model"
    model_types = ["my_model"]               # optional: the config.json model_type(s)
    [defaults]                               # optional: config values when unset
    tie_word_embeddings = false
    [derived]                                # optional: computed when the config lacks them
    head_dim = "hidden_size // num_attention_heads"
    [ranges.i]                               # optional: {i} is 0 .. size - 1
    size = "num_hidden_layers"
    noun = "layer"                           # optional: how messages call one

    [[entry]]
    torch = "model.layers.{i}.self_attn.q_proj.weight"
    flax = "layers/{i}/attn/q/kernel"
    shape = ["num_attention_heads * head_dim", "hidden_size"]   # optional
    ops = [{permute = [1, 0]}, {split = 1, into = ["num_attention_heads", "head_dim"]}]

    [[entry]]                                # scan_layers: one leaf layers/mlp/up/kernel,
    torch = "model.layers.{i}.mlp.up_proj.weight"   # the layers on axis 0; else
    flax = "layers/mlp/up/kernel"            # one leaf per layer, layers_{i}/mlp/up/kernel
    ops = [{stack = "i", axis = 0, when = "scan_layers", unstacked = {layers = "layers_{i}"}}]

    [[entry]]
    torch = "lm_head.weight"
    flax = "head/kernel"
    optional = "tie_word_embeddings"         # true, false, or a condition

    [[tie]]
    alias = "lm_head.weight"
    canonical = "model.embed_tokens.weight"
    implicit = true                          # the model computes it: no leaf
    when = "tie_word_embeddings"

Nothing here imports torch, transformers or JAX.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.layouts.ops import AXES, Concat, Op, Stack, Stacks, When, parse_op
from bridge.layouts.sizes import Scope, evaluate, names_in

__all__ = [
    "MODULE",
    "TABLES",
    "Bound",
    "Entry",
    "Range",
    "Table",
    "TableFamily",
    "TableTie",
    "read_table",
]

Shape = tuple[int, ...]

#: The shipped tables (``jaxshare.toml``, ``transformers-flax.toml``, ``tunix/``,
#: ``maxtext/``).
TABLES = Path(__file__).parent / "tables"

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: The placeholder of any module path (``{module}.weight``): an entry holding it is
#: a naming rule for every module's leaf of that name (:attr:`Entry.any_module`).
MODULE = "module"
_NAME = r"([A-Za-z_][A-Za-z0-9_]*)"
_ANY_TORCH = re.compile(rf"\{{{MODULE}\}}\.{_NAME}")
_ANY_FLAX = re.compile(rf"(?:{_NAME}/)?\{{{MODULE}\}}/{_NAME}")


def placeholders(pattern: str) -> list[str]:
    return _PLACEHOLDER.findall(pattern)


@dataclass(frozen=True)
class Entry:
    """One row of a layout table.

    Attributes:
      torch: the PyTorch name pattern (``model.layers.{i}.mlp.up_proj.weight``).
      flax: the Flax path pattern, ``/``-separated (``layers/{i}/mlp/up/kernel``).
      ops: the ops from the PyTorch tensor(s) to the Flax leaf, in order; at most
        one stack or concat, which combines the tensors of its placeholder (a stack
        with a ``when`` only where it holds: see :attr:`unstacked`), or stacks one
        right after another, each over its own placeholder (a layer's experts on
        one axis, then the layers on another).
      parts: ``{placeholder: names}`` of the named placeholders, in stacking order. A
        named placeholder the Flax path lacks and no op combines lists other
        spellings of one tensor (``post_{p}_layernorm``, ``p = ["ffw", "ffn"]``): the
        way in takes whichever is stored, the way back writes the first.
      when: a condition on the config; the entry is inactive where it is false.
      optional: whether a source may lack the entry's tensors (else an entry that
        matches nothing is refused): true, false, or a condition on the config
        (a head that a tied model need not hold: ``"tie_word_embeddings"``).
      shape: the shape of each of its PyTorch tensors, as expressions over the
        config; ``None``: not given (the tensors are taken as they come).
      layers: for an entry of any module (:attr:`any_module`), the layer kinds it
        is for (``"linear"``, ``"embedding"``: see ``bridge.DEFAULT_LAYERS``); empty
        for any.
      ndims: for an entry of any module, the tensor ranks it is for; empty for any.
      axes: for an entry of any module, its permute: a named axis order of
        :data:`bridge.layouts.ops.AXES` (``{permute = "kernel"}``).
      collection: for an entry of any module whose Flax path has no collection
        segment, the linen collection its leaf belongs to (NNX Variables carry it).
    """

    torch: str
    flax: str
    ops: tuple[Op, ...] = ()
    parts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    when: str | None = None
    optional: bool | str = False
    shape: tuple[int | str, ...] | None = None
    layers: tuple[str, ...] = ()
    ndims: tuple[int, ...] = ()
    axes: str = "same"
    collection: str | None = None

    @property
    def any_module(self) -> bool:
        """Whether the entry is for a leaf of any module, ``{module}.weight`` ->
        ``params/{module}/kernel``: a naming rule, which the layer that holds the
        tensor (``layers``) and its rank (``ndims``) choose, not a name.

        >>> Entry("{module}.weight", "params/{module}/kernel", axes="kernel").any_module
        True
        """
        return f"{{{MODULE}}}" in self.torch

    @property
    def leaves(self) -> tuple[str | None, str, str]:
        """For an entry of any module: its collection (``None``: the path has none),
        PyTorch leaf name and Flax leaf name.

        >>> Entry("{module}.weight", "params/{module}/kernel").leaves
        ('params', 'weight', 'kernel')
        """
        m, n = _ANY_TORCH.fullmatch(self.torch), _ANY_FLAX.fullmatch(self.flax)
        assert m is not None and n is not None, self
        return n.group(1), m.group(1), n.group(2)

    @property
    def combine(self) -> Stack | Concat | None:
        """The (first) stack or concat of the entry, if any (with a ``when`` or not)."""
        ops = (op.op if isinstance(op, When) else op for op in self.ops)
        return next((op for op in ops if isinstance(op, Stack | Concat)), None)

    @property
    def respelled(self) -> Stack | None:
        """The entry's stack with a ``when`` and ``unstacked``, if any."""
        return next(
            (
                op.op
                for op in self.ops
                if isinstance(op, When) and isinstance(op.op, Stack) and op.op.unstacked
            ),
            None,
        )

    @property
    def unstacked(self) -> str | None:
        """The Flax path pattern of each part where the entry's stack, one with a
        ``when`` and ``unstacked``, does not apply; ``None`` for an entry without.

        >>> Entry("h.{i}.w", "layers/w", (parse_op({"stack": "i", "when": "scan",
        ...     "unstacked": {"layers": "layers_{i}"}}, "entry 1"),)).unstacked
        'layers_{i}/w'
        """
        combine = self.respelled
        if combine is None or combine.unstacked is None:
            return None
        segment, spelling = combine.unstacked
        return "/".join(spelling if s == segment else s for s in self.flax.split("/"))

    def resolved(self, stacked: bool) -> Entry:
        """The entry as it applies where its conditional stack does (``stacked``: a
        plain stack) or does not (no stack, the :attr:`unstacked` path); the entry
        itself where it has no such stack."""
        flax, combine = self.unstacked, self.respelled
        if flax is None or combine is None:
            return self
        ops = [op for op in self.ops if not (isinstance(op, When) and op.op is combine)]
        if not stacked:
            return replace(self, flax=flax, ops=tuple(ops))
        at = next(k for k, op in enumerate(self.ops) if isinstance(op, When) and op.op is combine)
        ops.insert(at, replace(combine, unstacked=None))
        return replace(self, ops=tuple(ops))

    def describe(self) -> str:
        """``torch -> flax``, as errors and ``inspect`` name the entry."""
        return f"{self.torch} -> {self.flax}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"torch": self.torch, "flax": self.flax}
        if self.ops:
            out["ops"] = [op.to_dict() for op in self.ops]
        if self.axes != "same":
            out["ops"] = [{"permute": self.axes}]
        for key in ("layers", "ndims"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        if self.collection is not None:
            out["collection"] = self.collection
        if self.parts:
            out["parts"] = {k: list(v) for k, v in self.parts.items()}
        if self.when is not None:
            out["when"] = self.when
        if self.optional:
            out["optional"] = self.optional
        if self.shape is not None:
            out["shape"] = list(self.shape)
        return out


@dataclass(frozen=True)
class TableTie:
    """A tie the model keeps.

    Attributes:
      alias: the PyTorch name that is not stored (``lm_head.weight``).
      canonical: the PyTorch name it is tied to.
      implicit: the model computes the alias from the canonical (``attend``,
        ``embedder.decode``, ``logits_via_embedding``): the Flax tree has no leaf
        for it. Else the Flax tree holds it as a leaf of its own (an entry places
        it), and the tie is the values' agreement.
      when: a condition on the config.
    """

    alias: str
    canonical: str
    implicit: bool = True
    when: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alias": self.alias, "canonical": self.canonical}
        if not self.implicit:
            out["implicit"] = False
        if self.when is not None:
            out["when"] = self.when
        return out


@dataclass(frozen=True)
class TableFamily:
    """How one model family's Flax port differs from a table of any module's leaves
    (transformers 4.57's Flax Llama keeps an RMS norm's ``weight``; Whisper names
    its head ``lm_head``), found by ``config.json``'s ``model_type``.

    Attributes:
      model_types: the ``config.json`` ``model_type`` s of the family.
      entries: entries of any module tried before the table's own.
      modules: PyTorch module name -> Flax module name.
      tied_leaves: PyTorch names the Flax port holds as leaves of their own even
        when ``config.json`` ties them.
      untied_leaves: the same, only where ``tie_word_embeddings`` is false.
      computed: ``{end of a PyTorch name: function}``: tensors the Flax port
        computes rather than holds, by the name of what computes them
        (``"sinusoidal_positions"``: see ``bridge.layouts.layout.COMPUTED``).
      absent: ``{architecture: PyTorch module names}`` its PyTorch class holds,
        unused, and its Flax class lacks.
    """

    model_types: tuple[str, ...]
    entries: tuple[Entry, ...] = ()
    modules: Mapping[str, str] = field(default_factory=dict)
    tied_leaves: tuple[str, ...] = ()
    untied_leaves: tuple[str, ...] = ()
    computed: Mapping[str, str] = field(default_factory=dict)
    absent: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_types": list(self.model_types)}
        if self.entries:
            out["entry"] = [e.to_dict() for e in self.entries]
        for key in ("modules", "computed"):
            if getattr(self, key):
                out[key] = dict(getattr(self, key))
        for key in ("tied_leaves", "untied_leaves"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        if self.absent:
            out["absent"] = {k: list(v) for k, v in self.absent.items()}
        return out


@dataclass(frozen=True)
class Range:
    """The values of a numbered placeholder: ``0 .. size - 1``.

    Attributes:
      size: how many, an expression over the config (``"num_hidden_layers"``).
      noun: how messages call one (``"layer"``: "layer 0's", "3 layers");
        ``None``: by the placeholder (``{i}=0``).
    """

    size: int | str
    noun: str | None = None

    def to_dict(self) -> str | int | dict[str, Any]:
        if self.noun is None:
            return self.size
        return {"size": self.size, "noun": self.noun}


@dataclass(frozen=True)
class Table:
    """A layout as data: entries, ties, and the config values its expressions read.

    Attributes:
      name: what ``layout=`` calls it.
      entries: the entries, in order (the order of the Flax leaves).
      ties: the ties the model keeps.
      model_types: the ``config.json`` ``model_type`` s it is for; empty for any.
      defaults: config values used where the config does not set them.
      derived: ``{name: expression}`` computed where the config lacks ``name``.
      ignore: PyTorch name patterns the model computes or does not use
        (``model.rotary_emb.inv_freq``): left out on the way in.
      ranges: ``{placeholder: Range}``: the values of numbered placeholders
        (``{i}``: the layers), so that a missing layer, or a stack of the wrong
        length, is named.
      families: for a table of any module's leaves (:attr:`any_module`), what
        each model family does otherwise.

    A table's entries are either all for named tensors, which its own views
    convert (:mod:`bridge.layouts.view`), or all for any module's leaves
    (``{module}.weight``): naming rules, which ``bridge.Rules`` apply with what
    they know of the model (its layers' classes, ``like=``, scanned stacks).

    >>> t = Table.from_dict({"name": "tiny", "entry": [
    ...     {"torch": "fc.weight", "flax": "fc/kernel", "ops": [{"permute": [1, 0]}]}]})
    >>> t.entries[0].describe(), t.entries[0].ops
    ('fc.weight -> fc/kernel', (Permute(perm=(1, 0)),))
    """

    name: str
    entries: tuple[Entry, ...]
    ties: tuple[TableTie, ...] = ()
    model_types: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    derived: Mapping[str, str] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    ranges: Mapping[str, Range] = field(default_factory=dict)
    families: tuple[TableFamily, ...] = ()

    def __post_init__(self) -> None:
        for k, entry in enumerate(self.entries):
            _check_entry(entry, f"entry {k + 1} ({entry.torch!r})")
        named = {p for entry in self.entries for p in entry.parts}
        for p in self.ranges:
            if p in named:
                raise ValueError(f"`ranges` numbers {{{p}}}, which an entry lists `parts` of")
        kinds = {e.any_module for e in self.entries}
        if len(kinds) > 1:
            raise ValueError(
                "its entries are either all for named tensors or all for any module's leaves "
                f"({{{MODULE}}}); found both"
            )
        family_entries = [e for f in self.families for e in f.entries]
        if not self.any_module:
            if self.families:
                raise ValueError(
                    f"`family` is for a table of any module's leaves ({{{MODULE}}}.weight)"
                )
            return
        rest = [
            key for key in ("ties", "defaults", "derived", "ignore", "ranges") if getattr(self, key)
        ]
        if rest:
            raise ValueError(
                f"a table of any module's leaves ({{{MODULE}}}.weight) takes name, entry and "
                f"family; found {rest[0].rstrip('s') if rest[0] == 'ties' else rest[0]!r}"
            )
        for entry in family_entries:
            if not entry.any_module:
                raise ValueError(f"a family's entry {entry.torch!r} is not for any module")
        tops = {e.leaves[0] is None for e in (*self.entries, *family_entries)}
        if len(tops) > 1:
            raise ValueError(
                "its Flax paths either all start with a collection (params/{module}/kernel) "
                "or none does; found both"
            )

    @property
    def any_module(self) -> bool:
        """Whether its entries are for any module's leaves (naming rules)."""
        return bool(self.entries) and self.entries[0].any_module

    @property
    def collections(self) -> bool:
        """Whether its Flax paths start with a linen collection (``params/...``)."""
        return not self.any_module or self.entries[0].leaves[0] is not None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "layout") -> Table:
        """A table from its mapping (what a TOML or JSON file holds).

        Raises:
          ValueError: one line naming ``where`` and the key: an unknown key, a
            missing one, a value of the wrong type, an op that is not one.
        """
        return _table(data, where)

    def to_dict(self) -> dict[str, Any]:
        """The mapping :meth:`from_dict` reads (JSON- and TOML-ready)."""
        out: dict[str, Any] = {"name": self.name}
        if self.model_types:
            out["model_types"] = list(self.model_types)
        if self.defaults:
            out["defaults"] = dict(self.defaults)
        if self.derived:
            out["derived"] = dict(self.derived)
        if self.ignore:
            out["ignore"] = list(self.ignore)
        if self.ranges:
            out["ranges"] = {p: r.to_dict() for p, r in self.ranges.items()}
        out["entry"] = [e.to_dict() for e in self.entries]
        if self.ties:
            out["tie"] = [t.to_dict() for t in self.ties]
        if self.families:
            out["family"] = [f.to_dict() for f in self.families]
        return out

    def bind(
        self,
        config: Mapping[str, Any] | None,
        where: str = "",
        *,
        options: Mapping[str, Any] | None = None,
    ) -> Bound:
        """The table evaluated for ``config`` (and the caller's ``options``, which
        its expressions see over the config): the active entries, ops and ties,
        every size an int.

        Raises:
          ValueError: one line: a size or condition that reads what the config does
            not set, a size that is not a positive int, an entry whose ops do not
            invert on the shapes it gives; a table of any module's leaves, which
            naming rules apply, not a bound table.
        """
        if self.any_module:
            raise ValueError(
                f"{where or self.name}: a table of any module's leaves ({{{MODULE}}}.weight) "
                "names tensors by rules (bridge.Layout.from_table), not by binding"
            )
        return Bound(self, config, where, options=options)


def _check_entry(entry: Entry, where: str) -> None:
    if entry.any_module or entry.layers or entry.ndims or entry.axes != "same":
        _check_any_module(entry, where)
        return
    if entry.collection is not None:
        raise ValueError(f"{where}: `collection` is for an entry of any module ({{{MODULE}}})")
    unstacked = entry.unstacked
    if unstacked is not None:
        _check_unstacked(entry, where)
        _check_entry(entry.resolved(True), where)
        _check_entry(entry.resolved(False), where)
        return
    for op in entry.ops:
        if isinstance(op, When) and isinstance(op.op, Stack | Concat):
            raise ValueError(
                f"{where}: a stack or concat always applies, but for a stack with `unstacked`; "
                "give the entry a `when`"
            )
        if isinstance(op, Stack) and op.unstacked is not None:
            raise ValueError(
                f"{where}: `unstacked` spells the parts where the stack's `when` does not hold; "
                "give the stack a `when`"
            )
    torch_names, flax_names = placeholders(entry.torch), placeholders(entry.flax)
    for pattern, names in ((entry.torch, torch_names), (entry.flax, flax_names)):
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: {pattern!r} uses a placeholder twice")
    at = [k for k, op in enumerate(entry.ops) if isinstance(op, Stack | Concat)]
    combines = [op for op in entry.ops if isinstance(op, Stack | Concat)]
    if len(combines) > 1 and (
        any(isinstance(op, Concat) for op in combines) or at[-1] - at[0] != len(at) - 1
    ):
        raise ValueError(
            f"{where}: at most one stack or concat per entry, or stacks one right after "
            "another (a layer's experts, then the layers)"
        )
    over = {op.over for op in combines}
    if len(over) != len(combines):
        raise ValueError(f"{where}: two stacks over one placeholder")
    missing = set(flax_names) - set(torch_names)
    if missing:
        raise ValueError(
            f"{where}: the Flax path's {{{sorted(missing)[0]}}} is not in the torch name"
        )
    for name in over:
        if name not in torch_names or name in flax_names:
            raise ValueError(
                f"{where}: it combines over {{{name}}}, which must be in the torch name and not "
                "in the Flax path"
            )
    # (A named placeholder the path lacks and nothing combines: spellings of one tensor.)
    left = set(torch_names) - set(flax_names) - over - set(entry.parts)
    if left:
        raise ValueError(
            f"{where}: {{{sorted(left)[0]}}} is in the torch name but not in the Flax path; "
            "stack or concatenate over it, or add it to the path"
        )
    for name, values in entry.parts.items():
        if name not in torch_names:
            raise ValueError(f"{where}: `parts` names {{{name}}}, which the torch name lacks")
        if not values or len(set(values)) != len(values):
            raise ValueError(f"{where}: `parts.{name}` must list distinct names")
    if entry.shape is not None and (
        not entry.shape
        or not all(isinstance(s, int | str) and not isinstance(s, bool) for s in entry.shape)
    ):
        raise ValueError(
            f"{where}: `shape` lists sizes (ints or expressions), found {entry.shape!r}"
        )


def _check_any_module(entry: Entry, where: str) -> None:
    """An entry of any module: ``{module}.LEAF`` -> ``[COLLECTION/]{module}/LEAF``,
    with at most a named permute, and layers and ranks to choose it by."""
    if not entry.any_module:
        raise ValueError(
            f"{where}: `layers`, `ndims` and a named permute are for an entry of any module "
            f"({{{MODULE}}}.weight)"
        )
    if not _ANY_TORCH.fullmatch(entry.torch):
        raise ValueError(
            f"{where}: an entry of any module names a leaf of it, '{{{MODULE}}}.weight'; "
            f"found {entry.torch!r}"
        )
    flax = _ANY_FLAX.fullmatch(entry.flax)
    if flax is None:
        raise ValueError(
            f"{where}: its Flax path is '{{{MODULE}}}/kernel' or 'params/{{{MODULE}}}/kernel' "
            f"(a collection first); found {entry.flax!r}"
        )
    if entry.collection is not None and flax.group(1) is not None:
        raise ValueError(
            f"{where}: `collection` is for a Flax path without one; {entry.flax!r} has "
            f"{flax.group(1)!r}"
        )
    for key in ("ops", "parts", "when", "optional", "shape"):
        if getattr(entry, key):
            raise ValueError(
                f"{where}: an entry of any module takes torch, flax, layers, ndims, collection "
                f'and one permute by name (ops = [{{permute = "kernel"}}]); found {key!r}'
            )
    if not isinstance(entry.axes, str) or entry.axes not in AXES:
        raise ValueError(
            f"{where}: a permute of any module is named, one of {', '.join(sorted(AXES))}; "
            f"found {entry.axes!r}"
        )
    if not all(type(n) is int and n > 0 for n in entry.ndims):
        raise ValueError(f"{where}: `ndims` lists ranks (ints > 0), found {list(entry.ndims)!r}")
    if not all(isinstance(k, str) and k for k in entry.layers):
        raise ValueError(f"{where}: `layers` lists layer kinds, found {list(entry.layers)!r}")


def _check_unstacked(entry: Entry, where: str) -> None:
    """The checks of a stack with a ``when`` and ``unstacked`` that its two
    resolved entries do not make."""
    combine = entry.respelled
    assert combine is not None and combine.unstacked is not None
    segment, spelling = combine.unstacked
    count = entry.flax.split("/").count(segment)
    if count != 1:
        raise ValueError(
            f"{where}: `unstacked` respells the segment {segment!r}, which the Flax path "
            f"{entry.flax!r} holds {'twice or more' if count else 'not'}; name one of its segments"
        )
    if placeholders(spelling) != [combine.over]:
        raise ValueError(
            f"{where}: `unstacked` spells {segment!r} as {spelling!r}, which must hold "
            f"{{{combine.over}}}, the placeholder it stacks, and no other"
        )


_TABLE_KEYS = {
    *("name", "model_types", "defaults", "derived", "ignore", "ranges", "entry", "tie"),
    "family",
}
_ENTRY_KEYS = {"torch", "flax", "shape", "ops", "parts", "when", "optional"}
_ANY_MODULE_KEYS = {"layers", "ndims", "collection"}
_FAMILY_KEYS = {
    *("model_types", "entry", "modules", "tied_leaves", "untied_leaves", "computed"),
    "absent",
}
_RANGE_KEYS = {"size", "noun"}
_TIE_KEYS = {"alias", "canonical", "implicit", "when"}


def _keys(data: Any, allowed: set[str], required: Iterable[str], where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a table of keys, found {type(data).__name__}")
    extra = sorted(set(data) - allowed)
    if extra:
        near = difflib.get_close_matches(extra[0], sorted(allowed), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(
            f"{where}: unknown key {extra[0]!r}{hint}; expected {', '.join(sorted(allowed))}"
        )
    for key in required:
        if key not in data:
            raise ValueError(f"{where}: the key {key!r} is missing")
    return data


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: expected a non-empty string, found {value!r}")
    return value


def _table(data: Any, where: str) -> Table:
    data = _keys(data, _TABLE_KEYS, ("name", "entry"), where)
    entries_data = data["entry"]
    if not isinstance(entries_data, list) or not entries_data:
        raise ValueError(f"{where}: `entry` must list one entry or more")
    entries = _entries(entries_data, where)
    families = []
    for k, f in enumerate(_list(data.get("family", []), f"{where}: `family`")):
        families.append(_family(f, f"{where}: family {k + 1}"))
    ties = []
    for k, t in enumerate(_list(data.get("tie", []), f"{where}: `tie`")):
        at = f"{where}: tie {k + 1}"
        t = _keys(t, _TIE_KEYS, ("alias", "canonical"), at)
        implicit = t.get("implicit", True)
        if not isinstance(implicit, bool):
            raise ValueError(f"{at}: `implicit` is true or false, found {implicit!r}")
        when = t.get("when")
        ties.append(
            TableTie(
                _str(t["alias"], f"{at} (`alias`)"),
                _str(t["canonical"], f"{at} (`canonical`)"),
                implicit,
                None if when is None else _expression(when, f"{at} (`when`)"),
            )
        )
    model_types = _list(data.get("model_types", []), f"{where}: `model_types`")
    derived = data.get("derived", {})
    defaults = data.get("defaults", {})
    for key, value in (("derived", derived), ("defaults", defaults)):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: `{key}` must be a table, found {value!r}")
    for name, text in derived.items():
        _expression(text, f"{where}: derived {name!r}")
    ranges_data = data.get("ranges", {})
    if not isinstance(ranges_data, Mapping):
        raise ValueError(f"{where}: `ranges` must be a table, found {ranges_data!r}")
    ranges = {}
    for name, r in ranges_data.items():
        at = f"{where}: ranges.{name}"
        if not name.isidentifier():
            raise ValueError(f"{at}: a placeholder's name is an identifier")
        if isinstance(r, Mapping):
            r = _keys(r, _RANGE_KEYS, ("size",), at)
            noun = r.get("noun")
            if noun is not None:
                _str(noun, f"{at} (`noun`)")
            r_size = r["size"]
        else:
            r_size, noun = r, None
        if type(r_size) is not int:
            r_size = _expression(r_size, f"{at} (`size`)")
        ranges[name] = Range(r_size, noun)
    try:
        return Table(
            _str(data["name"], f"{where}: `name`"),
            tuple(entries),
            tuple(ties),
            tuple(_str(m, f"{where}: `model_types`") for m in model_types),
            MappingProxyType(dict(defaults)),
            MappingProxyType(dict(derived)),
            tuple(_str(p, f"{where}: `ignore`") for p in _list(data.get("ignore", []), where)),
            MappingProxyType(ranges),
            tuple(families),
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _entries(data: list[Any], where: str) -> list[Entry]:
    entries = []
    for k, e in enumerate(data):
        at = f"{where}: entry {k + 1}"
        any_module = isinstance(e, Mapping) and f"{{{MODULE}}}" in str(e.get("torch", ""))
        allowed = _ENTRY_KEYS | (_ANY_MODULE_KEYS if any_module else set())
        e = _keys(e, allowed, ("torch", "flax"), at)
        ops_data = e.get("ops", [])
        if not isinstance(ops_data, list):
            raise ValueError(f"{at}: `ops` must be a list, found {ops_data!r}")
        axes = "same"
        if any_module:  # (One permute, by name: the entry's rank is not fixed.)
            if ops_data and (len(ops_data) > 1 or set(ops_data[0]) != {"permute"}):
                raise ValueError(
                    f"{at}: an entry of any module takes one op, a named permute "
                    f'(ops = [{{permute = "kernel"}}]); found {ops_data!r}'
                )
            axes = ops_data[0]["permute"] if ops_data else "same"
            ops_data = []
        parts = e.get("parts", {})
        if not isinstance(parts, Mapping) or not all(
            isinstance(v, list) and all(isinstance(s, str) for s in v) for v in parts.values()
        ):
            raise ValueError(f"{at}: `parts` maps placeholders to lists of names, found {parts!r}")
        when = e.get("when")
        optional = e.get("optional", False)
        if not isinstance(optional, bool):
            optional = _expression(optional, f"{at} (`optional`: true, false or a condition)")
        shape = e.get("shape")
        if shape is not None:
            shape = tuple(
                s if type(s) is int else _expression(s, f"{at} (`shape`)")
                for s in _list(shape, f"{at}: `shape`")
            )
        collection = e.get("collection")
        entry = Entry(
            _str(e["torch"], f"{at} (`torch`)"),
            _str(e["flax"], f"{at} (`flax`)"),
            tuple(parse_op(op, f"{at}, op {j + 1}") for j, op in enumerate(ops_data)),
            MappingProxyType({k: tuple(v) for k, v in parts.items()}),
            None if when is None else _expression(when, f"{at} (`when`)"),
            optional,
            shape,
            tuple(_list(e.get("layers", []), f"{at}: `layers`")),
            tuple(_list(e.get("ndims", []), f"{at}: `ndims`")),
            axes,
            None if collection is None else _str(collection, f"{at} (`collection`)"),
        )
        _check_entry(entry, at)
        entries.append(entry)
    return entries


def _family(data: Any, where: str) -> TableFamily:
    data = _keys(data, _FAMILY_KEYS, ("model_types",), where)
    maps = {}
    for key in ("modules", "computed", "absent"):
        value = data.get(key, {})
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: `{key}` must be a table, found {value!r}")
        maps[key] = value
    leaves = {
        key: tuple(_str(n, f"{where}: `{key}`") for n in _list(data.get(key, []), where))
        for key in ("tied_leaves", "untied_leaves")
    }
    return TableFamily(
        tuple(_str(m, f"{where}: `model_types`") for m in _list(data["model_types"], where)),
        tuple(_entries(_list(data.get("entry", []), f"{where}: `entry`"), where)),
        MappingProxyType({k: _str(v, f"{where}: modules.{k}") for k, v in maps["modules"].items()}),
        leaves["tied_leaves"],
        leaves["untied_leaves"],
        MappingProxyType(
            {k: _str(v, f"{where}: computed.{k}") for k, v in maps["computed"].items()}
        ),
        MappingProxyType(
            {
                k: tuple(_str(m, f"{where}: absent.{k}") for m in _list(v, where))
                for k, v in maps["absent"].items()
            }
        ),
    )


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, found {value!r}")
    return value


def _expression(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected an expression string, found {text!r}")
    try:
        names_in(text)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return text


def read_table(path: str | Path) -> Table:
    """A table from a ``.toml`` or ``.json`` file.

    Raises:
      ValueError: one line naming the file and where in it: not TOML (its line and
        column) or not JSON (its line), or a key :meth:`Table.from_dict` refuses.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the layout file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: the layout file is not UTF-8 text") from None
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not TOML ({e})") from None
    elif path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})"
            ) from None
    else:
        raise ValueError(f"{path}: a layout file ends in .toml or .json")
    return Table.from_dict(data, str(path))


def _regex(pattern: str, parts: Mapping[str, Sequence[str]]) -> re.Pattern[str]:
    out, at = [], 0
    for m in _PLACEHOLDER.finditer(pattern):
        out.append(re.escape(pattern[at : m.start()]))
        name = m.group(1)
        if name in parts:
            alternatives = "|".join(re.escape(v) for v in parts[name])
            out.append(f"(?P<{name}>{alternatives})")
        else:
            out.append(f"(?P<{name}>0|[1-9][0-9]*)")
        at = m.end()
    out.append(re.escape(pattern[at:]))
    return re.compile("".join(out))


def fill(pattern: str, values: Mapping[str, str]) -> str:
    """``pattern`` with each placeholder replaced by its value.

    >>> fill("layers.{i}.{p}_proj", {"i": "3", "p": "q"})
    'layers.3.q_proj'
    """
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], pattern)


def chain(ops: Sequence[Op], shape: Shape, where: str) -> list[Shape]:
    """The shapes before each op and after the last, from ``shape``."""
    shapes = [shape]
    for op in ops:
        try:
            shapes.append(op.shape(shapes[-1]))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return shapes


def back_chain(ops: Sequence[Op], shape: Shape, where: str) -> list[Shape]:
    """The shapes before each op and after the last, from the result's ``shape``."""
    shapes = [shape]
    for op in reversed(ops):
        try:
            shapes.append(op.back_shape(shapes[-1]))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return shapes[::-1]


@dataclass(frozen=True)
class BoundEntry:
    """An entry evaluated for one config.

    Attributes:
      entry: the entry as written.
      index: its place in the table (from 0).
      before, combine, after: its ops before its stack or concat, that op, and the
        ops after it (``before`` holds every op when there is none); the ops whose
        ``when`` is false left out. Stacks one right after another are one
        :class:`bridge.layouts.ops.Stacks`.
      torch_re, flax_re: its patterns as regular expressions.
      optional: whether a source may lack its tensors, for this config.
      shape: the shape of each of its PyTorch tensors, for this config, if given.
      count: how many tensors its stack or concat combines, where the table says
        (its placeholder's ``parts`` or ``ranges``).
      counts: for :class:`bridge.layouts.ops.Stacks`, how many values of each
        placeholder, where the table says.
      leaf_shape: the shape of its Flax leaf, where ``shape`` (and ``count``) say.
    """

    entry: Entry
    index: int
    before: tuple[Op, ...]
    combine: Stack | Stacks | Concat | None
    after: tuple[Op, ...]
    torch_re: re.Pattern[str]
    flax_re: re.Pattern[str]
    optional: bool = False
    shape: Shape | None = None
    count: int | None = None
    leaf_shape: Shape | None = None
    counts: tuple[int, ...] | None = None

    @property
    def ops(self) -> tuple[Op, ...]:
        combine = self.combine
        middle = () if combine is None else (combine,)
        if isinstance(combine, Stacks):
            middle = combine.stacks
        return (*self.before, *middle, *self.after)

    @property
    def exact(self) -> bool:
        return all(op.exact for op in self.ops)

    def describe(self) -> str:
        return f"entry {self.index + 1} ({self.entry.describe()})"


def invert_shapes(entry: BoundEntry, shape: Shape, parts: int, where: str) -> list[Shape]:
    """The PyTorch shapes a leaf of ``shape`` of ``entry`` comes back to (``parts``
    of them)."""
    combined = back_chain(entry.after, shape, where)[0]
    combine = entry.combine
    if combine is None:
        part_shapes = [combined]
    else:
        try:
            if isinstance(combine, Stack | Stacks):
                part_shapes = combine.part_shapes(combined)
            else:
                part_shapes = combine.part_shapes(combined, parts)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return [back_chain(entry.before, s, where)[0] for s in part_shapes]


def _bind_ops(ops: Sequence[Op], scope: Scope) -> tuple[Op, ...]:
    """``ops`` bound in ``scope``, those whose ``when`` is false left out."""
    out = []
    for op in ops:
        if isinstance(op, When):
            if not evaluate(op.condition, scope):
                continue
            op = op.op
        out.append(op.bind(scope))
    return tuple(out)


class Bound:
    """A table evaluated for one config: what the views read through.

    Attributes:
      table: the table.
      config: the config.
      scope: the config, with the caller's options, the table's defaults and
        derived values.
      ranges: ``{placeholder: its number of values}`` of the table's ``ranges``.
      entries: the active entries, evaluated.
      ties: the active ties.

    >>> table = Table.from_dict({"name": "t", "ranges": {"i": "layers"}, "entry": [
    ...     {"torch": "h.{i}.w", "flax": "h/w", "shape": ["d", "d"],
    ...      "ops": [{"permute": [1, 0]}, {"stack": "i", "axis": "scan_axis"}]}]})
    >>> bound = table.bind({"layers": 2, "d": 3}, options={"scan_axis": 1})
    >>> bound.entries[0].leaf_shape, bound.torch_shapes()
    ((3, 2, 3), {'h.0.w': (3, 3), 'h.1.w': (3, 3)})
    """

    def __init__(
        self,
        table: Table,
        config: Mapping[str, Any] | None,
        where: str = "",
        *,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.table = table
        self.config = config
        self.where = where or f"the {table.name} layout"
        self.scope = Scope(config, options=options, defaults=table.defaults, derived=table.derived)
        self.ranges: dict[str, int] = {}
        for p, r in table.ranges.items():
            try:
                n = evaluate(r.size, self.scope)
            except (ValueError, ArithmeticError) as e:
                raise ValueError(f"{self.where}: ranges.{p}: {e}") from None
            if type(n) is not int or n < 1:
                raise ValueError(
                    f"{self.where}: ranges.{p}: {r.size!r} is {n!r}, not a positive int"
                )
            self.ranges[p] = n
        entries = []
        for k, entry in enumerate(table.entries):
            at = f"{self.where}: entry {k + 1} ({entry.describe()})"
            if entry.when is not None and not self._holds(entry.when, at):
                continue
            if entry.unstacked is not None:
                stacked = next(
                    op for op in entry.ops if isinstance(op, When) and op.op is entry.respelled
                )
                entry = entry.resolved(self._holds(stacked.condition, at))
                at = f"{self.where}: entry {k + 1} ({entry.describe()})"
            try:
                ops = _bind_ops(entry.ops, self.scope)
                shape = None
                if entry.shape is not None:
                    shape = tuple(_dim(s, self.scope) for s in entry.shape)
            except (ValueError, ArithmeticError) as e:
                raise ValueError(f"{at}: {e}") from None
            optional = entry.optional
            if isinstance(optional, str):
                optional = self._holds(optional, at, "optional")
            combine: Stack | Stacks | Concat | None
            combine = next((op for op in ops if isinstance(op, Stack | Concat)), None)
            cut = ops.index(combine) if combine is not None else len(ops)
            end = cut + (combine is not None)
            while isinstance(combine, Stack) and end < len(ops) and isinstance(ops[end], Stack):
                end += 1
            if end - cut > 1:
                combine = Stacks(tuple(op for op in ops[cut:end] if isinstance(op, Stack)))
            count = counts = None
            if combine is not None:
                each = [
                    len(named) if (named := entry.parts.get(o)) is not None else self.ranges.get(o)
                    for o in combine.overs
                ]
                known = [n for n in each if n is not None]
                counts = tuple(known) if len(known) == len(each) else None
                count = math.prod(counts) if counts is not None else None
            bound = BoundEntry(
                entry,
                k,
                ops[:cut],
                combine,
                ops[end:],
                _regex(entry.torch, entry.parts),
                _regex(entry.flax, entry.parts),
                optional,
                shape,
                count,
                counts=counts,
            )
            entries.append(self._with_leaf_shape(bound, at))
        self.entries: tuple[BoundEntry, ...] = tuple(entries)
        self.ties: tuple[TableTie, ...] = tuple(
            t
            for t in table.ties
            if t.when is None or self._holds(t.when, f"{self.where}: tie of {t.alias!r}")
        )
        self._ignored = [re.compile(_glob(p)) for p in table.ignore]
        self._blocks = self._number_blocks()

    def _with_leaf_shape(self, entry: BoundEntry, at: str) -> BoundEntry:
        """``entry`` with the shape of its leaf, checked to invert to ``shape``."""
        shape = entry.shape
        if shape is None or (entry.combine is not None and entry.count is None):
            return entry
        parts = entry.count or 1
        part = chain(entry.before, shape, at)[-1]
        if entry.combine is not None:
            try:
                if isinstance(entry.combine, Stacks):
                    part = entry.combine.combined([part] * parts, entry.counts or ())
                else:
                    part = entry.combine.combined([part] * parts)
            except ValueError as e:
                raise ValueError(f"{at}: {e}") from None
        leaf = chain(entry.after, part, at)[-1]
        back = invert_shapes(entry, leaf, parts, at)
        if back != [shape] * parts:
            raise ValueError(
                f"{at}: on config.json's sizes ({self.described(entry)}) the ops take "
                f"{shape} to {leaf}, which comes back as {back[0]}: they do not invert."
            )
        return replace(entry, leaf_shape=leaf)

    def _holds(self, text: str, where: str, key: str = "when") -> bool:
        try:
            return bool(evaluate(text, self.scope))
        except (ValueError, ArithmeticError) as e:
            raise ValueError(f"{where}: `{key}` {e}") from None

    def ignored(self, name: str) -> bool:
        """Whether the PyTorch tensor ``name`` is one the table leaves out."""
        return any(r.fullmatch(name) for r in self._ignored)

    def implicit_tie(self, name: str) -> TableTie | None:
        """The active implicit tie whose alias is ``name``."""
        return next((t for t in self.ties if t.implicit and t.alias == name), None)

    def place_inactive(self, name: str) -> tuple[str, tuple[Op, ...]] | None:
        """Where an entry the config leaves inactive would place the PyTorch tensor
        ``name`` (the head of a tied model): its Flax path and ops, if one does and
        none of its placeholders combine."""
        active = {e.index for e in self.entries}
        for k, entry in enumerate(self.table.entries):
            if k in active or entry.combine is not None:
                continue
            m = _regex(entry.torch, entry.parts).fullmatch(name)
            if m is not None:
                return fill(entry.flax, m.groupdict()), entry.ops
        return None

    def match_torch(self, name: str) -> tuple[BoundEntry, dict[str, str]] | None:
        """The entry the PyTorch name ``name`` is one of, with its placeholders'
        values; ``None`` for none.

        Raises:
          ValueError: two entries claim it.
        """
        return self._match(name, "torch_re", f"the tensor {name!r}")

    def match_flax(self, path: str) -> tuple[BoundEntry, dict[str, str]] | None:
        """The entry the Flax path ``path`` is the leaf of, as :meth:`match_torch`."""
        return self._match(path, "flax_re", f"the leaf {path!r}")

    def _match(self, text: str, attr: str, what: str) -> tuple[BoundEntry, dict[str, str]] | None:
        found = [
            (e, m.groupdict()) for e in self.entries if (m := getattr(e, attr).fullmatch(text))
        ]
        if len(found) > 1:
            raise ValueError(
                f"{self.where}: two entries claim {what}: {found[0][0].describe()} and "
                f"{found[1][0].describe()}; make their patterns exclusive or their `when` differ."
            )
        return found[0] if found else None

    def nearest(self, text: str, *, flax: bool) -> str:
        """The entry whose pattern is nearest ``text``, as errors name it."""
        patterns: dict[str, BoundEntry | None] = {
            (e.entry.flax if flax else e.entry.torch): e for e in self.entries
        } or {(e.flax if flax else e.torch): None for e in self.table.entries}
        near = difflib.get_close_matches(text, [fill_any(p) for p in patterns], n=1, cutoff=0.0)
        if not near:
            return "the table has no entry"
        pattern = next(p for p in patterns if fill_any(p) == near[0])
        entry = patterns[pattern]
        return f"nearest: {entry.describe()}" if entry is not None else f"nearest: {pattern!r}"

    # -- what the ranges and shapes tell ------------------------------------------------

    def label(self, placeholder: str, value: str | int) -> str:
        """One value of a placeholder as messages name it: ``layer 0``, ``{i}=0``."""
        r = self.table.ranges.get(placeholder)
        if r is not None and r.noun is not None:
            return f"{r.noun} {value}"
        return f"{{{placeholder}}}={value}"

    def counted(self, placeholder: str, n: int) -> str:
        """``n`` values of a placeholder as messages say it: ``3 layers``."""
        r = self.table.ranges.get(placeholder)
        if r is not None and r.noun is not None:
            return f"{n} {r.noun}{'' if n == 1 else 's'}"
        return f"{n} values of {{{placeholder}}}"

    def beyond(self, values: Mapping[str, str]) -> str | None:
        """Why placeholder ``values`` are none of the model's (a layer past the last),
        or ``None``."""
        for p, v in values.items():
            n = self.ranges.get(p)
            if n is not None and v is not None and int(v) >= n:
                return f"{self.label(p, v)} is beyond {self.table.ranges[p].size}={n}"
        return None

    def described(self, entry: BoundEntry) -> str:
        """The config values ``entry``'s shapes read, as messages list them:
        ``llama: hidden_size=64, num_hidden_layers=3``."""
        texts = _strings(list(entry.entry.shape or ()))
        for op in entry.entry.ops:
            spec = op.to_dict()
            texts += _strings([v for k, v in spec.items() if k not in _NOT_SIZES])
        texts += [
            str(self.table.ranges[p].size)
            for p in placeholders(entry.entry.torch)
            if p in self.ranges
        ]
        names: list[str] = []
        for text in texts:
            try:
                found = sorted(names_in(text), key=text.index)
            except ValueError:
                continue
            names += [n for n in found if n not in names and n in self.scope]
        values = ", ".join(f"{n}={self.scope[n]!r}" for n in names)
        model_type = (self.config or {}).get("model_type")
        return f"{model_type}: {values}" if isinstance(model_type, str) else values

    def expand(self, entry: BoundEntry, *, flax: bool) -> list[dict[str, str]] | None:
        """Every value of the placeholders of ``entry``'s Flax path (or PyTorch name,
        other spellings of one tensor taken at their first), by their ``parts`` and
        ``ranges``; ``None`` where one has neither."""
        pattern = entry.entry.flax if flax else entry.entry.torch
        in_flax = set(placeholders(entry.entry.flax))
        overs = entry.combine.overs if entry.combine is not None else ()
        combos: list[dict[str, str]] = [{}]
        for p in placeholders(pattern):
            named = entry.entry.parts.get(p)
            if named is not None:
                values = list(named if p in in_flax or p in overs else named[:1])
            elif p in self.ranges:
                values = [str(k) for k in range(self.ranges[p])]
            else:
                return None
            combos = [{**c, p: v} for c in combos for v in values]
        return combos

    def order_key(self, entry: BoundEntry, values: Mapping[str, str]) -> tuple[Any, ...]:
        """Where a PyTorch tensor of ``entry`` with placeholder ``values`` comes in the
        model's own order (``state_dict()``'s): consecutive entries whose first
        numbered placeholder is the same form a block, listed layer by layer (a
        layer's experts within its layer, entry by entry)."""
        block, numbered = self._blocks[entry.index]
        named = entry.entry.parts
        return (
            block,
            tuple(int(values.get(p) or 0) for p in numbered[:1]),
            entry.index,
            tuple(int(values.get(p) or 0) for p in numbered[1:]),
            tuple(
                named[p].index(values[p]) if values.get(p) in named[p] else 0
                for p in placeholders(entry.entry.torch)
                if p in named
            ),
        )

    def _number_blocks(self) -> dict[int, tuple[int, tuple[str, ...]]]:
        blocks: dict[int, tuple[int, tuple[str, ...]]] = {}
        block, last = -1, None
        for e in self.entries:
            numbered = tuple(p for p in placeholders(e.entry.torch) if p not in e.entry.parts)
            if not numbered or numbered[:1] != last:
                block += 1
            blocks[e.index] = (block, numbered)
            last = numbered[:1]
        return blocks

    def torch_shapes(self) -> dict[str, Shape]:
        """Every PyTorch tensor of the config's model, by name, with its shape, in the
        model's own order (see :meth:`order_key`); the aliases of implicit ties left
        out.

        Raises:
          ValueError: an active entry gives no ``shape``, or has a placeholder with
            neither ``parts`` nor ``ranges``.
        """
        found: list[tuple[tuple[Any, ...], str, Shape]] = []
        for entry in self.entries:
            combos = self.expand(entry, flax=False)
            if entry.shape is None or combos is None:
                raise ValueError(
                    f"{self.where}: {entry.describe()} gives no `shape`, or a placeholder of "
                    "it no `ranges`: the table does not say the model's tensors."
                )
            for values in combos:
                name = fill(entry.entry.torch, values)
                if self.implicit_tie(name) is None:
                    found.append((self.order_key(entry, values), name, entry.shape))
        return {name: shape for _, name, shape in sorted(found, key=lambda t: t[0])}


#: The keys of an op's mapping that are not sizes or factors.
_NOT_SIZES = frozenset({"when", "in", "back", "stack", "concat", "axis"})


def _strings(value: Any) -> list[str]:
    """The strings in ``value`` (lists and mappings of them), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _dim(value: int | str, scope: Scope) -> int:
    n = evaluate(value, scope)
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if type(n) is not int or n < 0:
        raise ValueError(f"`shape` {value!r} is {n!r}, not a size")
    return n


def fill_any(pattern: str) -> str:
    """A pattern with every placeholder shown as ``0``, for nearness."""
    return _PLACEHOLDER.sub("0", pattern)


def _glob(pattern: str) -> str:
    return ".*".join(re.escape(part) for part in pattern.split("*"))
