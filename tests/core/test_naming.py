"""``NamingRecord``: what a conversion did to each leaf, checked on construction and parsed
from JSON as strictly as the alias map is (one parser, ``jaxshare.core.strict_json``)."""

import json

import pytest

from jaxshare import AliasMap, Naming, NamingRecord
from jaxshare.core.naming import MAX_JSON_BYTES

RECORD = NamingRecord(
    {"params/wte/embedding": "wte.weight", "params/mlp/kernel": ("mlp.weight", (1, 0))}
)


def test_a_record_maps_flax_paths_to_torch_names_and_permutations():
    assert RECORD["params/mlp/kernel"] == Naming("mlp.weight", (1, 0))
    assert RECORD["params/wte/embedding"] == Naming("wte.weight", None)
    assert list(RECORD) == ["params/wte/embedding", "params/mlp/kernel"]  # the record's order


def test_json_round_trips_in_the_records_order():
    text = RECORD.to_json()
    assert json.loads(text) == {
        "format": "jaxshare.naming",
        "version": 1,
        "leaves": {
            "params/wte/embedding": {"torch": "wte.weight"},
            "params/mlp/kernel": {"torch": "mlp.weight", "permute": [1, 0]},
        },
    }
    assert NamingRecord.from_json(text) == RECORD
    assert NamingRecord.from_json(RECORD.to_json(indent=2).encode()) == RECORD
    assert list(NamingRecord.from_json(text)) == list(RECORD)


def test_an_identity_permutation_is_none():
    assert NamingRecord({"a/k": ("a.w", (0, 1))})["a/k"].permute is None


@pytest.mark.parametrize(
    "entries, error, match",
    [
        ({"/a": "a.w"}, ValueError, r"'/a' is not a '/'-joined Flax path"),
        ({"a/": "a.w"}, ValueError, r"'a/' is not a '/'-joined Flax path"),
        ({"": "a.w"}, ValueError, r"'' is not a '/'-joined Flax path"),
        ({"a/k": "a/w"}, ValueError, r"'a/k' names 'a/w', which is not a PyTorch name"),
        ({"a/k": ""}, ValueError, r"names '', which is not a PyTorch name"),
        ({"a/k": 3}, TypeError, r"'a/k' must map to a PyTorch name or \(name, permutation\)"),
        ({"a/k": ("a.w", (0, 0))}, ValueError, r"permutation of 'a/k' must be a permutation"),
        ({"a/k": ("a.w", "10")}, TypeError, r"permutation of 'a/k' must be a sequence"),
        ({"a/k": "x.w", "b/k": "x.w"}, ValueError, r"'a/k' and 'b/k' both name .*'x.w'"),
    ],
)
def test_invalid_records_are_rejected_naming_paths(entries, error, match):
    with pytest.raises(error, match=match):
        NamingRecord(entries)


def _doc(**fields):
    """A naming record's JSON, ``fields`` changed."""
    return json.dumps({"format": "jaxshare.naming", "version": 1, "leaves": {}, **fields})


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", r"naming record is not JSON"),
        (b"\xff\xfe", r"naming record is not UTF-8 text"),
        ("[1, 2]", r"must be an object, got list"),
        (
            _doc(format="jaxshare.alias_map"),
            r"format 'jaxshare.alias_map', expected 'jaxshare.naming'",
        ),
        (_doc(version=2), r"version 2; this jaxshare reads version 1"),
        (_doc(version="1"), r"version '1'"),
        (_doc(version=True), r"version True"),  # True == 1, but is no version
        (_doc(version=1.0), r"version 1.0"),  # nor is 1.0
        (_doc(extra=1), r"unexpected fields \['extra'\]"),
        ('{"format": "jaxshare.naming", "version": 1}', r"lacks the fields \['leaves'\]"),
        (_doc(leaves=[]), r"'leaves' must be an object, got list"),
        (_doc(leaves={"a/k": "a.w"}), r"'a/k' must map to \{'torch': name"),
        (_doc(leaves={"a/k": {}}), r"'a/k' must map to \{'torch': name"),
        (_doc(leaves={"a/k": {"torch": "a.w", "x": 1}}), r"'a/k' must map to \{'torch': name"),
        (_doc(leaves={"a/k": {"torch": 1}}), r"'a/k' names 1, which is not a PyTorch name"),
        (_doc(leaves={"a/k": {"torch": "a.w", "permute": "10"}}), r"'permute' of 'a/k'.*list"),
        (_doc(leaves={"a/k": {"torch": "a.w", "permute": None}}), r"'permute' of 'a/k'.*list"),
        (_doc(leaves={"a/k": {"torch": "a.w", "permute": [1.0, 0]}}), r"'a/k'.*permutation"),
        (_doc(leaves={"a/k": {"torch": "x"}, "b/k": {"torch": "x"}}), r"both name .*'x'"),
        (
            '{"format": "jaxshare.naming", "format": "x", "version": 1, "leaves": {}}',
            r"repeats the key 'format'",
        ),
        (
            '{"format": "jaxshare.naming", "version": 1, "leaves": '
            '{"a/k": {"torch": "a.w"}, "a/k": {"torch": "b.w"}}}',
            r"repeats the key 'a/k'",
        ),
    ],
)
def test_from_json_is_strict(text, match):
    with pytest.raises(ValueError, match=match):
        NamingRecord.from_json(text)


def test_from_json_refuses_oversized_input_before_parsing():
    big = _doc(leaves={f"a/{i}": {"torch": f"a.{i}"} for i in range(100)})
    with pytest.raises(ValueError, match=r"over the limit of 100; pass a larger `max_bytes`"):
        NamingRecord.from_json(big, max_bytes=100)
    assert len(NamingRecord.from_json(big, max_bytes=len(big))) == 100
    assert MAX_JSON_BYTES == 64 * 2**20


def test_the_alias_map_and_the_record_refuse_the_same_documents_alike():
    """One parser: the same fault gets the same words, each naming its document."""

    def words(parse, text, name, fmt):
        with pytest.raises(ValueError) as info:
            parse(text.replace("FORMAT", fmt))
        message = str(info.value).replace(name, "DOC").replace(fmt, "FORMAT")
        return message.replace("'aliases'", "'FIELD'").replace("'leaves'", "'FIELD'")

    for bad in (
        "not json",
        "[1]",
        '{"format": 1}',
        '{"format": "FORMAT", "version": true}',
        '{"format": "FORMAT", "version": 1, "x": 1}',
        '{"format": "FORMAT", "version": 1}',
    ):
        assert words(AliasMap.from_json, bad, "alias map", "jaxshare.alias_map") == words(
            NamingRecord.from_json, bad, "naming record", "jaxshare.naming"
        ), bad


def test_a_record_is_provenance_not_a_tie():
    with_record = AliasMap({"b": "a"}, naming=NamingRecord({"a": "a.w"}))
    assert with_record == AliasMap({"b": "a"}) and with_record.naming == NamingRecord({"a": "a.w"})
