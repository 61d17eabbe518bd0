"""Weight files: safetensors with ties in the metadata, torch files loaded safely."""

import json
import os
import pickle
import struct
import tempfile
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from bridge import inspect, load_safetensors, load_torch, save_safetensors, shared_params, to_torch
from jaxshare import AliasMap
from jaxshare.formats import ALIAS_MAP_KEY as METADATA_KEY


def tied_state() -> dict[str, torch.Tensor]:
    emb = torch.randn(10, 4).to(torch.bfloat16)
    return {
        "wte.weight": emb,
        "ln.weight": torch.ones(4, dtype=torch.float16),
        "steps": torch.tensor(3),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "lm_head.weight": emb,
        "again.weight": emb.detach(),  # another object over the same memory
    }


# -- safetensors ------------------------------------------------------------------


def test_safetensors_round_trip_re_ties(tmp_path, assert_same_state):
    state = tied_state()
    path = tmp_path / "m.safetensors"
    save_safetensors(state, path)
    loaded = load_safetensors(path)
    assert_same_state(loaded, state)
    assert loaded["lm_head.weight"] is loaded["wte.weight"] is loaded["again.weight"]


def test_a_file_save_model_wrote_loads_tied_and_strictly(tmp_path):
    """``safetensors.torch.save_model`` drops the duplicate and records it in the
    metadata: ``load_safetensors`` gives it back as the kept tensor itself."""
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_model(model, path)
    assert len(safetensors.torch.load_file(path)) == 1
    loaded = load_safetensors(path)
    assert loaded["0.weight"] is loaded["1.weight"]
    fresh = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    fresh.load_state_dict(loaded, strict=True)
    assert torch.equal(fresh[1].weight, model[0].weight)


def test_each_storage_is_written_once_and_plain_safetensors_reads_the_file(tmp_path):
    state = tied_state()
    path = tmp_path / "m.safetensors"
    save_safetensors(state, path)
    plain = safetensors.torch.load_file(path)
    assert set(plain) == set(state) - {"lm_head.weight", "again.weight"}
    with safetensors.safe_open(path, "pt") as f:
        metadata = f.metadata()
    assert AliasMap.from_json(metadata[METADATA_KEY]) == {
        "lm_head.weight": "wte.weight",
        "again.weight": "wte.weight",
    }
    assert metadata["format"] == "pt"
    untied = tmp_path / "untied.safetensors"
    safetensors.torch.save_file({k: v.clone() for k, v in state.items()}, untied)
    assert _data_bytes(untied) - _data_bytes(path) == 2 * state["wte.weight"].nbytes


