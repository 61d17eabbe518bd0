"""``Manifest``: the per-tensor hashes a writer records, parsed strictly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxshare.internal import Manifest, ManifestEntry, TensorHash, tensor_digest

DIGEST = tensor_digest([np.arange(4, dtype=np.float32)])


def _doc(**change: object) -> str:
    doc: dict[str, object] = {
        "format": "jaxshare.manifest",
        "version": 1,
        "algorithm": "sha256",
        "tensors": {"w": {"shape": [4], "dtype": "float32", "sha256": DIGEST}},
    }
    doc.update(change)
    return json.dumps(doc)


def test_round_trip_and_order():
    m = Manifest(
        {
            "b": ManifestEntry((2, 3), "bfloat16", DIGEST),
            "a": ManifestEntry((), "int8", None),
        }
    )
    back = Manifest.from_json(m.to_json())
    assert back == m and list(back) == ["b", "a"]
    assert back["a"].sha256 is None


@given(st.binary(max_size=64), st.integers(1, 16))
def test_blocks_hash_as_one_tensor(data, cut):
    x = np.frombuffer(data, np.uint8)
    h = TensorHash()
    for start in range(0, x.size, cut):
        h.update(x[start : start + cut])
    assert h.hexdigest() == tensor_digest([x])


def test_a_transposed_view_hashes_in_c_order():
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert tensor_digest([x.T]) == tensor_digest([np.ascontiguousarray(x.T)])
    assert tensor_digest([x.T]) != tensor_digest([x])


def test_placeholders_are_unique_digest_shaped_stand_ins():
    m, marks = Manifest.placeholder([("a", (2,), "float32"), ("b", (), "int8")])
    assert len(set(marks)) == 2 and all(len(s) == 64 for s in marks)
    assert [m[n].sha256 for n in m] == marks


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_doc(format="jaxshare.alias_map"), "has format"),
        (_doc(version=True), "has version True"),
        (_doc(version=2), "Upgrade jaxshare"),
        (_doc(algorithm="md5"), "hashes with 'md5'"),
        (_doc(extra=1), "unexpected fields"),
        (_doc(tensors=[]), "must be an object"),
        (_doc(tensors={"w": {"shape": [4], "dtype": "float32"}}), "must map to"),
        (_doc(tensors={"w": {"shape": 4, "dtype": "float32", "sha256": None}}), "must be a list"),
        (_doc(tensors={"w": {"shape": [True], "dtype": "f4", "sha256": None}}), "ints >= 0"),
        (_doc(tensors={"w": {"shape": [-1], "dtype": "f4", "sha256": None}}), "ints >= 0"),
        (_doc(tensors={"w": {"shape": [1], "dtype": 3, "sha256": None}}), "dtype name"),
        (_doc(tensors={"w": {"shape": [1], "dtype": "f4", "sha256": "AB"}}), "64 lowercase hex"),
        ('{"format": "jaxshare.manifest", "format": 1}', "repeats the key"),
        ("[1]", "must be an object"),
    ],
)
def test_bad_documents_are_refused_in_one_line(text, match):
    with pytest.raises(ValueError, match=match) as info:
        Manifest.from_json(text)
    assert "\n" not in str(info.value)


def test_oversized_input_is_refused_before_parsing():
    with pytest.raises(ValueError, match="over the limit"):
        Manifest.from_json(_doc(), max_bytes=10)
