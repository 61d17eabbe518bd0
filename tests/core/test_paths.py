import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util
from flax.core import FrozenDict

from jaxshare.core.paths import children, flatten_with_paths, keypath_to_path, render, split


class Point(NamedTuple):
    x: object
    y: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
    left: object
    right: object


@pytest.mark.parametrize(
    "tree, expected",
    [
        ({"a": {"b": 1}}, [("a", "b")]),
        ([1, (2,)], [(0,), (1, 0)]),
        (Point(1, 2), [("x",), ("y",)]),
        (Pair(1, 2), [("left",), ("right",)]),
        (FrozenDict({"p": {"k": 1}}), [("p", "k")]),
        ({0: 1, 1: 2}, [(0,), (1,)]),
    ],
)
def test_keypaths_become_tuples_of_str_and_int(tree, expected):
    assert [p for p, _ in flatten_with_paths(tree)] == expected


def test_render_matches_flax_flatten_dict():
    params = {"params": {"wte": {"embedding": 1}, "h": {"0": {"attn": {"kernel": 2}}}}}
    ours = {render(p): leaf for p, leaf in flatten_with_paths(params)}
    assert ours == traverse_util.flatten_dict(params, sep="/")


def test_split_inverts_render_of_str_paths():
    path = ("params", "transformer", "wte", "embedding")
    assert split(render(path)) == path


@pytest.mark.parametrize(
    "path, match",
    [
        (("params", "a/b", "kernel"), r"'a/b'.*\('params', 'a/b', 'kernel'\).*rename"),
        (("params", 1.5), r"float.*\('params', 1.5\)"),
        (("params", True), r"bool"),
        ((("t", 1),), r"tuple"),
    ],
)
def test_render_rejects_ambiguous_keys_naming_the_path(path, match):
    with pytest.raises(ValueError, match=match):
        render(path)


def test_keypath_to_path_of_flattened_index_key():
    kp = (jax.tree_util.FlattenedIndexKey(3),)
    assert keypath_to_path(kp) == (3,)


def test_children_sees_none_in_sequences_and_mappings():
    assert children([None, 1]) == [(0, None), (1, 1)]
    assert children({"a": None}) == [("a", None)]
    assert children(jnp.ones(2)) is None
    assert children(None) == []
