"""A Flax-named source placed in a Flax layout: as it is, or through its PyTorch names.

A Flax model's own files (``flax_model.msgpack``) and Orbax items are Flax-named
already. Placed in the layout they are in (their paths and ``config.json`` show
it: :func:`bridge.naming.torch_naming.flax_layout`), every tensor stays where it
is; placed in another layout, or in a target tree (``like=``), they are named in
PyTorch first (:func:`bridge.torch_plan`, by their own layout) and placed from
there, each tensor read and transposed once, when it is written. Nothing here
imports torch or JAX (but for the config's model class on the meta device, which
tells the layout of a tree under a linen ``params`` collection where transformers
is installed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge.layouts.layout import JAXSHARE, Layout, as_layout
from bridge.layouts.rules import Rules
from bridge.naming.flax_placement import FlaxPlacement, Place, place_source
from bridge.naming.torch_naming import flax_layout, torch_plan
from jaxshare import AliasMap
from jaxshare.internal import PlannedSource, render, split
from jaxshare.stream import TensorSource

__all__ = ["place_any"]


def place_any(
    source: TensorSource, *, like: Any, rules: Rules, layout: str | Layout | None
) -> tuple[FlaxPlacement, TensorSource]:
    """The placement of any ``source`` in Flax paths, and the source it reads: a
    PyTorch-named one by :func:`place_source`; a Flax-named one as it is, when it is
    in the layout asked for (``layout`` unset or its own, no ``like``), else through
    its PyTorch names."""
    chosen = None if layout is None else as_layout(layout)
    if chosen is not None and chosen.view is not None:  # (MaxText, tables: a view, not rules.)
        source = source if source.flax_named else chosen.view(source, None)
        placed = _as_is(source)
        return (placed if like is None else _in_like(placed, source, like, chosen)), source
    if source.flax_named:
        kept = _kept_as_is(source, like, rules, layout)
        if kept is not None:
            return kept, source
        source = _in_torch_names(source, rules)
    placed = place_source(source, like=like, rules=rules, layout=layout)
    return placed, placed.reads or source


def _in_like(
    placed: FlaxPlacement, source: TensorSource, like: Any, layout: Layout
) -> FlaxPlacement:
    """``placed`` (a view's leaves at their own paths) in the target tree ``like``:
    every leaf of the view a leaf of ``like`` of its shape, every leaf of ``like``
    filled.

    Raises:
      ValueError: one line naming the first leaf that disagrees.
    """
    from bridge.naming.like import like_tree  # (JAX: `like` is a Flax tree.)

    tree = like_tree(like)
    where = f"{source.where}: the {layout.name} layout"
    for name in placed.stored:
        path, shape = split(name), tuple(source.infos[name].shape)
        if path not in tree.shapes:
            raise ValueError(
                f"{where} makes the leaf {name!r} {shape}, which `like` lacks; pass the model "
                "of the checkpoint's config.json."
            )
        if tree.shapes[path] != shape:
            raise ValueError(
                f"{where} makes the leaf {name!r} {shape}, but `like` holds it as "
                f"{tree.shapes[path]}; pass the model of the checkpoint's config.json."
            )
    filled = {split(name) for name in placed.stored}
    empty = [render(p) for p in tree.shapes if p not in filled]
    if empty:
        raise ValueError(
            f"{where} fills no tensor into {len(empty)} leaves of `like`, first {empty[0]!r}; "
            "pass the checkpoint the model was made for."
        )
    return dataclasses.replace(placed, like=tree)


def _kept_as_is(
    source: TensorSource, like: Any, rules: Rules, layout: str | Layout | None
) -> FlaxPlacement | None:
    """Every tensor where it is, when ``source`` is in ``layout`` already (or none is
    asked for) and no ``like`` is given: the layout it is in is :func:`flax_layout`'s."""
    if like is not None:
        return None
    if layout is not None:
        found = flax_layout(source, config=source.config, rules=rules)
        if as_layout(layout) is not (found or JAXSHARE):
            return None
    return _as_is(source)


def _as_is(source: TensorSource) -> FlaxPlacement:
    """Every tensor of a Flax-named ``source`` placed at its own path."""
    places = {name: Place(split(name), None) for name in [*source.infos, *source.ties]}
    stored = [name for name in source.infos if name not in source.ties]
    return FlaxPlacement(places, stored, source.ties)


def _in_torch_names(source: TensorSource, rules: Rules) -> TensorSource:
    """``source`` in PyTorch names, its tensors read (and transposed) one at a time,
    its ties without the naming record, which would place them back where they were."""
    plan = torch_plan(source, rules=rules)
    amap = plan.alias_map
    ties = AliasMap(dict(amap), transforms=dict(amap.transforms))
    return PlannedSource(source, dataclasses.replace(plan, alias_map=ties))
