"""PEFT LoRA adapters <-> the LoRA params of Flax models (bridge.adapters.flax_lora):
real PEFT 0.21 adapters on tiny transformers 5 Qwen3, Llama 3 and Gemma 3 models, Tunix's own
model classes with qwix's ``apply_lora_to_model``, ``nnx.LoRALinear``, and Tunix's
``save_only_lora_params`` checkpoints."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import qwix
import torch
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge.adapters.flax_lora import factor_ops
from bridge.layouts.ops import Merge, Op, Permute, Scale, Split, Stack
from bridge.layouts.tunix import tunix_tables
from jaxshare.formats import SafetensorsFile

#: The modules the adapters here target: each kind of kernel Tunix has (heads on an
#: output axis, heads on input axes, a plain Linear, the head); Gemma 3's heads first
#: (``q_einsum`` (heads, hidden, head_dim)), its k and v left out (Tunix stacks them into
#: one ``kv_einsum``), its head the embedding.
_EVERY_KIND = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = {
    "qwen3": [*_EVERY_KIND, "lm_head"],
    "llama3": [*_EVERY_KIND, "lm_head"],
    "gemma3": ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
#: The same modules as Tunix names them, for qwix's rules where no adapter says.
QWIX_PATHS = {
    "qwen3": ".*(q|k|v|o|gate|up|down)_proj|lm_head",
    "llama3": ".*(q|k|v|o|gate|up|down)_proj|lm_head",
    "gemma3": ".*(q_einsum|attn_vec_einsum|gate_proj|up_proj|down_proj)",
}
RANK, ALPHA = 4, 8.0  # scaling 2: alpha / r, as PEFT and qwix compute it
#: What Tunix 0.1.7 and qwix 0.1.8 warn of under jax 0.10 / flax 0.12, and PEFT 0.21 of
#: transformers 5 (``is_gradient_checkpointing``); the suite makes warnings errors.
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:{message}")
    for message in (
        r"'sharding' is deprecated, use 'out_sharding':DeprecationWarning",
        r"`flax\.nnx\.State` will be:DeprecationWarning",
        r"jax\.experimental\.shard_map is deprecated:DeprecationWarning",
        r"`is_gradient_checkpointing` is deprecated:FutureWarning",
        r"The 'm\.iter_modules\(\)' method is deprecated:DeprecationWarning",
        r"'\.value' access is now deprecated:DeprecationWarning",
        r"'VariableState' was removed:DeprecationWarning",
        r"jax\.interpreters\.pxla\.thread_resources is deprecated:DeprecationWarning",
    )
]


@pytest.fixture(scope="module")
def tm(load_script: Callable) -> ModuleType:
    """google-tunix's model modules and the tiny models (``tests/_support/tunix_models.py``)."""
    return load_script("tests/_support/tunix_models.py")


