"""PyTorch Distributed Checkpoint folders read with numpy only: ``jaxshare.formats.dcp.reader``
and ``jaxshare.formats.dcp.metadata``.

The fixtures (``tests/data/dcp``, built by ``make_fixtures.py`` with the real
``torch.distributed.checkpoint.save``) are a one-process tied model (``flat``) and an
FSDP2 run on two gloo ranks saved as ``{"model", "optimizer", "train_state"}``
(``sharded``), each beside ``dcp_to_torch_save``'s output, which the reader must match
bit for bit. Bad folders are copies of the fixtures spoiled in ``tmp_path``: their
metadata edited with torch's own classes and pickled again, their files cut short. The
reader never imports torch (checked in a process where torch cannot be imported).
"""

from __future__ import annotations

import collections
import hashlib
import io
import itertools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from jaxshare import AliasMap
from jaxshare.formats import DCPFolder, is_dcp_folder
from jaxshare.formats.dcp.metadata import read_dcp_metadata

DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"
FIXTURES = ["flat", "sharded"]


def _bits(a) -> bytes:
    if isinstance(a, torch.Tensor):
        a = a.detach().contiguous().reshape(-1)
        return a.view(torch.uint8).numpy().tobytes() if a.numel() else b""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def _reference(name: str) -> dict:
    """``dcp_to_torch_save``'s output of fixture ``name``, flattened as DCP flattens it."""
    nested = torch.load(DATA / f"{name}.pt", weights_only=True)
    flat, _ = flatten_state_dict(nested)
    return flat


def _copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def _edit_metadata(folder: Path, edit) -> None:
    """Loads the folder's ``.metadata`` with torch's classes (our own fixture), lets
    ``edit`` change the ``Metadata``, and pickles it back as DCP does."""
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    edit(metadata)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def _one_line(e: pytest.ExceptionInfo, path: Path) -> str:
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    return message


# -- what the folders hold -------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_every_item_equals_dcp_to_torch_save_bit_for_bit(name):
    want = _reference(name)
    with DCPFolder(DATA / name, part=None) as f:
        assert f.kind == "dcp" and f.part is None
        assert set(f.infos) | set(f.other_items) == set(want)
        for fqn, info in f.infos.items():
            tensor = want[fqn]
            got = f.array(fqn)
            assert info.shape == got.shape == tuple(tensor.shape), fqn
            assert got.dtype.itemsize == tensor.element_size(), fqn
            assert _bits(got) == _bits(tensor), fqn
            assert _bits(f.read(fqn)) == _bits(tensor), fqn
            assert b"".join(_bits(b) for b in f.blocks(fqn)) == _bits(tensor), fqn
        for fqn in f.other_items:
            assert f.read_item(fqn) == want[fqn], fqn


def test_the_flat_fixture_is_its_state_dict_with_every_dtype():
    with DCPFolder(DATA / "flat") as f:
        assert f.part is None and f.notes == () and f.other_items == ()
        assert f.top_level == tuple(f.infos)  # a flat state dict: each key is top level
        assert list(f.infos)[:5] == [
            "gate",
            "calibration",
            "positions",
            "tokens_seen",
            "wte.weight",
        ]
        assert {f.infos[n].dtype for n in ("calibration", "positions", "fc.weight")} == {
            "bfloat16", "int64", "float32"
        }  # fmt: skip
        assert f.infos["tokens_seen"].shape == () and f.array("tokens_seen") == 14
        # DCP records no ties: the tied head is written again, as its own record.
        records = {
            n: f.metadata.tensors[n].chunks[0].record for n in ("wte.weight", "lm_head.weight")
        }
        assert dict(f.ties) == {} and records["wte.weight"] != records["lm_head.weight"]
        np.testing.assert_array_equal(f.array("lm_head.weight"), f.array("wte.weight"))
        assert f.parts == ("__0_0.distcp: 11 chunks, 17.7 KiB",)
        report = f.report()
        assert report.kind == "dcp" and set(report.arrays) == set(f.infos)


