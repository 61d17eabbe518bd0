"""The OCDBT encoder (jaxshare/checkpoint/_ocdbt.py), with TensorStore as the oracle.

Each test writes values into data files of its own, describes them with
``encode_database``, writes the manifest and the node file beside them, and has
TensorStore read the database back: its keys (``list``), every value byte for byte,
its own dump of the manifest and of every node, zarr arrays stored in it.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.checkpoint._ocdbt import (
    MAX_INLINE_VALUE_BYTES,
    TARGET_NODE_BYTES,
    ValueRef,
    crc32c,
    encode_database,
    new_data_file_name,
)

Entries = dict[bytes, bytes | ValueRef]


# --- helpers --------------------------------------------------------------------------


def _lay_out(
    root: Path,
    values: Mapping[bytes, bytes],
    *,
    inline: Mapping[bytes, bool] | None = None,
    files: list[str] | None = None,
    seed: int = 0,
) -> Entries:
    """``values`` as entries: inline where ``inline`` says (by default: those of at most
    1024 bytes, one in two), the others appended to data files under ``root``."""
    rng = random.Random(seed)
    files = files or [new_data_file_name() for _ in range(3)]
    contents = {path: bytearray() for path in files}
    entries: Entries = {}
    for key, value in values.items():
        keep = (
            inline[key]
            if inline is not None
            else (len(value) <= MAX_INLINE_VALUE_BYTES and rng.random() < 0.5)
        )
        if keep:
            entries[key] = value
        else:
            path = rng.choice(files)
            data = contents[path]
            data += bytes(rng.randrange(8))  # values need not be packed
            entries[key] = ValueRef(path, len(data), len(value))
            data += value
    for path, data in contents.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(bytes(data))
    return entries


def _write(root: Path, entries: Mapping[bytes, bytes | ValueRef], **kwargs: Any) -> bytes:
    """Encodes ``entries`` and writes the manifest and node file under ``root``; the
    node file's bytes."""
    node_file = new_data_file_name()
    manifest, nodes = encode_database(entries, node_file=node_file, **kwargs)
    (root / "d").mkdir(parents=True, exist_ok=True)
    (root / "manifest.ocdbt").write_bytes(manifest)
    (root / node_file).write_bytes(nodes)
    return nodes


def _ocdbt(root: Path) -> ts.KvStore:
    return ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root}/"}).result()


def _base(root: Path) -> ts.KvStore:
    return ts.KvStore.open({"driver": "file", "path": f"{root}/"}).result()


def _value(root: Path, value: bytes | ValueRef) -> bytes:
    if isinstance(value, ValueRef):
        with open(root / value.path, "rb") as f:
            f.seek(value.offset)
            return f.read(value.length)
    return value


def _assert_reads(root: Path, entries: Mapping[bytes, bytes | ValueRef], sample: int = 0) -> None:
    """TensorStore lists exactly the keys of ``entries`` and reads each value (or
    ``sample`` of them, the first and last included) byte for byte."""
    kv = _ocdbt(root)
    keys = sorted(entries)
    assert sorted(kv.list().result()) == keys
    chosen = keys
    if sample and len(keys) > sample:
        chosen = [keys[0], keys[-1], *random.Random(1).sample(keys, sample)]
    reads = {key: kv.read(key) for key in chosen}
    for key, future in reads.items():
        result = future.result()
        assert result.state == "value", key
        assert result.value == _value(root, entries[key]), key


def _stats(root: Path) -> dict[str, Any]:
    """The manifest's one version, as TensorStore dumps it."""
    dump = ts.ocdbt.dump(_base(root)).result()
    assert dump["version_tree_nodes"] == []
    (version,) = dump["versions"]
    return version


