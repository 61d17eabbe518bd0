"""Carry a tied PyTorch checkpoint into Flax and Orbax, and back, with the tie intact.

The PyTorch model is a small GPT-style LM whose ``lm_head.weight`` *is* its token
embedding ``wte.weight`` (one Parameter under two names, as Hugging Face ties
them). Its Flax twin is written the way Hugging Face's Flax models are: the
logits come from the embedding (``nn.Embed.attend``), so the Flax parameters
have no ``lm_head`` at all. The script

1. saves the PyTorch ``state_dict`` as ``model.pt`` and reads it back with
   ``bridge.load_torch`` (jaxshare's own restricted unpickler: a file that would
   run code is refused, never run);
2. converts it with ``bridge.to_flax(state, like=...)``, where ``like`` is the
   Flax model's ``jax.eval_shape`` init: names and layouts follow it (``wte``
   becomes an ``embedding``, Linear weights become transposed ``kernel`` s), and
   the head -- which the Flax model has no place for -- stays in the alias map as
   ``params/lm_head/kernel -> params/wte/embedding`` transposed;
3. saves an Orbax checkpoint that stores the embedding once, with the alias map
   beside it (``jaxshare.checkpoint.save`` of a ``jaxshare.Tied``);
4. restores it and runs the Flax model: same logits as PyTorch;
5. converts the restored tree back with ``bridge.to_torch(tree, alias_map)``:
   ``lm_head.weight`` is ``wte.weight`` again (one tensor object), so a fresh
   PyTorch model loads it with ``load_state_dict(strict=True)`` and gives the
   same logits; ``bridge.save_safetensors`` writes the tie once.

The same conversions from the command line::

    jaxshare convert model.pt ckpt            # PyTorch file -> Orbax, Flax names
    jaxshare convert ckpt back.safetensors --names torch
    jaxshare inspect back.safetensors

Run it: ``python examples/convert_torch_checkpoint.py [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import linen as nn

import bridge
import jaxshare
from jaxshare import checkpoint
from jaxshare.formats import inspect_safetensors

VOCAB, DIM, TOKENS = 50, 16, 12


class TorchLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM)
        )
        self.ln_f = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # the tie

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        return self.lm_head(self.ln_f(x + self.mlp(x)))


class Mlp(nn.Module):
    """Named like ``torch.nn.Sequential``: layers ``0`` and ``2``."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.gelu(nn.Dense(4 * DIM, name="0")(x), approximate=False)
        return nn.Dense(DIM, name="2")(x)


class FlaxLM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        wte = nn.Embed(VOCAB, DIM, name="wte")
        x = wte(tokens)
        x = nn.LayerNorm(epsilon=1e-5, name="ln_f")(x + Mlp(name="mlp")(x))
        return wte.attend(x)  # the head is the embedding: no lm_head parameters


@dataclass
class Result:
    aliases: jaxshare.AliasMap
    flax_vs_torch: float
    head_is_embedding: bool
    back_vs_torch: float
    safetensors_saved_bytes: int


def run(workdir: Path, log: Callable[[str], None] = print) -> Result:
    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = TorchLM().eval()
    tokens = np.arange(TOKENS) % VOCAB
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)).numpy()

    # 1. A PyTorch checkpoint, read back safely.
    torch.save(model.state_dict(), workdir / "model.pt")
    state = bridge.load_torch(workdir / "model.pt")
    log(f"model.pt: ties {bridge.shared_params(state)}")

    # 2. To Flax, shaped like the Flax model's parameters.
    like = jax.eval_shape(FlaxLM().init, jax.random.key(0), tokens)
    variables, aliases = bridge.to_flax(state, like=like)
    log(f"to_flax: {len(jax.tree.leaves(variables))} arrays; alias map {aliases}")

    # 3. An Orbax checkpoint storing the embedding once, with the alias map.
    ckpt = workdir / "ckpt"
    checkpoint.save(ckpt, jaxshare.tie(variables, aliases), force=True)
    log(f"orbax checkpoint {ckpt.name}: alias map {checkpoint.read_alias_map(ckpt)}")

    # 4. Restore and run in Flax.
    restored = checkpoint.restore(ckpt)
    logits = np.asarray(FlaxLM().apply(restored, jnp.asarray(tokens)))
    flax_vs_torch = float(np.abs(logits - expected).max())
    log(f"Flax logits vs PyTorch: max |diff| {flax_vs_torch:.1e}")

    # 5. Back to PyTorch: every tie one tensor again.
    back = bridge.to_torch(restored, checkpoint.read_alias_map(ckpt))
    head_is_embedding = back["lm_head.weight"] is back["wte.weight"]
    fresh = TorchLM().eval()
    fresh.load_state_dict(back, strict=True)
    with torch.no_grad():
        again = fresh(torch.from_numpy(tokens)).numpy()
    back_vs_torch = float(np.abs(again - expected).max())
    log(
        f"to_torch: lm_head.weight is wte.weight: {head_is_embedding}; "
        f"load_state_dict(strict=True) ok; logits max |diff| {back_vs_torch:.1e}"
    )
    bridge.save_safetensors(back, workdir / "back.safetensors")
    report = inspect_safetensors(workdir / "back.safetensors")  # the header alone
    log(f"back.safetensors: ties {dict(report.alias_map)}, {report.bytes_saved} bytes saved")
    return Result(aliases, flax_vs_torch, head_is_embedding, back_vs_torch, report.bytes_saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jaxshare-convert-") as tmp:
        result = run(args.workdir or Path(tmp))
    assert result.flax_vs_torch < 1e-5 and result.back_vs_torch == 0.0 and result.head_is_embedding
    print("done: the tie survived PyTorch -> Flax -> Orbax -> PyTorch")


if __name__ == "__main__":
    main()
