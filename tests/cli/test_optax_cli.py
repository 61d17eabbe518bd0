"""``jaxshare convert run.pt RUN --optimizer``, a Flax loop resuming from it, the way
back to a ``.pt`` that torch loads, and ``jaxshare inspect`` of the optimizer state."""

from __future__ import annotations

import json

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import torch
import transformers

import bridge
from bridge.training.optax_state import moments_of
from jaxshare.checkpoint import SharedRestore
from jaxshare.cli import main


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    named = list(model.named_parameters())
    decay = [(n, p) for n, p in named if p.ndim >= 2]
    rest = [(n, p) for n, p in named if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
    )


@pytest.fixture
def run(tmp_path):
    model = build()
    opt = make_optimizer(model)
    for seed in range(3):
        batch = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(seed))
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
    path = tmp_path / "run.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    return path, model, opt


def test_convert_writes_a_step_a_flax_loop_resumes_and_the_way_back(run, tmp_path, capsys):
    path, model, opt = run
    out = tmp_path / "ckpts"
    assert main(["convert", str(path), str(out), "--optimizer", "--quiet"]) == 0
    assert sorted(p.name for p in (out / "3").iterdir() if p.is_dir()) == [
        "opt_state",
        "optimizer",
        "params",
    ]
    # A Flax loop resumes: the record rebuilds tx, and the abstract state restores.
    with ocp.CheckpointManager(out.absolute()) as manager:
        step = manager.latest_step()
        meta = manager.restore(
            step, args=ocp.args.Composite(params=SharedRestore(), optimizer=ocp.args.JsonRestore())
        )
    assert step == 3 and meta.optimizer["kind"] == "adam"
    from jaxshare import checkpoint, tie

    params = tie(meta.params, checkpoint.read_alias_map(out / "3" / "params"))
    tx = bridge.optax_for(meta.optimizer)
    with ocp.CheckpointManager(out.absolute()) as manager:
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                opt_state=ocp.args.StandardRestore(jax.eval_shape(tx.init, params))
            ),
        )
    adam = moments_of(restored.opt_state, "adam")
    kernel = "params/transformer/h/0/mlp/c_proj/kernel"  # a GPT-2 Conv1D: (in, out) already
    want = opt.state[model.transformer.h[0].mlp.c_proj.weight]["exp_avg"].numpy()
    assert np.array_equal(np.asarray(adam["mu"][kernel]), want)
    assert "params/lm_head/kernel" in params.alias_map  # the tie, held once
    updates, _ = tx.update(jax.tree.map(np.zeros_like, params), restored.opt_state, params)
    assert optax.tree_utils.tree_norm(updates) > 0  # (weight decay moves it: a live state)
    # The way back needs no flags: torch.load and both load_state_dict take it.
    back = tmp_path / "back.pt"
    assert main(["convert", str(out), str(back), "--quiet"]) == 0
    loaded = torch.load(back, weights_only=True)
    fresh = build()
    fresh_opt = make_optimizer(fresh)
    fresh.load_state_dict(loaded["model"])
    fresh_opt.load_state_dict(loaded["optimizer"])
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    for (_, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(p, q)
        for slot, value in opt.state[p].items():
            assert torch.equal(fresh_opt.state[q][slot], value), slot
    assert fresh_opt.param_groups[0]["lr"] == 1e-2
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_inspect_shows_the_optimizer_state(run, capsys):
    path, _, _ = run
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "optimizer state (torch): Adam/AdamW, step 3, 2 param group(s)" in text
    assert "exp_avg_sq: 16 tensors" in text
    assert main(["inspect", "--json", str(path)]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes[-3].startswith("optimizer state (torch): Adam/AdamW, step 3")


def test_bad_input_is_one_line(run, tmp_path, capsys):
    path, _, _ = run
    assert main(["convert", str(path), str(tmp_path / "x.safetensors"), "--optimizer"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--optimizer writes a CheckpointManager directory" in err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["convert", str(path), str(tmp_path / "taken"), "--optimizer", "--quiet"]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["convert", str(path), str(tmp_path / "taken"), "--optimizer", "--force"]) == 1
    assert "not an output of the same kind" in capsys.readouterr().err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    model = torch.nn.Linear(4, 4, bias=False)
    muon = torch.optim.Muon(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    muon.step()
    torch.save({"model": model.state_dict(), "optimizer": muon.state_dict()}, tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    assert main(["convert", str(tmp_path / "m.pt"), str(tmp_path / "m"), "--optimizer"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ns_steps" in err
    assert not (tmp_path / "m").exists() and (tmp_path / "m.pt").read_bytes() == before
