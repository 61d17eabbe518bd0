"""MaxText's layout of the Llama, Mistral, Gemma, Mixtral and Qwen3-MoE families, in
PyTorch names and back.

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
Hugging Face pairs the two halves, Gemma's norms and embedding hold
Hugging Face's ``weight + 1`` and ``embedding * sqrt(hidden_size)``, and a
mixture of experts holds each expert weight of every layer in one array, the
experts on an axis of their own.

The conversions are data: one layout table per family,
``bridge/layouts/tables/maxtext/{llama,mistral,gemma,mixtral,qwen3_moe}.toml``
(:data:`MAXTEXT_FAMILIES`),
read both ways by the tables' engine (:class:`bridge.layouts.view.TableToTorch`,
:class:`bridge.layouts.view.TableToFlax`). This module picks the table by
``config.json``'s ``model_type``, checks the config, and gives the table MaxText's
own options -- ``scan_layers``, ``param_scan_axis``, ``interleaved_rope``,
``maxtext_vocab_size`` -- and where in an item the weights are.

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
- Mixtral: ``layers/MoeBlock_0/gate/kernel`` (E, X) <->
  ``layers.{i}.block_sparse_moe.gate.weight`` (X, E): ``.T``; and
  ``layers/MoeBlock_0/wi_0`` (X, E, F) <-> ``layers.{i}.block_sparse_moe.experts.{x}.w1.weight``
  (F, E), ``wi_1`` <-> ``w3``, ``wo`` (X, F, E) <-> ``w2`` (E, F): expert ``x``'s
  slice ``[x]``, ``.T`` [7]. No ``mlp``; attention and norms as Mistral's, the
  query multiplied by ``float32(1/sqrt(D))`` [7].
- Qwen3-MoE: ``layers/moe_block/gate/kernel`` <-> ``layers.{i}.mlp.gate.weight``,
  ``layers/moe_block/wi_0``, ``wi_1``, ``wo`` <->
  ``layers.{i}.mlp.experts.{x}.gate_proj.weight``, ``up_proj``, ``down_proj``: as
  Mixtral's; ``layers/self_attention/query_norm/scale`` (D,) <->
  ``layers.{i}.self_attn.q_norm.weight``, ``key_norm`` <-> ``k_norm``: as is; the
  query not scaled [8].

(``layers`` is ``decoder/layers``, ``layers.{i}`` is ``model.layers.{i}``; E hidden
size, H query heads, K key-value heads, D head dim, F intermediate size (an expert's:
Qwen3-MoE's ``moe_intermediate_size``), X experts, V the config's vocabulary, V'
MaxText's, which pads Gemma's. An expert weight's stacked array is ``(X, L, E, F)``:
the layers at the scan axis of the array that holds a layer's experts first.) The
sources:

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
7. ``checkpoint_conversion/utils/param_mapping.py``
   ``MIXTRAL_MAXTEXT_TO_HF_PARAM_MAPPING`` (scanned: per expert weight a nested
   list, experts outer and layers inner; unscanned: a layer's list of experts) and
   ``MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN`` (``reshape_kernel``: ``x.transpose()``;
   ``reshape_and_transpose_attention``; ``scale_query_layer``:
   ``(x * float32(1 / sqrt(head_dim))).astype(x.dtype)`` to MaxText, ``* float32(sqrt(
   head_dim))`` to HF), applied by ``to_maxtext.py``: ``_build_multi_axis_stacked_tensor``
   (an expert weight's experts and layers on axes 0 and 1) and
   ``_build_single_axis_stacked_tensor`` (the rest on ``param_scan_axis``; an
   unscanned layer's experts on axis 0), and the way back by ``utils/utils.py``
   ``process_maxtext_param`` (the same axes sliced); ``models/mixtral.py``
   (``MoeBlock_0``), ``layers/moe.py`` (``wi_0`` of ``(num_experts, emb, mlp)``);
   ``configs/models/mixtral-8x7b.yml`` (``decoder_block: mixtral``,
   ``logits_via_embedding: false``). ``standalone_scripts/llama_or_mistral_ckpt.py``
   (its ``MoeBlock_0`` branch) writes the same tree, the query divided by
   ``sqrt(head_dim)`` in bfloat16, and ``llama_mistral_mixtral_orbax_to_hf.py``
   ``convert_state_to_hf`` reads it back (``w1`` from ``wi_0[k, layer].T``).
8. ``checkpoint_conversion/utils/param_mapping.py`` ``QWEN_MAXTEXT_TO_HF_PARAM_MAPPING``
   (``num_experts > 1``: ``moe_block``, laid out as in [7]) and
   ``QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN`` (``reshape_kernel``, ``reshape_expert_kernel``:
   a 2-D ``transpose(1, 0)``, ``pad_embedding_layer``), applied as in [7];
   ``standalone_scripts/convert_qwen3_moe.py`` ``convert_hf_to_maxtext`` writes the
   same tree; ``configs/models/qwen3-30b-a3b.yml``: ``decoder_block: qwen3_moe``.

Where MaxText's own scripts differ, the tables do what the script for that
model does: the query is scaled by ``1/sqrt(head_dim)`` in float32 [1, 5] for
Llama with Llama 3 RoPE and for Gemma, divided by ``sqrt(head_dim)`` [2] for
Mistral and other Llamas; to Hugging Face it is always multiplied back in
float32 [1, 5]; Mixtral's is multiplied both ways as numpy computes
``x * np.float32(f)``, cast back to the weight's dtype [7]. MaxText's converters
put an expert weight's experts and layers on axes 0 and 1 whatever
``param_scan_axis`` says [7]; the tables put the layers on ``param_scan_axis``,
as MaxText's scanned model holds every weight, which is the same at MaxText's
default 1. Where ``sqrt(head_dim)`` is not a power of two (head dim 8,
32, 128) the query does not come back bit for bit (about one float32 ulp), and
neither do Gemma's norms (``(w + 1) - 1`` rounds). Nothing here imports torch,
transformers or JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Literal

from bridge.layouts.ops import Add, Divide, Op, Scale, When
from bridge.layouts.table import TABLES, Table, read_table
from bridge.layouts.view import TableToFlax, TableToTorch
from jaxshare.formats import CONFIG_FILE
from jaxshare.stream import TensorSource

__all__ = [
    "MAXTEXT_FAMILIES",
    "MAXTEXT_TABLES",
    "MaxTextFamily",
    "MaxTextToTorch",
    "TorchToMaxText",
    "maxtext_tables",
    "maxtext_view",
    "torch_shapes",
]

#: Where the tables are: one per family.
MAXTEXT_TABLES = TABLES / "maxtext"

#: The nestings of MaxText's weights in an item, tried in this order: a run's
#: ``TrainState`` (and what MaxText's converters write), then a bare ``params`` tree.
PREFIXES: tuple[tuple[str, ...], ...] = (("params", "params"), ("params",), ())

_LAYER, _LAYERS = "model.layers.{i}.", "decoder/layers/"
_EMBEDDING, _NORM = "model.embed_tokens.weight", "model.norm.weight"


@cache
def maxtext_tables() -> tuple[Table, ...]:
    """The shipped MaxText tables: Gemma, Llama, Mistral, Mixtral, Qwen3-MoE."""
    return tuple(read_table(path) for path in sorted(MAXTEXT_TABLES.glob("*.toml")))


@dataclass(frozen=True)
class MaxTextFamily:
    """How MaxText lays out one family of Hugging Face models: its table, and what
    the table says of it, by name.

    Attributes:
      table: the family's layout table.
      decoder_block: MaxText's ``decoder_block`` for it.
      layer: per decoder layer, ``(Hugging Face name after model.layers.{i}.,
        MaxText path under decoder/layers)``.
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
      experts: the config key of its number of experts, for a family of
        mixtures of experts (``None``: dense).

    >>> MAXTEXT_FAMILIES["gemma"].layer[0]
    ('self_attn.q_proj.weight', ('self_attention', 'query', 'kernel'))
    >>> MAXTEXT_FAMILIES["gemma"].norm_offset, MAXTEXT_FAMILIES["llama"].divides_query
    (1.0, True)
    >>> MAXTEXT_FAMILIES["mixtral"].experts, MAXTEXT_FAMILIES["mixtral"].layer[-3]
    ('num_local_experts', ('block_sparse_moe.experts.{e}.w2.weight', ('MoeBlock_0', 'wo')))
    """

    table: Table

    def _ops(self, name: str) -> list[Op]:
        """The ops of the (first) entry of the PyTorch name pattern ``name``, each
        conditional one as the op it applies."""
        entry = next(e for e in self.table.entries if e.torch == name)
        return [op.op if isinstance(op, When) else op for op in entry.ops]

    @property
    def decoder_block(self) -> str:
        return str(self.table.defaults["decoder_block"])

    @property
    def layer(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return tuple(
            (e.torch.removeprefix(_LAYER), tuple(e.flax.removeprefix(_LAYERS).split("/")))
            for e in self.table.entries
            if e.torch.startswith(_LAYER) and e.flax.startswith(_LAYERS)
        )

    @property
    def norm_offset(self) -> float:
        return next((float(op.operand) for op in self._ops(_NORM) if isinstance(op, Add)), 0.0)

    @property
    def scaled_embedding(self) -> bool:
        return any(isinstance(op, Scale) for op in self._ops(_EMBEDDING))

    @property
    def tied(self) -> bool:
        return bool(self.table.defaults.get("tie_word_embeddings", False))

    @property
    def divides_query(self) -> bool:
        return any(isinstance(op, Divide) for op in self._ops(f"{_LAYER}self_attn.q_proj.weight"))

    @property
    def rope_from_config(self) -> bool:
        return "interleaved_rope" in self.table.derived

    @property
    def experts(self) -> str | None:
        r = self.table.ranges.get("e")
        return None if r is None else str(r.size)


#: MaxText's layout of each family, by ``config.json``'s ``model_type``.
MAXTEXT_FAMILIES: Mapping[str, MaxTextFamily] = MappingProxyType(
    {model_type: MaxTextFamily(t) for t in maxtext_tables() for model_type in t.model_types}
)


def _family(config: Any, where: str) -> MaxTextFamily:
    """The family of ``config`` (a ``config.json`` dict), its sizes checked, or one
    ``ValueError`` line."""
    if not isinstance(config, Mapping):
        raise ValueError(
            f"{where}: MaxText's layout needs the model's config.json; pass `config=` (a dict)."
        )
    model_type = config.get("model_type")
    family = MAXTEXT_FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
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

    dense = (config.get("mlp_only_layers") or [], config.get("decoder_sparse_step") or 1)
    if family.experts is not None and dense != ([], 1):
        raise ValueError(
            f"{where}: config.json sets mlp_only_layers {dense[0]!r}, decoder_sparse_step "
            f"{dense[1]!r}, but MaxText's {family.decoder_block} layers are all mixtures of "
            "experts (mlp_only_layers [], decoder_sparse_step 1)."
        )
    hidden, heads = count("hidden_size"), count("num_attention_heads")
    count("num_hidden_layers")
    count("num_key_value_heads", heads)
    count("head_dim", hidden // heads)
    count("intermediate_size")
    count("vocab_size")
    return family


def _options(
    config: Mapping[str, Any], scan_axis: int, interleaved_rope: bool | None, **more: Any
) -> dict[str, Any]:
    """MaxText's options as the tables read them (``None``: the table's default)."""
    if scan_axis not in (0, 1):
        raise ValueError(f"`scan_axis` is MaxText's param_scan_axis, 0 or 1; got {scan_axis!r}.")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, Mapping) else None
    return {
        "param_scan_axis": scan_axis,
        "interleaved_rope": interleaved_rope,
        "rope_type": rope_type if isinstance(rope_type, str) else None,
        **more,
    }


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
    family = _family(config, CONFIG_FILE)
    options = _options(config, 1, None)
    return family.table.bind(config, CONFIG_FILE, options=options).torch_shapes()


def _find_prefix(names: Sequence[str], where: str) -> tuple[str, ...]:
    """Where MaxText's weights are in an item of leaves ``names``."""
    for top in PREFIXES:
        starts = ["/".join((*top, key)) + "/" for key in ("decoder", "token_embedder")]
        if any(n.startswith(s) for n in names for s in starts):
            return top
    sample = ", ".join(repr(n) for n in list(names)[:3])
    raise ValueError(
        f"{where}: no MaxText weights: expected leaves under 'params/params/decoder/' (a "
        f"MaxText run's items) or 'params/decoder/', found {sample or 'none'}; pass `prefix=`."
    )


