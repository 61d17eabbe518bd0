"""The usual names of tied tensors: what stands in for a model class that cannot be
read (no ``transformers``, an architecture its table and this transformers lack).

A head tied to the input embedding (:data:`WORD_EMBEDDING_HEADS`, the embedding
by :data:`INPUT_EMBEDDINGS`), and every stack's ``embed_tokens`` tied to an
encoder-decoder's ``shared`` embedding, applied only where ``tie_word_embeddings``
(absent: ``True``, the default every transformers version writes a difference
from) or the model type (:data:`ALWAYS_TIED`) says the word embeddings are tied.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

from jaxshare.formats import CONFIG_FILE

__all__ = ["ALWAYS_TIED", "INPUT_EMBEDDINGS", "WORD_EMBEDDING_HEADS", "usual_ties"]

#: Model types whose word embeddings transformers ties whatever
#: ``tie_word_embeddings`` says (their config classes set it to ``True``).
ALWAYS_TIED: frozenset[str] = frozenset({"t5", "mt5", "umt5", "longt5", "pop2piano", "udop"})

#: The output head(s) tied to the input embedding, by what else the files hold:
#: ``(a tensor the family stores, {head tensor: tensor it is tied to})``; the first
#: family whose marker the files hold wins, the last (marker ``None``) is the rest.
#: ``"<embedding>"`` stands for the input embedding (:data:`INPUT_EMBEDDINGS`).
WORD_EMBEDDING_HEADS: tuple[tuple[str | None, Mapping[str, str]], ...] = (
    (  # BERT and its kin: the decoder's weight and bias.
        "cls.predictions.bias",
        MappingProxyType(
            {
                "cls.predictions.decoder.weight": "<embedding>",
                "cls.predictions.decoder.bias": "cls.predictions.bias",
            }
        ),
    ),
    (  # RoBERTa and its kin.
        "lm_head.bias",
        MappingProxyType(
            {"lm_head.decoder.weight": "<embedding>", "lm_head.decoder.bias": "lm_head.bias"}
        ),
    ),
    (None, MappingProxyType({"lm_head.weight": "<embedding>"})),
)

#: Input word embeddings, best first: the tensor a head is tied to is the first
#: (shortest name first) whose name matches. Encoder-decoder models (T5, BART) tie
#: ``[prefix.]encoder.embed_tokens.weight`` and ``[prefix.]decoder.embed_tokens.weight``
#: to ``[prefix.]shared.weight`` too.
INPUT_EMBEDDINGS: tuple[str, ...] = (
    r"(.+\.)?shared\.weight",
    r"(.+\.)?(embeddings\.)?word_embeddings\.weight",
    r"(.+\.)?wte\.weight",
    r"(.+\.)?embed_tokens\.weight",
    r"(.+\.)?embed_in\.weight",
    r"(.+\.)?tok_embeddings\.weight",
)

#: Architectures (``config.json`` ``architectures``) that have an output head.
_HEADED = re.compile(
    r"(LMHead|ForCausalLM|ForConditionalGeneration|ForMaskedLM|ForPreTraining|WithLMHead)"
)


def _word_embeddings_tied(config: Mapping[str, Any]) -> bool:
    if config.get("model_type") in ALWAYS_TIED:
        return True
    for part in (config, config.get("text_config") or {}):
        if isinstance(part, Mapping) and "tie_word_embeddings" in part:
            return bool(part["tie_word_embeddings"])
    return True


def usual_ties(
    config: Mapping[str, Any], stored: Collection[str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """``({alias: canonical}, lines)``: the ties the usual names give a model whose files
    hold ``stored``, where ``config`` says its word embeddings are tied, and one line
    per tie it declares that they cannot name.

    >>> usual_ties({"architectures": ["GPT2LMHeadModel"]}, ["transformer.wte.weight"])
    ({'lm_head.weight': 'transformer.wte.weight'}, ())
    """
    unnamed: list[str] = []
    if config.get("tie_encoder_decoder"):
        unnamed.append(
            f"{CONFIG_FILE} sets tie_encoder_decoder, whose ties only the model class names; "
            "install transformers (`pip install 'jaxshare[hf]'`) to recover them"
        )
    if not _word_embeddings_tied(config):
        return {}, tuple(unnamed)
    names = sorted(stored, key=lambda n: (n.count("."), len(n), n))
    ties: dict[str, str] = {}
    # Encoder-decoder models: every stack's embed_tokens is the shared embedding.
    for name in names:
        m = re.fullmatch(r"(.+\.)?shared\.weight", name)
        if m is None:
            continue
        prefix = m.group(1) or ""
        for stack in ("encoder", "decoder"):
            alias = f"{prefix}{stack}.embed_tokens.weight"
            holds_stack = any(n.startswith(f"{prefix}{stack}.") for n in stored)
            if alias not in stored and holds_stack:
                ties[alias] = name
    embedding = next(
        (n for pattern in INPUT_EMBEDDINGS for n in names if re.fullmatch(pattern, n)), None
    )
    architectures = config.get("architectures") or []
    headed = any(isinstance(a, str) and _HEADED.search(a) for a in architectures)
    if headed:
        heads = next(h for marker, h in WORD_EMBEDDING_HEADS if marker is None or marker in stored)
        for alias, canonical in heads.items():
            if alias in stored:
                continue
            if canonical == "<embedding>":
                if embedding is None:
                    unnamed.append(
                        f"{CONFIG_FILE} ties the word embeddings, but no stored tensor is an "
                        f"input embedding jaxshare knows to tie {alias!r} to; install "
                        "transformers (`pip install 'jaxshare[hf]'`) to name the ties exactly"
                    )
                    continue
                canonical = embedding
            if canonical in stored:
                ties[alias] = canonical
    return ties, tuple(unnamed)
