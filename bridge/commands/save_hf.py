"""``save_hf``: any source or tree as a Hugging Face model directory.

Shards of at most ``max_shard_size``, split as ``save_pretrained`` splits; each
tensor streamed from the source through the plan (read, cast, transposed, written,
dropped); the aliases the config ties left out as ``save_pretrained`` leaves
them out, every other alias written out; each shard's metadata recording the ties
whose canonical it stores (and the naming record); the whole directory written
under a temporary name and renamed into place only when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge.hf.config import ConfigTies, config_dict, config_ties
from bridge.hf.experts import FusedView, experts_family
from bridge.layouts.layout import TRANSFORMERS_FLAX, Family, Layout, as_layout
from bridge.layouts.rules import Rule, Rules, as_rules
from bridge.naming.torch_naming import ModelTensors, flax_layout, flax_variables, torch_plan
from bridge.sources.registry import open_source
from jaxshare import AliasMap
from jaxshare.formats import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_SIZE,
    MANIFEST_KEY,
    SAFE_INDEX,
    SAFE_WEIGHTS,
    TensorSpec,
    parse_size,
    shard_name,
    write_safetensors,
)
from jaxshare.internal import (
    HF_DIRECTORY,
    Manifest,
    ManifestEntry,
    PlannedSource,
    UnstackedSource,
    atomic_output,
    compose,
    data_offsets,
    float_dtype,
    is_floating,
    is_nnx_module,
    numpy_dtype,
    tie_metadata,
    unstacked,
)
from jaxshare.stream import Plan, PlanEntry, ProgressFn, TensorSource

__all__ = ["save_hf"]


def _source_of(
    what: Any,
    rules: Rules,
    like: Callable[[], Any],
    layout: Callable[[Any], Layout | None],
    config: Any,
) -> TensorSource:
    """A source of whatever ``save_hf`` was given: :func:`bridge.open_source` of a
    path, a source, a module or a state dict; a Flax tree is named in PyTorch by
    :func:`bridge.to_torch` -- by its naming record, else by ``layout(tree)`` when it
    is the transformers-flax layout (its family's, of ``config``), else after
    ``like()``, the config's meta model -- and read as that state dict."""
    if isinstance(what, (str, os.PathLike, TensorSource)):  # (Read as it is: no JAX.)
        return open_source(what, rules, arg="source_or_tree")
    from jaxshare import Tied  # (JAX: a tree of arrays.)

    flax_tree = isinstance(what, Tied) or is_nnx_module(what)
    if isinstance(what, Mapping) and not isinstance(what, TensorSource):
        flax_tree = not _is_state_dict(what)
    if not flax_tree:
        return open_source(what, rules, arg="source_or_tree")
    named = isinstance(what, Tied) and what.alias_map.naming is not None
    chosen = None if named else layout(what)
    if chosen is not None and chosen.view is not None:  # (Its view names the tree.)
        from jaxshare.checkpoint import TreeSource

        return TreeSource(what.unique if isinstance(what, Tied) else what)
    from bridge.naming.to_torch import to_torch
    from bridge.torch.state_dict import StateDictSource

    if named or (chosen is not None and not chosen.collections):
        cfg = None if config is None else config_dict(config)
        state = to_torch(what, rules=rules if chosen is None else chosen.resolve(cfg, rules))
    else:
        state = to_torch(what, rules=rules, like=like())
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
    plan: Plan, tied_by_config: Mapping[str, str], order: Callable[[str], Any] | None
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
    if order is not None:
        position = {e.name: i for i, e in enumerate(entries)}
        entries.sort(key=lambda e: (order(e.name), position[e.name]))
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


def _config_text(
    file: Path | None, cfg: dict, entries: list[PlanEntry], *, changed: bool = False
) -> bytes:
    """``config.json``: ``file``'s own bytes where nothing changes (``changed``: ``cfg``
    differs from it already), its ``dtype`` set to the weights' floating dtype when
    they all share one."""
    floats = {e.info.dtype for e in entries if is_floating(e.info.dtype)}
    if len(floats) == 1:
        (dtype,) = floats
        for key in ("dtype", "torch_dtype"):
            if key in cfg and cfg[key] != dtype:
                cfg[key] = dtype
                changed = True
    if file is not None and not changed:
        return file.read_bytes()
    return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def _config_file(config: Any, source: TensorSource) -> Path | None:
    """The file ``config`` was read from: its path, or the source's ``config.json``
    asset when it is the source's own config."""
    if config is source.config:
        return source.assets.get(CONFIG_FILE)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        return path / CONFIG_FILE if path.is_dir() else path
    return None


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
    layout: str | Layout | None = None,
    use_transformers: bool | None = None,
    manifest: bool = False,
    fused_experts: bool = False,
) -> Path:
    """Writes a Hugging Face model directory that transformers'
    ``from_pretrained`` loads with no missing or unexpected keys.

    ``config.json`` (the file's own bytes where they need no change) and the
    source's other assets (``generation_config.json``, the tokenizer's files: a
    Hugging Face directory's, or those an item keeps), copied as they are; then
    the weights as ``model.safetensors``,
    or shards ``model-0000k-of-0000N.safetensors`` of at most ``max_shard_size``
    each with ``model.safetensors.index.json`` (``metadata.total_size``,
    ``weight_map``). Each shard's metadata holds ``{"format": "pt"}`` and the
    ties (and naming record) whose canonical it stores, so jaxshare reads every
    tie back. A tie the config declares is left out of the files, as
    ``save_pretrained`` does (transformers ties it again on load); every other
    alias is written out, and a stored tensor the config ties to another stored
    one (a Flax head its tie makes unused) is left out, one warning line each --
    but a head the Flax port computes its logits with (transformers-flax Llama's
    and Mistral's ``lm_head/kernel``), which is kept where it differs from the
    embedding, the output's ``config.json`` saying ``tie_word_embeddings: false``
    (one warning line). Tensors are read, cast and transposed one at a time; the
    directory appears only when complete.

    Args:
      directory: the output directory.
      source_or_tree: a path (an Orbax item, a weights file, a Hugging Face or
        DeepSpeed directory), a :class:`jaxshare.stream.TensorSource`, a torch module
        or state dict, Flax variables, a :class:`jaxshare.Tied` or an
        ``nnx.Module`` (Flax trees are named in PyTorch by :func:`bridge.to_torch`).
      config: ``config.json``: a path, a dict or a ``PretrainedConfig``; default:
        the source's (a Hugging Face directory's own, or the one an item keeps
        among its assets).
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
      layout: the Flax layout of a Flax-named source without a naming record:
        ``"jaxshare"`` or ``"transformers-flax"``; default: found from the tree (no
        collection at the top: transformers-flax; a linen ``params`` collection
        alone: transformers-flax where the config's model class fits it), see
        ``docs/flax-layouts.md``.
      use_transformers: as for :class:`HFDirectory`, for the config's ties.
      manifest: record every tensor's hash as it is written (each shard's
        metadata, and the index's ``metadata`` under ``"jaxshare.manifest"``), for
        :func:`bridge.verify` of the directory alone.
      fused_experts: write a mixture of experts fused, as transformers 5 holds it and
        ``save_pretrained(save_original_format=False)`` writes it
        (``model.layers.1.mlp.experts.gate_up_proj``), each layer's experts read into
        one array; default: per expert, as ``save_pretrained`` writes them by default
        (``docs/experts.md``).

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

    def meta(config: Any, stored: Sequence[str] = (), *, need_model: bool = True) -> ConfigTies:
        return config_ties(
            config_dict(config),
            stored,
            rules,
            use_transformers=use_transformers,
            need_model=need_model,
        )

    def like() -> Any:
        """The meta model to name Flax leaves after, where no naming record does."""
        if config is None:
            raise ValueError(
                f"{directory}: a Hugging Face directory needs a config.json; pass `config=`."
            )
        return meta(config).model

    tree_in: list[Layout | None] = []  # (The layout a Flax tree given in memory is in.)

    def tree_layout(tree: Any) -> Layout | None:
        cfg = None if config is None else config_dict(config)
        flax, ties, _ = flax_variables(tree, None)
        model = None if cfg is None else (lambda: ModelTensors.of_class(meta(cfg), cfg))
        tree_in.append(flax_layout(flax, ties, layout=layout, config=cfg, rules=rules, model=model))
        return tree_in[-1]

    source = opened = _source_of(source_or_tree, rules, like, tree_layout, config)
    try:
        if config is None:
            config = source.config
            if config is None:
                raise ValueError(
                    f"{directory}: a Hugging Face directory needs a config.json; pass `config=` "
                    f"({source.where} has none)."
                )
        cfg = config_dict(config)
        view = None if layout is None else as_layout(layout).view
        if view is not None and source.flax_named:
            source = view(source, cfg)  # (MaxText's item as its PyTorch tensors.)
        # The model class itself, built on the meta device, only where it names
        # leaves or checks them; else the ties the table tells, after the plan.
        needs_model = plan is None and _needs_model(source, cfg, rules, layout)
        found = meta(cfg) if needs_model else ConfigTies({})
        chosen = tree_in[-1] if tree_in else None  # (The layout the tensors come from.)
        if plan is None:
            plan, source, named_in = _plan_of(source, cfg, found, rules, layout, directory)
            chosen = chosen if named_in is None else named_in
            # Stacks of layers (a scanned tree's) as layers, each read as its slice.
            plan, source = unstacked(plan, source)
        if fused_experts:
            plan, source = _fused(plan, source, cfg, directory)
        if not needs_model:
            found = meta(cfg, [e.name for e in plan.entries], need_model=False)
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
        port = None if chosen is None or chosen.collections else chosen.family(cfg)
        plan, untied = _without_tied_copies(plan, source, found.ties, cfg, Path(directory), port)
        # Layers split from stacks come stack after stack, the order they are read in
        # (a stack stored in one chunk is read once); the rest in the model's order.
        order = None if isinstance(source, UnstackedSource) else found.order
        entries = _outputs(plan, found.ties, order)
        shards = _shards(entries, limit)
        names = [shard_name(SAFE_WEIGHTS, k, len(shards)) for k in range(1, len(shards) + 1)]
        text = _config_text(_config_file(config, source), cfg, entries, changed=untied)
        inputs = [*inputs, *([source.path] if source.path is not None else [])]
        if isinstance(source_or_tree, (str, os.PathLike)):
            inputs.append(source_or_tree)
        assets = {n: p for n, p in source.assets.items() if n != CONFIG_FILE}
        _write(
            Path(directory), plan, source, shards, names, text, assets,
            force=force, inputs=inputs, progress=progress, manifest=manifest,
        )  # fmt: skip
    finally:
        if opened is not source_or_tree:
            opened.close()
    return Path(directory)


def _fused(
    plan: Plan, source: TensorSource, config: dict, directory: str | os.PathLike
) -> tuple[Plan, TensorSource]:
    """The plan's outputs with each layer's experts fused (:class:`FusedView`)."""
    family = experts_family(config)
    if family is None:
        raise ValueError(
            f"{directory}: --fused-experts (`fused_experts=True`) is for a mixture of "
            f"experts; config.json's model_type {config.get('model_type')!r} has none that "
            "jaxshare fuses (bridge/hf/experts.toml)."
        )
    fused = FusedView(PlannedSource(source, plan), family)
    return Plan.identity(fused), fused


def _needs_model(
    source: TensorSource, config: dict, rules: Rules, layout: str | Layout | None
) -> bool:
    """Whether naming ``source``'s tensors in PyTorch needs the config's model
    class (see :func:`_plan_of`): a Flax-named source without a naming record or
    stacks (the class names its leaves, or checks the layout's names), or in the
    transformers-flax layout (the class tells what its port computes)."""
    if not source.flax_named:
        return False
    if source.ties.naming is None and not rules.stacks:
        return True
    # (Named, or stacked: the layout is found with no model class.)
    chosen = flax_layout(source, layout=layout, config=config, rules=rules, model=lambda: None)
    return chosen is not None and not chosen.collections


def _plan_of(
    source: TensorSource,
    config: dict,
    found: ConfigTies,
    rules: Rules,
    layout: str | Layout | None,
    directory: str | os.PathLike,
) -> tuple[Plan, TensorSource, Layout | None]:
    """The PyTorch names of ``source``'s tensors: as they are (PyTorch names); by its
    naming record (a conversion's: exact); by the transformers-flax layout (given, or
    found: no collection at the top, or a linen ``params`` collection whose tree
    that layout fits, see :func:`bridge.naming.torch_naming.flax_layout`), whose rules
    decide every name and axis order; else after the config's model class
    (``like=``), which settles what names cannot; by the rules where ``rules.stacks``
    names scanned layers (a stack is one output here, named ``model.layers.{i}...``).
    Returns the plan, the source it reads (``source``, or, where the Flax port
    computes tensors that the PyTorch class stores, ``source`` with them) and the
    layout the tensors are in."""
    if not source.flax_named:
        return Plan.identity(source), source, None
    model = ModelTensors.of_class(found, config)
    asked: list[bool] = []  # (Whether a tree under `params/` was held against the model.)

    def against() -> ModelTensors | None:
        asked.append(True)
        return model

    chosen = flax_layout(source, layout=layout, config=config, rules=rules, model=against)
    # (The layout is `chosen`: where it is jaxshare's, no model asks again.)
    if source.ties.naming is not None or rules.stacks:  # (Exact; a port's quirks below.)
        plan = torch_plan(source, rules=rules, model=lambda: None)
    elif chosen is None or chosen.collections:
        try:
            named = torch_plan(source, rules=rules, like=found.model, model=lambda: None)
        except ValueError:
            problem = None
            if chosen is None and asked and model is not None:  # It fits neither layout:
                problem = _misfit(source, config, rules, model, directory)  # the other's line.
            if problem is None:
                raise
            raise ValueError(problem) from None
        return named, source, chosen
    else:
        plan = torch_plan(source, rules=rules, layout=chosen, config=config)
        problem = None if model is None else model.misfit(plan, chosen, str(directory))
        if problem is not None:  # Every name the layout gives is the model's, of its shape.
            raise ValueError(problem)
    family = None if chosen is None or chosen.collections else chosen.family(config)
    if family is None or found.names is None:
        return plan, source, chosen
    return (*_with_computed(plan, source, family, found.names, config, directory), chosen)


def _misfit(
    source: TensorSource,
    config: dict,
    rules: Rules,
    model: ModelTensors,
    directory: str | os.PathLike,
) -> str | None:
    """The line that names the first leaf of ``source`` that the transformers-flax
    layout names as no tensor of ``model``, ``None`` where that layout names none."""
    try:
        plan = torch_plan(source, rules=rules, layout=TRANSFORMERS_FLAX, config=config)
    except ValueError:
        return None
    return model.misfit(plan, TRANSFORMERS_FLAX, str(directory))


def _with_computed(
    plan: Plan,
    source: TensorSource,
    family: Family,
    names: Mapping[str, tuple[int, ...]],
    config: dict,
    directory: str | os.PathLike,
) -> tuple[Plan, TensorSource]:
    """``plan`` plus the tensors the model class stores and ``family``'s Flax port
    computes (Pegasus' sinusoidal positions), in the plan's floating dtype; a
    tensor of a module the Flax class lacks is one warning line, as transformers
    initialises it on load."""
    have = {*(e.name for e in plan.entries), *plan.alias_map}
    wanted = [n for n in names if n not in have]
    floats = [e.info.dtype for e in plan.entries if is_floating(e.info.dtype)]
    dtype = numpy_dtype(max(set(floats), key=floats.count) if floats else "float32")
    extra = {}
    for name in wanted:
        compute = family.computed_by(name)
        if compute is not None:
            extra[name] = compute(tuple(names[name])).astype(dtype)
    absent = [n for n in wanted if family.absent_from(n, config)]
    if absent:
        arch = (config.get("architectures") or ["?"])[0]
        warnings.warn(
            f"{directory}: {', '.join(map(repr, absent))} are not written: the Flax port of "
            f"{arch} has no such module, and transformers initialises them on load (the "
            "PyTorch class holds them unused).",
            stacklevel=4,
        )
    if not extra:
        return plan, source
    with_extra = PlannedSource(source, plan, extra)
    return Plan.identity(with_extra), with_extra


def _without_tied_copies(
    plan: Plan,
    source: TensorSource,
    tied: Mapping[str, str],
    config: dict,
    directory: Path,
    port: Family | None = None,
) -> tuple[Plan, bool]:
    """``plan`` without the tensors the model class ties to another tensor the plan
    stores: a Flax leaf the model never uses under its tie. The tied-to tensor is
    kept -- transformers ties the other to it on load -- and each one left out is one
    warning line, saying whether the two held the same values (else max |Δ|).

    A leaf the Flax ``port`` holds of its own even where ``config.json`` ties it
    (:attr:`bridge.Family.tied_leaves`: transformers-flax Llama's and Mistral's
    ``lm_head/kernel``, which their logits use) is what the model computed with:
    where it holds its canonical's bits, the tie stays as it is (left out, no line);
    where it differs, nothing it used is dropped -- both are written, ``config``
    (the output's ``config.json``) says ``tie_word_embeddings: false``, and one
    warning line says so.

    Where ``config.json`` says ``tie_word_embeddings: false`` and the model class
    declares the tie all the same (transformers 5's mT5 head), the two sources
    disagree: the config decides, both are written, and one warning line says so.

    Returns:
      The plan, and whether ``config`` was untied.
    """
    by_name = {e.name: e for e in plan.entries}
    declared = AliasMap(tied)  # (Chains collapsed.)
    dropped: set[str] = set()
    untied = config.get("tie_word_embeddings") is False
    held = port.tied_leaves if port is not None and not untied else frozenset()
    untie = False
    for alias, canonical in declared.items():
        if alias not in by_name or canonical not in by_name:
            continue
        if untied:
            warnings.warn(
                f"{directory}: config.json sets tie_word_embeddings: false, but the model class "
                f"declares {alias!r} tied to {canonical!r} all the same; both are written, "
                "as the config says (transformers loads two stored tensors that differ "
                "apart).",
                stacklevel=4,
            )
            continue
        a, c = by_name[alias], by_name[canonical]
        left, kept = plan.array(source, a), plan.array(source, c)
        if alias in held:  # (The port's own leaf: what its model computed with.)
            if _same_bits(left, kept):
                dropped.add(alias)  # The tie as it is: transformers ties it again on load.
                continue
            warnings.warn(
                f"{directory}: config.json ties {alias!r} to {canonical!r}, but the Flax "
                f"model computes with {a.source!r}, a leaf of its own, which differs from "
                f"{c.source!r} (max |Δ| = {_max_delta(left, kept)}): both are written, and "
                "config.json says tie_word_embeddings: false.",
                stacklevel=4,
            )
            untie = True
            continue
        if left.shape == kept.shape and np.array_equal(left, kept, equal_nan=True):
            how = "which holds the same values"
        else:
            delta = _max_delta(left, kept)
            how = f"but they differ (max |Δ| = {delta}); {canonical!r} is kept"
        warnings.warn(
            f"{directory}: {alias!r} (from {a.source!r}) is left out: config.json ties it to "
            f"{canonical!r} (from {c.source!r}), {how}, as transformers ties {alias!r} to "
            "it on load.",
            stacklevel=4,
        )
        dropped.add(alias)
    if untie:
        config["tie_word_embeddings"] = False
    if not dropped:
        return plan, untie
    kept_entries = tuple(e for e in plan.entries if e.name not in dropped)
    return dataclasses.replace(plan, entries=kept_entries), untie


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (``-0.0`` is not ``0.0``; a NaN is
    itself), compared as unsigned integers of their width, without a copy."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.itemsize not in (1, 2, 4, 8):
        return bool(np.array_equal(a, b, equal_nan=True))
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(a.view(bits), b.view(bits)))


def _max_delta(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    return f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.3g}"


def _write(
    dst: Path,
    plan: Plan,
    source: TensorSource,
    shards: list[list[PlanEntry]],
    names: list[str],
    config_text: bytes,
    assets: Mapping[str, Path],
    *,
    force: bool,
    inputs: Iterable[str | os.PathLike],
    progress: ProgressFn | None,
    manifest: bool = False,
) -> None:
    amap = plan.alias_map
    hashes: dict[str, ManifestEntry] = {}
    total = sum(len(s) for s in shards)
    done = 0
    files = []  # Each shard's specs and metadata.
    for shard in shards:
        here = {e.name for e in shard}
        mine = {a: c for a, c in amap.items() if c in here}
        shard_map = AliasMap(
            mine,
            transforms={a: p for a, p in amap.transforms.items() if a in mine},
            naming=amap.naming,
        )
        specs = [TensorSpec(e.name, e.info.shape, numpy_dtype(e.info.dtype)) for e in shard]
        files.append((specs, {"format": "pt", **tie_metadata(shard_map)}))
    # In the shards' order; a source that is not mapped (an Orbax item) is read ahead
    # on threads while the tensor before is written, each array made to line up with
    # its place in its shard, which writes it without a copy (`kept`).
    offsets = {
        k: v
        for specs, meta in files
        for k, v in data_offsets(specs, meta, manifest=manifest).items()
    }
    ordered = dataclasses.replace(plan, entries=tuple(e for shard in shards for e in shard))
    outputs = ordered.outputs(source, offsets)
    with (
        contextlib.closing(outputs),  # Its threads end with the write.
        atomic_output(dst, HF_DIRECTORY, force=force, inputs=inputs) as tmp,
    ):
        tmp.mkdir()
        for shard, name, (specs, metadata) in zip(shards, names, files, strict=True):
            with write_safetensors(
                tmp / name, specs, metadata, manifest=manifest, kept=True
            ) as write:
                for entry in shard:
                    _, blocks = next(outputs)
                    digest = write(blocks)
                    del blocks  # Before the next is read.
                    hashes[entry.name] = ManifestEntry(entry.info.shape, entry.info.dtype, digest)
                    done += 1
                    if progress is not None:
                        progress(done, total, entry.name, entry.info.nbytes)
        if len(shards) > 1:
            weight_map = {e.name: n for s, n in zip(shards, names, strict=True) for e in s}
            index = {
                "metadata": {
                    "total_parameters": sum(int(np.prod(e.info.shape)) for s in shards for e in s),
                    "total_size": sum(e.info.nbytes for s in shards for e in s),
                    **({MANIFEST_KEY: Manifest(hashes).to_dict()} if manifest else {}),
                },
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / CONFIG_FILE).write_bytes(config_text)
        for name, path in assets.items():  # (Copied as they are: never parsed, never run.)
            shutil.copyfile(path, tmp / name)
