"""The optimizer state of DeepSpeed ZeRO folders, read without deepspeed.

The folders under ``tests/data/deepspeed_optim`` were written by the real
DeepSpeed 0.19.8 after three AdamW steps (``make optim-fixtures``); beside each
lie DeepSpeed's own consolidation of the weights (``reference.pt``), the moments,
steps and groups as DeepSpeed's engine held them (``optimizer_reference.pt``,
gathered with ``safe_get_full_optimizer_state``) and five further steps
(``continuation.pt``). The tests never import deepspeed.
"""

from __future__ import annotations

import enum
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.formats import DeepSpeedSlot, is_deepspeed_training, read_deepspeed_training
from jaxshare.formats.deepspeed.checkpoint import Placement, flat_pieces
from jaxshare.formats.deepspeed.files import _Inert, load_deepspeed_file

DATA = Path(__file__).resolve().parents[1] / "data"
OPTIM = DATA / "deepspeed_optim"
OLD = DATA / "deepspeed"
FIXTURES = sorted(p.name for p in OPTIM.iterdir() if (p / "latest").is_file())
# name -> (stage, world size, flat groups per rank)
EXPECTED = {
    "gpt2_z1_w3_fp32": (1, 3, 2),
    "gpt2_z2_w2_bf16": (2, 2, 2),
    "gpt2_z2_w2_fp32": (2, 2, 2),
    "gpt2_z3_w2_fp32": (3, 2, 2),
    "llama_z2_w2_fp32": (2, 2, 2),
    "llama_z3_w2_fp32": (3, 2, 2),
    "llama_z3_w3_fp32": (3, 3, 6),  # sub_group_size 150: several sub-groups per group
}
OLD_FIXTURES = sorted(p.name for p in OLD.iterdir() if (p / "latest").is_file())
SLOTS = ("exp_avg", "exp_avg_sq")


def load(name: str, file: str) -> dict[str, Any]:
    return torch.load(OPTIM / name / file, weights_only=True)


def same_bits(a: np.ndarray, t: torch.Tensor) -> bool:
    t = t.detach().contiguous()
    return (
        a.dtype == np.float32 and a.shape == tuple(t.shape) and a.tobytes() == t.numpy().tobytes()
    )


def optim_files(folder: Path) -> list[Path]:
    tag = (folder / "latest").read_text().strip()
    return sorted((folder / tag).glob("*optim_states.pt"))


def test_every_fixture_is_covered():
    assert FIXTURES == sorted(EXPECTED)


def test_the_fixtures_are_small():
    size = sum(p.stat().st_size for p in OPTIM.rglob("*") if p.is_file())
    assert size < 4 * 2**20


# -- bit-equal with DeepSpeed -----------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_moments_are_deepspeeds_bit_for_bit(name):
    ref = load(name, "optimizer_reference.pt")
    params, state = read_deepspeed_training(OPTIM / name)
    with params:
        assert sorted(state.slots) == list(SLOTS)
        for slot in SLOTS:
            source = state.slots[slot]
            assert list(source.infos) == [n for g in ref["groups"] for n in g["names"]]
            assert set(source.infos) == set(ref[slot])
            for key, want in ref[slot].items():
                assert source.infos[key].shape == tuple(want.shape), key
                assert same_bits(source.array(key), want), (slot, key)


@pytest.mark.parametrize("name", FIXTURES)
def test_steps_groups_and_hyperparameters_are_deepspeeds(name):
    ref = load(name, "optimizer_reference.pt")
    params, state = read_deepspeed_training(OPTIM / name)
    params.close()
    assert state.producer == "deepspeed" and state.path == OPTIM / name / "global_step3"
    assert dict(state.steps) == ref["step"] and set(ref["step"].values()) == {3}
    assert [g.names for g in state.groups] == [tuple(g["names"]) for g in ref["groups"]]
    for group, want in zip(state.groups, ref["groups"], strict=True):
        assert dict(group.hyper) == {k: v for k, v in want.items() if k != "names"}
    decay, no_decay = state.groups
    assert (decay.hyper["weight_decay"], no_decay.hyper["weight_decay"]) == (0.1, 0.0)
    assert decay.hyper["lr"] == 1e-3 and decay.hyper["betas"] == (0.9, 0.95)
    assert decay.hyper["eps"] == 1e-8 and decay.hyper["amsgrad"] is False
    assert state.unknown == ()


