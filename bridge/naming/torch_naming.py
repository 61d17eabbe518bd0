"""Flax -> torch naming: the PyTorch name and axis order of every leaf of a Flax tree.

Naming reads only paths, shapes, the alias map and its naming record -- never an
array -- and decides, for every Flax path, the PyTorch name and the PyTorch ->
Flax permutation its tensor is stored with: a :class:`TorchNaming`.
:func:`bridge.to_torch` moves the values after it, :func:`bridge.torch_plan`
streams them into files after it (an Orbax item to safetensors or a Hugging Face
directory), and :func:`bridge.torch_alias_map` keeps only its ties.

A naming record (what a conversion from PyTorch recorded) names each leaf
exactly; otherwise the rules do (:mod:`bridge.layouts.rules`), or a target module or
state dict (``like=``), whose names and layer types decide. This module never
imports torch: ``jaxshare convert ckpt out.safetensors --names torch`` names an
Orbax item's arrays without paying for torch's import. Only naming after a live
module (``like=``) touches torch, through that module, and the config's model class
on the meta device, built (where transformers is installed) only for a tree under a
linen ``params`` collection that the two layouts name otherwise.

Which layout a Flax tree is in has one answer here, :func:`flax_layout`, which every
route that names a Flax tree in PyTorch asks (:func:`torch_plan`, so ``check``,
``verify`` and ``convert --names torch``; :func:`bridge.to_torch`; ``save_hf``):
:func:`bridge.detect_layout`'s rule, with the model's tensors (:class:`ModelTensors`:
``like``, or the config's model class on the meta device, where transformers is
installed) as its test of a tree under a linen ``params`` collection.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.layouts.layout import (
    TRANSFORMERS_FLAX,
    Layout,
    as_layout,
    detect_layout,
    layout_rules,
)
from bridge.layouts.rules import Rules, RulesArg, as_rules
from bridge.naming.flax_placement import place_in, stack_layers, torch_leaves
from jaxshare import AliasMap, NamingRecord
from jaxshare.internal import (
    EXPERT,
    LAYER,
    Perm,
    as_alias_map,
    compose,
    inverse,
    is_nnx_module,
    is_nnx_state,
    is_variable,
    lift,
    nest,
    permute_shape,
    render,
    render_part,
    split,
    unstacked,
    variable_value,
)
from jaxshare.stream import ArrayInfo, Plan, PlanEntry, TensorSource

if TYPE_CHECKING:
    from bridge.sources.registry import Source

__all__ = [
    "ModelTensors",
    "TorchNaming",
    "flax_layout",
    "flax_variables",
    "in_torch_names",
    "model_config",
    "name_leaves",
    "torch_alias_map",
    "torch_aliases",
    "torch_plan",
]


_NNX_COLLECTIONS = {"Param": "params", "BatchStat": "batch_stats"}

_LIST_ITEM = re.compile(r"^(.*?[^_\d].*?)((?:_\d+)+)$")


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
    experts = _experts_of(module, rules) if ndim else None
    if experts is not None:  # A layer's experts, first among its axes.
        module = [*module[:experts], EXPERT, *module[experts:]]
        ndim -= 1
    perm: Perm | None = None
    for rule in rules.rules:
        if rule.flax == name and collection in (None, rule.collection) and rule.fits(ndim):
            name, perm = rule.torch, rule.perm(ndim)
            break
    if experts is not None:
        perm, ndim = lift(perm, ndim, 0), ndim + 1
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


def _experts_of(module: list[str], rules: Rules) -> int | None:
    """The length of the experts prefix (``model.layers.{i}.mlp.experts``, in
    ``rules.stacks``) a module is in, if any: its ``{i}`` stands for the layers' stack
    or any layer's index."""
    for prefix in sorted(rules.stacks, key=len, reverse=True):
        parts = prefix.split(".")
        if LAYER not in parts or len(module) <= len(parts):
            continue
        if all(
            p == m or (p == LAYER and (m == LAYER or m.isdigit()))
            for p, m in zip(parts, module, strict=False)
        ):
            return len(parts)
    return None