def _randomize_peft(model: torch.nn.Module, seed: int) -> None:
    """Every LoRA factor random (PEFT starts B at zero: an adapter that changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module", params=list(TARGETS))
def base(request, tmp_path_factory, tm):
    """A tiny float32 transformers 5 model of the family (untied; Gemma 3 is always
    tied), its directory and config."""
    family = request.param
    hf = tmp_path_factory.mktemp(family) / "hf"
    config = tm.write_hf_dir(hf, family, tied=family == "gemma3", dtype="float32")
    if family == "llama3":
        # Tunix 0.1.7's Llama 3 applies plain rope (not Llama 3.2's scaling), and of base
        # 1e6 whatever the config says (its attention calls apply_rope without rope_theta).
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
        (hf / "config.json").write_text(json.dumps(config))
    return family, hf, config


@pytest.fixture(scope="module")
def peft_adapter(base, tmp_path_factory) -> Path:
    """A PEFT 0.21 adapter (``get_peft_model`` + ``save_pretrained``) on every target."""
    import transformers

    family, hf, _ = base
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS[family])
    model = peft.get_peft_model(model, lora)
    _randomize_peft(model, 1)
    out = tmp_path_factory.mktemp("peft") / "adapter"
    # (PEFT counts lm_head an embedding layer and would save the base's whole head.)
    model.save_pretrained(out, save_embedding_layers=False)
    return out


TOKENS = np.array([[3, 17, 42, 99, 5, 250, 7, 64], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)


def _peft_logits(hf: Path, adapter: Path) -> np.ndarray:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    model = peft.PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS).long()).logits.numpy()


def _hf_logits(hf: Path) -> np.ndarray:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS).long()).logits.numpy()


def _tunix_lora(tm, hf: Path, config: dict, seed: int = 0, adapter: Path | None = None):
    """Tunix's model of ``hf``, with qwix's LoRA as Tunix's ``apply_lora_to_model``
    applies it (``LoraProvider(module_path, rank, alpha)``): on the adapter's modules,
    of its rank and alpha (``bridge.qwix_rules``), or on :data:`QWIX_PATHS`."""
    model = tm.tunix_load(hf, config, mode="original")
    if adapter is not None:
        rules = bridge.qwix_rules(adapter, layout="tunix", config=config)
        provider = qwix.LoraProvider([qwix.LoraRule(**rule) for rule in rules])
    else:
        family = tm.family_of(config)
        provider = qwix.LoraProvider(module_path=QWIX_PATHS[family], rank=RANK, alpha=ALPHA)
    return qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(seed), **model.get_model_input())


def _tunix_logits(model) -> np.ndarray:
    b, t = TOKENS.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    logits, _ = model(jnp.asarray(TOKENS), positions, None, mask)
    return np.asarray(logits)


#: float32 end to end, but two programs: XLA's and torch's matmul orders, rope, and
#: the softmax differ in the last bits (measured: 1.5e-6 for Qwen3, 2.1e-6 for Llama 3,
#: 1.6e-6 for Gemma 3, logits of up to ~3); the LoRA moves the logits by ~1 (asserted
#: beside each comparison).
ATOL = 2e-5


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    with SafetensorsFile(directory / "adapter_model.safetensors") as f:
        return {name: np.array(f.array(name)) for name in f.infos}


def test_peft_adapter_to_tunix_qwix_lora_gives_peft_outputs(base, peft_adapter, tm) -> None:
    """PEFT -> qwix LoRA params of Tunix's model: the same logits as PEFT's model."""
    family, hf, config = base
    model = _tunix_lora(tm, hf, config, adapter=peft_adapter)
    like = nnx.state(model, nnx.LoRAParam)
    state = bridge.adapter_to_flax(peft_adapter, layout="tunix", config=config, like=like)
    assert jax.tree.structure(state) == jax.tree.structure(like)
    nnx.update(model, state)
    want, base_logits = _peft_logits(hf, peft_adapter), _hf_logits(hf)
    got = _tunix_logits(model)
    assert np.abs(want - base_logits).max() > 100 * ATOL  # the adapter does change them
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_qwix_lora_to_peft_adapter_that_peft_serves(base, tm, tmp_path) -> None:
    """A LoRA trained in JAX (random qwix params) -> a PEFT directory that
    ``PeftModel.from_pretrained`` serves, unmerged, with the JAX model's logits."""
    family, hf, config = base
    model = _tunix_lora(tm, hf, config)
    state = nnx.state(model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(7), 1000))
    state = jax.tree.map(lambda x: 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), state)
    nnx.update(model, state)
    out = bridge.adapter_from_flax(
        state,
        tmp_path / "adapter",
        layout="tunix",
        config=config,
        lora_alpha=ALPHA,
        base_model_name_or_path=str(hf),
    )
    doc = json.loads((out / "adapter_config.json").read_text())
    assert (doc["r"], doc["lora_alpha"], sorted(doc["target_modules"])) == (
        RANK,
        ALPHA,
        sorted(TARGETS[family]),
    )
    want = _tunix_logits(model)
    got = _peft_logits(hf, out)
    assert np.abs(want - _hf_logits(hf)).max() > 100 * ATOL
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_peft_to_qwix_to_peft_is_bit_exact(base, peft_adapter, tmp_path) -> None:
    """Without a model (no ``like``): PEFT -> nested dicts -> PEFT, every tensor the same
    bits under the same name."""
    family, _, config = base
    params = bridge.adapter_to_flax(peft_adapter, layout="tunix", config=config)
    q, o = ("q_einsum", "attn_vec_einsum") if family == "gemma3" else ("q_proj", "o_proj")
    attn = params["layers"]["1"]["attn"]
    assert (attn[q]["w_lora_a"].shape, attn[q]["w_lora_b"].shape) == ((64, RANK), (RANK, 4, 16))
    assert (attn[o]["w_lora_a"].shape, attn[o]["w_lora_b"].shape) == ((4, 16, RANK), (RANK, 64))
    out = bridge.adapter_from_flax(
        params, tmp_path / "back", layout="tunix", config=config, lora_alpha=ALPHA
    )
    got, want = _tensors(out), _tensors(peft_adapter)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].tobytes() == want[name].tobytes(), name


