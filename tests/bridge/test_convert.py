"""``to_flax`` / ``to_torch``: names, layouts, ties and dtypes across the boundary."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import linen as nn
from flax import nnx
from flax.core import FrozenDict
from hypothesis import given
from hypothesis import strategies as st
from torch import nn as tnn

import jaxshare
from bridge import flax_alias_map, shared_params, to_flax, to_torch, torch_alias_map
from jaxshare import AliasMap


class TiedLM(tnn.Module):
    def __init__(self):
        super().__init__()
        self.wte = tnn.Embedding(10, 4)
        self.ln = tnn.LayerNorm(4)
        self.lm_head = tnn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens):
        return self.lm_head(self.ln(self.wte(tokens)))


class AttendLM(nn.Module):
    """Computes the head from the embedding: no place for lm_head."""

    @nn.compact
    def __call__(self, tokens):
        wte = nn.Embed(10, 4, name="wte")
        return wte.attend(nn.LayerNorm(epsilon=1e-5, name="ln")(wte(tokens)))


class DenseLM(nn.Module):
    """Has an lm_head Dense of its own: a place for the alias."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.LayerNorm(epsilon=1e-5, name="ln")(nn.Embed(10, 4, name="wte")(tokens))
        return nn.Dense(10, use_bias=False, name="lm_head")(x)


TOKENS = np.array([[1, 2, 3, 9]])


# -- round trips ----------------------------------------------------------------


@pytest.mark.parametrize("source", ["module", "state_dict"])
def test_round_trip_keeps_values_names_and_ties(source, assert_same_state):
    model = TiedLM()
    variables, aliases = to_flax(model if source == "module" else model.state_dict())
    back = to_torch(variables, aliases)
    assert_same_state(back, model.state_dict())
    TiedLM().load_state_dict(back, strict=True)


def test_a_tie_across_layouts_carries_the_permutation():
    variables, aliases = to_flax(TiedLM())
    assert aliases == AliasMap(
        {"params/lm_head/kernel": "params/wte/embedding"},
        transforms={"params/lm_head/kernel": (1, 0)},
    )
    params = variables["params"]
    np.testing.assert_array_equal(params["lm_head"]["kernel"], params["wte"]["embedding"].T)


def test_identity_ties_are_one_array_object():
    model = tnn.ModuleDict({"a": tnn.Linear(2, 2)})
    model["b"] = model["a"]
    variables, aliases = to_flax(model)
    assert aliases == {"params/b/kernel": "params/a/kernel", "params/b/bias": "params/a/bias"}
    assert variables["params"]["b"]["kernel"] is variables["params"]["a"]["kernel"]
    back = to_torch(variables)  # without the map: arrays that are one object are tied
    assert back["b.weight"] is back["a.weight"]


def test_torch_save_of_the_result_stores_each_tie_once(tmp_path):
    model = TiedLM()
    back = to_torch(*to_flax(model))
    torch.save(back, tmp_path / "tied.pt")
    torch.save({k: v.clone() for k, v in back.items()}, tmp_path / "untied.pt")
    saved = (tmp_path / "untied.pt").stat().st_size - (tmp_path / "tied.pt").stat().st_size
    assert saved >= model.wte.weight.numel() * 4


def _snapshot_state(state: dict) -> list:
    """Each entry's name, tensor object, dtype, and a copy of its values."""
    return [(k, v, v.dtype, v.detach().clone()) for k, v in state.items()]


def _snapshot_tree(tree) -> tuple:
    """The structure, and each leaf's path, object, dtype, and a copy of its values."""
    leaves, structure = jax.tree_util.tree_flatten_with_path(tree)
    return structure, [(p, x, x.dtype, np.array(x)) for p, x in leaves]


def _assert_unchanged_state(state: dict, snapshot: list) -> None:
    assert list(state) == [k for k, *_ in snapshot]
    for key, tensor, dtype, values in snapshot:
        assert state[key] is tensor and tensor.dtype == dtype, key
        assert torch.equal(tensor, values), key


def _assert_unchanged_tree(tree, snapshot: tuple) -> None:
    structure, leaves = snapshot
    now, now_structure = jax.tree_util.tree_flatten_with_path(tree)
    assert now_structure == structure
    for (path, leaf), (was_path, was, dtype, values) in zip(now, leaves, strict=True):
        assert path == was_path and leaf is was and leaf.dtype == dtype, path
        np.testing.assert_array_equal(np.asarray(leaf), values)


