"""Stacks one right after another in a layout table's entry (``bridge.layouts.ops.Stacks``):
a layer's experts on one axis, then the layers on another, in one leaf (MaxText's
mixtures of experts). The op's shapes and part indices against numpy's nested
``np.stack``; a table with such an entry both ways, bit for bit, its slices reading
only the tensors they cover, scanned or not; and one line for each bad entry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.layouts.ops import Stack, Stacks
from bridge.layouts.table import Table
from bridge.layouts.view import TableToFlax, TableToTorch
from jaxshare.checkpoint import TreeSource
from jaxshare.internal import nest
from jaxshare.stream import ArrayInfo, TensorSource


class _Named(TensorSource):
    """PyTorch-named tensors in memory, recording the names read."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self._tensors = tensors
        self.infos = {n: ArrayInfo(a.shape, a.dtype.name) for n, a in tensors.items()}
        self.reads: list[str] = []

    def read(self, name: str) -> np.ndarray:
        self.reads.append(name)
        return self._tensors[name]


def _nested_stack(parts: list[np.ndarray], counts: tuple[int, int], axes: tuple[int, int]):
    """numpy's own: each layer's experts stacked on ``axes[0]``, then the layers on
    ``axes[1]`` (``parts``: the first placeholder fastest)."""
    experts, layers = counts
    by_layer = [np.stack(parts[i * experts : (i + 1) * experts], axes[0]) for i in range(layers)]
    return np.stack(by_layer, axes[1])


@given(
    part=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    experts=st.integers(1, 4),
    layers=st.integers(1, 4),
    data=st.data(),
)
def test_stacks_are_numpys_nested_stack(part, experts, layers, data) -> None:
    first = data.draw(st.integers(0, len(part)))
    second = data.draw(st.integers(0, len(part) + 1))
    rng = np.random.default_rng(len(part) + experts + layers)
    parts = [rng.standard_normal(part).astype(np.float32) for _ in range(experts * layers)]
    want = _nested_stack(parts, (experts, layers), (first, second))
    op = Stacks((Stack("e", first), Stack("i", second)))
    assert op.combined([tuple(part)] * len(parts), (experts, layers)) == want.shape
    assert op.counts(want.shape) == (experts, layers)
    assert op.part_shapes(want.shape) == [tuple(part)] * len(parts)
    for k, x in enumerate(parts):
        assert np.array_equal(want[op.part_index(k, want.shape)], x), k


def test_stacks_of_parts_that_differ_or_do_not_count_up_are_refused() -> None:
    op = Stacks((Stack("e", 0), Stack("i", 1)))
    with pytest.raises(ValueError, match=r"stacks over \{e, i\}: 5 parts are not 2 x 3"):
        op.combined([(2,)] * 5, (2, 3))
    with pytest.raises(ValueError, match=r"the parts' shapes differ"):
        op.combined([(2,)] * 5 + [(3,)], (2, 3))


#: Experts ``x.{e}`` of each layer ``h.{i}``, stacked on axis ``e_axis``, then the
#: layers on ``axis`` where ``scan`` holds (``h_{i}/x/w`` where it does not).
EXPERTS = {
    "name": "experts",
    "ranges": {
        "i": {"size": "layers", "noun": "layer"},
        "e": {"size": "experts", "noun": "expert"},
    },
    "entry": [
        {"torch": "emb.w", "flax": "emb", "shape": ["d", "d"]},
        {
            "torch": "h.{i}.x.{e}.w",
            "flax": "h/x/w",
            "shape": ["d", "d + 1"],
            "ops": [
                {"permute": [1, 0]},
                {"stack": "e", "axis": "e_axis"},
                {"stack": "i", "axis": "axis", "when": "scan", "unstacked": {"h": "h_{i}"}},
            ],
        },
    ],
}


def _experts(rng: np.random.Generator, layers: int, experts: int, d: int) -> dict:
    out = {"emb.w": rng.standard_normal((d, d)).astype(np.float32)}
    for i, e in itertools.product(range(layers), range(experts)):
        out[f"h.{i}.x.{e}.w"] = rng.standard_normal((d, d + 1)).astype(np.float32)
    return out