def test_nested_state_dicts_are_flattened_as_dcp_flattens_them():
    with DCPFolder(DATA / "sharded", part=None) as f:
        assert f.top_level == ("model", "optimizer", "train_state")
        names = set(f.infos)
        assert {"model.wte.weight", "model.probe.colwise", "optimizer.state.fc.weight.exp_avg",
                "optimizer.state.gate.step"} <= names  # fmt: skip
        assert "optimizer.param_groups.0.lr" in f.other_items
        assert "train_state.step" in f.other_items and f.read_item("train_state.step") == 3
        assert f.read_item("optimizer.param_groups.0.betas") == (0.9, 0.999)
        assert f.metadata.keys["model.wte.weight"] == ("model", "wte.weight")
        assert f.metadata.keys["optimizer.param_groups.0.lr"] == (
            "optimizer", "param_groups", 0, "lr"
        )  # fmt: skip
        (items,) = f.notes  # The items that are not tensors, listed (and never read so).
        assert items.startswith("items that are not tensors: optimizer.param_groups.0.lr, ")
        assert items.endswith(" (+5 more)")


def test_a_training_checkpoint_shows_its_model_with_one_line_on_the_rest():
    want = _reference("sharded")
    with DCPFolder(DATA / "sharded") as f:
        assert f.part == "model" and f.other_items == ()
        assert list(f.infos)[:3] == ["gate", "calibration", "positions"]
        assert all(f"model.{n}" in want for n in f.infos)
        assert f.notes == (
            "also holds: optimizer (21 tensors, 12 other items), train_state (1 other item)",
        )
        for name in f.infos:
            assert _bits(f.array(name)) == _bits(want[f"model.{name}"]), name
    with DCPFolder(DATA / "sharded", part="optimizer") as f:
        assert "state.wte.weight.exp_avg_sq" in f.infos and "param_groups.0.lr" in f.other_items
        assert f.notes[0].startswith("items that are not tensors: param_groups.0.lr, ")
        assert f.notes[1:] == ("also holds: model (13 tensors), train_state (1 other item)",)
        assert _bits(f.array("state.fc.weight.exp_avg")) == _bits(
            want["optimizer.state.fc.weight.exp_avg"]
        )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_newer_torchtitan_layout_keeps_model_keys_at_the_top(tmp_path):
    """torchtitan now saves the model's keys at the top level, beside ``optimizer``..."""
    import torch.distributed.checkpoint as dcp

    state = {
        "tok_embeddings.weight": torch.arange(12.0).reshape(4, 3),
        "norm.weight": torch.ones(3),
        "optimizer": {"state": {"norm.weight": {"exp_avg": torch.zeros(3)}}},
        "lr_scheduler": {"last_epoch": 7},
        "train_state": {"step": 7},
    }
    dcp.save(state, checkpoint_id=tmp_path / "step-7", no_dist=True)
    with DCPFolder(tmp_path / "step-7") as f:
        assert f.part == "model" and list(f.infos) == ["tok_embeddings.weight", "norm.weight"]
        assert f.notes == (
            "also holds: optimizer (1 tensor), lr_scheduler (1 other item), "
            "train_state (1 other item)",
        )
    with DCPFolder(tmp_path / "step-7", part="lr_scheduler") as f:
        assert f.read_item("last_epoch") == 7


def test_a_part_the_folder_lacks_is_refused_naming_the_keys():
    with pytest.raises(ValueError, match=r"`part` 'model' is not a top-level key") as e:
        DCPFolder(DATA / "flat", part="model")
    _one_line(e, DATA / "flat")


def test_is_dcp_folder(tmp_path):
    assert is_dcp_folder(DATA / "flat") and is_dcp_folder(DATA / "sharded")
    assert not is_dcp_folder(tmp_path) and not is_dcp_folder(DATA / "flat.pt")
    (tmp_path / ".metadata").write_bytes(b"")
    assert not is_dcp_folder(tmp_path)  # no data files


# -- chunks and slices -----------------------------------------------------------------