class MaxTextToTorch(TableToTorch):
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
    >>> import numpy as np
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
        where = source.where
        config = source.config if config is None else config
        family = _family(config, where)
        assert config is not None  # (`_family` refuses anything but a mapping.)
        options = _options(config, scan_axis, interleaved_rope)
        names = list(source.infos)
        top = tuple(prefix) if prefix is not None else _find_prefix(names, where)
        layers = "/".join((*top, "decoder", "layers"))
        scanned = not any(n.startswith(f"{layers}_") for n in names)
        options["scan_layers"] = scanned
        embedding = source.infos.get("/".join((*top, "token_embedder", "embedding")))
        if family.scaled_embedding and embedding is not None and len(embedding.shape) == 2:
            if embedding.shape[0] >= config["vocab_size"]:  # (MaxText pads Gemma's rows.)
                options["maxtext_vocab_size"] = embedding.shape[0]
        # (At the top of an item, beside the weights: a run's step, its opt_state.)
        others: Literal["refuse", "leave"] = "refuse" if top else "leave"
        super().__init__(source, family.table, config, options=options, prefix=top, others=others)
        self.scanned = scanned
        self.origins = {alias: CONFIG_FILE for alias in self.ties}


class TorchToMaxText(TableToFlax):
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
    >>> import numpy as np
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
        where = source.where
        config = source.config if config is None else config
        family = _family(config, where)
        assert config is not None  # (`_family` refuses anything but a mapping.)
        options = _options(config, scan_axis, interleaved_rope, scan_layers=bool(scan_layers))
        vocab = config["vocab_size"]
        if maxtext_vocab_size is not None and (
            type(maxtext_vocab_size) is not int or maxtext_vocab_size < vocab
        ):
            raise ValueError(
                f"{where}: `maxtext_vocab_size` pads the embedding's {vocab} rows, so it "
                f"is an int of at least {vocab}; got {maxtext_vocab_size!r}."
            )
        options["maxtext_vocab_size"] = maxtext_vocab_size
        super().__init__(source, family.table, config, options=options, prefix=tuple(prefix))
        self.infos = dict(sorted(self.infos.items()))  # (By path, as MaxText's trees list.)


def maxtext_view(source: TensorSource, config: Mapping[str, Any] | None = None) -> TensorSource:
    """``source`` in the other naming of MaxText's layout: a Flax-named MaxText item
    as its Hugging Face tensors (:class:`MaxTextToTorch`), a PyTorch-named source as
    the MaxText tree (:class:`TorchToMaxText`); ``config`` defaults to the source's."""
    return (MaxTextToTorch if source.flax_named else TorchToMaxText)(source, config)
