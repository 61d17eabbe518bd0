"""Naming and axis rules: each PyTorch layer's tensors land where Flax expects them."""

import dataclasses
import warnings

import jax
import numpy as np
import pytest
import torch
from flax import linen as nn
from torch import nn as tnn

import bridge
from bridge import Rule, Rules, to_flax, to_torch
from bridge.naming.flax_placement import TorchLeaf, candidates, module_variants
from bridge.naming.torch_naming import torch_name


class Conv1D(tnn.Module):
    """Hugging Face's GPT-2 Conv1D: a Linear whose weight is stored (in, out)."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = tnn.Parameter(torch.randn(nx, nf))
        self.bias = tnn.Parameter(torch.randn(nf))


class Custom(tnn.Module):
    def __init__(self):
        super().__init__()
        self.pos_embed = tnn.Parameter(torch.randn(5, 3))
        self.register_buffer("step", torch.tensor(7))


def _one(layer: tnn.Module) -> tnn.Module:
    return tnn.ModuleDict({"layer": layer})


# (layer, {flax path: (permutation from torch, torch name)})
LAYERS = [
    (
        tnn.Linear(3, 5),
        {"params/layer/kernel": ((1, 0), "weight"), "params/layer/bias": (None, "bias")},
    ),
    (
        tnn.Conv1d(2, 4, 3),
        {"params/layer/kernel": ((2, 1, 0), "weight"), "params/layer/bias": (None, "bias")},
    ),
    (
        tnn.Conv2d(2, 4, (3, 5)),
        {"params/layer/kernel": ((2, 3, 1, 0), "weight"), "params/layer/bias": (None, "bias")},
    ),
    (tnn.Conv3d(2, 4, 3, bias=False), {"params/layer/kernel": ((2, 3, 4, 1, 0), "weight")}),
    (tnn.ConvTranspose2d(2, 4, 3, bias=False), {"params/layer/kernel": ((2, 3, 0, 1), "weight")}),
    (Conv1D(4, 3), {"params/layer/kernel": (None, "weight"), "params/layer/bias": (None, "bias")}),
    (tnn.Embedding(7, 3), {"params/layer/embedding": (None, "weight")}),
    (
        tnn.LayerNorm(3),
        {"params/layer/scale": (None, "weight"), "params/layer/bias": (None, "bias")},
    ),
    (
        tnn.GroupNorm(2, 4),
        {"params/layer/scale": (None, "weight"), "params/layer/bias": (None, "bias")},
    ),
    (tnn.RMSNorm(3), {"params/layer/scale": (None, "weight")}),
    (
        tnn.BatchNorm2d(3),
        {
            "params/layer/scale": (None, "weight"),
            "params/layer/bias": (None, "bias"),
            "batch_stats/layer/mean": (None, "running_mean"),
            "batch_stats/layer/var": (None, "running_var"),
            "batch_stats/layer/num_batches_tracked": (None, "num_batches_tracked"),
        },
    ),
    (
        Custom(),
        {"params/layer/pos_embed": (None, "pos_embed"), "buffers/layer/step": (None, "step")},
    ),
]


@pytest.mark.parametrize(
    "layer, expected", LAYERS, ids=lambda x: type(x).__name__ if isinstance(x, tnn.Module) else ""
)
def test_each_layer_maps_names_and_layouts_and_back(layer, expected, flat):
    model = _one(layer)
    variables, aliases = to_flax(model)
    leaves = flat(variables)
    assert set(leaves) == set(expected) and not aliases
    state = model.state_dict()
    for path, (perm, name) in expected.items():
        tensor = state[f"layer.{name}"]
        want = tensor.numpy() if perm is None else tensor.numpy().transpose(perm)
        np.testing.assert_array_equal(np.asarray(leaves[path]), want)
        assert np.asarray(leaves[path]).dtype == want.dtype
    # Going back needs the layer types only where names are ambiguous (Conv1D, ConvTranspose).
    back = to_torch(variables, like=model)
    assert list(back) == list(state)
    for key, tensor in state.items():
        assert torch.equal(back[key], tensor) and back[key].dtype == tensor.dtype


@pytest.mark.parametrize(
    "key, shape, expected",
    [
        # Module names type the usual layers (bridge.DEFAULT_LAYER_NAMES): GPT-2's Conv1D
        # is stored (in, out) already, an embedding keeps its layout.
        ("h.0.attn.c_attn.weight", (4, 12), ("params/h/0/attn/c_attn/kernel", (0, 1))),
        ("wte.weight", (10, 4), ("params/wte/embedding", (0, 1))),
        ("proj.weight", (10, 4), ("params/proj/kernel", (1, 0))),  # Hugging Face's default
        ("ln.weight", (4,), ("params/ln/scale", None)),
        ("conv.weight", (8, 3, 5, 5), ("params/conv/kernel", (2, 3, 1, 0))),
        ("bn.running_mean", (8,), ("batch_stats/bn/mean", None)),
        ("bn.running_var", (8,), ("batch_stats/bn/var", None)),
        ("bn.num_batches_tracked", (), ("batch_stats/bn/num_batches_tracked", None)),
        ("scalar", (), ("params/scalar", None)),
    ],
)
def test_names_alone_use_the_first_candidate(key, shape, expected, flat):
    variables, aliases = to_flax({key: torch.zeros(shape)})
    ((path, leaf),) = flat(variables).items()
    assert (path, leaf.shape) == (
        expected[0],
        tuple(np.transpose(np.zeros(shape), expected[1]).shape),
    )
    back = to_torch(variables, aliases)  # the naming record makes the way back exact
    assert list(back) == [key] and back[key].shape == shape


def test_a_state_dict_without_layer_types_still_round_trips_exactly():
    model = tnn.ModuleDict(
        {"c": Conv1D(5, 5), "e": tnn.Embedding(5, 5), "t": tnn.ConvTranspose1d(3, 3, 3)}
    )
    state = model.state_dict()
    back = to_torch(*to_flax(state))
    assert all(torch.equal(back[k], v) for k, v in state.items()) and set(back) == set(state)


def test_a_square_conv1d_needs_the_module_and_gets_it_right():
    model = _one(Conv1D(4, 4))
    by_module, _ = to_flax(model)
    by_names, _ = to_flax(model.state_dict())
    w = model.layer.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(by_module["params"]["layer"]["kernel"]), w)
    np.testing.assert_array_equal(np.asarray(by_names["params"]["layer"]["kernel"]), w.T)


def test_like_decides_a_non_square_conv1d_by_shape():
    model = _one(Conv1D(6, 4))
    like = {
        "params": {
            "layer": {
                "kernel": jax.ShapeDtypeStruct((4, 6), np.float32),
                "bias": jax.ShapeDtypeStruct((6,), np.float32),
            }
        }
    }
    variables, _ = to_flax(model.state_dict(), like=like)
    np.testing.assert_array_equal(
        np.asarray(variables["params"]["layer"]["kernel"]), model.layer.weight.detach().numpy()
    )


def test_like_decides_embedding_versus_kernel_by_name():
    state = {"wte.weight": torch.randn(10, 4)}
    like = {"wte": {"embedding": jax.ShapeDtypeStruct((10, 4), np.float32)}}
    variables, _ = to_flax(state, like=like)
    np.testing.assert_array_equal(
        np.asarray(variables["wte"]["embedding"]), state["wte.weight"].numpy()
    )


def test_rules_are_ordered_and_yours_come_first():
    rules = [Rule("weight", "w", layers=("linear",)), *bridge.DEFAULT_RULES]
    model = _one(tnn.Linear(2, 3))
    variables, _ = to_flax(model, rules=rules)
    assert set(variables["params"]["layer"]) == {"w", "bias"}
    assert variables["params"]["layer"]["w"].shape == (3, 2)
    back = to_torch(variables, rules=rules)
    assert torch.equal(back["layer.weight"], model.layer.weight)


def test_layer_kinds_are_overridable():
    class MyProjection(tnn.Linear):
        pass

    class Transposed(tnn.Module):
        def __init__(self):
            super().__init__()
            self.weight = tnn.Parameter(torch.randn(2, 3))

    layers = {**bridge.DEFAULT_LAYERS, "Transposed": "conv1d"}
    model = tnn.ModuleDict({"p": MyProjection(2, 3), "t": Transposed()})
    variables, _ = to_flax(model, rules=Rules(layers=layers))
    assert variables["params"]["p"]["kernel"].shape == (2, 3)  # a Linear subclass is a Linear
    assert variables["params"]["t"]["kernel"].shape == (2, 3)  # kept (in, out)


@pytest.mark.parametrize(
    "linen_lists, path", [(False, "params/layers/0/kernel"), (True, "params/layers_0/kernel")]
)
def test_list_items_are_named_as_nnx_or_as_linen(linen_lists, path, flat):
    model = tnn.ModuleDict({"layers": tnn.ModuleList([tnn.Linear(2, 2)])})
    rules = Rules(linen_lists=linen_lists)
    variables, _ = to_flax(model, rules=rules)
    assert path in flat(variables)
    assert set(to_torch(variables, rules=rules)) == {"layers.0.weight", "layers.0.bias"}


def test_linen_lists_back_without_like_split_every_numbered_name_so_pass_like():
    model = tnn.ModuleDict({"conv_1": tnn.Linear(2, 2)})
    rules = Rules(linen_lists=True)
    variables, _ = to_flax(model, rules=rules)
    assert "conv.1.weight" in to_torch(variables, rules=rules)  # documented ambiguity
    assert set(to_torch(variables, rules=rules, like=model)) == {"conv_1.weight", "conv_1.bias"}


def test_like_finds_linen_list_names_by_itself():
    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(2):
                x = nn.Dense(2, name=f"layers_{i}")(x)
            return x

    model = tnn.ModuleDict({"layers": tnn.ModuleList([tnn.Linear(2, 2), tnn.Linear(2, 2)])})
    like = jax.eval_shape(Stack().init, jax.random.key(0), np.ones((1, 2), np.float32))
    variables, _ = to_flax(model, like=like)
    assert jax.tree.structure(variables) == jax.tree.structure(like)
    np.testing.assert_array_equal(
        np.asarray(variables["params"]["layers_1"]["kernel"]),
        model["layers"][1].weight.detach().numpy().T,
    )


def test_candidates_are_restricted_by_a_known_layer():
    assert [
        t.name for t in candidates(TorchLeaf("x.weight", (3, 2), layer="embedding"), Rules())
    ] == ["embedding"]
    assert [t.name for t in candidates(TorchLeaf("x.weight", (3, 2)), Rules())] == [
        "kernel",
        "kernel",
        "embedding",
        "scale",
        "weight",
    ]


@pytest.mark.parametrize(
    "module, linen, expected",
    [
        (("a", "b", "0", "c"), False, ("a", "b", "0", "c")),
        (("a", "b", "0", "c"), True, ("a", "b_0", "c")),
        (("blocks", "0", "1"), True, ("blocks_0_1",)),
    ],
)
def test_module_variants(module, linen, expected):
    assert module_variants(module, linen)[0] == expected


@pytest.mark.parametrize(
    "path, ndim, collection, expected",
    [
        (("a", "kernel"), 2, "params", ("a.weight", (1, 0))),
        (("a", "kernel"), 4, "params", ("a.weight", (2, 3, 1, 0))),
        (("a", "embedding"), 2, "params", ("a.weight", None)),
        (("a", "scale"), 1, "params", ("a.weight", None)),
        (("a", "mean"), 1, "batch_stats", ("a.running_mean", None)),
        (("a", "mean"), 1, "params", ("a.mean", None)),  # a param called mean stays one
        (("a", "mean"), 1, None, ("a.running_mean", None)),  # no collections: by name
        (("a", "pos_embed"), 2, "params", ("a.pos_embed", None)),
    ],
)
def test_torch_names_of_flax_leaves(path, ndim, collection, expected):
    assert torch_name(path, ndim, collection, Rules()) == expected


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: Rule("weight", "kernel", axes="sideways"),
            ValueError,
            "unknown `axes` 'sideways'",
        ),
        (lambda: Rule("a.weight", "kernel"), ValueError, "Rule `torch` must be one non-empty name"),
        (lambda: Rule("weight", ""), ValueError, "Rule `flax`"),
        (lambda: Rules(rules=("weight",)), TypeError, "`rules` must hold Rule objects"),
        (
            lambda: to_flax({"a": torch.ones(1)}, rules="weight"),
            TypeError,
            "`rules` must be a bridge.Rules",
        ),
    ],
)
def test_bad_rules_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_the_old_name_of_a_rules_axes_still_works_and_says_so():
    with pytest.warns(DeprecationWarning, match=r"`Rule.layout` is now `Rule.axes`"):
        rule = Rule("weight", "kernel", layout="kernel")
    assert rule == Rule("weight", "kernel", axes="kernel") and rule.perm(2) == (1, 0)
    with pytest.warns(DeprecationWarning, match=r"`Rule.layout` is now `Rule.axes`"):
        assert rule.layout == "kernel"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (A copy passes no old name along.)
        assert dataclasses.replace(rule, flax="w") == Rule("weight", "w", axes="kernel")
