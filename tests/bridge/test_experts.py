"""A mixture of experts under both of transformers 5's namings: per expert (as
``save_pretrained`` writes by default) and fused (as the model holds them and
``save_original_format=False`` writes them), each read as the other, with real
Qwen3-MoE, Mixtral and Qwen2-MoE (a shared expert, a dense first layer) from tiny
configs."""

from __future__ import annotations

import json

import numpy as np
import optax
import pytest
import torch
import transformers
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file
from safetensors.torch import load_file

import bridge
from bridge.hf.experts import (
    FusedView,
    PerExpertView,
    experts_families,
    experts_family,
)
from jaxshare import checkpoint
from jaxshare.cli import main
from jaxshare.internal import UsageError

CONFIGS = {
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False,
    ),
    "mixtral": lambda: transformers.MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
        shared_expert_intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def moe(request, tmp_path_factory):
    """A model saved both ways by transformers 5, with bfloat16 weights."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]())
    model = model.to(torch.bfloat16)
    root = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(root / "per")
    model.save_pretrained(root / "fused", save_original_format=False)
    return request.param, model, root


def _tensors(path):
    """``{name: (dtype, shape, bytes)}`` of a directory's safetensors files."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        for name, t in load_file(file).items():
            out[name] = (str(t.dtype), tuple(t.shape), t.view(torch.uint8).numpy().tobytes())
    return out


def _arrays(arrays: dict) -> dict:
    """``{name: (dtype, shape, bytes)}`` of numpy arrays (bfloat16 as torch names it)."""
    out = {}
    for name, a in arrays.items():
        dtype = "torch.bfloat16" if a.dtype.name == "bfloat16" else f"torch.{a.dtype.name}"
        out[name] = (dtype, tuple(a.shape), np.ascontiguousarray(a).tobytes())
    return out


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))[:6]
    for name in a:
        assert a[name] == b[name], name


def test_the_two_namings_are_what_transformers_5_writes(moe) -> None:
    """The fused directory has fewer tensors; each view of one is the other, bit for bit."""
    name, _, root = moe
    per, fused = _tensors(root / "per"), _tensors(root / "fused")
    assert len(fused) < len(per)
    family = experts_family(json.loads((root / "per" / "config.json").read_text()))
    with bridge.HFDirectory(root / "per") as a, bridge.HFDirectory(root / "fused") as b:
        assert isinstance(bridge.open_source(root / "fused"), PerExpertView)
        _same(_arrays({n: PerExpertView(b, family).array(n) for n in per}), per)
        _same(_arrays({n: FusedView(a, family).array(n) for n in fused}), fused)


def test_both_namings_give_one_item_and_both_come_back(moe, tmp_path) -> None:
    """Per-expert and fused directories convert to the same item, leaf for leaf and bit for
    bit; the item goes back per expert by default and fused with --fused-experts, and
    transformers 5 loads each with no missing or unexpected keys, bit-exact."""
    name, model, root = moe
    items = {}
    for kind in ("per", "fused"):
        items[kind] = tmp_path / f"item-{kind}"
        assert main(["convert", str(root / kind), str(items[kind]), "--quiet"]) == 0
    a, b = checkpoint.restore(items["per"]), checkpoint.restore(items["fused"])
    import jax

    flat_a = dict(jax.tree_util.tree_leaves_with_path(a))
    flat_b = dict(jax.tree_util.tree_leaves_with_path(b))
    assert flat_a.keys() == flat_b.keys()
    for path in flat_a:
        assert np.asarray(flat_a[path]).tobytes() == np.asarray(flat_b[path]).tobytes(), path
    back_per, back_fused = tmp_path / "back-per", tmp_path / "back-fused"
    assert main(["convert", str(items["fused"]), str(back_per), "--format", "hf", "--quiet"]) == 0
    assert (
        main(["convert", str(items["per"]), str(back_fused), "--format", "hf", "--fused-experts",
              "--quiet"]) == 0
    )  # fmt: skip
    _same(_tensors(back_per), _tensors(root / "per"))
    _same(_tensors(back_fused), _tensors(root / "fused"))
    expected = model.state_dict()
    for directory in (back_per, back_fused):
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
            directory, output_loading_info=True, dtype=torch.bfloat16
        )
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
        for key, value in loaded.state_dict().items():
            assert torch.equal(value.view(torch.int16), expected[key].view(torch.int16)), key