def _split_list_item(part: str) -> list[str]:
    m = _LIST_ITEM.match(part)
    if m is None:
        return [part]
    return [m.group(1), *m.group(2)[1:].split("_")]


@dataclass(frozen=True)
class _FlaxLeaf:
    path: str  # the rendered path: the leaf's name in alias maps and naming records
    full: tuple[str, ...]  # the path as a tuple
    parts: tuple[str, ...]  # the path without its collection
    collection: str | None  # None: the tree has no collections
    value: Any  # the array (a _Shape for an alias the tree does not hold)


@dataclass(frozen=True)
class _Shape:
    """Stands in for an alias's array that the tree does not hold."""

    shape: tuple[int, ...]


def _flax_leaves(tree: Any) -> list[_FlaxLeaf]:
    """Every array of ``tree`` in insertion order, with its collection."""
    # Linen variables have their collections at the top; NNX Variables carry theirs.
    top = list(tree) if isinstance(tree, Mapping) else []
    collections = (
        not is_nnx_state(tree)
        and bool(top)
        and ("params" in top or all(k in {"batch_stats", "buffers"} for k in top))
    )
    out: list[_FlaxLeaf] = []

    def visit(node: Any, keys: tuple[Any, ...]) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                visit(child, (*keys, key))
            return
        if node is None:
            return
        full = tuple(render_part(key, keys) for key in keys)
        path = render(full)
        if is_variable(node):
            collection = _NNX_COLLECTIONS.get(type(node).__name__, type(node).__name__.lower())
            parts, value = full, variable_value(node)
        elif collections:
            collection, parts, value = full[0], full[1:], node
        else:
            collection, parts, value = None, full, node
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"`variables` leaf {path!r} is a {type(value).__name__}, not an array.")
        out.append(_FlaxLeaf(path, full, parts, collection, value))

    visit(tree, ())
    return out


@dataclass(frozen=True)
class TorchNaming:
    """The PyTorch name of every leaf of a Flax tree, decided from metadata alone:
    what :func:`name_leaves` returns.

    Attributes:
      names: Flax path -> ``(PyTorch name, PyTorch -> Flax permutation)``, for
        every leaf and alias that has a PyTorch name.
      leaves: Flax path -> the leaf (an alias the tree does not hold stands in
        with its shape).
      alias_map: the ties, in Flax paths.
      order: the Flax paths in output order.
      like_keys: the output's names in order, when a target (``like=``) gave them.
      fills: ``{PyTorch name: PyTorch name}`` of the names ``like`` ties to another
        that no Flax leaf holds (a head the Flax model computes from the
        embedding): each is that tensor again.
    """

    names: dict[str, tuple[str, Perm | None]]
    leaves: dict[str, _FlaxLeaf]
    alias_map: AliasMap
    order: list[str]
    like_keys: list[str] | None
    fills: dict[str, str] = field(default_factory=dict)

    def plan(self) -> Plan:
        """The streaming plan: each stored Flax path written under its PyTorch
        name, in PyTorch axis order. Its alias map is in PyTorch names: a tie whose
        axis orders cancel is an identical alias (stored once), one whose axis orders
        differ an alias with a transform; its naming record maps the Flax paths
        to the PyTorch names."""
        flax_ties = self.alias_map
        entries = []
        for path in self.order:
            if path in flax_ties:
                continue
            name, perm = self.names[path]
            back = inverse(perm)
            info = self.leaves[path].value
            shape = permute_shape(tuple(info.shape), back)
            entries.append(PlanEntry(name, path, back, ArrayInfo(shape, str(info.dtype))))
        aliases: dict[str, str] = {}
        transforms: dict[str, Any] = {}
        for alias, canonical in flax_ties.items():
            if alias not in self.names:
                continue  # `like` has no place for it: PyTorch has no name for it.
            (a_name, a_perm), (c_name, c_perm) = self.names[alias], self.names[canonical]
            # torch alias = T(flax alias, a^-1) = T(flax canonical, a^-1 . t), and
            # flax canonical = T(torch canonical, c).
            aliases[a_name] = c_name
            transforms[a_name] = compose(
                compose(inverse(a_perm), flax_ties.transform(alias)), c_perm
            )
        aliases.update(self.fills)
        # (The Flax paths the model computes stay marked so in the record: read back
        # into Flax, they are ties again, and no leaves.)
        implicit = [p for p in self.order if p in flax_ties.implicit]
        naming = NamingRecord({p: self.names[p] for p in self.order}, implicit=implicit)
        return Plan(tuple(entries), AliasMap(aliases, transforms=transforms, naming=naming))