def test_tunix_save_only_lora_params_checkpoint_to_peft(base, tm, tmp_path) -> None:
    """What Tunix's own CheckpointManager writes with ``save_only_lora_params=True`` (the
    trainer's flag when the model has LoRA) -> the adapter its state gives, bit for bit."""
    family, hf, config = base
    tm.tunix()  # (The bare tunix package: its trainers' __init__ not run.)
    manager_lib = importlib.import_module("tunix.sft.checkpoint_manager")
    model = _tunix_lora(tm, hf, config, seed=3)
    state = nnx.state(model, nnx.LoRAParam)
    manager = manager_lib.CheckpointManager(str(tmp_path / "ckpt"))
    assert manager.save(5, model, save_only_lora_params=True, force=True)
    manager.close()
    from_ckpt = bridge.adapter_from_flax(
        tmp_path / "ckpt", tmp_path / "a", layout="tunix", config=config, lora_alpha=ALPHA
    )
    from_state = bridge.adapter_from_flax(
        state, tmp_path / "b", layout="tunix", config=config, lora_alpha=ALPHA
    )
    got, want = _tensors(from_ckpt), _tensors(from_state)
    assert sorted(got) == sorted(want) and len(want) == len(jax.tree.leaves(state))
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


# -- nnx.LoRALinear: the "nnx" naming, any model of jaxshare's naming rules ------------


class _TorchMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, 16), torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _NnxMLP(nnx.Module):
    def __init__(self, rank: int) -> None:
        rngs = nnx.Rngs(0)
        self.fc1 = nnx.LoRALinear(6, 16, lora_rank=rank, rngs=rngs)
        self.fc2 = nnx.LoRALinear(16, 5, lora_rank=rank, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.fc1(x)))


def _nnx_mlp(torch_model: _TorchMLP, rank: int) -> _NnxMLP:
    model = _NnxMLP(rank)
    sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    for name in ("fc1", "fc2"):
        layer = getattr(model, name)
        layer.kernel.set_value(jnp.asarray(sd[f"{name}.weight"].T))
        layer.bias.set_value(jnp.asarray(sd[f"{name}.bias"]))
    return model


@pytest.mark.parametrize("alpha", [8.0, 6.0], ids=["scaling-2", "scaling-1.5"])
def test_nnx_lora_linear_both_ways(alpha: float, tmp_path) -> None:
    """PEFT on a torch MLP -> ``nnx.LoRALinear``'s ``lora/lora_a``, ``lora/lora_b``
    (the scaling folded into ``lora_b``: nnx.LoRA has none) -> PEFT: the same outputs,
    and the same bits where the scaling is a power of two."""
    torch.manual_seed(0)
    torch_model = _TorchMLP()
    nnx_model = _nnx_mlp(torch_model, RANK)
    lora = peft.LoraConfig(r=RANK, lora_alpha=alpha, target_modules=["fc1", "fc2"])
    peft_model = peft.get_peft_model(torch_model, lora)
    _randomize_peft(peft_model, 2)
    peft_model.save_pretrained(tmp_path / "adapter")
    like = nnx.state(nnx_model, nnx.LoRAParam)
    state = bridge.adapter_to_flax(tmp_path / "adapter", like=like)
    assert {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(state)} == {
        "fc1/lora/lora_a",
        "fc1/lora/lora_b",
        "fc2/lora/lora_a",
        "fc2/lora/lora_b",
    }
    nnx.update(nnx_model, state)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    with torch.no_grad():
        want = peft_model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(nnx_model(jnp.asarray(x))), want, atol=1e-5, rtol=0)
    out = bridge.adapter_from_flax(state, tmp_path / "back", lora_alpha=alpha)
    got, orig = _tensors(out), _tensors(tmp_path / "adapter")
    assert sorted(got) == sorted(orig)
    for name in orig:
        if alpha / RANK == 2.0:
            assert got[name].tobytes() == orig[name].tobytes(), name
        else:  # (times 1.5 then divided by it in float32: within an ulp or two.)
            np.testing.assert_allclose(got[name], orig[name], rtol=3e-7, atol=0)