def test_inputs_are_not_mutated():
    model = TiedLM()
    state = model.state_dict()
    before_state = _snapshot_state(state)
    variables, aliases = to_flax(state)
    _assert_unchanged_state(state, before_state)
    before_variables, before_aliases = _snapshot_tree(variables), aliases.to_json()
    to_torch(variables, aliases)
    _assert_unchanged_tree(variables, before_variables)
    assert aliases.to_json() == before_aliases
    _assert_unchanged_state(state, before_state)


# -- like= ----------------------------------------------------------------------


@pytest.mark.parametrize("flax_model", [AttendLM, DenseLM])
def test_like_gives_its_exact_structure_and_the_same_forward(flax_model):
    torch.manual_seed(0)  # (The forward is compared within float32 tolerance: fixed weights.)
    model = TiedLM().eval()
    like = jax.eval_shape(flax_model().init, jax.random.key(0), TOKENS)
    variables, aliases = to_flax(model, like=like)
    assert jax.tree.structure(variables) == jax.tree.structure(like)
    # The head's alias stays in the map whether or not `like` has a place for it.
    assert aliases.transform("params/lm_head/kernel") == (1, 0)
    with torch.no_grad():
        want = model(torch.from_numpy(TOKENS)).numpy()
    np.testing.assert_allclose(flax_model().apply(variables, TOKENS), want, atol=1e-5)
    back = to_torch(variables, aliases)
    assert back["lm_head.weight"] is back["wte.weight"]
    TiedLM().load_state_dict(back, strict=True)


def test_like_without_a_collection_wrapper_and_frozen(assert_same_state):
    model = TiedLM()
    params = jax.eval_shape(AttendLM().init, jax.random.key(0), TOKENS)["params"]
    variables, aliases = to_flax(model, like=FrozenDict(params))
    assert isinstance(variables, FrozenDict) and set(variables) == {"wte", "ln"}
    assert aliases == AliasMap(
        {"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)}
    )
    assert_same_state(to_torch(variables, aliases), model.state_dict())


@pytest.mark.parametrize(
    "like, match",
    [
        (
            {"params": {"wte": {"embedding": jax.ShapeDtypeStruct((10, 5), jnp.float32)}}},
            r"'wte.weight' \(10, 4\): no place with a matching shape: "
            r"'params/wte/embedding' has shape \(10, 5\)",
        ),
        (
            {"params": {"wte": {"embedding": jax.ShapeDtypeStruct((10, 4), jnp.float32)}}},
            "'ln.weight' has no place in `like`",
        ),
        (
            {
                "params": {
                    "wte": {"embedding": jax.ShapeDtypeStruct((10, 4), jnp.float32)},
                    "ln": {
                        "scale": jax.ShapeDtypeStruct((4,), jnp.float32),
                        "bias": jax.ShapeDtypeStruct((4,), jnp.float32),
                    },
                    "extra": {"kernel": jax.ShapeDtypeStruct((4, 4), jnp.float32)},
                }
            },
            r"`like` has leaves no tensor fills: 'params/extra/kernel' \(4, 4\)",
        ),
        (
            {
                "params": {
                    "ln": {
                        "scale": jax.ShapeDtypeStruct((4,), jnp.float32),
                        "bias": jax.ShapeDtypeStruct((4,), jnp.float32),
                    }
                }
            },
            r"none of the tied names \['wte.weight', 'lm_head.weight'\] has a place",
        ),
    ],
    ids=["shape", "unmatched-tensor", "unfilled-leaf", "tie-without-place"],
)
def test_like_mismatches_are_named(like, match):
    with pytest.raises(ValueError, match=match):
        to_flax(TiedLM(), like=like)


def test_like_reports_every_problem_at_once():
    with pytest.raises(ValueError) as info:
        to_flax({"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(3)}, like={"c": jnp.zeros(1)})
    message = str(info.value)
    assert "'a.weight'" in message and "'b.bias'" in message and "'c'" in message


def test_like_with_shardings_places_the_arrays():
    mesh = jax.make_mesh((8,), ("x",))
    sharding = jax.NamedSharding(mesh, jax.P("x"))
    like = {
        "params": {"w": {"kernel": jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=sharding)}}
    }
    variables, _ = to_flax({"w.weight": torch.randn(16, 8)}, like=like)
    kernel = variables["params"]["w"]["kernel"]
    assert kernel.sharding == sharding and len(kernel.addressable_shards) == 8
    assert torch.equal(to_torch(variables)["w.weight"], torch.from_numpy(np.array(kernel).T))


# -- NNX, Tied, DeepSpeed maps -----------------------------------------------------


class NnxLM(nnx.Module):
    def __init__(self, rngs):
        self.wte = nnx.Embed(10, 4, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)])
        self.again = self.blocks[0]  # NNX's State keeps 'again' (sorted first), drops 'blocks/0'


