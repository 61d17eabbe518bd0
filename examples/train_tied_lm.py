"""Train a small Flax LM whose output projection is tied to its token embedding.

The model is GPT-2 shaped and written as plain Flax linen with no tying code in
it: a token embedding ``wte``, a position embedding, one pre-norm transformer
block and an ``lm_head`` ``Dense`` layer. So ``model.init`` returns

    params/wte/embedding   (vocab, dim)
    params/lm_head/kernel  (dim, vocab)

and the tie lives only in the parameters, where a PyTorch GPT-2 converted to
Flax has it too: ``lm_head/kernel == wte/embedding.T``. jaxshare says so with
an ``AliasMap`` whose alias carries an axis permutation,

    AliasMap({"params/lm_head/kernel": "params/wte/embedding"},
             transforms={"params/lm_head/kernel": (1, 0)})

held in a ``jaxshare.Tied``. ``jit``, ``grad``, optax and donation see only the
Tied's unique leaves: the embedding is one leaf, the loss reads the full tree
through ``tied.tree`` (which re-creates ``lm_head/kernel`` as the transposed
embedding), the gradients of both uses are summed into that one leaf, and Adam
keeps one ``mu`` and one ``nu`` for it. ``--tie identity`` runs the same story
with an ``lm_head`` that is an ``nn.Embed`` used through ``attend``, so the alias
``params/lm_head/embedding`` is the very same array as the embedding.

The script trains the LM a few hundred steps on a synthetic task built in code
(each token is followed by its image under a fixed random permutation of the
vocabulary, so the loss can fall to about zero; the point is the tie, not the
model) with ``optax.adam`` and ``jax.jit(step, donate_argnums=(0, 1))``, and
asserts:

* the loss falls;
* the tie holds after training: the Tied holds exactly one leaf for it, and the
  full tree's alias is the canonical's transform (the very same object for an
  identity tie), while the same model trained with the tie duplicated (two
  independent leaves, the usual way a converted model is trained) has drifted
  apart;
* the gradient of the tied leaf is the sum of the gradients of both uses;
* params + Adam state bytes against the duplicated model: params smaller by
  the tied bytes, Adam state (``mu`` and ``nu``) by exactly twice the tied bytes;
* donation: a raw tree holding one buffer at two paths (the identity-tied full
  tree) cannot be donated to the jitted step, while its ``Tied`` can.

Run it with ``python examples/train_tied_lm.py`` (``--help`` for the flags);
:func:`run` is the entry point the tests call with a short setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxshare

__all__ = [
    "ALIAS",
    "CANONICAL",
    "Config",
    "Result",
    "Step",
    "TieKind",
    "TiedLM",
    "alias_map",
    "at",
    "donation_demo",
    "duplicate",
    "full_tree",
    "init_tied",
    "main",
    "make_loss",
    "make_step",
    "model_for",
    "run",
    "synthetic_batches",
    "tied_grad_error",
    "train",
    "tree_bytes",
]

TieKind = Literal["transpose", "identity"]
#: The path that is stored: the token embedding, ``(vocab, dim)``.
CANONICAL = "params/wte/embedding"
#: The path that is not stored, per kind of tie.
ALIAS: dict[str, str] = {
    "transpose": "params/lm_head/kernel",  # nn.Dense, (dim, vocab) == embedding.T
    "identity": "params/lm_head/embedding",  # nn.Embed.attend, (vocab, dim) == embedding
}
Params = Any  # a jaxshare.Tied or the full variables dict
Step = Callable[[Params, Any, jax.Array], tuple[Params, Any, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes of the model and the task.

    Attributes:
      vocab: vocabulary size; the tied array is ``(vocab, dim)`` float32.
      dim: model width.
      heads: attention heads.
      seq_len: tokens per sequence fed to the model (the batch holds one more,
        the last target).
      batch: sequences per step.
      learning_rate: Adam's learning rate.
      tie: ``"transpose"`` (``lm_head/kernel == wte/embedding.T``) or
        ``"identity"`` (``lm_head/embedding is wte/embedding``).
      seed: seeds the parameters and the data.
    """

    vocab: int = 128
    dim: int = 32
    heads: int = 2
    seq_len: int = 16
    batch: int = 32
    learning_rate: float = 3e-3
    tie: TieKind = "transpose"
    seed: int = 0