def name_leaves(
    tree: Any,
    amap: AliasMap,
    like: Source | None,
    rules: Rules,
    filled_by_map: Collection[str] = (),
) -> TorchNaming:
    """Names every leaf (and alias) of ``tree``. With ``like``, its names are the
    output's: each must be placed, but for ``filled_by_map`` (the aliases of a
    PyTorch-named map, filled afterwards)."""
    flat = _flax_leaves(tree)
    leaves = {leaf.path: leaf for leaf in flat}
    missing = sorted({c for c in amap.values() if c not in leaves})
    if missing:
        raise ValueError(
            f"`variables` has no array at canonical path(s) {missing[:5]} named by the alias "
            "map; was the map made for another tree?"
        )
    held = [a for a in amap if a in leaves]
    if held:  # The tree holds aliases too: each must be its canonical (transformed).
        from jaxshare import dedupe  # (JAX: the tree holds arrays.)

        try:
            dedupe(
                tree,
                AliasMap(
                    {a: amap[a] for a in held}, transforms={a: amap.transform(a) for a in held}
                ),
            )
        except ValueError as e:
            raise ValueError(
                f"`variables` and the alias map disagree, so one PyTorch tensor cannot hold "
                f"both names of a tie ({e}). Were the copies trained apart? Train with a "
                "`jaxshare.Tied`, or pass an alias map without these ties."
            ) from None
    for alias, canonical in amap.items():
        c = leaves[canonical]
        shape = permute_shape(tuple(c.value.shape), amap.transform(alias))
        if alias not in leaves:
            full = split(alias)  # (A name from the alias map: an edge.)
            if c.parts != c.full:  # The tree has collections.
                collection, parts = full[0], full[1:]
            else:
                collection, parts = c.collection, full
            leaves[alias] = _FlaxLeaf(alias, full, parts, collection, _Shape(shape))
    present = {leaf.path for leaf in flat}
    order = [leaf.path for leaf in flat] + sorted(a for a in amap if a not in present)
    names: dict[str, tuple[str, Perm | None]] = {}
    like_keys = None
    fills: dict[str, str] = {}
    if like is None:
        record = amap.naming or NamingRecord()
        for path in order:
            leaf = leaves[path]
            ndim = len(leaf.value.shape)
            recorded = record.get(path)
            if recorded is None:
                names[path] = torch_name(leaf.parts, ndim, leaf.collection, rules)
            elif recorded.permute is not None and len(recorded.permute) != ndim:
                raise ValueError(
                    f"{path!r} has shape {tuple(leaf.value.shape)}, but the naming record "
                    f"permutes it by {list(recorded.permute)}: the tree is not the one the "
                    "record was made for."
                )
            else:
                names[path] = recorded
    else:
        from bridge.sources.registry import open_source

        index = {leaf.full: tuple(leaf.value.shape) for leaf in leaves.values()}
        # Layers the tree holds stacked (a scanned model's) are named as stacks.
        target = stack_layers(open_source(like, rules, arg="like"), rules, index)
        torch_side = torch_leaves(target, rules, guess=False)
        # A name `like` ties to another needs no leaf: the Flax model may compute it
        # (an `attend` head, Hugging Face's tied heads); it is that tensor again.
        optional = {*filled_by_map, *target.ties}
        places, problems = place_in(torch_side, index, rules, optional=optional, what="`variables`")
        fills = {a: c for a, c in target.ties.items() if a not in places and c in places}
        claimed = {s.name for s in places.values()}
        unclaimed = [p for p in order if p not in claimed and p not in amap]
        if unclaimed:
            problems.append(f"leaves of `variables` with no name in `like`: {unclaimed[:10]}")
        if problems:
            raise ValueError(
                "cannot name the Flax leaves after `like`:\n  "
                + "\n  ".join(problems)
                + "\nCheck that `variables` belong to this model, or pass `rules=` (scanned "
                "layers, one leaf per weight for all layers: `--stack PREFIX`, "
                "`Rules(stacks=...)`; see docs/scanned.md)."
            )
        names = {s.name: (key, s.perm) for key, s in places.items()}
        order = [places[leaf.key].name for leaf in torch_side if leaf.key in places]
        like_keys = [leaf.key for leaf in torch_side if leaf.key in places or leaf.key in fills]
    seen: dict[str, str] = {}
    for path in order:
        key = names[path][0]
        if key in seen:
            raise ValueError(
                f"{path!r} and {seen[key]!r} both map to the PyTorch name {key!r}; pass "
                "`rules=` (or `like=`) that tell them apart."
            )
        seen[key] = path
    return TorchNaming(names, leaves, amap, order, like_keys, fills)


