"""Naming and axis rules: the tables a layout is made of.

A PyTorch name ``a.b.0.c.weight`` is a module path plus a leaf name; its Flax path
is ``params/a/b/0/c/kernel``: a collection, the same module path (``layers.0``
becomes linen's ``layers_0`` when asked), and a leaf name chosen by an ordered
list of :class:`Rule`. A rule also says how the axes move (``kernel`` of a
Linear is its ``weight`` transposed). The rules of a layout are data: the
entries of its table for any module (``{module}.weight`` ->
``params/{module}/kernel``, :mod:`bridge.layouts.table`), one rule each
(:meth:`Rule.from_entry`); :data:`DEFAULT_RULES` are ``tables/jaxshare.toml``'s.

Names alone are ambiguous: a 2-D ``weight`` is a Linear's (transposed), an
Embedding's (as is) or a GPT-2 ``Conv1D``'s (already ``(in, out)``). The layer
that owns the tensor decides when it is known (its kind, from a module's class:
:data:`DEFAULT_LAYERS`; from its name: :data:`DEFAULT_LAYER_NAMES`). The rules
are applied in each direction by :mod:`bridge.naming.flax_placement` (torch ->
Flax: every candidate place, best first) and :mod:`bridge.naming.torch_naming`
(Flax -> torch: the first rule whose Flax side matches).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from bridge.layouts.ops import AXES
from bridge.layouts.table import TABLES, Entry, read_table
from jaxshare.internal import Perm

__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_LAYER_NAMES",
    "DEFAULT_RULES",
    "AXES",
    "Rule",
    "Rules",
    "RulesArg",
    "as_rules",
    "class_kind",
    "layer_kind",
]


_RENAMED = (
    "`Rule.layout` is now `Rule.axes`: a layout is a model family's convention (bridge.Layout)."
)


@dataclass(frozen=True, init=False)
class Rule:
    """One naming and axis rule: a leaf's Flax name and axis order.

    Args:
      torch: the PyTorch leaf name, e.g. ``"weight"``.
      flax: the Flax leaf name, e.g. ``"kernel"``.
      layers: layer kinds (values of :data:`DEFAULT_LAYERS`) the rule is for;
        empty for any. A rule for other layers is never used for a tensor whose
        layer is known, and is a candidate for one whose layer is not.
      ndims: tensor ranks the rule is for; empty for any.
      axes: a key of :data:`AXES`: how the axes move from PyTorch to Flax.
      collection: the linen collection the leaf belongs to.
      layout: the old name of ``axes``, which works with a ``DeprecationWarning``.

    >>> r = Rule("weight", "kernel", layers=("conv",), axes="kernel")
    >>> r.perm(4)  # (O, I, H, W) -> (H, W, I, O)
    (2, 3, 1, 0)
    """

    torch: str
    flax: str
    layers: tuple[str, ...] = ()
    ndims: tuple[int, ...] = ()
    axes: str = "same"
    collection: str = "params"

    def __init__(
        self,
        torch: str,
        flax: str,
        layers: Sequence[str] = (),
        ndims: Sequence[int] = (),
        axes: str = "same",
        collection: str = "params",
        layout: str | None = None,
    ) -> None:
        # (Written out rather than generated, for the old name `layout=`.)
        if layout is not None:
            warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
            axes = layout
        given = dict(torch=torch, flax=flax, layers=tuple(layers), ndims=tuple(ndims))
        for attr, value in {**given, "axes": axes, "collection": collection}.items():
            object.__setattr__(self, attr, value)
        names = (("torch", self.torch), ("flax", self.flax), ("collection", self.collection))
        for what, name in names:
            if not isinstance(name, str) or not name or "." in name or "/" in name:
                raise ValueError(
                    f"Rule `{what}` must be one non-empty name without '.' or '/', got {name!r}."
                )
        if self.axes not in AXES:
            raise ValueError(
                f"Rule {self.torch!r} -> {self.flax!r}: unknown `axes` {self.axes!r}; "
                f"expected one of {sorted(AXES)}."
            )

    def perm(self, ndim: int) -> Perm | None:
        """The PyTorch -> Flax axis permutation for a tensor of rank ``ndim``."""
        perm = AXES[self.axes](ndim)
        return None if perm is None or perm == tuple(range(ndim)) else perm

    def fits(self, ndim: int) -> bool:
        """Whether the rule is for a tensor of rank ``ndim``: one of its ``ndims``,
        and one its axis order fits (a ``kernel`` has two axes or more).

        >>> Rule("weight", "kernel", axes="kernel").fits(1)
        False
        """
        perm = AXES[self.axes](ndim)
        fits = perm is None or sorted(perm) == list(range(ndim))
        return fits and (not self.ndims or ndim in self.ndims)

    @classmethod
    def from_entry(cls, entry: Entry) -> Rule:
        """The rule of a table's entry of any module (``{module}.weight`` ->
        ``params/{module}/kernel``).

        >>> Rule.from_entry(Entry("{module}.weight", "{module}/scale", ndims=(1,)))
        Rule(torch='weight', flax='scale', layers=(), ndims=(1,), axes='same', collection='params')
        """
        collection, torch, flax = entry.leaves
        return cls(
            torch,
            flax,
            entry.layers,
            entry.ndims,
            entry.axes,
            collection or entry.collection or "params",
        )

    @property
    def layout(self) -> str:
        """The old name of :attr:`axes` (with a ``DeprecationWarning``)."""
        warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
        return self.axes


#: The rules, in order: the jaxshare layout's table (``tables/jaxshare.toml``). See
#: the module docstring for how they are chosen.
DEFAULT_RULES: tuple[Rule, ...] = tuple(
    Rule.from_entry(entry) for entry in read_table(TABLES / "jaxshare.toml").entries
)

#: PyTorch class names (matched along the class's MRO, most derived first) -> layer kind.
#: ``Conv1D`` is Hugging Face's (GPT-2), whose ``weight`` is stored ``(in, out)``.
DEFAULT_LAYERS: Mapping[str, str] = MappingProxyType(
    {
        "Linear": "linear",
        "_ConvTransposeNd": "conv_transpose",
        "_ConvNd": "conv",
        "Conv1D": "conv1d",
        "Embedding": "embedding",
        "EmbeddingBag": "embedding",
        "_NormBase": "batch_norm",
        "LayerNorm": "norm",
        "GroupNorm": "norm",
        "RMSNorm": "norm",
    }
)

#: Module names (the last part of a module path) -> layer kind, used only where the
#: layer types are unknown (a bare state dict or file, no module and no config) and no
#: target tree (``like=``) decides, so a state dict gives the same Flax tree as its
#: module. The usual Hugging Face names: embeddings, the output heads, and GPT-2's
#: ``Conv1D`` layers (weight stored ``(in, out)``).
DEFAULT_LAYER_NAMES: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "wte", "wpe", "embed_tokens", "embed_positions", "word_embeddings",
                "position_embeddings", "token_type_embeddings", "shared", "tok_embeddings",
                "embed_in", "relative_attention_bias", "token_embedding", "position_embedding",
            ),
            "embedding",
        ),
        **dict.fromkeys(("c_attn", "c_fc", "c_proj", "q_attn"), "conv1d"),
        # Output heads: GPT-2/Llama/T5 `lm_head`, BERT `cls.predictions.decoder`,
        # RoBERTa `lm_head.decoder` (tied to the word embeddings, so often not stored).
        **dict.fromkeys(("lm_head", "decoder"), "linear"),
    }
)  # fmt: skip


@dataclass(frozen=True)
class Rules:
    """The full naming configuration, passed as ``rules=``.

    Args:
      rules: ordered :class:`Rule` list (put yours before ``DEFAULT_RULES``).
      layers: PyTorch class name -> layer kind.
      layer_names: module name -> layer kind, for modules whose layer type is
        unknown (see :data:`DEFAULT_LAYER_NAMES`); ``{}`` turns the guess off.
      linen_lists: name list items as linen does (``layers.0`` <-> ``layers_0``)
        rather than ``layers/0`` (NNX, Hugging Face). Without ``like``, going
        back splits every ``name_<digits>`` part, so a module named ``conv_1``
        would come back as ``conv.1``: pass ``like=`` the module to be exact.
      collections: whether Flax paths start with the linen collection
        (``params/wte/embedding``, linen variables); ``False``: a params tree
        without it, as Hugging Face's Flax models hold (``wte/embedding``).
      modules: PyTorch module name -> Flax module name, where a Flax port names a
        module otherwise (Whisper's ``proj_out`` is its Flax ``lm_head``).
      tied_leaves: PyTorch names that a tie makes one tensor, but that the Flax
        tree holds as a leaf of its own all the same (Flax Llama's ``lm_head``):
        written out from their canonical, not kept as an alias.
      stacks: PyTorch module prefix -> Flax axis, for scanned layers: the
        tensors ``model.layers.{k}.*`` are stacked into one leaf per weight under
        ``model/layers``, the layers on that axis (see ``docs/scanned.md``); an
        experts prefix (``'model.layers.{i}.mlp.experts'``) stacks experts the
        same way (``docs/experts.md``). Prefixes alone (a sequence, or one
        string) stack on axis 0, as ``--stack`` does.

    A :class:`bridge.Layout` makes the ``Rules`` of its Flax layout.

    >>> Rules(linen_lists=True).linen_lists
    True
    >>> dict(Rules(stacks=["model.layers", "model.layers.{i}.mlp.experts"]).stacks)
    {'model.layers': 0, 'model.layers.{i}.mlp.experts': 0}
    """

    rules: tuple[Rule, ...] = DEFAULT_RULES
    layers: Mapping[str, str] = field(default_factory=lambda: DEFAULT_LAYERS)
    linen_lists: bool = False
    layer_names: Mapping[str, str] = field(default_factory=lambda: DEFAULT_LAYER_NAMES)
    collections: bool = True
    modules: Mapping[str, str] = field(default_factory=dict)
    tied_leaves: frozenset[str] = frozenset()
    stacks: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rules = tuple(self.rules)
        bad = [r for r in rules if not isinstance(r, Rule)]
        if bad:
            raise TypeError(f"`rules` must hold Rule objects, got {bad[:3]!r}.")
        names = [*self.modules, *self.modules.values()]
        if any(not isinstance(n, str) or not n or "." in n or "/" in n for n in names):
            raise ValueError(
                f"Rules `modules` must map module names (no '.' or '/') to module names, got "
                f"{dict(self.modules)!r}."
            )
        stacks = self.stacks
        if isinstance(stacks, str):
            stacks = (stacks,)
        if not isinstance(stacks, Mapping):  # Prefixes alone: each stacked on axis 0.
            stacks = dict.fromkeys(stacks, 0)
        bad_stacks = {
            p: a
            for p, a in stacks.items()
            if not isinstance(p, str) or not p or "/" in p or type(a) is not int or a < 0
        }
        if bad_stacks:
            raise ValueError(
                "Rules `stacks` must map PyTorch module prefixes ('model.layers') to a Flax "
                f"axis >= 0, got {bad_stacks!r}."
            )
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "stacks", MappingProxyType(dict(stacks)))
        object.__setattr__(self, "layers", MappingProxyType(dict(self.layers)))
        object.__setattr__(self, "layer_names", MappingProxyType(dict(self.layer_names)))
        object.__setattr__(self, "modules", MappingProxyType(dict(self.modules)))
        object.__setattr__(self, "tied_leaves", frozenset(self.tied_leaves))


RulesArg = Rules | Sequence[Rule] | None


def as_rules(rules: RulesArg) -> Rules:
    """Accepts ``None`` (the defaults), a :class:`Rules`, or a sequence of :class:`Rule`."""
    if rules is None:
        return Rules()
    if isinstance(rules, Rules):
        return rules
    if isinstance(rules, Sequence) and not isinstance(rules, str):
        return Rules(rules=tuple(rules))
    raise TypeError(
        f"`rules` must be a bridge.Rules or a sequence of bridge.Rule, got {type(rules).__name__}."
    )


def layer_kind(module: Any, rules: Rules) -> str | None:
    """The layer kind of a ``torch.nn.Module``, ``None`` when no class in its MRO is known."""
    return class_kind([cls.__name__ for cls in type(module).__mro__], rules)


def class_kind(class_names: Sequence[str], rules: Rules) -> str | None:
    """The layer kind of a class given its MRO's names, most derived first."""
    for name in class_names:
        kind = rules.layers.get(name)
        if kind is not None:
            return kind
    return None
