"""Ties by memory (``jaxshare.core.memory``): the one rule every reader and writer that ties
by memory follows -- the same extent is one array, a permuted view is an alias with its
permutation, any other overlap is reported, and zero-size arrays never tie by address."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxshare.core.memory import Extent, array_key, memory_ties, numpy_extent

W = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize(
    "arrays, aliases, transforms, overlaps",
    [
        ({"a": W, "b": W[:]}, {"b": "a"}, {}, []),
        ({"a": W, "b": W.transpose(2, 0, 1)}, {"b": "a"}, {"b": (2, 0, 1)}, []),
        ({"a": W, "b": W[1]}, {}, {}, [("b", "a")]),  # a slice: overlaps, no tie
        ({"a": W[0], "b": W[1]}, {}, {}, []),  # apart in memory
        ({"a": W, "b": W.view(np.int32)}, {}, {}, [("b", "a")]),  # other dtype: no tie
        ({"a": W, "b": W.copy()}, {}, {}, []),
        ({"a": W, "b": W, "c": W.T}, {"b": "a", "c": "a"}, {"c": (2, 1, 0)}, []),
    ],
    ids=["same", "permuted", "slice", "apart", "dtype", "copy", "three"],
)
def test_the_rule_by_case(arrays, aliases, transforms, overlaps):
    found = memory_ties({n: numpy_extent(a) for n, a in arrays.items()}, views=True)
    assert (found.aliases, found.transforms, found.overlaps) == (aliases, transforms, overlaps)
    plain = memory_ties({n: numpy_extent(a) for n, a in arrays.items()})
    assert plain.aliases == {a: c for a, c in aliases.items() if a not in transforms}


def test_zero_size_arrays_tie_only_as_one_object():
    empty = np.zeros((0, 3))
    assert numpy_extent(empty) is None
    keys = {"a": array_key(empty), "b": array_key(empty), "c": array_key(np.zeros((0, 3)))}
    assert memory_ties(keys).aliases == {"b": "a"}
    assert memory_ties({"a": numpy_extent(empty), "b": numpy_extent(empty)}).aliases == {}


def test_other_keys_tie_by_equality_only_and_none_never():
    keys = {"a": ("ds_id", 3), "b": ("ds_id", 3), "c": None, "d": None, "e": ("ds_id", 4)}
    assert memory_ties(keys, views=True).aliases == {"b": "a"}


def test_bounds_follow_negative_strides():
    assert numpy_extent(W[::-1]).bounds == numpy_extent(W).bounds
    e = Extent(1000, (3,), (-4,), "float32", 4)
    assert e.bounds == (992, 1004)


@st.composite
def views(draw):
    """A base array and named views of it: the base itself, permutations, slices."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    base = np.arange(int(np.prod(shape)), dtype=np.int16).reshape(shape)
    out = {}
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["same", "perm", "slice"]))
        if kind == "perm":
            perm = draw(st.permutations(range(base.ndim)))
            out[f"v{i}"] = base.transpose(perm)
        elif kind == "slice":
            out[f"v{i}"] = base[tuple(slice(0, draw(st.integers(1, n))) for n in shape)]
        else:
            out[f"v{i}"] = base[...]
    return {"base": base, **out}


@given(views())
def test_each_alias_is_its_canonical_seen_through_its_permutation(arrays):
    found = memory_ties({n: numpy_extent(a) for n, a in arrays.items()}, views=True)
    order = list(arrays)
    for alias, canonical in found.aliases.items():
        assert order.index(canonical) < order.index(alias)
        assert canonical not in found.aliases  # no chains
        perm = found.transforms.get(alias)
        seen = arrays[canonical] if perm is None else arrays[canonical].transpose(perm)
        assert seen.shape == arrays[alias].shape and seen.strides == arrays[alias].strides
        assert np.shares_memory(seen, arrays[alias]) or not seen.size
    for name, other in found.overlaps:
        assert np.shares_memory(arrays[name], arrays[other])
    untied = [n for n in arrays if n not in found.aliases]
    for a, b in itertools.combinations(untied, 2):  # what stays apart is no view of another
        same = numpy_extent(arrays[a]) == numpy_extent(arrays[b])
        assert not same
