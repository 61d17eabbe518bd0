"""Scanned layers: per-layer PyTorch tensors as one stacked Flax leaf, and back.

Linen ``nn.scan`` and NNX stacks (``nnx.vmap``) filled from a torch ``ModuleList``
(outputs within 1e-5, the way back bit for bit, the tied head an alias), a
transformers 5 Llama directory through ``--stack`` (axis 0 and MaxText's axis 1)
and back to ``from_pretrained``, plain Orbax items unstacked by ``--stack``, the
stacks ``inspect`` shows, and the bad inputs, each one line. The laws of stacking
(lift, unstack of stack) are property-tested.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from safetensors.torch import load_file

import bridge
import jaxshare
from jaxshare import AliasMap, checkpoint
from jaxshare.cli import main
from jaxshare.internal import (
    PlannedSource,
    StackedSource,
    UnstackedSource,
    inverse,
    layer_perm,
    lift,
    nest,
    stack_axis,
)
from jaxshare.stream import ArrayInfo, Plan, PlanEntry, TensorSource

L, D, V = 3, 8, 16


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, D)
        self.norm = torch.nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.tanh(self.lin(x)))


class Tower(torch.nn.Module):
    """An embedding, L blocks in a ModuleList, and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.layers = torch.nn.ModuleList([Block() for _ in range(L)])
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.layers:
            x = block(x)
        return self.head(x)


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        y = jnp.tanh(nn.Dense(D, name="lin")(x))
        return nn.LayerNorm(epsilon=1e-5, name="norm")(x + y), None


class LinenTower(nn.Module):
    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        emb = nn.Embed(V, D, name="emb")
        scan = nn.scan(
            LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=L
        )
        x, _ = scan(name="layers")(emb(ids), None)
        return emb.attend(x)


class NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(D, D, rngs=rngs)
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.norm(x + jnp.tanh(self.lin(x)))


class NNXTower(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.emb = nnx.Embed(V, D, rngs=rngs)

        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs: nnx.Rngs) -> NNXBlock:
            return NNXBlock(rngs)

        self.layers = blocks(rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def step(x: jax.Array, block: NNXBlock) -> jax.Array:
            return block(x)

        return self.emb.attend(step(self.emb(ids), self.layers))


IDS = np.array([[1, 5, 7, 2]])


def tower(dtype: torch.dtype = torch.float32) -> Tower:
    torch.manual_seed(0)
    return Tower().to(dtype)


def assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)  # Every per-layer name, layer after layer:
    layers = [int(n.split(".")[1]) for n in got if n.startswith("layers.")]
    assert layers == sorted(layers)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


