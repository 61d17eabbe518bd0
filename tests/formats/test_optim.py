"""A PyTorch optimizer's state read with numpy only: ``jaxshare.formats.optim``.

Real torch optimizers (Adam, AdamW with weight decay, Adam with ``amsgrad``, SGD
with momentum) train a tiny model a few steps -- one whose head is tied to its
embedding (one ``Parameter``, one state) and one without a tie -- and are saved with
``torch.save({"model": ..., "optimizer": ...})``; the reader must give back every
slot bit for bit, the steps, the groups and their hyper-parameters, and each tie
once, under its canonical name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from jaxshare.formats import (
    OptimizerState,
    SlotSource,
    TorchFile,
    is_torch_training_file,
    optimizer_state,
    read_torch_training,
)


class TinyLM(nn.Module):
    """Embedding, a Linear, a LayerNorm and a head, the head tied to the embedding
    or not; an int64 buffer, which is no parameter."""

    def __init__(self, tied: bool, float_buffer: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.fc = nn.Linear(6, 6)
        self.ln = nn.LayerNorm(6)
        self.head = nn.Linear(6, 11, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        self.register_buffer("positions", torch.arange(5))
        if float_buffer:
            self.register_buffer("scale", torch.ones(3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        return self.head(self.ln(torch.tanh(self.fc(x)) + x))


OPTIMIZERS = {
    "adam": (lambda p: torch.optim.Adam(p, lr=1e-2), {"exp_avg", "exp_avg_sq"}),
    "adamw": (
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
        {"exp_avg", "exp_avg_sq"},
    ),
    "amsgrad": (
        lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
        {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    ),
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {"momentum_buffer"}),
}


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> None:
    for i in range(steps):
        ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(i))
        loss = nn.functional.cross_entropy(model(ids).reshape(-1, 11), ids.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _groups(model: nn.Module, named: bool, split: bool) -> list:
    """What the optimizer is given: ``model.parameters()``, ``named_parameters()``, or
    two groups (decay / no decay) of either."""
    pairs = list(model.named_parameters())
    items = pairs if named else [p for _, p in pairs]
    if not split:
        return items
    decay = [it for it, (n, _) in zip(items, pairs, strict=True) if n.endswith("weight")]
    rest = [it for it, (n, _) in zip(items, pairs, strict=True) if not n.endswith("weight")]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def _order(model: nn.Module, split: bool) -> list[str]:
    """The parameters' names in the order the optimizer was given them."""
    names = [n for n, _ in model.named_parameters()]
    if not split:
        return names
    return [n for n in names if n.endswith("weight")] + [
        n for n in names if not n.endswith("weight")
    ]


def _run(tmp_path: Path, kind: str, *, tied=True, named=True, split=False, extra=None, **kw):
    torch.manual_seed(0)
    model = TinyLM(tied, **kw)
    make, _ = OPTIMIZERS[kind]
    optimizer = make(_groups(model, named, split))
    _train(model, optimizer)
    path = tmp_path / "run.pt"
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **(extra or {})}, path
    )
    return model, optimizer, path


def _bits(t: torch.Tensor | np.ndarray) -> bytes:
    a = t.detach().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    return a.tobytes()


def _assert_equals_torch(state: OptimizerState, model: nn.Module, optimizer) -> None:
    names = {id(p): n for n, p in model.named_parameters()}  # (a tie once: its first name)
    want_slots: dict[str, dict[str, torch.Tensor]] = {}
    want_steps = {}
    for p, entries in optimizer.state.items():
        for key, value in entries.items():
            if key == "step":
                want_steps[names[id(p)]] = int(value)
            else:
                want_slots.setdefault(key, {})[names[id(p)]] = value
    assert dict(state.steps) == want_steps
    assert set(state.slots) == set(want_slots)
    for slot, tensors in want_slots.items():
        source = state.slots[slot]
        assert isinstance(source, SlotSource) and list(source.infos) == list(tensors)
        assert dict(source.ties) == {}
        for name, tensor in tensors.items():
            got = source.array(name)
            assert got.dtype == np.float32 and got.shape == tuple(tensor.shape), (slot, name)
            assert _bits(got) == _bits(tensor), (slot, name)
            assert _bits(b"".join(b.tobytes() for b in source.blocks(name))) == _bits(tensor)
    assert len(state.groups) == len(optimizer.param_groups)
    for group, torch_group in zip(state.groups, optimizer.param_groups, strict=True):
        assert group.names == tuple(names[id(p)] for p in torch_group["params"])
        hyper = {k: v for k, v in torch_group.items() if k not in ("params", "param_names")}
        assert dict(group.hyper) == hyper
    assert state.unknown == ()


