import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import FrozenDict
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxshare import AliasMap, find_shared

# (name, tree, expected alias map): containers x sharing shapes.
CASES = [
    ("none", lambda t: {"a": t.W, "b": t.V}, {}),
    ("pair-dict", lambda t: {"wte": t.W, "lm_head": t.W}, {"wte": "lm_head"}),
    (
        "triple-nested",
        lambda t: {"enc": {"emb": t.W}, "dec": {"emb": t.W}, "shared": t.W},
        {"enc/emb": "dec/emb", "shared": "dec/emb"},
    ),
    ("two-groups", lambda t: {"a": t.W, "b": t.V, "c": t.W, "d": t.V}, {"c": "a", "d": "b"}),
    ("list", lambda t: [t.W, t.V, t.W], {"2": "0"}),
    ("tuple-in-dict", lambda t: {"t": (t.V, t.V)}, {"t/1": "t/0"}),
    ("namedtuple", lambda t: t.Block(t.W, t.W), {"bias": "kernel"}),
    ("dataclass", lambda t: t.Model(t.W, t.W, t.V), {"head": "embed"}),
    ("frozendict", lambda t: FrozenDict({"p": {"x": t.W, "y": t.W}}), {"p/y": "p/x"}),
    ("int-keys", lambda t: {0: t.W, 1: t.W}, {"1": "0"}),
    (
        "shared-subtree",
        lambda t: {"l0": {"k": t.W, "b": t.V}, "l1": {"k": t.W, "b": t.V}},
        {"l1/b": "l0/b", "l1/k": "l0/k"},
    ),
]


@pytest.mark.parametrize("name, build, expected", CASES, ids=[c[0] for c in CASES])
def test_finds_ties_in_containers(name, build, expected, trees):
    assert find_shared(build(trees)) == AliasMap(expected)


@pytest.mark.parametrize("leaf", [1, 2.0, "s", None, True, np.float32(1.0)])
def test_non_array_leaves_are_never_aliases(leaf):
    assert find_shared({"a": leaf, "b": leaf, "c": [leaf]}) == {}


def test_canonical_is_first_in_flatten_order_and_stable(W):
    tree = {"z": W, "a": {"y": W}, "m": [W]}
    m = find_shared(tree)
    assert set(m.values()) == {"a/y"}  # dict keys sorted: 'a' < 'm' < 'z'
    assert all(find_shared(tree) == m for _ in range(5))
    # Insertion order of the dict does not matter, only the flatten order.
    assert find_shared(dict(reversed(list(tree.items())))) == m


@pytest.mark.parametrize(
    "prefer, canonical",
    [
        (["lm_head"], "lm_head/kernel"),
        (["transformer/wte"], "transformer/wte/embedding"),
        (lambda p: 0 if p.startswith("x") else 1, "x"),
        (lambda p: -len(p), "transformer/wte/embedding"),
        ([], "lm_head/kernel"),
        (["lm"], "lm_head/kernel"),  # 'lm' is no prefix at a '/' boundary: flatten order.
    ],
)
def test_prefer_ranks_paths(prefer, canonical, W):
    tree = {"transformer": {"wte": {"embedding": W}}, "lm_head": {"kernel": W}, "x": W}
    m = find_shared(tree, prefer=prefer)
    assert set(m.values()) == {canonical} and len(m) == 2


def test_prefer_of_wrong_type_is_a_type_error(W):
    with pytest.raises(TypeError, match="`prefer` must be a callable"):
        find_shared({"a": W, "b": W}, prefer="a")


def test_unknown_by_is_rejected():
    with pytest.raises(ValueError, match="`by` must be 'identity' or 'buffer', got 'ptr'"):
        find_shared({}, by="ptr")


def test_is_leaf_is_honoured(W, V, trees):
    tree = {"a": trees.Block(W, V), "b": trees.Block(W, V)}
    assert find_shared(tree) == {"b/kernel": "a/kernel", "b/bias": "a/bias"}
    # With whole blocks as leaves nothing is an array, so nothing is tied.
    assert find_shared(tree, is_leaf=lambda x: isinstance(x, trees.Block)) == {}


def test_equal_values_are_not_ties():
    assert find_shared({"a": jnp.zeros(3), "b": jnp.zeros(3)}) == {}


def test_tracers_inside_jit_by_identity(V):
    @jax.jit
    def f(x):
        y = x * 2
        m = find_shared({"a": y, "b": y, "c": x})
        assert m == {"b": "a"}
        return y

    f(V)


def test_jit_copies_break_identity_and_buffer_finds_nothing_either(V):
    a, b = jax.jit(lambda x: (x, x))(V)
    assert a is not b
    assert find_shared({"a": a, "b": b}) == {}


def test_buffer_on_tracer_is_a_clear_error(V):
    @jax.jit
    def f(x):
        find_shared({"a": x, "b": x}, by="buffer")
        return x

    with pytest.raises(TypeError, match=r"'a' is a tracer.*by='identity'"):
        f(V)


def test_key_with_slash_in_a_tie_is_rejected_naming_it(W, V):
    with pytest.raises(ValueError, match=r"'a/b' at path \('a/b',\) contains '/'"):
        find_shared({"a/b": W, "c": W})
    assert find_shared({"a/b": W, "c": V}) == {}  # Untied keys are never rendered.


