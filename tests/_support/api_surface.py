"""What a package's face promises, read in a fresh interpreter: its ``__all__``, the
names it imports for the type checker (``if TYPE_CHECKING:``, with their homes), and
what each name is once imported. ``python api_surface.py PACKAGE`` prints it as JSON;
the API tests compare what it finds (``tests/conftest.py``'s ``api_surface``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
import types


def _type_checking_names(module: types.ModuleType) -> dict[str, str]:
    """``{name: home module}`` of the ``from HOME import X as X`` under ``TYPE_CHECKING``."""
    tree = ast.parse(inspect.getsource(module))
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    for alias in stmt.names:
                        names[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    return names


FRAMEWORKS = ("torch", "jax", "orbax", "flax", "transformers")


def surface(package: str) -> dict:
    module = importlib.import_module(package)
    at_import = sorted(n for n in vars(module) if not n.startswith("_"))
    frameworks = sorted(f for f in FRAMEWORKS if f in sys.modules)
    checked = _type_checking_names(module)
    problems = []
    for name in module.__all__:
        try:
            value = getattr(module, name)
        except Exception as e:  # noqa: BLE001 -- reported, not raised
            problems.append(f"{name}: {type(e).__name__}: {e}")
            continue
        home = checked.get(name)
        if home is not None:
            home_module, _, attr = home.rpartition(".")
            try:
                expected = getattr(importlib.import_module(home_module), attr)
            except (ImportError, AttributeError):  # a subpackage: `from pkg import sub`
                expected = importlib.import_module(home)
            if value is not expected:
                problems.append(f"{name}: is not {home}")
        if callable(value) and not value.__doc__:
            problems.append(f"{name}: no docstring")
    return {
        "all": list(module.__all__),
        "type_checking": sorted(checked),
        "at_import": at_import,
        "after": sorted(n for n in vars(module) if not n.startswith("_")),
        "problems": problems,
        "frameworks_at_import": frameworks,
    }


if __name__ == "__main__":
    print(json.dumps(surface(sys.argv[1])))