class TiedLM(nn.Module):
    """A one-block GPT-2 shaped LM; the tie is in its parameters, not its code.

    Attributes:
      vocab: vocabulary size.
      dim: model width.
      heads: attention heads.
      max_len: longest sequence (size of the position embedding).
      tie: the kind of ``lm_head``: ``"transpose"`` is an ``nn.Dense`` with a
        ``(dim, vocab)`` kernel, ``"identity"`` an ``nn.Embed`` used through
        ``attend`` with a ``(vocab, dim)`` embedding.
    """

    vocab: int
    dim: int
    heads: int
    max_len: int
    tie: TieKind = "transpose"

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Next-token logits ``(batch, length, vocab)`` for ``tokens`` ``(batch, length)``."""
        x = nn.Embed(self.vocab, self.dim, name="wte")(tokens)
        wpe = self.param("wpe", nn.initializers.normal(0.02), (self.max_len, self.dim))
        x = x + wpe[: tokens.shape[-1]]
        h = nn.LayerNorm(name="ln_1")(x)
        x = x + nn.MultiHeadDotProductAttention(self.heads, name="attn")(
            h, mask=nn.make_causal_mask(tokens)
        )
        h = nn.LayerNorm(name="ln_2")(x)
        x = x + nn.Dense(self.dim, name="mlp_out")(
            nn.gelu(nn.Dense(4 * self.dim, name="mlp_in")(h))
        )
        x = nn.LayerNorm(name="ln_f")(x)
        if self.tie == "transpose":
            return nn.Dense(self.vocab, use_bias=False, name="lm_head")(x)
        return nn.Embed(self.vocab, self.dim, name="lm_head").attend(x)


def model_for(config: Config) -> TiedLM:
    """The :class:`TiedLM` of ``config``."""
    return TiedLM(config.vocab, config.dim, config.heads, config.seq_len, config.tie)


def alias_map(tie: TieKind) -> jaxshare.AliasMap:
    """The tie of :class:`TiedLM` as an ``AliasMap``: ``lm_head`` is an alias of ``wte``.

    >>> alias_map("transpose").transform("params/lm_head/kernel")
    (1, 0)
    >>> alias_map("identity")
    AliasMap({'params/lm_head/embedding': 'params/wte/embedding'})
    """
    alias = ALIAS[tie]
    return jaxshare.AliasMap(
        {alias: CANONICAL}, transforms={alias: (1, 0)} if tie == "transpose" else None
    )


def init_tied(model: TiedLM, key: jax.Array) -> jaxshare.Tied:
    """Initialises ``model`` and ties its ``lm_head`` to its embedding.

    ``model.init`` gives ``lm_head`` its own random values; they are dropped, and
    the Tied re-creates ``lm_head`` from the embedding (``Tied`` checks that the
    unique tree has every canonical and no alias).
    """
    tokens = jnp.zeros((1, model.max_len), jnp.int32)
    variables = jax.jit(model.init)(key, tokens)
    params = {k: v for k, v in variables["params"].items() if k != "lm_head"}
    return jaxshare.Tied({"params": params}, alias_map(model.tie))


def duplicate(tied: jaxshare.Tied) -> dict[str, Any]:
    """The same model with the tie duplicated: the full tree, every leaf its own copy.

    This is what training a converted model without jaxshare does: ``lm_head``
    starts equal to the embedding's transform but is an independent leaf.
    """
    return jax.tree_util.tree_map(jnp.copy, tied.tree)


def full_tree(params: Params) -> Any:
    """The variables ``model.apply`` takes: ``params.tree`` for a Tied, else ``params``."""
    return params.tree if isinstance(params, jaxshare.Tied) else params


def at(tree: Any, path: str) -> Any:
    """The value at a ``'/'``-joined path of nested mappings.

    >>> at({"params": {"wte": {"embedding": 1}}}, "params/wte/embedding")
    1
    """
    return functools.reduce(lambda node, key: node[key], path.split("/"), tree)


def tree_bytes(tree: Any) -> int:
    """Bytes held by the array leaves of ``tree`` (a Tied counts its unique leaves).

    >>> tree_bytes({"a": jnp.zeros((2, 3)), "n": None, "s": "x"})
    24
    """
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))


def make_loss(model: TiedLM) -> Callable[[Params, jax.Array], jax.Array]:
    """The next-token cross-entropy ``loss(params, batch)``; ``params`` is a Tied or a full tree."""

    def loss_fn(params: Params, batch: jax.Array) -> jax.Array:
        logits = model.apply(full_tree(params), batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    return loss_fn


def make_step(model: TiedLM, optimizer: optax.GradientTransformation) -> Step:
    """The jitted training step ``(params, opt_state, batch) -> (params, opt_state, loss)``.

    One function serves a Tied and a plain (duplicated) tree. ``params`` and
    ``opt_state`` are donated: their buffers are reused for the outputs.
    """
    loss_fn = make_loss(model)

    def step(params: Params, opt_state: Any, batch: jax.Array) -> tuple[Params, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def synthetic_batches(config: Config, count: int) -> list[jax.Array]:
    """``count`` batches ``(batch, seq_len + 1)`` of int32 tokens, built in code.

    Each sequence starts at a random token and follows a fixed random
    permutation of the vocabulary, so every next token is predictable from the
    current one and a model can drive the loss toward zero.
    """
    rng = np.random.default_rng(config.seed)
    successor = rng.permutation(config.vocab).astype(np.int32)
    tokens = np.empty((count, config.batch, config.seq_len + 1), np.int32)
    tokens[..., 0] = rng.integers(config.vocab, size=(count, config.batch))
    for t in range(config.seq_len):
        tokens[..., t + 1] = successor[tokens[..., t]]
    return jax.device_put(list(tokens))


def train(
    step: Step,
    params: Params,
    opt_state: Any,
    batches: Sequence[jax.Array],
    steps: int,
    *,
    log: Callable[[str], None] | None = None,
    log_every: int = 50,
) -> tuple[Params, Any, list[float]]:
    """Runs ``steps`` steps over ``batches`` (cycled); returns the new state and the losses."""
    losses = []
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, batches[i % len(batches)])
        losses.append(loss)
        if log is not None and (i % log_every == 0 or i == steps - 1):
            log(f"  step {i:4d}  loss {float(loss):.4f}")
    return params, opt_state, [float(x) for x in losses]


def tied_grad_error(model: TiedLM, tied: jaxshare.Tied, batch: jax.Array) -> float:
    """How far the Tied's gradient of the embedding is from the sum of the
    gradients of its two uses (``wte``, and ``lm_head`` transformed back) taken
    on the full tree as independent leaves: ``max |difference| / max |sum|``."""
    alias = ALIAS[model.tie]
    perm = tied.alias_map.transform(alias)
    inverse = None if perm is None else tuple(int(i) for i in np.argsort(perm))
    loss_fn = make_loss(model)

    @jax.jit
    def both(tied: jaxshare.Tied) -> tuple[jax.Array, jax.Array]:
        g_tied = at(jax.grad(loss_fn)(tied, batch).unique, CANONICAL)
        g_full = jax.grad(loss_fn)(tied.tree, batch)  # every path its own leaf
        g_head = at(g_full, alias)
        g_head = g_head if inverse is None else jnp.transpose(g_head, inverse)
        return g_tied, at(g_full, CANONICAL) + g_head

    g_tied, g_sum = both(tied)
    return float(jnp.max(jnp.abs(g_tied - g_sum)) / jnp.max(jnp.abs(g_sum)))


def donation_demo(config: Config, log: Callable[[str], None] = print) -> str:
    """Donates the identity-tied LM to the jitted step twice: as the raw full
    tree, which holds the embedding's buffer at two paths and fails, and as a
    Tied, which works. Returns the raw tree's error message."""
    model = model_for(dataclasses.replace(config, tie="identity"))
    optimizer = optax.adam(config.learning_rate)
    step = make_step(model, optimizer)
    batch = synthetic_batches(config, 1)[0]
    tied = init_tied(model, jax.random.key(config.seed))
    raw = tied.tree
    assert at(raw, ALIAS["identity"]) is at(raw, CANONICAL), "raw tree should hold one buffer twice"
    log(f"  raw tree: {CANONICAL} and {ALIAS['identity']} are one array, donated twice ...")
    try:
        step(raw, optimizer.init(raw), batch)
    except jax.errors.JaxRuntimeError as e:
        error = str(e).splitlines()[0]
    else:
        raise AssertionError("donating a tree that holds one buffer twice should fail")
    log(f"    fails (XLA logs it to stderr too): {error[:90]}...")
    embedding = at(tied.unique, CANONICAL)
    new, _, loss = step(tied, optimizer.init(tied), batch)
    assert embedding.is_deleted(), "the Tied's embedding should have been donated"
    assert isinstance(new, jaxshare.Tied) and new.alias_map == tied.alias_map
    log(f"  Tied: donated and stepped (loss {float(loss):.4f}); its old embedding buffer is freed")
    return error


