"""The public surface: `__all__` is complete and importable, and torch stays out."""

import subprocess
import sys
import types

import pytest

import jaxshare


def test_all_names_resolve_and_are_documented():
    for name in jaxshare.__all__:
        obj = getattr(jaxshare, name)
        assert obj.__doc__, f"jaxshare.{name} has no docstring"


def test_all_is_sorted_and_complete():
    assert list(jaxshare.__all__) == sorted(jaxshare.__all__)
    public = {
        n
        for n, v in vars(jaxshare).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    } - {"annotations", "Any"}
    assert public <= set(jaxshare.__all__)


def test_import_does_not_pull_in_torch_or_orbax():
    code = (
        "import sys, jaxshare; "
        "print('torch' in sys.modules, 'orbax.checkpoint' in sys.modules, 'bridge' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        jaxshare.no_such_name  # noqa: B018