@pytest.mark.parametrize("name", FIXTURES)
def test_masters_are_deepspeeds_consolidation(name):
    consolidated = load(name, "reference.pt")
    gathered = load(name, "optimizer_reference.pt")["fp32_params"]
    params, _ = read_deepspeed_training(OPTIM / name)
    with params:
        stage, world, _ = EXPECTED[name]
        assert (params.stage, params.world_size) == (stage, world)
        for key, want in consolidated.items():
            got, want = params.array(key), want.detach().contiguous()
            assert got.dtype.name == str(want.dtype).removeprefix("torch."), key
            assert got.shape == tuple(want.shape), key
            assert got.tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes(), key
        for key, want in gathered.items():  # the engine's own masters, gathered
            assert same_bits(params.array(key), want), key


@pytest.mark.parametrize("name", FIXTURES)
def test_a_tie_has_one_state_and_frozen_parameters_none(name):
    ref = load(name, "optimizer_reference.pt")
    params, state = read_deepspeed_training(OPTIM / name)
    params.close()
    assert dict(params.ties) == ref["ties"]
    for alias, canonical in ref["ties"].items():
        assert alias not in state.steps and canonical in state.steps
        assert all(alias not in s.infos for s in state.slots.values())
        assert sum(alias in g.names or canonical in g.names for g in state.groups) == 1
    for frozen in ref["frozen"]:
        assert frozen not in state.steps and frozen in params.names
        assert all(frozen not in s.infos for s in state.slots.values())
    if name.startswith("gpt2"):
        assert ref["ties"] == {"lm_head.weight": "transformer.wte.weight"}
        assert ref["frozen"] == ["transformer.wpe.weight"]
    else:  # untied: lm_head has a state of its own
        assert ref["ties"] == {} and "lm_head.weight" in state.steps


@pytest.mark.parametrize("name", FIXTURES)
def test_the_fixtures_exercise_deepspeeds_padding_and_sub_groups(name):
    stage, world, flat_groups = EXPECTED[name]
    states = [load_deepspeed_file(f)["optimizer_state_dict"] for f in optim_files(OPTIM / name)]
    assert len(states) == world
    if stage == 3:
        assert all(len(s["fp32_flat_groups"]) == flat_groups for s in states)
        groups = states[0]["optimizer_state_dict"]["param_groups"]
        assert sum(len(g["params"]) for g in groups) == flat_groups and len(groups) == 2
    else:  # the last rank's partition is padded: moments hold the padding, masters do not
        last = states[-1]
        assert any(last["group_paddings"])
        for g, pad in enumerate(last["group_paddings"]):
            moment = last["base_optimizer_state"]["state"][g]["exp_avg"]
            assert moment.size == last["single_partition_of_fp32_groups"][g].size + pad


@pytest.mark.parametrize("name", FIXTURES)
def test_the_state_read_resumes_as_deepspeed_went_on(name):
    # Plain torch AdamW started from what the reader gives, fed DeepSpeed's recorded
    # gradients, lands on DeepSpeed's own parameters after each of the five steps:
    # bit for bit on the CPU that recorded them, within 2 ulp of each tensor's largest
    # value on others (torch's CPU kernels round the same AdamW differently from one
    # CPU to another: 1 ulp on ~500 elements on an AVX-512 Xeon). A wrong moment, step
    # or hyper-parameter is off by about the learning rate (1e-3), 10^5 times more.
    cont = load(name, "continuation.pt")
    params, state = read_deepspeed_training(OPTIM / name)
    with params:
        weights = {n: torch.nn.Parameter(torch.from_numpy(params.array(n))) for n in state.steps}
        moments = {s: {n: torch.from_numpy(state.slots[s].array(n)) for n in state.steps}
                   for s in SLOTS}  # fmt: skip
    order = [n for g in state.groups for n in g.names]
    opt = torch.optim.AdamW(
        [{**g.hyper, "params": [weights[n] for n in g.names]} for g in state.groups]
    )
    opt.load_state_dict({
        "state": {i: {"step": torch.tensor(float(state.steps[n])),
                      **{s: moments[s][n] for s in SLOTS}} for i, n in enumerate(order)},
        "param_groups": [{**g.hyper, "params": [order.index(n) for n in g.names]}
                         for g in state.groups],
    })  # fmt: skip
    assert cont["batches"].shape == (5, EXPECTED[name][1], 2, 8)
    for grads, want in zip(cont["grads"], cont["params"], strict=True):
        for n, p in weights.items():
            p.grad = grads[n].clone()
        opt.step()
        for n, p in weights.items():
            got, expected = p.detach().numpy(), want[n].numpy()
            ulp = np.spacing(np.abs(expected).max())
            np.testing.assert_allclose(got, expected, rtol=0, atol=2 * ulp, err_msg=n)


