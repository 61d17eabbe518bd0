"""What ``jaxshare inspect`` says of a PEFT adapter directory: its rank, alpha and
scaling, the modules it targets and touches (per layer), what it replaces whole,
its base model, and which side of each of the base's ties it changes.

The base's ties come from its ``config.json`` (``config=``, ``--config``), else
from the base itself where ``base_model_name_or_path`` is a local model directory
(read from metadata, as ``merge`` reads it); otherwise the report says it cannot
tell.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge.adapters.lora import Change, changes
from bridge.adapters.peft import Adapter, read_adapter
from bridge.hf.config import config_dict, config_ties
from bridge.layouts.rules import as_rules
from bridge.sources.registry import find_reader, opened
from jaxshare.formats import ADAPTER_CONFIG, ADAPTER_WEIGHTS, SafetensorsFile
from jaxshare.internal import SourceView
from jaxshare.stream import TieReport

__all__ = ["AdapterSource", "base_ties", "describe", "inspect_adapter"]

#: A module of a numbered layer: ``(prefix, index, rest)``.
_LAYER = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


class AdapterSource(SourceView):
    """A PEFT adapter directory as a source: its tensors in PEFT's names, its
    description in :attr:`notes`."""

    def __init__(self, adapter: Adapter, notes: tuple[str, ...] = ()) -> None:
        weights = SafetensorsFile(adapter.path / ADAPTER_WEIGHTS)
        super().__init__(weights)
        self.path, self.kind, self.infos = adapter.path, "peft-adapter", weights.infos
        self.parts = (*weights.parts, ADAPTER_CONFIG)
        known = {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
        self.other_files = tuple(
            sorted(p.name for p in adapter.path.iterdir() if p.name not in known)
        )
        self.notes = notes

    @property
    def where(self) -> str:
        return str(self.path)

    def array(self, name: str) -> Any:
        return self._source.array(name)


def base_ties(adapter: Adapter, config: Any = None) -> Mapping[str, str] | None:
    """``{alias: canonical}`` of the adapter's base, in PyTorch names: from ``config``
    (a ``config.json``, its directory or a dict), else from the base where
    ``base_model_name_or_path`` is a local input jaxshare reads; ``None`` where
    neither tells."""
    if config is not None:
        cfg = config_dict(config)
        stored = sorted({*changes(adapter), "lm_head.weight"})  # (a causal LM's class)
        return dict(config_ties(cfg, stored, as_rules(None), need_model=False).ties)
    base = adapter.config.base_model_name_or_path
    if base is None or not os.path.exists(base) or find_reader(Path(base)) is None:
        return None
    with opened(base, arg="base") as source:
        return dict(source.ties)


def _layers(modules: list[str]) -> list[str]:
    """The modules, those of numbered layers grouped: one line per set of layers
    that touch the same modules."""
    by_layer: dict[tuple[str, int], list[str]] = {}
    loose = []
    for module in modules:
        match = _LAYER.match(module)
        if match is None:
            loose.append(module)
        else:
            by_layer.setdefault((match[1], int(match[2])), []).append(match[3])
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for (prefix, index), rest in sorted(by_layer.items()):
        groups.setdefault((prefix, tuple(sorted(rest))), []).append(index)
    lines = [
        f"touches in {prefix}.{{{_span(indices)}}}: {', '.join(rest)}"
        for (prefix, rest), indices in groups.items()
    ]
    if loose:
        lines.append(f"touches: {', '.join(loose)}")
    return lines


def _span(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``.

    >>> _span([0, 1, 2, 5])
    '0-2,5'
    """
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def _tie_line(alias: str, canonical: str, changed: Mapping[str, Change]) -> str | None:
    sides = [n for n in (alias, canonical) if n in changed]
    if not sides:
        return None
    if len(sides) == 2:
        return (
            f"tie {alias} = {canonical}: the adapter changes both ({changed[alias].how}; "
            f"{changed[canonical].how}); merged, the tie is kept only where they agree"
        )
    other = canonical if sides[0] == alias else alias
    return (
        f"tie {alias} = {canonical}: the adapter changes {sides[0]} "
        f"({changed[sides[0]].how}) but not {other}; merged, they differ: `jaxshare merge` "
        "unties them (tie_word_embeddings: false), --keep-tie refuses"
    )


def describe(adapter: Adapter, ties: Mapping[str, str] | None) -> list[str]:
    """The lines ``inspect`` prints for ``adapter``, its base's ties ``ties`` (``None``:
    unknown)."""
    c = adapter.config
    how = "lora_alpha / sqrt(r), rsLoRA" if c.use_rslora else "lora_alpha / r"
    lines = [
        f"PEFT LoRA adapter: r={c.r}, lora_alpha={c.lora_alpha}, scaling {c.scaling:g} ({how})"
    ]
    modules = adapter.modules()
    for key in ("rank_pattern", "alpha_pattern"):
        if c.raw.get(key):
            lines.append(f"{key}: {dict(c.raw[key])}")
    scalings = sorted({c.scaling_of(m) for m in modules})
    if scalings and scalings != [c.scaling]:
        lines.append(f"scalings by module: {', '.join(f'{s:g}' for s in scalings)}")
    targets = c.target_modules
    if isinstance(targets, str):
        lines.append(f"target modules (regex): {targets}")
    else:
        lines.append(f"target modules: {', '.join(sorted(targets)) or 'none named'}")
    lines += _layers(list(modules))
    embeddings = sorted(m for m, p in modules.items() if p.embedding)
    if embeddings:
        lines.append(f"embeddings (delta (B @ A).T): {', '.join(embeddings)}")
    saved = sorted(adapter.saved())
    if c.modules_to_save:
        lines.append(f"modules_to_save: {', '.join(c.modules_to_save)}")
    if saved:
        lines.append(
            "whole tensors it carries (modules_to_save; base layers PEFT saves beside their "
            f"adapter): {', '.join(saved)}"
        )
    lines.append(f"base model: {c.base_model_name_or_path or 'not recorded'}")
    if c.raw.get("ensure_weight_tying"):
        lines.append("ensure_weight_tying: true (PEFT gave tied layers one adapter)")
    if ties is None:
        lines.append(
            "ties of the base: unknown (its config.json not found: pass --config, the base's "
            "config.json or directory)"
        )
        return lines
    changed = changes(adapter)
    tie_lines = [line for a, k in sorted(ties.items()) if (line := _tie_line(a, k, changed))]
    if not ties:
        lines.append("ties of the base: none")
    elif not tie_lines:
        lines.append(f"ties of the base: {len(ties)}, none touched by the adapter")
    return lines + tie_lines


def inspect_adapter(path: str | os.PathLike, *, config: Any = None) -> TieReport:
    """The report of the adapter directory ``path``: its tensors (PEFT's names, no
    ties of their own) and, as notes, :func:`describe`'s lines.

    Raises:
      FileNotFoundError, ValueError: not a readable plain LoRA adapter (one line).
    """
    adapter = read_adapter(path)
    notes = tuple(describe(adapter, base_ties(adapter, config)))
    with AdapterSource(adapter, notes) as source:
        return source.report()
