"""DeepSpeed ZeRO checkpoint folders: read without deepspeed, bit-exact with
DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint``.

The folders under ``tests/data/deepspeed`` were written by the real DeepSpeed
0.19.8 (``make fixtures``); each holds ``reference.pt``, DeepSpeed's own
consolidation of it. The tests never import deepspeed.
"""

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch

from bridge import DeepSpeedCheckpoint, load_deepspeed, load_safetensors, save_safetensors
from jaxshare import AliasMap
from jaxshare.formats import ALIAS_MAP_KEY, save_plan
from jaxshare.stream import Plan, TensorSource

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "latest").is_file())
# name -> (stage, world size, dtype of the trained weights, names zero_to_fp32 drops)
EXPECTED = {
    "gpt2_z0_w2_bf16": (0, 2, torch.bfloat16, set()),
    "gpt2_z1_w2_fp32": (1, 2, torch.float32, {"transformer.wpe.weight"}),
    "gpt2_z2_w1_fp32": (2, 1, torch.float32, set()),
    "gpt2_z2_w2_bf16": (2, 2, torch.float32, set()),
    "gpt2_z2_w2_fp16": (2, 2, torch.float32, set()),
    "gpt2_z3_w1_bf16": (3, 1, torch.float32, set()),
    "gpt2_z3_w2_fp32": (3, 2, torch.float32, set()),
    "gpt2_z3_w2_fp16": (3, 2, torch.float32, set()),
    "t5_z2_w2_fp32": (2, 2, torch.float32, set()),
    "t5_z3_w2_bf16": (3, 2, torch.float32, set()),
}
T5_TIE = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
          "lm_head.weight")  # fmt: skip


def reference(name: str) -> dict[str, torch.Tensor]:
    return torch.load(DATA / name / "reference.pt", weights_only=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def tie_groups(state: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """Names over one memory (one object, or one storage at one offset)."""
    groups: dict[tuple, set[str]] = {}
    for k, t in state.items():
        if t.numel():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.dtype)
            groups.setdefault(key, set()).add(k)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_every_fixture_is_covered():
    assert FIXTURES == sorted(EXPECTED)


# -- bit-exact with DeepSpeed ----------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_state_dict_is_deepspeeds_bit_for_bit(name):
    ref = reference(name)
    state = load_deepspeed(DATA / name)
    _, _, _, dropped = EXPECTED[name]
    assert set(state) == set(ref) | dropped
    for key, want in ref.items():
        got = state[key]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), key
        assert torch.equal(bits(got), bits(want)), key
        assert got.is_contiguous(), key


@pytest.mark.parametrize("name", FIXTURES)
def test_ties_are_deepspeeds_and_each_alias_is_its_canonical(name):
    with DeepSpeedCheckpoint(DATA / name) as ckpt:
        state = ckpt.state_dict()
        amap = ckpt.shared_params
    assert {frozenset([*amap.groups()[c], c]) for c in amap.groups()} == tie_groups(reference(name))
    for alias, canonical in amap.items():
        assert state[alias] is state[canonical]
    assert tie_groups(state) == tie_groups(reference(name))


def test_the_t5_four_way_tie_is_one_tensor():
    state = load_deepspeed(DATA / "t5_z3_w2_bf16")
    first = state[T5_TIE[0]]
    assert all(state[k] is first for k in T5_TIE)
    assert first.dtype == torch.float32 and first.shape == (31, 9)


@pytest.mark.parametrize("name", FIXTURES)
def test_metadata_describes_the_folder(name):
    stage, world_size, weights, dropped = EXPECTED[name]
    with DeepSpeedCheckpoint(DATA / name) as ckpt:
        assert (ckpt.stage, ckpt.world_size, ckpt.tag, ckpt.ds_version) == (
            stage, world_size, "global_step2", "0.19.8")  # fmt: skip
        assert set(ckpt.recovered) == dropped
        state = ckpt.state_dict()
        assert list(state) == list(ckpt.names)
        assert list(ckpt.infos) == [n for n in ckpt.names if n not in ckpt.shared_params]
        for key, info in ckpt.infos.items():
            assert info.shape == tuple(state[key].shape)
            assert info.dtype == str(state[key].dtype).removeprefix("torch.")
    assert state["lm_head.weight"].dtype == weights


