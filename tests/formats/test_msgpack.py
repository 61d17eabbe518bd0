"""Flax msgpack files read with numpy only: ``MsgpackFile`` over files written by the real
``flax.serialization.to_bytes``, compared with ``msgpack_restore`` bit for bit; views of the
mapped file; chunked arrays; sharded Hugging Face directories; hostile files refused.

Hostile files are crafted with ``msgpack`` itself (flax's encoder), so each one differs from
what flax writes in exactly the way its test names.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import flax.serialization
import ml_dtypes
import msgpack
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.formats import (
    FLAX_INDEX,
    FLAX_WEIGHTS,
    WEIGHT_SUFFIXES,
    MsgpackFile,
    hf_weights,
    open_weights_file,
)
from jaxshare.formats.msgpack import DTYPES, MAX_DEPTH, MAX_RECORDS_BYTES, read_msgpack
from jaxshare.internal import check_not_a_shard, is_hf_directory
from jaxshare.io.mapped import copy_view, file_extent

DTYPE_NAMES = sorted(DTYPES)
PREFIX = "not a Flax msgpack file jaxshare can read: "


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, name))


def _values(name: str, shape: tuple[int, ...], raw: bytes | None = None) -> np.ndarray:
    """An array of ``shape``: ``raw`` bytes as its bits (any bit pattern: NaNs,
    denormals), or a ramp."""
    dtype = _dtype(name)
    n = math.prod(shape)
    if raw is None:
        values = np.arange(n).astype(dtype) if name != "bool" else np.arange(n) % 3 == 0
        return values.reshape(shape)
    if name == "bool":
        raw = bytes(b & 1 for b in raw)
    return np.frombuffer(raw, dtype, count=n).reshape(shape).copy()


def _bits(a) -> tuple:
    a = np.asarray(a)
    return a.dtype.name, a.shape, np.ascontiguousarray(a).tobytes()


def _write(path: Path, tree) -> Path:
    path.write_bytes(flax.serialization.to_bytes(tree))
    return path


def _same_leaf(got, want) -> None:
    if isinstance(want, np.ndarray | np.generic):
        assert _bits(got) == _bits(want)
    elif isinstance(want, float):
        assert type(got) is float and struct.pack("<d", got) == struct.pack("<d", want)
    else:
        assert type(got) is type(want) and got == want


def _check_against_flax(path: Path, tree) -> None:
    """Every leaf of ``path`` reads as ``msgpack_restore`` reads it, in the order and
    with the paths of ``flatten_dict(tree, sep="/")``."""
    want = flatten_dict(flax.serialization.msgpack_restore(path.read_bytes()), sep="/")
    assert list(want) == list(flatten_dict(flax.serialization.to_state_dict(tree), sep="/"))
    with MsgpackFile(path) as f:
        assert list(f.contents.leaves) == list(want)
        arrays = [k for k, v in want.items() if isinstance(v, np.ndarray | np.generic)]
        assert list(f.infos) == arrays
        assert list(f.scalars) == [k for k in want if k not in arrays]
        for name, value in want.items():
            if name in f.infos:
                got = f.array(name)
                assert not got.flags.writeable, name
                assert f.infos[name].shape == got.shape and f.infos[name].dtype == got.dtype.name
                _same_leaf(got, np.asarray(value))
            else:
                _same_leaf(f.scalars[name], value)
        assert f.ties == {} and f.kind == "msgpack" and f.mapped


def _assert_a_view_of(view: np.ndarray, path: Path, want: bytes) -> None:
    """``view`` lies in a map of the file ``path`` (not a copy), over the bytes ``want``."""
    mapped, offset, length = file_extent(view)
    assert os.path.samefile(mapped, path) and length == view.nbytes
    assert path.read_bytes()[offset : offset + length] == want


# -- what flax writes reads back ---------------------------------------------------------


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_dtype_reads_bit_exact_as_a_view_of_the_mapped_file(tmp_path, name):
    tree = {
        "params": {"w": _values(name, (3, 4)), "empty": _values(name, (0, 2))},
        "zero_d": _values(name, ()),
        "scalar": _values(name, ())[()],  # a numpy scalar: ext type 3
    }
    path = _write(tmp_path / "flax_model.msgpack", tree)
    _check_against_flax(path, tree)
    with MsgpackFile(path) as f:
        view = f.array("params/w")
        _assert_a_view_of(view, path, tree["params"]["w"].tobytes())
        assert f.read_slice("params/w", (slice(1, 3), slice(None, None, 2))).tobytes() == (
            tree["params"]["w"][1:3, ::2].tobytes()
        )
        assert f.infos["scalar"].shape == () and f.infos["params/empty"].shape == (0, 2)


def test_python_scalars_are_leaves_that_are_no_arrays(tmp_path):
    tree = {
        "step": 3,
        "big": 2**64 - 1,
        "neg": -(2**63),
        "lr": 1e-3,
        "name": "gpt2",
        "blob": b"\x00\xff",
        "done": False,
        "none": None,
        "z": 1 - 2j,
        "layers": [np.ones(2, np.float32), 7],  # to_bytes writes lists as maps '0', '1'
        "nothing": {},  # flatten_dict drops empty maps, and so does the reader
    }
    path = _write(tmp_path / "m.msgpack", tree)
    _check_against_flax(path, tree)
    with MsgpackFile(path) as f:
        assert list(f.infos) == ["layers/0"]
        assert f.scalars == {"step": 3, "big": 2**64 - 1, "neg": -(2**63), "lr": 1e-3,
                             "name": "gpt2", "blob": b"\x00\xff", "done": False, "none": None,
                             "z": 1 - 2j, "layers/1": 7}  # fmt: skip


KEYS = st.text("abyz_019", min_size=1, max_size=3)


SHAPES = st.lists(st.integers(0, 3), max_size=3).map(tuple)


@st.composite
def arrays(draw, shapes=SHAPES):
    name = draw(st.sampled_from(DTYPE_NAMES))
    shape = draw(shapes)
    n = math.prod(shape) * _dtype(name).itemsize
    return _values(name, shape, draw(st.binary(min_size=n, max_size=n)))


LEAVES = st.one_of(
    arrays(),
    arrays(st.just(())).map(lambda a: a[()]),  # numpy scalars
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.complex_numbers(allow_nan=False),
)
TREES = st.dictionaries(
    KEYS,
    st.recursive(LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=4), max_leaves=12),
    max_size=5,
)


@settings(deadline=None)
@given(tree=TREES)
def test_random_trees_read_back_bit_exact_in_flatten_dict_order(tmp_path_factory, tree):
    path = _write(tmp_path_factory.mktemp("t") / "flax_model.msgpack", tree)
    _check_against_flax(path, tree)


# -- chunked arrays ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "complex128"])
def test_a_chunked_array_reads_bit_exact_and_as_its_chunks(tmp_path, monkeypatch, name):
    monkeypatch.setattr(flax.serialization, "MAX_CHUNK_SIZE", 16)
    big = _values(name, (7, 5))
    tree = {"emb": {"embedding": big}, "small": _values(name, ())}  # (at most 16 bytes)
    path = _write(tmp_path / "flax_model.msgpack", tree)
    assert b"__msgpack_chunked_array__" in path.read_bytes()
    _check_against_flax(path, tree)
    with MsgpackFile(path) as f:
        entry = f.contents.arrays["emb/embedding"]
        per_chunk = max(1, 16 // big.dtype.itemsize)
        assert entry.chunked and len(entry.ranges) == math.ceil(big.size / per_chunk) > 1
        blocks = list(f.blocks("emb/embedding"))
        assert len(blocks) == len(entry.ranges)
        flat = big.reshape(-1)
        for i, block in enumerate(blocks):
            want = flat[i * per_chunk : (i + 1) * per_chunk]
            assert _bits(block) == _bits(want)
            _assert_a_view_of(block, path, want.tobytes())
        assert _bits(b"".join(b.tobytes() for b in blocks)) == _bits(big.tobytes())
        assert [b.shape for b in f.blocks("small")] == [()]  # stored whole: one block
        for index in [
            (),
            (slice(2, 5),),
            (slice(None), slice(1, 4)),
            (slice(6, 7), slice(4, 5)),
            (slice(None, None, -2), slice(None, None, 3)),
            (slice(3, 3),),
            (slice(5, 1, -1), slice(0, 0)),
        ]:
            assert _bits(f.read_slice("emb/embedding", index)) == _bits(big[index]), index


def test_a_chunked_0d_array(tmp_path, monkeypatch):
    monkeypatch.setattr(flax.serialization, "MAX_CHUNK_SIZE", 4)
    tree = {"x": np.array(2.5)}  # 8 bytes over a limit of 4: one chunk of one element
    path = _write(tmp_path / "m.msgpack", tree)
    _check_against_flax(path, tree)
    with MsgpackFile(path) as f:
        assert f.contents.arrays["x"].chunked and f.read_slice("x", ()) == 2.5


def test_views_copy_file_to_file_and_need_no_copy(tmp_path):
    w = np.arange(4096, dtype=np.float32)
    path = _write(tmp_path / "m.msgpack", {"w": w})
    with MsgpackFile(path) as f:
        view = f.array("w")
        assert view.base is not None and not view.flags.owndata
        with open(tmp_path / "out", "wb") as out:
            assert copy_view(view, out)
    assert (tmp_path / "out").read_bytes() == w.tobytes()


def test_a_source_like_the_others(tmp_path):
    path = _write(tmp_path / "flax_model.msgpack", {"a": {"kernel": np.ones((2, 3), np.int16)}})
    assert ".msgpack" in WEIGHT_SUFFIXES
    with open_weights_file(path) as f:
        assert isinstance(f, MsgpackFile) and f.flax_named
        assert f.parts == (f"flax_model.msgpack: 1 tensors, {path.stat().st_size} B",)
        report = f.report()
        assert report.kind == "msgpack" and report.bytes_stored == 12 and report.bytes_saved == 0
        with pytest.raises(KeyError, match=r"no array named 'missing'"):
            f.array("missing")
    with pytest.raises(ValueError, match=r"the file is closed"):
        f.array("a/kernel")


@pytest.mark.subprocess
def test_reading_imports_no_framework(tmp_path):
    path = _write(tmp_path / "m.msgpack", {"w": np.ones(3, ml_dtypes.bfloat16)})
    code = (
        "import sys; from jaxshare.formats import MsgpackFile; "
        f"f = MsgpackFile({str(path)!r}); f.array('w').sum(); "
        "print([m for m in ('jax', 'flax', 'msgpack', 'torch', 'orbax') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]"]


# -- Hugging Face directories ------------------------------------------------------------

SHARDS = {
    "flax_model-00001-of-00002.msgpack": ["transformer/wte/embedding", "transformer/h/0/kernel"],
    "flax_model-00002-of-00002.msgpack": ["transformer/h/1/kernel", "transformer/ln_f/scale"],
}


def test_a_sharded_flax_directory_is_found_and_its_shards_read(tmp_path):
    flat = {n: _values("float32", (i + 1, 2)) for i, n in enumerate(sum(SHARDS.values(), []))}
    for file, names in SHARDS.items():
        _write(tmp_path / file, unflatten_dict({n: flat[n] for n in names}, sep="/"))
    weight_map = {n: file for file, names in SHARDS.items() for n in names}
    total = sum(a.nbytes for a in flat.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp_path / FLAX_INDEX).write_text(json.dumps(index))
    (tmp_path / "config.json").write_text("{}")
    weights = hf_weights(tmp_path)
    assert weights.flavour == "msgpack" and weights.index == tmp_path / FLAX_INDEX
    assert weights.files == tuple(tmp_path / f for f in sorted(SHARDS))
    read = {}
    for file in weights.files:
        with open_weights_file(file) as f:
            assert list(f.infos) == SHARDS[file.name]
            read.update({n: _bits(f.array(n)) for n in f.infos})
    assert read == {n: _bits(a) for n, a in flat.items()}
    assert is_hf_directory(tmp_path) and hf_weights(tmp_path / FLAX_INDEX) == weights
    with pytest.raises(ValueError, match=r"one shard of the 2 that flax_model.msgpack.index.json"):
        check_not_a_shard(weights.files[0])
    (tmp_path / FLAX_INDEX).unlink()
    with pytest.raises(ValueError, match=r"named as shard 1 of 2, but no index"):
        check_not_a_shard(weights.files[0])


FIXTURES = Path(__file__).resolve().parents[1] / "data" / "transformers_flax"


@pytest.mark.parametrize("model", ["gpt2", "llama", "bart"])
def test_what_transformers_save_pretrained_wrote_reads_as_flax_reads_it(model):
    """The fixtures are Flax models saved by transformers 4.57 (``make_fixtures.py``); bart
    also sharded into four ``.msgpack`` files and their index."""
    whole = FIXTURES / model / "flax_model" / FLAX_WEIGHTS
    want = flatten_dict(flax.serialization.msgpack_restore(whole.read_bytes()), sep="/")
    _check_against_flax(whole, unflatten_dict(want, sep="/"))
    if model != "bart":
        return
    weights = hf_weights(FIXTURES / model / "flax_model_sharded")
    assert weights.flavour == "msgpack" and len(weights.files) == 4 and weights.index is not None
    weight_map = json.loads(weights.index.read_text())["weight_map"]
    read = {}
    for file in weights.files:
        with open_weights_file(file) as f:
            assert {weight_map[n] for n in f.infos} == {file.name}
            read.update({n: _bits(f.array(n)) for n in f.infos})
    assert read == {n: _bits(a) for n, a in want.items()}  # the shards hold the whole model


@pytest.mark.parametrize(
    "files, found",
    [
        ([FLAX_WEIGHTS], FLAX_WEIGHTS),
        ([FLAX_WEIGHTS, FLAX_INDEX], FLAX_INDEX),
        ([FLAX_WEIGHTS, "pytorch_model.bin"], "pytorch_model.bin"),
        ([FLAX_INDEX, "model.safetensors"], "model.safetensors"),
    ],
)
def test_a_directory_prefers_safetensors_then_bin_then_msgpack(tmp_path, files, found):
    shard = "flax_model-00001-of-00001.msgpack"
    _write(tmp_path / shard, {"w": np.ones(2, np.float32)})
    for name in files:
        if name == FLAX_INDEX:
            (tmp_path / name).write_text(json.dumps({"weight_map": {"w": shard}}))
        else:
            (tmp_path / name).write_bytes(b"")
    assert is_hf_directory(tmp_path)
    weights = hf_weights(tmp_path)
    assert (weights.index or weights.files[0]).name == found
    assert weights.flavour == {"model.safetensors": "safetensors", "pytorch_model.bin": "bin"}.get(
        found, "msgpack"
    )


def test_an_index_of_shards_of_several_kinds_is_refused(tmp_path):
    for name in ("a.msgpack", "b.safetensors"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / FLAX_INDEX).write_text(
        json.dumps({"weight_map": {"w": "a.msgpack", "v": "b.safetensors"}})
    )
    with pytest.raises(ValueError, match=r"lists shards of several kinds \(.msgpack, .safet"):
        hf_weights(tmp_path)


# -- hostile and broken files ------------------------------------------------------------


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _ndarray(shape, dtype: str, data: bytes, code: int = 1) -> msgpack.ExtType:
    return msgpack.ExtType(code, _pack((shape, dtype, data)))


GOOD = {"w": _ndarray((2,), "float32", bytes(8))}
CHUNKED = {"__msgpack_chunked_array__": True, "shape": {"0": 2},
           "chunks": {"0": _ndarray((2,), "float32", bytes(8))}}  # fmt: skip


def _nested(depth: int) -> bytes:
    return b"\x81\xa1k" * depth + b"\xc0"


HOSTILE = {
    "empty file": (b"", r"the file is empty \(at byte 0\)"),
    "trailing bytes": (_pack(GOOD) + b"\x00", r"the top-level map ends 1 byte before the file"),
    "ext code 99": (_pack({"w": msgpack.ExtType(99, b"x")}), r"'w' is of msgpack ext type 99"),
    "ext code -1 (a timestamp)": (b"\x81\xa1w\xd6\xff" + bytes(4), r"msgpack ext type -1,"),
    "object dtype": (_pack({"w": _ndarray((1,), "object", bytes(8))}), r"dtype 'object', not"),
    "void dtype": (_pack({"w": _ndarray((1,), "void64", bytes(8))}), r"dtype 'void64', not"),
    "structured dtype": (
        _pack({"w": _ndarray((1,), "[('a', '<f4')]", bytes(4))}),
        r"dtype \"\[\('a', '<f4'\)\]\", not",
    ),
    "shape against bytes": (
        _pack({"w": _ndarray((3,), "float32", bytes(8))}),
        r"'w' \(float32\[3\]\) needs 12 bytes, but its data holds 8",
    ),
    "negative size": (_pack({"w": _ndarray((-1,), "float32", b"")}), r"holds an integer -1, no"),
    "too many axes": (_pack({"w": _ndarray((1,) * 65, "int8", b"\x00")}), r"65 axes, over"),
    "key with a slash": (
        flax.serialization.to_bytes({"a/b": np.ones(1)}),
        r"the key 'a/b' in the map at the top level contains '/', which joins",
    ),
    "int key": (_pack({1: None}), r"a key of the map at the top level is an integer, not a str"),
    "duplicate key": (b"\x82\xa1k\xc0\xa1k\xc0", r"the map at the top level has the key 'k' twice"),
    "key not UTF-8": (b"\x81\xa1\xff\xc0", r"a key of the map at the top level is not UTF-8"),
    "absurd depth": (_nested(10_000), rf"maps nested deeper than {MAX_DEPTH} levels"),
    "top level an array": (_pack([1, 2]), r"the top level is a msgpack array, not a map"),
    "top level an ndarray": (
        flax.serialization.to_bytes(np.zeros(3)),
        r"the top level is an ext value, not a map",
    ),
    "top level nil": (b"\xc0", r"the top level is nil, not a map"),
    "a list in the tree": (_pack({"l": [1]}), r"'l' is a msgpack array; flax writes lists"),
    "type byte 0xc1": (b"\x81\xa1k\xc1", r"0xc1 is no msgpack type byte \(at byte 3\)"),
    "map claims 2**32-1 entries": (b"\xdf\xff\xff\xff\xff", r"the file ends 0 bytes later: it"),
    "string claims 4 GiB": (b"\x81\xa1k\xdb\xff\xff\xff\xff", r"the string 'k' needs 4294967295"),
    "ext claims 4 GiB": (b"\x81\xa1k\xc9\xff\xff\xff\xff\x01", r"the array 'k' needs 4294967295"),
    "data past the payload": (
        _pack({"w": msgpack.ExtType(1, _pack(((2,), "float32", bytes(8)))[:-2])}),
        r"the data of 'w' needs 8 bytes, but the ext payload it is in ends 6 bytes later",
    ),
    "junk inside the payload": (
        _pack({"w": msgpack.ExtType(1, _pack(((2,), "float32", bytes(8))) + b"\x00")}),
        r"the data of 'w' ends 1 byte before its ext payload",
    ),
    "payload no triple": (_pack({"w": msgpack.ExtType(1, _pack((2,)))}), r"not msgpack \(shape, d"),
    "numpy scalar with a shape": (
        _pack({"s": _ndarray((2,), "float32", bytes(8), code=3)}),
        r"the numpy scalar 's' has shape \(2,\)",
    ),
    "complex no pair": (_pack({"z": msgpack.ExtType(2, _pack((1.0,)))}), r"not a msgpack \(real"),
    "chunked marker not first": (
        _pack({"w": {"shape": {"0": 2}, "__msgpack_chunked_array__": True}}),
        r"the key '__msgpack_chunked_array__' in the map at 'w', where no chunked",
    ),
    "chunked at the top": (_pack(CHUNKED), r"'__msgpack_chunked_array__' in the map at the top"),
    "chunked marker false": (
        _pack({"w": {**CHUNKED, "__msgpack_chunked_array__": False}}),
        r"the chunked array 'w' has a marker that is not true",
    ),
    "chunked extra entry": (_pack({"w": {**CHUNKED, "x": 1}}), r"'w' has 4 entries, not"),
    "chunked shape disagrees": (
        _pack({"w": {**CHUNKED, "shape": {"0": 3}}}),
        r"the chunks of 'w' hold 2 elements, but its shape \[3\] needs 3",
    ),
    "chunked shape keys": (
        _pack({"w": {**CHUNKED, "shape": {"1": 2}}}),
        r"the shape of the chunked array 'w' has the key '1' where flax writes '0'",
    ),
    "chunked without chunks": (
        _pack({"w": {**CHUNKED, "chunks": {}}}),
        r"the chunks of 'w' are not a map of one or more arrays",
    ),
    "chunk of another dtype": (
        _pack(
            {
                "w": {
                    **CHUNKED,
                    "shape": {"0": 4},
                    "chunks": {
                        "0": _ndarray((2,), "float32", bytes(8)),
                        "1": _ndarray((2,), "int32", bytes(8)),
                    },
                }
            }
        ),
        r"chunk 1 of 'w' is int32\[2\], not a flat run of float32 elements",
    ),  # fmt: skip
}


@pytest.mark.parametrize("content, match", HOSTILE.values(), ids=HOSTILE)
def test_a_hostile_file_is_refused_in_one_line_naming_it(tmp_path, content, match):
    path = tmp_path / "flax_model.msgpack"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        MsgpackFile(path)
    _assert_one_line(e.value, path)
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == content


def _assert_one_line(error: ValueError, path: Path) -> None:
    message = str(error)
    assert message.startswith(f"{path}: {PREFIX}") and "\n" not in message
    assert message.endswith(").") and "(at byte " in message


def test_a_file_cut_short_anywhere_is_refused_as_truncated(tmp_path, monkeypatch):
    monkeypatch.setattr(flax.serialization, "MAX_CHUNK_SIZE", 16)
    tree = {"params": {"w": _values("bfloat16", (4, 5)), "b": _values("float32", (5,))},
            "step": 3, "name": "model", "z": 1j, "s": np.float16(2)}  # fmt: skip
    whole = flax.serialization.to_bytes(tree)
    for eighth in range(1, 8):
        path = tmp_path / f"cut{eighth}.msgpack"
        path.write_bytes(whole[: len(whole) * eighth // 8])
        with pytest.raises(ValueError, match=r"the file ends \d+ bytes? later: it is trunc") as e:
            MsgpackFile(path)
        _assert_one_line(e.value, path)


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_are_refused(tmp_path, seed):
    path = tmp_path / "random.msgpack"
    path.write_bytes(np.random.default_rng(seed).bytes(4096))
    with pytest.raises(ValueError) as e:
        MsgpackFile(path)
    _assert_one_line(e.value, path)


@settings(deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_are_read_or_refused_in_one_line(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("b") / "x.msgpack"
    path.write_bytes(content)
    try:
        contents = read_msgpack(path)
    except ValueError as e:
        _assert_one_line(e, path)
        return
    assert 0x80 <= content[0] <= 0x8F or content[0] in (0xDE, 0xDF)  # a map
    assert len(contents.leaves) <= len(content)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path}: {PREFIX}it is a directory"):
        MsgpackFile(tmp_path)


def test_what_a_hostile_file_claims_is_never_allocated(tmp_path):
    """Lengths are trusted only once their bytes are there, and the records of a file's
    leaves stay within its size plus MAX_RECORDS_BYTES, even where each of many leaves
    sits under a long path (whose rendering would otherwise take the file's size squared)."""
    key = b"\xda" + struct.pack(">H", 60_000) + b"k" * 60_000  # a 60 kB key
    leaves = b"".join(b"\xa2" + f"{i:02x}".encode() + b"\xc0" for i in range(256))
    # 256 leaves under a path of 3.7 MB: rendered, the paths would take 950 MB.
    content = b"".join(b"\x81" + key for _ in range(MAX_DEPTH - 2)) + b"\xde\x01\x00" + leaves
    cases = {
        "deep.msgpack": (content, r"its keys, strings and paths would take more than"),
        "claims.msgpack": (b"\xdf\xff\xff\xff\xff\xa1k\xc6\xff\xff\xff\xff", r"truncated"),
    }
    for name, (data, match) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match=match):
                read_msgpack(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < len(data) + MAX_RECORDS_BYTES + 2**20, (name, peak)
