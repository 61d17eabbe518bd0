"""The ties and layer kinds of transformers' model classes, tabulated: no transformers, no torch.

Building a config's model class on the meta device (:mod:`bridge.hf.meta`) names a
Hugging Face directory's ties exactly, but importing transformers and torch costs
seconds. ``bridge/hf/table.json`` holds what that model tells, per model class,
generated from transformers by ``make hf-table`` (``python -m bridge.hf.meta``) and
tested against it (``tests/bridge/test_hf_table.py``):

- its ties (``all_tied_weights_keys`` and parameters registered twice), for each
  value ``config.json`` may give ``tie_word_embeddings`` (absent, true, false);
- its tensor names in ``state_dict()`` order, and the class (with its MRO's names)
  of every module that holds a tensor, with list indices written ``{i}``, so one
  entry serves any number of layers.

:func:`table_ties` answers only where the table is sure: a class it holds, of the
config's model type, whose files hold no tensor the class does not know, without
``tie_encoder_decoder`` and with a boolean (or absent) ``tie_word_embeddings``;
otherwise it returns ``None`` and the model class is built as before.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.hf.experts import experts_family
from bridge.layouts.rules import Rules, class_kind

__all__ = [
    "TABLE_FILE",
    "TableAnswer",
    "load_table",
    "name_order",
    "ordered_templates",
    "table_ties",
    "template",
]

#: Where the table lives (package data, written by ``python -m bridge.hf.meta``).
TABLE_FILE = Path(__file__).with_name("table.json")
FORMAT, VERSION = "jaxshare.hf_table", 1

#: ``(ties, {module prefix: layer kind}, sort key of a tensor name)``.
TableAnswer = tuple[dict[str, str], dict[str, str | None], Callable[[str], tuple]]


def template(name: str) -> str:
    """``name`` with every list index written ``{i}``.

    >>> template("transformer.h.11.attn.c_attn.weight")
    'transformer.h.{i}.attn.c_attn.weight'
    """
    return ".".join("{i}" if part.isdigit() else part for part in name.split("."))


def name_order(names: Sequence[str]) -> Callable[[str], tuple | None]:
    """A sort key that puts tensor names in the order of ``names`` (templates, in
    ``state_dict()`` order): a module's own tensors before its children's, children
    in the order first seen, list items by index. ``None`` for a name it cannot place.

    >>> key = name_order(["wte.weight", "h.{i}.w", "h.{i}.b", "ln_f.weight"])
    >>> sorted(["ln_f.weight", "h.1.w", "h.0.b", "h.0.w", "wte.weight"], key=key)
    ['wte.weight', 'h.0.w', 'h.0.b', 'h.1.w', 'ln_f.weight']
    """
    children: dict[tuple[str, ...], dict[str, int]] = {}
    for name in names:
        parts = tuple(name.split("."))
        for depth, part in enumerate(parts):
            seen = children.setdefault(parts[:depth], {})
            seen.setdefault(part, len(seen))

    def key(name: str) -> tuple | None:
        out: list[int] = []
        prefix: tuple[str, ...] = ()
        for part in name.split("."):
            generic = "{i}" if part.isdigit() else part
            rank = children.get(prefix, {}).get(generic)
            if rank is None:
                return None
            out += (rank, int(part) if part.isdigit() else 0)
            prefix += (generic,)
        return tuple(out)

    return key


def ordered_templates(*builds: Sequence[str]) -> list[str] | None:
    """The templates of the tensor names of ``builds`` (each a model's names in
    ``state_dict()`` order) in an order :func:`name_order` sorts each back into,
    ``None`` if there is none: list items may hold different children (T5's
    ``layer.0`` attention, ``layer.1`` MLP, both a ``layer_norm``), in orders every
    item agrees with.

    >>> ordered_templates(["l.0.a.w", "l.0.n.w", "l.1.m.w", "l.1.n.w"])
    ['l.{i}.a.w', 'l.{i}.m.w', 'l.{i}.n.w']
    """
    seen: dict[tuple[int, tuple[str, ...]], list[str]] = {}  # (build, parent) -> children
    for b, names in enumerate(builds):
        for name in names:
            parts = name.split(".")
            for depth, part in enumerate(parts):
                children = seen.setdefault((b, tuple(parts[:depth])), [])
                generic = "{i}" if part.isdigit() else part
                if generic not in children:
                    children.append(generic)
    after: dict[tuple[str, ...], dict[str, set[str]]] = {}
    first: dict[tuple[str, ...], dict[str, int]] = {}
    for (_, parent), children in seen.items():
        generic_parent = tuple("{i}" if p.isdigit() else p for p in parent)
        edges, rank = after.setdefault(generic_parent, {}), first.setdefault(generic_parent, {})
        for i, child in enumerate(children):
            rank.setdefault(child, len(rank))
            edges.setdefault(child, set()).update(children[:i])
    order: dict[tuple[str, ...], dict[str, int]] = {}
    for parent, edges in after.items():
        placed: dict[str, int] = {}
        while len(placed) < len(edges):
            ready = [
                c for c, before in edges.items() if c not in placed and before <= placed.keys()
            ]
            if not ready:
                return None  # Items order their children differently.
            placed[min(ready, key=first[parent].__getitem__)] = len(placed)
        order[parent] = placed

    def key(t: str) -> tuple[int, ...]:
        parts = t.split(".")
        return tuple(order[tuple(parts[:d])][p] for d, p in enumerate(parts))

    return sorted(dict.fromkeys(template(n) for names in builds for n in names), key=key)


@functools.cache
def load_table(path: Path = TABLE_FILE) -> Mapping[str, Any] | None:
    """The table at ``path``, ``None`` where there is none (or it is of another
    format or version: then every config builds its model class)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data if type(data.get("version")) is int and data["version"] == VERSION else None


