"""Torch -> Flax placement: where each PyTorch tensor of a source goes in a Flax tree.

Placing reads only names, shapes, layer kinds, ties and a naming record -- never a
tensor -- and decides, for every name, a Flax path and the PyTorch -> Flax axis
permutation (a :class:`Place`), and turns the PyTorch ties into an alias map in
Flax paths: a :class:`FlaxPlacement`. :func:`bridge.to_flax` moves the values after
it, :func:`bridge.flax_plan` streams them into files after it, and
:func:`bridge.flax_alias_map` keeps only its ties; all three start from
:func:`place_source`, so every route places a tensor the same way.

Without a target tree the rules place each tensor (:mod:`bridge.layouts.rules`), or the
naming record a source carries does, exactly. With one (``like=``), each
tensor's candidate places are tried in order, each spelled with and without its
collection and with both list namings; the first path the tree has *with the
right shape* wins. So the tree settles what names cannot: a square Linear versus
a GPT-2 ``Conv1D`` weight by shape, ``embedding`` versus ``kernel`` by name,
linen ``layers_0`` versus ``layers/0``. Every problem is collected and reported
at once, by name.

Paths are tuples of ``str`` parts here; they are rendered (``'/'``-joined) only
where they leave: in the alias map, the naming record and the plan.

Nothing here imports torch or, without a target tree, JAX.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bridge.layouts.layout import Family, Layout, as_layout, layout_rules
from bridge.layouts.rules import Rules, RulesArg, as_rules
from jaxshare import AliasMap, NamingRecord
from jaxshare.internal import (
    EXPERT,
    LAYER,
    STACKED,
    Perm,
    RetiedSource,
    StackedSource,
    compose,
    inverse,
    layer_prefixes,
    lift,
    permute_shape,
    render,
    split,
    stack_prefix,
)
from jaxshare.stream import Plan, PlanEntry, TensorSource

if TYPE_CHECKING:
    from bridge.naming.like import LikeTree
    from bridge.sources.registry import Source

__all__ = [
    "FlaxPlacement",
    "Place",
    "default_place",
    "flax_plan",
    "place_in",
    "place_source",
    "place_leaves",
    "torch_leaves",
]

FlaxPath = tuple[str, ...]


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
        to be found from the target's shapes. A layer's experts (a key with ``{e}``,
        ``(E, *expert)``, or ``(L, E, *expert)`` under ``{i}`` too) keep their axis
        first among a layer's, the layers' axis lifted out of their way.
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
    def experts(self) -> bool:
        """Whether this stacks a layer's experts (its key has ``{e}``)."""
        return EXPERT in self.key.split(".")

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

    The last candidate keeps the PyTorch name and axis order, in ``params`` (or in
    ``buffers`` for a known buffer).

    >>> [(t.name, t.perm) for t in candidates(TorchLeaf("head.weight", (3, 2)), Rules())]
    [('kernel', (1, 0)), ('kernel', None), ('embedding', None), ('scale', None), ('weight', None)]
    >>> candidates(TorchLeaf("wte.weight", (3, 2), layer="embedding"), Rules())
    [Candidate(collection='params', name='embedding', perm=None)]
    """
    ndim = len(leaf.shape) - leaf.stacked - leaf.experts  # (A stack's rules: its layers'.)
    axes = [leaf.stack or 0] if leaf.stacked else [None]

    def stacked(perm: Perm | None, axis: int | None) -> Perm | None:
        """A layer's (or an expert's) permutation, the experts' axis then the layers'
        lifted out of its way."""
        inner = ndim
        if leaf.experts:  # (A layer's experts first among its axes.)
            perm, inner = lift(perm, inner, 0), inner + 1
        return perm if axis is None else lift(perm, inner, axis)

    out: list[Candidate] = []
    for rule in rules.rules:
        if rule.torch != leaf.name or not rule.fits(ndim):
            continue
        if leaf.layer is not None and rule.layers and leaf.layer not in rule.layers:
            continue
        for axis in axes:
            target = Candidate(rule.collection, rule.flax, stacked(rule.perm(ndim), axis))
            if target not in out:
                out.append(target)
    if not out or leaf.layer is None:
        fallback = Candidate(
            "buffers" if leaf.buffer else "params", leaf.name, stacked(None, axes[0])
        )
        if fallback not in out:
            out.append(fallback)
    return out


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
    module = tuple(part for part in module if part not in STACKED)  # A stack: its module.
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


@dataclass(frozen=True)
class Place:
    """Where one tensor lives in the Flax tree.

    Attributes:
      path: the Flax path, as a tuple of keys.
      perm: the PyTorch -> Flax axis permutation.
      collection: whether ``path`` starts with the collection name.
      linen: whether ``path`` spells list items linen's way (``layers_0``).
    """

    path: FlaxPath
    perm: Perm | None
    collection: bool = True
    linen: bool = False

    @property
    def name(self) -> str:
        """The path rendered, ``'params/wte/embedding'``."""
        return render(self.path)


def _place_of(
    leaf: TorchLeaf, candidate: Candidate, module: FlaxPath, collection: bool, rules: Rules
) -> Place:
    parts = ((candidate.collection,) if collection else ()) + module + (candidate.name,)
    plain = module_variants(leaf.module, False, rules.modules)[0]  # (linen: list items joined)
    return Place(parts, candidate.perm, collection, module != plain)


def _spellings(leaf: TorchLeaf, candidate: Candidate, rules: Rules) -> list[Place]:
    """Every spelling of ``candidate``'s path: list namings, with and without collection."""
    modules = module_variants(leaf.module, rules.linen_lists, rules.modules)
    return [
        _place_of(leaf, candidate, module, c, rules) for module in modules for c in (True, False)
    ]


