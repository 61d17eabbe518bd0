"""Naming and layout rules: where a PyTorch tensor goes in a Flax tree, and back.

A PyTorch name ``a.b.0.c.weight`` is a module path plus a leaf name; its Flax path
is ``params/a/b/0/c/kernel``: a collection, the same module path (``layers.0``
becomes linen's ``layers_0`` when asked), and a leaf name chosen by an ordered
list of :class:`Rule`. A rule also says how the axes move (``kernel`` of a
Linear is its ``weight`` transposed).

Names alone are ambiguous: a 2-D ``weight`` is a Linear's (transposed), an
Embedding's (as is) or a GPT-2 ``Conv1D``'s (already ``(in, out)``). The layer
that owns the tensor decides when it is known (from a module: its class, looked
up in :data:`DEFAULT_LAYERS`); otherwise every rule for the name is a candidate,
in order, and the first wins -- unless a target tree (``like=``) picks the one
whose path and shape it has. The first candidate for an unknown 2-D ``weight``
is Hugging Face's default, ``kernel = weight.T``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from jaxshare.internal import LAYER, Perm, lift

__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_LAYER_NAMES",
    "DEFAULT_RULES",
    "LAYOUTS",
    "Rule",
    "Rules",
    "RulesArg",
    "Candidate",
    "TorchLeaf",
    "as_rules",
    "candidates",
    "class_kind",
    "guess_kind",
    "layer_kind",
    "module_variants",
    "torch_name",
]


def _kernel(ndim: int) -> Perm:
    """(O, I, *S) -> (*S, I, O): Linear (a 2-D transpose) and ConvNd."""
    return (*range(2, ndim), 1, 0)


def _transposed_kernel(ndim: int) -> Perm:
    """(I, O, *S) -> (*S, I, O): ConvTransposeNd."""
    return (*range(2, ndim), 0, 1)


#: Named layouts: ``ndim -> permutation`` from the PyTorch to the Flax axis order.
LAYOUTS: Mapping[str, Callable[[int], Perm | None]] = MappingProxyType(
    {"same": lambda ndim: None, "kernel": _kernel, "transposed_kernel": _transposed_kernel}
)


@dataclass(frozen=True)
class Rule:
    """One naming and layout rule.

    Args:
      torch: the PyTorch leaf name, e.g. ``"weight"``.
      flax: the Flax leaf name, e.g. ``"kernel"``.
      layers: layer kinds (values of :data:`DEFAULT_LAYERS`) the rule is for;
        empty for any. A rule for other layers is never used for a tensor whose
        layer is known, and is a candidate for one whose layer is not.
      ndims: tensor ranks the rule is for; empty for any.
      layout: a key of :data:`LAYOUTS`: how the axes move from PyTorch to Flax.
      collection: the linen collection the leaf belongs to.

    >>> r = Rule("weight", "kernel", layers=("conv",), layout="kernel")
    >>> r.perm(4)  # (O, I, H, W) -> (H, W, I, O)
    (2, 3, 1, 0)
    """

    torch: str
    flax: str
    layers: tuple[str, ...] = ()
    ndims: tuple[int, ...] = ()
    layout: str = "same"
    collection: str = "params"

    def __post_init__(self) -> None:
        names = (("torch", self.torch), ("flax", self.flax), ("collection", self.collection))
        for what, name in names:
            if not isinstance(name, str) or not name or "." in name or "/" in name:
                raise ValueError(
                    f"Rule `{what}` must be one non-empty name without '.' or '/', got {name!r}."
                )
        if self.layout not in LAYOUTS:
            raise ValueError(
                f"Rule {self.torch!r} -> {self.flax!r}: unknown `layout` {self.layout!r}; "
                f"expected one of {sorted(LAYOUTS)}."
            )
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "ndims", tuple(self.ndims))

    def perm(self, ndim: int) -> Perm | None:
        """The PyTorch -> Flax axis permutation for a tensor of rank ``ndim``."""
        perm = LAYOUTS[self.layout](ndim)
        return None if perm is None or perm == tuple(range(ndim)) else perm

    def fits(self, ndim: int) -> bool:
        return not self.ndims or ndim in self.ndims


#: The rules, in order. See the module docstring for how they are chosen.
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("weight", "kernel", layers=("linear", "conv"), ndims=(2, 3, 4, 5), layout="kernel"),
    Rule(
        "weight", "kernel", layers=("conv_transpose",), ndims=(3, 4, 5), layout="transposed_kernel"
    ),
    Rule("weight", "kernel", layers=("conv1d",), ndims=(2,)),
    Rule("weight", "embedding", layers=("embedding",), ndims=(2,)),
    Rule("weight", "scale", layers=("norm", "batch_norm")),
    Rule("bias", "bias"),
    Rule("running_mean", "mean", layers=("batch_norm",), collection="batch_stats"),
    Rule("running_var", "var", layers=("batch_norm",), collection="batch_stats"),
    Rule(
        "num_batches_tracked",
        "num_batches_tracked",
        layers=("batch_norm",),
        collection="batch_stats",
    ),
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
        ``model/layers``, the layers on that axis (see ``docs/scanned.md``).

    A :class:`bridge.Layout` makes the ``Rules`` of its Flax layout.

    >>> Rules(linen_lists=True).linen_lists
    True
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
        bad_stacks = {
            p: a
            for p, a in dict(self.stacks).items()
            if not isinstance(p, str) or not p or "/" in p or type(a) is not int or a < 0
        }
        if bad_stacks:
            raise ValueError(
                "Rules `stacks` must map PyTorch module prefixes ('model.layers') to a Flax "
                f"axis >= 0, got {bad_stacks!r}."
            )
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "stacks", MappingProxyType(dict(self.stacks)))
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


def guess_kind(module: str, rules: Rules) -> str | None:
    """The layer kind :attr:`Rules.layer_names` gives a module path such as
    ``'transformer.wte'`` (by its last part), or ``None``.

    >>> guess_kind("transformer.h.0.attn.c_attn", Rules()), guess_kind("enc", Rules())
    ('conv1d', None)
    """
    return rules.layer_names.get(module.rpartition(".")[2]) if module else None


@dataclass(frozen=True)
class TorchLeaf:
    """One PyTorch tensor as the rules see it.

    Attributes:
      key: the state-dict name, ``"h.0.attn.c_attn.weight"``.
      shape: its shape.
      layer: the kind of the module that owns it, ``None`` if unknown.
      buffer: ``True`` for a buffer, ``False`` for a parameter, ``None`` if unknown.
      stack: for a stack of layers (a key with ``{i}``, shape ``(L, *layer)``),
        the Flax axis the layers go on; ``None``: not a stack, or (with ``like=``)
        to be found from the target's shapes.
    """

    key: str
    shape: tuple[int, ...]
    layer: str | None = None
    buffer: bool | None = None
    stack: int | None = None

    @property
    def stacked(self) -> bool:
        """Whether this is a stack of layers (its key has ``{i}``)."""
        return LAYER in self.key.split(".")

    @property
    def module(self) -> tuple[str, ...]:
        return tuple(self.key.split(".")[:-1])

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Candidate:
    """Where a tensor goes: its collection, Flax leaf name and axis permutation."""

    collection: str
    name: str
    perm: Perm | None


def candidates(leaf: TorchLeaf, rules: Rules) -> list[Candidate]:
    """Every place ``leaf`` can go, best first, distinct.

    The last candidate keeps the PyTorch name and layout, in ``params`` (or in
    ``buffers`` for a known buffer).

    >>> [(t.name, t.perm) for t in candidates(TorchLeaf("head.weight", (3, 2)), Rules())]
    [('kernel', (1, 0)), ('kernel', None), ('embedding', None), ('scale', None), ('weight', None)]
    >>> candidates(TorchLeaf("wte.weight", (3, 2), layer="embedding"), Rules())
    [Candidate(collection='params', name='embedding', perm=None)]
    """
    ndim = len(leaf.shape) - leaf.stacked  # (A stack's rules are its layers'.)
    axes = [leaf.stack or 0] if leaf.stacked else [None]
    out: list[Candidate] = []
    for rule in rules.rules:
        if rule.torch != leaf.name or not rule.fits(ndim):
            continue
        if leaf.layer is not None and rule.layers and leaf.layer not in rule.layers:
            continue
        for axis in axes:
            perm = rule.perm(ndim) if axis is None else lift(rule.perm(ndim), ndim, axis)
            target = Candidate(rule.collection, rule.flax, perm)
            if target not in out:
                out.append(target)
    if not out or leaf.layer is None:
        perm = None if axes[0] is None else lift(None, ndim, axes[0])
        fallback = Candidate("buffers" if leaf.buffer else "params", leaf.name, perm)
        if fallback not in out:
            out.append(fallback)
    return out


_LIST_ITEM = re.compile(r"^(.*?[^_\d].*?)((?:_\d+)+)$")


def module_variants(
    module: tuple[str, ...], linen_lists: bool, renames: Mapping[str, str] | None = None
) -> list[tuple[str, ...]]:
    """The Flax spellings of a PyTorch module path, preferred first (``renames``:
    PyTorch module name -> Flax module name, :attr:`Rules.modules`).

    >>> module_variants(("h", "0", "attn"), linen_lists=False)
    [('h', '0', 'attn'), ('h_0', 'attn')]
    >>> module_variants(("wte",), linen_lists=True)
    [('wte',)]
    >>> module_variants(("proj_out",), False, {"proj_out": "lm_head"})
    [('lm_head',)]
    """
    if renames:
        module = tuple(renames.get(part, part) for part in module)
    module = tuple(part for part in module if part != LAYER)  # A stack: the layers' module.
    linen: list[str] = []
    for part in module:
        if part.isdigit() and linen:
            linen[-1] = f"{linen[-1]}_{part}"
        else:
            linen.append(part)
    variants = [module, tuple(linen)]
    if linen_lists:
        variants.reverse()
    return list(dict.fromkeys(variants))


def torch_name(
    path: tuple[str, ...], ndim: int, collection: str | None, rules: Rules
) -> tuple[str, Perm | None]:
    """The PyTorch name of the Flax leaf at ``path`` (collection removed) and the
    PyTorch -> Flax permutation it was stored with: the first rule whose Flax
    side (collection, leaf name, rank) matches; otherwise the name is kept. A
    ``None`` collection (a tree without collections) matches any.

    >>> torch_name(("h_0", "mlp", "kernel"), 2, "params", Rules(linen_lists=True))
    ('h.0.mlp.weight', (1, 0))
    >>> torch_name(("bn", "mean"), 1, "batch_stats", Rules())
    ('bn.running_mean', None)
    """
    *module, name = path
    if rules.linen_lists:
        module = [p for part in module for p in _split_list_item(part)]
    if rules.modules:
        back = {flax: torch for torch, flax in rules.modules.items()}
        module = [back.get(part, part) for part in module]
    stack = _stack_of(module, rules) if ndim else None
    if stack is not None:  # The layers' rules, the layer axis lifted out of the way.
        prefix, axis = stack
        module = [*module[:prefix], LAYER, *module[prefix:]]
        ndim -= 1
    perm: Perm | None = None
    for rule in rules.rules:
        if rule.flax == name and collection in (None, rule.collection) and rule.fits(ndim):
            name, perm = rule.torch, rule.perm(ndim)
            break
    if stack is not None:
        perm = lift(perm, ndim, stack[1])
    return ".".join([*module, name]), perm


def _stack_of(module: list[str], rules: Rules) -> tuple[int, int] | None:
    """``(length of the prefix, Flax axis)`` of the stack a module is in, if any."""
    for prefix, axis in sorted(rules.stacks.items(), key=lambda item: -len(item[0])):
        parts = prefix.split(".")
        if module[: len(parts)] == parts:
            return len(parts), axis
    return None


def _split_list_item(part: str) -> list[str]:
    m = _LIST_ITEM.match(part)
    if m is None:
        return [part]
    return [m.group(1), *m.group(2)[1:].split("_")]
