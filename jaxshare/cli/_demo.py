"""``jaxshare demo``: the whole story on a small built-in tied model.

1. The problem: JAX keeps no tie (``jit`` copies, donation of one buffer twice
   fails).
2. The core: ``find_shared`` -> ``AliasMap`` -> ``Tied``; training steps with
   donation where the gradient of both uses lands in one leaf.
3. Checkpoints (``jaxshare.checkpoint``): save with a CheckpointManager,
   restore with ties as identity, ``inspect``.
4. PyTorch (``bridge``, when torch is installed): a tied torch model to Flax and
   back, ``load_state_dict(strict=True)``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxshare import AliasMap, Tied, find_shared, tie

__all__ = ["run", "core_story", "tiny_lm"]

VOCAB, DIM = 32, 16


def tiny_lm(seed: int = 0) -> dict:
    """Params of a one-layer LM whose output projection is its embedding, transposed."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    embedding = jax.random.normal(k1, (VOCAB, DIM)) * 0.1
    return {
        "params": {
            "wte": {"embedding": embedding},
            "mlp": {"kernel": jax.random.normal(k2, (DIM, DIM)) * 0.1, "bias": jnp.zeros(DIM)},
            "lm_head": {"kernel": embedding.T},
        }
    }


def _loss(params: dict, tokens: jax.Array) -> jax.Array:
    p = params["params"]
    x = p["wte"]["embedding"][tokens[:-1]]
    x = x + jnp.tanh(x @ p["mlp"]["kernel"] + p["mlp"]["bias"])
    logits = x @ p["lm_head"]["kernel"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(tokens.shape[0] - 1), tokens[1:]])


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silences file descriptor 2 (C++ logging included) for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def core_story(say: Callable[[str], None]) -> Tied:
    """The core on ``tiny_lm``; returns the trained ``Tied``."""
    say("== 1. JAX keeps no tie ==")
    w = jnp.ones(4)
    a, b = jax.jit(lambda x: (x, x))(w)
    say(f"jax.jit(lambda x: (x, x)) returns the same array twice? {a is b}")
    try:
        with _quiet_stderr():  # XLA also logs the error we provoke from C++.
            jax.jit(lambda t: t, donate_argnums=0)({"a": w, "b": w})
        say("donating {'a': w, 'b': w}: worked")
    except Exception as e:  # XLA's own error type varies by backend.
        say(f"donating {{'a': w, 'b': w}} fails: {str(e).splitlines()[0][:90]}")

    say("\n== 2. find_shared, AliasMap, Tied ==")
    full = tiny_lm()
    tie_map = AliasMap(
        {"params/lm_head/kernel": "params/wte/embedding"},
        transforms={"params/lm_head/kernel": (1, 0)},
    )
    say(f"the embedding reused as lm_head (transposed): {tie_map!r}")
    same = {"encoder": full["params"]["wte"], "decoder": full["params"]["wte"]}
    say(f"find_shared of an encoder/decoder sharing one embedding: {find_shared(same)!r}")
    params = tie(full, tie_map)
    n_full, n_tied = len(jax.tree_util.tree_leaves(full)), len(jax.tree_util.tree_leaves(params))
    say(f"leaves: full tree {n_full}, Tied {n_tied} (the tie is one leaf)")

    def step(p: Tied, tokens: jax.Array) -> tuple[Tied, jax.Array]:
        loss, grads = jax.value_and_grad(lambda p: _loss(p.tree, tokens))(p)
        return jax.tree.map(lambda x, g: x - 0.5 * g, p, grads), loss

    donating = jax.jit(step, donate_argnums=0)
    tokens = jnp.arange(64) % VOCAB
    first = None
    for _ in range(60):
        params, loss = donating(params, tokens)
        first = float(loss) if first is None else first
    retied = params.tree["params"]
    holds = bool(jnp.array_equal(retied["lm_head"]["kernel"], retied["wte"]["embedding"].T))
    say(f"60 SGD steps with donate_argnums=0: loss {first:.3f} -> {float(loss):.3f}")
    say(f"after training, lm_head/kernel == wte/embedding.T: {holds}")
    return params


def run(workdir: str | Path | None = None, say: Callable[[str], None] = print) -> None:
    """Runs every story; checkpoints go under ``workdir`` (a temp dir by default)."""
    with tempfile.TemporaryDirectory(prefix="jaxshare-demo-") as tmp:
        root = Path(workdir).absolute() if workdir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        core_story(say)
        from jaxshare.cli._demo_checkpoint import demo_story as checkpoint_story

        say("\n== 3. Orbax checkpoints that keep ties ==")
        checkpoint_story(root / "checkpoint", say)
        say("\n== 4. PyTorch <-> Flax with ties kept ==")
        try:
            from jaxshare.cli._demo_torch import demo_story as torch_story
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            say("(skipped: torch is not installed; `pip install 'jaxshare[torch]'`)")
            return
        torch_story(root / "bridge", say)