class TorchTwin(tnn.Module):
    def __init__(self):
        super().__init__()
        self.wte = tnn.Embedding(10, 4)
        self.blocks = tnn.ModuleList([tnn.Linear(4, 4), tnn.Linear(4, 4)])
        self.again = self.blocks[0]


def test_nnx_module_gets_back_the_names_its_state_dropped():
    model = NnxLM(nnx.Rngs(0))
    assert 0 not in nnx.state(model)["blocks"]
    back = to_torch(model)
    assert back["again.weight"] is back["blocks.0.weight"]
    torch_model = TorchTwin()
    torch_model.load_state_dict(back, strict=True)
    np.testing.assert_array_equal(
        back["again.weight"].numpy(), np.asarray(model.blocks[0].kernel[...]).T
    )


def test_nnx_like_round_trip(assert_same_state):
    torch_model = TorchTwin()
    model = nnx.eval_shape(lambda: NnxLM(nnx.Rngs(0)))
    state, aliases = to_flax(torch_model, like=model)
    # PyTorch's canonical is blocks.0 (first in state_dict); NNX's is the path it keeps.
    assert aliases == {"blocks/0/bias": "again/bias", "blocks/0/kernel": "again/kernel"}
    assert isinstance(state, nnx.State)
    real = NnxLM(nnx.Rngs(1))
    nnx.update(real, state)
    np.testing.assert_array_equal(
        np.asarray(real.again.kernel[...]), torch_model.again.weight.detach().numpy().T
    )
    assert_same_state(to_torch(real), torch_model.state_dict())


def test_tied_input(assert_same_state):
    model = TiedLM()
    variables, aliases = to_flax(model)
    tied = jaxshare.tie(variables, aliases)
    assert "lm_head" not in tied.unique["params"]
    assert_same_state(to_torch(tied), model.state_dict())


def test_a_deepspeed_shared_params_dict_is_an_alias_map():
    model = TiedLM()
    unique = {
        "params": {
            "wte": {"embedding": jnp.asarray(model.wte.weight.detach().numpy())},
            "ln": {"scale": jnp.ones(4), "bias": jnp.zeros(4)},
        }
    }
    back = to_torch(unique, shared_params(model))
    assert back["lm_head.weight"] is back["wte.weight"]
    model.load_state_dict(back, strict=True)


def test_a_deepspeed_dict_with_like_fills_the_names_variables_lack():
    model = TiedLM()
    variables, _ = to_flax(model, like=jax.eval_shape(AttendLM().init, jax.random.key(0), TOKENS))
    back = to_torch(variables, shared_params(model), like=model)
    assert list(back) == list(model.state_dict()) and back["lm_head.weight"] is back["wte.weight"]
    # Without the map, the module's own tie fills the name the variables lack.
    again = to_torch(variables, like=model)
    assert list(again) == list(back) and again["lm_head.weight"] is again["wte.weight"]


def test_a_deepspeed_dict_that_does_not_fit_is_refused():
    variables, _ = to_flax({"a.bias": torch.ones(2), "b.bias": torch.zeros(2)})
    with pytest.raises(
        ValueError, match="ties 'b.bias' to 'a.bias', but they hold different values"
    ):
        to_torch(variables, {"b.bias": "a.bias"})
    with pytest.raises(
        ValueError, match="ties 'c.bias' to 'nope.bias', which the converted weights"
    ):
        to_torch(variables, {"c.bias": "nope.bias"})


def test_alias_maps_across_namings():
    model = TiedLM()
    flax_map = flax_alias_map(shared_params(model), model)
    assert flax_map == to_flax(model)[1]
    variables, _ = to_flax(model)
    assert torch_alias_map(flax_map, variables) == {"lm_head.weight": "wte.weight"}
    # DeepSpeed did not store the alias: its shape is its canonical's.
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    # (`wte` types as an embedding by its name, `lm_head` as a Linear.)
    assert flax_alias_map({"lm_head.weight": "wte.weight"}, sd) == AliasMap(
        {"params/lm_head/kernel": "params/wte/embedding"},
        transforms={"params/lm_head/kernel": (1, 0)},
    )


def test_a_flax_tie_whose_layouts_do_not_cancel_is_a_permuted_view():
    emb = jnp.arange(8.0).reshape(4, 2)
    variables = {"params": {"wte": {"embedding": emb}}}
    aliases = {"params/head/kernel": "params/wte/embedding"}  # kernel == embedding, no transpose
    back = to_torch(variables, aliases)
    assert back["head.weight"].shape == (2, 4)
    assert (
        back["head.weight"].untyped_storage().data_ptr()
        == back["wte.weight"].untyped_storage().data_ptr()
    )
    with pytest.raises(ValueError, match="differ in axis order, so PyTorch cannot tie them"):
        torch_alias_map(aliases, variables)


