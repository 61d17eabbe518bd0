"""DeepSpeed ZeRO runs resumed in optax and back (the fixtures of
``tests/data/deepspeed_optim``: three AdamW steps, then five more recorded with their
gradients): moments and fp32 masters bit-equal after conversion, and both sides agreeing
with DeepSpeed's own five next steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optax
import pytest
import torch
import transformers

import bridge
from bridge.training.optax_state import moments_of
from bridge.training.to_optax import SlotAsParams
from jaxshare import formats, tie

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_optim"
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.is_dir())


def _flax_of(params) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """``{PyTorch name: (Flax path, permutation)}`` of the params' stored leaves."""
    naming = params.alias_map.naming
    held = {path: naming[path] for path in naming if path not in params.alias_map}
    return {n.torch: (path, n.permute) for path, n in held.items()}


def _at(tree, path: str):
    for part in path.split("/"):
        tree = tree[part]
    return np.asarray(tree)


def _laid(t: torch.Tensor, perm) -> np.ndarray:
    a = t.float().numpy()
    return a if perm is None else a.transpose(perm)


def _grads(folder: Path, grads: dict[str, torch.Tensor]):
    """The recorded gradient placed as the params are (frozen parameters: zeros)."""
    params, _ = formats.read_deepspeed_training(folder)
    slot = formats.SlotSource("grad", {k: v.float().numpy() for k, v in grads.items()})
    return tie(*bridge.to_flax(SlotAsParams(params, slot)))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-30)


@pytest.mark.parametrize("name", FIXTURES)
def test_zero_run_resumes_in_optax_and_back(name):
    folder = DATA / name
    ref = torch.load(folder / "optimizer_reference.pt", weights_only=True)
    more = torch.load(folder / "continuation.pt", weights_only=True)
    consolidated = torch.load(folder / "reference.pt", weights_only=True)  # zero_to_fp32's
    _, state = formats.read_deepspeed_training(folder)
    tx = bridge.optax_for(state)  # AdamW over two groups, the frozen parameter set to zero
    params, opt_state = bridge.to_optax(folder, tx)
    where = _flax_of(params)
    moments = moments_of(opt_state, "adam")
    for torch_name, (path, perm) in where.items():
        want = ref["fp32_params"].get(torch_name, consolidated.get(torch_name))
        if want is not None:  # (ZeRO-1's zero_to_fp32 leaves the frozen one out.)
            assert np.array_equal(_at(params.unique, path), _laid(want, perm)), torch_name
        if torch_name in ref["frozen"]:
            continue
        for slot, field in (("exp_avg", "mu"), ("exp_avg_sq", "nu")):
            got = np.asarray(moments[field][path])
            assert np.array_equal(got, _laid(ref[slot][torch_name], perm)), (slot, torch_name)
    assert len(moments["mu"]) == len(ref["exp_avg"])  # each tie's state held once
    # Five more steps: optax on DeepSpeed's recorded gradients, against its masters.
    p, s = params, opt_state
    for k in range(len(more["grads"])):
        updates, s = tx.update(_grads(folder, more["grads"][k]), s, p)
        p = optax.apply_updates(p, updates)
        got = bridge.to_torch(p)
        for torch_name, want in more["params"][k].items():
            assert rel(got[torch_name].numpy(), want.float().numpy()) <= 1e-5, (k, torch_name)
    # The way back: a torch model and AdamW load both state dicts and go on the same way.
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(config)
    groups = [list(g.names) for g in state.groups]
    sd, osd = bridge.from_optax(params, opt_state, tx, like=model, groups=groups)
    model.load_state_dict(sd)
    by_name = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [by_name[n] for n in g]} for g in groups])
    opt.load_state_dict(osd)
    assert [g["lr"] for g in opt.param_groups] == [g.hyper["lr"] for g in state.groups]
    for k in range(len(more["grads"])):
        for n, q in by_name.items():
            q.grad = more["grads"][k][n].float() if n in more["grads"][k] else None
        opt.step()
        for torch_name, want in more["params"][k].items():
            assert rel(by_name[torch_name].detach().numpy(), want.float().numpy()) <= 1e-5, (
                k,
                torch_name,
            )
