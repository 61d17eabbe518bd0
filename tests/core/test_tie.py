import copy
from collections import OrderedDict, defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _trees import Block, Model, V, W
from flax.core import FrozenDict

from jaxshare import AliasMap, dedupe, find_shared, retie


def leaves_by_path(tree):
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


CASES = [
    # name, tree, expected unique tree
    ("dict", {"wte": W, "head": W, "b": V}, {"b": V, "head": W}),
    (
        "nested-prunes-emptied",
        {"wte": {"embedding": W}, "lm_head": {"kernel": W}},
        {"lm_head": {"kernel": W}},
    ),
    ("list-gets-none", [W, V, W], [W, V, None]),
    ("tuple-gets-none", {"t": (V, V)}, {"t": (V, None)}),
    ("namedtuple", Block(W, W), Block(W, None)),
    ("dataclass", Model(W, W), Model(W, None)),
    ("frozendict", FrozenDict({"p": {"x": W, "y": W}}), FrozenDict({"p": {"x": W}})),
    ("ordereddict-keeps-order", OrderedDict(b=W, c=V, a=W), OrderedDict(b=W, c=V, a=None)),
    ("mapping-in-list", [{"k": W}, {"k": W}], [{"k": W}, {}]),
    ("keeps-empty-originals", {"e": {}, "a": W, "b": W}, {"e": {}, "a": W}),
]


@pytest.mark.parametrize("name, tree, unique", CASES, ids=[c[0] for c in CASES])
def test_dedupe_and_retie_round_trip(name, tree, unique):
    before = copy.copy(tree)
    got, m = dedupe(tree)
    assert type(got) is type(unique)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(unique)
    assert all(
        a is b
        for a, b in zip(
            jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(unique), strict=False
        )
    )
    full = retie(got, m)
    assert jax.tree_util.tree_structure(full) == jax.tree_util.tree_structure(tree)
    assert all(
        a is b
        for a, b in zip(
            jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(tree), strict=False
        )
    )
    assert find_shared(full) == m
    assert type(full) is type(tree)
    if isinstance(tree, dict):
        assert tree == before  # input not mutated (same keys, same objects)


def test_dedupe_shares_untouched_subtrees():
    big = {"layers": {str(i): {"k": jnp.ones(2)} for i in range(10)}, "a": W, "b": W}
    unique, _ = dedupe(big)
    assert unique["layers"] is big["layers"]


def test_dedupe_is_idempotent():
    tree = {"wte": W, "head": W, "l": [V, V]}
    once, m = dedupe(tree)
    twice, m2 = dedupe(once, m)
    assert m2 == m
    assert leaves_by_path(twice) == leaves_by_path(once)


def test_retie_recreates_int_keys_from_siblings():
    tree = {"layers": {0: {"k": W}, 1: {"k": W}}}
    unique, m = dedupe(tree)
    assert unique == {"layers": {0: {"k": W}}}
    full = retie(unique, m)
    assert list(full["layers"]) == [0, 1] and full["layers"][1]["k"] is W


def test_retie_with_transform_shares_one_transposed_array():
    m = AliasMap(
        {"head/kernel": "wte", "head2/kernel": "wte"},
        transforms={"head/kernel": (1, 0), "head2/kernel": (1, 0)},
    )
    full = retie({"wte": W}, m)
    assert full["head"]["kernel"] is full["head2"]["kernel"]
    np.testing.assert_array_equal(full["head"]["kernel"], W.T)
    unique, m2 = dedupe(full, m)
    assert unique == {"wte": W} and m2 == m


def test_retie_numpy_transform_is_a_view():
    w = np.arange(6.0).reshape(2, 3)
    full = retie({"w": w}, AliasMap({"t": "w"}, transforms={"t": (1, 0)}))
    assert np.shares_memory(full["t"], w)


def test_dedupe_accepts_deepspeed_style_plain_dicts():
    unique, m = dedupe({"a": W, "b": W}, {"b": "a"})
    assert unique == {"a": W} and isinstance(m, AliasMap)


def test_dedupe_of_equal_copies_re_establishes_a_tie():
    # jax.jit returns two copies of one array: equal values, distinct objects.
    a, b = jax.jit(lambda x: (x, x))(W)
    unique, m = dedupe({"a": a, "b": b}, {"b": "a"})
    assert set(unique) == {"a"}


def test_dedupe_on_abstract_targets():
    sds = jax.ShapeDtypeStruct
    target = {"wte": sds((10, 4), jnp.bfloat16), "head": sds((4, 10), jnp.bfloat16)}
    m = AliasMap({"head": "wte"}, transforms={"head": (1, 0)})
    unique, _ = dedupe(target, m)
    assert set(unique) == {"wte"}
    full = retie(unique, m)
    assert full["head"].shape == (4, 10) and full["head"].dtype == jnp.bfloat16


