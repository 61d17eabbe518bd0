"""find_shared on flax.nnx graphs: canonical paths are the ones nnx.state keeps."""

import jax.numpy as jnp
import pytest
from flax import nnx

from jaxshare import AliasMap, dedupe, find_shared, retie
from jaxshare.core.paths import flatten_with_paths, render


def state_paths(model) -> set[str]:
    pure = nnx.to_pure_dict(nnx.state(model))
    return {render(p) for p, _ in flatten_with_paths(pure)}


class TiedLM(nnx.Module):
    """Embedding reused as the output layer: a shared Variable."""

    def __init__(self, rngs):
        self.wte = nnx.Embed(10, 4, rngs=rngs)
        self.lm_head = nnx.Linear(4, 10, use_bias=False, rngs=rngs)
        self.lm_head.kernel = self.wte.embedding  # same Variable object


class SharedBlock(nnx.Module):
    """A module registered twice: every leaf beneath it is an alias."""

    def __init__(self, rngs):
        self.encoder = nnx.Linear(3, 3, rngs=rngs)
        self.decoder = self.encoder


class Nested(nnx.Module):
    """Sharing inside a shared module, and a module in a list."""

    def __init__(self, rngs):
        inner = SharedBlock(rngs)
        self.a = inner
        self.b = inner
        self.layers = nnx.List([inner.encoder, nnx.Linear(3, 3, rngs=rngs)])


def test_shared_variable():
    model = TiedLM(nnx.Rngs(0))
    m = find_shared(model)
    assert m == AliasMap({"wte/embedding": "lm_head/kernel"})
    assert set(m.values()) <= state_paths(model)
    assert not set(m) & state_paths(model)


def test_shared_module_expands_to_one_alias_per_leaf():
    m = find_shared(SharedBlock(nnx.Rngs(0)))
    assert m == {"encoder/bias": "decoder/bias", "encoder/kernel": "decoder/kernel"}


def test_nested_sharing_and_lists():
    model = Nested(nnx.Rngs(0))
    m = find_shared(model)
    assert m == {
        "a/encoder/bias": "a/decoder/bias",
        "a/encoder/kernel": "a/decoder/kernel",
        "b/decoder/bias": "a/decoder/bias",
        "b/decoder/kernel": "a/decoder/kernel",
        "b/encoder/bias": "a/decoder/bias",
        "b/encoder/kernel": "a/decoder/kernel",
        "layers/0/bias": "a/decoder/bias",
        "layers/0/kernel": "a/decoder/kernel",
    }
    # The canonical of every tie is exactly the path nnx.state keeps...
    assert set(m.values()) <= state_paths(model)
    # ...and every alias is a path nnx.state dropped.
    assert not set(m) & state_paths(model)


@pytest.mark.parametrize("cls", [TiedLM, SharedBlock, Nested])
def test_nnx_state_is_already_the_unique_tree(cls):
    model = cls(nnx.Rngs(0))
    m = find_shared(model)
    pure = nnx.to_pure_dict(nnx.state(model))
    unique, m2 = dedupe(pure, m)  # Nothing left to drop: NNX dropped the aliases.
    assert unique is pure and m2 == m
    full = retie(pure, m)
    for alias, canonical in m.items():
        path_a, path_c = alias.split("/"), canonical.split("/")
        leaf_a = _get(full, path_a)
        assert leaf_a is _get(full, path_c)


def _get(tree, parts):
    for p in parts:
        tree = (
            tree[int(p)]
            if isinstance(tree, list)
            else tree[int(p) if p.isdigit() and p not in tree else p]
        )
    return tree


def test_retie_restores_list_index_keys_as_ints():
    model = Nested(nnx.Rngs(0))
    full = retie(nnx.to_pure_dict(nnx.state(model)), find_shared(model))
    assert sorted(full["layers"]) == [0, 1]
    assert full["layers"][0]["kernel"] is full["a"]["decoder"]["kernel"]


def test_nnx_state_object_is_walked_like_the_module():
    model = TiedLM(nnx.Rngs(0))
    state = nnx.state(model)
    assert find_shared(state) == {}  # NNX already dropped the alias


def test_raw_arrays_nnx_keeps_twice_are_aliases():
    class Raw(nnx.Module):
        def __init__(self):
            self.a = nnx.data(jnp.ones(3))
            self.b = self.a

    model = Raw()
    m = find_shared(model)
    assert m == {"b": "a"}
    assert state_paths(model) == {"a", "b"}  # NNX keeps both...
    unique, _ = dedupe(nnx.to_pure_dict(nnx.state(model)), m)
    assert set(unique) == {"a"}  # ...dedupe drops the alias.


def test_distinct_variables_with_equal_arrays_are_not_tied_by_identity():
    class Two(nnx.Module):
        def __init__(self):
            x = jnp.ones(3)
            self.a = nnx.Param(x)
            self.b = nnx.Param(x)

    model = Two()
    assert find_shared(model) == {}  # NNX: two parameters that diverge on update.
    assert find_shared(model, by="buffer") == {"b": "a"}  # Same memory right now.


def test_optimizer_state_holds_each_tie_once():
    import optax

    model = TiedLM(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    assert find_shared(opt) == {}  # Moments were made from the unique state.
    adam = opt.opt_state[0]
    assert set(nnx.to_pure_dict(nnx.state(adam.mu))) == {"lm_head"}  # no 'wte'


def test_containers_of_modules_are_walked_as_graphs():
    model = TiedLM(nnx.Rngs(0))
    other = SharedBlock(nnx.Rngs(1))
    m = find_shared({"model": model, "ema": other, "step": 3})
    assert m == {
        "ema/encoder/bias": "ema/decoder/bias",
        "ema/encoder/kernel": "ema/decoder/kernel",
        "model/wte/embedding": "model/lm_head/kernel",
    }
    assert find_shared([model, model]) == {
        "0/wte/embedding": "0/lm_head/kernel",
        "1/lm_head/kernel": "0/lm_head/kernel",
        "1/wte/embedding": "0/lm_head/kernel",
    }


def test_cycles_are_not_followed_forever():
    class Parent(nnx.Module):
        def __init__(self, rngs):
            self.child = nnx.Linear(2, 2, rngs=rngs)

    p = Parent(nnx.Rngs(0))
    p.child.parent = p  # A back reference.
    assert find_shared(p) == {}


def test_buffer_mode_on_nnx():
    model = TiedLM(nnx.Rngs(0))
    assert find_shared(model, by="buffer") == find_shared(model)
