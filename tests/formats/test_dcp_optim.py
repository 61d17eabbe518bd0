"""A DCP training checkpoint's optimizer state read with numpy only:
``jaxshare.formats.dcp.training``.

``_dcp_optim_worker.py`` trains a tiny tied model with FSDP2 ``fully_shard`` on two
gloo ranks (AdamW, two groups) and saves ``get_state_dict(model, optimizer)`` with
``dcp.save`` (once per writer run, for the module); the reference is the full state
gathered with ``StateDictOptions(full_state_dict=True)`` and saved by ``torch.save``.
The moments read from the chunks of both ranks must equal it bit for bit.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from jaxshare.formats import (
    DCPFolder,
    is_dcp_training_folder,
    read_dcp_training,
    read_torch_training,
)

HERE = Path(__file__).resolve().parent
DCP_DATA = HERE.parents[0] / "data" / "dcp"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fsdp2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_dcp_optim_worker.py"), str(rank), str(port), str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err[-4000:]
    return folder


def _bits(a) -> bytes:
    if isinstance(a, torch.Tensor):
        return a.detach().contiguous().numpy().tobytes()
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.subprocess
@pytest.mark.parametrize("key", ["optim", "optimizer"])
def test_the_moments_equal_the_full_state_dict_bit_for_bit(run, key):
    want = torch.load(run / "full.pt", weights_only=True)
    folder = run / key
    assert is_dcp_training_folder(folder)
    params, state = read_dcp_training(folder)
    assert isinstance(params, DCPFolder) and params.part == "model"
    assert state.producer == "dcp" and state.path == folder and state.unknown == ()
    # The model: every name, DCP's model part without its prefix, bit for bit.
    assert list(params.infos) == list(want["model"])
    for name, tensor in want["model"].items():
        assert _bits(params.array(name)) == _bits(tensor), name
    # The optimizer: each moment assembled from both ranks' chunks.
    slots: dict[str, dict[str, torch.Tensor]] = {}
    for name, entries in want["optim"]["state"].items():
        assert state.steps[name] == int(entries["step"]) == 3
        for slot, tensor in entries.items():
            if slot != "step":
                slots.setdefault(slot, {})[name] = tensor
    assert set(state.slots) == set(slots) == {"exp_avg", "exp_avg_sq"}
    for slot, tensors in slots.items():
        source = state.slots[slot]
        assert list(source.infos) == list(tensors) and dict(source.ties) == {}
        for name, tensor in tensors.items():
            assert _bits(source.array(name)) == _bits(tensor), (slot, name)
            assert b"".join(_bits(b) for b in source.blocks(name)) == _bits(tensor)
            rows = tensor.shape[0]
            assert _bits(source.read_slice(name, (slice(1, rows),))) == _bits(tensor[1:])
    # The groups, with their hyper-parameters.
    assert len(state.groups) == 2
    for group, torch_group in zip(state.groups, want["optim"]["param_groups"], strict=True):
        assert group.names == tuple(torch_group["params"])
        assert dict(group.hyper) == {k: v for k, v in torch_group.items() if k != "params"}
    assert state.groups[0].names == ("emb.weight", "fc.weight", "head.weight")
    assert [g.hyper["weight_decay"] for g in state.groups] == [0.1, 0.0]


@pytest.mark.subprocess
def test_the_state_is_sharded_and_read_from_both_ranks(run):
    with DCPFolder(run / "optim", part="optim") as optim:
        files = {file for _, _, file in optim.chunks("state.emb.weight.exp_avg")}
    assert files == {"__0_0.distcp", "__1_0.distcp"}


@pytest.mark.subprocess
def test_dcp_records_no_tie_and_the_tied_name_is_noted(run):
    params, state = read_dcp_training(run / "optim")
    assert dict(params.ties) == {}  # DCP records none; none is invented
    assert "out.weight" in params.infos and "out.weight" not in state.steps
    assert params.notes[-1] == (
        "in no optimizer group: out.weight (frozen, buffers, or ties DCP does not record)"
    )
    np.testing.assert_array_equal(params.array("out.weight"), params.array("emb.weight"))


@pytest.mark.subprocess
def test_the_full_state_dict_file_reads_the_same(run):
    params, state = read_torch_training(run / "full.pt")  # "optim", keyed by names
    _, dcp_state = read_dcp_training(run / "optim")
    assert dict(params.ties) == {}  # (gathered: a tensor of its own per name)
    assert state.steps == dcp_state.steps and state.groups == dcp_state.groups
    for slot, source in state.slots.items():
        for name in source.infos:
            assert _bits(source.array(name)) == _bits(dcp_state.slots[slot].array(name))


def test_a_folder_without_an_optimizer_is_refused_in_one_line(tmp_path):
    assert not is_dcp_training_folder(DCP_DATA / "flat")
    assert not is_dcp_training_folder(tmp_path)
    with pytest.raises(ValueError) as e:
        read_dcp_training(DCP_DATA / "flat")
    message = str(e.value)
    assert "\n" not in message and str(DCP_DATA / "flat") in message
    assert "expected a DCP training checkpoint with top-level 'model' and 'optim'" in message
    with pytest.raises(FileNotFoundError):
        read_dcp_training(tmp_path / "missing")


def test_the_torchtitan_fixture_reads_with_its_adam_state():
    want = torch.load(DCP_DATA / "sharded.pt", weights_only=True)["optimizer"]
    params, state = read_dcp_training(DCP_DATA / "sharded")
    assert "rope_cache" in params.infos and set(state.slots) == {"exp_avg", "exp_avg_sq"}
    for name, entries in want["state"].items():
        assert state.steps[name] == int(entries["step"])
        for slot in ("exp_avg", "exp_avg_sq"):
            assert _bits(state.slots[slot].array(name)) == _bits(entries[slot]), (slot, name)


@pytest.mark.parametrize("named", [True, False], ids=["named_parameters", "parameters"])
def test_a_plain_optimizer_state_dict_saved_by_dcp_is_matched_by_index(tmp_path, named):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    given = model.named_parameters() if named else model.parameters()
    optimizer = torch.optim.Adam(given, lr=1e-3, amsgrad=True)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():  # (DCP warns that it saves in one process, as asked)
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"model": model.state_dict(), "optim": optimizer.state_dict()},
            checkpoint_id=tmp_path / "plain",
            no_dist=True,
        )
    _, state = read_dcp_training(tmp_path / "plain")  # state keyed "0", "1", ...: by index
    assert state.groups[0].names == ("0.weight", "0.bias", "1.weight", "1.bias")
    assert set(state.slots) == {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    for name, p in model.named_parameters():
        for slot, tensor in optimizer.state[p].items():
            if slot == "step":
                assert state.steps[name] == int(tensor) == 1
            else:
                assert _bits(state.slots[slot].array(name)) == _bits(tensor), (slot, name)


@pytest.mark.subprocess
def test_to_optax_keeps_the_tie_dcp_does_not_record_once_it_is_declared(run):
    """DCP keeps both names of the tied Parameter (``out.weight`` = ``emb.weight``) and
    records no tie: untied, one would train and the other freeze, so ``to_optax``
    refuses in one line until the tie is declared; declared, it is one leaf with one
    state, its moments the full state's."""
    import optax

    import bridge

    folder = run / "optim"
    _, state = read_dcp_training(folder)
    tx = bridge.optax_for(state)
    with pytest.raises(ValueError, match=r"'out.weight' is in no param group but equals"):
        bridge.to_optax(folder, tx)
    params, opt_state = bridge.to_optax(folder, tx, ties=["out.weight=emb.weight"])
    assert dict(params.alias_map) == {"params/out/kernel": "params/emb/kernel"}
    assert "out" not in params.unique["params"]
    full = torch.load(run / "full.pt", weights_only=True)["optim"]["state"]
    adams = [
        s
        for s in jax_leaves(opt_state, optax.ScaleByAdamState)
        if not isinstance(s.mu.unique["params"]["emb"]["kernel"], optax.MaskedNode)
    ]
    (adam,) = adams  # (the decay group's: emb, fc and head weights)
    for name, got in (("emb.weight", adam.mu), ("emb.weight", adam.nu)):
        slot = "exp_avg" if got is adam.mu else "exp_avg_sq"
        want = full[name][slot].numpy().T  # (a weight without a layer type: a kernel)
        assert _bits(got.unique["params"]["emb"]["kernel"]) == _bits(want), slot
    assert int(adam.count) == 3
    # The command's way: --optimizer with --tie writes the step with the tie.
    from jaxshare import checkpoint

    out = run / "resumed"
    with pytest.raises(ValueError, match="in no param group"):
        bridge.convert(folder, out, optimizer=True)
    bridge.convert(folder, out, optimizer=True, ties=["out.weight=emb.weight"])
    (step,) = [p for p in out.iterdir() if p.name.isdigit()]
    assert dict(checkpoint.read_alias_map(step / "params")) == dict(params.alias_map)


def jax_leaves(tree, kind):
    import jax

    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, kind))
            if isinstance(x, kind)]  # fmt: skip