def linen_like() -> dict:
    return jax.eval_shape(LinenTower().init, jax.random.key(0), jnp.asarray(IDS))


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_a_scanned_model_is_filled_from_a_module_list_and_comes_back_bit_exact(kind):
    model = tower()
    if kind == "linen":
        variables, aliases = bridge.to_flax(model, like=linen_like())
        layers = variables["params"]["layers"]
        out = LinenTower().apply(variables, jnp.asarray(IDS))
        back = bridge.to_torch(variables, aliases)
    else:
        net = NNXTower(nnx.Rngs(0))
        variables, aliases = bridge.to_flax(model, like=net)
        nnx.update(net, variables)
        layers = nnx.to_pure_dict(nnx.state(net))["layers"]
        out = net(jnp.asarray(IDS))
        back = bridge.to_torch(net, aliases)
    assert layers["lin"]["kernel"].shape == (L, D, D)
    assert layers["norm"]["scale"].shape == (L, D)
    for k in range(L):  # Layer k of the stack is torch's layer k, in the Flax layout.
        lin = model.layers[k].lin.weight.detach().numpy().T
        np.testing.assert_array_equal(np.asarray(layers["lin"]["kernel"][k]), lin)
    want = model(torch.tensor(IDS)).detach().numpy()
    np.testing.assert_allclose(np.asarray(out), want, atol=1e-5, rtol=0)
    assert_bit_exact(back, model.state_dict())
    assert back["head.weight"] is back["emb.weight"]  # The tie across the stack: one tensor.
    (alias,) = aliases
    assert alias.endswith("head/kernel") and aliases.transform(alias) == (1, 0)
    assert aliases.naming[alias.replace("head/kernel", "layers/lin/kernel")] == (
        "layers.{i}.lin.weight",
        (0, 2, 1),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_scanned_tree_through_an_orbax_item_needs_no_model_on_the_way_back(dtype, tmp_path):
    model = tower(dtype)
    variables, aliases = bridge.to_flax(model, like=linen_like())
    checkpoint.save(tmp_path / "ckpt", jaxshare.tie(variables, aliases))
    restored = checkpoint.restore(tmp_path / "ckpt")
    amap = checkpoint.open_source(tmp_path / "ckpt").ties  # (With its naming record.)
    assert str(restored["params"]["layers"]["lin"]["kernel"].dtype) == str(dtype).split(".")[1]
    back = bridge.to_torch(restored, amap)
    assert_bit_exact(back, model.state_dict())
    assert back["head.weight"] is back["emb.weight"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A transformers 5 Llama directory: 3 layers, GQA, a tied head."""
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V * 4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("llama") / "hf"
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def convert(*argv: object) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["convert", "--quiet", *map(str, argv)])
    return status, err.getvalue()


@pytest.mark.parametrize("axis", [0, 1])
def test_a_directory_stacked_into_an_item_comes_back_equal_and_loads(llama, axis, tmp_path):
    item, out = tmp_path / "item", tmp_path / "out"
    assert convert(llama, item, "--stack", "model.layers", "--stack-axis", axis) == (0, "")
    tree = ocp.StandardCheckpointer().restore(item.absolute())
    layers = tree["params"]["model"]["layers"]
    down = layers["mlp"]["down_proj"]["kernel"]
    assert down.shape == ((L, 48, 32) if axis == 0 else (48, L, 32))
    stored = load_file(llama / "model.safetensors")
    layer1 = stored["model.layers.1.mlp.down_proj.weight"].numpy().T
    np.testing.assert_array_equal(np.take(np.asarray(down), 1, axis=axis), layer1)
    assert set(tree["params"]) == {"model"}  # The tied head is an alias, stored once.
    chunks = checkpoint.open_source(item)._reader._open("params/model/layers/mlp/down_proj/kernel")
    assert chunks.chunk_layout.read_chunk.shape[axis] == 1  # One layer per chunk.
    assert convert(item, out, "--format", "hf") == (0, "")  # The naming record: no options.
    back = load_file(out / "model.safetensors")
    assert set(back) == set(stored)
    assert all(torch.equal(back[n], stored[n]) for n in stored)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_inspect_shows_each_stack_as_one_line_with_its_layers(llama, tmp_path, capsys):
    item = tmp_path / "item"
    assert convert(llama, item, "--stack", "model.layers")[0] == 0
    capsys.readouterr()
    assert main(["inspect", str(item)]) == 0
    out = capsys.readouterr().out
    assert "stacks of layers: 9" in out
    line = next(x for x in out.splitlines() if "mlp/down_proj/kernel" in x)
    assert f"{L} layers on axis 0" in line and "model.layers.{i}.mlp.down_proj.weight" in line
    assert main(["inspect", "--json", str(item)]) == 0
    stacks = json.loads(capsys.readouterr().out)["stacks"]
    assert len(stacks) == 9 and {s["layers"] for s in stacks} == {L}


@pytest.mark.parametrize("stack", [["--stack", "model.layers"], []], ids=["--stack", "found"])
def test_a_plain_orbax_item_of_stacks_is_unstacked_by_the_command(llama, stack, tmp_path):
    """An item a scanned training loop wrote with plain Orbax: no naming record, so
    ``--stack`` says where the layers are -- or the config's model class, whose
    per-layer names the tree holds as stacks."""
    stored = {n: t.numpy() for n, t in load_file(llama / "model.safetensors").items()}
    params = {"params/model/embed_tokens/embedding": stored["model.embed_tokens.weight"]}
    params["params/model/norm/scale"] = stored["model.norm.weight"]
    for name in [n for n in stored if n.startswith("model.layers.0.")]:
        rest = name.removeprefix("model.layers.0.")
        module, leaf = rest.rsplit(".", 1)
        per = [stored[f"model.layers.{k}.{rest}"] for k in range(L)]
        flax_leaf = "scale" if "norm" in module else "kernel"
        stacked = np.stack([p if p.ndim == 1 else p.T for p in per])
        params[f"params/model/layers/{module.replace('.', '/')}/{flax_leaf}"] = stacked
    with ocp.StandardCheckpointer() as saver:
        saver.save((tmp_path / "plain").absolute(), nest(params))
    out = tmp_path / "out"
    status, err = convert(
        tmp_path / "plain", out, "--format", "hf", "--config", llama / "config.json", *stack
    )
    assert (status, err) == (0, "")
    back = load_file(out / "model.safetensors")
    assert set(back) == set(stored) - {"lm_head.weight"}  # (Tied: left to the config.)
    assert all(np.array_equal(back[n].numpy(), stored[n]) for n in back)
    transformers.AutoModelForCausalLM.from_pretrained(out)


def per_layer_file(path: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    save_file({n: np.ones(s, np.float32) for n, s in shapes.items()}, path)
    return path


@pytest.mark.parametrize(
    ("shapes", "argv", "says"),
    [
        (
            {"h.0.w.weight": (2, 3), "h.1.w.weight": (2, 4)},
            ["--stack", "h"],
            "the layers of 'h.{i}.w.weight' differ: 'h.0.w.weight' is (2, 3) float32 but "
            "'h.1.w.weight' is (2, 4) float32",
        ),
        (
            {"h.0.w.weight": (2, 3), "h.2.w.weight": (2, 3)},
            ["--stack", "h"],
            "the stack 'h.{i}.w.weight' misses layer(s) [1] of 0..2",
        ),
        (
            {"h.0.w.weight": (2, 3), "h.1.w.weight": (2, 3)},
            ["--stack", "h", "--stack-axis", "3"],
            "--stack-axis 3 is out of range for 'h.{i}.w.weight', whose layers are 2-D",
        ),
        (
            {"h.0.w.weight": (2, 3), "h.1.w.weight": (2, 3)},
            ["--stack", "model.layers"],
            "--stack 'model.layers' matches no tensor: no name starts with "
            "'model.layers.<layer index>.' (the prefixes with numbered layers here: ['h'])",
        ),
    ],
    ids=["unequal-layers", "missing-layer", "axis-out-of-range", "prefix-matches-nothing"],
)
def test_bad_stacks_are_one_line_exit_1_and_no_output(shapes, argv, says, tmp_path):
    src = per_layer_file(tmp_path / "in.safetensors", shapes)
    before = src.read_bytes()
    status, err = convert(src, tmp_path / "item", *argv)
    assert status == 1
    assert err.count("\n") == 1 and says in err and str(src) in err, err
    assert not (tmp_path / "item").exists() and src.read_bytes() == before


class Layers(TensorSource):
    """Per-layer tensors in memory, for the laws."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._arrays = arrays
        self.infos = {n: ArrayInfo(a.shape, a.dtype.name) for n, a in arrays.items()}

    def read(self, name: str) -> np.ndarray:
        return self._arrays[name]


@st.composite
def stacks(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], int, tuple[int, ...] | None]:
    layers = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.int8]))
    perm = draw(st.permutations(range(len(shape))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    arrays = {
        f"h.{k}.w": rng.standard_normal(shape).astype(np.float32).astype(dtype)
        for k in range(layers)
    }
    arrays["e.w"] = rng.standard_normal(2).astype(dtype)
    axis = draw(st.integers(0, len(shape)))
    return arrays, axis, tuple(perm)


@settings(max_examples=60, deadline=None)
@given(stacks())
def test_unstacking_a_stack_gives_every_layer_back_bit_for_bit(case):
    """For any layers, layout and stack axis: the stack, permuted into Flax (the
    layers on ``axis``), read back layer by layer, is each layer bit for bit."""
    arrays, axis, perm = case
    ndim = len(perm)
    lifted = lift(perm, ndim, axis)
    assert layer_perm(lifted) == (None if perm == tuple(range(ndim)) else perm)
    assert stack_axis(lifted) == axis
    stacked = StackedSource(Layers(arrays), ["h"])
    info = stacked.infos["h.{i}.w"]
    entry = PlanEntry("params/h/w", "h.{i}.w", lifted, info.permuted(lifted))
    to_flax = Plan((entry, PlanEntry("params/e/w", "e.w", None, stacked.infos["e.w"])), AliasMap())
    flax = PlannedSource(stacked, to_flax)
    layers = len(arrays) - 1
    for k in range(layers):  # A layer read from the Flax stack, as its slice alone.
        index = (*(slice(None),) * axis, slice(k, k + 1))
        got = np.take(flax.read_slice("params/h/w", index), 0, axis=axis)
        want = arrays[f"h.{k}.w"] if perm is None else arrays[f"h.{k}.w"].transpose(perm)
        got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    back = Plan((PlanEntry("h.{i}.w", "params/h/w", inverse(lifted), info),), AliasMap())
    per_layer = UnstackedSource(PlannedSource(flax, back))
    assert list(per_layer.infos) == [f"h.{k}.w" for k in range(layers)]
    for k in range(layers):
        got, want = per_layer.array(f"h.{k}.w"), arrays[f"h.{k}.w"]
        assert got.shape == want.shape and np.array_equal(got.view(np.uint8), want.view(np.uint8))


class Chunked(Layers):
    """A stack stored as one chunk (as plain Orbax writes it), counting its reads."""

    def __init__(self, arrays: dict[str, np.ndarray], chunks: dict[str, tuple[int, ...]]) -> None:
        super().__init__(arrays)
        self.chunks, self.reads = chunks, []

    def chunk_shape(self, name: str) -> tuple[int, ...] | None:
        return self.chunks.get(name)

    def read(self, name: str) -> np.ndarray:
        self.reads.append(("whole", name))
        return super().read(name)

    def read_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        self.reads.append(("slice", name))
        return np.asarray(super().read(name)[index])


@pytest.mark.parametrize(
    ("chunk", "reads"),
    [((1, 2), [("slice", "h.{i}.w")] * 3), ((3, 2), [("whole", "h.{i}.w")])],
    ids=["per-layer-chunks", "one-chunk"],
)
def test_a_stack_is_read_a_layer_at_a_time_or_once_whole(chunk, reads):
    """Per-layer chunks: one slice per layer. Chunks that span layers: the stack read
    once, not once per layer (each read would decode every chunk it touches)."""
    stack = np.arange(6, dtype=np.float32).reshape(3, 2)
    source = Chunked({"h.{i}.w": stack, "e.w": np.zeros(1, np.float32)}, {"h.{i}.w": chunk})
    layers = UnstackedSource(source)
    assert [layers.array(f"h.{k}.w").tolist() for k in range(3)] == stack.tolist()
    assert source.reads == reads


def test_a_sharded_stack_reads_each_device_block_from_its_layers():
    """A stacked leaf sharded over 8 devices: each device's block is read from the
    layers (and rows) it covers, and the array equals the unsharded one."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    specs = {"kernel": jax.sharding.PartitionSpec(None, "x", None)}

    def sharded(path, leaf):
        spec = specs.get(path[-1].key, jax.sharding.PartitionSpec())
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=jax.NamedSharding(mesh, spec))

    like = jax.tree_util.tree_map_with_path(sharded, linen_like())
    model = tower()
    variables, _ = bridge.to_flax(model, like=like)
    kernel = variables["params"]["layers"]["lin"]["kernel"]
    assert kernel.sharding == like["params"]["layers"]["lin"]["kernel"].sharding
    assert len(kernel.addressable_shards) == 8
    want = np.stack([model.layers[k].lin.weight.detach().numpy().T for k in range(L)])
    np.testing.assert_array_equal(np.asarray(kernel), want)
