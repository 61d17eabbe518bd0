"""``layout="tunix"``: transformers 5 directories into google-tunix 0.1.7's own models
(Qwen3, Llama 3, Gemma 3 text) and back, compared with Tunix's loader and with
transformers 5, bit for bit; and a Tunix key mapping read as a table."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import jax
import numpy as np
import pytest
from flax import nnx

import bridge
from bridge.layouts.layout import Layout
from jaxshare.cli import main
from jaxshare.formats import SafetensorsFile
from jaxshare.internal import keypath_to_path, render, variable_value

#: (family, tied, Gemma 3's fused q/k/v): Qwen3 tied and not, Llama 3 tied as 3.2-1B is,
#: Gemma 3 with q alone and k/v stacked, and with q/k/v in one kernel, Qwen3-MoE (its
#: experts stacked on an axis of their own, as Tunix's `_stack_experts` stacks them).
CASES = [
    ("qwen3", True, False),
    ("qwen3", False, False),
    ("llama3", True, False),
    ("gemma3", True, False),
    ("gemma3", True, True),
    ("qwen3_moe", False, False),
]
IDS = ["qwen3-tied", "qwen3-untied", "llama3-tied", "gemma3", "gemma3-fused-qkv", "qwen3-moe"]


@pytest.fixture(scope="module")
def tm(load_script: Callable) -> ModuleType:
    """google-tunix's model modules and the tiny models (``tests/_support/tunix_models.py``)."""
    return load_script("tests/_support/tunix_models.py")


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request, tmp_path_factory, tm):
    family, tied, fused = request.param
    hf = tmp_path_factory.mktemp(family) / "hf"
    kw = {"fused_qkv": True} if fused else {}
    config = tm.write_hf_dir(hf, family, tied, **kw)
    return hf, config


def _flat(tree) -> dict[str, jax.Array]:
    leaves = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    return {render(keypath_to_path(kp)): variable_value(v) for kp, v in leaves}


def _hf_tensors(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with SafetensorsFile(file) as f:
            out.update({name: np.array(f.array(name)) for name in f.infos})
    return out


#: Tunix's model class of each family.
CLASSES = {"qwen3": "Qwen3", "qwen3_moe": "Qwen3", "llama": "Llama3", "gemma3_text": "Gemma3"}
FAMILIES = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "llama": "llama3", "gemma3_text": "gemma3"}


def test_to_flax_fills_a_sharded_tunix_model_as_tunix_loads_it(case, tm) -> None:
    """The state has exactly ``like``'s structure and shardings, and after
    ``nnx.update`` the model's every parameter is what Tunix's loader gives."""
    hf, config = case
    mesh = jax.make_mesh((4, 2), ("fsdp", "tp"))
    expected = tm.tunix_load(hf, config, mesh=mesh)
    like = nnx.state(expected, nnx.Param)
    state, _ = bridge.to_flax(hf, like=like, layout="tunix")
    got, want = _flat(state), _flat(like)
    assert list(got) == list(want)
    for path, array in got.items():
        w = want[path]
        assert array.dtype == w.dtype and array.shape == w.shape, path
        assert array.sharding == w.sharding, path
        assert np.array_equal(np.asarray(array), np.asarray(w)), path
    cls = getattr(
        getattr(tm.tunix(), FAMILIES[config["model_type"]]).model, CLASSES[config["model_type"]]
    )
    with nnx.use_eager_sharding(False), warnings.catch_warnings():
        for message in tm._LOAD_WARNINGS:
            warnings.filterwarnings("ignore", message, DeprecationWarning)
        model = nnx.eval_shape(lambda: cls(tm.tunix_config(config), rngs=nnx.Rngs(params=0)))
    nnx.update(model, state)
    for path, array in _flat(nnx.state(model, nnx.Param)).items():
        assert np.array_equal(np.asarray(array), np.asarray(want[path])), path


