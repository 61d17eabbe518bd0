"""The bridge's face: each name listed once with its home, ``__all__`` derived from it,
documented, and light to import -- read in a fresh interpreter."""

import inspect

import pytest

import bridge


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