def test_chunks_are_what_each_rank_stored():
    with DCPFolder(DATA / "sharded") as f:
        assert f.chunks("fc.weight") == [
            ((0, 0), (4, 6), "__0_0.distcp"),  # 7 rows over 2 ranks: 4 + 3
            ((4, 0), (3, 6), "__1_0.distcp"),
        ]
        assert f.chunks("gate") == [((0,), (1,), "__0_0.distcp"), ((1,), (0,), "__1_0.distcp")]
        assert f.chunks("rope_cache") == [((0, 0), (3, 4), "__1_0.distcp")]  # Replicate: once
        assert [c[:2] for c in f.chunks("probe.colwise")] == [((0, 0), (3, 3)), ((0, 3), (3, 2))]
        assert f.parts == (
            "__0_0.distcp: 24 chunks, 37.8 KiB",
            "__1_0.distcp: 33 chunks, 13 other items, 67.3 KiB",
        )


def test_read_slice_reads_only_the_chunks_it_overlaps():
    with DCPFolder(DATA / "sharded") as f:
        whole = f.array("fc.weight")
        row = 6 * 4  # bytes of one float32 row
        cases = [
            ((slice(0, 2),), 4 * row),  # inside rank 0's chunk
            ((slice(5, 7), slice(1, 3)), 3 * row),  # inside rank 1's
            ((slice(3, 5),), 7 * row),  # across both
        ]
        for index, chunk_bytes in cases:
            before = f.bytes_read
            got = f.read_slice("fc.weight", index)
            assert f.bytes_read - before == chunk_bytes, index
            np.testing.assert_array_equal(got, whole[index])
        assert 4 * row < whole.nbytes
        before = f.bytes_read
        got = f.read_slice("probe.colwise", (slice(None), slice(0, 2)))  # column shards
        assert f.bytes_read - before == 3 * 3 * 4
        np.testing.assert_array_equal(got, f.array("probe.colwise")[:, :2])
        assert f.read_slice("gate", (slice(0, 1),)).tolist() == f.array("gate").tolist()
        assert f.read_slice("tokens_seen", ()).shape == ()


def test_whole_chunks_are_views_of_the_mapped_files():
    with DCPFolder(DATA / "sharded") as f:
        one = f.array("rope_cache")  # a single chunk: no copy
        assert not one.flags.writeable and not one.flags.owndata
        blocks = list(f.blocks("fc.weight"))  # row shards stream as they are
        assert [b.shape for b in blocks] == [(4, 6), (3, 6)]
        assert all(not b.flags.writeable and not b.flags.owndata for b in blocks)
        assembled = f.array("fc.weight")
        assert assembled.flags.owndata and assembled.shape == (7, 6)


def _grid(shape, cuts):
    """Every box (offsets, ends) of the grid that ``cuts`` (per axis) make of ``shape``."""
    if not shape:
        return [((), ())]
    axes = [list(zip([0, *c], [*c, n], strict=True)) for n, c in zip(shape, cuts, strict=True)]
    return [tuple(zip(*box, strict=True)) for box in itertools.product(*axes)]


@st.composite
def _shardings(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    cuts = [sorted(set(draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=3)))) if n > 1
            else [] for n in shape]  # fmt: skip
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.bool]))
    ranks = draw(st.integers(1, 5))
    raw = draw(st.booleans())
    return shape, cuts, dtype, ranks, raw


