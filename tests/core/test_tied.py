import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxshare import AliasMap, Tied, tie

V_, D_ = 16, 8


def params(key=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(key))
    emb = jax.random.normal(k1, (V_, D_))
    return {"wte": {"embedding": emb}, "lm_head": {"kernel": emb.T}, "ln": {"scale": jnp.ones(D_)}}


TRANSPOSED = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})


def loss(p, tokens):
    x = p["wte"]["embedding"][tokens] * p["ln"]["scale"]
    logits = x @ p["lm_head"]["kernel"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(tokens.shape[0]), tokens])


TOKENS = jnp.arange(12) % V_


def test_leaves_are_the_unique_leaves():
    t = tie(params(), TRANSPOSED)
    assert len(jax.tree_util.tree_leaves(t)) == 2
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(t)[0]]
    assert paths == [".unique['ln']['scale']", ".unique['wte']['embedding']"]


def test_grad_sums_every_use_into_the_one_leaf():
    t = tie(params(), TRANSPOSED)
    g = jax.grad(lambda t: loss(t.tree, TOKENS))(t)
    # Reference: gradients of the untied tree, the head's folded back by hand.
    full = params()
    g_full = jax.grad(loss)(full, TOKENS)
    expected = g_full["wte"]["embedding"] + g_full["lm_head"]["kernel"].T
    np.testing.assert_allclose(g.unique["wte"]["embedding"], expected, rtol=1e-6)
    assert isinstance(g, Tied) and g.alias_map == TRANSPOSED


def test_grad_of_identity_tie_used_three_times():
    w = jnp.arange(3.0)
    t = tie({"a": w, "b": w, "c": [w]})
    g = jax.grad(lambda t: (t.tree["a"] * 1 + t.tree["b"] * 2 + t.tree["c"][0] * 3).sum())(t)
    np.testing.assert_array_equal(jax.tree_util.tree_leaves(g)[0], jnp.full(3, 6.0))


def adam_bytes(state) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(state) if hasattr(x, "nbytes"))


def test_adam_state_holds_each_tie_once():
    full = params()
    tied = tie(full, TRANSPOSED)
    opt = optax.adam(1e-2)
    tied_bytes = full["wte"]["embedding"].nbytes
    assert adam_bytes(opt.init(full)) - adam_bytes(opt.init(tied)) == 2 * tied_bytes


def make_step(opt):
    def step(t, state, tokens):
        loss_value, g = jax.value_and_grad(lambda t: loss(t.tree, tokens))(t)
        updates, state = opt.update(g, state, t)
        return optax.apply_updates(t, updates), state, loss_value

    return step


def test_donation_works_on_tied_and_fails_on_a_raw_tree():
    w = jnp.ones(4)
    with pytest.raises(Exception, match="donate the same buffer twice"):
        jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)({"a": w, "b": w})
    t = tie({"a": (x := jnp.ones(4)), "b": x})
    out = jax.jit(lambda t: jax.tree.map(lambda y: y + 1, t), donate_argnums=0)(t)
    assert x.is_deleted()
    assert out.tree["a"] is out.tree["b"]


def test_training_steps_with_donation_keep_the_tie():
    opt = optax.adam(5e-2)
    t = tie(params(), TRANSPOSED)
    state = opt.init(t)
    step = jax.jit(make_step(opt), donate_argnums=(0, 1))
    losses = []
    for _ in range(30):
        t, state, loss_value = step(t, state, TOKENS)
        losses.append(float(loss_value))
    assert losses[-1] < losses[0]
    assert step._cache_size() == 1  # the alias map is static aux data: one trace
    full = t.tree
    assert len(jax.tree_util.tree_leaves(t)) == 2
    np.testing.assert_array_equal(full["lm_head"]["kernel"], full["wte"]["embedding"].T)


def test_sharded_tied_tree_under_jit():
    mesh = jax.make_mesh((8,), ("x",))
    emb = jax.device_put(jnp.ones((V_, D_)), NamedSharding(mesh, P("x")))
    t = tie({"a": emb, "b": emb})
    out = jax.jit(lambda t: jax.tree.map(lambda x: x * 2, t), donate_argnums=0)(t)
    assert out.unique["a"].sharding.is_equivalent_to(emb.sharding, 2)
    assert out.tree["b"] is out.tree["a"]


def test_constructor_validates_the_map():
    w = jnp.ones(3)
    with pytest.raises(ValueError, match=r"holds values at alias paths \['b'\]"):
        Tied({"a": w, "b": w}, {"b": "a"})
    with pytest.raises(ValueError, match=r"no value at canonical path\(s\) \['z'\]"):
        Tied({"a": w}, {"b": "z"})
    with pytest.raises(ValueError, match=r"alias 'b' has transform \[1, 0\].*shape \(3,\)"):
        Tied({"a": w}, AliasMap({"b": "a"}, transforms={"b": (1, 0)}))


def test_replace_keeps_the_map_and_repr_shows_it():
    w = jnp.ones(3)
    t = tie({"a": w, "b": w})
    t2 = t.replace({"a": w * 2})
    assert t2.alias_map == t.alias_map and t2.tree["b"] is t2.tree["a"]
    assert "AliasMap({'b': 'a'})" in repr(t)


def test_treedefs_compare_by_alias_map():
    w = jnp.ones(3)
    a = jax.tree_util.tree_structure(tie({"a": w, "b": w}))
    b = jax.tree_util.tree_structure(tie({"a": w + 1, "b": (w + 1)}, {"b": "a"}))
    c = jax.tree_util.tree_structure(tie({"a": w, "c": w}))
    assert a == b and a != c
