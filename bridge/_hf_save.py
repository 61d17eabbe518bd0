"""``save_hf``: any source or tree as a Hugging Face model directory.

Shards of at most ``max_shard_size``, split as ``save_pretrained`` splits; each
tensor streamed from the source through the plan (read, cast, transposed, written,
dropped); the aliases the config ties left out as ``save_pretrained`` leaves
them out, every other alias written out; each shard's metadata recording the ties
whose canonical it stores (and the naming record); the whole directory written
under a temporary name and renamed into place only when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge._hf_config import ConfigTies, config_dict, config_ties
from bridge._open import open_source
from bridge._rules import Rule, Rules, as_rules
from bridge._torch_naming import torch_plan
from jaxshare import AliasMap
from jaxshare.formats import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_SIZE,
    SAFE_INDEX,
    SAFE_WEIGHTS,
    TensorSpec,
    parse_size,
    shard_name,
    write_safetensors,
)
from jaxshare.internal import (
    HF_DIRECTORY,
    atomic_output,
    compose,
    float_dtype,
    is_floating,
    is_nnx_module,
    numpy_dtype,
    tie_metadata,
)
from jaxshare.stream import Plan, PlanEntry, ProgressFn, TensorSource

__all__ = ["save_hf"]

_GENERATION_CONFIG = "generation_config.json"


def _source_of(what: Any, rules: Rules, like: Callable[[], Any]) -> TensorSource:
    """A source of whatever ``save_hf`` was given: :func:`bridge.open_source` of a
    path, a source, a module or a state dict; a Flax tree is named in PyTorch by
    :func:`bridge.to_torch` (its naming record, else ``like()``, the config's meta
    model) and read as that state dict."""
    from jaxshare import Tied

    flax_tree = isinstance(what, Tied) or is_nnx_module(what)
    if isinstance(what, Mapping) and not isinstance(what, TensorSource):
        flax_tree = not _is_state_dict(what)
    if not flax_tree:
        return open_source(what, rules, arg="source_or_tree")
    from bridge._sources import StateDictSource
    from bridge._to_torch import to_torch

    named = isinstance(what, Tied) and what.alias_map.naming is not None
    state = to_torch(what, rules=rules, like=None if named else like())
    return StateDictSource(state, rules, arg="source_or_tree")


def _is_state_dict(mapping: Mapping) -> bool:
    """A mapping of torch tensors (not of Flax arrays and subtrees)."""
    torch = sys.modules.get("torch")  # (A tensor exists only once torch is imported.)
    return (
        torch is not None
        and bool(mapping)
        and all(isinstance(v, torch.Tensor) for v in mapping.values())
    )


def _outputs(
    plan: Plan, tied_by_config: Mapping[str, str], names: Iterable[str] | None
) -> list[PlanEntry]:
    """The entries to write: the plan's, plus each alias the config does not tie
    (transformers reads no alias map) read from its canonical's source, in the
    model's ``state_dict()`` order where it is known."""
    declared = AliasMap(tied_by_config)  # (Chains collapsed: each name to its group's root.)
    tied = {*declared, *declared.values()}
    by_name = {e.name: e for e in plan.entries}
    amap = plan.alias_map
    entries = list(plan.entries)
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        same_group = declared.get(alias, alias) == declared.get(canonical, canonical)
        if perm is None and alias in tied and same_group:
            continue  # Left out, as save_pretrained leaves it out.
        c = by_name[canonical]
        entries.append(PlanEntry(alias, c.source, compose(perm, c.perm), c.info.permuted(perm)))
    if names is not None:
        rank = {n: i for i, n in enumerate(names)}
        position = {e.name: i for i, e in enumerate(entries)}
        entries.sort(key=lambda e: (rank.get(e.name, len(rank)), position[e.name]))
    return entries