def model_name(config: Mapping[str, Any]) -> str:
    """The model class a ``config.json`` names, as a message names it.

    >>> model_name({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    'GPT2LMHeadModel'
    """
    return str((config.get("architectures") or [config.get("model_type", "the model")])[0])


@dataclass(frozen=True)
class ModelTensors:
    """The tensors of the model a Flax tree is named for: what a layout's PyTorch
    names must fit (:meth:`misfit`), which tells the transformers-flax layout from
    jaxshare's under a linen ``params`` collection.

    Attributes:
      names: ``{PyTorch name: shape}`` of every tensor of the model, tied ones included.
      what: the model, as a message names it (``GPT2LMHeadModel``).
      load_name: the name in :attr:`names` that transformers loads a file's tensor
        name as (:attr:`bridge.hf.config.ConfigTies.load_name`); the name itself
        where nothing renames it.

    >>> from jaxshare.stream import ArrayInfo, Plan, PlanEntry
    >>> model = ModelTensors({"wte.weight": (4, 2)}, "Tiny")
    >>> def plan(shape):
    ...     info = ArrayInfo(shape, "float32")
    ...     return Plan((PlanEntry("wte.weight", "params/wte/embedding", None, info),), AliasMap())
    >>> model.misfit(plan((4, 2)), as_layout("transformers-flax"), "item") is None
    True
    >>> print(model.misfit(plan((2, 4)), as_layout("transformers-flax"), "item"))
    ... # doctest: +NORMALIZE_WHITESPACE
    item: the Flax leaf 'params/wte/embedding' fits no layout: the transformers-flax layout
    names it 'wte.weight' (2, 4), but Tiny holds it as (4, 2) (nearest: wte.weight); pass
    `layout=` (--layout) the tree's layout, or convert a tree of this model.
    """

    names: Mapping[str, tuple[int, ...]]
    what: str = "the model"
    load_name: Callable[[str], str] = field(default=str, repr=False, compare=False)

    @classmethod
    def of_class(cls, found: Any, config: Mapping[str, Any]) -> ModelTensors | None:
        """The tensors of ``config``'s model class, as :func:`bridge.hf.config.config_ties`
        found them (``found``); ``None`` where it built no model class."""
        if found.names is None:
            return None
        return cls(found.names, model_name(config), found.load_name)

    @classmethod
    def of(
        cls, like: Any, config: Mapping[str, Any] | None, rules: RulesArg = None
    ) -> ModelTensors | None:
        """The tensors of ``like`` (a module, a state dict, a path or a source: its
        names and shapes, ties included), else of ``config``'s model class, built on
        the meta device where transformers is installed (``None`` where it is not, or
        where nothing is given)."""
        rules = as_rules(rules)
        if like is None:
            if config is None:
                return None
            from bridge.hf.config import config_ties  # (transformers, where installed)

            return cls.of_class(config_ties(config, (), rules), config)
        from bridge.sources.registry import open_source

        source = open_source(like, rules, arg="like")
        try:
            names = {name: tuple(info.shape) for name, info in source.infos.items()}
            for alias, canonical in source.ties.items():
                if canonical in names:
                    shape = permute_shape(names[canonical], source.ties.transform(alias))
                    names.setdefault(alias, shape)
        finally:
            if source is not like:
                source.close()
        what = source.where if isinstance(like, (str, TensorSource)) else type(like).__name__
        return cls(names, "`like`" if isinstance(like, Mapping) else what)

    def misfit(self, plan: Plan, layout: Layout, where: str) -> str | None:
        """The one line that names the first Flax leaf ``layout`` names (``plan``) as
        no tensor of the model, or of another shape, with the model's nearest names;
        ``None`` where every leaf fits."""
        record = plan.alias_map.naming or NamingRecord()
        flax_path = {n.torch: path for path, n in record.items()}
        for entry in plan.entries:
            loaded = self.load_name(entry.name)
            shape = self.names.get(loaded)
            if shape is not None and (loaded != entry.name or tuple(shape) == entry.info.shape):
                continue  # (A renamed tensor may be reshaped on load too: its name is enough.)
            what = "has no tensor of that name" if shape is None else f"holds it as {tuple(shape)}"
            near = difflib.get_close_matches(entry.name, list(self.names), n=3, cutoff=0.5)
            return (
                f"{where}: the Flax leaf {flax_path.get(entry.name, entry.source)!r} fits no "
                f"layout: the {layout.name} layout names it {entry.name!r} "
                f"{tuple(entry.info.shape)}, but {self.what} {what}"
                + (f" (nearest: {', '.join(near)})" if near else "")
                + "; pass `layout=` (--layout) the tree's layout, or convert a tree of this model."
            )
        return None