def _walk(root: Path, location: str, height: int, prefix: bytes) -> tuple[list, dict[str, int]]:
    """The leaf entries ``(full key, dumped value)`` under the node at ``location``, and
    the statistics of its subtree counted from the nodes themselves; checks every
    interior entry's statistics against its child's."""
    base = _base(root)
    node = ts.ocdbt.dump(base, location).result()
    assert node["height"] == height
    length = int(location.rsplit(":", 1)[1])
    stats = {"num_keys": 0, "num_tree_bytes": length, "num_indirect_value_bytes": 0}
    leaves: list = []
    for entry in node["entries"]:
        key = entry["key"]
        if height == 0:
            leaves.append((prefix + key, entry))
            stats["num_keys"] += 1
            if "indirect_value" in entry:
                stats["num_indirect_value_bytes"] += int(entry["indirect_value"].rsplit(":", 1)[1])
            continue
        common = entry["subtree_common_prefix"]
        assert key.startswith(common)
        child_leaves, child = _walk(root, entry["location"], height - 1, prefix + common)
        assert child == entry["statistics"], entry
        assert child_leaves[0][0] == prefix + key  # an entry's key is its child's first
        leaves += child_leaves
        for name in stats:
            stats[name] += child[name]
    return leaves, stats


def _assert_tree(root: Path, entries: Mapping[bytes, bytes | ValueRef], nodes: bytes) -> int:
    """The dumped tree holds exactly ``entries`` in order, with statistics equal to
    the real sums; its height."""
    version = _stats(root)
    assert version["generation_number"] == 1
    leaves, stats = _walk(root, version["root"]["location"], version["root_height"], b"")
    assert stats == version["root"]["statistics"]
    assert stats == {
        "num_keys": len(entries),
        "num_tree_bytes": len(nodes),  # every node is reachable, once
        "num_indirect_value_bytes": sum(
            v.length for v in entries.values() if isinstance(v, ValueRef)
        ),
    }
    assert [key for key, _ in leaves] == sorted(entries)
    for key, entry in leaves:
        value = entries[key]
        if isinstance(value, ValueRef):
            assert entry["indirect_value"].endswith(f"{value.path}:{value.offset}:{value.length}")
        else:
            assert entry["inline_value"] == value
    return int(version["root_height"])


def _random_values(n: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 7, 100, 1023, 1024, 1025, 4096, 70_000, 300_000]
    return {
        f"params/layer_{i}/kernel/{i % 3}.0".encode(): rng.randbytes(sizes[i % len(sizes)])
        for i in range(n)
    }


def _body(encoded: bytes) -> bytes:
    """The decompressed body of an encoded manifest or node."""
    assert encoded[13] == 1  # zstd
    return zstandard.ZstdDecompressor().decompressobj().decompress(encoded[14:-4])


# --- reading back ------------------------------------------------------------------------


def test_values_inline_and_in_data_files_read_back(tmp_path: Path) -> None:
    values = _random_values(40, seed=0)
    entries = _lay_out(tmp_path, values)
    # A value in another database's data file (Orbax's per-process layout), and the
    # same bytes named twice.
    other = tmp_path / "ocdbt.process_0" / "d" / ("f" * 32)
    other.parent.mkdir(parents=True)
    other.write_bytes(b"head" + values[b"params/layer_9/kernel/0.0"])
    entries[b"params/other/0.0"] = ValueRef(f"ocdbt.process_0/d/{'f' * 32}", 4, 300_000)
    entries[b"params/alias/0.0"] = entries[b"params/other/0.0"]
    assert any(isinstance(v, bytes) for v in entries.values())
    nodes = _write(tmp_path, entries)
    _assert_reads(tmp_path, entries)
    assert _assert_tree(tmp_path, entries, nodes) == 0
    kv = _ocdbt(tmp_path)
    for missing in (b"", b"params", b"params/layer_1", b"params/layer_1/kernel/1.00", b"zzz"):
        assert kv.read(missing).result().state == "missing", missing


def test_empty_and_zero_length_values(tmp_path: Path) -> None:
    path = new_data_file_name()
    (tmp_path / "d").mkdir()
    (tmp_path / path).write_bytes(b"abc")
    entries: Entries = {b"a": b"", b"b": ValueRef(path, 3, 0), b"c": ValueRef(path, 0, 3)}
    _write(tmp_path, entries)
    _assert_reads(tmp_path, entries)