def test_names_come_in_the_models_state_dict_order():
    # The model's own order (from the stored module), not zero_to_fp32's
    # buffers-frozen-groups order.
    with DeepSpeedCheckpoint(DATA / "gpt2_z2_w2_bf16") as ckpt:
        names = ckpt.names
    assert names[:4] == ("tokens_seen", "transformer.calibration", "transformer.wte.weight",
                         "transformer.wpe.weight")  # fmt: skip
    assert names[-1] == "lm_head.weight"
    assert list(reference("gpt2_z2_w2_bf16"))[2:4] == [
        "transformer.wpe.weight", "transformer.wte.weight"]  # fmt: skip


def test_buffers_and_frozen_parameters_follow_deepspeeds_rules():
    state = load_deepspeed(DATA / "gpt2_z2_w2_bf16")
    assert state["tokens_seen"].dtype == torch.int64 and int(state["tokens_seen"]) == 28
    assert state["transformer.calibration"].dtype == torch.float32  # stored bf16; as zero_to_fp32
    assert state["transformer.wpe.weight"].dtype == torch.bfloat16  # frozen: as stored
    assert state["transformer.wte.weight"].dtype == torch.float32  # the fp32 master weights


def test_zero1_frozen_parameters_come_from_the_module():
    # DeepSpeed records frozen parameters only under ZeRO-2/3, so its zero_to_fp32
    # drops them under ZeRO-1; the stored module holds them.
    state = load_deepspeed(DATA / "gpt2_z1_w2_fp32")
    assert "transformer.wpe.weight" not in reference("gpt2_z1_w2_fp32")
    frozen = load_deepspeed(DATA / "gpt2_z2_w1_fp32")["transformer.wpe.weight"]
    assert torch.equal(state["transformer.wpe.weight"], frozen)  # same seed, never trained


def test_zero0_gives_the_stored_module():
    with DeepSpeedCheckpoint(DATA / "gpt2_z0_w2_bf16") as ckpt:
        state = ckpt.state_dict()
        assert ckpt.stage == 0 and dict(ckpt.shared_params) == {
            "lm_head.weight": "transformer.wte.weight"}  # fmt: skip
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    assert state["transformer.calibration"].dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["gpt2_z3_w2_fp32", "gpt2_z2_w2_bf16"])
def test_a_tag_folder_or_tag_reads_the_same(name):
    want = load_deepspeed(DATA / name)
    for got in (load_deepspeed(DATA / name / "global_step2"),
                load_deepspeed(DATA / name, tag="global_step2")):  # fmt: skip
        assert list(got) == list(want)
        assert all(torch.equal(bits(got[k]), bits(want[k])) for k in want)


# -- streaming ------------------------------------------------------------------------


def test_metadata_needs_no_tensor(monkeypatch):
    def refuse(self, name):
        raise AssertionError(f"read {name}")

    monkeypatch.setattr(DeepSpeedCheckpoint, "pieces", refuse)
    with DeepSpeedCheckpoint(DATA / "t5_z3_w2_bf16") as ckpt:
        assert ckpt.infos["shared.weight"].shape == (31, 9)
        assert set(ckpt.shared_params) == set(T5_TIE[1:])
        assert len(ckpt.names) == len(ckpt.infos) + 3


def test_items_assembles_one_tensor_at_a_time(monkeypatch):
    reads = []
    real = DeepSpeedCheckpoint.read

    def spy(self, name):
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(DeepSpeedCheckpoint, "read", spy)
    with DeepSpeedCheckpoint(DATA / "gpt2_z3_w2_fp16") as ckpt:
        it = ckpt.items()
        assert reads == []
        order = []
        for name, tensor in it:
            assert reads == [*order, name]  # nothing read ahead
            order.append(name)
            assert tensor.shape == ckpt.infos[name].shape
        assert order == list(ckpt.infos)


def mapped_file(array):
    """The file mapped (``/proc/self/maps``) at the array's first byte, or None."""
    address = array.__array_interface__["data"][0]
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # range, perms, offset, device, inode[, path]
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5] if len(fields) == 6 else None
    return None