def test_save_hf_writes_fused_experts_from_per_expert_tensors(moe, tmp_path) -> None:
    name, _, root = moe
    out = bridge.save_hf(tmp_path / "out", root / "per", fused_experts=True)
    _same(_tensors(out), _tensors(root / "fused"))


def test_the_table_follows_transformers_5s_conversion_mapping() -> None:
    """Each model type of the table is one transformers 5 converts with the same
    converter (its "qwen2_moe" or "mixtral"), whose patterns the table spells."""
    from transformers import conversion_mapping as cm

    aliases = cm._MODEL_TO_CONVERSION_PATTERN
    mapping = cm._build_checkpoint_conversion_mapping()
    for family in experts_families():
        owners = {aliases.get(t, t) for t in family.model_types}
        assert len(owners) == 1, (family.model_types, owners)
        (owner,) = owners
        patterns = {
            (tuple(c.source_patterns), tuple(c.target_patterns))
            for c in mapping[owner]
            if hasattr(c, "operations")
        }
        for fused in family.fused:
            sources = tuple(
                "." + p.split(".", 1)[1].replace("{e}", "*") if p.startswith("block") else
                p.replace("{e}", "*")
                for p in fused.experts
            )  # fmt: skip
            assert any(
                tuple(s.lstrip(".") for s in src) == tuple(s.lstrip(".") for s in sources)
                and tgt[0].lstrip(".").endswith(fused.fused.split(".", 1)[1])
                for src, tgt in patterns
            ), (owner, fused)


def test_a_missing_expert_is_one_line(tmp_path) -> None:
    family = experts_family({"model_type": "qwen3_moe"})
    w = np.zeros((4, 8), np.float32)
    names = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": w
             for e in range(3) for p in ("gate", "up", "down")}  # fmt: skip
    del names["model.layers.0.mlp.experts.1.up_proj.weight"]
    save_file(names, tmp_path / "m.safetensors")
    with bridge.open_source(tmp_path / "m.safetensors") as source:
        with pytest.raises(ValueError) as e:
            FusedView(source, family)
    message = str(e.value)
    assert "'model.layers.0.mlp.experts.gate_up_proj' fuses 3 experts, but 1 tensor(s)" in message
    assert "'mlp.experts.1.up_proj.weight'" in message and "\n" not in message


def test_a_source_with_both_namings_of_a_layer_is_one_line(tmp_path) -> None:
    family = experts_family({"model_type": "qwen3_moe"})
    save_file(
        {
            "model.layers.0.mlp.experts.gate_up_proj": np.zeros((2, 8, 4), np.float32),
            "model.layers.0.mlp.experts.0.gate_proj.weight": np.zeros((4, 4), np.float32),
        },
        tmp_path / "m.safetensors",
    )
    with bridge.open_source(tmp_path / "m.safetensors") as source:
        with pytest.raises(ValueError, match="is stored, and 'model.layers.0.mlp.experts"):
            PerExpertView(source, family)