def test_empty_database(tmp_path: Path) -> None:
    nodes = _write(tmp_path, {})
    assert nodes == b""
    assert sorted(_ocdbt(tmp_path).list().result()) == []
    assert _ocdbt(tmp_path).read(b"a").result().state == "missing"
    version = _stats(tmp_path)
    assert "location" not in version["root"]
    assert version["root"]["statistics"] == {
        "num_keys": 0,
        "num_tree_bytes": 0,
        "num_indirect_value_bytes": 0,
    }


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param([b"only"], id="single"),
        pytest.param([b""], id="empty-key"),
        pytest.param([b"a", b"ab", b"abc", b"abd", b"abd\x00", b"b", b"ba"], id="prefixes"),
        pytest.param([b"x" * 500 + bytes([i]) for i in range(40)], id="long-shared-prefix"),
        pytest.param([bytes([i, j]) for i in (0, 1, 127, 128, 255) for j in (0, 255)], id="binary"),
        pytest.param([b"", b"\x00", b"\x00\x00", b"\xff", b"\xff\xff"], id="edges"),
    ],
)
@pytest.mark.parametrize("target", [TARGET_NODE_BYTES, 150, 1])
def test_key_shapes(tmp_path: Path, keys: list[bytes], target: int) -> None:
    values = {key: bytes([len(key) % 256]) * (i * 300 % 2000) for i, key in enumerate(keys)}
    entries = _lay_out(tmp_path, values)
    nodes = _write(tmp_path, entries, target_node_bytes=target)
    _assert_reads(tmp_path, entries)
    _assert_tree(tmp_path, entries, nodes)


# --- many keys: interior nodes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "target", "min_height"),
    [(10_000, TARGET_NODE_BYTES, 1), (100_000, TARGET_NODE_BYTES, 1), (3_000, 300, 3)],
)
def test_many_keys(tmp_path: Path, n: int, target: int, min_height: int) -> None:
    path = new_data_file_name()
    (tmp_path / "d").mkdir()
    (tmp_path / path).write_bytes(random.Random(0).randbytes(4096))
    entries: Entries = {
        f"params.layers_{i % 97}.w/{i // 97}.0".encode(): ValueRef(path, i % 4000, 1 + i % 90)
        for i in range(n)
    }
    entries[b"params.layers_0.w/.zarray"] = b'{"zarr_format":2}'
    nodes = _write(tmp_path, entries, target_node_bytes=target)
    keys = _ocdbt(tmp_path).list().result()
    assert len(keys) == len(entries)
    assert sorted(keys) == sorted(entries)
    _assert_reads(tmp_path, entries, sample=200)
    version = _stats(tmp_path)
    assert version["root_height"] >= min_height
    assert version["root"]["statistics"]["num_keys"] == len(entries)
    assert version["root"]["statistics"]["num_tree_bytes"] == len(nodes)
    if n <= 10_000:
        _assert_tree(tmp_path, entries, nodes)


def test_nodes_stay_small(tmp_path: Path) -> None:
    """No node decodes to much over the target: a lookup reads a small node."""
    entries: Entries = {b"k%06d" % i: b"v" * 100 for i in range(5_000)}
    nodes = _write(tmp_path, entries)
    version = _stats(tmp_path)
    assert version["root_height"] == 1
    root = ts.ocdbt.dump(_base(tmp_path), version["root"]["location"]).result()
    for entry in root["entries"]:
        offset, length = map(int, entry["location"].rsplit(":", 2)[1:])
        body = _body(nodes[offset : offset + length])
        assert len(body) < TARGET_NODE_BYTES + 2 * 1024
        assert entry["statistics"]["num_keys"] < 1000


# --- against TensorStore's own encoder ---------------------------------------------------


