"""Flax layouts: how a Flax tree names and places the tensors of a PyTorch model.

A layout is a list of naming and axis rules (:mod:`bridge.layouts.rules`) plus what it
knows of each model family's Flax port, and makes the :class:`bridge.Rules` that
placing and naming use:

- ``"jaxshare"``, the default: linen variables (``params/...``), a Linear's
  ``weight`` is its ``kernel`` transposed, GPT-2's ``Conv1D`` weight (stored
  ``(in, out)`` already) is its ``kernel`` as it is, norms' ``weight`` is ``scale``;
- ``"transformers-flax"``: exactly the ``params`` trees of transformers 4.57's
  Flax models (``FlaxGPT2LMHeadModel``, ``FlaxBertForMaskedLM``, ...): no
  collection at the top, every 2-D ``kernel`` the PyTorch weight transposed
  (GPT-2's ``FlaxConv1D`` included, whose kernel is ``(out, in)``), and the
  family quirks of :data:`TRANSFORMERS_FLAX_FAMILIES` -- RMS norms that keep
  ``weight`` (Llama, Mistral, Gemma, T5), Whisper's head named ``lm_head``, and
  Flax Llama's head, which it holds as a leaf of its own even when tied;
- ``"maxtext"``: MaxText's scanned Llama, Mistral, Gemma, Mixtral and Qwen3-MoE
  (:mod:`bridge.layouts.maxtext`);
- ``"tunix"``: google-tunix's NNX Qwen3, Qwen3-MoE, Llama 3 and Gemma 3 (text), tables by
  ``model_type`` (:mod:`bridge.layouts.tunix`).

A layout made of tables (:mod:`bridge.layouts.table`: entries from PyTorch name
patterns to Flax path patterns, with the ops between) converts through a view of
its own (:mod:`bridge.layouts.view`), either way, from the same entries; users
write their own as a TOML or JSON file (:meth:`Layout.from_file`, ``--layout
FILE``) or import a Tunix key mapping (:meth:`Layout.from_tunix`).

Ties a Flax port computes instead of storing (GPT-2's ``lm_head`` from
``wte/embedding``, BART's ``lm_head`` and both ``embed_tokens`` from ``shared``,
BERT's MLM decoder) have no leaf: they stay aliases, and what ``config.json``
ties comes back on the way out. Nothing here imports torch or transformers: the
families are known by ``config.json``'s ``model_type``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from bridge.layouts.rules import DEFAULT_RULES, Rule, Rules, RulesArg, as_rules
from bridge.layouts.table import TABLES, Table, TableFamily, read_table
from jaxshare.internal import split

if TYPE_CHECKING:  # (The command's --help lists the layouts: no source is read then.)
    from jaxshare.stream import TensorSource

__all__ = [
    "JAXSHARE",
    "LAYOUTS",
    "MAXTEXT",
    "TRANSFORMERS_FLAX",
    "TRANSFORMERS_FLAX_FAMILIES",
    "TUNIX",
    "COMPUTED",
    "Family",
    "Layout",
    "as_layout",
    "detect_layout",
    "layout_rules",
    "sinusoidal_positions",
]


def sinusoidal_positions(shape: tuple[int, ...]) -> np.ndarray:
    """The sinusoidal position table of ``shape`` ``(positions, dim)`` that Pegasus
    and Marian compute (sines in the first half, cosines in the second), in float32,
    bit for bit as transformers' PyTorch ``create_weight`` fills it.

    >>> sinusoidal_positions((3, 4))[0].tolist()  # sin 0, sin 0, cos 0, cos 0
    [0.0, 0.0, 1.0, 1.0]
    """
    positions, dim = shape
    j = np.arange(dim)
    angle = np.arange(positions)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
    sentinel = dim // 2 + dim % 2
    out = np.empty((positions, dim), np.float32)
    out[:, :sentinel] = np.sin(angle[:, 0::2])
    out[:, sentinel:] = np.cos(angle[:, 1::2])
    return out


@dataclass(frozen=True)
class Family:
    """How one model family's Flax port differs from its layout's rules.

    Attributes:
      model_types: the ``config.json`` ``model_type`` s of the family.
      rules: rules tried before the layout's own.
      modules: PyTorch module name -> Flax module name.
      tied_leaves: PyTorch names the Flax port holds as leaves of their own
        even when ``config.json`` ties them.
      untied_leaves: PyTorch names the Flax port holds as leaves of their own
        when ``config.json`` sets ``tie_word_embeddings: false``, even where the
        model class ties them all the same (transformers 5's mT5 head).
      computed: PyTorch tensors the Flax port computes rather than holds, by the
        end of their name (``embed_positions.weight``), with the function of
        their shape that computes them: no leaf on the way in (checked against
        it), written from it on the way out.
      absent: ``{architecture: PyTorch module names}`` the architecture's PyTorch
        class holds, unused, and its Flax class lacks (BigBird MLM's pooler):
        left out on the way in, one warning; missing on the way out, one warning.
    """

    model_types: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    modules: Mapping[str, str] = field(default_factory=dict)
    tied_leaves: frozenset[str] = frozenset()
    untied_leaves: frozenset[str] = frozenset()
    computed: Mapping[str, Callable[[tuple[int, ...]], np.ndarray]] = field(default_factory=dict)
    absent: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def leaves_of_their_own(self, config: Mapping[str, Any] | None) -> frozenset[str]:
        """The tied PyTorch names the Flax port of ``config`` holds as leaves."""
        untied = (config or {}).get("tie_word_embeddings") is False
        return self.tied_leaves | (self.untied_leaves if untied else frozenset())

    def computed_by(self, name: str) -> Callable[[tuple[int, ...]], np.ndarray] | None:
        """What computes the PyTorch tensor ``name`` in the Flax port, if it does."""
        return next((f for end, f in self.computed.items() if _ends(name, end)), None)

    def absent_from(self, name: str, config: Mapping[str, Any] | None) -> bool:
        """Whether the PyTorch tensor ``name`` is in a module the Flax class of
        ``config``'s architecture lacks."""
        modules = self.absent.get(((config or {}).get("architectures") or [""])[0], ())
        return any(name.startswith(f"{module}.") for module in modules)


def _ends(name: str, end: str) -> bool:
    return name == end or name.endswith(f".{end}")


#: What computes a tensor a Flax port does not hold, by the name a table's
#: ``family.computed`` gives it.
COMPUTED: Mapping[str, Callable[[tuple[int, ...]], np.ndarray]] = MappingProxyType(
    {"sinusoidal_positions": sinusoidal_positions}
)


def _family(family: TableFamily, where: str) -> Family:
    unknown = sorted(set(family.computed.values()) - set(COMPUTED))
    if unknown:
        raise ValueError(
            f"{where}: family {family.model_types[0]!r} computes a tensor by {unknown[0]!r}, "
            f"which is not one of {', '.join(sorted(COMPUTED))}"
        )
    return Family(
        family.model_types,
        rules=tuple(Rule.from_entry(e) for e in family.entries),
        modules=family.modules,
        tied_leaves=frozenset(family.tied_leaves),
        untied_leaves=frozenset(family.untied_leaves),
        computed=MappingProxyType({end: COMPUTED[f] for end, f in family.computed.items()}),
        absent=family.absent,
    )


def _tables_view(
    layout: Layout,
) -> Callable[[TensorSource, Mapping[str, Any] | None], TensorSource]:
    def view(source: TensorSource, config: Mapping[str, Any] | None) -> TensorSource:
        from bridge.layouts.view import table_view

        return table_view(layout.table_list())(source, config)

    return view


@dataclass(frozen=True)
class Layout:
    """A Flax layout: its rules, whether paths start with a collection, and what it
    knows of each family.

    Attributes:
      name: what ``layout=`` (and ``--layout``) calls it.
      rules: the naming and axis rules, in order.
      collections: whether paths start with the linen collection (``params/``).
      families: family quirks, found by ``config.json``'s ``model_type``.
      view: where the layout reshapes and rescales tensors beyond naming and
        permuting them (MaxText's heads on axes of their own, its scaled query),
        the source that reads a tree of the layout in PyTorch names, and PyTorch
        names as the tree (``view(source, config)``, by the source's naming):
        such a layout converts by its view, never by rules.

    >>> TRANSFORMERS_FLAX.family({"model_type": "llama"}).tied_leaves
    frozenset({'lm_head.weight'})
    """

    name: str
    rules: tuple[Rule, ...] = DEFAULT_RULES
    collections: bool = True
    families: tuple[Family, ...] = ()
    view: Callable[[TensorSource, Mapping[str, Any] | None], TensorSource] | None = None
    tables: tuple[Table, ...] | Callable[[], tuple[Table, ...]] = ()

    def __post_init__(self) -> None:
        if self.tables and self.view is None and not _any_module(self.tables):
            object.__setattr__(self, "view", _tables_view(self))

    def table_list(self) -> tuple[Table, ...]:
        """The layout's tables (read when first asked for, where they are files)."""
        return self.tables() if callable(self.tables) else self.tables

    @classmethod
    def from_table(cls, table: Table | Mapping[str, Any]) -> Layout:
        """The layout of one table (a :class:`bridge.layouts.table.Table` or its
        mapping, as a TOML or JSON file holds it).

        A table of named tensors converts through its view; a table of any
        module's leaves (``{module}.weight``) is the layout's naming rules, with
        its families.

        >>> layout = Layout.from_table({"name": "mine", "entry": [
        ...     {"torch": "fc.weight", "flax": "fc/kernel", "ops": [{"permute": [1, 0]}]}]})
        >>> layout.name, layout.view is not None
        ('mine', True)
        >>> rules = Layout.from_table({"name": "nnx", "entry": [{"torch": "{module}.weight",
        ...     "flax": "{module}/kernel", "ops": [{"permute": "kernel"}]}]})
        >>> rules.view is None, rules.collections, rules.rules[0].axes
        (True, False, 'kernel')
        """
        table = table if isinstance(table, Table) else Table.from_dict(table)
        if not table.any_module:
            return cls(table.name, collections=False, tables=(table,))
        return cls(
            table.name,
            tuple(Rule.from_entry(e) for e in table.entries),
            collections=table.collections,
            families=tuple(_family(f, f"layout {table.name!r}") for f in table.families),
            tables=(table,),
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Layout:
        """The layout of a ``.toml`` or ``.json`` table file (``--layout FILE``).

        Raises:
          ValueError: one line naming the file and the line or key that is wrong.
        """
        return cls.from_table(read_table(Path(path)))

    @classmethod
    def from_tunix(cls, mapping: Mapping[str, Any], *, config: Any, name: str = "tunix") -> Layout:
        """The layout of a Tunix key mapping, what ``_get_key_and_transform_mapping(cfg)``
        returns (see :func:`bridge.layouts.tunix.from_tunix`)."""
        from bridge.layouts.tunix import from_tunix

        return cls.from_table(from_tunix(mapping, config=config, name=name))

    @property
    def reshapes(self) -> bool:
        """Whether the layout has a :attr:`view` (its old flag, with a
        ``DeprecationWarning``)."""
        warnings.warn(
            "`Layout.reshapes` is now `Layout.view is not None`: a layout that reshapes "
            "converts through its view.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.view is not None

    def family(self, config: Mapping[str, Any] | None) -> Family | None:
        """The family of ``config`` (a ``config.json`` dict), ``None`` if none is known."""
        model_type = (config or {}).get("model_type")
        return next((f for f in self.families if model_type in f.model_types), None)

    def resolve(self, config: Mapping[str, Any] | None, base: RulesArg = None) -> Rules:
        """The rules of this layout for the model of ``config``; ``base`` gives the
        layer tables and list naming (a layout replaces its rule list)."""
        if self.view is not None:
            raise ValueError(
                f"the {self.name} layout reshapes tensors, which naming rules cannot: convert "
                f"its files with `jaxshare convert --layout {self.name}` (bridge.convert, "
                "bridge.save_hf), then use the Hugging Face directory or item it writes."
            )
        base = as_rules(base)
        family = self.family(config)
        return dataclasses.replace(
            base,
            rules=(*(family.rules if family else ()), *self.rules),
            collections=self.collections,
            modules=family.modules if family else {},
            tied_leaves=family.leaves_of_their_own(config) if family else frozenset(),
        )


def _any_module(tables: tuple[Table, ...] | Callable[[], tuple[Table, ...]]) -> bool:
    return not callable(tables) and any(t.any_module for t in tables)


#: jaxshare's own layout (linen variables), the default: ``tables/jaxshare.toml``,
#: whose rules are :data:`bridge.DEFAULT_RULES`.
JAXSHARE = Layout.from_table(read_table(TABLES / "jaxshare.toml"))

#: The ``params`` trees of transformers 4.57's Flax models: ``tables/transformers-flax.toml``.
TRANSFORMERS_FLAX = Layout.from_table(read_table(TABLES / "transformers-flax.toml"))

#: What transformers 4.57's Flax ports do otherwise than the transformers-flax rules
#: (its table's families).
TRANSFORMERS_FLAX_FAMILIES: tuple[Family, ...] = TRANSFORMERS_FLAX.families


def _maxtext_view(source: TensorSource, config: Mapping[str, Any] | None) -> TensorSource:
    from bridge.layouts.maxtext import maxtext_view  # (Its tables: only when asked for.)

    return maxtext_view(source, config)


def _maxtext_tables() -> tuple[Table, ...]:
    from bridge.layouts.maxtext import maxtext_tables

    return maxtext_tables()


#: MaxText's layout of the Llama, Mistral, Gemma, Mixtral and Qwen3-MoE families
#: (``params/params/decoder/layers/...``, the layers on axis 1): one table per family
#: (``bridge/layouts/tables/maxtext/``), read with MaxText's options by
#: ``bridge.layouts.maxtext``.
MAXTEXT = Layout("maxtext", DEFAULT_RULES, view=_maxtext_view, tables=_maxtext_tables)


def _tunix_tables() -> tuple[Table, ...]:
    from bridge.layouts.tunix import tunix_tables  # (Its files: only when asked for.)

    return tunix_tables()


#: google-tunix's NNX models of Qwen3, Qwen3-MoE, Llama 3 and Gemma 3 (text), by ``model_type``:
#: ``layers/0/attn/q_proj/w``, the heads on axes of their own (``bridge.layouts.tunix``).
TUNIX = Layout("tunix", collections=False, tables=_tunix_tables)


#: The layouts by name.
LAYOUTS: Mapping[str, Layout] = MappingProxyType(
    {layout.name: layout for layout in (JAXSHARE, TRANSFORMERS_FLAX, MAXTEXT, TUNIX)}
)


def as_layout(layout: str | os.PathLike[str] | Layout) -> Layout:
    """A layout by name (or itself).

    Raises:
      ValueError: an unknown name; the message lists the layouts.

    >>> as_layout("transformers-flax").collections
    False
    """
    if isinstance(layout, Layout):
        return layout
    found = LAYOUTS.get(layout) if isinstance(layout, str) else None
    if found is None and isinstance(layout, str | os.PathLike):
        if str(layout).endswith((".toml", ".json")):
            return Layout.from_file(layout)
    if found is None:
        raise ValueError(
            f"`layout` {layout!r} is not one of {', '.join(sorted(LAYOUTS))}, nor a layout "
            "file (.toml, .json)."
        )
    return found


def detect_layout(
    layout: str | Layout | None,
    paths: Sequence[str] = (),
    config: Mapping[str, Any] | None = None,
    *,
    fits: Callable[[Layout], bool] | None = None,
) -> Layout | None:
    """The layout of a Flax tree of ``paths`` (rendered) for the model ``config``
    names (a ``config.json`` dict):

    - ``layout``, when given;
    - ``None`` (jaxshare's rules, as given) without a ``config`` or ``paths``;
    - the transformers-flax layout for a tree with no collection at its top
      (``transformer/wte/embedding``): the Flax model's own ``params``;
    - for a tree whose top is the linen ``params`` collection alone
      (``params/transformer/wte/embedding``: ``{"params": params}`` as a linen
      training loop saves a Flax model's params), the transformers-flax layout
      where ``fits(layout)``, the caller's test against the config's model class,
      says that layout names every leaf under ``params/`` as a tensor of the
      model, of its shape. The paths alone cannot tell that tree from jaxshare's
      own layout, which names the same modules under ``params/`` (the two trees
      are the same for most models; GPT-2's differ only in the axis order of its
      ``Conv1D`` kernels): only the model's shapes can. Without ``fits``, or where
      it fails, such a tree is jaxshare's (``None``);
    - else ``None``.

    >>> detect_layout(None, ["transformer/wte/embedding"], {"model_type": "gpt2"}).name
    'transformers-flax'
    >>> detect_layout(None, ["params/wte/embedding"], {"model_type": "gpt2"}) is None
    True
    >>> linen = ["params/transformer/wte/embedding"]
    >>> detect_layout(None, linen, {"model_type": "gpt2"}, fits=lambda layout: True).name
    'transformers-flax'
    >>> detect_layout(None, linen, {"model_type": "gpt2"}, fits=lambda layout: False) is None
    True
    """
    if layout is not None:
        return as_layout(layout)
    if config is None or not paths:
        return None
    top = {split(path)[0] for path in paths}  # (Rendered paths, from the source: split back.)
    if not top & {"params", "batch_stats", "buffers"}:
        return TRANSFORMERS_FLAX
    if top == {"params"} and fits is not None and fits(TRANSFORMERS_FLAX):
        return TRANSFORMERS_FLAX
    return None


def layout_rules(
    layout: str | Layout | None,
    rules: RulesArg,
    config: Mapping[str, Any] | None = None,
    *,
    paths: Sequence[str] = (),
) -> Rules:
    """The rules a conversion names and places with: those of the layout
    :func:`detect_layout` finds, for ``config``'s family; else ``rules`` as given.

    >>> tree = ["transformer/wte/embedding"]
    >>> layout_rules(None, None, {"model_type": "gpt2"}, paths=tree).collections
    False
    """
    found = detect_layout(layout, paths, config)
    return as_rules(rules) if found is None else found.resolve(config, rules)
