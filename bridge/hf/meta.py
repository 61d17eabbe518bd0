"""The model class of a Hugging Face ``config.json``, built on the meta device.

``save_pretrained`` leaves a tied tensor out of the files; only the model class
says exactly which names transformers ties again on load. Built on the meta
device it costs no memory and runs no weights, downloads nothing and runs no
remote code, and it tells ``all_tied_weights_keys`` (transformers 5;
``_tied_weights_keys`` and the input/output embeddings before it), the
parameters one module reaches by several names, and the class of every module
(so a GPT-2 ``Conv1D`` is known as one). This is the one module of the config
logic that imports torch and transformers (:mod:`bridge.hf.config` calls it
only when both are installed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import torch

from bridge.layouts.rules import Rules, class_kind, layer_kind
from bridge.torch.shared import shared_params
from jaxshare import AliasMap

__all__ = [
    "ALTERNATIVES",
    "ALTERNATIVE_KEYS",
    "MetaModel",
    "generation_config",
    "meta_model_ties",
    "table_entry",
    "tabulated_classes",
    "write_table",
]


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


# --- the table: what the model classes say, written once (``make hf-table``) ---------


def _variant(config: Mapping[str, Any], flag: str) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if k != "tie_word_embeddings"}
    if flag != "absent":
        out["tie_word_embeddings"] = flag == "true"
    return out


def table_entry(
    configs: Sequence[Mapping[str, Any]], classes: dict[tuple[str, ...], int]
) -> dict[str, Any] | str:
    """The table's entry (see :mod:`bridge.hf.table`) for the model class
    ``architectures[0]`` of ``configs`` (one model type; several where a config key
    changes which modules it has: their modules and names merged), or why it has
    none (one line). ``classes`` interns the MROs' names (``{names: index}``)."""
    import transformers

    from bridge.hf.table import name_order, ordered_templates, template

    builds, ties = [], None
    for config in configs:
        found = {
            f: meta_model_ties(_variant(config, f), Rules()) for f in ("absent", "true", "false")
        }
        if any(v is None for v in found.values()):
            return "transformers cannot build it from this config"
        these = {f: v[0] for f, v in found.items() if v is not None}
        if ties is not None and these != ties:
            return "its ties depend on config keys other than tie_word_embeddings"
        ties = these
        builds.append(found["absent"])
    assert ties is not None
    if any(
        any(p.isdigit() for p in n.split("."))
        for t in ties.values()
        for kv in t.items()
        for n in kv
    ):
        return "it ties list items to each other: their ties depend on the number of layers"
    modules: dict[str, set[int]] = {}
    for _, _, shapes, model, _ in builds:  # type: ignore[misc]
        nested = [m for m in model.modules() if isinstance(m, transformers.PreTrainedModel)]
        if any(type(m.config) is not type(model.config) for m in nested):
            return "it holds models of configs of their own, which decide their ties"
        owners = {""}
        for name in shapes:
            parts = name.split(".")[:-1]
            owners.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        for prefix, module in model.named_modules(remove_duplicate=False):
            if prefix in owners:
                mro = tuple(c.__name__ for c in type(module).__mro__)
                index = classes.setdefault(mro, len(classes))
                modules.setdefault(template(prefix), set()).add(index)
    by_index = {i: mro for mro, i in classes.items()}
    for found_in in modules.values():
        if len({class_kind(by_index[i], Rules()) for i in found_in}) > 1:
            return "list items of one list hold layers of different kinds (a Sequential)"
    names = [list(b[2]) for b in builds]  # type: ignore[index]
    templates = ordered_templates(*names)
    if templates is None or any(sorted(n, key=name_order(templates)) != n for n in names):  # type: ignore[arg-type]
        return "its state_dict() order differs from one list item to another"
    return {
        "ties": ties,
        "modules": {t: (min(i) if len(i) == 1 else sorted(i)) for t, i in sorted(modules.items())},
        "names": templates,
    }