def test_manifest_bytes_equal_tensorstores(tmp_path: Path) -> None:
    entries = _lay_out(tmp_path, _random_values(20, seed=3))
    manifest, _ = encode_database(
        entries, node_file=new_data_file_name(), uuid=bytes(range(16)), commit_time_ns=123
    )
    (tmp_path / "manifest.ocdbt").write_bytes(manifest)
    dump = ts.ocdbt.dump(_base(tmp_path)).result()
    assert dump["config"] == {
        "compression": {"id": "zstd"},
        "max_decoded_node_bytes": 100_000_000,
        "max_inline_value_bytes": 1024,
        "uuid": bytes(range(16)).hex(),
        "version_tree_arity_log2": 4,
    }
    assert dump["versions"][0]["commit_time"] == 123
    assert ts.ocdbt.undump_manifest(dump) == manifest


def test_leaf_body_equals_tensorstores(tmp_path: Path) -> None:
    """A leaf of inline values decodes to the very bytes TensorStore writes for it."""
    rng = random.Random(5)
    entries: Entries = {b"params/%d/.zarray" % i: rng.randbytes(i * 7 % 300) for i in range(150)}
    entries[b""] = b"empty key"
    config = {
        "max_inline_value_bytes": 1024,
        "max_decoded_node_bytes": 100_000_000,
        "compression": {"id": "zstd"},
    }
    kv = ts.KvStore.open(
        {"driver": "ocdbt", "base": f"file://{tmp_path}/", "config": config}
    ).result()
    txn = ts.Transaction(atomic=True)
    for key, value in entries.items():
        kv.with_transaction(txn).write(key, value).result()
    txn.commit_async().result()
    version = ts.ocdbt.dump(_base(tmp_path)).result()["versions"][-1]
    assert version["root_height"] == 0
    path, offset, length = version["root"]["location"].removeprefix("btreenode::").rsplit(":", 2)
    theirs = (tmp_path / path).read_bytes()[int(offset) : int(offset) + int(length)]
    _, ours = encode_database(entries, node_file=new_data_file_name())
    assert _body(ours) == _body(theirs)


def test_reencodes_an_orbax_written_item(tmp_path: Path) -> None:
    """The root node of an item Orbax wrote, re-encoded from its keys and values,
    decodes to the same bytes."""
    import orbax.checkpoint as ocp

    item = (tmp_path / "item").absolute()  # (Orbax takes absolute paths.)
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.int32)}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(item, tree)
    assert (item / "manifest.ocdbt").is_file()
    kv = _ocdbt(item)
    entries: Entries = {key: kv.read(key).result().value for key in kv.list().result()}
    version = _stats(item)
    assert version["root_height"] == 0
    path, offset, length = version["root"]["location"].removeprefix("btreenode::").rsplit(":", 2)
    theirs = (item / path).read_bytes()[int(offset) : int(offset) + int(length)]
    _, ours = encode_database(entries, node_file=new_data_file_name())
    assert _body(ours) == _body(theirs)


def test_deterministic() -> None:
    entries: Entries = {b"a": b"1", b"b": ValueRef("d/" + "0" * 32, 0, 2000)}
    one = encode_database(entries, node_file="d/" + "1" * 32, uuid=bytes(16), commit_time_ns=7)
    two = encode_database(
        dict(reversed(entries.items())),
        node_file="d/" + "1" * 32,
        uuid=bytes(16),
        commit_time_ns=7,
    )
    assert one == two
    manifest, _ = one
    assert crc32c(manifest[:-4]).to_bytes(4, "little") == manifest[-4:]


def test_crc32c_check_values() -> None:
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43


# --- property ---------------------------------------------------------------------------

_keys = st.binary(max_size=6) | st.lists(
    st.sampled_from([b"a", b"b", b"/", b"\x00", b"\xff"]), max_size=8
).map(b"".join)
_values = st.tuples(st.integers(0, 2000), st.booleans())