def test_pieces_are_views_of_the_mapped_partitions():
    with DeepSpeedCheckpoint(DATA / "gpt2_z3_w2_fp32") as ckpt:
        pieces = ckpt.pieces("transformer.wte.weight")  # 279 elements: 140 + 139 (of 140)
        assert [p.size for p in pieces] == [140, 139]
        assert all(not p.flags.writeable and not p.flags.owndata for p in pieces)
        folder = DATA / "gpt2_z3_w2_fp32" / "global_step2"
        ranks = [str(folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in (0, 1)]
        assert [mapped_file(p) for p in pieces] == ranks
        joined = np.concatenate(pieces).reshape(31, 9)
        np.testing.assert_array_equal(joined, ckpt.read("transformer.wte.weight").numpy())
        with pytest.raises(KeyError, match="alias of 'transformer.wte.weight'"):
            ckpt.pieces("lm_head.weight")


def test_read_owns_its_memory():
    with DeepSpeedCheckpoint(DATA / "gpt2_z3_w1_bf16") as ckpt:
        a = ckpt.read("transformer.wte.weight")
        b = ckpt.read("transformer.wte.weight")
        alias = ckpt.read("lm_head.weight")
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.zero_()
    assert torch.equal(b, alias) and not torch.equal(a, b)


# -- safetensors ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2_z2_w2_bf16", "t5_z3_w2_bf16"])
def test_a_tied_folder_goes_to_safetensors_where_zero_to_fp32_crashes(tmp_path, name):
    ref = reference(name)
    # What `zero_to_fp32 --safe_serialization` does with this state dict (see
    # make_fixtures.log for DeepSpeed's own crash):
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        safetensors.torch.save_file(ref, tmp_path / "plain.safetensors")
    state = load_deepspeed(DATA / name)
    save_safetensors(state, tmp_path / "saved.safetensors")
    with DeepSpeedCheckpoint(DATA / name) as ckpt:
        save_plan(tmp_path / "streamed.safetensors", Plan.identity(ckpt), ckpt)
        stored, amap = list(ckpt.infos), ckpt.shared_params
    saved = (tmp_path / "saved.safetensors").read_bytes()
    assert (tmp_path / "streamed.safetensors").read_bytes() == saved
    back = load_safetensors(tmp_path / "streamed.safetensors")
    assert set(back) == set(ref)
    assert all(torch.equal(bits(back[k]), bits(ref[k])) for k in ref)
    assert tie_groups(back) == tie_groups(ref)
    assert list(safetensors.torch.load_file(tmp_path / "streamed.safetensors")) == stored
    with safetensors.safe_open(tmp_path / "streamed.safetensors", "pt") as f:
        assert AliasMap.from_json(f.metadata()[ALIAS_MAP_KEY]) == amap


# -- bad input ------------------------------------------------------------------------


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Unknown:
    pass


def hostile_files(tmp_path, marker):
    good = DATA / "gpt2_z3_w2_fp32" / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = good.read_bytes()
    files = {}

    def save(name, obj):
        torch.save(obj, tmp_path / name)
        files[name] = (tmp_path / name).read_bytes()

    save("runs_code", {"optimizer_state_dict": {"x": _RunsCode(marker)}})
    save("unknown_class", {"optimizer_state_dict": {"x": Unknown()}})
    files["truncated"] = data[: len(data) // 2]
    files["random"] = bytes(range(7, 256)) * 16
    files["json"] = b'{"optimizer_state_dict": {"zero_stage": 3}}'
    files["empty"] = b""
    return files


@pytest.mark.parametrize(
    "case, match",
    [
        ("runs_code", r"refused: loading it would run code .*GLOBAL posix\.system"),
        ("unknown_class", r"refused: loading it would run code.*GLOBAL \S*test_deepspeed\.Unknown"),
        ("truncated", r"not a PyTorch file jaxshare can read \(BadZipFile"),
        ("random", r"not a PyTorch/zip/pickle file \(it starts with b'\\x07\\x08"),
        ("json", r"not a PyTorch/zip/pickle file \(it starts with b'\{\"op'"),
        ("empty", r"not a PyTorch/zip/pickle file \(an empty file\)"),
    ],
)
@pytest.mark.parametrize(
    "target",
    ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"],
)
def test_a_bad_rank_file_is_refused_in_one_line_and_nothing_changes(tmp_path, case, match, target):
    marker = tmp_path / "pwned"
    content = hostile_files(tmp_path, marker)[case]
    folder = tmp_path / "ckpt"
    shutil.copytree(DATA / "gpt2_z3_w2_fp32", folder)
    bad = folder / "global_step2" / target
    bad.write_bytes(content)
    before = digest(folder)
    with pytest.raises(ValueError) as info:
        load_deepspeed(folder)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{bad}: ")
    assert re.search(match, message), message
    assert digest(folder) == before
    assert not marker.exists()
    assert "deepspeed" not in sys.modules


def _copy(tmp_path, name="gpt2_z2_w2_bf16"):
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    return folder


@pytest.mark.parametrize(
    "damage, error, match",
    [
        (lambda f: (f / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink(),
         ValueError, r"expected 2 optimizer files \(partition_count\), found 1"),
        (lambda f: [p.unlink() for p in (f / "global_step2").glob("*optim_states.pt")],
         ValueError, "expected the ZeRO optimizer files"),
        (lambda f: (f / "latest").write_text("global_step9"),
         FileNotFoundError, r"global_step9: no such tag folder; the tags in .* \['global_step2'\]"),
        (lambda f: (f / "latest").write_text("../../etc"),
         ValueError, r"latest: expected the name of a tag folder beside it, found '\.\./\.\./etc'"),
        (lambda f: (f / "global_step2" / "mp_rank_00_model_states.pt").unlink(),
         ValueError, "expected a DeepSpeed checkpoint tag folder holding mp_rank_00_model_states"),
        (lambda f: (f / "global_step2" / "mp_rank_01_model_states.pt").write_bytes(b""),
         ValueError, "holds mp_rank_01_model_states.pt, a file of a tensor-parallel checkpoint"),
        (lambda f: (f / "global_step2" / "layer_01-model_00-model_states.pt").write_bytes(b""),
         ValueError, "a file of a pipeline-parallel checkpoint"),
        (lambda f: (f / "global_step2" / "expp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b""),
         ValueError, r"a file of an expert-parallel \(MoE\) checkpoint"),
        (lambda f: shutil.copy(
            DATA / "gpt2_z2_w1_fp32" / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            f / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
         ValueError, "both with and without the `bf16_` prefix"),
        (lambda f: shutil.copy(
            DATA / "t5_z2_w2_fp32" / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
            f / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
         ValueError, "from another run"),
    ],
)  # fmt: skip
def test_a_damaged_folder_is_named_and_left_alone(tmp_path, damage, error, match):
    folder = _copy(tmp_path)
    damage(folder)
    before = digest(folder)
    with pytest.raises(error, match=match) as info:
        DeepSpeedCheckpoint(folder)
    assert "\n" not in str(info.value)
    assert digest(folder) == before


def test_a_folder_that_is_not_a_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_deepspeed(tmp_path / "missing")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"found \['model.safetensors'\]; pass the folder"):
        load_deepspeed(tmp_path)


# -- docs ---------------------------------------------------------------------------------


def test_the_reference_page_examples_run(monkeypatch, capsys):
    page = Path(__file__).resolve().parents[2] / "docs" / "deepspeed.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 5
    monkeypatch.chdir(page.parents[1])  # the examples name the fixtures from the root
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/deepspeed.md block {i}", "exec"), {"__name__": "docs"})
    out = capsys.readouterr().out
    assert "19 torch.float32" in out and "3 2 global_step2" in out
    assert "refused: loading it would run code" in out and "pwned" not in out
    assert "deepspeed 3 2 ['exp_avg', 'exp_avg_sq']" in out  # the optimizer state


def test_a_folder_is_a_tensor_source_with_a_tie_report():
    with DeepSpeedCheckpoint(DATA / "t5_z2_w2_fp32") as ckpt:
        assert isinstance(ckpt, TensorSource) and ckpt.kind == "deepspeed"
        report = ckpt.report()
        array = ckpt.array("shared.weight")
        part = ckpt.read_slice("shared.weight", (slice(2, 5), slice(None)))
    assert report.alias_map == ckpt.ties == ckpt.shared_params
    assert {report.origin(a) for a in report.alias_map} == {"shared_params"}
    assert report.bytes_saved == 3 * 31 * 9 * 4
    assert len(report.parts) == 3 and report.parts[0].startswith("global_step2/mp_rank_00")
    assert array.dtype == "float32" and (part == array[2:5]).all()
    with DeepSpeedCheckpoint(DATA / "gpt2_z0_w2_bf16") as ckpt:
        assert ckpt.origins == {"lm_head.weight": "storage"}
        assert str(ckpt.array("transformer.wte.weight").dtype) == "bfloat16"


def test_the_output_may_not_be_an_input_or_an_existing_file(tmp_path):
    folder = _copy(tmp_path, "gpt2_z2_w1_fp32")
    out = tmp_path / "model.safetensors"
    with DeepSpeedCheckpoint(folder) as ckpt:
        plan, inputs = Plan.identity(ckpt), [folder]
        save_plan(out, plan, ckpt, inputs=inputs)
        with pytest.raises(FileExistsError):
            save_plan(out, plan, ckpt, inputs=inputs)
        save_plan(out, plan, ckpt, inputs=inputs, force=True)
        with pytest.raises(ValueError, match="would lie inside the input"):
            save_plan(folder / "global_step2" / "x.safetensors", plan, ckpt, inputs=inputs)
    state = load_safetensors(out)
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
