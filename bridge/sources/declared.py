"""Ties declared for a source that records none (a PyTorch DCP folder), checked by content.

DCP stores a tied pair twice and says nothing of the tie. The ties come from the
user instead -- ``--tie ALIAS=CANONICAL``, or ``--config config.json`` with the
same config-tie logic as Hugging Face directories (the model class on the meta
device, else the table) -- and each is held against the stored values before it
is deduplicated: two names whose bytes differ are not one tensor, and saying so
is one line naming both, with the largest difference. Equal values alone never
make a tie (a LayerNorm's weight of ones equals another's and is not tied).
Nothing here imports torch; a config's model class is built on the meta device
only where transformers is installed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bridge.hf.config import config_dict, config_ties
from bridge.layouts.rules import Rules
from jaxshare import AliasMap
from jaxshare.formats import CONFIG_FILE
from jaxshare.internal import RetiedSource, same_bytes, transpose
from jaxshare.stream import TensorSource

__all__ = ["declare_ties", "parse_tie", "tie_map"]


def parse_tie(text: str) -> tuple[str, str]:
    """``'ALIAS=CANONICAL'`` (PyTorch names) as a pair.

    Raises:
      ValueError: anything else, one line.

    >>> parse_tie("lm_head.weight=model.embed_tokens.weight")
    ('lm_head.weight', 'model.embed_tokens.weight')
    """
    alias, eq, canonical = text.partition("=")
    alias, canonical = alias.strip(), canonical.strip()
    if not eq or not alias or not canonical or alias == canonical or "/" in text:
        raise ValueError(
            f"--tie takes ALIAS=CANONICAL, two PyTorch names (lm_head.weight="
            f"model.embed_tokens.weight), got {text!r}."
        )
    return alias, canonical


def tie_map(ties: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    """``{alias: canonical}`` of ties given as a mapping or as ``"ALIAS=CANONICAL"``
    strings (``--tie``).

    >>> tie_map(["lm_head.weight=wte.weight"])
    {'lm_head.weight': 'wte.weight'}
    """
    return dict(ties) if isinstance(ties, Mapping) else dict(map(parse_tie, ties))


def declare_ties(
    source: TensorSource,
    ties: Mapping[str, str] = {},  # noqa: B006 -- read only
    *,
    config: Any = None,
    rules: Rules | None = None,
) -> TensorSource:
    """``source`` with the ties ``ties`` (``{alias: canonical}``, PyTorch names) and
    those ``config`` declares, each checked against the stored values: where both
    names are stored their bytes must be equal; an alias the source lacks is its
    canonical's tensor. The result's ``config`` is ``config`` where one is given.
    ``source`` itself when nothing is declared.

    Raises:
      ValueError: a declared tie whose tensors differ (one line naming both, their
        shapes or the largest difference), or that names a tensor the source lacks.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import SafetensorsFile
    >>> path = tempfile.mkdtemp() + "/two.safetensors"
    >>> save_file({"wte.weight": np.ones((2, 3), np.float32),
    ...            "lm_head.weight": np.ones((2, 3), np.float32)}, path)
    >>> declare_ties(SafetensorsFile(path), {"lm_head.weight": "wte.weight"}).ties
    AliasMap({'lm_head.weight': 'wte.weight'})
    """
    declared = dict(ties)
    origins = dict.fromkeys(declared, "--tie")
    assets: dict[str, Path] = {}
    cfg = None if config is None else config_dict(config)
    if cfg is not None:
        found = config_ties(cfg, list(source.infos), rules or Rules())
        named = {a: c for a, c in found.ties.items() if a in source.infos or c in source.infos}
        if found.ties and not named:
            warnings.warn(
                f"{source.where}: {CONFIG_FILE} ties {', '.join(sorted(found.ties))}, which the "
                "input does not hold (another model class's names?); no tie is taken from it: "
                "pass --tie ALIAS=CANONICAL.",
                stacklevel=3,
            )
        for alias, canonical in named.items():
            if alias not in declared:
                declared[alias] = canonical
                origins[alias] = CONFIG_FILE
        if isinstance(config, (str, os.PathLike)):
            file = Path(config)
            assets[CONFIG_FILE] = file / CONFIG_FILE if file.is_dir() else file
    if not declared and not assets and cfg is None:
        return source
    # A declared canonical may itself be an alias (with a transform): the map
    # collapses the chain to the stored root and composes the transforms.
    merged = {**source.ties, **declared}
    kept = {a: t for a, t in source.ties.transforms.items() if a not in declared}
    try:
        ties = AliasMap(merged, transforms=kept, naming=source.ties.naming)
    except ValueError as error:
        raise ValueError(f"{source.where}: the declared ties {declared}: {error}") from None
    for alias, canonical in declared.items():
        _check(source, alias, canonical, ties, origins[alias])
    return RetiedSource(source, ties, origins, assets, config=cfg)


def _check(source: TensorSource, alias: str, canonical: str, ties: AliasMap, origin: str) -> None:
    """One line unless ``alias`` can be ``canonical``'s tensor (its stored root's,
    transformed as ``ties`` says)."""
    where = f"{source.where}: {origin} ties {alias!r} to {canonical!r}"
    root, perm = ties.get(alias, alias), ties.transform(alias)
    if root not in source.infos:
        raise ValueError(f"{where}, but it holds no tensor {canonical!r}.")
    if alias not in source.infos:
        return  # (Not stored: the alias is the canonical's tensor.)
    a, c = source.infos[alias], source.infos[root].permuted(perm)
    if (a.shape, a.dtype) != (c.shape, c.dtype):
        raise ValueError(
            f"{where}, but they differ: {a.shape} {a.dtype} against {c.shape} {c.dtype}."
        )
    x, y = source.array(alias), source.array(root)
    y = y if perm is None else transpose(y, perm)
    if not same_bytes(x, y):
        delta = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))
        raise ValueError(
            f"{where}, but their values differ (max |Δ| = {delta:.3g}); they are not one "
            "tensor, so the tie is refused."
        )