def test_optax_state_ties_follow_the_params(W):
    params = {"wte": W, "head": W}
    state = optax.adam(1e-3).init(params)
    # Adam creates fresh moments per leaf: mu and nu do not share anything.
    assert find_shared(state) == {}
    m = find_shared((params, state))
    assert m == {"0/wte": "0/head"}


def test_optax_state_holding_one_array_twice(W):
    state = optax.adam(1e-3).init({"x": W})
    shared = state[0]._replace(nu=state[0].mu)
    assert find_shared((shared,)) == {"0/nu/x": "0/mu/x"}


def test_equinox_module_with_a_shared_weight():
    key = jax.random.PRNGKey(0)
    emb = eqx.nn.Embedding(10, 4, key=key)
    lin = eqx.nn.Linear(4, 10, use_bias=False, key=key)
    lin = eqx.tree_at(lambda m: m.weight, lin, emb.weight)

    class LM(eqx.Module):
        embed: eqx.nn.Embedding
        head: eqx.nn.Linear

    assert find_shared(LM(emb, lin)) == {"head/weight": "embed/weight"}


# -- by="buffer" ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests expect 8 fake CPU devices (see conftest.py)"
    return jax.make_mesh((4, 2), ("data", "model"))


def rewrap(x: jax.Array) -> jax.Array:
    """A distinct jax.Array over the very same shards."""
    return jax.make_array_from_single_device_arrays(
        x.shape, x.sharding, [s.data for s in x.addressable_shards]
    )


@pytest.mark.parametrize("spec", [P("data", "model"), P("data"), P(), P(None, "model")])
def test_buffer_finds_rewrapped_sharded_arrays(mesh, spec):
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, spec))
    y = rewrap(x)
    assert y is not x
    tree = {"a": x, "b": y}
    assert find_shared(tree) == {}
    assert find_shared(tree, by="buffer") == {"b": "a"}


def test_buffer_distinguishes_same_shards_with_other_metadata(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P()))
    reshaped_view = x.reshape(4, 4)  # A new buffer under jit semantics anyway.
    assert find_shared({"a": x, "b": reshaped_view}, by="buffer") == {}


def test_buffer_never_ties_zero_size_arrays():
    tree = {
        "a": jnp.zeros((0, 3)),
        "b": jnp.zeros((0, 3)),
        "c": np.zeros((0,)),
        "d": np.zeros((0,)),
    }
    assert find_shared(tree, by="buffer") == {}
    z = jnp.zeros((0,))
    assert find_shared({"a": z, "b": z}) == {"b": "a"}  # Identity is still identity.


def test_buffer_refuses_deleted_arrays():
    x = jnp.ones(4)
    jax.jit(lambda v: v + 1, donate_argnums=0)(x)
    assert x.is_deleted()
    with pytest.raises(ValueError, match=r"array at 'p/x' has been deleted \(donated"):
        find_shared({"p": {"x": x}}, by="buffer")


def test_buffer_on_numpy_views():
    base = np.arange(10.0)
    same = base[:]  # Same pointer, shape, strides, dtype: the same memory.
    prefix = base[:5]  # Same pointer, other shape: not a tie.
    strided = base[::2]
    tree = {"a": base, "b": same, "c": prefix, "d": strided, "e": base.view(np.int64)}
    assert find_shared(tree, by="buffer") == {"b": "a"}


def test_buffer_keeps_numpy_and_jax_apart():
    n = np.arange(4.0, dtype=np.float32)
    j = jnp.asarray(n)  # May alias n's memory on CPU; still a different kind of object.
    assert find_shared({"a": n, "b": j}, by="buffer") == {}


def test_buffer_holds_references_while_walking():
    # Arrays created on the fly by a pytree's flatten are alive until the walk
    # ends, so a freed address can never be reused by a later leaf.
    class Fresh:
        def __init__(self, n):
            self.n = n

    jax.tree_util.register_pytree_node(
        Fresh,
        lambda f: ([jnp.full((256,), float(i)) for i in range(f.n)], f.n),
        lambda n, _: Fresh(n),
    )
    assert find_shared(Fresh(50), by="buffer") == {}


class Strict:
    """A pytree node whose unflatten refuses non-array children."""

    def __init__(self, a, b):
        if not all(hasattr(x, "shape") for x in (a, b)):
            raise TypeError("Strict holds arrays only")
        self.a, self.b = a, b


jax.tree_util.register_pytree_with_keys(
    Strict,
    lambda s: (((jax.tree_util.GetAttrKey("a"), s.a), (jax.tree_util.GetAttrKey("b"), s.b)), None),
    lambda _, children: Strict(*children),
)


def test_paths_of_nodes_that_refuse_placeholders(W, V):
    tree = {"s": Strict(W, V), "t": Strict(V, W)}
    assert find_shared(tree) == {"t/a": "s/b", "t/b": "s/a"}
    assert find_shared(tree, prefer=["t"]) == {"s/a": "t/b", "s/b": "t/a"}


def test_repeated_non_array_objects_are_skipped_in_the_fast_path(W):
    s = "shared-string"
    tree = {"a": s, "b": s, "c": W, "d": [W, 0, 0]}
    assert find_shared(tree) == {"d/0": "c"}


def test_buffer_on_single_device_arrays_rewrapped_and_across_devices():
    x = jax.device_put(jnp.arange(8.0), jax.devices()[3])
    y = rewrap(x)
    z = jax.device_put(x, jax.devices()[4])  # a copy on another device
    assert find_shared({"a": x, "b": y, "c": z}, by="buffer") == {"b": "a"}