# -- dtypes, memory ------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
    ],
)
def test_dtypes_cross_bit_exactly(dtype, assert_same_state):
    if dtype == torch.bool:
        tensor = torch.randint(0, 2, (3, 5)).bool()
    else:  # Any bit pattern, NaNs included.
        width = torch.tensor([], dtype=dtype).element_size()
        tensor = torch.randint(0, 256, (3, 5 * width), dtype=torch.uint8).view(dtype)
    state = {"layer.weight": tensor}
    variables, _ = to_flax(state)
    kernel = variables["params"]["layer"]["kernel"]
    name = str(dtype).removeprefix("torch.")
    assert np.dtype(kernel.dtype) == np.dtype(getattr(ml_dtypes, name, name))
    assert_same_state(to_torch(variables), state)


def test_64_bit_arrays_stay_numpy_without_x64():
    variables, _ = to_flax({"bn.num_batches_tracked": torch.tensor(2**40)})
    leaf = variables["batch_stats"]["bn"]["num_batches_tracked"]
    assert isinstance(leaf, np.ndarray) and leaf.dtype == np.int64 and int(leaf) == 2**40


def test_no_copy_where_the_layout_allows():
    emb = torch.randn(64, 32)
    variables, _ = to_flax({"wte.weight": emb}, like={"wte": {"embedding": jnp.zeros((64, 32))}})
    array = variables["wte"]["embedding"]
    assert array.unsafe_buffer_pointer() == emb.data_ptr()
    back = to_torch(variables)
    assert back["wte.weight"].data_ptr() == array.unsafe_buffer_pointer()


@pytest.mark.parametrize(
    "state, error, match",
    [
        ({"a": "text"}, TypeError, "entry 'a' is a str, not a tensor"),
        (
            {"a": torch.zeros(2, dtype=torch.float8_e4m3fnuz)},
            TypeError,
            "'a' has dtype torch.float8_e4m3fnuz",
        ),
        ({"a": torch.zeros(2, device="meta")}, ValueError, "'a' is on the meta device"),
        ({"a/b": torch.zeros(2)}, ValueError, "contains '/'"),
        (
            {"a.weight": torch.zeros(2), "a.scale": torch.zeros(2)},
            ValueError,
            "'a.weight' and 'a.scale' both go to 'params/a/scale'",
        ),
    ],
)
def test_bad_tensors_are_named(state, error, match):
    with pytest.raises(error, match=match):
        to_flax(state)


@pytest.mark.parametrize(
    "variables, aliases, match",
    [
        (
            {"params": {"a": {"bias": jnp.ones(2)}}},
            {"params/b/bias": "params/c/bias"},
            r"no array at canonical path\(s\) \['params/c/bias'\]",
        ),
        (
            {"params": {"a": {"bias": jnp.ones(2)}, "b": {"bias": jnp.ones(3)}}},
            {"params/b/bias": "params/a/bias"},
            r"(?s)disagree.*'params/b/bias' \(alias of 'params/a/bias'\): expected float32\[2\]",
        ),
        (
            {"params": {"a": {"bias": jnp.ones(2)}, "b": {"bias": jnp.zeros(2)}}},
            {"params/b/bias": "params/a/bias"},
            "(?s)disagree.*'params/b/bias'.*holds different values",
        ),
        (
            {"params": {"a": {"kernel": jnp.ones((2, 2)), "weight": jnp.ones((2, 2))}}},
            None,
            "both map to the PyTorch name 'a.weight'",
        ),
        ([jnp.ones(2)], None, "`variables` must be a Flax variables or params mapping"),
    ],
)
def test_to_torch_errors_are_named(variables, aliases, match):
    with pytest.raises((ValueError, TypeError), match=match):
        to_torch(variables, aliases)


def test_to_torch_like_checks_names_and_shapes():
    model = TiedLM()
    variables, aliases = to_flax(model)
    other = tnn.ModuleDict({"wte": tnn.Embedding(10, 4)})
    with pytest.raises(
        ValueError, match=r"leaves of `variables` with no name in `like`: \['params/ln/scale'"
    ):
        to_torch(variables, aliases, like=other)
    assert list(to_torch(variables, aliases, like=model)) == list(model.state_dict())


# -- the law, over random tied state dicts -----------------------------------------


@given(data=st.data())
def test_to_torch_inverts_to_flax_bit_exactly_with_ties(data, tied_state_dicts, assert_same_state):
    state = data.draw(tied_state_dicts)
    assert_same_state(to_torch(*to_flax(state)), state)
