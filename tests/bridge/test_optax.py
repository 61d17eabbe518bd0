"""``bridge.to_optax`` / ``bridge.from_optax``: a torch training run resumed in optax and
back, moments bit-equal, and the two sides agreeing step for step."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
from jaxshare import tie

STEPS, MORE = 3, 5
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    t = transformers
    if kind == "gpt2":  # lm_head tied to transformer.wte
        config = t.GPT2Config(
            n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return t.GPT2LMHeadModel(config).train()
    config = t.LlamaConfig(
        vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return t.LlamaForCausalLM(config).train()


def batches(model: torch.nn.Module, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (2, 8), generator=g) for _ in range(n)]


def groups_of(model: torch.nn.Module) -> list[list[str]]:
    """The Hugging Face Trainer's two groups: weight decay for matrices, none for the rest."""
    named = list(model.named_parameters())
    return [[n for n, p in named if p.ndim >= 2], [n for n, p in named if p.ndim < 2]]


def make_optimizer(model: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    by_name = dict(model.named_parameters())
    decay, rest = ([by_name[n] for n in g] for g in groups_of(model))
    if kind == "adamw":  # (Named groups: torch.save keeps each group's param_names.)
        decay, rest = ([(n, by_name[n]) for n in g] for g in groups_of(model))
        groups = [{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=WD)


def optax_tx(kind: str) -> optax.GradientTransformation:
    """What a JAX user writes for the same optimizer."""
    if kind == "adamw":
        decay = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731
        return optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD, mask=decay)
    if kind == "adam":
        return optax.chain(
            optax.add_decayed_weights(WD), optax.adam(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS)
        )
    return optax.chain(optax.add_decayed_weights(WD), optax.sgd(0.1, momentum=0.9))


def torch_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    opt.zero_grad()
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()


def grads_step(model: torch.nn.Module, opt: torch.optim.Optimizer, holder, batch) -> object:
    """One torch step, and its gradient placed as the params are: ``holder`` (a copy of
    the model) takes the gradients as its weights and goes through ``to_flax``. Both sides
    step on this one gradient, so what is compared is the optimizers alone (a gradient
    recomputed at each side's own weights would differ in the last bits, and Adam turns
    noise-level gradients -- GPT-2's key bias has none in theory -- into full steps)."""
    opt.zero_grad()
    model(input_ids=batch, labels=batch).loss.backward()
    with torch.no_grad():
        for (_, p), (_, q) in zip(model.named_parameters(), holder.named_parameters(), strict=True):
            q.copy_(p.grad)
    opt.step()
    grads = tie(*bridge.to_flax(holder))  # (over the holder's memory: copied, to go on)
    return jax.block_until_ready(jax.tree.map(lambda x: x.copy(), grads))


def step_with(model: torch.nn.Module, opt: torch.optim.Optimizer, holder) -> None:
    """A torch step on the gradient ``holder`` holds."""
    for (_, p), (_, q) in zip(model.named_parameters(), holder.named_parameters(), strict=True):
        p.grad = q.detach().clone()
    opt.step()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(float(b.abs().max()), 1e-30)
    return float((a - b).abs().max()) / scale


def assert_agree(got: dict[str, torch.Tensor], model: torch.nn.Module, step: int) -> None:
    for name, want in model.state_dict().items():
        assert rel(got[name], want) <= 1e-5, (step, name, rel(got[name], want))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def run(request):
    """A model trained STEPS steps with AdamW (two groups, weight decay) in fp32."""
    model = build(request.param)
    opt = make_optimizer(model, "adamw")
    for batch in batches(model, STEPS, 0):
        torch_step(model, opt, batch)
    return request.param, model, opt


def test_moments_bit_equal_with_transposes_and_the_tie_once(run):
    kind, model, opt = run
    params, state = bridge.to_optax((model, opt), optax_tx("adamw"))
    variables, _ = bridge.to_flax(model)
    assert jax.tree.structure(params) == jax.tree.structure(tie(*bridge.to_flax(model)))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(params), jax.tree.leaves(tie(*bridge.to_flax(model))), strict=True
        )
    )
    adam = state[0]  # masked adamw: chain(scale_by_adam, masked decay, lr)
    assert int(adam.count) == STEPS
    named = dict(model.named_parameters())
    for torch_name, flax_path, transposed in CHECKS[kind]:
        p = named[torch_name]
        for slot, tree in (("exp_avg", adam.mu), ("exp_avg_sq", adam.nu)):
            want = opt.state[p][slot].numpy()
            got = np.asarray(_at(tree.unique, flax_path))
            assert np.array_equal(got, want.T if transposed else want), (slot, flax_path)
    leaves = jax.tree.leaves(adam.mu)
    assert len(leaves) == len(list(model.parameters()))  # one entry per tie
    if kind == "gpt2":
        assert "params/lm_head/kernel" in adam.mu.alias_map
        assert "lm_head" not in adam.mu.unique["params"]