# -- slots -------------------------------------------------------------------------------


def test_a_slot_is_a_tensor_source_of_views_that_outlives_the_checkpoint():
    params, state = read_deepspeed_training(OPTIM / "gpt2_z3_w2_fp32")
    source = state.slots["exp_avg"]
    params.close()
    assert isinstance(source, DeepSpeedSlot) and source.mapped
    name = "transformer.h.0.attn.c_attn.weight"  # 243 elements over 2 ranks
    pieces = source.pieces(name)
    assert len(pieces) == 2 and all(not p.flags.writeable for p in pieces)
    whole = source.array(name)
    assert whole.shape == (9, 27) and np.array_equal(np.concatenate(pieces), whole.reshape(-1))
    assert np.array_equal(source.read_slice(name, (slice(1, 3), slice(None))), whole[1:3])
    with pytest.raises(KeyError, match="transformer.wpe.weight.*has no `exp_avg`"):
        source.array("transformer.wpe.weight")


@pytest.mark.parametrize("name", FIXTURES)
def test_is_deepspeed_training(name):
    assert is_deepspeed_training(OPTIM / name)
    assert is_deepspeed_training(OPTIM / name / "global_step3")
    assert is_deepspeed_training(OPTIM / name, tag="global_step3")


@pytest.mark.parametrize(
    "path", [OLD / "gpt2_z0_w2_bf16", OPTIM / "nowhere", OPTIM / "make_fixtures.py", OPTIM]
)
def test_is_deepspeed_training_says_no(path):
    assert not is_deepspeed_training(path)


# -- the older fixtures: 2 steps, ZeRO-1/2/3, world sizes 1 and 2, fp32/bf16/fp16, T5 ------


@pytest.mark.parametrize("name", [n for n in OLD_FIXTURES if "_z0_" not in n])
def test_the_older_fixtures_read_with_moments_of_their_parameters_shapes(name):
    params, state = read_deepspeed_training(OLD / name)
    with params:
        trainable = [n for g in load_deepspeed_file(params._model_files[0])["param_shapes"]
                     for n in g]  # fmt: skip
        assert list(state.steps) == trainable and set(state.steps.values()) == {2}
        assert [n for g in state.groups for n in g.names] == trainable
        assert all(set(params.ties).isdisjoint(s.infos) for s in state.slots.values())
        for slot in SLOTS:
            source = state.slots[slot]
            assert list(source.infos) == trainable
            for key in trainable:
                m = source.array(key)
                assert m.shape == params.infos[key].shape and m.dtype == np.float32, key
                assert np.isfinite(m).all() and (slot == "exp_avg" or (m >= 0).all()), key
        assert any(source.array(key).any() for key in trainable)
    if name.startswith("t5"):
        assert "shared.weight" in state.steps and len(params.ties) == 3
        frozen = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    else:
        frozen = "transformer.wpe.weight"
    assert frozen in params.names and frozen not in state.steps


def test_zero0_is_refused_in_one_line():
    with pytest.raises(ValueError, match="ZeRO-0 checkpoint keeps no ZeRO optimizer") as e:
        read_deepspeed_training(OLD / "gpt2_z0_w2_bf16")
    assert "\n" not in str(e.value) and "gpt2_z0_w2_bf16" in str(e.value)