def _write_folder(folder: Path, tensors: dict, ranks: int, raw: bool) -> None:
    """A DCP folder as ``FileSystemWriter`` lays one out, by hand: each chunk a record
    (``torch.save`` of the chunk, or its raw bytes) in its rank's file."""
    folder.mkdir()
    files = [io.BytesIO() for _ in range(ranks)]
    items, storage, planner = {}, {}, {}
    for fqn, (tensor, boxes) in tensors.items():
        chunks = []
        for i, (offsets, ends) in enumerate(boxes):
            sizes = tuple(e - o for o, e in zip(offsets, ends, strict=True))
            part = tensor[tuple(slice(o, e) for o, e in zip(offsets, ends, strict=True))]
            rank = i % ranks
            start = files[rank].tell()
            if raw:
                files[rank].write(_bits(part))
            else:
                torch.save(part.clone(), files[rank])
            length = files[rank].tell() - start
            chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            storage[MetadataIndex(fqn, offsets)] = _StorageInfo(f"__{rank}_0.distcp", start, length)
        items[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=tensor.dtype), tensor.shape, chunks
        )
        planner[fqn] = (fqn,)
    for rank, f in enumerate(files):
        (folder / f"__{rank}_0.distcp").write_bytes(f.getvalue())
    metadata = Metadata(items, planner_data=planner, storage_data=storage, version="1.0.0")
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


@settings(max_examples=30, deadline=None)
@given(_shardings(), st.randoms(use_true_random=False))
def test_any_grid_of_chunks_over_any_number_of_ranks_reads_bit_exact(sharding, rnd):
    shape, cuts, dtype, ranks, raw = sharding
    values = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 100
    tensor = values.to(dtype)
    boxes = _grid(shape, cuts)
    rnd.shuffle(boxes)  # ranks store their boxes in any order
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        _write_folder(folder, {"w": (tensor, boxes)}, ranks, raw)
        with DCPFolder(folder) as f:
            assert f.infos["w"].shape == shape
            assert _bits(f.array("w")) == _bits(tensor)
            assert b"".join(_bits(b) for b in f.blocks("w")) == _bits(tensor)
            index = tuple(slice(*sorted((rnd.randint(0, n), rnd.randint(0, n)))) for n in shape)
            assert _bits(f.read_slice("w", index)) == _bits(tensor[index])


def test_raw_records_are_read_as_the_chunks_bytes():
    """A record exactly ``prod(sizes) * itemsize`` long is the chunk's raw bytes."""
    tensor = torch.arange(35, dtype=torch.float32).reshape(7, 5).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "raw"
        _write_folder(folder, {"w": (tensor, [((0, 0), (4, 5)), ((4, 0), (7, 5))])}, 2, raw=True)
        assert (folder / "__0_0.distcp").stat().st_size == 4 * 5 * 2
        with DCPFolder(folder) as f:
            assert [b.flags.owndata for b in f.blocks("w")] == [False, False]
            assert _bits(f.array("w")) == _bits(tensor)


def test_two_fqns_over_one_record_are_a_tie_and_the_alias_map_beside_is_read(tmp_path):
    folder = _copy("flat", tmp_path)

    def share(metadata):
        index = MetadataIndex("wte.weight", (0, 0))
        metadata.storage_data[MetadataIndex("lm_head.weight", (0, 0))] = metadata.storage_data[
            index
        ]

    _edit_metadata(folder, share)
    with DCPFolder(folder) as f:
        assert dict(f.ties) == {"lm_head.weight": "wte.weight"}
        assert f.origins == {"lm_head.weight": "storage"} and f.written_out == frozenset()
        assert f.report().bytes_saved == 11 * 6 * 4
    (folder / "jaxshare_alias_map.json").write_text(
        AliasMap({"proj.weight": "fc.weight"}, transforms={"proj.weight": (1, 0)}).to_json()
    )
    with DCPFolder(folder) as f:
        assert dict(f.ties) == {"lm_head.weight": "wte.weight", "proj.weight": "fc.weight"}
        assert f.ties.transforms == {"proj.weight": (1, 0)}
        assert f.origins["proj.weight"] == "alias map" and f.written_out == {"proj.weight"}
    (folder / "jaxshare_alias_map.json").write_text(AliasMap({"x": "nope.weight"}).to_json())
    with pytest.raises(ValueError, match="'nope.weight'; expected a tensor of the folder") as e:
        DCPFolder(folder)
    _one_line(e, folder / "jaxshare_alias_map.json")


# -- bad input: one line, naming the file ----------------------------------------------