# -- what the files hold -----------------------------------------------------------------


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("named", [True, False], ids=["named_parameters", "parameters"])
def test_every_slot_step_and_group_equals_torchs_bit_for_bit(tmp_path, kind, tied, named):
    model, optimizer, path = _run(tmp_path, kind, tied=tied, named=named)
    assert is_torch_training_file(path)
    params, state = read_torch_training(path)
    assert isinstance(params, TorchFile) and params.kind == "torch"
    assert state.producer == "torch" and state.path == path
    assert set(state.slots) == OPTIMIZERS[kind][1]
    _assert_equals_torch(state, model, optimizer)
    for name, tensor in model.state_dict().items():
        assert _bits(params.array(name)) == _bits(tensor), name
    assert dict(params.ties) == ({"head.weight": "emb.weight"} if tied else {})


def test_a_tie_is_held_once_under_its_canonical_name(tmp_path):
    _, _, path = _run(tmp_path, "adamw", tied=True, named=True)
    params, state = read_torch_training(path)
    assert params.ties["head.weight"] == "emb.weight" and params.origins == {
        "head.weight": "storage"
    }
    for source in state.slots.values():
        assert "emb.weight" in source.infos and "head.weight" not in source.infos
    assert [n for g in state.groups for n in g.names].count("emb.weight") == 1
    assert "head.weight" not in state.steps
    assert sum(len(s.infos) for s in state.slots.values()) == 2 * 5  # 5 parameters, 2 moments


@pytest.mark.parametrize("named", [True, False], ids=["named_parameters", "parameters"])
def test_two_groups_decay_and_no_decay(tmp_path, named):
    model, optimizer, path = _run(tmp_path, "adamw", named=named, split=True)
    if named:  # the groups' param_names say which is which
        _, state = read_torch_training(path)
    else:  # `names`, in the order the groups were given them
        sd = torch.load(path, weights_only=True)["optimizer"]
        sd["state"] = {i: {k: v.numpy() for k, v in s.items()} for i, s in sd["state"].items()}
        state = optimizer_state(sd, _order(model, True))
    _assert_equals_torch(state, model, optimizer)
    assert [g.hyper["weight_decay"] for g in state.groups] == [0.1, 0.0]
    assert state.groups[1].names == ("fc.bias", "ln.bias")


def test_the_in_memory_state_dict_maps_indices_through_names(tmp_path):
    model, optimizer, _ = _run(tmp_path, "sgd", named=False)
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: v.numpy() for k, v in s.items()} for i, s in sd["state"].items()}
    state = optimizer_state(sd, [n for n, _ in model.named_parameters()])
    _assert_equals_torch(state, model, optimizer)
    assert state.path is None and state.steps == {}


def test_the_other_entries_of_a_training_file_are_noted_not_read(tmp_path):
    torch.manual_seed(0)
    model = TinyLM(True)
    optimizer = torch.optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    _train(model, optimizer)
    scheduler.step()
    path = tmp_path / "run.pt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "optim": optimizer.state_dict(),
            "lr_scheduler": scheduler.state_dict(),
            "epoch": 3,
        },
        path,
    )
    params, state = read_torch_training(path)
    assert params.notes == ("also holds: lr_scheduler (a dict), epoch = 3 (not read)",)
    _assert_equals_torch(state, model, optimizer)


def test_entries_it_does_not_know_land_in_unknown_one_line_each(tmp_path):
    torch.manual_seed(0)
    model = TinyLM(True)
    optimizer = torch.optim.Adam(model.named_parameters(), lr=1e-2)
    _train(model, optimizer)
    sd = optimizer.state_dict()
    # An Adafactor-like state: a factored row of the embedding's second moment, a per-param lr.
    sd["state"][0]["exp_avg_sq_row"] = torch.ones(11)
    sd["state"][2]["lr"] = 0.005
    path = tmp_path / "run.pt"
    torch.save({"model": model.state_dict(), "optimizer": sd}, path)
    _, state = read_torch_training(path)
    assert state.unknown == (
        "emb.weight: exp_avg_sq_row (a float32 tensor of shape (11,))",
        "fc.bias: lr (float 0.005)",
    )
    assert set(state.slots) == {"exp_avg", "exp_avg_sq"}