def _owners(names: Iterable[str]) -> set[str]:
    """Every module prefix that holds one of ``names``, and each ancestor (``""``: the
    model)."""
    out = {""}
    for name in names:
        parts = name.split(".")[:-1]
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def table_ties(
    config: Mapping[str, Any],
    stored: Collection[str],
    rules: Rules,
    *,
    table: Mapping[str, Any] | None = None,
) -> TableAnswer | None:
    """What the model class of ``config`` built on the meta device would say of a
    model whose files hold ``stored``, from the table alone: ``(ties, {module: layer
    kind} for every module holding a tensor and its ancestors, sort key putting
    names in state_dict() order)``, or ``None`` where the table cannot be sure.

    The class is chosen as :func:`bridge.hf.meta.meta_model_ties` chooses it:
    ``architectures[0]``; without one, the model type's causal-LM class when
    ``stored`` holds an ``lm_head.weight``, else its base model.

    >>> ties, layers, key = table_ties(
    ...     {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
    ...     ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"], Rules())
    >>> ties, layers["transformer.h.0.attn.c_attn"]
    ({'lm_head.weight': 'transformer.wte.weight'}, 'conv1d')
    """
    table = load_table() if table is None else table
    model_type = config.get("model_type")
    if table is None or not isinstance(model_type, str) or config.get("tie_encoder_decoder"):
        return None
    architectures = config.get("architectures") or []
    if architectures:
        name = architectures[0]
    else:
        auto = table["auto"].get(model_type) or {}
        name = auto.get("causal" if "lm_head.weight" in stored else "base")
    entry = table["models"].get(model_type, {}).get(name) if isinstance(name, str) else None
    if entry is None:
        return None
    flag = config.get("tie_word_embeddings", "absent")
    if flag not in (True, False, "absent"):
        return None
    ties = dict(entry["ties"][{True: "true", False: "false"}.get(flag, flag)])
    known = set(entry["names"])
    # (A mixture of experts saved per expert: the class holds each layer's experts fused.)
    family = experts_family(config)
    as_held = (lambda n: n) if family is None else family.held_name
    if any(template(as_held(n)) not in known for n in stored):
        return None  # A tensor the class does not have here: a config this entry never saw.
    modules: Mapping[str, Any] = entry["modules"]
    classes: Sequence[Sequence[str]] = table["classes"]
    layers: dict[str, str | None] = {}
    for prefix in sorted(_owners([*stored, *ties, *ties.values()])):
        module = as_held(f"{prefix}.")[:-1] if prefix else prefix  # (A module, renamed.)
        found = modules.get(template(module))
        if found is None and family is not None and family.in_expert(prefix):
            continue  # (One expert's module: the class has none; its kind is not known.)
        if found is None:
            return None
        kinds = {
            class_kind(classes[i], rules) for i in (found if isinstance(found, list) else [found])
        }
        if len(kinds) != 1:
            return None  # List items of different kinds under these rules: the class decides.
        layers[prefix] = kinds.pop()
    order = name_order(entry["names"])

    def key(name: str) -> tuple:
        rank = order(name)
        return (1,) if rank is None else (0, *rank)

    return ties, layers, key
