"""The bridge's public surface: ``__all__`` complete, documented, and light to import."""

import inspect
import subprocess
import sys

import bridge


def test_all_names_resolve_and_are_documented():
    for name in bridge.__all__:
        obj = getattr(bridge, name)
        if callable(obj):
            assert obj.__doc__, f"bridge.{name} has no docstring"
    assert all(isinstance(rule, bridge.Rule) for rule in bridge.DEFAULT_RULES)
    assert set(bridge.DEFAULT_LAYERS.values()) >= {
        r for rule in bridge.DEFAULT_RULES for r in rule.layers
    }


def test_all_is_sorted_and_complete():
    assert list(bridge.__all__) == sorted(bridge.__all__)
    public = {n for n in vars(bridge) if not n.startswith("_")}
    assert public == set(bridge.__all__)


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
    ):
        params = list(inspect.signature(getattr(bridge, name)).parameters.values())
        assert params[0].kind is inspect.Parameter.POSITIONAL_ONLY, name
        assert all(p.kind in (p.POSITIONAL_ONLY, p.KEYWORD_ONLY) for p in params), name


def test_import_bridge_does_not_pull_in_orbax():
    code = "import sys, bridge; print('orbax.checkpoint' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