def test_a_tensor_of_the_parameters_shape_under_a_new_name_is_a_slot(tmp_path):
    torch.manual_seed(0)
    model = TinyLM(False)
    optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer)
    sd = optimizer.state_dict()
    for entries in sd["state"].values():
        entries["muon_buffer"] = entries["momentum_buffer"] * 2
    path = tmp_path / "run.pt"
    torch.save({"model": model.state_dict(), "optimizer": sd}, path)
    _, state = read_torch_training(path)
    assert set(state.slots) == {"momentum_buffer", "muon_buffer"}
    for i, (name, _) in enumerate(model.named_parameters()):
        assert _bits(state.slots["muon_buffer"].array(name)) == _bits(sd["state"][i]["muon_buffer"])


# -- bad inputs: one line each -------------------------------------------------------------


def _one_line(e: pytest.ExceptionInfo, path: Path | None = None) -> str:
    message = str(e.value)
    assert "\n" not in message, message
    assert path is None or str(path) in message, message
    return message


def test_a_file_with_no_optimizer_is_refused_in_one_line(tmp_path):
    model = TinyLM(True)
    for obj, found in [
        ({"model": model.state_dict(), "epoch": 1}, "found a dict with keys ['epoch', 'model']"),
        (model.state_dict(), "found a model's state dict only"),
    ]:
        path = tmp_path / "model.pt"
        torch.save(obj, path)
        assert not is_torch_training_file(path)
        with pytest.raises(ValueError) as e:
            read_torch_training(path)
        message = _one_line(e, path)
        assert (
            "an optimizer state dict (under 'optimizer' / 'optimizer_state_dict' / 'optim')"
            in message
        )
        assert found in message and '"optimizer": optimizer.state_dict()' in message


def test_is_torch_training_file_never_raises(tmp_path):
    (tmp_path / "notes.txt").write_text("not a file of torch")
    assert not is_torch_training_file(tmp_path / "notes.txt")
    assert not is_torch_training_file(tmp_path / "missing.pt")
    assert not is_torch_training_file(tmp_path)


def test_indices_that_cannot_be_matched_to_names_are_refused_with_the_fix(tmp_path):
    # A float buffer is no parameter: the model's floating tensors are one more than
    # the optimizer's parameters.
    _, _, path = _run(tmp_path, "adam", named=False, float_buffer=True)
    with pytest.raises(ValueError) as e:
        read_torch_training(path)
    message = _one_line(e, path)
    assert "holds 5 parameters and names none" in message and "6 floating-point tensors" in message
    assert "`model.named_parameters()`" in message and "pass `names`" in message


def test_two_groups_without_names_are_refused(tmp_path):
    _, _, path = _run(tmp_path, "adamw", named=False, split=True)
    with pytest.raises(ValueError) as e:
        read_torch_training(path)
    assert "2 param groups name no parameters" in _one_line(e, path)


def test_a_moment_of_another_shape_than_its_parameter_is_refused(tmp_path):
    model, optimizer, path = _run(tmp_path, "adam", named=False)
    params, _ = read_torch_training(path)
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: v.numpy() for k, v in s.items()} for i, s in sd["state"].items()}
    names = [n for n, _ in model.named_parameters()]
    names[1], names[2] = names[2], names[1]  # fc.weight <-> fc.bias: the order is wrong
    with pytest.raises(ValueError) as e:
        optimizer_state(sd, names, params=params)
    message = _one_line(e)
    assert message == (
        "the optimizer state dict: exp_avg of 'fc.bias' has shape (6, 6), its parameter (6,); "
        "expected the optimizer of this model, saved with it."
    )


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["emb.weight"], "`names` holds 1 names, the optimizer 5 parameters"),
        (["emb.weight", "fc.weight", "fc.bias", "ln.weight", "nope"], "names a parameter 'nope'"),
        (
            ["emb.weight", "fc.weight", "fc.bias", "ln.weight", "head.weight"],
            "holds ['emb.weight'] twice",
        ),
    ],
)
def test_names_that_do_not_fit_the_model_are_refused(tmp_path, names, match):
    _, _, path = _run(tmp_path, "adam", named=False)
    model_file = tmp_path / "model.pt"
    torch.manual_seed(0)
    torch.save(TinyLM(True).state_dict(), model_file)
    params = TorchFile(model_file)
    sd = torch.load(path, weights_only=True)["optimizer"]
    sd["state"] = {i: {k: v.numpy() for k, v in s.items()} for i, s in sd["state"].items()}
    with pytest.raises(ValueError) as e:
        optimizer_state(sd, names, params=params, path=path)
    assert match in _one_line(e, path)