@dataclasses.dataclass(frozen=True)
class Result:
    """What :func:`run` measured.

    Attributes:
      losses: the tied model's loss at every step.
      tied_bytes: bytes of the tied array (the embedding).
      params_bytes: ``{"tied": ..., "duplicated": ...}`` bytes of the parameters
        (a Tied counts its unique leaves).
      opt_bytes: the same for the Adam state (``count``, ``mu``, ``nu``).
      leaves: the same for the number of parameter leaves.
      opt_leaves: the same for the number of Adam state leaves.
      tie_error: after training, the largest difference between the Tied's
        alias and its canonical's transform (zero: the tie holds).
      tie_is_identity: for an identity tie, whether the alias is the very same
        object as the canonical after training.
      duplicated_drift: the same difference for the duplicated model trained as
        long: the tie it started with is gone.
      grad_error: relative difference between the Tied's gradient of the
        embedding and the sum of the gradients of both uses.
      donation_error: the error of donating the raw tree that holds one buffer twice.
      seconds: wall time of the whole run.
    """

    losses: list[float]
    tied_bytes: int
    params_bytes: dict[str, int]
    opt_bytes: dict[str, int]
    leaves: dict[str, int]
    opt_leaves: dict[str, int]
    tie_error: float
    tie_is_identity: bool
    duplicated_drift: float
    grad_error: float
    donation_error: str
    seconds: float