CHECKS = {
    "gpt2": [
        ("transformer.wte.weight", "params/transformer/wte/embedding", False),
        ("transformer.h.0.attn.c_attn.weight", "params/transformer/h/0/attn/c_attn/kernel", False),
        ("transformer.ln_f.weight", "params/transformer/ln_f/scale", False),
    ],
    "llama": [
        ("model.layers.0.self_attn.q_proj.weight",
         "params/model/layers/0/self_attn/q_proj/kernel", True),
        ("lm_head.weight", "params/lm_head/kernel", True),
        ("model.embed_tokens.weight", "params/model/embed_tokens/embedding", False),
    ],
}  # fmt: skip


def _at(tree, path: str):
    for part in path.split("/"):
        tree = tree[part]
    return tree


def saved(route: str, model: torch.nn.Module, opt: torch.optim.Optimizer, tmp_path):
    """The run as ``to_optax`` takes it: in memory, a torch.save run file, a DCP folder."""
    if route == "memory":
        return (model, opt)
    if route == "file":
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "run.pt"
        )
        return tmp_path / "run.pt"
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one process: torch.distributed is not started)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp_path / "dcp")
    return tmp_path / "dcp"


ROUTES = [
    ("gpt2", "adamw", "memory"),
    ("llama", "adamw", "memory"),
    ("gpt2", "adamw", "file"),
    ("llama", "adamw", "dcp"),
    ("llama", "adam", "memory"),
    ("gpt2", "sgd", "file"),
]


@pytest.mark.parametrize(("kind", "opt_kind", "route"), ROUTES)
def test_optax_and_torch_agree_for_five_more_steps_and_the_way_back(
    kind, opt_kind, route, tmp_path
):
    model = build(kind)
    opt = make_optimizer(model, opt_kind)
    for batch in batches(model, STEPS, 0):
        torch_step(model, opt, batch)
    tx = optax_tx(opt_kind)
    params, state = bridge.to_optax(saved(route, model, opt, tmp_path), tx)
    start_params, start_state = params, state
    # The way back, before anything moves: bit for bit what torch holds.
    sd, osd = bridge.from_optax(params, state, tx, like=model, groups=opt)
    back = build(kind)
    back_opt = make_optimizer(back, opt_kind)
    back.load_state_dict(sd)
    back_opt.load_state_dict(osd)
    for (_, p), (_, q) in zip(model.named_parameters(), back.named_parameters(), strict=True):
        for slot, value in opt.state[p].items():
            assert torch.equal(back_opt.state[q][slot], value), slot
    # Five more steps on each side, from the same point, on the same batches.
    holder = build(kind)
    for k, batch in enumerate(batches(model, MORE, 1)):
        g = grads_step(model, opt, holder, batch)
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        step_with(back, back_opt, holder)
        assert_agree(bridge.to_torch(params, like=model), model, k)
        assert_agree(back.state_dict(), model, k)
    del start_params, start_state


def test_chain_with_clipping_and_a_schedule():
    model = build("llama")
    opt = make_optimizer(model, "adamw")
    for batch in batches(model, STEPS, 0):
        torch_step(model, opt, batch)
    # The torch lr is the schedule's value at the step (a scheduler stepped with the optimizer).
    sched = optax.piecewise_constant_schedule(LR, {STEPS + 10: 0.1})
    decay = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(sched, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD, mask=decay),
    )
    params, state = bridge.to_optax((model, opt), tx)
    counts = [int(x) for x in jax.tree.leaves(state) if getattr(x, "dtype", None) == np.int32]
    assert counts and set(counts) == {STEPS}


