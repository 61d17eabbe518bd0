"""NNX ties a model can run, named by the model's own layers.

The two real NNX tie patterns: a Variable shared with the same layout (an encoder
and a decoder embedding), and ``Embed.attend`` for a head computed from the
embedding, whose PyTorch ``lm_head.weight`` then has no place in the model and
stays in the alias map.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import bridge
import jaxshare


class EncDec(nnx.Module):
    """Encoder and decoder embeddings sharing one Variable (the same layout)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dec = nnx.Embed(10, 4, rngs=rngs)
        self.enc = nnx.Embed(10, 4, rngs=rngs)
        self.enc.embedding = self.dec.embedding

    def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
        return self.enc(tokens) + self.dec(tokens)


class AttendLM(nnx.Module):
    """An output head computed from the embedding: ``wte.attend``."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.wte = nnx.Embed(10, 4, rngs=rngs)
        self.mlp = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
        return self.wte.attend(jnp.tanh(self.mlp(self.wte(tokens))))


class TorchLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.mlp = torch.nn.Linear(4, 4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.mlp(self.wte(tokens))))


TOKENS = np.array([1, 4, 9, 0])


def test_both_models_run():
    assert EncDec(nnx.Rngs(0))(jnp.asarray(TOKENS)).shape == (4, 4)
    assert AttendLM(nnx.Rngs(0))(jnp.asarray(TOKENS)).shape == (4, 10)


@pytest.mark.parametrize("like", ["module", "state"])
def test_a_dropped_alias_is_named_after_the_model_s_own_layer(like):
    model = EncDec(nnx.Rngs(0))
    assert jaxshare.find_shared(model) == {"enc/embedding": "dec/embedding"}
    exported = bridge.to_torch(model)
    assert exported["enc.weight"] is exported["dec.weight"]
    target = model if like == "module" else nnx.state(model)
    state, aliases = bridge.to_flax(exported, like=target)
    # An Embed's alias: `enc/embedding`, no transform -- not a transposed Linear kernel.
    assert aliases == {"enc/embedding": "dec/embedding"} and not aliases.transforms
    fresh = EncDec(nnx.Rngs(1))
    nnx.update(fresh, state)
    assert fresh.enc.embedding is fresh.dec.embedding
    np.testing.assert_array_equal(fresh.enc.embedding[...], model.enc.embedding[...])
    np.testing.assert_array_equal(fresh(jnp.asarray(TOKENS)), model(jnp.asarray(TOKENS)))


def test_an_attend_head_keeps_the_torch_tie_in_the_alias_map():
    torch.manual_seed(0)
    torch_model = TorchLM().eval()
    model = AttendLM(nnx.Rngs(0))
    state, aliases = bridge.to_flax(torch_model, like=model)
    # The model has no `lm_head`: the tie stays in the alias map, a transposed kernel.
    assert aliases == jaxshare.AliasMap(
        {"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)}
    )
    nnx.update(model, state)
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(TOKENS)).numpy()
    np.testing.assert_allclose(model(jnp.asarray(TOKENS)), expected, rtol=1e-5, atol=1e-6)
    back = bridge.to_torch(model, aliases)
    assert back["lm_head.weight"] is back["wte.weight"]
    torch_model.load_state_dict(back, strict=True)
