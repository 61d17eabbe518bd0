"""The bridge's face: each name listed once with its home, ``__all__`` derived from it,
documented, and light to import -- read in a fresh interpreter."""

import inspect
import re

import numpy as np
import pytest

import bridge
import jaxshare.formats


@pytest.mark.subprocess
def test_the_face_lists_each_name_with_its_home(api_surface):
    face = api_surface("bridge")
    assert face["problems"] == []
    assert face["all"] == sorted(face["all"])
    assert set(face["type_checking"]) == set(face["all"])
    assert face["at_import"] == []
    assert set(face["after"]) == set(face["all"])


@pytest.mark.subprocess
def test_importing_the_bridge_imports_no_framework(api_surface):
    assert api_surface("bridge")["frameworks_at_import"] == []


def test_the_default_rules_name_known_layer_kinds():
    assert all(isinstance(rule, bridge.Rule) for rule in bridge.DEFAULT_RULES)
    assert set(bridge.DEFAULT_LAYERS.values()) >= {
        r for rule in bridge.DEFAULT_RULES for r in rule.layers
    }


def test_tree_arguments_are_positional_only_and_options_keyword_only():
    for name in (
        "to_flax",
        "to_torch",
        "shared_params",
        "flax_alias_map",
        "torch_alias_map",
        "save_safetensors",
        "load_safetensors",
        "load_torch",
        "convert",
        "inspect",
        "flax_plan",
        "torch_plan",
        "check",
        "verify",
        "to_optax",
        "from_optax",
    ):
        params = list(inspect.signature(getattr(bridge, name)).parameters.values())
        assert params[0].kind is inspect.Parameter.POSITIONAL_ONLY, name
        assert all(p.kind in (p.POSITIONAL_ONLY, p.KEYWORD_ONLY) for p in params), name


def _hf_directory(tmp_path):
    from safetensors.numpy import save_file

    from bridge.hf.directory import HFDirectory

    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    return HFDirectory(tmp_path)


#: ``(old, new, what the warning says)``: each name the restructure changed still
#: works from its old place, says what it is now, and is the new thing.
RENAMED = [
    (lambda _: bridge.FlaxPlan, lambda _: bridge.FlaxPlacement, "`bridge.FlaxPlan` is now"),
    (lambda _: bridge.TorchPlan, lambda _: bridge.TorchNaming, "`bridge.TorchPlan` is now"),
    (
        lambda _: jaxshare.formats.HFLayout,
        lambda _: jaxshare.formats.HFWeights,
        "`jaxshare.formats.HFLayout` is now",
    ),
    (
        lambda _: jaxshare.formats.hf_layout,
        lambda _: jaxshare.formats.hf_weights,
        "`jaxshare.formats.hf_layout` is now",
    ),
    (lambda _: bridge.LAYOUTS["maxtext"].reshapes, lambda _: True, "`Layout.reshapes` is now"),
    (lambda _: bridge.LAYOUTS["jaxshare"].reshapes, lambda _: False, "`Layout.reshapes` is now"),
    (lambda _: bridge.Rule("w", "k", axes="kernel").layout, lambda _: "kernel", "`Rule.layout`"),
    (lambda d: _hf_directory(d).layout, lambda d: _hf_directory(d).weights, "`HFDirectory.layout`"),
]


@pytest.mark.parametrize(("old", "new", "says"), RENAMED, ids=[r[2] for r in RENAMED])
def test_an_old_name_still_works_and_says_what_it_is_now(old, new, says, tmp_path):
    with pytest.warns(DeprecationWarning, match=re.escape(says)):
        value = old(tmp_path)
    assert value == new(tmp_path)