#: Config keys that change which modules a model has, and their other values: each
#: is built too, and the table's entry holds the modules and names of all.
ALTERNATIVES: Mapping[str, tuple[Mapping[str, Any], ...]] = {
    "longt5": ({"encoder_attention_type": "transient-global"},),
}
#: Config keys whose default leaves a module kind out of a model of few layers
#: (DeepSeek's first MoE layer comes after 3 dense ones): built with this value too.
ALTERNATIVE_KEYS: Mapping[str, Any] = {"first_k_dense_replace": 1}


#: Config keys of the number of layers, made small for the table's models (one entry
#: serves any number: list indices are ``{i}``).
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
               "decoder_layers", "num_decoder_layers")  # fmt: skip


def generation_config(model_type: str, *, small: bool = True) -> dict[str, Any] | None:
    """The default config of ``model_type`` as ``config.json`` holds it, with (``small``)
    at most 3 layers per stack; ``None`` for a config class without defaults."""
    import transformers

    with _quiet():
        try:
            base = json.loads(transformers.CONFIG_MAPPING[model_type]().to_json_string())
        except Exception:  # noqa: BLE001 -- a config class without defaults
            return None
    if not small:
        return base
    return {k: min(v, 3) if k in _LAYER_KEYS and isinstance(v, int) else v for k, v in base.items()}


def tabulated_classes() -> dict[str, list[str]]:
    """``{model type: [model class, ...]}``: the causal, seq2seq, masked LM, speech
    seq2seq and image classification classes of transformers and the base model of
    each of their model types (one class may serve several model types)."""
    from transformers.models.auto import modeling_auto as auto

    out: dict[str, list[str]] = {}
    heads = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
             "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
             "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_MAPPING_NAMES")  # fmt: skip
    for mapping in heads:
        for model_type, cls in getattr(auto, mapping).items():
            if isinstance(cls, str) and (mapping != heads[-1] or model_type in out):
                if cls not in out.setdefault(model_type, []):
                    out[model_type].append(cls)
    return {t: sorted(c) for t, c in sorted(out.items())}


def write_table(
    path: Any, *, only: Collection[str] = (), log: Callable[[str], None] = print
) -> None:
    """Builds every tabulated class (``only``: those model types) on the meta device
    and writes the table to ``path`` (a temporary name, then renamed)."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    from bridge.hf.table import FORMAT, VERSION

    classes: dict[tuple[str, ...], int] = {}
    models: dict[str, dict[str, Any]] = {}
    excluded: dict[str, dict[str, str]] = {}
    for model_type, names in tabulated_classes().items():
        if only and model_type not in only:
            continue
        configs = {small: generation_config(model_type, small=small) for small in (True, False)}
        for cls in names:
            entry: dict[str, Any] | str = "its config class has no defaults"
            for small in (True, False):  # (Fewer layers than a list of layer kinds names.)
                config = configs[small]
                if config is not None:
                    config = {**config, "architectures": [cls]}
                    changes = [*ALTERNATIVES.get(model_type, ())]
                    changes += [{k: v} for k, v in ALTERNATIVE_KEYS.items() if k in config]
                    alternatives = [{**config, **a} for a in changes]
                    entry = table_entry([config, *alternatives], classes)
                if not (isinstance(entry, str) and "cannot build" in entry):
                    break
            if isinstance(entry, str):
                excluded.setdefault(model_type, {})[cls] = entry
                log(f"{model_type} {cls}: left out, {entry}")
            else:
                models.setdefault(model_type, {})[cls] = entry
    table = {
        "format": FORMAT,
        "version": VERSION,
        "transformers": transformers.__version__,
        "classes": [list(mro) for mro, _ in sorted(classes.items(), key=lambda kv: kv[1])],
        "auto": {
            t: {
                "causal": _str_or_none(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(t)),
                "base": _str_or_none(auto.MODEL_MAPPING_NAMES.get(t)),
            }
            for t in models
        },
        "models": models,
        "excluded": excluded,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)
    count = sum(map(len, models.values())), sum(map(len, excluded.values()))
    log(f"{path}: {count[0]} model classes, {count[1]} left out")


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


if __name__ == "__main__":
    import sys

    from bridge.hf.table import TABLE_FILE

    write_table(TABLE_FILE, only=sys.argv[1:])
