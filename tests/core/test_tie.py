from collections import OrderedDict, defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import FrozenDict

from jaxshare import AliasMap, dedupe, find_shared, retie


def leaves_by_path(tree):
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


CASES = [
    # name, tree, expected unique tree
    ("dict", lambda t: {"wte": t.W, "head": t.W, "b": t.V}, lambda t: {"b": t.V, "head": t.W}),
    (
        "nested-prunes-emptied",
        lambda t: {"wte": {"embedding": t.W}, "lm_head": {"kernel": t.W}},
        lambda t: {"lm_head": {"kernel": t.W}},
    ),
    ("list-gets-none", lambda t: [t.W, t.V, t.W], lambda t: [t.W, t.V, None]),
    ("tuple-gets-none", lambda t: {"t": (t.V, t.V)}, lambda t: {"t": (t.V, None)}),
    ("namedtuple", lambda t: t.Block(t.W, t.W), lambda t: t.Block(t.W, None)),
    ("dataclass", lambda t: t.Model(t.W, t.W), lambda t: t.Model(t.W, None)),
    (
        "frozendict",
        lambda t: FrozenDict({"p": {"x": t.W, "y": t.W}}),
        lambda t: FrozenDict({"p": {"x": t.W}}),
    ),
    (
        "ordereddict-keeps-order",
        lambda t: OrderedDict(b=t.W, c=t.V, a=t.W),
        lambda t: OrderedDict(b=t.W, c=t.V, a=None),
    ),
    ("mapping-in-list", lambda t: [{"k": t.W}, {"k": t.W}], lambda t: [{"k": t.W}, {}]),
    (
        "keeps-empty-originals",
        lambda t: {"e": {}, "a": t.W, "b": t.W},
        lambda t: {"e": {}, "a": t.W},
    ),
]


def _same_leaves(a, b) -> bool:
    """Same structure, and each leaf the very same object."""
    leaves_a, struct_a = jax.tree_util.tree_flatten(a)
    leaves_b, struct_b = jax.tree_util.tree_flatten(b)
    return struct_a == struct_b and all(x is y for x, y in zip(leaves_a, leaves_b, strict=True))


@pytest.mark.parametrize("name, build, build_unique", CASES, ids=[c[0] for c in CASES])
def test_dedupe_and_retie_round_trip(name, build, build_unique, trees):
    tree, unique = build(trees), build_unique(trees)
    before = jax.tree_util.tree_flatten_with_path(tree)
    got, m = dedupe(tree)
    assert type(got) is type(unique) and _same_leaves(got, unique)
    full = retie(got, m)
    assert type(full) is type(tree) and _same_leaves(full, tree)
    if isinstance(tree, OrderedDict):
        assert list(got) == list(unique) and list(full) == list(tree)  # Key order kept.
    assert find_shared(full) == m
    after = jax.tree_util.tree_flatten_with_path(tree)  # The input is not mutated.
    assert after[1] == before[1]
    assert all(p == q and x is y for (p, x), (q, y) in zip(after[0], before[0], strict=True))


def test_dedupe_shares_untouched_subtrees(W):
    big = {"layers": {str(i): {"k": jnp.ones(2)} for i in range(10)}, "a": W, "b": W}
    unique, _ = dedupe(big)
    assert unique["layers"] is big["layers"]


def test_dedupe_is_idempotent(W, V):
    tree = {"wte": W, "head": W, "l": [V, V]}
    once, m = dedupe(tree)
    twice, m2 = dedupe(once, m)
    assert m2 == m
    assert leaves_by_path(twice) == leaves_by_path(once)


def test_retie_recreates_int_keys_from_siblings(W):
    tree = {"layers": {0: {"k": W}, 1: {"k": W}}}
    unique, m = dedupe(tree)
    assert unique == {"layers": {0: {"k": W}}}
    full = retie(unique, m)
    assert list(full["layers"]) == [0, 1] and full["layers"][1]["k"] is W


def test_retie_with_transform_shares_one_transposed_array(W):
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


def test_dedupe_accepts_deepspeed_style_plain_dicts(W):
    unique, m = dedupe({"a": W, "b": W}, {"b": "a"})
    assert unique == {"a": W} and isinstance(m, AliasMap)


def test_dedupe_of_equal_copies_re_establishes_a_tie(W):
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


def test_dedupe_inside_jit(W):
    traced = {}

    @jax.jit
    def f(x):
        tree = {"a": x, "b": x.T.T}  # Two tracers: values unknown while tracing.
        unique, m = dedupe(tree, {"b": "a"})
        traced.update(keys=sorted(unique), alias_map=m, kept=unique["a"] is x)
        return unique["a"]

    np.testing.assert_array_equal(f(W), W)
    assert traced == {"keys": ["a"], "alias_map": AliasMap({"b": "a"}), "kept": True}
    # Shapes are still checked while tracing.
    with pytest.raises(ValueError, match=r"'b' \(alias of 'a'\): expected float32\[3, 4\]"):
        jax.jit(lambda x: dedupe({"a": x, "b": x.T}, {"b": "a"})[0])(W)


def test_mutable_mapping_subclass_with_default_factory(W):
    tree = defaultdict(list, {"a": W, "b": W})
    unique, m = dedupe(tree)
    assert isinstance(unique, defaultdict) and unique.default_factory is list
    assert retie(unique, m)["b"] is W


