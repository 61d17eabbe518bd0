"""A stack's transposed slice made in one pass equals the slice read, then transposed."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.core.naming import EXPERT
from jaxshare.io.stack import StackedSource
from jaxshare.io.transpose import contiguous_transpose
from jaxshare.stream import ArrayInfo, TensorSource


class Arrays(TensorSource):
    """Tensors held in memory (a view of them is their own memory)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.infos = {n: ArrayInfo(a.shape, a.dtype.name) for n, a in arrays.items()}

    def read(self, name: str) -> np.ndarray:
        return self.arrays[name]


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 3),
    experts=st.integers(1, 4),
    shape=st.tuples(st.integers(1, 5), st.integers(1, 6)),
    bf16=st.booleans(),
    order=st.sampled_from(list(itertools.permutations(range(3)))),
    layer=st.integers(0, 2),
)
def test_a_stack_of_stacks_transposes_each_member_into_place(
    layers, experts, shape, bf16, order, layer
) -> None:
    """Layers x experts, each weight 2-D: every permutation that keeps the layers' axis
    first, of one layer (as a stacked leaf is written) or of all, equals the slice
    read and then transposed, bit for bit; one that moves it is left to the reader."""
    rng = np.random.default_rng(layers * 100 + experts)
    dtype = ml_dtypes.bfloat16 if bf16 else np.float32
    arrays = {
        f"m.layers.{i}.experts.{e}.w": rng.standard_normal(shape).astype(dtype)
        for i in range(layers)
        for e in range(experts)
    }
    inner = StackedSource(Arrays(arrays), ["m.layers.{i}.experts"], EXPERT)
    stacked = StackedSource(inner, ["m.layers"])
    (name,) = stacked.infos
    assert stacked.infos[name].shape == (layers, experts, *shape)
    perm = (0, *(k + 1 for k in order))
    k = min(layer, layers - 1)
    for index in [(slice(k, k + 1),), ()]:
        made = stacked.permuted_slice(name, index, perm)
        want = contiguous_transpose(stacked.read_slice(name, index), perm)
        assert made is not None and made.dtype == want.dtype and made.flags.c_contiguous
        np.testing.assert_array_equal(made, want)
    assert stacked.permuted_slice(name, (), (1, 0, 2, 3)) is None


def test_an_items_stacked_slice_transposed_as_decoded_equals_read_then_transposed(
    tmp_path, monkeypatch
) -> None:
    """An item's stack of experts (chunks narrower than a layer's experts): a layer's
    slice, decoded in place and transposed chunk by chunk as it is decoded, equals the
    slice read and then transposed, bit for bit; and the layers of the stack read back
    as per-expert tensors are the file's."""
    from safetensors.numpy import save_file

    import bridge
    from jaxshare.checkpoint._source import CheckpointSource

    rng = np.random.default_rng(0)
    tensors = {
        f"m.layers.{i}.experts.{e}.w": rng.standard_normal((24, 40)).astype(ml_dtypes.bfloat16)
        for i in range(3)
        for e in range(5)
    }
    save_file(tensors, tmp_path / "m.safetensors")
    import jaxshare.checkpoint._stream as stream

    monkeypatch.setattr(stream, "CHUNK_BYTES", 2 * 24 * 40 * 2)  # Two experts a chunk.
    stacks = ["m.layers", "m.layers.{i}.experts"]
    bridge.convert(tmp_path / "m.safetensors", tmp_path / "item", stack=stacks)
    with bridge.open_source(tmp_path / "item") as source:
        base = source
        while not isinstance(base, CheckpointSource):
            base = base._source
        (name,) = base.infos
        assert base.infos[name].shape == (3, 5, 24, 40)
        assert base.chunk_shape(name) == (1, 2, 24, 40)  # (The last one past the end.)
        for index in [(slice(1, 2),), (slice(0, 3), slice(1, 4))]:
            made = base.permuted_slice(name, index, (0, 1, 3, 2))
            want = contiguous_transpose(base.read_slice(name, index), (0, 1, 3, 2))
            assert made is not None and made.tobytes() == want.tobytes()
    bridge.convert(tmp_path / "item", tmp_path / "back.safetensors", names="torch")
    from safetensors.numpy import load_file

    back = load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(tensors)
    assert all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)


@settings(max_examples=25, deadline=None)
@given(stacks=st.integers(1, 4), experts=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_stacks_read_ahead_give_each_expert_in_any_order(stacks, experts, seed) -> None:
    """Each stack read whole once in turn (the next ones read ahead on threads): every
    expert of every stack, asked for in turn or out of it, is its slice, bit for bit."""
    from jaxshare.io.stack import UnstackedSource

    rng = np.random.default_rng(seed)
    arrays = {
        f"m.{s}.experts.{EXPERT}.w": rng.standard_normal((experts, 3, 2)).astype(np.float32)
        for s in range(stacks)
    }
    names = [f"m.{s}.experts.{e}.w" for s in range(stacks) for e in range(experts)]
    for order in (names, list(rng.permutation(names))):
        with UnstackedSource(Arrays(arrays), EXPERT) as source:
            assert sorted(source.infos) == sorted(names)
            for name in order:
                s, e = int(name.split(".")[1]), int(name.split(".")[3])
                got = source.array(name)
                assert got.tobytes() == arrays[f"m.{s}.experts.{EXPERT}.w"][e].tobytes()
