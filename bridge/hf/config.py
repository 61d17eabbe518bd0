"""The ties a Hugging Face ``config.json`` declares, and the layer type of every module.

``save_pretrained`` leaves a tied tensor out of the files (``lm_head.weight`` when
it is ``transformer.wte.weight``): only the config says the tie exists. The model
class of ``config.json`` tells exactly: read from a table generated from
transformers (:mod:`bridge.hf.table`, no import of transformers or torch) where
only its ties, layer kinds and tensor order are asked for and the table holds the
class, else built on the meta device where ``transformers`` (and torch) are
installed (:mod:`bridge.hf.meta`).

Where neither can, the usual names stand in (:mod:`bridge.hf.usual_names`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.hf.usual_names import usual_ties
from bridge.layouts.rules import Rules
from jaxshare.formats import CONFIG_FILE

__all__ = ["ConfigTies", "config_dict", "config_ties", "encoder_decoder_ties", "has_transformers"]


@dataclass(frozen=True)
class ConfigTies:
    """What a config says of a model's tensors.

    Attributes:
      ties: ``{alias: canonical}`` in PyTorch names, as transformers ties them
        (the alias is the name ``save_pretrained`` leaves out).
      layers: ``{module prefix: layer kind}`` of the model class, ``None``
        without ``transformers``.
      names: every tensor name of the model class in ``state_dict()`` order,
        with its shape; ``None`` without ``transformers``.
      exact: whether the model class told (``False``: the table guessed).
      unnamed: ties the config declares that could not be named, one line each.
      model: the model class built on the meta device (no memory), to name Flax
        leaves after (``like=``); ``None`` without ``transformers``.
      load_name: the name in :attr:`names` that transformers loads a file's
        tensor name as (transformers 5 renames the names of older checkpoints:
        ViT's ``encoder.layer.0.attention.attention.key`` is its ``layers.0.
        attention.k_proj``); the name itself where nothing renames it.
      order: a sort key putting tensor names in the model's ``state_dict()`` order
        (names the model lacks last); ``None`` where nothing says it.
      tabulated: whether the table generated from transformers told
        (:mod:`bridge.hf.table`: no :attr:`names`, :attr:`model` or renames).
      encoder_decoder: the ties of ``tie_encoder_decoder`` for the decoder names
        the files leave out (:func:`encoder_decoder_ties`), where the config sets
        it and the model class names them: declared, but transformers 5 no longer
        makes them, so a writer stores those names.
    """

    ties: Mapping[str, str]
    layers: Mapping[str, str | None] | None = None
    names: Mapping[str, tuple[int, ...]] | None = None
    exact: bool = False
    unnamed: tuple[str, ...] = ()
    model: Any = field(default=None, repr=False, compare=False)
    load_name: Callable[[str], str] = field(default=str, repr=False, compare=False)
    order: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)
    tabulated: bool = False
    encoder_decoder: Mapping[str, str] = field(default_factory=dict)


def config_dict(config: Any) -> dict:
    """``config`` as the dict ``config.json`` holds: a path (of the file or its
    directory), a dict, or a ``transformers`` ``PretrainedConfig``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is not a JSON object.
      TypeError: anything else.
    """
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))  # A deep copy, and JSON-able.
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / CONFIG_FILE
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such config file.") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a JSON config ({e}).") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config is a JSON object, got a {type(data).__name__}.")
        return data
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and hasattr(config, "model_type"):
        return json.loads(config.to_json_string(use_diff=False))
    raise TypeError(
        "`config` must be a path to config.json, a dict or a transformers PretrainedConfig, "
        f"got {type(config).__name__}."
    )


def has_transformers() -> bool:
    """Whether ``transformers`` and torch (which its model classes need) can be
    imported, without importing them."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("transformers", "torch"))
    except (ImportError, ValueError):  # A module set to None in sys.modules: blocked.
        return False


def config_ties(
    config: Mapping[str, Any],
    stored: Collection[str],
    rules: Rules,
    *,
    use_transformers: bool | None = None,
    need_model: bool = True,
) -> ConfigTies:
    """The ties (and layer types) ``config`` declares for a model whose files
    hold the tensors ``stored``.

    Unless ``use_transformers`` is ``False``: without ``need_model`` (only the
    ties, layer kinds and order are asked for) the table generated from
    transformers tells where it holds the class (:mod:`bridge.hf.table`);
    otherwise, with ``use_transformers`` (default: when it is installed), the
    model class is built on the meta device. If neither can (an architecture
    this transformers does not know, a config it rejects) the table of usual
    names decides.
    """
    if use_transformers is not False and not need_model:
        from bridge.hf.table import table_ties

        answer = table_ties(config, stored, rules)
        if answer is not None:
            ties, layers, key = answer
            return ConfigTies(ties, layers, exact=True, order=key, tabulated=True)
    if use_transformers is None:
        use_transformers = has_transformers()
    if use_transformers:
        from bridge.hf.meta import meta_model_ties  # (torch and transformers)

        found = meta_model_ties(config, rules, stored)
        if found is not None:
            ties, layers, names, model, load_name = found
            rank = {name: i for i, name in enumerate(names)}
            pairs = encoder_decoder_ties(names, stored) if config.get("tie_encoder_decoder") else {}
            return ConfigTies(
                ties,
                layers,
                MappingProxyType(names),
                exact=True,
                model=model,
                load_name=load_name,
                order=lambda name: rank.get(name, len(rank)),
                encoder_decoder=pairs,
            )
    ties, unnamed = usual_ties(config, stored)
    return ConfigTies(ties, unnamed=unnamed)


def encoder_decoder_ties(
    names: Mapping[str, tuple[int, ...]], stored: Collection[str]
) -> dict[str, str]:
    """The ties of ``tie_encoder_decoder`` (transformers 4 tied each decoder weight
    to the encoder's of the same module path; transformers 5 no longer does), for
    the decoder names of the model (``names``: name -> shape) that the files do
    not store: ``[p.]decoder[.base].X`` -> ``[p.]encoder.X`` where that is stored
    with the same shape.

    >>> encoder_decoder_ties({"decoder.bert.l.weight": (2,), "encoder.l.weight": (2,)},
    ...                      {"encoder.l.weight": None})
    {'decoder.bert.l.weight': 'encoder.l.weight'}
    """
    ties: dict[str, str] = {}
    for name, shape in names.items():
        parts = name.split(".")
        if name in stored or "decoder" not in parts:
            continue
        i = parts.index("decoder")
        head, rest = parts[:i], parts[i + 1 :]
        for tail in (rest, rest[1:]):  # EncoderDecoderModel: decoder.<base prefix>.X
            candidate = ".".join([*head, "encoder", *tail])
            if candidate in stored and names.get(candidate) == shape:
                ties[name] = candidate
                break
    return ties