# -- the bad-input catalogue ---------------------------------------------------


# fmt: off
#: (id, the function, its tree, its alias map, what its error says)
ERRORS = [
    ("dedupe-canonical-missing", dedupe, lambda t: {"a": t.W}, {"b": "x/y"},
     r"no value at canonical path\(s\) \['x/y'\].*aliases: \['b'\]"),
    ("dedupe-alias-of-another-shape", dedupe, lambda t: {"a": t.W, "b": t.V}, {"b": "a"},
     r"'b' \(alias of 'a'\): expected float32\[3, 4\].*got float32\[5\]"),
    ("dedupe-alias-of-other-values", dedupe, lambda t: {"a": t.W, "b": t.W + 1}, {"b": "a"},
     r"'b' \(alias of 'a'\): holds different values"),
    ("dedupe-alias-of-another-dtype", dedupe,
     lambda t: {"a": t.W, "b": t.W.astype(jnp.bfloat16)}, {"b": "a"},
     r"expected float32\[3, 4\].*got bfloat16"),
    ("dedupe-alias-not-transposed", dedupe, lambda t: {"a": t.W, "b": t.W},
     AliasMap({"b": "a"}, transforms={"b": (1, 0)}),
     r"expected float32\[4, 3\] \(the canonical transposed by \[1, 0\]\)"),
    ("dedupe-transform-of-another-rank", dedupe, lambda t: {"a": t.W, "b": t.W},
     AliasMap({"b": "a"}, transforms={"b": (2, 0, 1)}),
     r"alias 'b' has transform \[2, 0, 1\] for 3 axes.*shape \(3, 4\)"),
    ("dedupe-alias-path-through-a-list", dedupe, lambda t: {"a": t.W, "l": [t.W]}, {"l/3": "a"},
     r"'l/3': no such path \(stops at 'l', which is not a mapping\)"),
    ("dedupe-alias-not-an-array", dedupe, lambda t: {"a": t.W, "b": "text"}, {"b": "a"},
     r"'b' \(alias of 'a'\): a str and a ArrayImpl"),
    ("retie-canonical-missing", retie, lambda t: {"a": t.W}, {"b": "missing"},
     r"`unique_tree` has no value at canonical path\(s\) \['missing'\]"),
    ("retie-alias-path-taken", retie, lambda t: {"a": t.W, "b": t.V}, {"b": "a"},
     r"already holds a ArrayImpl at alias path 'b'"),
    ("retie-parent-is-a-list", retie, lambda t: {"a": t.W, "l": [t.V]}, {"l/1": "a"},
     r"cannot create l/1: its parent is a list"),
    ("retie-parent-is-a-tuple", retie, lambda t: {"a": t.W, "t": (t.V,)}, {"t/x/y": "a"},
     r"cannot create t/x: its parent is a tuple"),
    ("retie-parent-is-a-leaf", retie, lambda t: {"a": t.W}, {"a/b": "a"},
     r"'a' is a leaf of type ArrayImpl"),
    ("retie-transform-of-another-rank", retie, lambda t: {"a": t.W},
     AliasMap({"b": "a"}, transforms={"b": (0, 2, 1)}),
     r"alias 'b'.*3 axes.*\(3, 4\)"),
    ("retie-canonical-is-none", retie, lambda t: {"a": None}, {"b": "a"},
     r"no value at canonical path\(s\) \['a'\]"),
]
# fmt: on


@pytest.mark.parametrize("name, function, build, amap, match", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_paths(name, function, build, amap, match, trees):
    with pytest.raises(ValueError, match=match):
        function(build(trees), amap)


def test_dedupe_reports_every_problem_at_once(W, V):
    with pytest.raises(ValueError) as e:
        dedupe({"a": W, "b": V, "c": W + 1}, {"b": "a", "c": "a"})
    assert "'b' (alias of 'a')" in str(e.value) and "'c' (alias of 'a')" in str(e.value)


def test_retie_refuses_transform_of_non_array():
    with pytest.raises(ValueError, match=r"alias 'b' has transform \[1, 0\].*canonical is a str"):
        retie({"a": "text"}, AliasMap({"b": "a"}, transforms={"b": (1, 0)}))


def test_non_string_keys_are_rejected_where_rendered(W):
    with pytest.raises(ValueError, match=r"key 1.5 of type float"):
        dedupe({1.5: W, 2.5: W})
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['y'\]"):
        dedupe({1.5: W, 2.5: W}, {"x": "y"})


def test_str_and_int_keys_rendering_alike_are_rejected(W, V):
    with pytest.raises(ValueError, match=r"keys '1' and 1 under '' render to the same path"):
        retie({"1": W, 1: V}, {"a": "1"})


def test_sequences_are_looked_up_by_index(W, V):
    tree = {"l": [V, W], "t": (W,)}
    assert retie({"l": [V, W], "t": (None,)}, {"t/0": "l/1"})["t"][0] is W
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['l/2'\]"):
        retie(tree, {"t/0": "l/2"})
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['l/01'\]"):
        retie(tree, {"t/0": "l/01"})


def test_retie_of_identical_alias_is_accepted(W):
    assert retie({"a": W, "b": W}, {"b": "a"})["b"] is W