def test_dedupe_inside_jit():
    @jax.jit
    def f(x):
        tree = {"a": x, "b": x.T.T}
        unique, _ = dedupe(tree, {"b": "a"})  # Shapes checked; values unknown while tracing.
        return unique["a"]

    f(W)


def test_mutable_mapping_subclass_with_default_factory():
    tree = defaultdict(list, {"a": W, "b": W})
    unique, m = dedupe(tree)
    assert isinstance(unique, defaultdict) and unique.default_factory is list
    assert retie(unique, m)["b"] is W


# -- the bad-input catalogue ---------------------------------------------------


@pytest.mark.parametrize(
    "tree, amap, match",
    [
        ({"a": W}, {"b": "x/y"}, r"no value at canonical path\(s\) \['x/y'\].*aliases: \['b'\]"),
        (
            {"a": W, "b": V},
            {"b": "a"},
            r"'b' \(alias of 'a'\): expected float32\[3, 4\].*got float32\[5\]",
        ),
        ({"a": W, "b": W + 1}, {"b": "a"}, r"'b' \(alias of 'a'\): holds different values"),
        (
            {"a": W, "b": W.astype(jnp.bfloat16)},
            {"b": "a"},
            r"expected float32\[3, 4\].*got bfloat16",
        ),
        (
            {"a": W, "b": W},
            AliasMap({"b": "a"}, transforms={"b": (1, 0)}),
            r"expected float32\[4, 3\] \(the canonical transposed by \[1, 0\]\)",
        ),
        (
            {"a": W, "b": W},
            AliasMap({"b": "a"}, transforms={"b": (2, 0, 1)}),
            r"alias 'b' has transform \[2, 0, 1\] for 3 axes.*shape \(3, 4\)",
        ),
        (
            {"a": W, "l": [W]},
            {"l/3": "a"},
            r"'l/3': no such path \(stops at 'l', which is not a mapping\)",
        ),
        ({"a": W, "b": "text"}, {"b": "a"}, r"'b' \(alias of 'a'\): a str and a ArrayImpl"),
    ],
)
def test_dedupe_errors_name_the_paths(tree, amap, match):
    with pytest.raises(ValueError, match=match):
        dedupe(tree, amap)


def test_dedupe_reports_every_problem_at_once():
    with pytest.raises(ValueError) as e:
        dedupe({"a": W, "b": V, "c": W + 1}, {"b": "a", "c": "a"})
    assert "'b' (alias of 'a')" in str(e.value) and "'c' (alias of 'a')" in str(e.value)


@pytest.mark.parametrize(
    "unique, amap, match",
    [
        (
            {"a": W},
            {"b": "missing"},
            r"`unique_tree` has no value at canonical path\(s\) \['missing'\]",
        ),
        ({"a": W, "b": V}, {"b": "a"}, r"already holds a ArrayImpl at alias path 'b'"),
        ({"a": W, "l": [V]}, {"l/1": "a"}, r"cannot create l/1: its parent is a list"),
        ({"a": W, "t": (V,)}, {"t/x/y": "a"}, r"cannot create t/x: its parent is a tuple"),
        ({"a": W}, {"a/b": "a"}, r"'a' is a leaf of type ArrayImpl"),
        (
            {"a": W},
            AliasMap({"b": "a"}, transforms={"b": (0, 2, 1)}),
            r"alias 'b'.*3 axes.*\(3, 4\)",
        ),
        ({"a": None}, {"b": "a"}, r"no value at canonical path\(s\) \['a'\]"),
    ],
)
def test_retie_errors_name_the_paths(unique, amap, match):
    with pytest.raises(ValueError, match=match):
        retie(unique, amap)


def test_retie_refuses_transform_of_non_array():
    with pytest.raises(ValueError, match=r"alias 'b' has transform \[1, 0\].*canonical is a str"):
        retie({"a": "text"}, AliasMap({"b": "a"}, transforms={"b": (1, 0)}))


def test_non_string_keys_are_rejected_where_rendered():
    with pytest.raises(ValueError, match=r"key 1.5 of type float"):
        dedupe({1.5: W, 2.5: W})
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['y'\]"):
        dedupe({1.5: W, 2.5: W}, {"x": "y"})


def test_str_and_int_keys_rendering_alike_are_rejected():
    with pytest.raises(ValueError, match=r"keys '1' and 1 under '' render to the same path"):
        retie({"1": W, 1: V}, {"a": "1"})


def test_sequences_are_looked_up_by_index():
    tree = {"l": [V, W], "t": (W,)}
    assert retie({"l": [V, W], "t": (None,)}, {"t/0": "l/1"})["t"][0] is W
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['l/2'\]"):
        retie(tree, {"t/0": "l/2"})
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['l/01'\]"):
        retie(tree, {"t/0": "l/01"})


def test_retie_of_identical_alias_is_accepted():
    assert retie({"a": W, "b": W}, {"b": "a"})["b"] is W
