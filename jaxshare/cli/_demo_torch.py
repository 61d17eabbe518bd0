"""The PyTorch part of ``jaxshare demo``: a tied torch model to Flax and back.

A small PyTorch LM whose ``lm_head`` is its token embedding goes to Flax (one
array, the head an alias carrying a transpose), runs there with the same output,
comes back as a state dict that loads with ``strict=True`` and stores the tie
once; then :func:`bridge.shared_params` meets a module DeepSpeed's
``_get_shared_params`` gets wrong, shown with the very walks DeepSpeed makes
(``named_children()``, ``data_ptr()``).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import torch
from flax import linen as nn

from bridge import load_safetensors, save_safetensors, shared_params, to_flax, to_torch

__all__ = ["FlaxLM", "TorchLM", "demo_story"]

VOCAB, DIM = 32, 16


class TorchLM(torch.nn.Module):
    """Embedding -> Linear+tanh residual -> LayerNorm -> lm_head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.mlp = torch.nn.Linear(DIM, DIM)
        self.ln_f = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        x = x + torch.tanh(self.mlp(x))
        return self.lm_head(self.ln_f(x))


class FlaxLM(nn.Module):
    """The same network in linen, with ``lm_head`` a Dense of its own."""

    @nn.compact
    def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
        x = nn.Embed(VOCAB, DIM, name="wte")(tokens)
        x = x + jnp.tanh(nn.Dense(DIM, name="mlp")(x))
        x = nn.LayerNorm(epsilon=1e-5, name="ln_f")(x)
        return nn.Dense(VOCAB, use_bias=False, name="lm_head")(x)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(DIM, DIM)
        self.gate = torch.nn.Parameter(torch.zeros(0))  # e.g. a disabled adapter


def _deepspeed_gets_wrong() -> torch.nn.Module:
    """One block registered twice, and two unrelated zero-size parameters."""
    block = _Block()
    model = torch.nn.ModuleDict({"encoder": block, "decoder": block, "other": _Block()})
    return model


def demo_story(workdir: Path, say: Callable[[str], None]) -> None:
    """Runs the PyTorch story, writing files under ``workdir``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = TorchLM().eval()
    say(f"PyTorch model: lm_head.weight is wte.weight: {model.lm_head.weight is model.wte.weight}")
    say(f"bridge.shared_params(model) = {shared_params(model)}")

    variables, aliases = to_flax(model)
    say(f"bridge.to_flax(model) -> alias map {aliases}")
    params = variables["params"]
    same = bool(jnp.array_equal(params["lm_head"]["kernel"], params["wte"]["embedding"].T))
    say(f"in Flax, lm_head/kernel == wte/embedding.T: {same}")

    tokens = np.arange(12) % VOCAB
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)).numpy()
    got = np.asarray(FlaxLM().apply(variables, jnp.asarray(tokens)))
    say(
        f"Flax forward equals the PyTorch forward: {np.allclose(got, expected, atol=1e-5)}"
        f" (max |diff| {np.abs(got - expected).max():.1e})"
    )

    state = to_torch(variables, aliases)
    tied = state["lm_head.weight"] is state["wte.weight"]
    say(f"bridge.to_torch: lm_head.weight is wte.weight: {tied}")
    fresh = TorchLM()
    fresh.load_state_dict(state, strict=True)
    say("load_state_dict(strict=True) into a fresh model: ok")
    once, twice = io.BytesIO(), io.BytesIO()
    torch.save(state, once)
    torch.save({k: v.clone() for k, v in state.items()}, twice)
    say(f"torch.save stores the tie once: {once.tell()} bytes ({twice.tell()} untied)")
    path = workdir / "tiny_lm.safetensors"
    save_safetensors(state, path, force=True)
    loaded = load_safetensors(path)
    tied = loaded["lm_head.weight"] is loaded["wte.weight"]
    say(f"{path.name}: lm_head.weight re-tied on load: {tied}")

    odd = _deepspeed_gets_wrong()
    say("a block registered twice (encoder, decoder) plus a zero-size parameter in each block:")
    children = [name for name, _ in odd.named_children()]
    say(f"  DeepSpeed walks named_children(): {children}, so it never names decoder.*")
    pointers = {n: p.data_ptr() for n, p in odd.named_parameters() if not p.numel()}
    say(f"  and keys by data_ptr(): {pointers}, so it ties the unrelated empty gates")
    say(f"  bridge.shared_params: {shared_params(odd)}")