def test_an_item_restores_as_the_tunix_state_and_goes_back_to_transformers(
    case, tmp_path, tm
) -> None:
    import orbax.checkpoint as ocp
    import torch
    import transformers

    hf, config = case
    item = tmp_path / "item"
    assert main(["convert", str(hf), str(item), "--layout", "tunix", "--quiet"]) == 0
    with warnings.catch_warnings():  # (Orbax: no shardings given, so the saved ones.)
        warnings.filterwarnings("ignore", "Sharding info not provided", UserWarning)
        restored = ocp.PyTreeCheckpointer().restore(item)
    model = tm.tunix_load(hf, config)
    want = tm.flat_params(model)
    got = {
        render(keypath_to_path(kp)): np.asarray(v)
        for kp, v in jax.tree_util.tree_flatten_with_path(restored)[0]
    }
    assert sorted(got) == sorted(want)
    for path, w in want.items():
        assert got[path].dtype == w.dtype and np.array_equal(got[path], w), path
    # A tied head (Qwen3, Llama 3) is the item's implicit alias: recorded, never a leaf.
    groups = bridge.inspect(item).to_dict()["tie_groups"]
    implicit = [a for g in groups for a in g["aliases"] if a.get("implicit")]
    if config["model_type"] != "gemma3_text" and config.get("tie_word_embeddings"):
        assert [(a["path"], a["permute"]) for a in implicit] == [("lm_head/w", [1, 0])]
    else:
        assert implicit == []
    # The way back: from the item (with the config), and from the model in memory.
    back = tmp_path / "back"
    assert main(["convert", str(item), str(back), "--format", "hf", "--layout", "tunix",
                 "--config", str(hf / "config.json"), "--quiet"]) == 0  # fmt: skip
    from_model = tmp_path / "from_model"
    bridge.save_hf(from_model, model, layout="tunix", config=hf / "config.json")
    original = _hf_tensors(hf)
    for out in (back, from_model):
        assert _hf_tensors(out).keys() == original.keys()
        for name, x in _hf_tensors(out).items():
            assert x.dtype == original[name].dtype and np.array_equal(x, original[name]), name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
                out, dtype=torch.bfloat16, output_loading_info=True
            )
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        tied = config.get("tie_word_embeddings", config["model_type"] == "gemma3_text")
        assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied


def _trainer_module(name: str) -> ModuleType:
    """A module of Tunix's trainers, imported for this test only: taken out of
    ``sys.modules`` again, since the harness checks that its model modules import none
    of them (``test_tunix_harness.py``), whatever ran before in the process."""
    before = set(sys.modules)
    module = importlib.import_module(name)
    for loaded in set(sys.modules) - before:
        if loaded.startswith(("tunix.sft", "tunix.rl")):
            del sys.modules[loaded]
    return module


def test_a_tunix_training_checkpoint_goes_back_to_transformers(tmp_path, tm) -> None:
    """Tunix's own CheckpointManager writes the step (``model_params``: ``nnx.state``
    whole, every leaf ending in ``value``)."""
    checkpoint_manager = _trainer_module("tunix.sft.checkpoint_manager")
    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, "qwen3", True)
    model = tm.tunix_load(hf, config)
    manager = checkpoint_manager.CheckpointManager(str(tmp_path / "run"))
    assert manager.save(7, model, force=True)
    manager.close()
    step = tmp_path / "run" / "7" / "model_params"
    out = tmp_path / "out"
    assert main(["convert", str(step), str(out), "--format", "hf", "--layout", "tunix",
                 "--config", str(hf / "config.json"), "--quiet"]) == 0  # fmt: skip
    original = _hf_tensors(hf)
    written = _hf_tensors(out)
    assert written.keys() == original.keys()
    for name, x in written.items():
        assert np.array_equal(x, original[name]), name


