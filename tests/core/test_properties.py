"""Property tests of the core laws over random trees with random tie patterns.

- ``retie(*dedupe(t))`` rebuilds ``t``: same structure, the very same leaf
  objects, ties as identity, transposed ties as one shared transpose.
- ``find_shared(retie(u, m)) == m`` for identity maps.
- ``AliasMap`` survives JSON; the canonical choice is stable.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from jaxshare import AliasMap, dedupe, find_shared, retie
from jaxshare.core.paths import flatten_with_paths, keypath_to_path, render

# A pool of arrays: dtypes incl. bf16, ints, bools; scalars; empty arrays.
POOL = [
    jnp.arange(6.0).reshape(2, 3),
    jnp.ones((3, 2), jnp.bfloat16),
    jnp.arange(4, dtype=jnp.int32),
    jnp.array([True, False]),
    jnp.float32(2.5),
    jnp.zeros((0, 2)),
    np.arange(8, dtype=np.int8).reshape(2, 4),
    jnp.arange(12, dtype=jnp.float16).reshape(3, 4),
]
TWO_D = [i for i, x in enumerate(POOL) if x.ndim == 2]
TRANSPOSED = {
    i: (np.transpose if isinstance(POOL[i], np.ndarray) else jnp.transpose)(POOL[i]) for i in TWO_D
}


@dataclasses.dataclass(frozen=True)
class Ref:
    """A leaf placeholder: POOL[i], or its (shared) transpose."""

    i: int
    t: bool = False


leaf_refs = st.one_of(
    st.builds(Ref, st.integers(0, len(POOL) - 1)),
    st.builds(Ref, st.sampled_from(TWO_D), st.just(True)),
    st.just(None),
    st.integers(-3, 3),
)
keys = st.sampled_from(["a", "b", "kernel", "embedding", "0", "x_1"])
trees = st.recursive(
    leaf_refs,
    lambda children: st.one_of(
        st.dictionaries(keys, children, max_size=4),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
    ),
    max_leaves=16,
)


def materialise(tree):
    return jax.tree.map(
        lambda r: (TRANSPOSED[r.i] if r.t else POOL[r.i]) if isinstance(r, Ref) else r,
        tree,
        is_leaf=lambda x: isinstance(x, Ref),
    )


def expected_map(tree) -> AliasMap:
    """The ties the tree was built with, computed independently of find_shared."""
    groups: dict[int, list[tuple[str, bool]]] = {}
    for path, leaf in flatten_with_paths(tree, is_leaf=lambda x: isinstance(x, Ref)):
        if isinstance(leaf, Ref):
            groups.setdefault(leaf.i, []).append((render(path), leaf.t))
    aliases, transforms = {}, {}
    for members in groups.values():
        plain = [p for p, t in members if not t]
        canonical = plain[0] if plain else members[0][0]
        for p, t in members:
            if p == canonical:
                continue
            aliases[p] = canonical
            if t and plain:
                transforms[p] = (1, 0)
    return AliasMap(aliases, transforms=transforms)


def same_objects(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb, strict=True))


@given(trees)
def test_retie_inverts_dedupe(refs):
    tree = materialise(refs)
    m = expected_map(refs)
    unique, m2 = dedupe(tree, m)
    assert m2 == m
    for alias in m:
        assert alias not in {render(p) for p, _ in flatten_with_paths(unique)}
    assert_retied(retie(unique, m), tree, m)


def assert_retied(full, original, m: AliasMap) -> None:
    """``full`` is ``original`` leaf for leaf: the same objects, except transposed
    aliases, which are one shared transpose per canonical, equal bit for bit."""
    lf, tf = jax.tree_util.tree_flatten_with_path(full)
    lo, to = jax.tree_util.tree_flatten_with_path(original)
    assert tf == to
    shared: dict[str, object] = {}
    for (kp, x), (_, y) in zip(lf, lo, strict=True):
        path = render(keypath_to_path(kp))
        if path in m and m.transform(path) is not None:
            assert x is shared.setdefault(m[path], x)
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert x is y, path


@given(trees)
def test_find_shared_recovers_identity_ties(refs):
    tree = materialise(refs)
    m = find_shared(tree)
    unique, _ = dedupe(tree, m)
    assert find_shared(retie(unique, m)) == m
    expected = expected_map(
        jax.tree.map(
            lambda r: Ref(r.i + 100 * r.t) if isinstance(r, Ref) else r,
            refs,
            is_leaf=lambda x: isinstance(x, Ref),
        )
    )
    assert m == expected  # a transpose is another object: its own identity group


@given(trees)
def test_dedupe_is_idempotent_and_canonicals_stable(refs):
    tree = materialise(refs)
    m = find_shared(tree)
    assert find_shared(tree) == m
    once, _ = dedupe(tree, m)
    twice, _ = dedupe(once, m)
    assert same_objects(once, twice)


paths = st.lists(keys, min_size=1, max_size=3).map("/".join)


@st.composite
def alias_maps(draw):
    canonicals = draw(st.lists(paths, min_size=1, max_size=3, unique=True))
    aliases = draw(st.lists(paths.filter(lambda p: p not in canonicals), max_size=6, unique=True))
    pairs = {a: draw(st.sampled_from(canonicals)) for a in aliases}
    transforms = {
        a: draw(st.permutations(range(draw(st.integers(1, 3)))))
        for a in aliases
        if draw(st.booleans())
    }
    return AliasMap(pairs, transforms=transforms)


@given(alias_maps())
def test_alias_map_json_round_trip(m):
    back = AliasMap.from_json(m.to_json())
    assert back == m and hash(back) == hash(m)
    assert back.groups() == m.groups()
    assert all(back.transform(a) == m.transform(a) for a in m)
