"""``merge_lora``: a PEFT LoRA adapter merged into its base, one tensor at a time.

The base is any input :func:`bridge.convert` reads (a Hugging Face directory, a
``.safetensors`` or PyTorch file, a DeepSpeed or DCP folder; an Orbax item, read in
the PyTorch names its naming record gives, as ``convert`` names it); the adapter a
PEFT directory (:func:`bridge.read_adapter`). Everything is checked from metadata
before a byte is written: every tensor the adapter changes must be the base's, of
the shape its factors (or its whole replacement) say. The output is
then written by ``convert``'s writers from a view of the base (:class:`MergedSource`)
whose changed tensors are merged as they are read (``W + scale * (B @ A)``, the
arithmetic and its rounding in :mod:`bridge.adapters.lora`): memory holds about
one tensor and its merge, never the model.

Ties are settled before anything is written. For each tie of the base (a
``config.json``'s ``tie_word_embeddings``, an alias map) one of whose sides the
adapter changes, both sides are merged and compared:

- equal, bit for bit: the tie is kept, the tensor stored once;
- different (an adapter on ``lm_head`` alone, ``modules_to_save`` on one side):
  both are written, ``config.json`` says ``tie_word_embeddings: false``, and one
  warning line says so -- or, with ``keep_tie``, a ``ValueError`` names both
  tensors and the largest difference, and nothing is written.

A config that ties two tensors that differ is never written.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge.adapters.lora import Change, changes
from bridge.adapters.peft import Adapter, read_adapter
from bridge.commands.convert import convert, output_format
from bridge.hf.config import config_ties
from bridge.layouts.rules import as_rules
from bridge.naming.torch_naming import in_torch_names
from bridge.sources.registry import opened
from jaxshare import AliasMap
from jaxshare.formats import CONFIG_FILE
from jaxshare.internal import (
    FileRange,
    PlannedSource,
    SourceView,
    check_not_an_input,
    is_floating,
)
from jaxshare.stream import ProgressFn, TensorSource

__all__ = ["MergedSource", "merge_lora"]

#: The config key of the tie between the input embedding and the output head.
TIE_KEY = "tie_word_embeddings"


class MergedSource(SourceView):
    """``source`` with an adapter's changes merged into its tensors as they are read.

    Args:
      source: the base, in PyTorch names.
      changed: ``{tensor name: Change}``, every name the base's (stored or tied).
      untied: aliases of the base written as tensors of their own now (their tie
        broken by the merge); every other tie is kept.
      config: the output's ``config.json`` (the base's, its ties settled).
      assets: the files that travel with the tensors (the base's, ``config.json``
        replaced where it changed).
    """

    def __init__(
        self,
        source: TensorSource,
        changed: Mapping[str, Change],
        untied: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        assets: Mapping[str, Path] | None = None,
    ) -> None:
        super().__init__(source)
        untied = frozenset(untied)
        self._changes = dict(changed)
        self.ties = AliasMap(
            {a: c for a, c in source.ties.items() if a not in untied},
            transforms={a: source.ties.transform(a) for a in source.ties if a not in untied},
        )
        self.origins = {a: o for a, o in source.origins.items() if a in self.ties}
        infos = dict(source.infos)
        for alias in sorted(untied):
            infos[alias] = source.infos[source.ties[alias]]
        self.infos = infos
        self.layers, self.buffers = source.layers, source.buffers
        self.notes, self.unapplied_ties = source.notes, source.unapplied_ties
        self.config = source.config if config is None else config
        self.assets = source.assets if assets is None else assets

    def _base(self, name: str) -> str:
        """The base tensor ``name`` is read from (an untied alias: its canonical)."""
        return name if name in self._source.infos else self._source.ties[name]

    def array(self, name: str) -> np.ndarray:
        weight = self._source.array(self._base(name))
        change = self._changes.get(name)
        return weight if change is None else change.apply(weight)

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        if name in self._changes or name not in self._source.infos:
            return [self.array(name)]
        return self._source.blocks(name)

    def extents(self, name: str) -> Sequence[FileRange]:
        return self._source.extents(self._base(name))


def _check(adapter: Adapter, source: TensorSource, changed: Mapping[str, Change]) -> None:
    """One line for the first change that does not fit the base: a tensor it lacks,
    a shape it does not have, a tensor that is not floating point."""
    names = {**source.infos, **{a: source.infos[c] for a, c in source.ties.items()}}
    missing = [n for n in changed if n not in names]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(
            f"{adapter.path}: the adapter changes {missing[0]!r}{more}, which the base "
            f"{source.where} does not hold; is it this adapter's base?"
        )
    fan = adapter.config.fan_in_fan_out
    for name, change in changed.items():
        info = names[name]
        if not is_floating(info.dtype):
            raise ValueError(
                f"{source.where}: {name!r} is {info.dtype}; an adapter changes floating "
                "point weights only."
            )
        shapes = []
        if change.replacement is not None:
            shapes.append(("its saved tensor", tuple(change.replacement.shape)))
        if change.pair is not None:
            shape = change.pair.weight_shape(fan)
            shapes.append((f"its rank-{change.pair.rank} factors", shape))
        for what, shape in shapes:
            if shape != tuple(info.shape):
                raise ValueError(
                    f"{adapter.path}: {name!r} is {tuple(info.shape)} in the base "
                    f"{source.where}, but {what} make it {shape}; is it this adapter's base?"
                )


def _settle_ties(
    source: TensorSource, changed: Mapping[str, Change], keep_tie: bool
) -> tuple[list[str], list[str]]:
    """The aliases whose ties the merge breaks, and a line for each: both sides of
    every tie the adapter touches are merged and compared. With ``keep_tie``, a tie
    that breaks is a ``ValueError`` (one line, both names and the largest
    difference)."""
    untied, lines = [], []
    for alias, canonical in source.ties.items():
        if alias not in changed and canonical not in changed:
            continue
        if source.ties.transform(alias) is not None:
            raise ValueError(
                f"{source.where}: {alias!r} is a transposed alias of {canonical!r}, and the "
                "adapter changes one of them; jaxshare merges into ties of one layout only."
            )
        weight = source.array(canonical)
        sides = [changed[n].apply(weight) if n in changed else weight for n in (alias, canonical)]
        if sides[0].tobytes() == sides[1].tobytes():
            continue
        wide = [np.asarray(side, np.float64) for side in sides]
        largest = float(np.max(np.abs(wide[0] - wide[1]))) if weight.size else 0.0
        del sides, wide
        if keep_tie:
            raise ValueError(
                f"{source.where}: merged, {alias!r} and {canonical!r} differ (max |delta| "
                f"{largest:.6g}), which the base ties; --keep-tie (`keep_tie=True`) refuses "
                "to untie them, and nothing was written."
            )
        untied.append(alias)
        lines.append(
            f"merged, {alias!r} and {canonical!r} differ (max |delta| {largest:.6g}): both "
            f"are written and config.json says {TIE_KEY}: false."
        )
    return untied, lines


def _untied_config(
    config: Mapping[str, Any], untied: Sequence[str], source: TensorSource
) -> dict[str, Any]:
    """``config`` with :data:`TIE_KEY` false (its ``text_config``'s too), checked to tie
    none of ``untied`` any more."""
    out = dict(config)
    out[TIE_KEY] = False
    if isinstance(out.get("text_config"), dict) and TIE_KEY in out["text_config"]:
        out["text_config"] = {**out["text_config"], TIE_KEY: False}
    stored = [*source.infos, *untied]
    still = set(config_ties(out, stored, as_rules(None), need_model=False).ties) & set(untied)
    if still:
        raise ValueError(
            f"{source.where}: merged, {sorted(still)[0]!r} differs from the tensor config.json "
            f"ties it to, and config.json ties them by more than {TIE_KEY}; nothing was "
            "written (merge into a base whose config can say they differ)."
        )
    return out


def merge_lora(
    base: str | os.PathLike | TensorSource,
    adapter: str | os.PathLike | Adapter,
    out: str | os.PathLike,
    /,
    *,
    keep_tie: bool = False,
    format: str | None = None,
    max_shard_size: str | int | None = None,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> Path:
    """Merges the LoRA ``adapter`` into ``base`` and writes the result at ``out``: what
    ``jaxshare merge BASE ADAPTER OUT`` does.

    Args:
      base: the base model: any input :func:`bridge.convert` reads (a Hugging Face
        directory, a ``.safetensors`` file, an Orbax item, ...), or a source.
      adapter: a PEFT LoRA adapter directory, or an :class:`~bridge.Adapter`.
      out: the output; its format as for :func:`bridge.convert` (``format``), but a
        directory is a Hugging Face directory where the base has a ``config.json``.
      keep_tie: refuse (a ``ValueError``, nothing written) rather than untie a tie
        whose sides the merge makes differ.
      format: ``"hf"``, ``"safetensors"``, ``"orbax"``, ``"torch"`` or ``"dcp"``.
      max_shard_size: the largest shard of a Hugging Face directory output.
      force: replace ``out`` if it is an output of the same kind.
      progress: ``progress(done, total, name, nbytes)`` after each tensor.

    Returns:
      ``out`` as a ``Path``.

    Raises:
      ValueError: an adapter that does not fit the base (a tensor the base lacks,
        a shape it does not have), one that is not plain LoRA, or a tie
        ``keep_tie`` refuses to break: one line, nothing written.
      FileNotFoundError: a missing input.
    """
    adapter = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
    out = Path(out)
    check_not_an_input(out, [adapter.path])
    changed = changes(adapter)
    with opened(base, arg="base") as stored:
        source = stored
        if stored.flax_named:  # (An Orbax item: read in the PyTorch names it records.)
            plan, reads = in_torch_names(stored, rules=as_rules(None))
            source = PlannedSource(reads, plan)
        _check(adapter, source, changed)
        untied, lines = _settle_ties(source, changed, keep_tie)
        has_config = source.config is not None
        fmt = format or ("hf" if has_config and not out.suffix else None)
        fmt = output_format(out, fmt, hf_options=max_shard_size is not None)
        with tempfile.TemporaryDirectory(prefix="jaxshare-merge-") as scratch:
            config, assets = source.config, source.assets
            if untied and source.config is not None:
                config = _untied_config(source.config, untied, source)
                kept = Path(scratch) / CONFIG_FILE
                kept.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
                assets = {**source.assets, CONFIG_FILE: kept}
            merged = MergedSource(source, changed, untied, config, assets)
            for line in lines:
                warnings.warn(f"{source.where}: {line}", stacklevel=2)
            convert(
                merged,
                out,
                format=fmt,
                config=config if fmt == "hf" else None,
                max_shard_size=max_shard_size,
                force=force,
                progress=progress,
            )
    return out