@given(
    layers=st.integers(1, 3),
    experts=st.integers(1, 4),
    d=st.integers(1, 3),
    e_axis=st.integers(0, 2),
    axis=st.integers(0, 3),
    scan=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_a_leaf_of_two_stacks_comes_back_bit_for_bit(
    layers, experts, d, e_axis, axis, scan, seed, data
) -> None:
    table = Table.from_dict(EXPERTS)
    sizes = {"layers": layers, "experts": experts, "d": d}
    options = {"scan": scan, "axis": axis, "e_axis": e_axis}
    tensors = _experts(np.random.default_rng(seed), layers, experts, d)
    source = _Named(tensors)
    tree = TableToFlax(source, table, sizes, options=options)
    leaves = {p: tree.array(p) for p in tree.infos}
    per_layer = [
        np.stack([tensors[f"h.{i}.x.{e}.w"].T for e in range(experts)], e_axis)
        for i in range(layers)
    ]
    if scan:
        assert sorted(leaves) == ["emb", "h/x/w"]
        want = np.stack(per_layer, axis)
        assert np.array_equal(leaves["h/x/w"], want)
        index = tuple(  # (A slice: only the tensors it covers are read.)
            slice(data.draw(st.integers(0, n - 1)), data.draw(st.integers(1, n)))
            for n in want.shape
        )
        source.reads.clear()
        assert np.array_equal(tree.read_slice("h/x/w", index), want[index])
        e_at, i_at = Stacks((Stack("e", e_axis), Stack("i", axis))).axes(want.ndim)
        covered = itertools.product(
            range(layers)[index[i_at]], range(experts)[index[e_at]]
        )  # fmt: skip
        if want[index].size:
            assert sorted(set(source.reads)) == sorted(f"h.{i}.x.{e}.w" for i, e in covered)
    else:
        assert sorted(leaves) == ["emb", *(f"h_{i}/x/w" for i in range(layers))]
        assert all(np.array_equal(leaves[f"h_{i}/x/w"], per_layer[i]) for i in range(layers))
    bound = table.bind(sizes, options=options)
    assert list(bound.torch_shapes()) == list(tensors)  # (Layer by layer, expert by expert.)
    back = TableToTorch(TreeSource(nest(leaves)), table, sizes, options=options)
    assert list(back.infos) == list(tensors)
    for name, x in tensors.items():
        got = back.array(name)
        assert got.dtype == x.dtype and np.array_equal(got, x), name


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"h.1.x.2.w": None}, "the tensor 'h.1.x.2.w' (2, 3) is missing"),
        ({"h.1.x.3.w": np.zeros((2, 3), np.float32)},
         "the tensor 'h.1.x.3.w' has no place in the experts layout (expert 3 is beyond "
         "experts=3)"),
        ({"h.1.x.2.w": np.zeros((2, 3), np.float16)},
         "'h.1.x.2.w' is float16, but layer 0, expert 0's is float32"),
    ],
)  # fmt: skip
def test_a_bad_expert_is_one_line(edit, says) -> None:
    tensors = _experts(np.random.default_rng(1), 2, 3, 2)
    for name, value in edit.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    sizes = {"layers": 2, "experts": 3, "d": 2}
    options = {"scan": True, "axis": 1, "e_axis": 0}
    with pytest.raises(ValueError) as e:
        TableToFlax(_Named(tensors), Table.from_dict(EXPERTS), sizes, options=options)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_leaf_stacking_other_counts_than_the_config_is_one_line() -> None:
    table = Table.from_dict(EXPERTS)
    options = {"scan": True, "axis": 1, "e_axis": 0}
    leaf = np.zeros((4, 2, 3, 2), np.float32)  # (4 experts, where the config says 3.)
    tree = TreeSource(nest({"emb": np.zeros((2, 2), np.float32), "h/x/w": leaf}))
    with pytest.raises(ValueError) as e:
        TableToTorch(tree, table, {"layers": 2, "experts": 3, "d": 2}, options=options)
    assert (
        "the leaf 'h/x/w' (4, 2, 3, 2) stacks 4 experts on its axis 0 (e_axis), but "
        "config.json has experts=3; pass the config" in str(e.value)
    ), str(e.value)
    with pytest.raises(ValueError) as e:
        TableToTorch(tree, table, {"layers": 3, "experts": 4, "d": 2}, options=options)
    assert "stacks 2 layers on its axis 1 (axis), but config.json has layers=3" in str(e.value)


@pytest.mark.parametrize(
    ("ops", "says"),
    [
        ([{"stack": "e"}, {"permute": [1, 0, 2]}, {"stack": "i"}],
         "at most one stack or concat per entry, or stacks one right after another"),
        ([{"concat": "e", "axis": 0}, {"stack": "i"}],
         "at most one stack or concat per entry, or stacks one right after another"),
        ([{"stack": "e"}, {"stack": "e"}], "two stacks over one placeholder"),
    ],
)  # fmt: skip
def test_stacks_apart_or_over_one_placeholder_are_refused_at_load(ops, says) -> None:
    data = {"name": "t", "entry": [{"torch": "h.{i}.x.{e}.w", "flax": "h/x/w", "ops": ops}]}
    with pytest.raises(ValueError, match=r"^layout: entry 1") as e:
        Table.from_dict(data)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