@given(
    values=st.dictionaries(_keys, _values, max_size=60),
    target=st.sampled_from([1, 100, 600, TARGET_NODE_BYTES]),
)
@settings(max_examples=30, deadline=None)
def test_any_keys_read_back(values: dict[bytes, tuple[int, bool]], target: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = {key: bytes([i % 251]) * size for i, (key, (size, _)) in enumerate(values.items())}
        inline = {
            key: want and size <= MAX_INLINE_VALUE_BYTES for key, (size, want) in values.items()
        }
        entries = _lay_out(root, data, inline=inline, files=[new_data_file_name()])
        nodes = _write(root, entries, target_node_bytes=target)
        _assert_reads(root, entries)
        if entries:
            _assert_tree(root, entries, nodes)


# --- zarr arrays ------------------------------------------------------------------------


@pytest.mark.parametrize("compressed", [False, True])
def test_zarr_array_through_it(tmp_path: Path, compressed: bool) -> None:
    array = np.arange(24, dtype="<f4").reshape(4, 6) * np.float32(1.5) - 7
    zarray = {
        "chunks": [2, 3],
        "compressor": {"id": "zstd", "level": 1} if compressed else None,
        "dimension_separator": ".",
        "dtype": "<f4",
        "fill_value": None,
        "filters": None,
        "order": "C",
        "shape": [4, 6],
        "zarr_format": 2,
    }
    path = new_data_file_name()
    data = bytearray()
    entries: Entries = {b"arr/.zarray": json.dumps(zarray).encode()}
    for i in range(2):
        for j in range(2):
            chunk = np.ascontiguousarray(array[2 * i : 2 * i + 2, 3 * j : 3 * j + 3]).tobytes()
            if compressed:
                chunk = zstandard.ZstdCompressor(level=1).compress(chunk)
            entries[f"arr/{i}.{j}".encode()] = ValueRef(path, len(data), len(chunk))
            data += chunk
    (tmp_path / "d").mkdir()
    (tmp_path / path).write_bytes(bytes(data))
    _write(tmp_path, entries)
    store = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": "arr/"},
        },
        read=True,
    ).result()
    got = store.read().result()
    assert got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == array.tobytes()


# --- bad input --------------------------------------------------------------------------

_NODE = "d/" + "0" * 32


def test_inline_value_over_the_limit() -> None:
    with pytest.raises(ValueError, match=r"key b'w/0\.0': an inline value of 1025 bytes"):
        encode_database({b"a": b"", b"w/0.0": bytes(1025)}, node_file=_NODE)
    encode_database({b"w/0.0": bytes(1024)}, node_file=_NODE)  # the limit itself is fine


@pytest.mark.parametrize(
    "node_file", ["x/" + "0" * 32, "d/" + "A" * 32, "d/abc", "/d/" + "0" * 32, "manifest.ocdbt"]
)
def test_node_file_must_be_a_data_file_name(node_file: str) -> None:
    with pytest.raises(ValueError, match="node_file"):
        encode_database({b"a": b"1"}, node_file=node_file)


def test_node_file_must_be_new() -> None:
    with pytest.raises(ValueError, match="a ValueRef points into it"):
        encode_database({b"a": ValueRef(_NODE, 0, 1)}, node_file=_NODE)


@pytest.mark.parametrize(
    ("entries", "kwargs", "error", "match"),
    [
        ({"a": b"1"}, {}, TypeError, "key 'a': expected bytes"),
        ({b"a": 1}, {}, TypeError, "key b'a': value of type int"),
        ({b"k" * 65536: b"1"}, {}, ValueError, "of 65536 bytes: expected at most 65535"),
        ({b"a": b"1"}, {"uuid": b"short"}, ValueError, "uuid"),
        ({b"a": b"1"}, {"commit_time_ns": -1}, ValueError, "commit_time_ns"),
        ({b"a": b"1"}, {"target_node_bytes": 0}, ValueError, "target_node_bytes"),
    ],
)
def test_bad_arguments(entries: Any, kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        encode_database(entries, node_file=_NODE, **kwargs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", 0, 1), "expected a non-empty path"),
        (("/abs", 0, 1), "relative to the database root"),
        (("d/x", -1, 1), "offset -1"),
        (("d/x", 0, -5), "length -5"),
        (("d/x", 2**63, 2**63), "under 2\\*\\*64 - 1"),
    ],
)
def test_bad_value_refs(args: tuple[str, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ValueRef(*args)