# -- the factors' ops, from a table's ops ---------------------------------------------


def _lora_kernel(f, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The kernel ``lora_a`` and ``lora_b`` make, by their axes (qwix's einsum)."""
    letters = "abcdefghijk"
    ins = "".join(letters[k] for k, t in enumerate(f.kernel_axes) if t == "in")
    outs = "".join(letters[k] for k, t in enumerate(f.kernel_axes) if t == "out")
    every = letters[: len(f.kernel_axes)]
    return np.einsum(f"{ins}r,r{outs}->{every}", a, b)


def _kernel(ops: list[Op], w: np.ndarray) -> np.ndarray:
    for op in ops:
        w = op.forward(w)
    return w


@st.composite
def _chains(draw):
    """A weight shape (out, in) and a chain of permutes, splits and merges on it (a
    merge of two neighbouring axes of one side: output axes, or input axes)."""
    out, inn = draw(st.sampled_from([2, 4, 6, 12])), draw(st.sampled_from([2, 3, 6, 8]))
    shape, sides, ops = [out, inn], ["out", "in"], []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["permute", "split", "merge"]))
        mergeable = [k for k in range(len(shape) - 1) if sides[k] == sides[k + 1]]
        if kind == "permute":
            perm = draw(st.permutations(range(len(shape))))
            ops.append(Permute(tuple(perm)))
            shape, sides = [shape[p] for p in perm], [sides[p] for p in perm]
        elif kind == "split" or not mergeable:
            k = draw(st.integers(0, len(shape) - 1))
            divisors = [d for d in range(1, shape[k] + 1) if shape[k] % d == 0]
            d = draw(st.sampled_from(divisors))
            ops.append(Split(k, (d, shape[k] // d)))
            shape = [*shape[:k], d, shape[k] // d, *shape[k + 1 :]]
            sides = [*sides[:k], sides[k], sides[k], *sides[k + 1 :]]
        else:
            k = draw(st.sampled_from(mergeable))
            ops.append(Merge(k, (shape[k], shape[k + 1])))
            shape = [*shape[:k], shape[k] * shape[k + 1], *shape[k + 2 :]]
            sides = [*sides[:k], sides[k], *sides[k + 2 :]]
    return (out, inn), ops


@given(_chains(), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_factors_make_the_kernel_and_come_back_exact(chain, rank: int, seed: int) -> None:
    """Law: ``lora_a`` and ``lora_b`` contract to the ops of ``B @ A``, and come back to
    ``A`` and ``B`` bit for bit."""
    (out, inn), ops = chain
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rank, inn)).astype(np.float32)
    b = rng.standard_normal((out, rank)).astype(np.float32)
    f = factor_ops(ops, (out, inn), "w")
    lora_a, lora_b = f.to_flax(a, b)
    assert lora_a.shape == f.a_shape(rank, (out, inn)) and lora_b.shape[0] == rank
    np.testing.assert_allclose(
        _lora_kernel(f, lora_a, lora_b), _kernel(ops, b @ a), rtol=1e-5, atol=1e-5
    )
    back_a, back_b = f.from_flax(lora_a, lora_b)
    assert back_a.tobytes() == a.tobytes() and back_b.tobytes() == b.tobytes()


#: Tunix's kernels (Qwen3's table, E=64, N=4, K=2, D=16, F=128): the pair of each, as
#: qwix 0.1.8 creates it (checked against a live qwix model above).
TUNIX_PAIRS = [
    ("model.layers.0.self_attn.q_proj.weight", (64, 64), (64, RANK), (RANK, 4, 16)),
    ("model.layers.0.self_attn.k_proj.weight", (32, 64), (64, RANK), (RANK, 2, 16)),
    ("model.layers.0.self_attn.o_proj.weight", (64, 64), (4, 16, RANK), (RANK, 64)),
    ("model.layers.0.mlp.down_proj.weight", (64, 128), (128, RANK), (RANK, 64)),
    ("lm_head.weight", (256, 64), (64, RANK), (RANK, 256)),
]


@pytest.mark.parametrize(("name", "weight", "a_shape", "b_shape"), TUNIX_PAIRS)
def test_tunix_table_entries_give_qwix_shapes(tm, name, weight, a_shape, b_shape) -> None:
    config = tm.tiny_hf_config("qwen3", tied=False)
    table = next(t for t in tunix_tables() if "qwen3" in t.model_types)
    entry, _ = table.bind(config).match_torch(name)
    f = factor_ops(entry.ops, weight, name)
    assert (f.a_shape(RANK, weight), f.b_shape(RANK, weight)) == (a_shape, b_shape)


@pytest.mark.parametrize(
    ("ops", "match"),
    [
        ([Permute((1, 0)), Split(1, (2, 2)), Merge(0, (4, 2))], r"merges input with output"),
        ([Scale("2")], r"cannot be carried to a LoRA factor"),
        ([Stack("p", 0)], r"cannot be carried to a LoRA factor"),
    ],
    ids=["merge-in-out", "scale", "stack"],
)
def test_ops_no_factor_carries_are_refused(ops, match) -> None:
    with pytest.raises(ValueError, match=r"^q_proj: .*" + match):
        factor_ops(ops, (4, 4), "q_proj")


def test_gemma3_fused_qkv_is_refused_in_one_line(tm, tmp_path) -> None:
    """Gemma 3 with as many KV heads as query heads: Tunix stacks q, k and v into one
    ``qkv_einsum`` kernel, which per-module PEFT pairs cannot be: one line."""
    config = tm.tiny_hf_config("gemma3", tied=True, fused_qkv=True)
    from bridge.adapters.peft import LoraConfig, LoraPair, save_adapter

    a = np.zeros((RANK, 64), np.float32)
    b = np.zeros((64, RANK), np.float32)
    out = save_adapter(
        tmp_path / "g",
        LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=("q_proj",)),
        {"model.layers.0.self_attn.q_proj": LoraPair(a, b)},
    )
    with pytest.raises(
        ValueError, match=r"q_proj\.weight in the tunix layout: the layout stacks it .*qkv_einsum"
    ):
        bridge.adapter_to_flax(out, layout="tunix", config=config)


def test_like_of_another_rank_is_one_line(base, peft_adapter) -> None:
    """``like`` whose ``down_proj`` has rank 8 (another LoRA rule) for an adapter of rank 4."""
    _, _, config = base
    flat = {}

    def walk(tree, prefix):
        for k, v in tree.items():
            walk(v, f"{prefix}{k}/") if isinstance(v, dict) else flat.update({prefix + k: v})

    walk(bridge.adapter_to_flax(peft_adapter, layout="tunix", config=config), "")
    like = dict(flat)
    like["layers/0/mlp/down_proj/kernel_lora_a"] = np.zeros((128, 8), np.float32)
    with pytest.raises(
        ValueError,
        match=r"'layers/0/mlp/down_proj/kernel_lora_a' is \(128, 4\) from "
        r"the adapter, but `like` has \(128, 8\)",
    ):
        bridge.adapter_to_flax(peft_adapter, layout="tunix", config=config, like=like)


def test_a_module_the_layout_lacks_is_one_line(base, tmp_path) -> None:
    """An adapter of another model (a module Tunix's table does not name)."""
    from bridge.adapters.peft import LoraConfig, LoraPair, save_adapter

    _, _, config = base
    pair = LoraPair(np.zeros((RANK, 64), np.float32), np.zeros((64, RANK), np.float32))
    out = save_adapter(
        tmp_path / "x",
        LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=("c_attn",)),
        {"transformer.h.0.attn.c_attn": pair},
    )
    with pytest.raises(
        ValueError,
        match=r"^transformer\.h\.0\.attn\.c_attn\.weight in the "
        r"tunix layout: no entry names it \(nearest: .*\); is the adapter",
    ):
        bridge.adapter_to_flax(out, layout="tunix", config=config)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_a_lora_on_a_head_the_model_computes_is_one_line(tm, tmp_path) -> None:
    """Tunix's tied Qwen3 computes its head with ``embedder.decode``: an adapter on
    ``lm_head`` has no kernel to sit beside, and says so rather than dropping the pair."""
    import transformers

    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, "qwen3", tied=True, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "lm_head"])
    peft.get_peft_model(model, lora).save_pretrained(tmp_path / "a", save_embedding_layers=False)
    with pytest.raises(
        ValueError,
        match=r"^lm_head\.weight in the tunix layout: the model computes it from "
        r"model\.embed_tokens\.weight \(a tie\), so it has no kernel",
    ):
        bridge.adapter_to_flax(tmp_path / "a", layout="tunix", config=config)


