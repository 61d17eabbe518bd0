"""The model class of a Hugging Face ``config.json``, built on the meta device.

``save_pretrained`` leaves a tied tensor out of the files; only the model class
says exactly which names transformers ties again on load. Built on the meta
device it costs no memory and runs no weights, downloads nothing and runs no
remote code, and it tells ``all_tied_weights_keys`` (transformers 5;
``_tied_weights_keys`` and the input/output embeddings before it), the
parameters one module reaches by several names, and the class of every module
(so a GPT-2 ``Conv1D`` is known as one). This is the one module of the config
logic that imports torch and transformers (:mod:`bridge._hf_config` calls it
only when both are installed).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch

from bridge._rules import Rules, layer_kind
from bridge._shared import shared_params
from jaxshare import AliasMap

__all__ = ["MetaModel", "meta_model_ties"]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings and log lines off, for a model that is never run."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


MetaModel = tuple[
    dict[str, str], dict[str, str | None], dict[str, tuple[int, ...]], Any, Callable[[str], str]
]


def meta_model_ties(
    config: Mapping[str, Any], rules: Rules, stored: Collection[str] = ()
) -> MetaModel | None:
    """What the model class of ``config``, built on the meta device, says: ``(ties,
    {module: layer kind}, {name: shape} of what ``save_pretrained`` writes, in
    state_dict() order, the model, the name a file's tensor name loads as)``;
    ``None`` when transformers cannot build it. The class is ``architectures[0]``;
    without one, the causal-LM class when ``stored`` holds an ``lm_head.weight``
    (a config written by ``config.to_json_file`` of a model built from a config
    names no class), else the base model's."""
    try:
        import transformers  # (Configures its logger: quieted only after the import.)
    except Exception:  # noqa: BLE001 -- a broken install: the table decides instead.
        return None
    with _quiet():
        try:
            model_type = config.get("model_type")
            if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
                return None
            hf_config = transformers.CONFIG_MAPPING[model_type].from_dict(dict(config))
            architectures = config.get("architectures") or []
            cls = None
            if architectures and isinstance(architectures[0], str):
                cls = getattr(transformers, architectures[0], None)
            with torch.device("meta"):
                if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
                    model = cls._from_config(hf_config)  # type: ignore[attr-defined]
                elif "lm_head.weight" in stored:
                    model = transformers.AutoModelForCausalLM.from_config(hf_config)
                else:
                    model = transformers.AutoModel.from_config(hf_config)
        except Exception:  # noqa: BLE001 -- any failure: the table decides instead.
            return None
    ties = dict(getattr(model, "all_tied_weights_keys", None) or {})
    if not ties and not hasattr(model, "all_tied_weights_keys"):  # transformers 4
        ties = _v4_ties(model)
    # What save_pretrained writes: the state dict but the keys it ignores on save
    # (Marian's sinusoidal positions, which it computes on load).
    unsaved = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    names = {
        k: tuple(t.shape) for k, t in model.state_dict(keep_vars=True).items() if k not in unsaved
    }
    # A tensor reached by several names (a module registered twice) is a tie too, unless
    # the model's own ties say so already (maybe the other way round: XLM-R registers its
    # head before the embedding it is tied to).
    declared = AliasMap(ties)
    for alias, canonical in shared_params(model).items():
        if declared.get(alias, alias) != declared.get(canonical, canonical):
            ties.setdefault(alias, canonical)
    layers = {p: layer_kind(m, rules) for p, m in model.named_modules(remove_duplicate=False)}
    return ties, layers, names, model, _load_name(model)


def _load_name(model: Any) -> Callable[[str], str]:
    """The name transformers 5 loads a file's tensor name as: its conversion mapping
    renames the names of older checkpoints (none in transformers 4: the name itself)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping

        transforms = get_model_conversion_mapping(model)
    except Exception:  # noqa: BLE001 -- transformers 4, or a mapping it cannot make
        return str

    def load_name(name: str) -> str:
        for transform in transforms:
            try:
                name = transform.rename_source_key(name)[0]
            except Exception:  # noqa: BLE001 -- a transform of another shape: no rename
                continue
        return name

    return load_name


def _v4_ties(model: Any) -> dict[str, str]:
    """transformers 4: the output embedding tied to the input embedding."""
    ties: dict[str, str] = {}
    if not getattr(model.config, "tie_word_embeddings", True):
        return ties
    try:
        inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return ties
    if inp is None or out is None:
        return ties
    names = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
    if id(inp) in names and id(out) in names:
        ties[f"{names[id(out)]}.weight"] = f"{names[id(inp)]}.weight"
    return ties
