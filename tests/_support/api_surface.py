"""What packages' faces promise, read in a fresh interpreter: each one's ``__all__``, the
names it imports for the type checker (``if TYPE_CHECKING:``, with their homes), what it
holds right after import, and what each name is once used. ``python api_surface.py
PACKAGE...`` prints ``{package: ...}`` as JSON; the API tests compare what it finds
(``tests/conftest.py``'s ``api_surface``).

Every face is imported (and read) before any name of any of them is used, so what one
imports on first use cannot hide what another imports at import."""

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


def surfaces(packages: list[str]) -> dict[str, dict]:
    """Each package's face; ``packages`` are imported in order, each read at once (a
    later import may bind a subpackage, or use a name, on an earlier one)."""
    modules, at_import = {}, {}
    for package in packages:
        modules[package] = module = importlib.import_module(package)
        at_import[package] = sorted(n for n in vars(module) if not n.startswith("_"))
    frameworks = sorted(f for f in FRAMEWORKS if f in sys.modules)
    return {
        package: _surface(module, at_import[package], frameworks)
        for package, module in modules.items()
    }


def _surface(module: types.ModuleType, at_import: list[str], frameworks: list[str]) -> dict:
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
        # (A subpackage imported by name binds itself here, `__all__` or not.)
        "after": sorted(
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and (n in module.__all__ or not inspect.ismodule(v))
        ),
        "problems": problems,
        "frameworks_at_import": frameworks,
    }


if __name__ == "__main__":
    print(json.dumps(surfaces(sys.argv[1:])))