@pytest.mark.parametrize(
    ("family", "fused"), [("qwen3", False), ("llama3", False), ("gemma3", False), ("gemma3", True)]
)
def test_a_tunix_key_mapping_is_the_shipped_table(tmp_path, family, fused, tm) -> None:
    """``Layout.from_tunix`` of Tunix's own ``_get_key_and_transform_mapping`` places
    every tensor where the shipped ``tunix`` layout does, with the same values."""
    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, family, True, **({"fused_qkv": True} if fused else {}))
    params = getattr(tm.tunix(), family).params
    mapping = params._get_key_and_transform_mapping(tm.tunix_config(config))
    layout = Layout.from_tunix(mapping, config=config)
    source = bridge.open_source(hf)
    ours = Layout.from_table(layout.table_list()[0]).view(source, None)
    shipped = bridge.LAYOUTS["tunix"].view(source, None)
    assert sorted(ours.infos) == sorted(shipped.infos)
    for path in shipped.infos:
        assert np.array_equal(ours.array(path), shipped.array(path)), path


def test_a_stored_head_the_config_ties_is_one_line(tmp_path, tm) -> None:
    import json

    from safetensors.numpy import save_file

    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, "qwen3", False)
    (hf / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = _hf_tensors(hf)
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning) as caught:
        source = bridge.open_source(hf)
        tree = bridge.LAYOUTS["tunix"].view(source, None)
    lines = [str(w.message) for w in caught if "lm_head.weight" in str(w.message)]
    assert len(lines) == 1 and "max |Δ| = " in lines[0], lines
    assert "lm_head/w" not in tree.infos


def test_a_like_whose_shapes_disagree_is_one_line(tmp_path, tm) -> None:
    hf = tmp_path / "hf"
    config = tm.write_hf_dir(hf, "qwen3", True)
    model = tm.tunix_load(hf, {**config})
    state = nnx.state(model, nnx.Param)
    state["final_norm"]["w"].set_value(np.zeros((3,), np.float32))
    with pytest.raises(ValueError) as e:
        bridge.to_flax(hf, like=state, layout="tunix")
    assert "makes the leaf 'final_norm/w' (64,), but `like` holds it as (3,)" in str(e.value)
    assert "\n" not in str(e.value)


def test_inspect_shows_the_entry_of_each_tensor(case, capsys) -> None:
    hf, config = case
    assert main(["inspect", str(hf), "--layout", "tunix"]) == 0
    out = capsys.readouterr().out
    assert "placed: model.norm.weight -> final_norm/" in out
    assert "(entry " in out
    if config.get("tie_word_embeddings", True):
        assert "implicit tie: lm_head.weight is computed from model.embed_tokens.weight" in out


def test_a_fused_qwen3_moe_directory_loads_as_the_per_expert_one(tmp_path, tm) -> None:
    """transformers 5's fused naming (``save_original_format=False``) fills Tunix's
    Qwen3-MoE with exactly what the per-expert directory does (Tunix reads only the
    latter), and the way back writes the per-expert names or, asked, the fused ones."""
    import torch
    import transformers

    per = tmp_path / "per"
    config = tm.write_hf_dir(per, "qwen3_moe", False)
    model = transformers.AutoModelForCausalLM.from_pretrained(per, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "fused", save_original_format=False)
    expected = tm.tunix_load(per, config)
    like = nnx.state(expected, nnx.Param)
    state, _ = bridge.to_flax(tmp_path / "fused", like=like, layout="tunix")
    want = _flat(like)
    assert {p: np.asarray(a).tobytes() for p, a in _flat(state).items()} == {
        p: np.asarray(a).tobytes() for p, a in want.items()
    }
    assert want["layers/0/mlp/gate_proj"].shape == (4, 64, 32)
    back = tmp_path / "back"
    bridge.save_hf(back, expected, layout="tunix", config=per / "config.json", fused_experts=True)
    fused = _hf_tensors(tmp_path / "fused")
    assert {n: a.tobytes() for n, a in _hf_tensors(back).items()} == {
        n: a.tobytes() for n, a in fused.items()
    }