def test_fused_experts_is_for_a_mixture_of_experts_and_hf_outputs(tmp_path) -> None:
    save_file({"fc.weight": np.zeros((2, 2), np.float32)}, tmp_path / "m.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UsageError, match="--fused-experts is how a Hugging Face directory"):
        bridge.convert(tmp_path / "m.safetensors", tmp_path / "item", fused_experts=True)
    with pytest.raises(ValueError, match="is for a mixture of experts; config.json's model_type"):
        bridge.save_hf(
            tmp_path / "out", tmp_path / "m.safetensors", config=tmp_path / "config.json",
            fused_experts=True,
        )  # fmt: skip


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_check_accounts_for_every_expert(moe, tmp_path) -> None:
    """Both directories transformers 5 wrote are clean; a layer missing an expert, a
    layer stored both ways (alike, then differing) are one error line each."""
    from safetensors.torch import save_file as save_torch

    name, _, root = moe
    for kind in ("per", "fused"):
        report = bridge.check(root / kind)
        assert report.ok, report.lines()
    per = load_file(root / "per" / "model.safetensors")
    fused = load_file(root / "fused" / "model.safetensors")
    layer = "model.layers.1."
    expert = next(n for n in per if n.startswith(layer) and ".experts.2." in n)
    missing = _copy(root / "per", tmp_path / "missing")
    save_torch({n: t for n, t in per.items() if n != expert}, missing / "model.safetensors",
               metadata={"format": "pt"})  # fmt: skip
    report = bridge.check(missing)
    assert [f.kind for f in report.findings] == ["expert-missing"], report.lines()
    line = report.findings[0].render()
    assert expert.split("experts.", 1)[1] in line and "(4 experts a layer)" in line
    twice = _copy(root / "per", tmp_path / "twice")
    gate_up = next(n for n in fused if n.startswith(layer) and n.endswith("gate_up_proj"))
    both = {**per, gate_up: fused[gate_up]}
    save_torch(both, twice / "model.safetensors", metadata={"format": "pt"})
    report = bridge.check(twice)
    assert [f.kind for f in report.findings] == ["expert-twice"], report.lines()
    with pytest.raises(ValueError, match="keep one naming"):
        bridge.open_source(twice)
    differ = _copy(root / "per", tmp_path / "differ")
    changed = fused[gate_up].clone()
    changed[3, 0, 0] += 1
    save_torch({**per, gate_up: changed}, differ / "model.safetensors", metadata={"format": "pt"})
    (finding,) = bridge.check(differ).findings
    assert finding.kind == "experts-differ" and finding.figure.startswith("max |Δ| = ")
    assert ".experts.3." in finding.names[1]


def test_inspect_shows_each_layers_experts(moe) -> None:
    name, _, root = moe
    for kind, stored in (("per", "per expert"), ("fused", "fused")):
        lines = [n for n in bridge.inspect(root / kind).notes if n.startswith("experts: ")]
        layers = 1 if name == "qwen2_moe" else 2  # (Qwen2-MoE's first layer is dense.)
        assert len(lines) == layers, lines
        assert all(": 4 experts (" in n and n.endswith(f"stored {stored}") for n in lines)


@given(
    st.sampled_from(["qwen3_moe", "mixtral"]),
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from(["float32", "bfloat16", "float16"]),
    st.integers(0, 2**16),
)
def test_fused_and_per_expert_views_invert_bit_for_bit(
    model_type, layers, experts, inner, hidden, dtype, seed
) -> None:
    """Per expert -> fused -> per expert gives every tensor back (names, shapes, dtypes,
    bits), and so does fused -> per expert -> fused; the other tensors pass through,
    renamed as the family says (Mixtral's router)."""
    import ml_dtypes

    from jaxshare.stream import ArrayInfo, TensorSource

    family = experts_family({"model_type": model_type})
    rng = np.random.default_rng(seed)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    tensors = {}
    moe = "block_sparse_moe" if model_type == "mixtral" else "mlp"
    for i in range(layers):
        tensors[f"model.layers.{i}.{moe}.gate.weight"] = (experts, hidden)
        for e in range(experts):
            for fused in family.fused:
                for pattern in fused.experts:
                    shape = (inner, hidden) if "down" not in pattern and "w2" not in pattern else (
                        hidden, inner)  # fmt: skip
                    tensors[f"model.layers.{i}." + pattern.replace("{e}", str(e))] = shape
    arrays = {
        n: rng.standard_normal(s).astype(np.float32).astype(np_dtype) for n, s in tensors.items()
    }

    class Arrays(TensorSource):
        def __init__(self, values):
            self.values = values
            self.infos = {n: ArrayInfo(a.shape, np.dtype(a.dtype).name) for n, a in values.items()}

        def read(self, name):
            return self.values[name]

    fused = FusedView(Arrays(arrays), family)
    assert all(
        ".experts." not in n or n.endswith(("gate_up_proj", "down_proj")) for n in fused.infos
    )
    back = PerExpertView(Arrays({n: fused.array(n) for n in fused.infos}), family)
    assert sorted(back.infos) == sorted(arrays)
    for name, a in arrays.items():
        b = back.array(name)
        assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes(), name
    again = FusedView(back, family)
    for name in fused.infos:
        assert again.array(name).tobytes() == fused.array(name).tobytes(), name


def test_a_fused_output_with_a_manifest_verifies_alone(moe, tmp_path) -> None:
    """``--fused-experts --manifest``: the manifest lists the fused tensors as written,
    and ``verify`` of the directory alone holds them against it; a per-expert and a
    fused directory of one model compare equal."""
    name, _, root = moe
    out = tmp_path / "out"
    bridge.convert(root / "per", out, format="hf", fused_experts=True, manifest=True)
    report = bridge.verify(out)
    assert report.ok and report.compared == len(_tensors(root / "fused")), report.lines()
    assert bridge.verify(root / "per", root / "fused").ok


STACKS = {
    "qwen3_moe": "model.layers.{i}.mlp.experts",
    "qwen2_moe": "model.layers.{i}.mlp.experts",
    "mixtral": "model.layers.{i}.block_sparse_moe.experts",
}


def _leaves(item) -> dict:
    import jax

    tree = checkpoint.restore(item)
    return {
        "/".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v)
        for kp, v in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_experts_stack_under_their_layers_from_either_naming(moe, tmp_path) -> None:
    """``--stack model.layers --stack 'model.layers.{i}.mlp.experts'``: each expert weight
    is one ``(L, E, in, out)`` leaf (Qwen2-MoE, whose first layer is dense, stacks its
    experts alone: ``(E, in, out)`` a layer), the same from the per-expert and the fused
    directory, bit for bit; the item goes back per expert or fused as transformers 5
    wrote them."""
    name, model, root = moe
    dense_first = name == "qwen2_moe"
    stacks = ["--stack", STACKS[name], *([] if dense_first else ["--stack", "model.layers"])]
    items = {}
    for kind in ("per", "fused"):
        items[kind] = tmp_path / f"item-{kind}"
        assert main(["convert", str(root / kind), str(items[kind]), *stacks, "--quiet"]) == 0
    a, b = _leaves(items["per"]), _leaves(items["fused"])
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    up = "w3" if name == "mixtral" else "up_proj"
    key = f"params/model/layers/{'1/' if dense_first else ''}"
    key += f"{'block_sparse_moe' if name == 'mixtral' else 'mlp'}/experts/{up}/kernel"
    leaf = a[key][3] if dense_first else a[key][1, 3]  # (Layer 1's expert 3.)
    assert a[key].shape[-3] == 4 and (dense_first or a[key].shape[0] == 2)
    stored = next(
        n for n in _tensors(root / "per") if n.startswith("model.layers.1.") and f".3.{up}." in n
    )
    assert _arrays({stored: np.ascontiguousarray(leaf.T)})[stored] == _tensors(root / "per")[stored]
    for kind, extra in (("per", []), ("fused", ["--fused-experts"])):
        back = tmp_path / f"back-{kind}"
        assert main(["convert", str(items["fused"]), str(back), "--format", "hf", *extra,
                     "--quiet"]) == 0  # fmt: skip
        _same(_tensors(back), _tensors(root / kind))


def test_experts_stack_alone_is_one_leaf_a_layer(tmp_path) -> None:
    """``--stack 'model.layers.{i}.mlp.experts'`` alone: an ``(E, ...)`` leaf per layer;
    a layer missing an expert is one line naming it."""
    family = experts_family({"model_type": "qwen3_moe"})
    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight": rng.standard_normal(
            (3, 5) if p != "down" else (5, 3)
        ).astype(np.float32)
        for i in range(2)
        for e in range(4)
        for p in ("gate", "up", "down")
    }
    save_file(tensors, tmp_path / "m.safetensors")
    item = tmp_path / "item"
    bridge.convert(tmp_path / "m.safetensors", item, stack="model.layers.{i}.mlp.experts")
    leaves = _leaves(item)
    assert leaves["params/model/layers/1/mlp/experts/gate_proj/kernel"].shape == (4, 5, 3)
    np.testing.assert_array_equal(
        leaves["params/model/layers/1/mlp/experts/gate_proj/kernel"][2],
        tensors["model.layers.1.mlp.experts.2.gate_proj.weight"].T,
    )
    assert family is not None
    del tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(tensors, tmp_path / "gap.safetensors")
    with pytest.raises(ValueError) as e:
        bridge.convert(
            tmp_path / "gap.safetensors", tmp_path / "gap", stack="model.layers.{i}.mlp.experts"
        )
    assert "'model.layers.1.mlp.experts.{e}.up_proj.weight' misses expert(s) [2]" in str(e.value)
    assert not (tmp_path / "gap").exists()


