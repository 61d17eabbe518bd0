"""``jaxshare.formats``: the safetensors format with numpy only -- headers checked
before any tensor is read, tensors streamed out one at a time, ties in the metadata."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from jaxshare import AliasMap
from jaxshare.formats import (
    ALIAS_MAP_KEY,
    SafetensorsFile,
    TensorSpec,
    alias_map_in,
    inspect_safetensors,
    read_header,
    write_safetensors,
)
from jaxshare.formats.safetensors import dtype_code, is_safetensors_file, tie_metadata

TENSORS = {
    "wte": np.arange(12, dtype=np.float32).reshape(3, 4),
    "half": np.arange(6, dtype=np.float16).reshape(2, 3),
    "bf16": np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16),
    "ids": np.array([[1, -2], [3, -4]], np.int64),
    "mask": np.array([True, False, True]),
    "empty": np.zeros((0, 5), np.float32),
    "scalar": np.array(7, np.int32),
}


def _write(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    specs = [TensorSpec(name, a.shape, a.dtype) for name, a in tensors.items()]
    with write_safetensors(path, specs, metadata) as write:
        for a in tensors.values():
            write([a])


def test_what_is_streamed_out_any_reader_reads_back_bit_for_bit(tmp_path):
    path = tmp_path / "w.safetensors"
    _write(path, TENSORS, {"format": "np"})
    theirs = load_file(path)
    with SafetensorsFile(path) as mine:
        for name, want in TENSORS.items():
            for got in (theirs[name], mine.array(name)):
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert got.tobytes() == want.tobytes(), name
        assert not mine.array("wte").flags.writeable  # A view of the mapped file.
    header = read_header(path)
    assert list(header.tensors) == list(TENSORS)  # In the order of their data.
    assert header.metadata == {"format": "np"} and header.data_start % 8 == 0


def test_a_tensor_may_be_written_in_blocks(tmp_path):
    path = tmp_path / "w.safetensors"
    big = np.arange(1000, dtype=np.float32).reshape(10, 100)
    with write_safetensors(path, [TensorSpec("big", big.shape, big.dtype)]) as write:
        write(big[i : i + 3] for i in range(0, 10, 3))
    np.testing.assert_array_equal(load_file(path)["big"], big)


@pytest.mark.parametrize(
    "blocks, match",
    [
        ([np.ones(3, np.float64)], r"'w': expected float32, got float64"),
        ([np.ones(2, np.float32)], r"'w': expected 12 bytes, got 8"),
        (None, r"wrote 0 of 1 tensors"),
    ],
)
def test_a_bad_write_leaves_nothing_behind(tmp_path, blocks, match):
    path = tmp_path / "w.safetensors"
    with pytest.raises(ValueError, match=match):
        with write_safetensors(path, [TensorSpec("w", (3,), np.dtype(np.float32))]) as write:
            if blocks is not None:
                write(blocks)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_replaced_only_with_force(tmp_path):
    path = tmp_path / "w.safetensors"
    _write(path, {"a": np.zeros(2, np.float32)})
    with pytest.raises(FileExistsError):
        _write(path, {"b": np.ones(2, np.float32)})
    assert list(load_file(path)) == ["a"]
    spec = TensorSpec("b", (2,), np.dtype(np.float32))
    with write_safetensors(path, [spec], force=True) as write:
        write([np.ones(2, np.float32)])
    assert list(load_file(path)) == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == [
        "w.safetensors"
    ]


def test_dtype_codes_and_what_safetensors_cannot_store():
    assert dtype_code(np.dtype(ml_dtypes.bfloat16), "w") == "BF16"
    assert dtype_code(np.dtype(np.bool_), "w") == "BOOL"
    with pytest.raises(ValueError, match=r"'layer/w' has dtype complex64, which safetensors"):
        dtype_code(np.dtype(np.complex64), "layer/w")


def test_ties_travel_in_the_metadata(tmp_path):
    path = tmp_path / "tied.safetensors"
    ties = AliasMap({"lm_head": "wte", "dec": "wte"}, transforms={"lm_head": (1, 0)})
    _write(path, {"wte": TENSORS["wte"]}, tie_metadata(ties))
    header = read_header(path)
    assert json.loads(header.metadata[ALIAS_MAP_KEY])["aliases"]["lm_head"] == {
        "target": "wte",
        "permute": [1, 0],
    }
    assert alias_map_in(header) == ties
    assert alias_map_in(header).transform("lm_head") == (1, 0)
    report = inspect_safetensors(path)
    assert report.bytes_stored == TENSORS["wte"].nbytes
    assert report.bytes_saved == 2 * TENSORS["wte"].nbytes  # Two aliases not written.


def test_a_plain_file_has_no_ties(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"w": np.ones(2, np.float32)}, path)
    assert alias_map_in(read_header(path)) == AliasMap()
    assert inspect_safetensors(path).bytes_saved == 0


@pytest.mark.parametrize(
    "ties, match",
    [
        (AliasMap({"b": "missing"}), r"alias 'b' names canonical 'missing', which the file"),
        (
            AliasMap({"b": "wte"}, transforms={"b": (2, 0, 1)}),
            r"alias 'b' permutes 3 axes, but 'wte' has shape \(3, 4\)",
        ),
    ],
)
def test_ties_that_do_not_fit_the_file_are_refused(tmp_path, ties, match):
    path = tmp_path / "w.safetensors"
    _write(path, {"wte": TENSORS["wte"]}, tie_metadata(ties))
    with pytest.raises(ValueError, match=f"{path}: metadata 'jaxshare.alias_map' does not fit"):
        alias_map_in(read_header(path))
    with pytest.raises(ValueError, match=match):
        alias_map_in(read_header(path))


@pytest.mark.parametrize(
    ("metadata", "ties"),
    [
        ({"lm_head.weight": "wte"}, {"lm_head.weight": "wte"}),  # save_model's record
        ({"format": "pt", "note": "a text"}, {}),  # names no stored tensor
        ({"a/b": "wte"}, {}),  # no PyTorch name: a '/'
        ({"": "wte"}, {}),  # nor empty
        ({"w.": "wte"}, {}),  # nor an empty part
        ({"a b": "wte"}, {}),  # nor spaces
        ({"x": "wte", "y": "x"}, {"x": "wte"}),  # 'x' is stored by no name: not 'y''s
    ],
    ids=["record", "text", "slash", "empty", "empty-part", "space", "chain"],
)
def test_only_metadata_that_can_be_a_save_model_record_is_a_tie(tmp_path, metadata, ties):
    path = tmp_path / "w.safetensors"
    _write(path, {"wte": TENSORS["wte"]}, metadata)
    with SafetensorsFile(path) as file:  # (Opens, whatever the metadata says.)
        assert dict(file.ties) == ties
        assert file.origins == dict.fromkeys(ties, "save_model metadata")
        assert file.infos.keys() == {"wte"}


@given(st.dictionaries(st.text(max_size=8), st.sampled_from(["wte", "x", "", "wte/0"])))
@settings(max_examples=60, deadline=None)
def test_no_metadata_makes_a_file_unreadable(metadata):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.safetensors"
        _write(path, {"wte": TENSORS["wte"]}, metadata)
        with SafetensorsFile(path) as file:
            assert all(c == "wte" for c in dict(file.ties).values())
            assert file.array("wte").tobytes() == TENSORS["wte"].tobytes()


def test_metadata_that_is_no_alias_map_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    _write(path, {"wte": TENSORS["wte"]}, {ALIAS_MAP_KEY: '{"format": "other"}'})
    with pytest.raises(ValueError, match=r"metadata 'jaxshare.alias_map' is invalid"):
        alias_map_in(read_header(path))


def _raw(header: dict | bytes, data: bytes = b"", size: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if size is None else size) + text + data


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x01\x02", r"the file has 2 bytes, fewer than the 8 of a header size"),
        (_raw({"w": ENTRY}, b"\x00" * 8, size=10_000), r"runs past the end of the file"),
        (_raw({"w": ENTRY}, b"\x00" * 8, size=200_000_000), r"over the limit of 100000000"),
        (_raw(b"\xff\xfe", b""), r"the header is not UTF-8 text"),
        (_raw(b"[1, 2]"), r"the header is a JSON list, not an object"),
        (_raw(b'{"w": 1, "w": 2}'), r"the header JSON repeats the key 'w'"),
        (_raw({"w": {**ENTRY, "dtype": "F33"}}, b"\x00" * 8), r"unknown dtype 'F33'"),
        (_raw({"w": {**ENTRY, "shape": [3]}}, b"\x00" * 8), r"needs 12 bytes, but its data"),
        (
            _raw({"w": {**ENTRY, "data_offsets": [4, 12]}}, b"\x00" * 12),
            r"tensor 'w' starts at data offset 4, expected 0",
        ),
        (_raw({"w": ENTRY}, b"\x00" * 4), r"the tensors need 8 bytes .* the file is truncated"),
        (_raw({"w": ENTRY}, b"\x00" * 9), r"holds 9 bytes of data .* account for 8"),
        (_raw({"__metadata__": {"a": 1}}), r"'__metadata__' must map strings to strings"),
    ],
)
def test_a_broken_header_is_refused_in_one_line_naming_the_file(tmp_path, content, match):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        read_header(path)
    message = str(e.value)
    assert message.startswith(f"{path}: not a valid safetensors file: ") and "\n" not in message
    assert not is_safetensors_file(path)


@pytest.mark.subprocess
def test_the_format_layer_imports_no_framework():
    code = (
        "import sys, jaxshare.formats; "
        "print([m for m in ('jax', 'torch', 'orbax.checkpoint', 'flax') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]"]