def default_place(
    leaf: TorchLeaf, rules: Rules, *, collection: bool | None = None, linen: bool | None = None
) -> Place:
    """The place of ``leaf`` when no tree decides: its first candidate, spelled
    with or without the collection (default: as the rules say) and with linen's
    list naming or not.

    >>> default_place(TorchLeaf("h.0.fc.weight", (3, 2)), Rules()).name
    'params/h/0/fc/kernel'
    >>> default_place(TorchLeaf("h.0.fc.weight", (3, 2)), Rules(collections=False)).name
    'h/0/fc/kernel'
    """
    linen = rules.linen_lists if linen is None else linen
    module = module_variants(leaf.module, linen, rules.modules)[0]
    collection = rules.collections if collection is None else collection
    return _place_of(leaf, candidates(leaf, rules)[0], module, collection, rules)


def place_in(
    leaves: list[TorchLeaf],
    index: Mapping[FlaxPath, tuple[int, ...]],
    rules: Rules,
    *,
    optional: Collection[str] = (),
    what: str = "`like`",
) -> tuple[dict[str, Place], list[str]]:
    """Places each leaf at a path of ``index`` (``{flax path: shape}``).

    Returns:
      ``({key: Place}, problems)``. A leaf in ``optional`` (a tie's alias) with
      no place is left out silently; any other leaf with no place, a shape that
      fits no candidate, or two leaves at one path is a problem, named.
    """
    places: dict[str, Place] = {}
    taken: dict[FlaxPath, str] = {}
    problems: list[str] = []
    for leaf in leaves:
        tried: list[str] = []
        found: Place | None = None
        for candidate in _candidates_of(leaf, rules):
            for place in _spellings(leaf, candidate, rules):
                shape = index.get(place.path)
                if shape is None:
                    continue
                want = permute_shape(leaf.shape, place.perm)
                if tuple(shape) == want:
                    found = place
                    break
                tried.append(f"{place.name!r} has shape {tuple(shape)}, not {want}")
            if found is not None:
                break
        if found is None:
            if tried:
                problems.append(
                    f"{leaf.key!r} {tuple(leaf.shape)}: no place with a matching shape: "
                    + "; ".join(tried)
                )
            elif leaf.key not in optional:
                spelled = [s.name for s in _spellings(leaf, candidates(leaf, rules)[0], rules)]
                problems.append(
                    f"{leaf.key!r} has no place in {what} (looked for {spelled[:2]} and "
                    "other rule candidates)"
                )
            continue
        if found.path in taken:
            problems.append(f"{leaf.key!r} and {taken[found.path]!r} both go to {found.name!r}")
            continue
        taken[found.path] = leaf.key
        places[leaf.key] = found
    return places, problems


def _candidates_of(leaf: TorchLeaf, rules: Rules) -> list[Candidate]:
    """The candidates of ``leaf``; for a stack whose axis a target tree is to find,
    those of every axis the layers can go on, axis 0 first."""
    if not leaf.stacked or leaf.stack is not None:
        return candidates(leaf, rules)
    out: list[Candidate] = []
    for axis in range(len(leaf.shape)):
        out += [t for t in candidates(dataclasses.replace(leaf, stack=axis), rules) if t not in out]
    return out