def test_verify_names_two_experts_whose_names_were_swapped(moe, tmp_path) -> None:
    """A copy of the directory whose experts 1 and 2 of layer 1 trade names: each of
    their tensors differs, and one line says they were swapped."""
    from safetensors.torch import save_file as save_torch

    name, _, root = moe
    per = load_file(root / "per" / "model.safetensors")
    swapped = dict(per)
    for n in per:
        if n.startswith("model.layers.1.") and ".experts.1." in n:
            other = n.replace(".experts.1.", ".experts.2.")
            swapped[n], swapped[other] = per[other], per[n]
    out = _copy(root / "per", tmp_path / "swapped")
    save_torch(swapped, out / "model.safetensors", metadata={"format": "pt"})
    report = bridge.verify(root / "per", out)
    assert not report.ok
    (line,) = [f for f in report.findings if f.kind == "swapped"]
    assert line.name.endswith(".experts.1") and "their names were swapped" in line.detail
    assert {f.kind for f in report.findings} == {"values", "swapped"}


def test_the_table_answers_for_either_naming_as_the_model_class_does(moe) -> None:
    """A per-expert (or fused) directory's ties and layer kinds come from the table
    generated from transformers, without torch, as the model class on the meta device
    gives them: the class holds its experts fused, and an expert's own module is none
    of its modules. (Qwen2-MoE's dense first layer is a layout the table's entry never
    saw: the model class answers there.)"""
    from bridge.hf.config import config_ties
    from bridge.layouts.rules import Rules

    name, _, root = moe
    config = json.loads((root / "per" / "config.json").read_text())
    for kind in ("per", "fused"):
        with bridge.open_source(root / kind) as source:
            stored = list(source.infos)
        table = config_ties(config, stored, Rules(), need_model=False)
        meta = config_ties(config, stored, Rules(), use_transformers=True)
        assert table.tabulated == (name != "qwen2_moe") and not meta.tabulated
        assert dict(table.ties) == dict(meta.ties)
        shared = set(table.layers) & set(meta.layers)
        assert {m: table.layers[m] for m in shared} == {m: meta.layers[m] for m in shared}
        assert sorted(stored, key=table.order) == sorted(stored, key=meta.order) or kind == "per"