def _shards(entries: list[PlanEntry], limit: int) -> list[list[PlanEntry]]:
    """``save_pretrained``'s split: in order, a new shard when the next tensor
    would overflow this one; a tensor over the limit alone."""
    shards: list[list[PlanEntry]] = []
    current: list[PlanEntry] = []
    size = 0
    for entry in entries:
        n = entry.info.nbytes
        if n > limit:
            shards.append([entry])
            continue
        if current and size + n > limit:
            shards.append(current)
            current, size = [], 0
        current.append(entry)
        size += n
    if current or not shards:
        shards.append(current)
    return shards


def _config_text(config: Any, cfg: dict, entries: list[PlanEntry]) -> bytes:
    """``config.json`` as given (the file's own bytes where nothing changes), its
    ``dtype`` set to the weights' floating dtype when they all share one."""
    floats = {e.info.dtype for e in entries if is_floating(e.info.dtype)}
    changed = False
    if len(floats) == 1:
        (dtype,) = floats
        for key in ("dtype", "torch_dtype"):
            if key in cfg and cfg[key] != dtype:
                cfg[key] = dtype
                changed = True
    if isinstance(config, (str, os.PathLike)) and not changed:
        path = Path(config)
        return (path / CONFIG_FILE if path.is_dir() else path).read_bytes()
    return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def save_hf(
    directory: str | os.PathLike,
    source_or_tree: Any,
    /,
    *,
    config: Any = None,
    plan: Plan | None = None,
    dtype: Any = None,
    max_shard_size: int | str | None = None,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    progress: ProgressFn | None = None,
    rules: Rules | Sequence[Rule] | None = None,
    use_transformers: bool | None = None,
) -> Path:
    """Writes a Hugging Face model directory that transformers'
    ``from_pretrained`` loads with no missing or unexpected keys.

    ``config.json`` (passed through), then the weights as ``model.safetensors``,
    or shards ``model-0000k-of-0000N.safetensors`` of at most ``max_shard_size``
    each with ``model.safetensors.index.json`` (``metadata.total_size``,
    ``weight_map``). Each shard's metadata holds ``{"format": "pt"}`` and the
    ties (and naming record) whose canonical it stores, so jaxshare reads every
    tie back. A tie the config declares is left out of the files, as
    ``save_pretrained`` does (transformers ties it again on load); every other
    alias is written out. Tensors are read, cast and transposed one at a time;
    the directory appears only when complete.

    Args:
      directory: the output directory.
      source_or_tree: a path (an Orbax item, a weights file, a Hugging Face or
        DeepSpeed directory), a :class:`jaxshare.stream.TensorSource`, a torch module
        or state dict, Flax variables, a :class:`jaxshare.Tied` or an
        ``nnx.Module`` (Flax trees are named in PyTorch by :func:`bridge.to_torch`).
      config: ``config.json``: a path, a dict or a ``PretrainedConfig``; default:
        the source's (a Hugging Face directory's own).
      plan: the outputs (PyTorch names); default: the source's tensors as they
        are, or :func:`bridge.torch_plan` of a Flax-named source.
      dtype: cast floating tensors (e.g. ``"bfloat16"``); ``config.json``'s
        ``dtype`` follows.
      max_shard_size: the largest shard, an int (bytes) or a string such as
        ``"5GB"`` (default ``"50GB"``, as transformers 5).
      force: replace an existing Hugging Face directory at ``directory``.
      inputs: more paths the output is made from (the output may be none of them,
        nor the source's own path).
      progress: ``progress(done, total, name, nbytes)`` after each tensor.
      rules: naming rules for Flax trees and sources.
      use_transformers: as for :class:`HFDirectory`, for the config's ties.

    Returns:
      ``directory`` as a ``Path``.

    Raises:
      FileExistsError: ``directory`` exists and ``force`` is false.
      ValueError: a bad size, config or plan (Flax names); an output that is an
        input; nothing is left behind.
    """
    rules = as_rules(rules)
    limit = parse_size(DEFAULT_MAX_SHARD_SIZE if max_shard_size is None else max_shard_size)
    float_dtype(dtype)

    def meta(config: Any) -> ConfigTies:
        return config_ties(config_dict(config), (), rules, use_transformers=use_transformers)

    def like() -> Any:
        """The meta model to name Flax leaves after, where no naming record does."""
        if config is None:
            raise ValueError(
                f"{directory}: a Hugging Face directory needs a config.json; pass `config=`."
            )
        return meta(config).model

    source = _source_of(source_or_tree, rules, like)
    try:
        if config is None:
            config = getattr(source, "config", None)
            if config is None:
                raise ValueError(
                    f"{directory}: a Hugging Face directory needs a config.json; pass `config=` "
                    f"({source.where} has none)."
                )
        from_source = config is getattr(source, "config", None)
        cfg = config_dict(config)
        found = meta(cfg)
        if plan is None:
            if source.flax_named:
                named = source.ties.naming is not None
                plan = torch_plan(source, rules=rules, like=None if named else found.model)
            else:
                plan = Plan.identity(source)
        plan = plan.cast(dtype)
        flax_names = [e.name for e in plan.entries if "/" in e.name]
        if flax_names:
            raise ValueError(
                f"{directory}: a Hugging Face directory holds PyTorch names, but the plan names "
                f"{flax_names[:3]}; pass `plan=bridge.torch_plan(source)`."
            )
        if not found.exact:  # The table decides by the names stored.
            stored = [e.name for e in plan.entries]
            found = config_ties(cfg, stored, rules, use_transformers=False)
        entries = _outputs(plan, found.ties, found.names)
        shards = _shards(entries, limit)
        names = [shard_name(SAFE_WEIGHTS, k, len(shards)) for k in range(1, len(shards) + 1)]
        text = _config_text(config, cfg, entries)
        inputs = [*inputs, *([source.path] if source.path is not None else [])]
        if isinstance(source_or_tree, (str, os.PathLike)):
            inputs.append(source_or_tree)
        generation = _generation_config(source) if from_source else None
        _write(
            Path(directory), plan, source, shards, names, text, generation,
            force=force, inputs=inputs, progress=progress,
        )  # fmt: skip
    finally:
        if source is not source_or_tree:
            source.close()
    return Path(directory)