def _data_bytes(path) -> int:
    """The size of a safetensors file without its header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - size


def test_permuted_views_are_stored_once_with_their_permutation(tmp_path, assert_same_state):
    # to_torch gives a tie whose layouts do not cancel as a permuted view.
    emb = torch.arange(8.0).reshape(4, 2)
    state = {"wte.weight": emb, "head.weight": emb.t(), "cube": torch.randn(2, 3, 4)}
    state["cube_t"] = state["cube"].permute(2, 0, 1)
    path = tmp_path / "m.safetensors"
    save_safetensors(state, path)
    assert set(safetensors.torch.load_file(path)) == {"wte.weight", "cube"}
    loaded = load_safetensors(path)
    assert_same_state(loaded, state)
    assert loaded["head.weight"].data_ptr() == loaded["wte.weight"].data_ptr()


def test_overlapping_views_that_are_not_one_tensor_are_refused(tmp_path):
    base = torch.arange(10.0)
    with pytest.raises(ValueError, match="'b' and 'a' share memory but neither is the other"):
        save_safetensors({"a": base, "b": base[2:7]}, tmp_path / "m.safetensors")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_disjoint_views_of_one_storage_are_written_separately(tmp_path, assert_same_state):
    fused = torch.arange(12.0)
    state = {"q": fused[:4], "k": fused[4:8], "v": fused[8:]}
    save_safetensors(state, tmp_path / "m.safetensors")
    assert_same_state(load_safetensors(tmp_path / "m.safetensors"), state)


def test_a_file_written_by_others_loads_without_ties(tmp_path, assert_same_state):
    state = {"a": torch.ones(2), "b": torch.zeros(3)}
    safetensors.torch.save_file(state, tmp_path / "m.safetensors")
    assert_same_state(load_safetensors(tmp_path / "m.safetensors"), state)


def _write_with_metadata(path, tensors, metadata):
    safetensors.torch.save_file(tensors, path, metadata=metadata)


@pytest.mark.parametrize(
    "tensors, aliases, match",
    [
        (
            {"a": torch.ones(2)},
            {"b": "c"},
            r"alias 'b' names canonical 'c', which the file does not store",
        ),
        (
            {"a": torch.ones(2), "b": torch.zeros(2)},
            {"b": "a"},
            "stores 'b', which its metadata ties to 'a', with different values",
        ),
        ({"a": torch.ones(2)}, None, "is invalid"),
    ],
    ids=["missing-canonical", "stored-alias-differs", "bad-json"],
)
def test_metadata_that_does_not_fit_the_file_is_refused(tmp_path, tensors, aliases, match):
    path = tmp_path / "m.safetensors"
    text = AliasMap(aliases).to_json() if aliases is not None else '{"format": "nope"}'
    _write_with_metadata(path, tensors, {METADATA_KEY: text})
    with pytest.raises(ValueError, match=match):
        load_safetensors(path)


def test_a_file_that_also_stores_its_aliases_is_re_tied(tmp_path):
    # `jaxshare convert --names flax` writes aliases out in full for plain readers.
    w = torch.arange(6.0).reshape(2, 3)
    path = tmp_path / "m.safetensors"
    _write_with_metadata(
        path,
        {"a": w, "b": w.t().contiguous()},
        {METADATA_KEY: AliasMap({"b": "a"}, transforms={"b": (1, 0)}).to_json()},
    )
    loaded = load_safetensors(path)
    assert torch.equal(loaded["b"], w.t()) and loaded["b"].data_ptr() == loaded["a"].data_ptr()


def test_the_result_of_to_torch_saves_and_loads(tmp_path):
    from bridge import to_flax

    model = nn.ModuleDict({"wte": nn.Embedding(5, 3), "head": nn.Linear(3, 5, bias=False)})
    model["head"].weight = model["wte"].weight
    state = to_torch(*to_flax(model))
    save_safetensors(state, tmp_path / "m.safetensors")
    loaded = load_safetensors(tmp_path / "m.safetensors")
    assert loaded["head.weight"] is loaded["wte.weight"]
    model.load_state_dict(loaded, strict=True)


def test_save_refuses_what_is_not_a_state_dict(tmp_path):
    with pytest.raises(TypeError, match=r"not so for 'x' \(int\)"):
        save_safetensors({"x": 3}, tmp_path / "m.safetensors")


# -- torch files ----------------------------------------------------------------------


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    with open(path, "wb") as f:
        pickle.dump({"w": _RunsCode(marker)}, f, protocol=2)
    zipped = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "payload": _RunsCode(marker)}, zipped)
    for hostile in (path, zipped):
        with pytest.raises(ValueError, match=f"{hostile.name}: refused: loading it would run code"):
            load_torch(hostile)
        with pytest.raises(ValueError, match="refused"):
            inspect(hostile)
    assert not marker.exists()


def test_torch_files_come_back_with_ties_as_one_object(tmp_path, assert_same_state):
    model = nn.ModuleDict({"a": nn.Linear(2, 2)})
    model["b"] = model["a"]
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)  # two names, two tensor objects, one storage each
    for mmap in (False, True):
        loaded = load_torch(path, mmap=mmap)
        assert_same_state(loaded, model.state_dict())
        assert loaded["b.weight"] is loaded["a.weight"]


def test_a_deepspeed_checkpoint_gives_its_module(tmp_path):
    emb = torch.randn(4, 2)
    state = {"wte.weight": emb, "ln.weight": torch.ones(2)}
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save(
        {
            "module": state,
            "shared_params": {"lm_head.weight": "wte.weight"},
            "buffer_names": [],
            "ds_version": "0.19.8",
        },
        path,
    )
    loaded = load_torch(path)
    assert loaded["lm_head.weight"] is loaded["wte.weight"]
    assert set(loaded) == {"wte.weight", "ln.weight", "lm_head.weight"}


def test_a_deepspeed_tie_to_a_zero_size_tensor_is_refused(tmp_path):
    path = tmp_path / "ds.pt"
    torch.save({"module": {"a": torch.zeros(0)}, "shared_params": {"b": "a"}}, path)
    with pytest.raises(ValueError, match="ties 'b' to 'a', a zero-size tensor"):
        load_torch(path)


def test_a_consolidated_zero_to_fp32_state_dict_loads(tmp_path):
    # zero_to_fp32 re-adds shared names as the same tensor object before saving.
    state = {"wte.weight": torch.randn(4, 2)}
    state["lm_head.weight"] = state["wte.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_torch(tmp_path / "pytorch_model.bin")
    assert loaded["lm_head.weight"] is loaded["wte.weight"]


@pytest.mark.parametrize(
    "obj, match",
    [
        ([torch.ones(1)], "found list"),
        ({"model": {"w": torch.ones(1)}}, r"found a dict with keys \['model'\]"),
    ],
)
def test_what_is_not_a_state_dict_is_named(tmp_path, obj, match):
    torch.save(obj, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=match):
        load_torch(tmp_path / "x.pt")


# -- inspect -----------------------------------------------------------------------------


def test_inspect_reads_a_safetensors_header_and_checks_it_against_the_file(tmp_path):
    state = tied_state()
    path = tmp_path / "m.safetensors"
    save_safetensors(state, path)
    with open(path, "r+b") as f:  # zero the data: the report comes from the header alone
        (size,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + size)
        f.write(bytes(path.stat().st_size - 8 - size))
    report = inspect(path)
    assert report.kind == "safetensors"
    assert report.alias_map == shared_params(state)
    assert report.bytes_saved == 2 * state["wte.weight"].nbytes
    assert report.arrays["lm_head.weight"].dtype == "bfloat16"
    with open(path, "r+b") as f:  # a truncated file is named as one, not reported
        f.truncate(8 + size)
    with pytest.raises(ValueError, match="the file is truncated"):
        inspect(path)


def test_inspect_a_torch_file(tmp_path):
    state = tied_state()
    torch.save(state, tmp_path / "m.bin")
    report = inspect(tmp_path / "m.bin")
    assert report.kind == "torch" and report.alias_map == shared_params(state)
    assert json.loads(report.to_json())["bytes_saved"] == 2 * state["wte.weight"].nbytes


@pytest.mark.parametrize(
    "content, match",
    [
        (b"abc", "fewer than the 8 of a header size"),
        (struct.pack("<Q", 10**12), "header size"),
        (struct.pack("<Q", 3) + b"{x}", "header is not JSON"),
    ],
)
def test_inspect_names_a_broken_safetensors_file(tmp_path, content, match):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        inspect(path)


@given(data=st.data())
def test_files_keep_every_name_bit_and_tie(data, tied_state_dicts, assert_same_state):
    state = data.draw(tied_state_dicts)
    with tempfile.TemporaryDirectory() as tmp:
        save_safetensors(state, Path(tmp) / "m.safetensors")
        assert_same_state(load_safetensors(Path(tmp) / "m.safetensors"), state)
        torch.save(state, Path(tmp) / "m.pt")
        assert_same_state(load_torch(Path(tmp) / "m.pt"), state)