def torch_leaves(
    source: TensorSource, rules: Rules, ties: AliasMap | None = None, *, guess: bool = True
) -> list[TorchLeaf]:
    """What the rules need to know of each tensor of ``source``: its name, shape
    (an alias the source does not store takes its canonical's), layer kind (the
    source's, else -- with ``guess`` -- guessed from the module name) and whether
    it is a buffer. With a target tree (``like=``) nothing is guessed: its paths and
    shapes choose among every candidate."""
    ties = source.ties if ties is None else ties
    layers = source.layers or {}
    buffers = source.buffers
    shapes = {name: info.shape for name, info in source.infos.items()}
    missing = sorted({c for c in ties.values() if c not in shapes})
    if missing:
        raise ValueError(
            f"{source.where}: the ties name canonical(s) {missing[:5]} that are not stored."
        )
    for alias, canonical in ties.items():
        if alias not in shapes:
            shapes[alias] = permute_shape(shapes[canonical], ties.transform(alias))
    leaves = []
    for key, shape in shapes.items():
        owner = key.rpartition(".")[0]
        layer = layers.get(owner) or (guess_kind(owner, rules) if guess else None)
        buffer = None if buffers is None else key in buffers
        prefix = stack_prefix(key)
        axis = None if prefix is None else rules.stacks.get(prefix)
        if axis is not None and axis >= len(shape):
            raise ValueError(
                f"{source.where}: --stack-axis {axis} is out of range for {key!r}, whose "
                f"layers are {len(shape) - 1}-D (the layers can go on axes 0..{len(shape) - 1})."
            )
        leaves.append(TorchLeaf(key, tuple(shape), layer, buffer, axis))
    return leaves


@dataclass(frozen=True)
class FlaxPlacement:
    """Where every tensor of a source goes in Flax, decided from metadata alone:
    what :func:`place_source` returns.

    Attributes:
      places: PyTorch name -> its Flax path and PyTorch -> Flax permutation, for
        every tensor and alias.
      stored: PyTorch names whose tensors are stored (canonicals and untied),
        in the source's order.
      alias_map: the ties in Flax paths, with their transforms and the naming
        record of every place.
      like: the target tree the tensors were placed in (``like=``), taken apart, if any.
      copies: ``{name: (stored name, PyTorch -> Flax permutation)}`` of the tied
        names the Flax tree holds as leaves of their own (``Rules.tied_leaves``):
        stored, read from the tensor they are tied to.
      reads: the source the names are of, where it is not the one placed: its
        per-layer tensors stacked (a name with ``{i}`` is a stack of layers,
        ``(L, *layer)``, see :class:`jaxshare.internal.StackedSource`).
    """

    places: dict[str, Place]
    stored: list[str]
    alias_map: AliasMap
    like: LikeTree | None = None
    copies: dict[str, tuple[str, Perm | None]] = dataclasses.field(default_factory=dict)
    reads: TensorSource | None = None

    def source_of(self, key: str) -> tuple[str, Perm | None]:
        """The stored tensor a stored name is read from, and the permutation from its
        axis order to the name's Flax leaf."""
        return self.copies.get(key, (key, self.places[key].perm))

    def plan(self, source: TensorSource) -> Plan:
        """The streaming plan: each stored tensor of ``source`` written at its Flax
        path, in its Flax axis order; the plan's alias map carries the naming record.
        (Stacked layers are read from :attr:`reads`.)"""
        source = self.reads or source
        entries = []
        for key in self.stored:
            base, perm = self.source_of(key)
            info = source.infos[base].permuted(perm)
            entries.append(PlanEntry(self.places[key].name, base, perm, info))
        return Plan(tuple(entries), self.alias_map)