def _tie_error(full: Any, tie: TieKind) -> float:
    """Largest difference between ``full``'s alias and its canonical's transform."""
    canonical = at(full, CANONICAL)
    expected = canonical.T if tie == "transpose" else canonical
    return float(jnp.max(jnp.abs(at(full, ALIAS[tie]) - expected)))


def run(
    steps: int = 300, config: Config | None = None, *, log: Callable[[str], None] = print
) -> Result:
    """Trains the tied LM and its duplicated twin, checks the tie, compares bytes.

    Args:
      steps: training steps for each model.
      config: sizes of the model and the task (default: ``Config()``).
      log: where progress and the tables go (``print``; the tests pass a no-op).

    Returns:
      The figures, already checked: a failed check raises ``AssertionError``.
    """
    start = time.perf_counter()
    config = config or Config()
    model = model_for(config)
    optimizer = optax.adam(config.learning_rate)
    step = make_step(model, optimizer)
    batches = synthetic_batches(config, min(steps, 64))
    amap = alias_map(config.tie)
    alias = ALIAS[config.tie]
    log(f"TiedLM vocab={config.vocab} dim={config.dim}: {amap!r}")

    tied = init_tied(model, jax.random.key(config.seed))
    dup = duplicate(tied)
    tied_bytes = tree_bytes(at(tied.unique, CANONICAL))
    figures = {"tied": (tied, optimizer.init(tied)), "duplicated": (dup, optimizer.init(dup))}
    params_bytes = {k: tree_bytes(p) for k, (p, _) in figures.items()}
    opt_bytes = {k: tree_bytes(s) for k, (_, s) in figures.items()}
    leaves = {k: len(jax.tree_util.tree_leaves(p)) for k, (p, _) in figures.items()}
    opt_leaves = {k: len(jax.tree_util.tree_leaves(s)) for k, (_, s) in figures.items()}

    log(f"training the tied model (jaxshare.Tied), {steps} steps:")
    tied, _, losses = train(step, *figures["tied"], batches, steps, log=log)
    log(f"training the duplicated model (two independent leaves), {steps} steps:")
    dup, _, dup_losses = train(step, *figures["duplicated"], batches, steps)
    log(f"  step {steps - 1:4d}  loss {dup_losses[-1]:.4f}")

    full = tied.tree
    tie_error = _tie_error(full, config.tie)
    tie_is_identity = at(full, alias) is at(full, CANONICAL)
    duplicated_drift = _tie_error(dup, config.tie)
    grad_error = tied_grad_error(model, tied, batches[0])
    log("donation under jax.jit(step, donate_argnums=(0, 1)):")
    donation_error = donation_demo(config, log)
    result = Result(
        losses=losses,
        tied_bytes=tied_bytes,
        params_bytes=params_bytes,
        opt_bytes=opt_bytes,
        leaves=leaves,
        opt_leaves=opt_leaves,
        tie_error=tie_error,
        tie_is_identity=tie_is_identity,
        duplicated_drift=duplicated_drift,
        grad_error=grad_error,
        donation_error=donation_error,
        seconds=time.perf_counter() - start,
    )
    _report(result, config, log)
    _check(result, config)
    return result