# -- bad input: one line, naming the file ------------------------------------------------


def torch_tree(obj: Any) -> Any:
    """A file's unpickled numpy tree in what ``torch.save`` stores and jaxshare's
    unpickler reads back (DeepSpeed's stand-ins as plain values)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, enum.IntEnum):
        return int(obj)
    if isinstance(obj, _Inert):
        return dict(obj.state)
    if isinstance(obj, dict):
        return {k: torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(torch_tree(v) for v in obj)
    return obj


def edit_file(file: Path, edit) -> None:
    tree = torch_tree(load_deepspeed_file(file))
    edit(tree["optimizer_state_dict"])
    torch.save(tree, file)


def copy_with(tmp_path: Path, name: str, rank: int, edit) -> Path:
    folder = shutil.copytree(OPTIM / name, tmp_path / name)
    file = optim_files(folder)[rank]
    edit_file(file, edit)
    return file


def moments_of(inner: dict) -> dict:
    return (inner.get("base_optimizer_state") or inner["optimizer_state_dict"])["state"]


def truncate(inner):
    moments_of(inner)[0]["exp_avg"] = moments_of(inner)[0]["exp_avg"][:-1].clone()


def drop_state(inner):
    inner.pop("base_optimizer_state", None) or inner.pop("optimizer_state_dict")


def drop_group(inner):
    del moments_of(inner)[1]


def other_step(inner):
    moments_of(inner)[0]["step"] = torch.tensor(4.0)


def half_step(inner):
    for s in moments_of(inner).values():
        s["step"] = torch.tensor(2.5)


def extra_entry(inner):
    moments_of(inner)[0]["extra"] = torch.zeros(3)


def not_a_tensor(inner):
    moments_of(inner)[1]["exp_avg_sq"] = None


def shuffled_groups(inner):
    sd = inner.get("base_optimizer_state") or inner["optimizer_state_dict"]
    sd["param_groups"][0]["params"], sd["param_groups"][1]["params"] = [1], [0]


BAD = [
    ("gpt2_z2_w2_fp32", 1, truncate, r"`exp_avg` of flat group 0 has \d+ elements, expected \d+"),
    ("llama_z3_w3_fp32", 2, truncate, r"`exp_avg` of flat group 0 has \d+ elements, expected"),
    ("gpt2_z2_w2_fp32", 0, drop_state, r"expected `base_optimizer_state` \(a torch optimizer"),
    ("gpt2_z3_w2_fp32", 1, drop_state, r"expected `optimizer_state_dict` \(a torch optimizer"),
    ("gpt2_z2_w2_fp32", 1, drop_group, r"has no entry for flat group\(s\) \[1\]"),
    ("gpt2_z3_w2_fp32", 0, other_step, r"flat group 0 is at steps \[4, 3\] on the ranks"),
    ("gpt2_z2_w2_bf16", 0, half_step, r"flat group 0's `step` is float32 array .*whole number"),
    ("llama_z2_w2_fp32", 1, extra_entry, r"flat group 0 holds .* rank 0's .*different runs"),
    (
        "llama_z3_w2_fp32",
        1,
        not_a_tensor,
        r"`exp_avg_sq` of flat group 1 is NoneType None on "
        r"rank 1, a float32 array of shape \[\d+\] on rank 0",
    ),
    ("gpt2_z1_w3_fp32", 0, shuffled_groups, r"hold the flat groups \[1, 0\], expected each"),
]


@pytest.mark.parametrize(
    ("name", "rank", "edit", "match"), BAD, ids=[f"{n}-{e.__name__}" for n, _, e, _ in BAD]
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, name, rank, edit, match):
    file = copy_with(tmp_path, name, rank, edit)
    with pytest.raises(ValueError, match=match) as e:
        read_deepspeed_training(file.parent.parent)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{file}: "), e.value  # The rank's file, first.


def test_a_missing_rank_file_is_one_line(tmp_path):
    folder = shutil.copytree(OPTIM / "llama_z3_w3_fp32", tmp_path / "ckpt")
    optim_files(folder)[1].unlink()
    with pytest.raises(ValueError, match=r"ranks 0..1 exactly once, found ranks \[0, 2\]") as e:
        read_deepspeed_training(folder)
    assert "\n" not in str(e.value) and str(folder / "global_step3") in str(e.value)


def test_a_truncated_file_is_one_line(tmp_path):
    folder = shutil.copytree(OPTIM / "gpt2_z2_w2_fp32", tmp_path / "ckpt")
    file = optim_files(folder)[1]
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a PyTorch") as e:
        read_deepspeed_training(folder)
    assert "\n" not in str(e.value) and str(file) in str(e.value)


def test_unknown_entries_are_listed_and_new_moments_become_slots(tmp_path):
    def edit(inner):
        for s in moments_of(inner).values():
            s["max_exp_avg_sq"] = s["exp_avg_sq"].clone()  # amsgrad's, as a partition
            s["lr"] = torch.tensor(0.5)  # a per-parameter scalar: not a moment

    folder = shutil.copytree(OPTIM / "gpt2_z2_w2_fp32", tmp_path / "ckpt")
    for file in optim_files(folder):
        edit_file(file, edit)
    params, state = read_deepspeed_training(folder)
    with params:
        assert sorted(state.slots) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
        want = state.slots["exp_avg_sq"].array("transformer.wte.weight")
        assert np.array_equal(state.slots["max_exp_avg_sq"].array("transformer.wte.weight"), want)
        assert len(state.unknown) == len(state.steps)
        assert "transformer.wte.weight: `lr` (float32 array of shape []) is not a moment" in (
            state.unknown
        )


def test_a_slot_only_some_sub_groups_hold_keeps_the_others_offsets(tmp_path):
    def edit(inner):
        for i, s in moments_of(inner).items():
            if i >= 2:
                s["max_exp_avg_sq"] = s["exp_avg_sq"].clone()

    folder = shutil.copytree(OPTIM / "llama_z3_w3_fp32", tmp_path / "ckpt")
    for file in optim_files(folder):
        edit_file(file, edit)
    params, state = read_deepspeed_training(folder)
    with params:
        shapes = load_deepspeed_file(params._model_files[0])["param_shapes"]
        later = [n for g in shapes[2:] for n in g]
        assert list(state.slots["max_exp_avg_sq"].infos) == later
        for name in later:
            want = state.slots["exp_avg_sq"].array(name)
            assert np.array_equal(state.slots["max_exp_avg_sq"].array(name), want), name


# -- the layout shared with the fp32 masters ---------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    numels=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    world=st.integers(1, 5),
    zero3=st.booleans(),
)
def test_flat_pieces_cut_deepspeeds_layouts_back_into_parameters(numels, world, zero3):
    # Lay parameters out as DeepSpeed does, then cut each back out.
    rng = np.random.default_rng(len(numels) * 7 + world)
    tensors = [rng.standard_normal(n).astype(np.float32) for n in numels]
    sources, offset = [], 0
    if zero3:  # each parameter split ceil(n / world) per rank at one offset, padded
        per = [-(-n // world) for n in numels]
        ranks = [[] for _ in range(world)]
        for t, k in zip(tensors, per, strict=True):
            padded = np.concatenate([t, np.zeros(k * world - t.size, np.float32)])
            for r in range(world):
                ranks[r].append(padded[r * k : (r + 1) * k])
            sources.append(Placement("zero3", t.size, 0, offset))
            offset += k
        parts = [[np.concatenate(r)] if r else [] for r in ranks]
    else:  # one group end to end, padded to 2 * world, split evenly over the ranks
        flat = np.concatenate(tensors)
        total = -(-flat.size // (2 * world)) * 2 * world
        flat = np.concatenate([flat, np.zeros(total - flat.size, np.float32)])
        size = total // world
        parts = [[flat[r * size : (r + 1) * size]] for r in range(world)]
        for t in tensors:
            sources.append(Placement("zero2", t.size, 0, offset))
            offset += t.size
    for t, source in zip(tensors, sources, strict=True):
        pieces = flat_pieces(source, parts, world)
        got = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        assert np.array_equal(got, t)
