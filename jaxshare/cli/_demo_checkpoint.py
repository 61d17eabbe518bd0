"""The checkpoint part of ``jaxshare demo``: a CheckpointManager that keeps ties."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import TextIO, cast

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from jaxshare import AliasMap, Tied, tie
from jaxshare.checkpoint import SharedRestore, SharedSave, inspect
from jaxshare.cli._render import print_report

__all__ = ["demo_story"]


def _tied_model() -> Tied:
    """A small LM whose decoder reuses the embedding and whose head is its transpose."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    emb = jax.random.normal(k1, (64, 16)) * 0.1
    full = {
        "params": {
            "wte": {"embedding": emb},
            "decoder": {"embedding": emb},
            "mlp": {"kernel": jax.random.normal(k2, (16, 16)) * 0.1, "bias": jnp.zeros(16)},
            "lm_head": {"kernel": emb.T},
        }
    }
    ties = AliasMap(
        {
            "params/decoder/embedding": "params/wte/embedding",
            "params/lm_head/kernel": "params/wte/embedding",
        },
        transforms={"params/lm_head/kernel": (1, 0)},
    )
    return tie(full, ties)


def demo_story(workdir: pathlib.Path, say: Callable[[str], None]) -> None:
    """Saves a tied model at three steps with a CheckpointManager, restores it, inspects it."""
    model = _tied_model()
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    with ocp.CheckpointManager(workdir, options=options) as manager:
        for step in (1, 2, 3):
            model = model.replace(jax.tree.map(lambda x: x * 0.9, model.unique))
            manager.save(
                step,
                args=ocp.args.Composite(
                    params=SharedSave(model), meta=ocp.args.JsonSave({"step": step})
                ),
            )
        manager.wait_until_finished()
        say(f"async saves of steps 1-3 with max_to_keep=2 keep steps {manager.all_steps()}")
        step = manager.latest_step()
        restored = manager.restore(
            step, args=ocp.args.Composite(params=SharedRestore(), meta=ocp.args.JsonRestore())
        )
        as_tied = manager.restore(
            step, args=ocp.args.Composite(params=SharedRestore(jax.eval_shape(lambda: model)))
        ).params
    p = restored.params["params"]
    say(
        "restored step "
        f"{restored.meta['step']}: decoder/embedding is wte/embedding (the same jax.Array)? "
        f"{p['decoder']['embedding'] is p['wte']['embedding']}"
    )
    say(
        "lm_head/kernel == wte/embedding.T? "
        f"{bool(jnp.array_equal(p['lm_head']['kernel'], p['wte']['embedding'].T))}"
    )
    n = len(as_tied.alias_map)
    say(f"restored into a Tied target: {type(as_tied).__name__} with {n} aliases")
    item = workdir / str(step) / "params"
    plain = ocp.StandardCheckpointer().restore(item)
    say(f"plain Orbax reads the item as the unique tree: {sorted(plain['params'])}")
    say(f"$ jaxshare inspect {item}")
    print_report(inspect(item), cast(TextIO, _Say(say)))


class _Say:
    """A text stream that hands complete lines to ``say``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._pending = ""

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            self._say(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False
