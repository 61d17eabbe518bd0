"""An encoder of TensorStore's OCDBT key-value database: the manifest and the B+tree.

Orbax stores an item's arrays as zarr chunks in an OCDBT database, TensorStore's
"Optionally-Cooperative Distributed B+Tree": a ``manifest.ocdbt`` at the item's root
names a B+tree, whose leaves map each key (``"params.w/.zarray"``, ``"params.w/0.0"``)
to its value, held inline in the leaf (small values) or as ``length`` bytes at
``offset`` of a data file ``d/<32 hex digits>``. jaxshare writes an item's chunks
itself, into data files it lays out at the disk's speed, and then describes them with
this module in TensorStore's own format, so that plain Orbax and TensorStore read the
item as if they had written it.

What is written (the format is the ``Storage format`` section of TensorStore's
``tensorstore/kvstore/ocdbt/index.rst``, cross-checked against its encoder):

- One version, generation 1, in a single manifest (no version tree nodes), with the
  configuration Orbax gives its databases: values of up to 1024 bytes inline,
  100,000,000 decoded bytes a node at most, version tree arity 16, zstd compression.
- The B+tree nodes in one data file, leaves first and the root last, each node
  encoded as TensorStore encodes it (its decompressed bytes are TensorStore's own),
  zstd-compressed at TensorStore's level and checksummed (CRC-32C). Nodes are
  split as TensorStore splits them, evenly by its estimate of a node's decoded size,
  but toward :data:`TARGET_NODE_BYTES` (64 KiB) a node rather than toward the
  configured maximum, so a lookup decodes a small node (a few thousand entries at
  most) whatever the number of keys.
- Every data file named by its path relative to the database root (an empty "base
  path" in the format's data file tables), so a value may live in any file under the
  root, ``d/...`` or another database's ``ocdbt.process_0/d/...``.

>>> manifest, nodes = encode_database(
...     {b"a/.zarray": b"{}", b"a/0": ValueRef("d/" + "0" * 32, 0, 4096)},
...     node_file="d/" + "1" * 32, uuid=bytes(16), commit_time_ns=0)
>>> manifest[:4].hex(), nodes[:4].hex(), len(manifest) == int.from_bytes(manifest[4:12], "little")
('0cdb3a2a', '0cdb20de', True)
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import zstandard

__all__ = [
    "ValueRef",
    "encode_database",
    "new_data_file_name",
    "crc32c",
    "MAX_INLINE_VALUE_BYTES",
    "MAX_DECODED_NODE_BYTES",
    "VERSION_TREE_ARITY_LOG2",
    "TARGET_NODE_BYTES",
]

MAX_INLINE_VALUE_BYTES = 1024
"""The longest value a leaf holds inline (the configuration Orbax writes); a longer
value is given as a :class:`ValueRef`."""

MAX_DECODED_NODE_BYTES = 100_000_000
"""``max_decoded_node_bytes`` of the configuration Orbax writes."""

VERSION_TREE_ARITY_LOG2 = 4
"""``version_tree_arity_log2`` of the configuration Orbax writes."""

TARGET_NODE_BYTES = 64 * 1024
"""The decoded size (by TensorStore's estimate) toward which nodes are split."""

_MANIFEST_MAGIC = 0x0CDB3A2A
_BTREE_NODE_MAGIC = 0x0CDB20DE
_FORMAT_VERSION = 0
_COMPRESSION_ZSTD = 1
# The zstd level stored in the configuration and used: 0, zstd's default (level 3),
# as TensorStore stores and uses it for `{"compression": {"id": "zstd"}}`.
_ZSTD_LEVEL = 0
_MANIFEST_KIND_SINGLE = 0
_GENERATION = 1
# Limits of the format (tensorstore/kvstore/ocdbt/format: btree.h kMaxKeyLength,
# data_file_id.h kMaxPathLength, btree_codec.h kMaxNodeArity).
_MAX_KEY_LENGTH = 65535
_MAX_PATH_LENGTH = 65535
_MAX_NODE_ARITY = 1024 * 1024
_U64_MAX = 2**64 - 1
# TensorStore's estimates of an entry's decoded size, less its key and data file path
# (btree.h: kLeafNodeFixedSize, kInteriorNodeFixedSize, GetLeafNodeDataSize).
_LEAF_ENTRY_BYTES = 16
_INDIRECT_VALUE_BYTES = 16
_INTERIOR_ENTRY_BYTES = 56
_NODE_FILE = re.compile(r"d/[0-9a-f]{32}")


@dataclass(frozen=True)
class ValueRef:
    """A value stored out of line: ``length`` bytes at ``offset`` of a data file.

    ``path`` is relative to the database root, e.g. ``"d/5a3a..."``; the encoder
    only records where the bytes are, the caller writes them.

    >>> ValueRef("d/" + "ab" * 16, offset=0, length=4096).length
    4096
    >>> ValueRef("/abs/path", 0, 1)
    Traceback (most recent call last):
    ...
    ValueError: ValueRef path '/abs/path': expected a non-empty path relative to the database root
    """

    path: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path or self.path.startswith("/"):
            raise ValueError(
                f"ValueRef path {self.path!r}: expected a non-empty path relative to the "
                "database root"
            )
        if len(self.path.encode()) > _MAX_PATH_LENGTH:
            raise ValueError(
                f"ValueRef path {self.path[:64]!r}...: expected at most {_MAX_PATH_LENGTH} "
                "bytes of UTF-8"
            )
        for name in ("offset", "length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ValueRef {self.path!r}: {name} {value!r}, expected an int >= 0")
        if self.offset + self.length >= _U64_MAX:
            raise ValueError(
                f"ValueRef {self.path!r}: offset {self.offset} + length {self.length}, "
                "expected under 2**64 - 1"
            )


def new_data_file_name() -> str:
    """A new data file's path relative to the database root: ``"d/"`` and 32 random
    lowercase hex digits, as TensorStore names its data files.

    >>> name = new_data_file_name()
    >>> name[:2], len(name), int(name[2:], 16) >= 0
    ('d/', 34, True)
    """
    return "d/" + secrets.token_hex(16)


def _make_crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """The CRC-32C (Castagnoli) of ``data``, continuing from ``crc``: the checksum
    that closes every manifest and B+tree node.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    >>> crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
    True
    """
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    """LEB128, as riegeli writes varints.

    >>> _varint(300).hex(), _varint(100_000_000).hex()
    ('ac02', '80c2d72f')
    """
    if value < 128:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _common_prefix_length(a: bytes, b: bytes) -> int:
    """
    >>> _common_prefix_length(b"params/w", b"params/b"), _common_prefix_length(b"a", b"ab")
    (7, 1)
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def _frame(magic: int, body: bytes) -> bytes:
    """The header (magic, total length, version 0, compression 1), the zstd-compressed
    ``body`` and the CRC-32C of all that (codec_util.cc, EncodeWithOptionalCompression)."""
    compressed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(body)
    length = 4 + 8 + 2 + len(compressed) + 4
    encoded = b"".join(
        (
            magic.to_bytes(4, "big"),
            length.to_bytes(8, "little"),
            bytes((_FORMAT_VERSION, _COMPRESSION_ZSTD)),
            compressed,
        )
    )
    return encoded + crc32c(encoded).to_bytes(4, "little")


def _data_file_table(paths: Sequence[bytes]) -> bytes:
    """The table of data files a node or the manifest refers to by index: ``paths``
    (sorted, distinct) prefix-compressed, each with an empty base path."""
    out = bytearray(_varint(len(paths)))
    if not paths:
        return bytes(out)
    prefixes = [0] + [_common_prefix_length(a, b) for a, b in itertools.pairwise(paths)]
    for prefix in prefixes[1:]:
        out += _varint(prefix)
    for path, prefix in zip(paths, prefixes, strict=True):
        out += _varint(len(path) - prefix)
    out += bytes(len(paths))  # base_path_length: 0 (varints)
    for path, prefix in zip(paths, prefixes, strict=True):
        out += path[prefix:]
    return bytes(out)


def _key_columns(keys: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The ``key_prefix_length`` and ``key_suffix_length`` columns, and the
    ``key_suffix`` column, of the sorted ``keys`` of a node."""
    lengths = bytearray()
    suffixes = bytearray()
    prefixes = [0] + [_common_prefix_length(a, b) for a, b in itertools.pairwise(keys)]
    for prefix in prefixes[1:]:
        lengths += _varint(prefix)
    for key, prefix in zip(keys, prefixes, strict=True):
        lengths += _varint(len(key) - prefix)
        suffixes += key[prefix:]
    return bytes(lengths), bytes(suffixes)


@dataclass(frozen=True)
class _Node:
    """An encoded node as its parent refers to it."""

    first_key: bytes
    last_key: bytes  # the last key of its subtree
    excluded: int  # the length of the prefix its keys are stored without
    offset: int
    length: int
    num_keys: int
    num_tree_bytes: int
    num_indirect_value_bytes: int


def _leaf_body(entries: Sequence[tuple[bytes, bytes | ValueRef]], excluded: int) -> bytes:
    """A leaf's body: height 0, the data files of its values, the keys (less their
    first ``excluded`` bytes), then column by column the value lengths, kinds (0
    inline, 1 out of line), data file indices and offsets, and the inline values."""
    paths = sorted({value.path.encode() for _, value in entries if isinstance(value, ValueRef)})
    index = {path: i for i, path in enumerate(paths)}
    lengths, suffixes = _key_columns([key[excluded:] for key, _ in entries])
    out = bytearray((0,))  # height
    out += _data_file_table(paths)
    out += _varint(len(entries))
    out += lengths
    out += suffixes
    refs = [value for _, value in entries if isinstance(value, ValueRef)]
    for _, value in entries:
        out += _varint(value.length if isinstance(value, ValueRef) else len(value))
    out += bytes(1 if isinstance(value, ValueRef) else 0 for _, value in entries)
    for ref in refs:
        out += _varint(index[ref.path.encode()])
    for ref in refs:
        out += _varint(ref.offset)
    for _, value in entries:
        if not isinstance(value, ValueRef):
            out += value
    return bytes(out)


def _interior_body(
    height: int, children: Sequence[_Node], excluded: int, node_file: bytes
) -> bytes:
    """An interior node's body: its height, the node file, the children's first keys
    (less their first ``excluded`` bytes) with how much more of their keys each child
    leaves out, then column by column the children's locations and statistics."""
    lengths, suffixes = _key_columns([child.first_key[excluded:] for child in children])
    out = bytearray((height,))
    out += _data_file_table([node_file])
    out += _varint(len(children))
    out += lengths
    for child in children:  # subtree_common_prefix_length
        out += _varint(child.excluded - excluded)
    out += suffixes
    out += bytes(len(children))  # data_file_id: 0 (varints)
    for field in ("offset", "length", "num_keys", "num_tree_bytes", "num_indirect_value_bytes"):
        for child in children:
            out += _varint(getattr(child, field))
    return bytes(out)


def _partition(sizes: Sequence[int], target: int, min_arity: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` ranges of entries of the given estimated sizes, one
    a node: as few nodes of about ``target`` bytes as hold them, of about equal size
    (a node takes the entry that reaches its share of the size), each of
    ``min_arity`` entries at least (but the last) and ``kMaxNodeArity`` at most, as
    TensorStore splits them (btree_node_encoder.cc, BtreeNodeEncoder::Finalize).

    >>> _partition([10] * 10, target=35, min_arity=1)
    [(0, 4), (4, 7), (7, 10)]
    >>> _partition([10] * 3, target=1, min_arity=2)
    [(0, 2), (2, 3)]
    """
    cumulative = list(itertools.accumulate(sizes, initial=0))
    n = len(sizes)
    ranges = []
    start = 0
    while start < n:
        count = n - start
        remaining = cumulative[n] - cumulative[start]
        num_nodes = max(-(-remaining // target), -(-count // _MAX_NODE_ARITY))
        num_nodes = max(1, min(num_nodes, -(-count // min_arity)))
        goal = -(-remaining // num_nodes)
        end = start + 1
        while (
            end < n
            and end - start < _MAX_NODE_ARITY
            and (end - start < min_arity or cumulative[end] - cumulative[start] < goal)
        ):
            end += 1
        ranges.append((start, end))
        start = end
    return ranges


def _check_entries(
    entries: Mapping[bytes, bytes | ValueRef],
) -> list[tuple[bytes, bytes | ValueRef]]:
    items: list[tuple[bytes, bytes | ValueRef]] = []
    for key, value in entries.items():
        if not isinstance(key, bytes):
            raise TypeError(f"key {key!r}: expected bytes")
        if len(key) > _MAX_KEY_LENGTH:
            raise ValueError(
                f"key {key[:64]!r}... of {len(key)} bytes: expected at most {_MAX_KEY_LENGTH}"
            )
        if isinstance(value, ValueRef):
            items.append((key, value))
        elif isinstance(value, bytes | bytearray | memoryview):
            value = bytes(value)
            if len(value) > MAX_INLINE_VALUE_BYTES:
                raise ValueError(
                    f"key {key!r}: an inline value of {len(value)} bytes, expected at most "
                    f"{MAX_INLINE_VALUE_BYTES}; store it in a data file and give a ValueRef"
                )
            items.append((key, value))
        else:
            raise TypeError(
                f"key {key!r}: value of type {type(value).__name__}, expected bytes or ValueRef"
            )
    items.sort(key=lambda item: item[0])
    return items


def _manifest_body(
    uuid: bytes, node_file: bytes, root: _Node | None, root_height: int, commit_time_ns: int
) -> bytes:
    out = bytearray(uuid)
    out.append(_MANIFEST_KIND_SINGLE)
    out += _varint(MAX_INLINE_VALUE_BYTES)
    out += _varint(MAX_DECODED_NODE_BYTES)
    out.append(VERSION_TREE_ARITY_LOG2)
    out += _varint(_COMPRESSION_ZSTD)
    out += _ZSTD_LEVEL.to_bytes(4, "little", signed=True)
    # One inline version: generation, root height, root location (data file id,
    # offset, length), statistics (num_keys, num_tree_bytes, num_indirect_value_bytes),
    # commit time; an empty tree's root is the "missing" reference (the empty path,
    # offset and length 2**64 - 1), as TensorStore writes it.
    out += _data_file_table([node_file if root is not None else b""])
    out += _varint(1)
    out += _varint(_GENERATION)
    out.append(root_height)
    out += _varint(0)
    if root is None:
        out += _varint(_U64_MAX) + _varint(_U64_MAX) + bytes(3)
    else:
        for value in (
            root.offset,
            root.length,
            root.num_keys,
            root.num_tree_bytes,
            root.num_indirect_value_bytes,
        ):
            out += _varint(value)
    out += commit_time_ns.to_bytes(8, "little")
    out += _varint(0)  # version tree nodes: none
    return bytes(out)


def encode_database(
    entries: Mapping[bytes, bytes | ValueRef],
    *,
    node_file: str,
    uuid: bytes | None = None,
    commit_time_ns: int | None = None,
    target_node_bytes: int = TARGET_NODE_BYTES,
) -> tuple[bytes, bytes]:
    """The manifest and the B+tree nodes of an OCDBT database holding exactly ``entries``.

    Write the first to ``manifest.ocdbt`` at the database root and the second to
    ``node_file`` under it; with the data files the ``ValueRef`` values point into
    (which the caller writes), they form a database of one version, generation 1,
    that TensorStore (``{"driver": "ocdbt", "base": ...}``) and so Orbax read.

    Args:
        entries: Every key of the database and its value: ``bytes`` (at most
            :data:`MAX_INLINE_VALUE_BYTES`), stored inline in a leaf, or a
            :class:`ValueRef`. Keys are sorted bytewise. An empty mapping gives an
            empty database (and empty node bytes, which need not be written).
        node_file: The data file the nodes are written into, relative to the root:
            ``"d/"`` and 32 lowercase hex digits (:func:`new_data_file_name`), not a file
            a ``ValueRef`` points into.
        uuid: The database's 16-byte identifier; random when ``None``.
        commit_time_ns: The version's commit time, in nanoseconds since the Unix epoch;
            now when ``None``.
        target_node_bytes: The decoded size, by TensorStore's estimate, toward which
            nodes are split.

    Returns:
        ``(manifest bytes, node file bytes)``.

    Raises:
        ValueError: An inline value over :data:`MAX_INLINE_VALUE_BYTES`, a key over
            65535 bytes, a malformed ``node_file``, ``uuid`` or ``commit_time_ns``.
        TypeError: A key that is not ``bytes``, a value neither ``bytes`` nor ``ValueRef``.

    >>> manifest, nodes = encode_database(
    ...     {b"k": b"v"}, node_file="d/" + "0" * 32, uuid=bytes(16), commit_time_ns=1)
    >>> len(manifest), len(nodes)
    (64, 35)
    >>> encode_database({b"w/0": bytes(2000)}, node_file="d/" + "0" * 32)
    Traceback (most recent call last):
    ...
    ValueError: key b'w/0': an inline value of 2000 bytes, expected at most 1024; ...
    """
    if not isinstance(node_file, str) or not _NODE_FILE.fullmatch(node_file):
        raise ValueError(
            f"node_file {node_file!r}: expected 'd/' and 32 lowercase hex digits, as "
            "new_data_file_name() gives"
        )
    if uuid is None:
        uuid = secrets.token_bytes(16)
    if not isinstance(uuid, bytes) or len(uuid) != 16:
        raise ValueError(f"uuid {uuid!r}: expected 16 bytes")
    if commit_time_ns is None:
        commit_time_ns = time.time_ns()
    if not isinstance(commit_time_ns, int) or not 0 <= commit_time_ns <= _U64_MAX:
        raise ValueError(f"commit_time_ns {commit_time_ns!r}: expected an int in [0, 2**64)")
    if not isinstance(target_node_bytes, int) or not (
        0 < target_node_bytes <= MAX_DECODED_NODE_BYTES // 2
    ):
        raise ValueError(
            f"target_node_bytes {target_node_bytes!r}: expected an int in "
            f"[1, {MAX_DECODED_NODE_BYTES // 2}]"
        )
    items = _check_entries(entries)
    for _, value in items:
        if isinstance(value, ValueRef) and value.path == node_file:
            raise ValueError(
                f"node_file {node_file!r}: a ValueRef points into it; expected a new file"
            )
    node_path = node_file.encode()
    if not items:
        body = _manifest_body(uuid, node_path, None, 0, commit_time_ns)
        return _frame(_MANIFEST_MAGIC, body), b""

    out = bytearray()
    # The leaves.
    sizes = [
        _LEAF_ENTRY_BYTES
        + len(key)
        + (
            _INDIRECT_VALUE_BYTES + len(value.path.encode())
            if isinstance(value, ValueRef)
            else len(value)
        )
        for key, value in items
    ]
    ranges = _partition(sizes, target_node_bytes, min_arity=1)
    nodes: list[_Node] = []
    for start, end in ranges:
        chunk = items[start:end]
        # A node's keys are stored without the prefix common to all of them (that of
        # its first and last), which its parent's entry for it names; the root's in
        # full, since the manifest names no prefix.
        excluded = 0 if len(ranges) == 1 else _common_prefix_length(chunk[0][0], chunk[-1][0])
        encoded = _frame(_BTREE_NODE_MAGIC, _leaf_body(chunk, excluded))
        nodes.append(
            _Node(
                first_key=chunk[0][0],
                last_key=chunk[-1][0],
                excluded=excluded,
                offset=len(out),
                length=len(encoded),
                num_keys=len(chunk),
                num_tree_bytes=len(encoded),
                num_indirect_value_bytes=sum(
                    value.length for _, value in chunk if isinstance(value, ValueRef)
                ),
            )
        )
        out += encoded
    # The interior nodes, level by level, up to the root.
    height = 0
    while len(nodes) > 1:
        height += 1
        sizes = [_INTERIOR_ENTRY_BYTES + len(node_path) + len(node.first_key) for node in nodes]
        ranges = _partition(sizes, target_node_bytes, min_arity=2)
        parents: list[_Node] = []
        for start, end in ranges:
            children = nodes[start:end]
            # The prefix common to every key of the subtree, and so (at most) to each
            # child's: each child's entry names how much more of its keys it leaves out.
            first_key, last_key = children[0].first_key, children[-1].last_key
            excluded = 0 if len(ranges) == 1 else _common_prefix_length(first_key, last_key)
            encoded = _frame(
                _BTREE_NODE_MAGIC, _interior_body(height, children, excluded, node_path)
            )
            parents.append(
                _Node(
                    first_key=first_key,
                    last_key=last_key,
                    excluded=excluded,
                    offset=len(out),
                    length=len(encoded),
                    num_keys=sum(child.num_keys for child in children),
                    num_tree_bytes=len(encoded) + sum(child.num_tree_bytes for child in children),
                    num_indirect_value_bytes=sum(
                        child.num_indirect_value_bytes for child in children
                    ),
                )
            )
            out += encoded
        nodes = parents
    body = _manifest_body(uuid, node_path, nodes[0], height, commit_time_ns)
    return _frame(_MANIFEST_MAGIC, body), bytes(out)