def _report(r: Result, config: Config, log: Callable[[str], None]) -> None:
    pb, ob = r.params_bytes, r.opt_bytes
    log("")
    log(f"{'bytes':<34}{'params':>12}{'Adam state':>14}")
    for kind, label in (
        ("tied", "tied (jaxshare.Tied)"),
        ("duplicated", "duplicated (independent leaves)"),
    ):
        log(f"{label:<34}{pb[kind]:>12,}{ob[kind]:>14,}")
    dp, do = pb["duplicated"] - pb["tied"], ob["duplicated"] - ob["tied"]
    log(f"{'saved by the tie':<34}{dp:>12,}{do:>14,}")
    log(
        f"{'  in tied arrays (' + format(r.tied_bytes, ',') + ' B each)':<34}"
        f"{dp / r.tied_bytes:>11g}x{do / r.tied_bytes:>13g}x"
    )
    log("")
    alias = ALIAS[config.tie]
    log(f"loss {r.losses[0]:.4f} -> {r.losses[-1]:.4f} over {len(r.losses)} steps")
    if r.tie_is_identity:
        how = "is the same object as"
    else:
        how = "== transpose of" if config.tie == "transpose" else "equals, as a copy,"
    log(
        f"tie after training: {alias} {how} {CANONICAL} (max diff {r.tie_error:g}); "
        f"one leaf in the Tied ({r.leaves['tied']} leaves vs {r.leaves['duplicated']})"
    )
    log(f"duplicated model's lm_head drifted from the embedding: max diff {r.duplicated_drift:.3g}")
    log(f"tied gradient == sum of both uses' gradients: relative diff {r.grad_error:.2g}")
    log(f"done in {r.seconds:.1f} s")


def _check(r: Result, config: Config) -> None:
    """The example's claims, as assertions."""
    first, last = r.losses[0], float(np.mean(r.losses[-5:]))
    assert last < 0.5 * first, f"loss did not fall: {first:.4f} -> {last:.4f}"
    assert r.tie_error == 0.0, f"tie broken after training: max diff {r.tie_error}"
    assert r.tie_is_identity == (config.tie == "identity"), "alias is not its canonical's object"
    assert r.leaves["tied"] == r.leaves["duplicated"] - 1, r.leaves
    assert r.opt_leaves["tied"] == r.opt_leaves["duplicated"] - 2, r.opt_leaves
    assert r.params_bytes["duplicated"] - r.params_bytes["tied"] == r.tied_bytes, r.params_bytes
    assert r.opt_bytes["duplicated"] - r.opt_bytes["tied"] == 2 * r.tied_bytes, r.opt_bytes
    assert r.duplicated_drift > 0.0, "the duplicated model should have lost its tie"
    assert r.grad_error < 1e-5, f"tied gradient is not the sum of both uses: {r.grad_error}"
    assert "same buffer twice" in r.donation_error, r.donation_error


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python examples/train_tied_lm.py [--steps N] [--tie KIND] ...``."""
    defaults = Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")
    parser.add_argument(
        "--tie",
        choices=["transpose", "identity"],
        default=defaults.tie,
        help="lm_head/kernel == wte/embedding.T, or lm_head/embedding is "
        "wte/embedding (default: transpose)",
    )
    parser.add_argument("--vocab", type=int, default=defaults.vocab)
    parser.add_argument("--dim", type=int, default=defaults.dim)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    if args.steps < 10:
        parser.error("--steps must be at least 10 for the loss to fall")
    config = dataclasses.replace(
        defaults, tie=args.tie, vocab=args.vocab, dim=args.dim, batch=args.batch, seed=args.seed
    )
    run(args.steps, config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
