"""MaxText's layout of the Llama, Mistral and Gemma families, in PyTorch names and back.

A MaxText run keeps its decoder weights scanned: one array per weight for all
``L`` layers, stacked on axis ``param_scan_axis`` (1 by default), under
``params/params/`` (the item's ``params`` key, then Flax's ``params``
collection); a checkpoint converted for MaxText is the same tree at
``<dir>/0/items``. :class:`MaxTextToTorch` reads such an item as the Hugging Face
PyTorch state dict of the same model, one layer of one weight at a time, and
:class:`TorchToMaxText` gives a Hugging Face directory's tensors as that tree.
Both apply MaxText's own conversions, which are not plain renamings: the heads
are axes of their own, the query kernel carries the attention's
``1/sqrt(head_dim)``, Llama 3.1's RoPE pairs neighbouring features where
Hugging Face pairs the two halves, and Gemma's norms and embedding hold
Hugging Face's ``weight + 1`` and ``embedding * sqrt(hidden_size)``.

The mapping, MaxText leaf (under ``params/params/``) <-> Hugging Face tensor: how
MaxText -> HF computes the tensor (HF -> MaxText is the inverse), [where from]. A
layer's leaf is shown for one layer; the stacked array has ``L`` inserted at the
scan axis (``query/kernel`` is ``(E, L, H, D)``, a norm's ``scale`` ``(E, L)``):

- ``token_embedder/embedding`` (V', E) <-> ``model.embed_tokens.weight`` (V, E):
  as is; Gemma: ``[:V] / sqrt(E)`` [4, 5].
- ``decoder/decoder_norm/scale`` (E,) <-> ``model.norm.weight``: as is; Gemma:
  ``- 1`` [4, 5].
- ``decoder/logits_dense/kernel`` (E, V) <-> ``lm_head.weight`` (V, E): ``.T``;
  no leaf when tied, MaxText's ``logits_via_embedding`` [1, 4, 6].
- ``layers/self_attention/query/kernel`` (E, H, D) <->
  ``layers.{i}.self_attn.q_proj.weight`` (H*D, E): ``* sqrt(D)``, RoPE
  unpermuted (Llama 3.1), ``.reshape(E, H*D).T`` [1, 2, 3].
- ``layers/self_attention/key/kernel`` (E, K, D) <->
  ``layers.{i}.self_attn.k_proj.weight`` (K*D, E): RoPE unpermuted (Llama 3.1),
  ``.reshape(E, K*D).T`` [1, 2].
- ``layers/self_attention/value/kernel`` (E, K, D) <->
  ``layers.{i}.self_attn.v_proj.weight`` (K*D, E): ``.reshape(E, K*D).T`` [1, 2].
- ``layers/self_attention/out/kernel`` (H, D, E) <->
  ``layers.{i}.self_attn.o_proj.weight`` (E, H*D): ``.reshape(H*D, E).T`` [1, 2].
- ``layers/mlp/wi_0/kernel`` (E, F) <-> ``layers.{i}.mlp.gate_proj.weight``,
  ``layers/mlp/wi_1/kernel`` (E, F) <-> ``layers.{i}.mlp.up_proj.weight``,
  ``layers/mlp/wo/kernel`` (F, E) <-> ``layers.{i}.mlp.down_proj.weight``: ``.T``
  [1, 2, 4].
- ``layers/pre_self_attention_layer_norm/scale`` (E,) <->
  ``layers.{i}.input_layernorm.weight``, ``layers/post_self_attention_layer_norm/scale``
  <-> ``layers.{i}.post_attention_layernorm.weight``: as is [1, 2].
- Gemma: ``layers/pre_self_attention_norm/scale`` <->
  ``layers.{i}.input_layernorm.weight``, ``layers/pre_ffw_norm/scale`` <->
  ``layers.{i}.post_attention_layernorm.weight``: ``- 1`` [4, 5].

(``layers`` is ``decoder/layers``, ``layers.{i}`` is ``model.layers.{i}``; E hidden
size, H query heads, K key-value heads, D head dim, F intermediate size, V the
config's vocabulary, V' MaxText's, which pads Gemma's.) The sources:

1. ``checkpoint_conversion/utils/param_mapping.py``:
   ``LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING`` (the names, scanned and not) and
   ``LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN``: ``reshape_kernel``,
   ``scale_query_layer`` (``x.astype(float32) * float32(sqrt(head_dim))`` to
   HF, ``* float32(1 / sqrt(head_dim))`` to MaxText) and ``adjust_rope``
   (to HF ``concatenate(x[..., ::2], x[..., 1::2])``, to MaxText the
   inverse, ``stack([first_half, second_half], -1)``); the hook chain
   ``[scale_query_layer, adjust_rope, reshape_kernel]``, reversed to MaxText.
2. ``checkpoint_conversion/standalone_scripts/llama_or_mistral_ckpt.py``
   ``_convert_huggingface_to_jax_weights`` (Llama 2/3 and Mistral from HF:
   the transposes and head reshapes, the stacking then ``np.transpose`` to
   ``(embed, layer, ...)``, the query kernel *divided* by
   ``sqrt(head_dim)`` in the weights' dtype, ``max_utils.permute_to_match_maxtext_rope``
   for ``llama3.1`` only), and ``llama_mistral_mixtral_orbax_to_hf.py``
   ``convert_state_to_hf`` with ``max_utils.unpermute_from_match_maxtext_rope``
   (a no-op but for ``llama3.1``) and ``reverse_scale``, the way back.
3. ``layers/attentions.py`` ``init_query_w`` (the query kernel's
   ``/ depth_scaling``, ``sqrt(head_dim)``: MaxText's attention does not scale)
   and ``init_rotary_embedding`` (``LLaMARotaryEmbedding``, which rotates
   feature pairs ``(2k, 2k+1)``, for ``model_name`` ``llama3.1-*`` or
   ``rope_type: llama3.1``; ``RotaryEmbedding``, which rotates halves as
   Hugging Face does, otherwise); ``layers/embeddings.py`` both classes.
4. ``checkpoint_conversion/standalone_scripts/convert_gemma_chkpt.py``
   ``main``: Gemma's leaf names, ``scale + 1`` for every norm, the embedding
   ``* sqrt(embed_dim)``, the query ``* head_dim**-0.5``, and no
   ``logits_dense`` (``configs/models/gemma-*.yml``: ``logits_via_embedding: true``;
   ``layers/decoders.py`` then divides the logits by ``sqrt(embed)``, undoing
   the embedding's scale).
5. ``checkpoint_conversion/utils/param_mapping.py``
   ``GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN``, the same for Gemma 2 from and to
   HF: ``scale_rmsnorm_layer`` (``+ 1.0`` / ``- 1.0``),
   ``pad_hf_embedding_layer`` (zero rows up to MaxText's vocabulary, then
   ``* float32(hidden_size ** 0.5)``; to HF ``[:V] / ...``),
   ``scale_query_layer`` (``* float32(1 / sqrt(head_dim))``).
6. ``checkpoint_conversion/utils/utils.py`` ``validate_and_filter_param_map_keys``
   (a mapped leaf the MaxText model lacks, ``logits_dense`` of a model with
   ``logits_via_embedding``, is skipped), ``save_weights_to_checkpoint``
   (``TrainState(params={"params": weights})``) and ``common/checkpointing.py``
   ``load_params_from_path`` ("On disk the weights live at
   ``params/params/...``"); ``configs/base.yml``: ``scan_layers: true``,
   ``param_scan_axis: 1``.

Where MaxText's own scripts differ, this module does what the script for that
model does: the query is scaled by ``1/sqrt(head_dim)`` in float32 [1, 5] for
Llama with Llama 3 RoPE and for Gemma, divided by ``sqrt(head_dim)`` [2] for
Mistral and other Llamas; to Hugging Face it is always multiplied back in
float32 [1, 5]. Where ``sqrt(head_dim)`` is not a power of two (head dim 8,
32, 128) the query does not come back bit for bit (about one float32 ulp), and
neither do Gemma's norms (``(w + 1) - 1`` rounds). Nothing here imports torch,
transformers or JAX.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from jaxshare import AliasMap
from jaxshare.formats import CONFIG_FILE
from jaxshare.internal import Index, numpy_dtype
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = [
    "MAXTEXT_FAMILIES",
    "MaxTextFamily",
    "MaxTextToTorch",
    "TorchToMaxText",
    "maxtext_view",
    "torch_shapes",
]

#: What a tensor is, which decides its shapes and its conversion.
Kind = Literal["embedding", "norm", "head", "query", "key", "value", "out", "up", "down"]

#: The nestings of MaxText's weights in an item, tried in this order: a run's
#: ``TrainState`` (and what MaxText's converters write), then a bare ``params`` tree.
PREFIXES: tuple[tuple[str, ...], ...] = (("params", "params"), ("params",), ())


@dataclass(frozen=True)
class MaxTextFamily:
    """How MaxText lays out one family of Hugging Face models.

    Attributes:
      decoder_block: MaxText's ``decoder_block`` for it.
      layer: per decoder layer, ``(Hugging Face name after model.layers.{i}.,
        MaxText path under decoder/layers, kind)``.
      norm_offset: what MaxText's norm scale adds to Hugging Face's weight
        (Gemma: 1, as Hugging Face's Gemma norm multiplies by ``1 + weight``).
      scaled_embedding: MaxText's embedding is Hugging Face's times
        ``sqrt(hidden_size)``, its rows padded (Gemma).
      tied: ``tie_word_embeddings`` when ``config.json`` does not say.
      divides_query: Hugging Face -> MaxText divides the query kernel by
        ``sqrt(head_dim)`` (``llama_or_mistral_ckpt.py``) rather than multiplying
        it by ``1/sqrt(head_dim)`` in float32 (``to_maxtext.py``'s hooks); a Llama
        with Llama 3 RoPE is converted by the latter.
      rope_from_config: a Llama 3 RoPE in ``config.json`` means MaxText's
        ``LLaMARotaryEmbedding`` (Llama 3.1): query and key features interleaved.

    >>> MAXTEXT_FAMILIES["gemma"].layer[0]
    ('self_attn.q_proj.weight', ('self_attention', 'query', 'kernel'), 'query')
    """

    decoder_block: str
    layer: tuple[tuple[str, tuple[str, ...], Kind], ...]
    norm_offset: float = 0.0
    scaled_embedding: bool = False
    tied: bool = False
    divides_query: bool = False
    rope_from_config: bool = False


def _layer(input_norm: str, post_norm: str) -> tuple[tuple[str, tuple[str, ...], Kind], ...]:
    """A decoder layer's tensors, its norms named ``input_norm`` and ``post_norm``."""
    return (
        ("self_attn.q_proj.weight", ("self_attention", "query", "kernel"), "query"),
        ("self_attn.k_proj.weight", ("self_attention", "key", "kernel"), "key"),
        ("self_attn.v_proj.weight", ("self_attention", "value", "kernel"), "value"),
        ("self_attn.o_proj.weight", ("self_attention", "out", "kernel"), "out"),
        ("mlp.gate_proj.weight", ("mlp", "wi_0", "kernel"), "up"),
        ("mlp.up_proj.weight", ("mlp", "wi_1", "kernel"), "up"),
        ("mlp.down_proj.weight", ("mlp", "wo", "kernel"), "down"),
        ("input_layernorm.weight", (input_norm, "scale"), "norm"),
        ("post_attention_layernorm.weight", (post_norm, "scale"), "norm"),
    )


_LLAMA_LAYER = _layer("pre_self_attention_layer_norm", "post_self_attention_layer_norm")

#: MaxText's layout of each family, by ``config.json``'s ``model_type``.
MAXTEXT_FAMILIES: Mapping[str, MaxTextFamily] = MappingProxyType(
    {
        "llama": MaxTextFamily("llama2", _LLAMA_LAYER, divides_query=True, rope_from_config=True),
        "mistral": MaxTextFamily("mistral", _LLAMA_LAYER, divides_query=True),
        "gemma": MaxTextFamily(
            "gemma",
            _layer("pre_self_attention_norm", "pre_ffw_norm"),
            norm_offset=1.0,
            scaled_embedding=True,
            tied=True,
        ),
    }
)

_EMBEDDING = ("token_embedder", "embedding")
_NORM = ("decoder", "decoder_norm", "scale")
_HEAD = ("decoder", "logits_dense", "kernel")
_HEAD_NAME, _EMBED_NAME = "lm_head.weight", "model.embed_tokens.weight"
#: What old checkpoints store and the models compute: MaxText's conversion maps it to nothing.
_COMPUTED = ".rotary_emb.inv_freq"


@dataclass(frozen=True)
class _Model:
    """What ``config.json`` says of the model, as the layout needs it."""

    model_type: str
    family: MaxTextFamily
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    interleaved: bool

    def describe(self) -> str:
        return (
            f"{self.model_type}: hidden_size={self.hidden}, num_hidden_layers={self.layers}, "
            f"num_attention_heads={self.heads}, num_key_value_heads={self.kv_heads}, "
            f"head_dim={self.head_dim}, intermediate_size={self.intermediate}, "
            f"vocab_size={self.vocab}"
        )

    def torch_shape(self, kind: Kind) -> tuple[int, ...]:
        e, f = self.hidden, self.intermediate
        return {
            "embedding": (self.vocab, e),
            "head": (self.vocab, e),
            "norm": (e,),
            "query": (self.heads * self.head_dim, e),
            "key": (self.kv_heads * self.head_dim, e),
            "value": (self.kv_heads * self.head_dim, e),
            "out": (e, self.heads * self.head_dim),
            "up": (f, e),
            "down": (e, f),
        }[kind]

    def maxtext_shape(self, kind: Kind, vocab: int | None = None) -> tuple[int, ...]:
        """One layer's MaxText shape (the embedding's with ``vocab`` rows)."""
        e, f, d = self.hidden, self.intermediate, self.head_dim
        return {
            "embedding": (self.vocab if vocab is None else vocab, e),
            "head": (e, self.vocab),
            "norm": (e,),
            "query": (e, self.heads, d),
            "key": (e, self.kv_heads, d),
            "value": (e, self.kv_heads, d),
            "out": (self.heads, d, e),
            "up": (e, f),
            "down": (f, e),
        }[kind]

    def to_torch(self, kind: Kind, x: np.ndarray) -> np.ndarray:
        """One MaxText array (a layer's) as its Hugging Face tensor."""
        e = self.hidden
        if kind == "query":
            x = _scaled(x, math.sqrt(self.head_dim))
        if kind in ("query", "key") and self.interleaved:
            x = np.concatenate((x[..., ::2], x[..., 1::2]), axis=-1)
        if kind in ("query", "key", "value"):
            x = x.reshape(e, -1).T
        elif kind == "out":
            x = x.reshape(-1, e).T
        elif kind in ("up", "down", "head"):
            x = x.T
        elif kind == "norm" and self.family.norm_offset:
            x = (x - self.family.norm_offset).astype(x.dtype)
        elif kind == "embedding" and self.family.scaled_embedding:
            x = (x / np.float32(e**0.5)).astype(x.dtype)
        return np.ascontiguousarray(x)

    def to_maxtext(self, kind: Kind, w: np.ndarray, vocab: int | None = None) -> np.ndarray:
        """One Hugging Face tensor as its MaxText array (a layer's)."""
        if kind in ("query", "key", "value", "out"):
            x = w.T.reshape(self.maxtext_shape(kind))
            if kind in ("query", "key") and self.interleaved:
                half = x.shape[-1] // 2
                x = np.stack([x[..., :half], x[..., half:]], axis=-1).reshape(x.shape)
            if kind == "query":
                if self.family.divides_query and not self.interleaved:
                    x = x / np.asarray(math.sqrt(self.head_dim), dtype=x.dtype)
                else:
                    x = _scaled(x, 1 / math.sqrt(self.head_dim))
        elif kind in ("up", "down", "head"):
            x = w.T
        elif kind == "norm" and self.family.norm_offset:
            x = (w + self.family.norm_offset).astype(w.dtype)
        elif kind == "embedding" and (
            vocab not in (None, w.shape[0]) or self.family.scaled_embedding
        ):
            x = np.zeros((w.shape[0] if vocab is None else vocab, w.shape[1]), w.dtype)
            x[: w.shape[0]] = w
            if self.family.scaled_embedding:
                x = (x * np.float32(self.hidden**0.5)).astype(w.dtype)
        else:
            x = w
        return np.ascontiguousarray(x)


def _scaled(x: np.ndarray, factor: float) -> np.ndarray:
    """``x * factor`` as MaxText's ``scale_query_layer`` hooks compute it: in float32,
    back in ``x``'s dtype."""
    return (x.astype(np.float32) * np.float32(factor)).astype(x.dtype)


def _model(config: Mapping[str, Any] | None, where: str, interleaved: bool | None) -> _Model:
    """The model ``config`` (a ``config.json`` dict) describes, or one ``ValueError`` line."""
    if not isinstance(config, Mapping):
        raise ValueError(
            f"{where}: MaxText's layout needs the model's config.json; pass `config=` (a dict)."
        )
    model_type = config.get("model_type")
    family = MAXTEXT_FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None or not isinstance(model_type, str):
        raise ValueError(
            f"{where}: config.json's model_type {model_type!r} has no MaxText layout here; "
            f"the known ones are {', '.join(sorted(MAXTEXT_FAMILIES))}."
        )
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ValueError(
                f"{where}: config.json sets {flag}: true, but MaxText's {family.decoder_block} "
                "layers have no biases."
            )

    def count(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if value is None and default is not None:
            value = default
        if type(value) is not int or value <= 0:
            raise ValueError(
                f"{where}: config.json's {key} must be a positive integer, got {value!r}."
            )
        return value

    hidden, heads = count("hidden_size"), count("num_attention_heads")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, Mapping) else None
    if interleaved is None:
        interleaved = family.rope_from_config and rope_type == "llama3"
    tied = config.get("tie_word_embeddings", family.tied)
    return _Model(
        model_type,
        family,
        hidden,
        count("num_hidden_layers"),
        heads,
        count("num_key_value_heads", heads),
        count("head_dim", hidden // heads),
        count("intermediate_size"),
        count("vocab_size"),
        bool(tied),
        interleaved,
    )


def _tensors(model: _Model) -> Iterator[tuple[str, tuple[str, ...], Kind, int | None]]:
    """Every tensor of the layout in Hugging Face's ``state_dict()`` order:
    ``(Hugging Face name, MaxText path, kind, layer)``, the path of a layer's
    tensor under ``decoder/layers``."""
    yield "model.embed_tokens.weight", _EMBEDDING, "embedding", None
    for i in range(model.layers):
        for name, path, kind in model.family.layer:
            yield f"model.layers.{i}.{name}", path, kind, i
    yield "model.norm.weight", _NORM, "norm", None
    yield "lm_head.weight", _HEAD, "head", None


def torch_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensors MaxText's layout of ``config``'s model holds, by
    name, in ``state_dict()`` order (a tied head left out).

    >>> config = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2,
    ...           "num_attention_heads": 2, "num_key_value_heads": 1,
    ...           "intermediate_size": 12, "vocab_size": 10}
    >>> shapes = torch_shapes(config)
    >>> len(shapes), shapes["model.layers.1.self_attn.k_proj.weight"]
    (21, (4, 8))
    """
    model = _model(config, CONFIG_FILE, None)
    return {
        name: model.torch_shape(kind)
        for name, _, kind, _ in _tensors(model)
        if not (kind == "head" and model.tied)
    }


def _render(parts: Sequence[str]) -> str:
    return "/".join(parts)


def _stacked(shape: tuple[int, ...], axis: int, layers: int) -> tuple[int, ...]:
    return (*shape[:axis], layers, *shape[axis:])


def _check_axis(scan_axis: int) -> int:
    if scan_axis not in (0, 1):
        raise ValueError(f"`scan_axis` is MaxText's param_scan_axis, 0 or 1; got {scan_axis!r}.")
    return scan_axis


@dataclass(frozen=True)
class _Leaf:
    """Where one Hugging Face tensor is in the MaxText item."""

    path: str
    kind: Kind
    layer: int | None  # Its index on the scan axis of ``path``; ``None``: the whole leaf.


class _MaxTextSource(TensorSource):
    """What both directions share: the wrapped source, the model its config describes."""

    _source: TensorSource
    _model: _Model
    _axis: int
    config: Mapping[str, Any]

    def _wrap(
        self,
        source: TensorSource,
        config: Mapping[str, Any] | None,
        interleaved_rope: bool | None,
        scan_axis: int,
    ) -> tuple[_Model, Mapping[str, Any]]:
        self._source = source
        if config is None:
            config = source.config
        self._model = _model(config, source.where, interleaved_rope)
        assert config is not None  # (`_model` refuses anything but a mapping.)
        self.config, self.live = config, source.live
        self._axis = _check_axis(scan_axis)
        return self._model, config


class MaxTextToTorch(_MaxTextSource):
    """A MaxText item's weights as the Hugging Face PyTorch state dict of the model.

    Wraps a Flax-named source in MaxText's layout (an Orbax item,
    ``jaxshare.checkpoint.open_source(".../0/items")``) and names its tensors as
    the Hugging Face model of ``config`` does (``model.layers.{i}.self_attn.q_proj.weight``,
    ...), each read as MaxText's export to Hugging Face computes it: one layer's
    slice of a stacked leaf (the source reads only that slice), reshaped,
    transposed, unpermuted and rescaled (see the module's table). The weights are
    found under ``params/params/`` (a MaxText run's items), ``params/`` or at the
    top; other leaves (``step``, ``opt_state/...``) are the run's, not the model's,
    and are left alone. Scanned (``decoder/layers/...``) and unscanned
    (``decoder/layers_{i}/...``) items are read alike.

    Args:
      source: the item, by Flax paths.
      config: the Hugging Face ``config.json`` of the model, as a dict; default:
        the source's (``source.config``, the one an item keeps).
      prefix: the path of the weights in the item; default: found.
      scan_axis: MaxText's ``param_scan_axis``, the stacked leaves' layer axis.
      interleaved_rope: whether the query and key features are in MaxText's
        Llama 3.1 order (``LLaMARotaryEmbedding``); default: a Llama whose
        config has a Llama 3 RoPE (``rope_type: llama3``). MaxText's
        ``llama3.3-70b`` uses plain RoPE: pass ``False``.

    Attributes:
      config: ``config``.
      prefix: the path of the weights in the item.
      scanned: whether the decoder layers are stacked.

    ``ties`` holds ``{"lm_head.weight": "model.embed_tokens.weight"}`` where the
    config ties the word embeddings and the item has no ``logits_dense`` (MaxText
    computes the logits from the embedding); an item with both keeps both, and
    writers that know the config leave the head out.

    Raises:
      ValueError: one line naming the leaf: a leaf of the layout missing, a leaf
        the layout has no place for, a stacked leaf whose scan axis is not
        ``num_hidden_layers`` long, a shape that does not fit the config, an
        untied config with no ``logits_dense``, a family MaxText's layout here
        does not cover.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import SafetensorsFile
    >>> config = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2,
    ...           "num_attention_heads": 2, "num_key_value_heads": 1,
    ...           "intermediate_size": 12, "vocab_size": 10}
    >>> rng = np.random.default_rng(0)
    >>> hf = {n: rng.standard_normal(s).astype(np.float32) for n, s in torch_shapes(config).items()}
    >>> save_file(hf, path := tempfile.mkdtemp() + "/model.safetensors")
    >>> with SafetensorsFile(path) as file:
    ...     back = MaxTextToTorch(TorchToMaxText(file, config), config)
    ...     k = back.array("model.layers.1.self_attn.k_proj.weight")
    >>> np.array_equal(k, hf["model.layers.1.self_attn.k_proj.weight"])
    True
    """

    def __init__(
        self,
        source: TensorSource,
        config: Mapping[str, Any] | None = None,
        /,
        *,
        prefix: Sequence[str] | None = None,
        scan_axis: int = 1,
        interleaved_rope: bool | None = None,
    ) -> None:
        model, config = self._wrap(source, config, interleaved_rope, scan_axis)
        where = source.where
        self.path, self.kind = source.path, source.kind
        self.parts, self.assets = source.parts, source.assets
        self.other_files = source.other_files
        names = list(source.infos)
        top = tuple(prefix) if prefix is not None else _find_prefix(names, where)
        self.prefix = top
        under = {n: source.infos[n] for n in names if _under(n, top)}
        layers = _render((*top, "decoder", "layers"))
        self.scanned = not any(n.startswith(f"{layers}_") for n in under)
        leaves: dict[str, _Leaf] = {}
        infos: dict[str, ArrayInfo] = {}
        seen: set[str] = set()
        head_missing = False
        for name, path, kind, layer in _tensors(model):
            if layer is None:
                full = _render((*top, *path))
            elif self.scanned:
                full = _render((*top, "decoder", "layers", *path))
            else:
                full = _render((*top, "decoder", f"layers_{layer}", *path))
            if full not in under:
                if kind == "head" and model.tied:
                    head_missing = True
                    continue
                raise ValueError(self._missing(full, kind, model, under))
            info = under[full]
            if full not in seen:
                self._check_shape(
                    full, kind, info, model, stacked=layer is not None and self.scanned
                )
                seen.add(full)
            at = layer if layer is not None and self.scanned else None
            leaves[name] = _Leaf(full, kind, at)
            infos[name] = ArrayInfo(model.torch_shape(kind), info.dtype)
        extra = sorted(set(under) - seen)
        if extra:
            raise ValueError(
                f"{where}: the leaf {extra[0]!r} has no place in MaxText's "
                f"{model.family.decoder_block} layout of {model.model_type}; convert an item "
                "of this family, or pass `prefix=` where its weights are."
            )
        self._leaves, self.infos = leaves, infos
        if head_missing:
            self.ties = AliasMap({_HEAD_NAME: _EMBED_NAME})
            self.origins = {_HEAD_NAME: CONFIG_FILE}

    @property
    def where(self) -> str:
        return self._source.where

    def _missing(self, path: str, kind: Kind, model: _Model, under: Iterable[str]) -> str:
        where = self._source.where
        if kind == "head":
            return (
                f"{where}: the MaxText leaf {path!r} is missing (MaxText computes the logits "
                "from the embedding, logits_via_embedding), but config.json sets "
                "tie_word_embeddings: false; set it true, or convert an item with a head."
            )
        shape = model.maxtext_shape(kind)
        want = _stacked(shape, self._axis, model.layers) if "/layers/" in path else shape
        near = difflib.get_close_matches(path, list(under), n=3, cutoff=0.8)
        found = f"nearest: {', '.join(near)}" if near else "nothing near it"
        return (
            f"{where}: the MaxText leaf {path!r} {want} is missing ({found}); MaxText's "
            f"{model.family.decoder_block} layout of {model.model_type} holds it."
        )

    def _check_shape(
        self, path: str, kind: Kind, info: ArrayInfo, model: _Model, *, stacked: bool
    ) -> None:
        where, got = self._source.where, tuple(info.shape)
        if kind == "embedding" and len(got) == 2 and got[0] >= model.vocab:
            padded = model.family.scaled_embedding  # (MaxText pads Gemma's rows.)
            shape = model.maxtext_shape(kind, got[0] if padded else None)
        else:
            shape = model.maxtext_shape(kind)
        want = _stacked(shape, self._axis, model.layers) if stacked else shape
        if stacked and len(got) == len(want) and got[self._axis] != model.layers:
            raise ValueError(
                f"{where}: the MaxText leaf {path!r} {got} stacks {got[self._axis]} layers on "
                f"its scan axis {self._axis} (param_scan_axis), but config.json has "
                f"num_hidden_layers={model.layers}; pass the config of the model the item holds."
            )
        if got != want:
            raise ValueError(
                f"{where}: the MaxText leaf {path!r} has shape {got}, but config.json "
                f"({model.describe()}) makes it {want}; pass the config of the model the "
                "item holds."
            )

    def read(self, name: str) -> np.ndarray:
        try:
            leaf = self._leaves[name]
        except KeyError:
            raise KeyError(f"{self.where}: no tensor named {name!r}.") from None
        model, source = self._model, self._source
        if leaf.layer is not None:
            ndim = len(source.infos[leaf.path].shape)
            index = [slice(None)] * ndim
            index[self._axis] = slice(leaf.layer, leaf.layer + 1)
            x = np.squeeze(source.read_slice(leaf.path, tuple(index)), axis=self._axis)
        elif leaf.kind == "embedding" and source.infos[leaf.path].shape[0] != model.vocab:
            x = source.read_slice(leaf.path, (slice(0, model.vocab), slice(None)))
        else:
            x = source.array(leaf.path)
        return model.to_torch(leaf.kind, np.asarray(x))

    def array(self, name: str) -> np.ndarray:
        return self.read(name)


def _under(name: str, top: tuple[str, ...]) -> bool:
    """Whether the leaf ``name`` is one of the weights under ``top``: all of them under
    ``params/...``; at the top of an item, those under ``decoder`` and ``token_embedder``."""
    parts = tuple(name.split("/"))
    if top:
        return parts[: len(top)] == top
    return parts[0] in ("decoder", "token_embedder")


def _find_prefix(names: Sequence[str], where: str) -> tuple[str, ...]:
    """Where MaxText's weights are in an item of leaves ``names``."""
    for top in PREFIXES:
        starts = [_render((*top, key)) + "/" for key in ("decoder", "token_embedder")]
        if any(n.startswith(s) for n in names for s in starts):
            return top
    sample = ", ".join(repr(n) for n in list(names)[:3])
    raise ValueError(
        f"{where}: no MaxText weights: expected leaves under 'params/params/decoder/' (a "
        f"MaxText run's items) or 'params/decoder/', found {sample or 'none'}; pass `prefix=`."
    )


class TorchToMaxText(_MaxTextSource):
    """A Hugging Face model's tensors as the tree a MaxText run restores.

    Wraps a PyTorch-named source (a Hugging Face directory,
    ``bridge.open_source(path)``) and gives MaxText's Flax paths
    (``params/params/decoder/layers/self_attention/query/kernel``, ...), each
    array as MaxText's Hugging Face -> MaxText conversion makes it (see the
    module's table): a stacked leaf is filled one layer at a time, each layer's
    tensor read, transposed, reshaped, permuted and scaled, into one
    preallocated array; a slice of it (a layer, a device's block) reads only the
    layers it covers. Write it with
    ``jaxshare.checkpoint.write_item(dst, jaxshare.stream.Plan.identity(s), s)``.

    Args:
      source: the Hugging Face model's tensors.
      config: its ``config.json`` as a dict; default: the source's.
      prefix: where the weights go: ``("params", "params")``, as MaxText's
        ``load_parameters_path`` restores them (``("params",)``: a bare tree).
      scan_layers: stack the decoder layers (``decoder/layers/...``, MaxText's
        default) or not (``decoder/layers_{i}/...``).
      scan_axis: MaxText's ``param_scan_axis``.
      interleaved_rope: permute the query and key features into MaxText's
        Llama 3.1 order; default: a Llama whose config has a Llama 3 RoPE.
      maxtext_vocab_size: the embedding's rows in MaxText (zero rows added);
        default: the config's ``vocab_size``. MaxText's Gemma configs pad
        256000 to 256128.

    Attributes:
      config: ``config``.

    A tied model has no ``logits_dense``: MaxText computes the logits from the
    embedding (``logits_via_embedding: true``; for a Llama, run it with
    ``normalize_embedding_logits: false``).

    Raises:
      ValueError: one line naming the tensor: a tensor of the model missing from
        ``source``, one the layout has no place for, a shape that does not fit the
        config, layers of different dtypes; a family MaxText's layout here does
        not cover.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import SafetensorsFile
    >>> config = {"model_type": "gemma", "hidden_size": 4, "num_hidden_layers": 3,
    ...           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
    ...           "intermediate_size": 6, "vocab_size": 5}
    >>> hf = {n: np.ones(s, np.float32) for n, s in torch_shapes(config).items()}
    >>> save_file(hf, path := tempfile.mkdtemp() + "/model.safetensors")
    >>> with SafetensorsFile(path) as file:
    ...     maxtext = TorchToMaxText(file, config, maxtext_vocab_size=8)
    ...     print(maxtext.infos["params/params/decoder/layers/self_attention/out/kernel"])
    ...     print(maxtext.array("params/params/decoder/layers/pre_ffw_norm/scale").tolist())
    ArrayInfo(shape=(2, 3, 2, 4), dtype='float32')
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """

    flax_named = True

    def __init__(
        self,
        source: TensorSource,
        config: Mapping[str, Any] | None = None,
        /,
        *,
        prefix: Sequence[str] = ("params", "params"),
        scan_layers: bool = True,
        scan_axis: int = 1,
        interleaved_rope: bool | None = None,
        maxtext_vocab_size: int | None = None,
    ) -> None:
        model, config = self._wrap(source, config, interleaved_rope, scan_axis)
        where = source.where
        if maxtext_vocab_size is not None and (
            type(maxtext_vocab_size) is not int or maxtext_vocab_size < model.vocab
        ):
            raise ValueError(
                f"{where}: `maxtext_vocab_size` pads the embedding's {model.vocab} rows, so it "
                f"is an int of at least {model.vocab}; got {maxtext_vocab_size!r}."
            )
        self._vocab = maxtext_vocab_size
        self.path, self.kind = source.path, source.kind
        self.parts, self.assets = source.parts, source.assets
        self.other_files = source.other_files
        top = tuple(prefix)
        # MaxText path -> (kind, the Hugging Face name of each layer, or the one tensor).
        self._plan: dict[str, tuple[Kind, tuple[str, ...], bool]] = {}
        dtypes: dict[str, str] = {}
        used: set[str] = set()
        for name, path, kind, layer in _tensors(model):
            if kind == "head" and model.tied:
                used.add(name)  # (Written out or not: MaxText computes it from the embedding.)
                continue
            info = self._torch_info(name, kind, model)
            used.add(name)
            if layer is None or not scan_layers:
                sub = path if layer is None else ("decoder", f"layers_{layer}", *path)
                full = _render((*top, *sub))
                self._plan[full] = (kind, (name,), False)
            else:
                full = _render((*top, "decoder", "layers", *path))
                kind_, names, _ = self._plan.get(full, (kind, (), True))
                self._plan[full] = (kind_, (*names, name), True)
                first = dtypes.setdefault(full, info.dtype)
                if info.dtype != first:
                    raise ValueError(
                        f"{where}: {name!r} is {info.dtype}, but layer 0's is {first}; MaxText "
                        "stacks the layers in one array, of one dtype. Cast them first."
                    )
            dtypes.setdefault(full, info.dtype)
        extra = [
            n
            for n in source.infos
            if n not in used and n not in source.ties and not n.endswith(_COMPUTED)
        ]
        if extra:
            raise ValueError(
                f"{where}: the tensor {extra[0]!r} has no place in MaxText's "
                f"{model.family.decoder_block} layout of {model.model_type} (no biases, "
                "adapters or heads of other tasks); convert the plain causal LM."
            )
        infos: dict[str, ArrayInfo] = {}
        for full in sorted(self._plan):
            kind, names, stacked = self._plan[full]
            shape = model.maxtext_shape(kind, self._vocab)
            if stacked:
                shape = _stacked(shape, self._axis, model.layers)
            infos[full] = ArrayInfo(shape, dtypes[full])
        self.infos = infos

    @property
    def where(self) -> str:
        return self._source.where

    def _torch_info(self, name: str, kind: Kind, model: _Model) -> ArrayInfo:
        """The info of the Hugging Face tensor ``name``, checked against the config."""
        source, where = self._source, self._source.where
        stored = name if name in source.infos else source.ties.get(name)
        if stored is None or stored not in source.infos:
            raise ValueError(
                f"{where}: the tensor {name!r} of MaxText's {model.family.decoder_block} layout "
                f"is missing; a {model.model_type} model with this config.json holds it."
            )
        info = source.infos[stored]
        want = model.torch_shape(kind)
        got = tuple(info.shape)
        if stored != name and (perm := source.ties.transform(name)) is not None:
            got = tuple(got[p] for p in perm)
        if got != want:
            raise ValueError(
                f"{where}: the tensor {name!r} has shape {got}, but config.json "
                f"({model.describe()}) makes it {want}; pass the model's own config.json."
            )
        return info

    def _torch_array(self, name: str) -> np.ndarray:
        source = self._source
        if name in source.infos:
            return np.asarray(source.array(name))
        canonical = source.ties[name]
        x = np.asarray(source.array(canonical))
        perm = source.ties.transform(name)
        return x if perm is None else x.transpose(perm)

    def _entry(self, name: str) -> tuple[Kind, tuple[str, ...], bool]:
        try:
            return self._plan[name]
        except KeyError:
            raise KeyError(f"{self.where}: no tensor named {name!r}.") from None

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def array(self, name: str) -> np.ndarray:
        kind, names, stacked = self._entry(name)
        if not stacked:
            return self._model.to_maxtext(kind, self._torch_array(names[0]), self._vocab)
        return self._layers(name, range(len(names)))

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``array(name)[index]``, converting only the layers ``index`` covers."""
        kind, names, stacked = self._entry(name)
        if not stacked:
            return np.asarray(self.array(name)[index])
        info = self.infos[name]
        full = (*index, *(slice(None),) * (len(info.shape) - len(index)))
        chosen = range(len(names))[full[self._axis]]
        x = self._layers(name, chosen)
        rest = tuple(slice(None) if k == self._axis else s for k, s in enumerate(full))
        return np.ascontiguousarray(x[rest])

    def _layers(self, name: str, layers: range) -> np.ndarray:
        """The stacked leaf ``name``'s ``layers``, filled one layer at a time."""
        kind, names, _ = self._plan[name]
        info = self.infos[name]
        shape = list(info.shape)
        shape[self._axis] = len(layers)
        out = np.empty(shape, numpy_dtype(info.dtype))
        at: list[Any] = [slice(None)] * len(shape)
        for j, i in enumerate(layers):
            at[self._axis] = j
            out[tuple(at)] = self._model.to_maxtext(kind, self._torch_array(names[i]))
        return out


def maxtext_view(source: TensorSource, config: Mapping[str, Any] | None = None) -> TensorSource:
    """``source`` in the other naming of MaxText's layout: a Flax-named MaxText item
    as its Hugging Face tensors (:class:`MaxTextToTorch`), a PyTorch-named source as
    the MaxText tree (:class:`TorchToMaxText`); ``config`` defaults to the source's."""
    return (MaxTextToTorch if source.flax_named else TorchToMaxText)(source, config)
