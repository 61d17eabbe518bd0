"""Where PyTorch names go in Flax: the plan :func:`bridge.to_flax` and
:func:`bridge.flax_plan` share.

Placing reads only names, shapes, layer kinds, ties and a naming record, so this
module never imports torch: ``jaxshare convert model.safetensors ckpt`` plans a
file's tensors without paying for torch's import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge._match import Slot, default_slot, place
from bridge._names import Rules, TorchLeaf, guess_kind, module_variants
from jaxshare import AliasMap, NamingRecord, TensorSource
from jaxshare.internal import Perm, compose, inverse, permute_shape

if TYPE_CHECKING:
    from bridge._target import TargetTree

__all__ = ["FlaxPlan", "plan_flax", "torch_leaves"]


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
    buffers = getattr(source, "buffers", None)
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
        leaves.append(TorchLeaf(key, tuple(shape), layer, buffer))
    return leaves


@dataclass(frozen=True)
class FlaxPlan:
    """Where every tensor of a source goes in Flax, decided from metadata alone.

    Attributes:
      slots: PyTorch name -> its Flax path and PyTorch -> Flax permutation, for
        every tensor and alias.
      stored: PyTorch names whose tensors are stored (canonicals and untied),
        in the source's order.
      alias_map: the ties in Flax paths, with their transforms and the naming
        record of every slot.
    """

    slots: dict[str, Slot]
    stored: list[str]
    alias_map: AliasMap


def plan_flax(
    leaves: list[TorchLeaf],
    aliases: AliasMap,
    like: TargetTree | None,
    rules: Rules,
    naming: NamingRecord | None = None,
) -> FlaxPlan:
    """Places every leaf in Flax paths and turns the PyTorch ties into an alias map.

    Without ``like`` a recorded ``naming`` (a file jaxshare wrote from Flax)
    places each leaf exactly; otherwise the rules do. An alias with no place in
    ``like`` (or whose layer is unknown) takes its canonical's Flax leaf name
    and layout at its own module path; one whose layer is known takes the
    rules' name for it.
    """
    groups: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        groups.setdefault(canonical, [canonical]).append(alias)
    order = {leaf.key: i for i, leaf in enumerate(leaves)}
    tied = {k for members in groups.values() for k in members}
    problems: list[str] = []
    recorded = _recorded_slots(naming, leaves) if like is None else None
    if recorded is not None:
        slots = recorded
    elif like is None:
        # Each tie's first name, and every untied or typed name, by the rules; the
        # other names of a tie follow their canonical below.
        firsts = {min(members, key=order.__getitem__) for members in groups.values()}
        slots = {
            leaf.key: default_slot(leaf, rules)
            for leaf in leaves
            if leaf.key not in tied or leaf.key in firsts or leaf.layer is not None
        }
    else:
        slots, problems = place(leaves, like.index, rules, optional=tied)
    by_key = {leaf.key: leaf for leaf in leaves}
    amap: dict[str, str] = {}
    transforms: dict[str, Perm | None] = {}
    alias_keys: set[str] = set()
    for members in groups.values():
        members.sort(key=order.__getitem__)
        # The canonical is the first name placed at a leaf the result holds (not at a
        # path an NNX graph reaches a shared Variable by, which its state drops).
        kept = like.shapes if like is not None else _slot_paths(slots)
        placed = sorted((k for k in members if k in slots), key=lambda k: slots[k].path not in kept)
        if not placed:
            problems.append(f"none of the tied names {members} has a place in `like`")
            continue
        canonical = slots[placed[0]]
        # Each member m is T(root, t_m) in PyTorch (t_m its own transform, the root
        # being the tie's PyTorch canonical) and T(root, P_m) in Flax, P_m = slot_m . t_m;
        # so the Flax alias m is T(flax canonical c, P_m . P_c^-1).
        from_root = inverse(_root_perm(canonical, placed[0], aliases))
        for key in members:
            if key == placed[0]:
                continue
            alias_keys.add(key)
            if key not in slots:  # No place: the tie stays in the alias map.
                slots[key] = _alias_slot(by_key[key], canonical, rules)
            slot = slots[key]
            amap[slot.path] = canonical.path
            transforms[slot.path] = compose(_root_perm(slot, key, aliases), from_root)
    taken: dict[str, str] = {}
    for key, slot in slots.items():  # (`place` has reported collisions among placed tensors)
        other = taken.setdefault(slot.path, key)
        if other != key:
            problems.append(f"{other!r} and {key!r} both go to {slot.path!r}")
    if like is not None:
        empty = [f"{p!r} {s}" for p, s in like.shapes.items() if p not in taken]
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
        {slots[leaf.key].path: (leaf.key, slots[leaf.key].perm) for leaf in leaves}
    )
    return FlaxPlan(slots, stored, AliasMap(amap, transforms=transforms, naming=record))


def _root_perm(slot: Slot, key: str, aliases: AliasMap) -> Perm | None:
    """The permutation from a tie's PyTorch canonical to ``key``'s Flax value."""
    return compose(slot.perm, aliases.transform(key) if key in aliases else None)


def _slot_paths(slots: Mapping[str, Slot]) -> set[str]:
    return {slot.path for slot in slots.values()}


def _alias_slot(leaf: TorchLeaf, canonical: Slot, rules: Rules) -> Slot:
    """The place of an alias that nothing else places: the rules' name for its layer
    when the layer is known (or its module name tells it: ``lm_head``); otherwise its
    canonical's leaf name and layout."""
    kind = leaf.layer or guess_kind(".".join(leaf.module), rules)
    if kind is not None:
        typed = dataclasses.replace(leaf, layer=kind)
        return default_slot(typed, rules, collection=canonical.collection, linen=canonical.linen)
    module = module_variants(leaf.module, canonical.linen)[0]
    prefix = canonical.path.split("/")[0] if canonical.collection else None
    parts = ((prefix,) if prefix else ()) + module + (canonical.path.rsplit("/", 1)[1],)
    return Slot("/".join(parts), canonical.perm, canonical.collection, canonical.linen)


def _recorded_slots(naming: NamingRecord | None, leaves: list[TorchLeaf]) -> dict[str, Slot] | None:
    """The slots a naming record gives, when it names every leaf; else ``None``."""
    if not naming:
        return None
    by_torch = {n.torch: (path, n.permute) for path, n in naming.items()}
    if any(leaf.key not in by_torch for leaf in leaves):
        return None
    return {leaf.key: Slot(*by_torch[leaf.key]) for leaf in leaves}