def test_a_truncated_distcp_is_refused_with_the_bytes_expected_and_found(tmp_path):
    folder = _copy("sharded", tmp_path)
    with open(folder / "__1_0.distcp", "r+b") as f:
        f.truncate(30000)
    with pytest.raises(ValueError, match="truncated: expected at least 68946 bytes") as e:
        DCPFolder(folder)
    assert _one_line(e, folder / "__1_0.distcp").endswith("found 30000.")


def test_a_missing_rank_file_is_refused(tmp_path):
    folder = _copy("sharded", tmp_path)
    (folder / "__1_0.distcp").unlink()
    with pytest.raises(ValueError, match="no such file; the metadata puts the record") as e:
        DCPFolder(folder)
    _one_line(e, folder / "__1_0.distcp")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: c.pop(1), r"no chunk holds \[4:7, 0:6\] \(from element \(4, 0\)\)"),
        (lambda c: c.append(c[0]), r"chunks 0 .* and 2 .* overlap at element \(0, 0\)"),
    ],
    ids=["missing", "overlapping"],
)
def test_chunks_that_do_not_tile_their_tensor_are_refused(tmp_path, edit, match):
    folder = _copy("sharded", tmp_path)
    _edit_metadata(folder, lambda m: edit(m.state_dict_metadata["model.fc.weight"].chunks))
    with pytest.raises(ValueError, match=match) as e:
        DCPFolder(folder)
    message = _one_line(e, folder / ".metadata")
    assert "tensor 'model.fc.weight' of shape (7, 6)" in message


def test_sizes_that_disagree_with_the_records_are_refused_when_read(tmp_path):
    folder = _copy("flat", tmp_path)

    def shrink(metadata):
        item = metadata.state_dict_metadata["fc.bias"]
        item.size = item.chunks[0].sizes = torch.Size([6])

    _edit_metadata(folder, shrink)
    with DCPFolder(folder) as f:
        assert f.infos["fc.bias"].shape == (6,)
        with pytest.raises(ValueError, match=r"expected a float32 tensor of shape \(6,\)") as e:
            f.array("fc.bias")
        assert _one_line(e, folder / "__0_0.distcp").endswith(
            "found a float32 tensor of shape (7,)."
        )


def test_a_damaged_record_is_refused_when_read(tmp_path):
    folder = _copy("flat", tmp_path)
    with DCPFolder(folder) as f:
        record = next(c.record for c in f.metadata.tensors["fc.weight"].chunks)
    data = bytearray((folder / record.file).read_bytes())
    data[record.offset : record.offset + record.length] = bytes(record.length)
    (folder / record.file).write_bytes(bytes(data))
    with DCPFolder(folder) as f:
        with pytest.raises(ValueError, match="raw bytes or a torch.save record of it") as e:
            f.array("fc.weight")
        _one_line(e, folder / record.file)
        np.testing.assert_array_equal(f.array("fc.bias").shape, (7,))  # the rest reads


