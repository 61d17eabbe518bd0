"""Hand-built PyTorch models in the shapes of the real ones, and their linen twins.

For each: PyTorch -> Flax -> PyTorch is bit-exact and keeps every tie, and the
linen model run on the converted weights gives the PyTorch model's output. The
PyTorch models mirror Hugging Face's module names and tying: GPT-2 (``Conv1D``
weights stored (in, out), ``lm_head`` tied to ``wte``), BERT MLM (decoder weight
tied to the word embeddings, decoder bias tied to the head's ``bias``), T5 (one
embedding as ``shared``, ``encoder.embed_tokens``, ``decoder.embed_tokens`` and
``lm_head``); plus a conv net with BatchNorm, and bf16/fp16 models. The linen
twins name lists the linen way (``h_0``), as linen's ``setup`` does, and compute
heads from the embedding as Hugging Face's Flax models do, so the ``like=``
matching and the aliases without a place are exercised too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import linen as nn
from torch import nn as tnn

from bridge import shared_params, to_flax, to_torch

V, D, H, L, T = 24, 16, 2, 2, 6  # vocab, width, heads, layers, tokens
EPS = 1e-5


def torch_attention(q, k, v, causal, scale=None):
    split = lambda t: t.reshape(*t.shape[:-1], H, D // H).transpose(-2, -3)  # noqa: E731
    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=causal, scale=scale)
    return y.transpose(-2, -3).reshape(*q.shape)


def flax_attention(q, k, v, causal, scale=None):
    split = lambda t: t.reshape(*t.shape[:-1], H, D // H)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    if scale is not None:  # dot_product_attention divides by sqrt(head dim) itself
        q = q * scale * np.sqrt(D // H)
    mask = nn.make_causal_mask(jnp.ones(q.shape[:-2])) if causal else None
    y = nn.dot_product_attention(q, k, v, mask=mask)
    return y.reshape(*y.shape[:-2], D)


# ----------------------------------------------------------------------------- GPT-2


class Conv1D(tnn.Module):
    """As ``transformers.pytorch_utils.Conv1D``: weight (in, out), ``x @ W + b``."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = tnn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = tnn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).reshape(
            *x.shape[:-1], self.nf
        )