@pytest.mark.parametrize(
    ("sd", "match"),
    [
        ({"model": 1}, "expected an optimizer state dict"),
        ([], "expected an optimizer state dict"),
        ({"param_groups": [{"lr": 1}]}, "param group 0 has no list `params`"),
        ({"param_groups": [{"params": [0, 0]}]}, "a parameter index is in several groups"),
        ({"param_groups": [{"params": [0]}], "state": {1: {}}}, "that no param group lists"),
        (
            {"param_groups": [{"params": [0]}], "state": {0: {"step": 1.5}}},
            "the step of 'w' is 1.5; expected a whole number",
        ),
        ({"param_groups": [{"params": [0]}]}, None),
    ],
)
def test_a_malformed_state_dict_is_refused_in_one_line(sd, match):
    if match is None:
        assert optimizer_state(sd, ["w"]).groups[0].names == ("w",)
        return
    with pytest.raises(ValueError) as e:
        optimizer_state(sd, ["w"])
    assert match in _one_line(e)


# -- laws ----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=5),
    slots=st.sets(
        st.sampled_from(["exp_avg", "exp_avg_sq", "momentum_buffer", "other"]), min_size=1
    ),
    step=st.integers(0, 2**24),
)
def test_every_array_comes_back_as_the_very_same_object(shapes, slots, step):
    names = [f"p{i}" for i in range(len(shapes))]
    rng = np.random.default_rng(0)
    state = {
        i: {"step": np.float32(step), **{s: rng.random(shape, np.float32) for s in sorted(slots)}}
        for i, shape in enumerate(shapes)
    }
    sd = {"state": state, "param_groups": [{"params": list(range(len(shapes))), "lr": 0.1}]}
    out = optimizer_state(sd, names)
    assert dict(out.steps) == dict.fromkeys(names, step)
    if slots == {"other"}:  # no moment tells the parameter's shape: nothing is guessed
        assert out.slots == {} and len(out.unknown) == len(names)
        return
    assert set(out.slots) == set(slots) and out.unknown == ()
    for i, name in enumerate(names):
        for slot in slots:
            assert out.slots[slot].read(name) is state[i][slot]


NO_TORCH = """
import json, sys
sys.modules["torch"] = None  # import torch fails
from jaxshare.formats import read_torch_training
params, state = read_torch_training(sys.argv[1])
print(json.dumps({
    "steps": state.steps, "slots": sorted(state.slots), "ties": dict(params.ties),
    "jax": "jax" in sys.modules,
}))
"""


@pytest.mark.subprocess
def test_the_reader_needs_neither_torch_nor_jax(tmp_path):
    _, _, path = _run(tmp_path, "adamw")
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "steps": dict.fromkeys(["emb.weight", "fc.weight", "fc.bias", "ln.weight", "ln.bias"], 3),
        "slots": ["exp_avg", "exp_avg_sq"],
        "ties": {"head.weight": "emb.weight"},
        "jax": False,
    }


def test_a_training_file_that_would_run_code_is_refused_with_the_fix(tmp_path):
    model = TinyLM(True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "run.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": np.random.get_state(),  # numpy's RNG state: a global beyond tensors
        },
        path,
    )
    with pytest.raises(ValueError) as e:
        read_torch_training(path)
    message = _one_line(e, path)
    assert "refused: loading it would run code" in message and "numpy" in message
    assert "pass `optimizer.state_dict()` (tensors as numpy) to `optimizer_state`" in message
    assert not is_torch_training_file(path)