MISMATCHES = [
    (lambda: optax.adamw(1e-3, b1=0.9, b2=0.95, weight_decay=WD), r"lr: torch 0\.01, optax 0\.001"),
    (
        lambda: optax.adamw(LR, b1=0.8, b2=0.95, weight_decay=WD),
        r"betas\[0\]: torch 0\.9, optax 0\.8.*param group 1 .*decoupled weight_decay \(AdamW\): "
        r"torch 0, optax 0\.1",
    ),
    (lambda: optax.adam(LR, b1=0.9, b2=0.999), r"betas\[1\]: torch 0\.95, optax 0\.999"),
    (
        lambda: optax.adamw(LR, b1=0.9, b2=0.95, eps=1e-6, weight_decay=WD),
        r"eps: torch 1e-08, optax 1e-06",
    ),
    (lambda: optax.sgd(0.1, momentum=0.9), r"Adam/AdamW .*`tx` keeps SGD state"),
    (
        lambda: optax.chain(optax.add_decayed_weights(WD), optax.adam(LR, b1=0.9, b2=0.95)),
        r"L2 weight_decay \(added to the gradient\): torch 0, optax 0\.1",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("make_tx", "match"), MISMATCHES)
def test_a_tx_that_differs_is_one_line_naming_both_sides(run, make_tx, match):
    _, model, opt = run
    with pytest.raises(ValueError, match=match) as e:
        bridge.to_optax((model, opt), make_tx())
    assert "\n" not in str(e.value)


def _muon():
    model = torch.nn.Linear(4, 4, bias=False)
    opt = torch.optim.Muon(model.parameters(), lr=1e-2)
    return model, opt


def _adafactor():
    model = torch.nn.Linear(4, 4, bias=False)
    return model, torch.optim.Adafactor(model.parameters(), lr=1e-2)


def _per_param_lr():
    model = torch.nn.Linear(4, 4, bias=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


UNKNOWN = [
    (_muon, optax.sgd(1e-2, momentum=0.95), r"ns_coefficients.*ns_steps"),
    (_adafactor, optax.adam(1e-2), r"row_var|col_var|beta2_decay"),
    (_per_param_lr, optax.adam(1e-2), r"weight: lr"),
]


@pytest.mark.parametrize(("make", "tx", "match"), UNKNOWN)
def test_unknown_state_is_one_line_never_a_reset(make, tx, match):
    model, opt = make()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    if make is _per_param_lr:
        opt.state[model.weight]["lr"] = 0.5  # what some optimizers keep per parameter
    with pytest.raises(ValueError, match=match) as e:
        bridge.to_optax((model, opt), tx)
    assert "\n" not in str(e.value)


def test_steps_that_differ_are_one_line():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(3)).sum().backward()
    opt.step()
    opt.state[model.bias]["step"] = torch.tensor(7.0)
    with pytest.raises(ValueError, match=r"steps differ \('weight' at 1, 'bias' at 7\)"):
        bridge.to_optax((model, opt), optax.adam(1e-3))


def test_optax_for_builds_the_groups_tx(run):
    _, model, opt = run
    from bridge.training.state import read_training

    state = read_training((model, opt)).optimizer
    tx = bridge.optax_for(state)
    params, opt_state = bridge.to_optax((model, opt), tx)
    sd, osd = bridge.from_optax(params, opt_state, tx, like=model)
    assert [g["weight_decay"] for g in osd["param_groups"]] == [WD, 0.0]
    assert [len(g["params"]) for g in osd["param_groups"]] == [len(g) for g in groups_of(model)]


@settings(max_examples=12, deadline=None)
@given(
    vocab=st.integers(1, 6),
    width=st.integers(1, 5),
    tied=st.booleans(),
    sgd=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_way_back_inverts_to_optax_bit_for_bit(vocab, width, tied, sgd, seed):
    """``from_optax(*to_optax(run))`` is the run again: weights, moments, step, groups."""
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict(
        {"wte": torch.nn.Embedding(vocab, width), "lm_head": torch.nn.Linear(width, vocab)}
    )
    if tied:
        model.lm_head.weight = model.wte.weight
    if sgd:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        tx = optax.sgd(0.1, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        tx = optax.adamw(1e-2, weight_decay=0.1)
    model.lm_head(model.wte(torch.arange(vocab))).square().sum().backward()
    opt.step()
    g = torch.Generator().manual_seed(seed)
    for state in opt.state.values():  # any values: the law holds bit for bit
        for slot, value in state.items():
            if slot != "step":
                value.copy_(torch.randn(value.shape, generator=g).abs())
    params, opt_state = bridge.to_optax((model, opt), tx)
    sd, osd = bridge.from_optax(params, opt_state, tx, like=model, groups=opt)
    for name, value in model.state_dict().items():
        assert torch.equal(sd[name], value), name
    if tied:
        assert sd["lm_head.weight"] is sd["wte.weight"]
    ids = {id(p): i for i, p in enumerate(opt.param_groups[0]["params"])}
    for p, state in opt.state.items():
        got = osd["state"][ids[id(p)]]
        for slot, value in state.items():
            assert torch.equal(got[slot], value), slot


def _tiny_run():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"wte": torch.nn.Embedding(5, 3), "lm_head": torch.nn.Linear(3, 5, bias=False)}
    )
    model.lm_head.weight = model.wte.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(2):
        opt.zero_grad()
        model.lm_head(model.wte(torch.arange(4))).sum().backward()
        opt.step()
    return model, opt


def test_inject_hyperparams_and_a_target_tree():
    model, opt = _tiny_run()
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=0.01)
    _, state = bridge.to_optax((model, opt), tx)
    assert int(state.count) == int(state.inner_state[0].count) == 2
    like = jax.eval_shape(lambda: bridge.to_flax(model)[0]["params"])  # no collection
    params, state = bridge.to_optax((model, opt), optax.adamw(1e-2, weight_decay=0.01), like=like)
    assert dict(params.alias_map) == {"lm_head/kernel": "wte/embedding"}
    want = opt.state[model.wte.weight]["exp_avg_sq"].numpy()
    assert np.array_equal(state[0].nu.unique["wte"]["embedding"], want)


def test_a_transform_that_changes_the_update_is_refused():
    model, opt = _tiny_run()
    tx = optax.chain(optax.adamw(1e-2, weight_decay=0.01), optax.scale_by_trust_ratio())
    with pytest.raises(ValueError, match="`tx` does not make the torch optimizer's update"):
        bridge.to_optax((model, opt), tx)