def _stored_tree(source: TensorSource) -> Any:
    """The nested tree of a Flax-named source's stored tensors (their infos)."""
    return nest({p: info for p, info in source.infos.items() if p not in source.ties})


def flax_layout(
    tree: Any,
    ties: AliasMap | None = None,
    /,
    *,
    layout: str | Layout | None = None,
    config: Mapping[str, Any] | None = None,
    rules: RulesArg = None,
    like: Any = None,
    model: Callable[[], ModelTensors | None] | None = None,
) -> Layout | None:
    """The layout a Flax tree is in: the one answer of every route that names a
    Flax tree in PyTorch names (``None``: jaxshare's rules, as given).

    :func:`bridge.detect_layout`'s rule, of the tree's paths and ``config``:
    ``layout`` when given; the transformers-flax layout for a tree with no
    collection at its top; for a tree whose top is the linen ``params`` collection
    alone (``{"params": params}``, as a linen training loop saves a Flax model's
    params), with no naming record and no stacks, the transformers-flax layout where
    that layout names every leaf as a tensor of the model, of its shape
    (:meth:`ModelTensors.misfit`). The model is built only for such a tree.

    Args:
      tree: a Flax tree (of arrays, or of anything with a shape and a dtype), or a
        Flax-named :class:`~jaxshare.stream.TensorSource` (its stored tensors).
      ties: the tree's alias map (default: a source's own; none).
      layout: the layout the caller names, if any.
      config: the model's ``config.json`` as a dict.
      rules: the rules the layout's are resolved over.
      like: the model to hold the tree against (:meth:`ModelTensors.of`); default:
        ``config``'s model class.
      model: the model's tensors, where the caller has them already.

    >>> import numpy as np
    >>> tree = {"params": {"transformer": {"wte": {"embedding": np.zeros((64, 16))}}}}
    >>> gpt2 = ModelTensors({"transformer.wte.weight": (64, 16)}, "GPT2LMHeadModel")
    >>> flax_layout(tree, config={"model_type": "gpt2"}, model=lambda: gpt2).name
    'transformers-flax'
    >>> flax_layout(tree, config={"model_type": "gpt2"}, model=lambda: None) is None
    True
    """
    if isinstance(tree, TensorSource):
        tree, ties = _stored_tree(tree), tree.ties if ties is None else ties
    ties = AliasMap({}) if ties is None else ties
    rules = as_rules(rules)

    def fits(candidate: Layout) -> bool:
        tensors = model() if model is not None else ModelTensors.of(like, config, rules)
        if tensors is None:
            return False  # (No model to hold the tree against.)
        try:
            plan = name_leaves(tree, ties, None, candidate.resolve(config, rules)).plan()
        except ValueError:
            return False
        return tensors.misfit(plan, candidate, "") is None

    paths = [leaf.path for leaf in _flax_leaves(tree)]
    unnamed = ties.naming is None and not rules.stacks
    return detect_layout(layout, paths, config, fits=fits if unnamed else None)


