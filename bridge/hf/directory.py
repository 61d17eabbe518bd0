"""Hugging Face model directories, read one tensor at a time.

:class:`HFDirectory` reads what ``save_pretrained`` writes -- ``config.json`` with
``model.safetensors``, or shards listed in ``model.safetensors.index.json``, or
the ``pytorch_model.bin`` flavour of either, or a Flax model's
``flax_model.msgpack`` (and its shards), whose names are the Flax model's own
``params`` paths (the transformers-flax layout) -- as a
:class:`jaxshare.stream.TensorSource`.
Its ties come from three places, each recorded as the tie's origin:

- ``"metadata"``: the alias map jaxshare writes into each shard's metadata;
- ``"storage"``: tensors of a ``.bin`` shard over one memory;
- ``"config.json"``: the ties transformers makes when it loads the model, whose
  aliases ``save_pretrained`` leaves out of the files (``lm_head.weight``), named
  by the model class built on the meta device, or by a table without
  transformers (see :mod:`bridge.hf.config`).

:func:`bridge.save_hf` (:mod:`bridge.commands.save_hf`) writes them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge.hf.config import ConfigTies, config_dict, config_ties
from bridge.layouts.rules import Rules, as_rules
from jaxshare import AliasMap
from jaxshare.formats import (
    CONFIG_FILE,
    MANIFEST_KEY,
    HFWeights,
    hf_weights,
    open_weights_file,
    read_index,
)
from jaxshare.internal import (
    METADATA,
    STORAGE,
    FileRange,
    Index,
    Manifest,
    UnheldTies,
    file_part,
    reading,
)
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = ["HFDirectory"]


class HFDirectory(TensorSource):
    """A Hugging Face model directory (or its index file), read lazily.

    Shards are mapped, safetensors and ``.bin`` alike (the latter read by
    jaxshare's restricted unpickler: no torch, no pickle code run), so a tensor
    is read only when asked for; names, shapes, dtypes and ties come from the
    headers, the index and ``config.json``.

    Args:
      path: the directory, or its ``*.index.json``.
      rules: naming rules (their layer table types the meta model's modules).
      use_transformers: build the model class on the meta device to name the
        config's ties and every module's layer type; default: when
        transformers is installed. ``False``: the table of usual names.

    Attributes:
      config: ``config.json`` as a dict (``None`` when the directory has none).
      assets: the files that travel with the weights (``config.json``, the
        tokenizer's, ...: ``jaxshare.formats.MODEL_ASSETS``), by name.
      other_files: the rest beside the weights: listed, never read or run.
      weights: which files hold the weights (:class:`jaxshare.formats.HFWeights`).
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

    mapped = True  # blocks are views of mapped files or tensors in memory

    kind = "hf"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        rules: Rules | None = None,
        use_transformers: bool | None = None,
    ) -> None:
        rules = as_rules(rules)
        self.weights = weights = hf_weights(path)
        self.path = weights.directory
        files = weights.model_files()
        self.assets, self.other_files = files.assets, files.other
        self.config = None if weights.config is None else config_dict(weights.config)
        self._shards: list[TensorSource] = []
        try:
            self._open(rules, use_transformers)
        except BaseException:
            self.close()
            raise

    def _open(self, rules: Rules, use_transformers: bool | None) -> None:
        weights = self.weights
        owner: dict[str, int] = {}
        infos: dict[str, ArrayInfo] = {}
        for i, file in enumerate(weights.files):
            try:
                shard = open_weights_file(file)
            except UnheldTies as e:  # (The directory is the input the report names.)
                raise UnheldTies(str(e), weights.directory, self.kind, e.ties) from None
            self._shards.append(shard)
            for name, info in shard.infos.items():
                if name in owner:
                    raise ValueError(
                        f"{self.path}: {name!r} is in both {weights.files[owner[name]].name} and "
                        f"{file.name}; a tensor belongs to one shard."
                    )
                owner[name] = i
                infos[name] = info
        if weights.index is not None:
            _check_index(weights.index, weights.files, owner)
        self._owner = owner
        ties, transforms, origins = {}, {}, {}
        naming = None
        for file, shard in zip(weights.files, self._shards, strict=True):
            for alias, canonical in shard.ties.items():
                ties[alias] = canonical
                if (perm := shard.ties.transform(alias)) is not None:
                    transforms[alias] = perm
                origins[alias] = shard.origins.get(alias, METADATA)
            if shard.ties.naming is not None:
                if naming is not None and naming != shard.ties.naming:
                    raise ValueError(
                        f"{file}: its naming record differs from another shard's; the shards "
                        "come from different conversions."
                    )
                naming = shard.ties.naming
        self.exact = False
        found = ConfigTies({})
        # (A Flax msgpack's names are Flax paths; the config's ties, in PyTorch names,
        # come back where they are written in PyTorch names: bridge.save_hf.)
        if self.config is not None and weights.flavour != "msgpack":
            found = config_ties(
                self.config, infos, rules, use_transformers=use_transformers, need_model=False
            )
            self.exact = found.exact
            self._config_ties(found, infos, ties, origins)
        if found.order is not None:
            key = found.order
            infos = dict(sorted(infos.items(), key=lambda kv: key(kv[0])))
        self.infos = infos
        self.ties = AliasMap(ties, transforms=transforms, naming=naming)
        self.origins = {a: origins[a] for a in self.ties}
        self.unapplied_ties = tuple(t for shard in self._shards for t in shard.unapplied_ties)
        self.layers = found.layers
        self._storage = frozenset(a for a, o in self.origins.items() if o == STORAGE)
        parts = [] if weights.index is None else [f"{weights.index.name}: {len(owner)} tensors"]
        shards = zip(weights.files, self._shards, strict=True)
        parts += [file_part(f, len(s.infos)) for f, s in shards]
        if self.config is not None:
            arch = (self.config.get("architectures") or ["?"])[0]
            by = "the model class on the meta device" if self.exact else "jaxshare's table"
            if found.tabulated:
                by = "the model class (tabulated from transformers)"
            if weights.flavour == "msgpack":
                parts.append(f"{CONFIG_FILE}: {arch}, its Flax model's own params")
            else:
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
        for alias, canonical in found.encoder_decoder.items():
            declared.setdefault(alias, canonical)
        mention: dict[str, int] = {}  # Each name's first mention, a canonical before its alias.
        for alias, canonical in declared.items():
            mention.setdefault(canonical, len(mention))
            mention.setdefault(alias, len(mention))
        groups = [
            sorted([canonical, *aliases], key=mention.__getitem__)
            for canonical, aliases in AliasMap(declared).groups().items()
        ]
        order = found.order or (lambda name: 0)
        for members in groups:
            present = [m for m in members if m in infos or m in ties]
            if not present:
                warnings.warn(
                    f"{self.path}: {CONFIG_FILE} ties {', '.join(members)}, but the files hold "
                    "none of them; the tie is left out.",
                    stacklevel=4,
                )
                continue
            present.sort(key=lambda m: (m in ties, order(m), members.index(m)))
            root = ties.get(present[0], present[0])
            for member in members:
                if member not in infos and member not in ties:
                    ties[member] = root
                    origins[member] = CONFIG_FILE

    @property
    def written_out(self) -> frozenset[str]:
        return frozenset(a for a in self.ties if a in self.infos and a not in self._storage)

    @property
    def layout(self) -> HFWeights:
        """The old name of :attr:`weights`, which works with a ``DeprecationWarning``."""
        warnings.warn(
            "`HFDirectory.layout` is now `HFDirectory.weights`: a layout is a model "
            "family's convention (bridge.Layout).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.weights

    def manifest(self) -> Manifest | None:
        """The manifest in the index's metadata, or in the one shard's where there is
        no index (``convert --manifest``)."""
        weights = self.weights
        if weights.index is None:
            return self._shards[0].manifest() if len(self._shards) == 1 else None
        doc = read_index(weights.index).metadata.get(MANIFEST_KEY)
        if doc is None:
            return None
        with reading(f"{weights.index}: metadata {MANIFEST_KEY!r}"):
            return Manifest.from_json(json.dumps(doc))

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

    def extents(self, name: str) -> Sequence[FileRange]:
        return self._shard(name).extents(name)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return self._shard(name).read_slice(name, index)

    def slice_view(self, name: str, index: Index) -> np.ndarray:
        return self._shard(name).slice_view(name, index)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()


def _check_index(index: Path, files: tuple[Path, ...], owner: Mapping[str, int]) -> None:
    """Every name the index lists is in the shard it names, and every stored name
    is listed."""
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