def _generation_config(source: TensorSource) -> Path | None:
    layout = getattr(source, "layout", None)
    path = None if layout is None else layout.directory / _GENERATION_CONFIG
    return path if path is not None and path.is_file() else None


def _write(
    dst: Path,
    plan: Plan,
    source: TensorSource,
    shards: list[list[PlanEntry]],
    names: list[str],
    config_text: bytes,
    generation: Path | None,
    *,
    force: bool,
    inputs: Iterable[str | os.PathLike],
    progress: ProgressFn | None,
) -> None:
    amap = plan.alias_map
    total = sum(len(s) for s in shards)
    done = 0
    with atomic_output(dst, HF_DIRECTORY, force=force, inputs=inputs) as tmp:
        tmp.mkdir()
        for shard, name in zip(shards, names, strict=True):
            here = {e.name for e in shard}
            mine = {a: c for a, c in amap.items() if c in here}
            shard_map = AliasMap(
                mine,
                transforms={a: p for a, p in amap.transforms.items() if a in mine},
                naming=amap.naming,
            )
            metadata = {"format": "pt", **tie_metadata(shard_map)}
            specs = [TensorSpec(e.name, e.info.shape, numpy_dtype(e.info.dtype)) for e in shard]
            with write_safetensors(tmp / name, specs, metadata) as write:
                for entry in shard:
                    write(plan.blocks(source, entry))
                    done += 1
                    if progress is not None:
                        progress(done, total, entry.name, entry.info.nbytes)
        if len(shards) > 1:
            weight_map = {e.name: n for s, n in zip(shards, names, strict=True) for e in s}
            index = {
                "metadata": {
                    "total_parameters": sum(int(np.prod(e.info.shape)) for s in shards for e in s),
                    "total_size": sum(e.info.nbytes for s in shards for e in s),
                },
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / CONFIG_FILE).write_bytes(config_text)
        if generation is not None:
            shutil.copyfile(generation, tmp / _GENERATION_CONFIG)