def torch_plan(
    source: TensorSource,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
    config: Mapping[str, Any] | None = None,
    model: Callable[[], ModelTensors | None] | None = None,
) -> Plan:
    """How each array of a Flax-named source is named and transposed in PyTorch, as
    :func:`bridge.to_torch` would, without reading an array.

    A naming record the source carries (a conversion's) decides names and
    axis orders exactly; otherwise the rules do (or ``like``, a module or state
    dict). The plan's alias map is in PyTorch names: a tie whose axis orders cancel
    is an identical alias (stored once), one whose axis orders differ an alias with
    a transform; its naming record maps the Flax paths to the PyTorch names.

    The rules are ``layout`` 's for the model of ``config`` (default: the
    source's own ``config``, an item's ``config.json`` asset, else ``like`` 's:
    a transformers model's, a Hugging Face directory's); without a layout,
    the layout :func:`flax_layout` finds: with a config, a tree with no collection at
    the top (``transformer/...``, not ``params/...``) is in the transformers-flax
    layout, and so is one under a linen ``params`` collection alone that the model
    (``model``, where the caller has its tensors; else ``like``; else the config's
    model class) fits in that layout.

    >>> import jax.numpy as jnp, tempfile
    >>> from jaxshare import checkpoint
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(path, {"params": {"wte": {"embedding": jnp.zeros((10, 4))}}})
    >>> [(e.name, e.source, e.perm) for e in torch_plan(checkpoint.open_source(path)).entries]
    [('wte.weight', 'params/wte/embedding', None)]
    """
    config = next((c for c in (config, source.config, model_config(like)) if c is not None), None)
    if source.ties.naming is None:  # (A naming record names every leaf exactly.)
        if layout is None and like is None and model is None and _alike(source, config, rules):
            model = _no_model  # (Either layout names it alike: no model class is built.)
        found = flax_layout(
            source, layout=layout, config=config, rules=rules, like=like, model=model
        )
        rules = layout_rules(found, rules, config)
    rules = as_rules(rules)
    return name_leaves(_stored_tree(source), source.ties, like, rules).plan()


def _no_model() -> ModelTensors | None:
    return None