def place_source(
    source: TensorSource,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    ties: AliasMap | None = None,
    layout: str | Layout | None = None,
) -> FlaxPlacement:
    """Places every tensor of an opened ``source`` in Flax paths (in ``like``, a
    target tree, when given), with ``ties`` (default: the source's own), by the
    rules of ``layout`` for the source's model (its ``config``) or by ``rules``."""
    config = source.config
    rules = layout_rules(layout, rules, config)
    tree = None
    if like is not None:
        from bridge.naming.like import like_tree  # (JAX: `like` is a Flax tree.)

        tree = like_tree(like)
    given = source
    source = stack_layers(source, rules, None if tree is None else tree.index, ties)
    if source is not given and ties is not None:
        ties = source.ties  # (The given ties, the layers stacked: see `stack_layers`.)
    ties = source.ties if ties is None else ties
    family = None if layout is None else as_layout(layout).family(config)
    left_out = set() if family is None else _left_out(source, family, config)
    if left_out:
        kept = {a: c for a, c in ties.items() if a not in left_out and c not in left_out}
        transforms = {a: p for a, p in ties.transforms.items() if a in kept}
        ties = AliasMap(kept, transforms=transforms, naming=ties.naming)
    leaves = torch_leaves(source, rules, ties, guess=tree is None)
    leaves = [leaf for leaf in leaves if leaf.key not in left_out]
    # A Flax port's own params (no collection) hold no alias: its model computes each.
    computed = layout is not None and not as_layout(layout).collections
    plan = place_leaves(leaves, ties, tree, rules, ties.naming, computed=computed)
    return plan if source is given else dataclasses.replace(plan, reads=source)


def stack_layers(
    source: TensorSource,
    rules: Rules,
    index: Mapping[FlaxPath, tuple[int, ...]] | None = None,
    ties: AliasMap | None = None,
) -> TensorSource:
    """``source`` with the per-layer tensors of scanned layers stacked, under the
    prefixes that ``rules.stacks`` names, that the source's naming record stacks
    (a file jaxshare wrote from a scanned tree), or -- given a target tree's
    ``index`` -- whose stacked leaf the tree has where it lacks each layer's;
    ``source`` itself when there are none. ``ties`` (default: the source's own)
    become the stacked source's."""
    if source.flax_named:
        return source
    naming = (source.ties if ties is None else ties).naming
    # (A prefix under a layer's, 'model.layers.{i}.mlp.experts', stacks each layer's experts.)
    experts = {p for p in rules.stacks if LAYER in p.split(".")}
    prefixes = set(rules.stacks) - experts
    if naming:
        prefixes |= {p for n in naming.values() if (p := stack_prefix(n.torch)) is not None}
        experts |= {p for n in naming.values() if (p := stack_prefix(n.torch, EXPERT)) is not None}
    if index is not None:
        prefixes |= _stacked_in(source, rules, index)
    if not prefixes and not experts:
        return source
    if ties is not None and ties is not source.ties:
        source = RetiedSource(source, ties)  # (A caller's merged ties, checked already.)
    if experts:  # (Each layer's experts first, then the layers, experts and all.)
        source = StackedSource(source, experts, EXPERT)
    return StackedSource(source, prefixes) if prefixes else source


def _stacked_in(
    source: TensorSource, rules: Rules, index: Mapping[FlaxPath, tuple[int, ...]]
) -> set[str]:
    """The module prefixes of ``source`` whose numbered layers a target tree holds as
    stacks: it has a stacked leaf's path for them, and no layer's own."""
    found: set[str] = set()
    for head in layer_prefixes(source.infos):
        try:
            trial = StackedSource(source, [head])
        except ValueError:
            continue  # (Not layers of one shape: placed one by one, and reported so.)
        for leaf in torch_leaves(trial, rules, guess=False):
            if stack_prefix(leaf.key) != head:
                continue
            member = trial.members(leaf.key)
            assert member is not None
            owner = member[0].rpartition(".")[0]
            own = TorchLeaf(
                member[0], source.infos[member[0]].shape, (source.layers or {}).get(owner)
            )
            if any(
                place.path in index
                for t in candidates(own, rules)
                for place in _spellings(own, t, rules)
            ):
                break
            if any(
                place.path in index
                for t in _candidates_of(leaf, rules)
                for place in _spellings(leaf, t, rules)
            ):
                found.add(head)
                break
    return found


