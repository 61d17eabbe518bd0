"""find_shared's own traversal gives jax's leaves, order and rendered paths."""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np
import pytest
from flax.core import FrozenDict
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxshare
from jaxshare.core.find import _flatten_with_rendered_paths
from jaxshare.core.paths import keypath_to_path, render

Pair = collections.namedtuple("Pair", ["left", "right"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    inner: object
    other: object


def _wrap(draw_kind: str, children: list[object]) -> object:
    if draw_kind == "dict":
        return {f"k{i}": c for i, c in enumerate(children)}
    if draw_kind == "intdict":
        return {i * 7 % 11: c for i, c in enumerate(children)}
    if draw_kind == "list":
        return list(children)
    if draw_kind == "tuple":
        return tuple(children)
    if draw_kind == "ordered":
        return collections.OrderedDict((f"z{9 - i}", c) for i, c in enumerate(children))
    if draw_kind == "frozen":
        return FrozenDict({f"f{i}": c for i, c in enumerate(children)})
    if draw_kind == "pair":
        return Pair(children[0] if children else None, children[1:] or None)
    return Box(children[0] if children else None, children[1:])


LEAVES = st.sampled_from([np.zeros(2), np.ones(3, np.float32), 1, 2.5, "s", None, np.zeros((0,))])
KINDS = st.sampled_from(["dict", "intdict", "list", "tuple", "ordered", "frozen", "pair", "box"])
TREES = st.recursive(
    LEAVES,
    lambda inner: st.builds(_wrap, KINDS, st.lists(inner, max_size=4)),
    max_leaves=30,
)


def _jax_view(tree, is_leaf=None):
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [leaf for _, leaf in flat], [render(keypath_to_path(kp)) for kp, _ in flat]


@settings(max_examples=150, deadline=None)
@given(TREES)
def test_the_walk_is_jaxs_flatten_with_rendered_paths(tree):
    leaves, paths = _flatten_with_rendered_paths(tree, None)
    want_leaves, want_paths = _jax_view(tree)
    assert paths == want_paths
    assert len(leaves) == len(want_leaves)
    assert all(a is b for a, b in zip(leaves, want_leaves, strict=True))


@settings(max_examples=50, deadline=None)
@given(TREES)
def test_the_walk_honours_is_leaf(tree):
    def is_leaf(x):
        return isinstance(x, (tuple, type(None)))

    leaves, paths = _flatten_with_rendered_paths(tree, is_leaf)
    want_leaves, want_paths = _jax_view(tree, is_leaf)
    assert paths == want_paths
    assert all(a is b for a, b in zip(leaves, want_leaves, strict=True))


@pytest.mark.parametrize(
    "groups",
    [[2] * 200, [11] * 40, [400], [1, 3, 2, 5]],
    ids=["pairs", "elevens", "one-group", "mixed"],
)
def test_many_ties_any_grouping(groups):
    """Half or more of the leaves aliases: every group found, canonical first."""
    tree: dict[str, dict[str, object]] = {}
    expected = {}
    for g, size in enumerate(groups):
        array = np.full((2,), g, np.float32)
        tree[f"g{g:03d}"] = {f"m{m:03d}": array for m in range(size)}
        for m in range(1, size):
            expected[f"g{g:03d}/m{m:03d}"] = f"g{g:03d}/m000"
    assert jaxshare.find_shared(tree) == jaxshare.AliasMap(expected)


def test_an_unrenderable_key_fails_only_when_tied():
    a = np.zeros(2)
    assert jaxshare.find_shared({"x/y": np.ones(2), "p": a, "q": a}) == {"q": "p"}
    with pytest.raises(ValueError, match=r"key 'x/y' .* contains '/'"):
        jaxshare.find_shared({"x/y": a, "q": a})


def test_an_empty_key_fails_only_when_tied():
    a = np.zeros(2)
    assert jaxshare.find_shared({"": {"w": np.ones(2)}, "p": a, "q": a}) == {"q": "p"}
    with pytest.raises(ValueError, match="is not a path"):
        jaxshare.find_shared({"": {"w": a}, "q": a})