def _alike(source: TensorSource, config: Mapping[str, Any] | None, rules: RulesArg) -> bool:
    """Whether ``source`` is a tree under a linen ``params`` collection alone that
    jaxshare's rules and the transformers-flax layout's name alike, every leaf (names,
    axis orders, ties): then which layout it is in changes no PyTorch name, and naming
    it needs no model class (GPT-2's and BERT's trees, for two)."""
    if config is None or {split(path)[0] for path in source.infos} != {"params"}:
        return False
    tree = _stored_tree(source)
    try:
        plans = [
            name_leaves(tree, source.ties, None, r).plan()
            for r in (as_rules(rules), TRANSFORMERS_FLAX.resolve(config, rules))
        ]
    except ValueError:
        return False
    (a, b) = [
        ([(e.name, e.perm) for e in plan.entries], dict(plan.alias_map), plan.alias_map.transforms)
        for plan in plans
    ]
    return a == b


def in_torch_names(
    source: TensorSource, /, *, layout: str | Layout | None = None, **naming: Any
) -> tuple[Plan, TensorSource]:
    """The one answer to "this source in PyTorch names": the plan naming each of its
    tensors, and the source that plan reads.

    A PyTorch-named source is itself. A Flax-named one in a layout with a view of its
    own (MaxText, :attr:`bridge.Layout.view`) is that view, read as it names its
    tensors. Any other is named by :func:`torch_plan` (its naming record, or the
    ``naming`` it takes: ``like``, ``rules``, ``config`` for ``layout``'s rules), and
    the layers of a stack are read one at a time (:func:`jaxshare.internal.unstacked`),
    so every name is one tensor of the PyTorch model.

    >>> import jax.numpy as jnp, tempfile
    >>> from jaxshare import checkpoint
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(path, {"params": {"fc": {"kernel": jnp.zeros((4, 2))}}})
    >>> plan, reads = in_torch_names(checkpoint.open_source(path))
    >>> [(e.name, e.source, e.perm) for e in plan.entries]
    [('fc.weight', 'params/fc/kernel', (1, 0))]
    """
    if not source.flax_named:
        return Plan.identity(source), source
    view = None if layout is None else as_layout(layout).view
    if view is not None:
        named = view(source, naming.get("config"))
        return Plan.identity(named), named
    return unstacked(torch_plan(source, layout=layout, **naming), source)


def torch_aliases(aliases: Any, arg: str) -> AliasMap:
    """A DeepSpeed-style ``{alias: canonical}`` in PyTorch names, checked, as an
    ``AliasMap`` (a PyTorch name is one path part: it has no ``'/'``).

    >>> torch_aliases({"lm_head.weight": "wte.weight"}, "aliases")
    AliasMap({'lm_head.weight': 'wte.weight'})
    """
    if not isinstance(aliases, Mapping):
        raise TypeError(
            f"`{arg}` must be a mapping of PyTorch names, got {type(aliases).__name__}."
        )
    slashed = [k for k in [*aliases, *aliases.values()] if not isinstance(k, str) or "/" in k]
    if slashed:
        raise ValueError(
            f"`{arg}` must name PyTorch tensors ('a.b.weight'); {slashed[0]!r} is not one."
        )
    return aliases if isinstance(aliases, AliasMap) else AliasMap(aliases)


def _is_torch_map(alias_map: Mapping[str, str]) -> bool:
    """A DeepSpeed-style map names PyTorch tensors: dots, no slashes."""
    names = [*alias_map, *alias_map.values()]
    return bool(names) and not any("/" in n for n in names) and any("." in n for n in names)