def _left_out(source: TensorSource, family: Family, config: Mapping[str, Any] | None) -> set[str]:
    """The tensors of ``source`` that ``family``'s Flax port has no leaf for: those it
    computes (each checked against what it computes: a stored table that differs is
    one warning line, as its values are lost), and those of modules its Flax class
    lacks (one warning line naming them)."""
    computed, absent = set(), []
    for name, info in source.infos.items():
        compute = family.computed_by(name)
        if compute is not None:
            computed.add(name)
            want, got = compute(info.shape), source.array(name)
            if not np.array_equal(want.astype(got.dtype), got):
                delta = np.max(np.abs(want.astype(np.float64) - got.astype(np.float64)))
                warnings.warn(
                    f"{source.where}: {name!r} is left out, as the Flax model computes it, "
                    f"but the stored values differ from what it computes (max |Δ| = "
                    f"{delta:.3g}); they are lost.",
                    stacklevel=4,
                )
        elif family.absent_from(name, config):
            absent.append(name)
    if absent:
        arch = ((config or {}).get("architectures") or ["?"])[0]
        warnings.warn(
            f"{source.where}: {', '.join(map(repr, absent))} are left out: the Flax port of "
            f"{arch} has no such module (the PyTorch class holds it unused).",
            stacklevel=4,
        )
    return computed | set(absent)


def place_leaves(
    leaves: list[TorchLeaf],
    aliases: AliasMap,
    like: LikeTree | None,
    rules: Rules,
    naming: NamingRecord | None = None,
    *,
    computed: bool = False,
) -> FlaxPlacement:
    """Places every leaf in Flax paths and turns the PyTorch ties into an alias map.

    Without ``like`` a recorded ``naming`` (a file jaxshare wrote from Flax)
    places each leaf exactly; otherwise the rules do. An alias with no place in
    ``like`` (or whose layer is unknown) takes its canonical's Flax leaf name
    and axis order at its own module path; one whose layer is known takes the
    rules' name for it.

    An alias is *implicit* (:attr:`jaxshare.AliasMap.implicit`, marked in the
    alias map and the naming record) where the Flax tree holds no leaf for it:
    its path is not in ``like`` (nor one an NNX graph shares); ``computed`` is
    set (a Flax port's own params, whose model computes every tie: the
    transformers-flax layout); or the recorded ``naming`` that places it marks
    it so.
    """
    groups: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        groups.setdefault(canonical, [canonical]).append(alias)
    order = {leaf.key: i for i, leaf in enumerate(leaves)}
    tied = {k for members in groups.values() for k in members}
    problems: list[str] = []
    recorded = _recorded_places(naming, leaves) if like is None else None
    if recorded is not None:
        places = recorded
    elif like is None:
        # Each tie's first name, and every untied or typed name, by the rules; the
        # other names of a tie follow their canonical below.
        firsts = {min(members, key=order.__getitem__) for members in groups.values()}
        places = {
            leaf.key: default_place(leaf, rules)
            for leaf in leaves
            if leaf.key not in tied or leaf.key in firsts or leaf.layer is not None
        }
    else:
        places, problems = place_in(leaves, like.index, rules, optional=tied)
    by_key = {leaf.key: leaf for leaf in leaves}
    amap: dict[str, str] = {}
    transforms: dict[str, Perm | None] = {}
    alias_keys: set[str] = set()
    implicit: set[str] = set()
    marked = naming.implicit if naming is not None and recorded is not None else frozenset()
    copies: dict[str, tuple[str, Perm | None]] = {}
    for members in groups.values():
        members.sort(key=order.__getitem__)
        # The canonical is the first name placed at a leaf the result holds (not at a
        # path an NNX graph reaches a shared Variable by, which its state drops).
        kept = like.shapes if like is not None else {place.path for place in places.values()}
        placed = sorted(
            (k for k in members if k in places), key=lambda k: places[k].path not in kept
        )
        if not placed:
            problems.append(f"none of the tied names {members} has a place in `like`")
            continue
        canonical = places[placed[0]]
        # Each member m is T(root, t_m) in PyTorch (t_m its own transform, the root
        # being the tie's PyTorch canonical) and T(root, P_m) in Flax, P_m = place_m . t_m;
        # so the Flax alias m is T(flax canonical c, P_m . P_c^-1).
        from_root = inverse(_root_perm(canonical, placed[0], aliases))
        for key in members:
            if key == placed[0]:
                continue
            if key not in places:  # No place: the tie stays in the alias map.
                places[key] = _alias_place(by_key[key], canonical, by_key[placed[0]].name, rules)
            place = places[key]
            if key in rules.tied_leaves and key in aliases and like is None:
                # A leaf of its own all the same: written out from the tensor it is tied to.
                copies[key] = (aliases[key], _root_perm(place, key, aliases))
                continue
            alias_keys.add(key)
            amap[place.name] = canonical.name
            transforms[place.name] = compose(_root_perm(place, key, aliases), from_root)
            unplaced = like is not None and place.path not in like.index
            if computed or unplaced or place.name in marked:
                implicit.add(place.name)  # (No leaf of the Flax tree: its model computes it.)
    taken: dict[FlaxPath, str] = {}
    for key, place in places.items():  # (`place` has reported collisions among placed tensors)
        other = taken.setdefault(place.path, key)
        if other != key:
            problems.append(f"{other!r} and {key!r} both go to {place.name!r}")
    if like is not None:
        empty = [f"{render(p)!r} {s}" for p, s in like.shapes.items() if p not in taken]
        if empty:
            problems.append(f"`like` has leaves no tensor fills: {', '.join(empty[:10])}")
    if problems:
        raise ValueError(
            f"cannot place the PyTorch tensors in {'Flax paths' if like is None else '`like`'}:"
            + "".join(f"\n  {p}" for p in problems)
            + "\nPass `like=` the tree the Flax model expects (e.g. `jax.eval_shape` of its "
            "init), the module instead of its state dict (its layer types decide), or "
            "`rules=` naming what the defaults do not know."
        )
    stored = [leaf.key for leaf in leaves if leaf.key not in alias_keys]
    record = NamingRecord(
        {places[leaf.key].name: (leaf.key, places[leaf.key].perm) for leaf in leaves},
        implicit=implicit,
    )
    alias_map = AliasMap(amap, transforms=transforms, naming=record, implicit=implicit)
    return FlaxPlacement(places, stored, alias_map, like, copies)


