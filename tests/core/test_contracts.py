"""The contracts cannot drift from the tree.

The import-linter contracts in ``pyproject.toml`` name packages, never modules: every
module of ``jaxshare`` and ``bridge`` lies in exactly one layer, every room of the
bridge in its rooms' order, and every module that imports torch is one the torch
contract names as a torch home. And no private name (``_name``) crosses a module
boundary: none is imported from another module, and none of a module's private
attributes is read by another one.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def _modules(*packages: str) -> dict[str, Path]:
    """``{dotted name: file}`` of every module under ``packages``."""
    out = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules("jaxshare", "bridge")


def _contract(prefix: str) -> dict:
    return next(c for c in CONTRACTS if c["name"].startswith(prefix))


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _entries(layers: list[str]) -> list[list[str]]:
    return [[name.strip() for name in layer.replace("|", ":").split(":")] for layer in layers]


def test_every_module_is_in_exactly_one_layer():
    layers = _entries(_contract("Layers:")["layers"])
    for module in MODULES:
        if module in ("jaxshare", "bridge"):
            continue  # (The top packages' faces.)
        homes = [i for i, layer in enumerate(layers) if any(_under(module, p) for p in layer)]
        assert len(homes) == 1, f"{module} is in layers {homes} of the layers contract"


def test_every_room_of_the_bridge_is_in_the_rooms_order():
    rooms = {name.split(".")[1] for name in MODULES if name.count(".") >= 1 and name != "bridge"}
    rooms = {r for r in rooms if (ROOT / "bridge" / r).is_dir()}
    layers = _entries(_contract("The bridge's rooms")["layers"])
    assert sorted(rooms) == sorted(p.split(".")[1] for layer in layers for p in layer)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` of every import in ``path`` that runs (nested ones
    too; not those for the type checker alone, under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    return found


def test_torch_is_imported_only_where_the_torch_contract_says():
    contract = _contract("Torch only where torch is")
    free = contract["source_modules"]
    homes = {
        rule.split(" -> ")[0]
        for rule in contract["ignore_imports"]
        if rule.split(" -> ")[1] in ("torch", "transformers")
    }
    for module, path in MODULES.items():
        if not any(_under(module, p) for p in free):
            continue
        takes = [
            line
            for imported, _, line in _imports(path)
            if imported.split(".")[0] in ("torch", "transformers", "deepspeed")
        ]
        assert not takes or module in homes, f"{module} imports torch at line {takes[0]}"


def test_the_torch_free_rooms_are_every_room_but_torch():
    free = set(_contract("Torch only where torch is")["source_modules"])
    rooms = {f"bridge.{p.name}" for p in (ROOT / "bridge").iterdir() if p.is_dir()}
    rooms -= {"bridge.__pycache__"}
    assert free == rooms - {"bridge.torch"}


#: Names with a leading underscore that are public API (a NamedTuple's).
PROTOCOL = frozenset({"_replace", "_fields", "_asdict", "_make", "_field_defaults"})


def _private_definitions(path: Path) -> set[str]:
    """The private names ``path`` defines: at the top, in its classes, on ``self``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - PROTOCOL


DEFINED = {module: _private_definitions(path) for module, path in MODULES.items()}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a chain of names and attributes; ``None`` for any other expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        above = _dotted(node.value)
        return None if above is None else f"{above}.{node.attr}"
    return None


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """``{local name: what it stands for, dotted}`` of every import in ``tree``:
    ``import a.b`` binds ``a`` to ``a``, ``import a.b as m`` binds ``m`` to ``a.b``, and
    ``from a.b import c as d`` binds ``d`` to ``a.b.c`` (a module or a name of one)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                head = a.name.split(".")[0]
                bound[a.asname or head] = a.name if a.asname else head
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _owner(receiver: ast.expr, bound: dict[str, str]) -> str | None:
    """The module of ours whose private name ``receiver._name`` reads: the deepest one
    ``receiver`` names through an import (``mapped``, ``jaxshare.io.mapped``, or a class
    taken from it); ``None`` where ``receiver`` is no imported name (a local, ``self``)."""
    head, _, rest = (_dotted(receiver) or "").partition(".")
    if head not in bound:
        return None
    full = f"{bound[head]}.{rest}" if rest else bound[head]
    deepest_first = [full.rsplit(".", n)[0] for n in range(full.count(".") + 1)]
    return next((name for name in deepest_first if name in MODULES), None)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_a_module_boundary(module):
    path = MODULES[module]
    ours = {m for m in MODULES if m != module}
    for imported, names, line in _imports(path):
        if imported in ours:
            private = [
                n
                for n in names
                if n.startswith("_") and not n.startswith("__") and f"{imported}.{n}" not in MODULES
            ]
            assert not private, f"{path}:{line} imports {private} from {imported}"
    # An attribute read through an import (``mapped._x``) is its module's; any other
    # (an object's, ``source._x``) is judged by name: another module's, none of ours.
    elsewhere = set().union(*(DEFINED[m] for m in ours)) - DEFINED[module]
    tree = ast.parse(path.read_text())
    bound = _imported_names(tree)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in PROTOCOL
        ):
            continue
        owner = _owner(node.value, bound)
        if owner is None:
            crosses = node.attr in elsewhere and _dotted(node.value) not in ("self", "cls")
        else:
            crosses = owner != module and f"{owner}.{node.attr}" not in MODULES
        if crosses:
            pytest.fail(
                f"{path}:{node.lineno} reads {node.attr}"
                + (f" of {owner}" if owner else ", another module's private name")
            )