class _Payload:
    """Runs ``touch MARKER`` when unpickled by pickle itself."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["whole", "planner_data", "storage_data"])
def test_a_hostile_metadata_is_refused_and_its_payload_never_runs(tmp_path, where):
    folder = _copy("flat", tmp_path)
    marker = tmp_path / "ran"
    if where == "whole":
        (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    else:
        _edit_metadata(folder, lambda m: setattr(m, where, _Payload(marker)))
    with pytest.raises(ValueError, match=r"refused: not DCP metadata: it names posix\.system") as e:
        DCPFolder(folder)
    _one_line(e, folder / ".metadata")
    with pytest.raises(ValueError, match="posix.system"):
        read_dcp_metadata(folder / ".metadata")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (pickle.dumps(collections.Counter("ab")), "it names collections.Counter"),
        (pickle.dumps({"state_dict_metadata": {}}), "expected a Metadata, found a dict"),
        (b"not a pickle at all", "not DCP metadata jaxshare can read"),
        (b"", "not DCP metadata jaxshare can read"),
    ],
    ids=["foreign-class", "foreign-object", "garbage", "empty"],
)  # fmt: skip
def test_a_foreign_metadata_is_refused_in_one_line(tmp_path, content, match):
    folder = _copy("flat", tmp_path)
    (folder / ".metadata").write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        DCPFolder(folder)
    _one_line(e, folder / ".metadata")


def test_a_hostile_record_is_refused_and_its_payload_never_runs(tmp_path):
    folder = _copy("sharded", tmp_path)
    marker = tmp_path / "ran"
    evil = io.BytesIO()
    torch.save(_Payload(marker), evil)
    with open(folder / "__1_0.distcp", "ab") as f:
        start = f.tell()
        f.write(evil.getvalue())

    def point(metadata):
        record = _StorageInfo("__1_0.distcp", start, len(evil.getvalue()))
        metadata.storage_data[MetadataIndex("train_state.step")] = record
        metadata.storage_data[MetadataIndex("model.rope_cache", (0, 0))] = record

    _edit_metadata(folder, point)
    with DCPFolder(folder) as f:
        with pytest.raises(ValueError, match="refused: .*posix.system") as e:
            f.array("rope_cache")
        _one_line(e, folder / "__1_0.distcp")
    with DCPFolder(folder, part="train_state") as f:
        with pytest.raises(ValueError, match="refused: unpickling it would run code") as e:
            f.read_item("step")
        _one_line(e, folder / "__1_0.distcp")
    assert not marker.exists()


def test_records_outside_the_folder_or_transformed_are_refused(tmp_path):
    folder = _copy("flat", tmp_path)
    index = MetadataIndex("fc.bias", (0,))

    def escape(metadata):
        metadata.storage_data[index].relative_path = "../flat.pt"

    _edit_metadata(folder, escape)
    with pytest.raises(ValueError, match="is in '../flat.pt'; expected a file name inside") as e:
        DCPFolder(folder)
    _one_line(e, folder / ".metadata")

    def compress(metadata):
        metadata.storage_data[index].relative_path = "__0_0.distcp"
        metadata.storage_data[index].transform_descriptors = ["stream.zstd/1"]

    _edit_metadata(folder, compress)
    with pytest.raises(ValueError, match=r"stream transform\(s\) \['stream.zstd/1'\]") as e:
        DCPFolder(folder)
    _one_line(e, folder / "__0_0.distcp")


def test_records_that_overlap_are_refused(tmp_path):
    folder = _copy("flat", tmp_path)

    def overlap(metadata):
        weight = metadata.storage_data[MetadataIndex("fc.weight", (0, 0))]
        bias = metadata.storage_data[MetadataIndex("fc.bias", (0,))]
        bias.offset = weight.offset + 100

    _edit_metadata(folder, overlap)
    with pytest.raises(ValueError, match="the records of 'fc.weight' and 'fc.bias' overlap") as e:
        DCPFolder(folder)
    _one_line(e, folder / "__0_0.distcp")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("tensors", [1, 3])
def test_dcps_safetensors_serialization_is_refused_not_misread(tmp_path, tensors):
    """``FileSystemWriter(serialization_format=SAFETENSORS)`` puts one safetensors blob
    where the metadata says each tensor's raw bytes are (torch cannot read it back)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    state = {f"w{i}": torch.arange(6.0 + i) for i in range(tensors)}
    writer = FileSystemWriter(tmp_path / "st", serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save({**state, "step": 3}, storage_writer=writer, no_dist=True)
    with pytest.raises(ValueError, match=r"serialization_format=SAFETENSORS\), whose") as e:
        DCPFolder(tmp_path / "st")
    _one_line(e, tmp_path / "st" / "__0_0.distcp")


def test_metadata_over_the_size_limit_is_refused(tmp_path):
    with pytest.raises(ValueError, match="over the 1.0 KiB a DCP metadata file is read up to") as e:
        DCPFolder(DATA / "flat", max_metadata_bytes=1024)
    _one_line(e, DATA / "flat" / ".metadata")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        DCPFolder(tmp_path / "nothing")


# -- without torch ---------------------------------------------------------------------

NO_TORCH = """
import hashlib, json, sys
sys.modules["torch"] = None
from jaxshare.formats.dcp.reader import DCPFolder
out = {}
for path in sys.argv[1:]:
    with DCPFolder(path, part=None) as f:
        for name in f.infos:
            a = f.array(name)
            out[f"{path}:{name}"] = hashlib.sha256(a.tobytes()).hexdigest()
        for name in f.other_items:
            out[f"{path}:{name}"] = repr(f.read_item(name))
assert sys.modules["torch"] is None
print(json.dumps({"items": out, "jax": "jax" in sys.modules}))
"""


@pytest.mark.subprocess
def test_the_reader_needs_neither_torch_nor_jax():
    paths = [str(DATA / name) for name in FIXTURES]
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *paths], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["jax"] is False
    want = {}
    for name, path in zip(FIXTURES, paths, strict=True):
        for fqn, value in _reference(name).items():
            want[f"{path}:{fqn}"] = (
                hashlib.sha256(_bits(value)).hexdigest()
                if isinstance(value, torch.Tensor)
                else repr(value)
            )
    assert result["items"] == want


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_cold_records_archive_is_read_page_by_page(tmp_path, drop_cache, cached_mib):
    """A record (a torch.save archive) of a folder the page cache lacks: its
    directory and headers are read page by page, not with the kernel's 8 MiB
    read-around, so that a tensor then read past the cache is not read twice."""
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.arange(6 * 2**20, dtype=torch.float32).reshape(3 * 2**10, 2**11)}
    dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    (data,) = (tmp_path / "ckpt").glob("*.distcp")
    drop_cache(data)
    with DCPFolder(tmp_path / "ckpt") as f:
        assert f.array("w").shape == (3 * 2**10, 2**11)  # (A view: no values read.)
        resident = cached_mib(data)
        assert not any(resident[1:-1]), resident  # (Beyond the archive's head and tail.)
        assert np.array_equal(f.array("w"), state["w"].numpy())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_cold_folders_records_are_read_ahead_at_their_ends_only(
    tmp_path, drop_cache, cached_mib, resident
):
    """A conversion reads each large tensor of a cold folder past the page cache;
    its record's headers and directory, which finding the values reads page by
    page, are read ahead into the cache, and nothing of the values is."""
    import torch.distributed.checkpoint as dcp

    from jaxshare.io.mapped import file_extent, map_file
    from jaxshare.io.plan import Plan

    state = {
        "a": torch.arange(2**20, dtype=torch.float32).reshape(2**10, 2**10),
        "b": torch.ones(3 * 2**18, dtype=torch.bfloat16),
    }
    dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    (data,) = (tmp_path / "ckpt").glob("*.distcp")
    with DCPFolder(tmp_path / "ckpt") as f:
        plan = Plan.identity(f)
        values = {
            name: file_extent(f.array(name))[1:]  # type: ignore[index]
            for name in f.infos
        }
        drop_cache(data)
        with plan.prefetch(f) as ahead:
            ahead.reached(len(plan.entries) - 1)
            ahead._thread.join(timeout=30)
            ranges = [ahead._extents(i) for i in range(len(plan.entries))]
        whole = map_file(data)
        for entry, read in zip(plan.entries, ranges, strict=True):
            ((_, start, length),) = f.extents(entry.source)
            at, n = values[entry.source]
            # The bytes around the values, and no more than twice as many.
            covered = np.zeros(length, bool)
            for _, offset, size in read:
                covered[offset - start : offset - start + size] = True
            assert covered[: at - start].all() and covered[at + n - start :].all(), entry
            assert sum(size for *_, size in read) <= 2 * (length - n)
            for _, offset, size in read:  # (Asked for: read by the disk in a moment.)
                deadline = time.monotonic() + 10
                while not resident(whole[offset : offset + size]):
                    assert time.monotonic() < deadline, (entry, offset, size)
                    time.sleep(0.01)
        assert not any(cached_mib(data)[1:-1])  # (The values, read past the cache.)
