import json

import pytest

from jaxshare import AliasMap


def test_is_an_immutable_sorted_mapping():
    m = AliasMap({"z": "a", "b": "a"})
    assert list(m) == ["b", "z"] and len(m) == 2 and m["z"] == "a"
    with pytest.raises(TypeError):
        m["q"] = "a"  # type: ignore[index]
    assert dict(m) == {"b": "a", "z": "a"}


def test_accepts_pairs_and_mappings_alike():
    assert AliasMap([("b", "a")]) == AliasMap({"b": "a"}) == {"b": "a"}


def test_equality_and_hash_include_transforms():
    plain = AliasMap({"k": "e"})
    permuted = AliasMap({"k": "e"}, transforms={"k": (1, 0)})
    assert plain != permuted and permuted != {"k": "e"}
    assert hash(permuted) == hash(AliasMap({"k": "e"}, transforms={"k": [1, 0]}))
    assert len({plain, permuted, AliasMap({"k": "e"})}) == 2


def test_identity_transform_is_normalised_away():
    m = AliasMap({"k": "e"}, transforms={"k": (0, 1)})
    assert m.transform("k") is None and m == AliasMap({"k": "e"})


def test_groups_sorted_by_canonical_then_alias():
    m = AliasMap({"d": "c", "b": "a", "e": "c", "a2": "a"})
    assert m.groups() == {"a": ("a2", "b"), "c": ("d", "e")}


def test_chains_collapse_and_compose_transforms():
    m = AliasMap({"a": "b", "b": "c"}, transforms={"a": (1, 0), "b": (1, 0)})
    assert dict(m) == {"a": "c", "b": "c"}
    assert m.transform("a") is None  # Two transposes cancel.
    assert m.transform("b") == (1, 0)
    m3 = AliasMap({"x": "y", "y": "z"}, transforms={"x": (1, 2, 0), "y": (2, 0, 1)})
    assert m3.transform("x") is None
    m4 = AliasMap({"x": "y", "y": "z"}, transforms={"x": (1, 0, 2), "y": (0, 2, 1)})
    # x = transpose(transpose(z, (0, 2, 1)), (1, 0, 2)) = transpose(z, (2, 0, 1))
    assert m4.transform("x") == (2, 0, 1)


@pytest.mark.parametrize(
    "aliases, transforms, error, match",
    [
        ({"a": "a"}, None, ValueError, r"'a' names itself"),
        ({"a": "b", "b": "a"}, None, ValueError, r"cycle: a -> b -> a"),
        ({"a": "b", "b": "c", "c": "a"}, None, ValueError, r"cycle: a -> b -> c -> a"),
        ({"a": 3}, None, TypeError, r"canonical of alias 'a' must be a str path, got int"),
        ({1: "a"}, None, TypeError, r"alias must be a str path, got int"),
        ({"": "a"}, None, ValueError, r"'' is not a path"),
        ({"a//b": "c"}, None, ValueError, r"'a//b' is not a path"),
        ({"a/": "c"}, None, ValueError, r"'a/' is not a path"),
        ({"a": "b"}, {"z": (1, 0)}, ValueError, r"`transforms` names 'z'"),
        ({"a": "b"}, {"a": (0, 0)}, ValueError, r"alias 'a' must be a permutation.*\[0, 0\]"),
        ({"a": "b"}, {"a": (1, 2)}, ValueError, r"permutation"),
        ({"a": "b"}, {"a": "10"}, TypeError, r"sequence of axis indices"),
        ({"a": "b"}, {"a": (True, False)}, ValueError, r"permutation"),
        ({"a": "b", "b": "c"}, {"a": (1, 0), "b": (0, 2, 1)}, ValueError, r"a -> b"),
    ],
)
def test_invalid_maps_are_rejected_naming_paths(aliases, transforms, error, match):
    with pytest.raises(error, match=match):
        AliasMap(aliases, transforms=transforms)


def test_transform_of_non_alias_is_a_key_error():
    with pytest.raises(KeyError, match="'nope' is not an alias"):
        AliasMap({"a": "b"}).transform("nope")


def test_rename_maps_every_path_and_keeps_transforms():
    m = AliasMap({"k": "e"}, transforms={"k": (1, 0)}).rename(lambda p: f"params/{p}")
    assert dict(m) == {"params/k": "params/e"} and m.transform("params/k") == (1, 0)


# -- JSON --------------------------------------------------------------------


def test_json_format_is_the_documented_one():
    m = AliasMap(
        {"a/b": "c/d", "lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)}
    )
    assert json.loads(m.to_json()) == {
        "format": "jaxshare.alias_map",
        "version": 1,
        "aliases": {"a/b": "c/d", "lm_head/kernel": {"target": "wte/embedding", "permute": [1, 0]}},
    }
    assert AliasMap.from_json(m.to_json()) == m
    assert AliasMap.from_json(m.to_json(indent=2).encode()) == m


def _doc(**fields):
    """An alias map's JSON, ``fields`` changed."""
    return json.dumps({"format": "jaxshare.alias_map", "version": 1, "aliases": {}, **fields})


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", r"alias map is not JSON"),
        ("[1, 2]", r"must be an object, got list"),
        (_doc(format="orbax"), r"format 'orbax', expected 'jaxshare.alias_map'"),
        (_doc(version=2), r"version 2; this jaxshare reads version 1"),
        (_doc(version="1"), r"version '1'"),
        (_doc(version=True), r"version True"),
        (_doc(extra=1), r"unexpected fields \['extra'\]"),
        (_doc(aliases=[]), r"'aliases' must be an object, got list"),
        (_doc(aliases={"a": 1}), r"canonical of alias 'a' must be a str path"),
        (_doc(aliases={"a": "a"}), r"'a' names itself"),
        (_doc(aliases={"a": "b", "b": "a"}), r"cycle"),
        (_doc(aliases={"a": {"target": "b"}}), r"alias 'a'.*exactly the fields"),
        (_doc(aliases={"a": {"target": "b", "permute": "10"}}), r"alias 'a'.*list of ints"),
        (_doc(aliases={"a": {"target": "b", "permute": [1.0, 0]}}), r"alias 'a'.*permutation"),
        (
            '{"format": "jaxshare.alias_map", "format": "x", "version": 1, "aliases": {}}',
            r"repeats the key 'format'",
        ),
        (
            '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"a": "b", "a": "c"}}',
            r"repeats the key 'a'",
        ),
        (b"\xff\xfe", r"alias map is not UTF-8 text"),
    ],
)
def test_from_json_is_strict(text, match):
    with pytest.raises(ValueError, match=match):
        AliasMap.from_json(text)


def test_from_json_refuses_oversized_input_before_parsing():
    big = _doc(aliases={f"a{i}": "b" for i in range(100)})
    with pytest.raises(ValueError, match=r"over the limit of 100; pass a larger `max_bytes`"):
        AliasMap.from_json(big, max_bytes=100)
    assert len(AliasMap.from_json(big, max_bytes=len(big))) == 100