def _root_perm(place: Place, key: str, aliases: AliasMap) -> Perm | None:
    """The permutation from a tie's PyTorch canonical to ``key``'s Flax value."""
    return compose(place.perm, aliases.transform(key) if key in aliases else None)


def _alias_place(leaf: TorchLeaf, canonical: Place, canonical_leaf: str, rules: Rules) -> Place:
    """The place of an alias that nothing else places: the rules' name for its layer
    when the layer is known (or its module name tells it: ``lm_head``); else, when it
    has its canonical's leaf name (``decoder.weight`` tied to ``encoder.weight``), the
    canonical's Flax leaf name and axis order at its own module path; else (a parameter
    registered twice, even in one module: ``self.b = self.a``, ``lin.weight2 =
    lin.weight``) a Flax name of its own."""
    own = {"collection": canonical.collection, "linen": canonical.linen}
    kind = leaf.layer or guess_kind(".".join(leaf.module), rules)
    if kind is not None:
        return default_place(dataclasses.replace(leaf, layer=kind), rules, **own)
    if leaf.name != canonical_leaf:
        return default_place(leaf, rules, **own)
    module = module_variants(leaf.module, canonical.linen, rules.modules)[0]
    prefix = canonical.path[:1] if canonical.collection else ()
    parts = prefix + module + canonical.path[-1:]
    return Place(parts, canonical.perm, canonical.collection, canonical.linen)


def _recorded_places(
    naming: NamingRecord | None, leaves: list[TorchLeaf]
) -> dict[str, Place] | None:
    """The places a naming record gives, when it names every leaf; else ``None``."""
    if not naming:
        return None
    by_torch = {n.torch: (path, n.permute) for path, n in naming.items()}
    if any(leaf.key not in by_torch for leaf in leaves):
        return None
    return {leaf.key: Place(split(by_torch[leaf.key][0]), by_torch[leaf.key][1]) for leaf in leaves}


def flax_plan(
    source: Source,
    /,
    *,
    like: Any = None,
    rules: RulesArg = None,
    layout: str | Layout | None = None,
) -> Plan:
    """Where each tensor of a PyTorch-named source goes in Flax: its path, axis order
    and ties, as :func:`bridge.to_flax` would place it, without reading a tensor.

    The plan's alias map (Flax paths) carries the naming record; ``layout``
    (``"jaxshare"``, ``"transformers-flax"``) as in :func:`bridge.to_flax`.

    >>> import torch
    >>> sd = {"wte.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(4, 4)}
    >>> for e in flax_plan(sd).entries:
    ...     print(e.name, e.source, e.perm)
    params/wte/embedding wte.weight None
    params/lm_head/kernel lm_head.weight (1, 0)
    """
    from bridge.sources.registry import opened

    rules = as_rules(rules)
    with opened(source, rules) as src:
        return place_source(src, like=like, rules=rules, layout=layout).plan(src)