def test_ranks_of_their_own_go_to_rank_pattern(tm, tmp_path) -> None:
    """PEFT's ``rank_pattern`` (o_proj of rank 2, the rest 4): two qwix rules, and the way
    back writes the pattern again, which PEFT loads with the same tensors and logits."""
    import transformers

    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, "qwen3", tied=False, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    lora = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "o_proj"], rank_pattern={"o_proj": 2}
    )
    model = peft.get_peft_model(model, lora)
    _randomize_peft(model, 4)
    model.save_pretrained(tmp_path / "a")
    rules = bridge.qwix_rules(tmp_path / "a", layout="tunix", config=config)
    assert [(r["rank"], r["alpha"]) for r in rules] == [(2, ALPHA), (RANK, ALPHA)]
    assert rules[0]["module_path"] == r"layers/0/attn/o_proj|layers/1/attn/o_proj"
    params = bridge.adapter_to_flax(tmp_path / "a", layout="tunix", config=config)
    assert params["layers"]["0"]["attn"]["o_proj"]["w_lora_a"].shape == (4, 16, 2)
    out = bridge.adapter_from_flax(
        params, tmp_path / "b", layout="tunix", config=config, lora_alpha=ALPHA
    )
    got, want = _tensors(out), _tensors(tmp_path / "a")
    assert sorted(got) == sorted(want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    np.testing.assert_array_equal(_peft_logits(hf, out), _peft_logits(hf, tmp_path / "a"))


def test_a_lora_a_without_its_lora_b_is_one_line(tmp_path) -> None:
    params = {"fc1": {"lora": {"lora_a": np.zeros((6, 2), np.float32)}}}
    with pytest.raises(
        ValueError, match=r"^'fc1/lora/lora_a': its pair 'fc1/lora/lora_b' is missing"
    ):
        bridge.adapter_from_flax(params, tmp_path / "x", lora_alpha=4.0, naming="nnx")
    assert not (tmp_path / "x").exists()


def test_a_folder_that_is_no_tunix_checkpoint_is_one_line(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: expected a Tunix checkpoint \(STEP/model_params"):
        bridge.read_tunix_lora(tmp_path / "empty")


def test_bf16_factors_round_trip_bit_exact(base, peft_adapter, tmp_path) -> None:
    """The factors keep their dtype, bf16 included: PEFT -> qwix params -> PEFT."""
    import ml_dtypes

    from bridge.adapters.peft import LoraPair, save_adapter

    family, _, config = base
    adapter = bridge.read_adapter(peft_adapter)
    bf16 = {
        m: LoraPair(
            np.asarray(p.A).astype(ml_dtypes.bfloat16), np.asarray(p.B).astype(ml_dtypes.bfloat16)
        )
        for m, p in adapter.modules().items()
    }
    source = save_adapter(tmp_path / "bf16", adapter.config, bf16)
    params = bridge.adapter_to_flax(source, layout="tunix", config=config)
    assert params["layers"]["0"]["mlp"]["up_proj"]["kernel_lora_b"].dtype == ml_dtypes.bfloat16
    out = bridge.adapter_from_flax(
        params, tmp_path / "b", layout="tunix", config=config, lora_alpha=ALPHA
    )
    got, want = _tensors(out), _tensors(source)
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype == ml_dtypes.bfloat16 for k in want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