class GPT2Block(tnn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(D, eps=EPS)
        self.attn = tnn.Module()
        self.attn.c_attn = Conv1D(3 * D, D)
        self.attn.c_proj = Conv1D(D, D)
        self.ln_2 = tnn.LayerNorm(D, eps=EPS)
        self.mlp = tnn.Module()
        self.mlp.c_fc = Conv1D(4 * D, D)
        self.mlp.c_proj = Conv1D(D, 4 * D)

    def forward(self, x):
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(D, dim=-1)
        x = x + self.attn.c_proj(torch_attention(q, k, v, causal=True))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2LMHeadModel(tnn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = tnn.Module()
        self.transformer.wte = tnn.Embedding(V, D)
        self.transformer.wpe = tnn.Embedding(T, D)
        self.transformer.h = tnn.ModuleList([GPT2Block() for _ in range(L)])
        self.transformer.ln_f = tnn.LayerNorm(D, eps=EPS)
        self.lm_head = tnn.Linear(D, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids):
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(ids.shape[-1]))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


class Pair(nn.Module):
    """Two Dense layers under one name (``attn/c_attn``, ``attn/c_proj``)."""

    first: str
    second: str
    features: tuple[int, int]

    def setup(self):
        setattr(self, self.first, nn.Dense(self.features[0]))
        setattr(self, self.second, nn.Dense(self.features[1]))


class FlaxGPT2Block(nn.Module):
    def setup(self):
        self.ln_1 = nn.LayerNorm(epsilon=EPS)
        self.attn = Pair("c_attn", "c_proj", (3 * D, D))
        self.ln_2 = nn.LayerNorm(epsilon=EPS)
        self.mlp = Pair("c_fc", "c_proj", (4 * D, D))

    def __call__(self, x):
        q, k, v = jnp.split(self.attn.c_attn(self.ln_1(x)), 3, axis=-1)
        x = x + self.attn.c_proj(flax_attention(q, k, v, causal=True))
        return x + self.mlp.c_proj(nn.gelu(self.mlp.c_fc(self.ln_2(x)), approximate=True))


class FlaxGPT2Transformer(nn.Module):
    def setup(self):
        self.wte = nn.Embed(V, D)
        self.wpe = nn.Embed(T, D)
        self.h = [FlaxGPT2Block() for _ in range(L)]
        self.ln_f = nn.LayerNorm(epsilon=EPS)

    def __call__(self, ids):
        x = self.wte(ids) + self.wpe(jnp.arange(ids.shape[-1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class FlaxGPT2LMHeadModel(nn.Module):
    def setup(self):
        self.transformer = FlaxGPT2Transformer()
        self.lm_head = nn.Dense(V, use_bias=False)  # a place for the tied head

    def __call__(self, ids):
        return self.lm_head(self.transformer(ids))


# ----------------------------------------------------------------------------- BERT


class BertLayer(tnn.Module):
    def __init__(self):
        super().__init__()
        self.attention = tnn.Module()
        self.attention.self = tnn.Module()
        for name in ("query", "key", "value"):
            setattr(self.attention.self, name, tnn.Linear(D, D))
        self.attention.output = tnn.Module()
        self.attention.output.dense = tnn.Linear(D, D)
        self.attention.output.LayerNorm = tnn.LayerNorm(D, eps=EPS)
        self.intermediate = tnn.Module()
        self.intermediate.dense = tnn.Linear(D, 4 * D)
        self.output = tnn.Module()
        self.output.dense = tnn.Linear(4 * D, D)
        self.output.LayerNorm = tnn.LayerNorm(D, eps=EPS)

    def forward(self, x):
        s, o = self.attention.self, self.attention.output
        x = o.LayerNorm(
            x + o.dense(torch_attention(s.query(x), s.key(x), s.value(x), causal=False))
        )
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class BertForMaskedLM(tnn.Module):
    def __init__(self):
        super().__init__()
        self.bert = tnn.Module()
        e = self.bert.embeddings = tnn.Module()
        e.word_embeddings = tnn.Embedding(V, D)
        e.position_embeddings = tnn.Embedding(T, D)
        e.token_type_embeddings = tnn.Embedding(2, D)
        e.LayerNorm = tnn.LayerNorm(D, eps=EPS)
        self.bert.encoder = tnn.Module()
        self.bert.encoder.layer = tnn.ModuleList([BertLayer() for _ in range(L)])
        self.cls = tnn.Module()
        p = self.cls.predictions = tnn.Module()
        p.transform = tnn.Module()
        p.transform.dense = tnn.Linear(D, D)
        p.transform.LayerNorm = tnn.LayerNorm(D, eps=EPS)
        p.decoder = tnn.Linear(D, V, bias=False)
        p.bias = tnn.Parameter(torch.randn(V))
        p.decoder.bias = p.bias  # as BertLMPredictionHead does
        p.decoder.weight = e.word_embeddings.weight  # as tie_weights() does

    def forward(self, ids):
        e = self.bert.embeddings
        x = e.word_embeddings(ids) + e.position_embeddings(torch.arange(ids.shape[-1]))
        x = e.LayerNorm(x + e.token_type_embeddings(torch.zeros_like(ids)))
        for layer in self.bert.encoder.layer:
            x = layer(x)
        t = self.cls.predictions.transform
        return self.cls.predictions.decoder(t.LayerNorm(F.gelu(t.dense(x))))


class FlaxBertSelf(nn.Module):
    def setup(self):
        self.query, self.key, self.value = nn.Dense(D), nn.Dense(D), nn.Dense(D)


class FlaxBertDenseNorm(nn.Module):
    """``dense`` then ``LayerNorm``: an attention's and a layer's ``output``, and the head's
    ``transform``."""

    def setup(self):
        self.dense = nn.Dense(D)
        self.LayerNorm = nn.LayerNorm(epsilon=EPS)


class FlaxBertAttention(nn.Module):
    def setup(self):
        self.self = FlaxBertSelf()
        self.output = FlaxBertDenseNorm()


class FlaxBertIntermediate(nn.Module):
    def setup(self):
        self.dense = nn.Dense(4 * D)


class FlaxBertLayer(nn.Module):
    def setup(self):
        self.attention = FlaxBertAttention()
        self.intermediate = FlaxBertIntermediate()
        self.output = FlaxBertDenseNorm()

    def __call__(self, x):
        s, o = self.attention.self, self.attention.output
        x = o.LayerNorm(x + o.dense(flax_attention(s.query(x), s.key(x), s.value(x), causal=False)))
        return self.output.LayerNorm(
            x + self.output.dense(nn.gelu(self.intermediate.dense(x), approximate=False))
        )


class FlaxBertEmbeddings(nn.Module):
    def setup(self):
        self.word_embeddings = nn.Embed(V, D)
        self.position_embeddings = nn.Embed(T, D)
        self.token_type_embeddings = nn.Embed(2, D)
        self.LayerNorm = nn.LayerNorm(epsilon=EPS)

    def __call__(self, ids):
        x = self.word_embeddings(ids) + self.position_embeddings(jnp.arange(ids.shape[-1]))
        return self.LayerNorm(x + self.token_type_embeddings(jnp.zeros_like(ids)))


class FlaxBertEncoder(nn.Module):
    def setup(self):
        self.layer = [FlaxBertLayer() for _ in range(L)]

    def __call__(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class FlaxBert(nn.Module):
    def setup(self):
        self.embeddings = FlaxBertEmbeddings()
        self.encoder = FlaxBertEncoder()

    def __call__(self, ids):
        return self.encoder(self.embeddings(ids))


class FlaxBertPredictions(nn.Module):
    """As Hugging Face's Flax head: the decoder is the word embedding, plus ``bias``."""

    def setup(self):
        self.transform = FlaxBertDenseNorm()
        self.bias = self.param("bias", nn.initializers.zeros, (V,))

    def __call__(self, x, embedding):
        x = self.transform.LayerNorm(nn.gelu(self.transform.dense(x), approximate=False))
        return x @ embedding.T + self.bias


class FlaxBertCls(nn.Module):
    def setup(self):
        self.predictions = FlaxBertPredictions()


class FlaxBertForMaskedLM(nn.Module):
    def setup(self):
        self.bert = FlaxBert()
        self.cls = FlaxBertCls()

    def __call__(self, ids):
        x = self.bert(ids)
        return self.cls.predictions(x, self.bert.embeddings.word_embeddings.embedding)


# ----------------------------------------------------------------------------- T5


class T5LayerNorm(tnn.Module):
    """T5's RMS norm: not a known layer type, so its 1-D weight maps by name and rank."""

    def __init__(self):
        super().__init__()
        self.weight = tnn.Parameter(1 + 0.1 * torch.randn(D))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _t5_attention():
    m = tnn.Module()
    for name in "qkvo":
        setattr(m, name, tnn.Linear(D, D, bias=False))
    return m


def _t5_sublayer(attr: str, make):
    m = tnn.Module()
    setattr(m, attr, make())
    m.layer_norm = T5LayerNorm()
    return m


def _t5_ff():
    m = tnn.Module()
    m.wi = tnn.Linear(D, 4 * D, bias=False)
    m.wo = tnn.Linear(4 * D, D, bias=False)
    return m


class T5Stack(tnn.Module):
    def __init__(self, embed_tokens: tnn.Embedding, decoder: bool):
        super().__init__()
        self.decoder = decoder
        self.embed_tokens = embed_tokens
        self.block = tnn.ModuleList()
        for _ in range(L):
            block = tnn.Module()
            layers = [_t5_sublayer("SelfAttention", _t5_attention)]
            if decoder:
                layers.append(_t5_sublayer("EncDecAttention", _t5_attention))
            layers.append(_t5_sublayer("DenseReluDense", _t5_ff))
            block.layer = tnn.ModuleList(layers)
            self.block.append(block)
        self.final_layer_norm = T5LayerNorm()

    def forward(self, ids, memory=None):
        x = self.embed_tokens(ids)
        for block in self.block:
            sa = block.layer[0]
            h = sa.layer_norm(x)
            a = sa.SelfAttention
            x = x + a.o(torch_attention(a.q(h), a.k(h), a.v(h), causal=self.decoder, scale=1.0))
            if self.decoder:
                ca = block.layer[1]
                h, a = ca.layer_norm(x), ca.EncDecAttention
                x = x + a.o(
                    torch_attention(a.q(h), a.k(memory), a.v(memory), causal=False, scale=1.0)
                )
            ff = block.layer[-1]
            x = x + ff.DenseReluDense.wo(F.relu(ff.DenseReluDense.wi(ff.layer_norm(x))))
        return self.final_layer_norm(x)


class T5ForConditionalGeneration(tnn.Module):
    def __init__(self):
        super().__init__()
        self.shared = tnn.Embedding(V, D)
        self.encoder = T5Stack(self.shared, decoder=False)
        self.decoder = T5Stack(self.shared, decoder=True)
        self.lm_head = tnn.Linear(D, V, bias=False)
        self.lm_head.weight = self.shared.weight

    def forward(self, ids, dec_ids):
        memory = self.encoder(ids)
        return self.lm_head(self.decoder(dec_ids, memory) * D**-0.5)


class FlaxT5LayerNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (D,))
        return scale * x * jax.lax.rsqrt(jnp.mean(x**2, axis=-1, keepdims=True) + EPS)


class FlaxT5Attention(nn.Module):
    causal: bool

    def setup(self):
        self.q, self.k, self.v, self.o = (nn.Dense(D, use_bias=False) for _ in range(4))

    def __call__(self, x, memory):
        return self.o(
            flax_attention(self.q(x), self.k(memory), self.v(memory), self.causal, scale=1.0)
        )


class FlaxT5FF(nn.Module):
    def setup(self):
        self.wi = nn.Dense(4 * D, use_bias=False)
        self.wo = nn.Dense(D, use_bias=False)


class FlaxT5SelfAttention(nn.Module):
    causal: bool

    def setup(self):
        self.SelfAttention = FlaxT5Attention(self.causal)
        self.layer_norm = FlaxT5LayerNorm()


class FlaxT5CrossAttention(nn.Module):
    def setup(self):
        self.EncDecAttention = FlaxT5Attention(False)
        self.layer_norm = FlaxT5LayerNorm()


class FlaxT5LayerFF(nn.Module):
    def setup(self):
        self.DenseReluDense = FlaxT5FF()
        self.layer_norm = FlaxT5LayerNorm()


class FlaxT5Block(nn.Module):
    decoder: bool

    def setup(self):
        layers = [FlaxT5SelfAttention(self.decoder)]
        if self.decoder:
            layers.append(FlaxT5CrossAttention())
        self.layer = [*layers, FlaxT5LayerFF()]

    def __call__(self, x, memory):
        sa = self.layer[0]
        h = sa.layer_norm(x)
        x = x + sa.SelfAttention(h, h)
        if self.decoder:
            ca = self.layer[1]
            x = x + ca.EncDecAttention(ca.layer_norm(x), memory)
        ff = self.layer[-1]
        return x + ff.DenseReluDense.wo(nn.relu(ff.DenseReluDense.wi(ff.layer_norm(x))))


class FlaxT5Stack(nn.Module):
    embed_tokens: nn.Embed
    decoder: bool

    def setup(self):
        self.block = [FlaxT5Block(self.decoder) for _ in range(L)]
        self.final_layer_norm = FlaxT5LayerNorm()

    def __call__(self, ids, memory=None):
        x = self.embed_tokens(ids)
        for block in self.block:
            x = block(x, memory)
        return self.final_layer_norm(x)


class FlaxT5(nn.Module):
    """As Hugging Face's Flax T5: one ``shared`` embedding, the head its ``attend``."""

    def setup(self):
        self.shared = nn.Embed(V, D)
        self.encoder = FlaxT5Stack(self.shared, decoder=False)
        self.decoder = FlaxT5Stack(self.shared, decoder=True)

    def __call__(self, ids, dec_ids):
        memory = self.encoder(ids)
        return self.shared.attend(self.decoder(dec_ids, memory) * D**-0.5)


# ----------------------------------------------------------------------------- ConvNet


class ConvNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = tnn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = tnn.BatchNorm2d(8)
        self.conv2 = tnn.Conv2d(8, 8, 3, stride=2, bias=False)
        self.bn2 = tnn.BatchNorm2d(8)
        self.head = tnn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


class FlaxConvNet(nn.Module):
    def setup(self):
        self.conv1 = nn.Conv(8, (3, 3), padding=1)
        self.bn1 = nn.BatchNorm(use_running_average=True, epsilon=EPS)
        self.conv2 = nn.Conv(8, (3, 3), strides=2, padding="VALID", use_bias=False)
        self.bn2 = nn.BatchNorm(use_running_average=True, epsilon=EPS)
        self.head = nn.Dense(5)

    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1))  # PyTorch's NCHW input
        x = nn.relu(self.bn1(self.conv1(x)))
        x = nn.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(axis=(1, 2)))


def _trained_conv_net() -> ConvNet:
    model = ConvNet()
    model.train()
    with torch.no_grad():
        for _ in range(3):  # running statistics and num_batches_tracked move
            model(torch.randn(4, 3, 9, 9) * 2 + 1)
    return model.eval()


# ----------------------------------------------------------------------------- the checks

ids = np.arange(T)[None] % V
dec_ids = (np.arange(T)[None] * 5 + 1) % V
CASES = {
    "gpt2": (GPT2LMHeadModel, FlaxGPT2LMHeadModel, (ids,)),
    "bert": (BertForMaskedLM, FlaxBertForMaskedLM, (ids,)),
    "t5": (T5ForConditionalGeneration, FlaxT5, (ids, dec_ids)),
    "convnet": (
        _trained_conv_net,
        FlaxConvNet,
        (np.random.default_rng(0).normal(size=(2, 3, 9, 9)).astype(np.float32),),
    ),
}


def _torch_out(model, inputs):
    with torch.no_grad():
        return model(*(torch.from_numpy(x) for x in inputs)).float().numpy()


def _assert_round_trip(state, back):
    """``back`` (named after the model, ``like=``) is ``state``, bit for bit and tie for tie."""
    assert list(back) == list(state)
    for key, tensor in state.items():
        assert back[key].dtype == tensor.dtype and back[key].shape == tensor.shape, key
        assert torch.equal(back[key], tensor), key
    ties = shared_params(state)
    for alias, canonical in ties.items():
        assert back[alias] is back[canonical], alias
    return ties


@pytest.mark.parametrize("name", CASES)
def test_round_trip_is_bit_exact_and_keeps_every_tie(name):
    make_torch, _, _ = CASES[name]
    torch.manual_seed(0)
    model = make_torch()
    variables, aliases = to_flax(model)
    back = to_torch(variables, aliases, like=model)
    ties = _assert_round_trip(model.state_dict(), back)
    assert len(ties) == {"gpt2": 1, "bert": 2, "t5": 3, "convnet": 0}[name]
    make_torch().load_state_dict(back, strict=True)


def _to_flax_for(name, model):
    """Converted for the linen twin: shaped by its ``jax.eval_shape`` -- except the
    conv net's, whose ``like`` has no place for num_batches_tracked (see below);
    linen ignores the extra batch statistic."""
    _, flax_model, inputs = CASES[name]
    if name == "convnet":
        return to_flax(model)
    like = jax.eval_shape(flax_model().init, jax.random.key(0), *inputs)
    variables, aliases = to_flax(model, like=like)
    assert jax.tree.structure(variables) == jax.tree.structure(like)
    return variables, aliases


@pytest.mark.parametrize("name", CASES)
def test_flax_forward_on_converted_weights_equals_torch(name):
    make_torch, flax_model, inputs = CASES[name]
    torch.manual_seed(0)
    model = make_torch().eval()
    variables, aliases = _to_flax_for(name, model)
    got = np.asarray(flax_model().apply(variables, *inputs))
    np.testing.assert_allclose(got, _torch_out(model, inputs), rtol=1e-5, atol=1e-5)
    # Aliases `like` had no place for are still in the map, so PyTorch gets them all back.
    back = to_torch(variables, aliases, like=model)
    _assert_round_trip(model.state_dict(), back)


def test_gpt2_layouts_and_the_head_alias():
    model = GPT2LMHeadModel()
    like = jax.eval_shape(FlaxGPT2LMHeadModel().init, jax.random.key(0), ids)
    variables, aliases = to_flax(model, like=like)
    c_proj = variables["params"]["transformer"]["h_0"]["attn"]["c_proj"]["kernel"]  # square
    np.testing.assert_array_equal(
        c_proj, model.transformer.h[0].attn.c_proj.weight.detach().numpy()
    )
    assert dict(aliases) == {"params/lm_head/kernel": "params/transformer/wte/embedding"}
    assert aliases.transform("params/lm_head/kernel") == (1, 0)


def test_bert_aliases_without_a_place_stay_in_the_map():
    like = jax.eval_shape(FlaxBertForMaskedLM().init, jax.random.key(0), ids)
    _, aliases = to_flax(BertForMaskedLM(), like=like)
    assert dict(aliases) == {
        "params/cls/predictions/decoder/bias": "params/cls/predictions/bias",
        "params/cls/predictions/decoder/kernel": "params/bert/embeddings/word_embeddings/embedding",
    }


def test_t5_one_embedding_four_names():
    like = jax.eval_shape(FlaxT5().init, jax.random.key(0), ids, dec_ids)
    variables, aliases = to_flax(T5ForConditionalGeneration(), like=like)
    assert aliases.groups() == {
        "params/shared/embedding": (
            "params/decoder/embed_tokens/embedding",
            "params/encoder/embed_tokens/embedding",
            "params/lm_head/kernel",
        )
    }
    assert set(variables["params"]) == {"shared", "encoder", "decoder"}


def test_conv_net_like_names_what_it_has_no_place_for():
    model = _trained_conv_net()
    like = jax.eval_shape(FlaxConvNet().init, jax.random.key(0), CASES["convnet"][2][0])
    with pytest.raises(ValueError, match="'bn1.num_batches_tracked' has no place in `like`"):
        to_flax(model, like=like)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    variables, _ = to_flax(state, like=like)
    assert jax.tree.structure(variables) == jax.tree.structure(like)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["gpt2", "convnet"])
def test_half_precision_models(name, dtype):
    make_torch, flax_model, inputs = CASES[name]
    torch.manual_seed(0)
    model = make_torch().to(dtype).eval()
    variables, aliases = _to_flax_for(name, model)
    floats = [x for x in jax.tree.leaves(variables) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert {str(x.dtype) for x in floats} == {
        str(dtype).removeprefix("torch.")
    }  # no float32 detour
    _assert_round_trip(model.state_dict(), to_torch(variables, aliases, like=model))
    # Same weights, both run in float32: the outputs agree.
    upcast = jax.tree.map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, variables
    )
    got = np.asarray(flax_model().apply(upcast, *inputs))
    np.testing.assert_allclose(got, _torch_out(model.float(), inputs), rtol=1e-5, atol=1e-5)