def flax_variables(
    variables: Any, alias_map: Mapping[str, str] | None
) -> tuple[Any, AliasMap, AliasMap | None]:
    """What :func:`bridge.to_torch` is given, taken apart: ``(tree, the ties in Flax
    paths, the ties in PyTorch names or None)``.

    ``variables`` is a Flax mapping, a ``Tied`` or an ``nnx.Module``;
    ``alias_map`` names Flax paths or, DeepSpeed's way, PyTorch names. Arrays that
    are one object in the tree, and an NNX module's shared Variables, are ties
    too, on the paths the given map leaves free.
    """
    from jaxshare import Tied, find_shared  # (JAX: a tree of arrays.)

    torch_map = None
    if alias_map is not None and _is_torch_map(alias_map):
        torch_map, alias_map = torch_aliases(alias_map, "alias_map"), None
    given = None if alias_map is None else as_alias_map(alias_map)
    if isinstance(variables, Tied):
        return variables.unique, _merge(given, variables.alias_map), torch_map
    if is_nnx_module(variables):
        from flax import nnx

        return nnx.state(variables), _merge(given, find_shared(variables)), torch_map
    if not isinstance(variables, Mapping):
        raise TypeError(
            "`variables` must be a Flax variables or params mapping, a jaxshare.Tied or an "
            f"nnx.Module, got {type(variables).__name__}."
        )
    return variables, _merge(given, find_shared(variables, is_leaf=is_variable)), torch_map


def _merge(primary: AliasMap | None, extra: AliasMap) -> AliasMap:
    """``primary``'s ties plus those of ``extra`` on paths ``primary`` leaves free."""
    if primary is None:
        return extra
    pairs = dict(primary.items())
    for alias, canonical in extra.items():
        if alias not in pairs and canonical not in pairs:
            pairs[alias] = canonical
    return AliasMap(
        pairs,
        transforms=primary.transforms,
        naming=primary.naming or extra.naming,
        implicit=primary.implicit,
    )


def torch_alias_map(
    alias_map: Mapping[str, str],
    variables: Any,
    /,
    *,
    like: Source | None = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
) -> dict[str, str]:
    """An ``AliasMap`` in Flax paths as PyTorch ``{alias: canonical}`` -- the shape
    of DeepSpeed's ``shared_params``.

    Args:
      alias_map: the ties in Flax paths.
      variables: the tree they belong to (shapes decide the PyTorch axis orders).
      like, rules, layout: as in :func:`bridge.to_torch`.

    Raises:
      ValueError: a tie whose axis orders do not cancel, which a PyTorch name cannot
        express (it would be a permuted view, not the same tensor).

    >>> import jax.numpy as jnp
    >>> from jaxshare import AliasMap
    >>> variables = {"params": {"wte": {"embedding": jnp.zeros((4, 2))}}}
    >>> head = AliasMap({"params/head/kernel": "params/wte/embedding"},
    ...                 transforms={"params/head/kernel": (1, 0)})
    >>> torch_alias_map(head, variables)
    {'head.weight': 'wte.weight'}
    """
    tree, amap, _ = flax_variables(variables, alias_map)
    config = model_config(like)
    found = flax_layout(tree, amap, layout=layout, config=config, rules=rules, like=like)
    plan = name_leaves(tree, amap, like, layout_rules(found, rules, config))
    out: dict[str, str] = {}
    for alias, canonical in plan.alias_map.items():
        if alias not in plan.names or canonical not in plan.names:
            continue
        key_a, perm_a = plan.names[alias]
        key_c, perm_c = plan.names[canonical]
        if compose(compose(inverse(perm_a), plan.alias_map.transform(alias)), perm_c) is not None:
            raise ValueError(
                f"alias {alias!r} of {canonical!r}: their PyTorch tensors {key_a!r} and "
                f"{key_c!r} differ in axis order, so PyTorch cannot tie them by name."
            )
        out[key_a] = key_c
    return out


def model_config(model: Any) -> Mapping[str, Any] | None:
    """The ``config.json`` of a transformers model (``like=``), or a source's own
    (a Hugging Face directory's), if it has one."""
    if isinstance(model, TensorSource):
        return model.config
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    return to_dict() if callable(to_dict) else None
