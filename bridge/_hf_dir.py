"""Hugging Face model directories, read and written one tensor at a time.

:class:`HFDirectory` reads what ``save_pretrained`` writes -- ``config.json`` with
``model.safetensors``, or shards listed in ``model.safetensors.index.json``, or
the ``pytorch_model.bin`` flavour of either -- as a :class:`jaxshare.TensorSource`.
Its ties come from three places, each recorded as the tie's origin:

- ``"metadata"``: the alias map jaxshare writes into each shard's metadata;
- ``"storage"``: tensors of a ``.bin`` shard over one memory;
- ``"config.json"``: the ties transformers makes when it loads the model, whose
  aliases ``save_pretrained`` leaves out of the files (``lm_head.weight``), named
  by the model class built on the meta device, or by a table without
  transformers (see :mod:`bridge._hf_config`).

:func:`save_hf` writes any source (or tree) as such a directory: shards of at most
``max_shard_size``, each tensor streamed from the source through the plan, the
aliases the config ties left out as ``save_pretrained`` does, every other alias
written out, and the whole directory renamed into place only when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bridge._hf_config import ConfigTies, config_dict, config_ties, encoder_decoder_ties
from bridge._names import Rule, Rules, as_rules
from bridge._sources import StateDictSource
from jaxshare import AliasMap, ArrayInfo, Plan, PlanEntry, ProgressFn, TensorSource
from jaxshare.formats import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_SIZE,
    HF_DIRECTORY,
    SAFE_INDEX,
    SAFE_WEIGHTS,
    SafetensorsFile,
    TensorSpec,
    hf_layout,
    is_item,
    parse_size,
    shard_name,
    tie_metadata,
    write_safetensors,
)
from jaxshare.internal import Index, atomic_output, compose, file_part, float_dtype

__all__ = ["HFDirectory", "save_hf"]

_GENERATION_CONFIG = "generation_config.json"


class HFDirectory(TensorSource):
    """A Hugging Face model directory (or its index file), read lazily.

    Shards are mapped (safetensors) or loaded with
    ``torch.load(mmap=True, weights_only=True)`` (``.bin``), so a tensor is read
    only when asked for; names, shapes, dtypes and ties come from the headers,
    the index and ``config.json``.

    Args:
      path: the directory, or its ``*.index.json``.
      rules: naming rules (their layer table types the meta model's modules).
      use_transformers: build the model class on the meta device to name the
        config's ties and every module's layer type; default: when
        transformers is installed. ``False``: the table of usual names.

    Attributes:
      config: ``config.json`` as a dict (``None`` when the directory has none).
      layout: which files hold the weights (:class:`jaxshare.formats.HFLayout`).
      exact: whether the model class named the config's ties (``False``: the
        table did, or there is no config).

    Raises:
      FileNotFoundError: no such path.
      ValueError: no weights; a corrupt index, config or shard; an index that
        lists a missing shard or a tensor its shard does not hold, or a shard
        holding a tensor the index does not list -- one line naming the file.

    A tie the config declares but that cannot be named (no tensor of the tie is
    stored) is a warning, never an error.
    """

    kind = "hf"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        rules: Rules | None = None,
        use_transformers: bool | None = None,
    ) -> None:
        rules = as_rules(rules)
        self.layout = layout = hf_layout(path)
        self.path = layout.directory
        self.config: dict | None = None
        if layout.config is not None:
            self.config = config_dict(layout.config)
        self._shards: list[TensorSource] = []
        try:
            self._open(rules, use_transformers)
        except BaseException:
            self.close()
            raise

    def _open(self, rules: Rules, use_transformers: bool | None) -> None:
        layout = self.layout
        owner: dict[str, int] = {}
        infos: dict[str, ArrayInfo] = {}
        for i, file in enumerate(layout.files):
            shard = _open_shard(file, rules)
            self._shards.append(shard)
            for name, info in shard.infos.items():
                if name in owner:
                    raise ValueError(
                        f"{self.path}: {name!r} is in both {layout.files[owner[name]].name} and "
                        f"{file.name}; a tensor belongs to one shard."
                    )
                owner[name] = i
                infos[name] = info
        if layout.index is not None:
            _check_index(layout.index, layout.files, owner)
        self._owner = owner
        ties, transforms, origins = {}, {}, {}
        naming = None
        for file, shard in zip(layout.files, self._shards, strict=True):
            for alias, canonical in shard.ties.items():
                ties[alias] = canonical
                if (perm := shard.ties.transform(alias)) is not None:
                    transforms[alias] = perm
                origins[alias] = shard.origins.get(alias, "metadata")
            if shard.ties.naming is not None:
                if naming is not None and naming != shard.ties.naming:
                    raise ValueError(
                        f"{file}: its naming record differs from another shard's; the shards "
                        "come from different conversions."
                    )
                naming = shard.ties.naming
        self.exact = False
        found = ConfigTies({})
        if self.config is not None:
            found = config_ties(self.config, infos, rules, use_transformers=use_transformers)
            self.exact = found.exact
            self._config_ties(found, infos, ties, origins)
        if found.names is not None:
            rank = {name: i for i, name in enumerate(found.names)}
            infos = dict(sorted(infos.items(), key=lambda kv: rank.get(kv[0], len(rank))))
        self.infos = infos
        self.ties = AliasMap(ties, transforms=transforms, naming=naming)
        self.origins = {a: origins[a] for a in self.ties}
        self.layers = found.layers
        self._storage = frozenset(a for a, o in self.origins.items() if o == "storage")
        parts = [] if layout.index is None else [f"{layout.index.name}: {len(owner)} tensors"]
        shards = zip(layout.files, self._shards, strict=True)
        parts += [file_part(f, len(s.infos)) for f, s in shards]
        if self.config is not None:
            arch = (self.config.get("architectures") or ["?"])[0]
            by = "the model class on the meta device" if self.exact else "jaxshare's table"
            parts.append(f"{CONFIG_FILE}: {arch}, ties named by {by}")
        self.parts = tuple(parts)

    def _config_ties(
        self,
        found: ConfigTies,
        infos: Mapping[str, ArrayInfo],
        ties: dict[str, str],
        origins: dict[str, str],
    ) -> None:
        """Adds the config's ties whose alias the files leave out (``ties`` and
        ``origins`` in place). A tied name the files also store stays as stored:
        the files are the truth."""
        for line in found.unnamed:
            warnings.warn(f"{self.path}: {line}.", stacklevel=4)
        declared = dict(found.ties)
        if self.config and self.config.get("tie_encoder_decoder") and found.names is not None:
            for alias, canonical in encoder_decoder_ties(found.names, infos).items():
                declared.setdefault(alias, canonical)
        groups = _groups(declared)
        order = {name: i for i, name in enumerate(found.names or ())}
        for members in groups:
            present = [m for m in members if m in infos or m in ties]
            if not present:
                warnings.warn(
                    f"{self.path}: {CONFIG_FILE} ties {', '.join(members)}, but the files hold "
                    "none of them; the tie is left out.",
                    stacklevel=4,
                )
                continue
            present.sort(key=lambda m: (m in ties, order.get(m, len(order)), members.index(m)))
            root = ties.get(present[0], present[0])
            for member in members:
                if member not in infos and member not in ties:
                    ties[member] = root
                    origins[member] = CONFIG_FILE

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset(a for a in self.ties if a in self.infos and a not in self._storage)

    def _shard(self, name: str) -> TensorSource:
        try:
            return self._shards[self._owner[name]]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}.") from None

    def read(self, name: str) -> Any:
        return self._shard(name).read(name)

    def array(self, name: str) -> np.ndarray:
        return self._shard(name).array(name)

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        return self._shard(name).blocks(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return self._shard(name).read_slice(name, index)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()


def _open_shard(file: Path, rules: Rules) -> TensorSource:
    if file.suffix == ".safetensors":
        return SafetensorsFile(file)
    from bridge._torchfile import load_torch

    return StateDictSource(load_torch(file, mmap=True), rules, arg=str(file), path=file)


def _check_index(index: Path, files: tuple[Path, ...], owner: Mapping[str, int]) -> None:
    """Every name the index lists is in the shard it names, and every stored name
    is listed."""
    from jaxshare.formats import read_index

    weight_map = read_index(index).weight_map
    position = {f.name: i for i, f in enumerate(files)}
    for name, file in weight_map.items():
        if owner.get(name) != position[file]:
            where = "no shard" if name not in owner else files[owner[name]].name
            raise ValueError(
                f"{index}: lists {name!r} in {file}, but {where} holds it; the index does not "
                "fit its shards."
            )
    unlisted = [n for n in owner if n not in weight_map]
    if unlisted:
        raise ValueError(
            f"{files[owner[unlisted[0]]]}: holds {unlisted[:3]}, which {index.name} does not "
            "list; the index does not fit its shards."
        )


def _groups(ties: Mapping[str, str]) -> list[list[str]]:
    """The tie groups of ``{alias: canonical}`` (chains joined), each in order of
    first mention, a canonical before its aliases.

    >>> _groups({"b": "a", "c": "b", "y": "x"})
    [['a', 'b', 'c'], ['x', 'y']]
    """
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        parent.setdefault(n, n)
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    order: list[str] = []
    for alias, canonical in ties.items():
        for m in (canonical, alias):
            if m not in parent:
                order.append(m)
        parent.setdefault(canonical, canonical)
        parent.setdefault(alias, alias)
        ra, rc = find(alias), find(canonical)
        if ra != rc:
            parent[ra] = rc
    groups: dict[str, list[str]] = {}
    for m in order:
        groups.setdefault(find(m), []).append(m)
    return list(groups.values())


def _flax_named(source: TensorSource) -> bool:
    return source.kind == "orbax" or any("/" in name for name in source.infos)


def _open_any(what: Any, rules: Rules, like: Callable[[], Any]) -> TensorSource:
    """A source of whatever ``save_hf`` was given; Flax trees are named in PyTorch
    by their naming record, else after ``like()`` (the config's meta model, or
    ``None``: by the rules)."""
    from jaxshare.internal import is_nnx_module

    if isinstance(what, TensorSource):
        return what
    if isinstance(what, (str, os.PathLike)):
        path = Path(what)
        if path.is_dir() and (is_item(path) or any(is_item(p) for p in path.iterdir())):
            from jaxshare import checkpoint

            return checkpoint.open_source(path)
        from bridge._sources import open_source

        return open_source(path, rules, arg="source_or_tree")
    import torch

    if isinstance(what, torch.nn.Module) or (
        isinstance(what, Mapping)
        and what
        and all(isinstance(v, torch.Tensor) for v in what.values())
    ):
        return StateDictSource(what, rules, arg="source_or_tree")
    from jaxshare import Tied

    if isinstance(what, (Tied, Mapping)) or is_nnx_module(what):
        from bridge._to_torch import to_torch

        named = isinstance(what, Tied) and what.alias_map.naming is not None
        state = to_torch(what, rules=rules, like=None if named else like())
        return StateDictSource(state, rules, arg="source_or_tree")
    raise TypeError(
        "`source_or_tree` must be a path, a jaxshare.TensorSource, a torch module or state "
        f"dict, Flax variables, a jaxshare.Tied or an nnx.Module, got {type(what).__name__}."
    )


def _groups_of(ties: Mapping[str, str]) -> dict[str, int]:
    return {m: i for i, members in enumerate(_groups(ties)) for m in members}


def _outputs(
    plan: Plan, tied_by_config: Mapping[str, str], names: Iterable[str] | None
) -> list[PlanEntry]:
    """The entries to write: the plan's, plus each alias the config does not tie
    (transformers reads no alias map) read from its canonical's source, in the
    model's ``state_dict()`` order where it is known."""
    group = _groups_of(tied_by_config)
    by_name = {e.name: e for e in plan.entries}
    amap = plan.alias_map
    entries = list(plan.entries)
    for alias, canonical in amap.items():
        perm = amap.transform(alias)
        if perm is None and alias in group and group[alias] == group.get(canonical):
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
    floats = {e.info.dtype for e in entries if _is_float(e.info.dtype)}
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


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return float_dtype(name)
    except ValueError:
        return np.dtype(name)


def _is_float(name: str) -> bool:
    try:
        float_dtype(name)
    except ValueError:
        return False
    return True


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
    rules: Rules | Iterable[Rule] | None = None,
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
        DeepSpeed directory), a :class:`jaxshare.TensorSource`, a torch module
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

    source = _open_any(source_or_tree, rules, like)
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
            if _flax_named(source):
                from bridge._plans import torch_plan

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
            specs = [TensorSpec(e.name, e.info.shape, _numpy_dtype(e.info.dtype)) for e in shard]
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
