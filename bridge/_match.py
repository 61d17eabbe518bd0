"""Placing PyTorch tensors at the paths of a Flax tree (``like=``).

Each tensor's candidate places (:func:`bridge._names.candidates`) are tried in
order, each spelled with and without its collection and with both list namings;
the first path the tree has *with the right shape* wins. So the tree settles
what names cannot: a square Linear versus a GPT-2 ``Conv1D`` weight by shape,
``embedding`` versus ``kernel`` by name, linen ``layers_0`` versus ``layers/0``.
Every problem is collected and reported at once, by name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from bridge._names import Rules, Target, TorchLeaf, candidates, module_variants
from jaxshare.internal import Perm, permute_shape

__all__ = ["Slot", "default_slot", "place"]


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the Flax tree.

    Attributes:
      path: the ``'/'``-joined Flax path.
      perm: the PyTorch -> Flax axis permutation.
      collection: whether ``path`` starts with the collection name.
      linen: whether ``path`` spells list items linen's way (``layers_0``).
    """

    path: str
    perm: Perm | None
    collection: bool = True
    linen: bool = False


def _slot(leaf: TorchLeaf, target: Target, module: tuple[str, ...], collection: bool) -> Slot:
    parts = ((target.collection,) if collection else ()) + module + (target.name,)
    return Slot("/".join(parts), target.perm, collection, module != leaf.module)


def _spellings(leaf: TorchLeaf, target: Target, rules: Rules) -> list[Slot]:
    """Every spelling of ``target``'s path: list namings, with and without collection."""
    modules = module_variants(leaf.module, rules.linen_lists)
    return [_slot(leaf, target, module, c) for module in modules for c in (True, False)]


def default_slot(
    leaf: TorchLeaf, rules: Rules, *, collection: bool = True, linen: bool | None = None
) -> Slot:
    """The place of ``leaf`` when no tree decides: its first candidate, spelled
    with or without the collection and with linen's list naming or not."""
    module = module_variants(leaf.module, rules.linen_lists if linen is None else linen)[0]
    return _slot(leaf, candidates(leaf, rules)[0], module, collection)


def place(
    leaves: list[TorchLeaf],
    index: Mapping[str, tuple[int, ...]],
    rules: Rules,
    *,
    optional: Collection[str] = (),
    what: str = "`like`",
) -> tuple[dict[str, Slot], list[str]]:
    """Places each leaf at a path of ``index`` (``{flax path: shape}``).

    Returns:
      ``({key: Slot}, problems)``. A leaf in ``optional`` (a tie's alias) with
      no place is left out silently; any other leaf with no place, a shape that
      fits no candidate, or two leaves at one path is a problem, named.
    """
    slots: dict[str, Slot] = {}
    taken: dict[str, str] = {}
    problems: list[str] = []
    for leaf in leaves:
        tried: list[str] = []
        found: Slot | None = None
        for target in candidates(leaf, rules):
            for slot in _spellings(leaf, target, rules):
                shape = index.get(slot.path)
                if shape is None:
                    continue
                want = permute_shape(leaf.shape, slot.perm)
                if tuple(shape) == want:
                    found = slot
                    break
                tried.append(f"{slot.path!r} has shape {tuple(shape)}, not {want}")
            if found is not None:
                break
        if found is None:
            if tried:
                problems.append(
                    f"{leaf.key!r} {tuple(leaf.shape)}: no place with a matching shape: "
                    + "; ".join(tried)
                )
            elif leaf.key not in optional:
                spelled = [s.path for s in _spellings(leaf, candidates(leaf, rules)[0], rules)]
                problems.append(
                    f"{leaf.key!r} has no place in {what} (looked for {spelled[:2]} and "
                    "other rule candidates)"
                )
            continue
        if found.path in taken:
            problems.append(f"{leaf.key!r} and {taken[found.path]!r} both go to {found.path!r}")
            continue
        taken[found.path] = leaf.key
        slots[leaf.key] = found
    return slots, problems