def test_a_plain_orbax_item_of_stacked_experts_goes_back_with_stack(moe, tmp_path) -> None:
    """An item of stacked experts that plain Orbax saved (no naming record, no config)
    goes back to the per-expert directory with ``--config`` and the same ``--stack``
    prefixes: the experts' axis and each expert's kernel undone, bit for bit."""
    import orbax.checkpoint as ocp

    name, _, root = moe
    if name == "qwen2_moe":  # (A dense first layer: stacked experts alone, per layer.)
        stacks = ["--stack", STACKS[name]]
    else:
        stacks = ["--stack", "model.layers", "--stack", STACKS[name]]
    ours = tmp_path / "ours"
    assert main(["convert", str(root / "per"), str(ours), *stacks, "--quiet"]) == 0
    with ocp.StandardCheckpointer() as checkpointer:
        tree = checkpointer.restore(ours.resolve())
        checkpointer.save((tmp_path / "plain").resolve(), tree)
    back = tmp_path / "back"
    assert main(["convert", str(tmp_path / "plain"), str(back), "--format", "hf", *stacks,
                 "--config", str(root / "per" / "config.json"), "--quiet"]) == 0  # fmt: skip
    _same(_tensors(back), _tensors(root / "per"))


class _PerExpertMoE(torch.nn.Module):
    """Experts as PyTorch names them per expert: ``model.layers.{i}.mlp.experts.{e}.*``."""

    def __init__(self) -> None:
        super().__init__()
        experts = lambda: torch.nn.ModuleList(  # noqa: E731
            torch.nn.ModuleDict(
                {p: torch.nn.Linear(4, 4, bias=False) for p in ("gate_proj", "up_proj")}
            )
            for _ in range(3)
        )
        layer = lambda: torch.nn.ModuleDict({"mlp": torch.nn.ModuleDict({"experts": experts()})})  # noqa: E731
        self.model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([layer(), layer()])})


def test_an_optimizers_moments_for_stacked_experts_are_refused_in_one_line(
    tmp_path, capsys
) -> None:
    """Issue 36, training state: moments follow weights name for name; stacked (experts or
    layers), they are refused in one line, nothing written (docs/experts.md says so)."""
    model = _PerExpertMoE()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    run = tmp_path / "run.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, run)
    stacks = ("model.layers", "model.layers.{i}.mlp.experts")
    with pytest.raises(ValueError, match=r"stacked\) layers are not carried") as e:
        bridge.to_optax(
            (model, opt), optax.adamw(1e-2, weight_decay=0.01), rules=bridge.Rules(stacks=stacks)
        )
    assert "\n" not in str(e.value)
    args = ["convert", str(run), str(tmp_path / "item"), "--optimizer"]
    assert main([*args, "--stack", stacks[0], "--stack", stacks[1]]) == 2
    err = capsys.readouterr().err.strip()
    assert "--stack do not apply" in err and "\n" not in err
    assert not (tmp_path / "item").exists()
    params, _ = bridge.to_optax(
        (model, opt), optax.adamw(1e-2, weight_decay=0.01)
    )  # name for name: carried
    assert params.unique["params"]["model"]["layers"]["1"]["mlp"]["experts"]["2"]
