"""The suite's marks and skips.

Every test that starts a process carries the ``subprocess`` marker, and only those, so
that ``pytest -m "not subprocess"`` runs the in-process suite alone. A test starts one
where its code, a function or class of its module it names, a fixture it asks for (its
own module's or a ``conftest.py``'s, whatever that one calls in turn), or a function of
a script a fixture loads (``load_script``) calls ``subprocess``, ``multiprocessing``,
``os.system`` and their kin. Read from the source, the marks cannot drift from what the
tests do.

Every skip is reported at the end of the run (the root ``conftest.py``), one line per
reason: a feature this machine lacks is never silently untested.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Calls that start a process, by the dotted name they resolve to.
SPAWN_NAMES = {
    *(f"subprocess.{f}" for f in ("run", "Popen", "call", "check_call", "check_output")),
    *(f"subprocess.{f}" for f in ("getoutput", "getstatusoutput")),
    *(f"os.{f}" for f in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp")),
    "pty.spawn",
    "concurrent.futures.ProcessPoolExecutor",
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
}
SPAWN_PREFIXES = ("multiprocessing.", "os.exec", "os.spawn")


def _spawns(dotted: str) -> bool:
    return dotted in SPAWN_NAMES or dotted.startswith(SPAWN_PREFIXES)


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` of a name or attribute chain, its first name as the module imported it."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _is_subprocess_mark(node: ast.expr) -> bool:
    node = node.func if isinstance(node, ast.Call) else node
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "subprocess"
        and (isinstance(node.value, ast.Attribute) and node.value.attr == "mark")
    )


def _fixture_name(node: ast.FunctionDef) -> str | None:
    """The name a ``@pytest.fixture`` function is asked for by; ``None`` if it is none."""
    for deco in node.decorator_list:
        call = deco if isinstance(deco, ast.Call) else None
        target = call.func if call else deco
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            for kw in call.keywords if call else ():
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
            return node.name
    return None


@dataclass
class Module:
    """What one file's top-level functions and classes do, as far as processes go."""

    path: Path
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    defs: dict[str, ast.FunctionDef | ast.ClassDef] = field(default_factory=dict)
    fixtures: dict[str, str] = field(default_factory=dict)  # fixture name -> def name
    scripts: dict[str, Path] = field(default_factory=dict)  # fixture name -> script
    spawning: set[str] = field(default_factory=set)  # def names

    @classmethod
    def read(cls, path: Path) -> Module:
        module = cls(path, ast.parse(path.read_text(), str(path)))
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):  # (``import os`` binds ``os`` to itself.)
                module.aliases |= {a.asname: a.name for a in node.names if a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    module.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.defs[node.name] = node
                name = _fixture_name(node) if not isinstance(node, ast.ClassDef) else None
                if name is not None:
                    module.fixtures[name] = node.name
                    script = _loaded_script(node)
                    if script is not None:
                        module.scripts[name] = script
        return module

    def direct(self, node: ast.AST) -> bool:
        """Whether ``node`` holds a call that starts a process."""
        return any(
            isinstance(n, ast.Call) and (d := _dotted(n.func, self.aliases)) and _spawns(d)
            for n in ast.walk(node)
        )

    def analyse(self, fixtures: set[str], scripts: dict[str, set[str]]) -> None:
        """Fills :attr:`spawning` with the defs that start a process, and ``fixtures``
        (those visible here that do) with this module's that do; ``scripts``: for each
        fixture that loads a script, the functions of it that do."""
        changed = True
        while changed:
            changed = False
            for name, node in self.defs.items():
                if name not in self.spawning and self.starts(node, fixtures, scripts):
                    self.spawning.add(name)
                    fixtures |= {f for f, d in self.fixtures.items() if d == name}
                    changed = True

    def starts(self, node: ast.AST, fixtures: set[str], scripts: dict[str, set[str]]) -> bool:
        if self.direct(node):
            return True
        if not isinstance(node, ast.ClassDef):  # The fixtures it asks for.
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if fixtures & {a.arg for a in args}:
                return True
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in self.spawning:
                return True
            if (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.attr in scripts.get(n.value.id, ())
            ):
                return True
        return False


def _loaded_script(node: ast.AST) -> Path | None:
    """The script a fixture returns with ``load_script("PATH")``, if it does."""
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id == "load_script"
            and n.args
            and isinstance(n.args[0], ast.Constant)
        ):
            return ROOT / n.args[0].value
    return None


def _script_spawning(path: Path) -> set[str]:
    script = Module.read(path)
    script.analyse(set(), {})
    return script.spawning


@dataclass(frozen=True)
class Found:
    """A test function: whether it starts a process, whether it is marked so."""

    name: str
    starts: bool
    marked: bool


def _conftests(path: Path) -> list[Path]:
    """The ``conftest.py`` files whose fixtures a test module under ``tests/`` sees,
    outermost first."""
    folders = [p for p in reversed(path.parents) if p == TESTS or TESTS in p.parents]
    return [f / "conftest.py" for f in folders if (f / "conftest.py").is_file()]


def _tests_of(path: Path) -> list[Found]:
    fixtures: set[str] = set()
    scripts: dict[str, set[str]] = {}
    for conftest in [*_conftests(path), path]:
        module = Module.read(conftest)
        scripts |= {name: _script_spawning(s) for name, s in module.scripts.items()}
        module.analyse(fixtures, scripts)
    module_marked = any(
        _is_subprocess_mark(mark)
        for node in module.tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        for mark in (
            node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
        )
    )
    found = []
    for name, node in module.defs.items():
        if isinstance(node, ast.ClassDef) or not name.startswith("test"):
            continue
        marked = module_marked or any(_is_subprocess_mark(d) for d in node.decorator_list)
        found.append(Found(name, name in module.spawning, marked))
    return found


MODULES = sorted(TESTS.rglob("test_*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_a_test_is_marked_subprocess_exactly_when_it_starts_a_process(path):
    found = _tests_of(path)
    unmarked = [t.name for t in found if t.starts and not t.marked]
    assert not unmarked, f"start a process: mark them @pytest.mark.subprocess: {unmarked}"
    needless = [t.name for t in found if t.marked and not t.starts]
    assert not needless, f"start no process, yet are marked subprocess: {needless}"


def test_no_test_module_starts_a_process_as_it_is_imported():
    """(Collection cannot be deselected by a marker.)"""
    for path in MODULES:
        module = Module.read(path)
        top = [n for n in module.tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert not any(module.direct(n) for n in top), path


def test_the_reading_sees_each_way_a_test_starts_a_process(tmp_path):
    """The reading itself: a direct call, one through a helper, a class and a fixture
    (the module's own and a conftest's), and a test that starts none."""
    folder = tmp_path / "tests" / "layer"
    folder.mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text(
        "import pytest, subprocess as sp\n"
        "@pytest.fixture\ndef spawner():\n    def go():\n        sp.run(['true'])\n    return go\n"
    )
    (folder / "test_x.py").write_text(
        "import os, pytest\nfrom subprocess import Popen\n"
        "def _helper():\n    Popen(['true'])\n"
        "class Runner:\n    def go(self):\n        os.system('true')\n"
        "@pytest.fixture(name='proc')\ndef _proc():\n    _helper()\n"
        "def test_direct():\n    os.fork()\n"
        "def test_helper():\n    _helper()\n"
        "def test_class():\n    Runner().go()\n"
        "def test_fixture(proc):\n    pass\n"
        "def test_conftest(spawner):\n    pass\n"
        "def test_reduce():\n    return (os.system, ('true',))\n"
    )
    module = Module.read(folder / "test_x.py")
    conftest = Module.read(tmp_path / "tests" / "conftest.py")
    fixtures: set[str] = set()
    conftest.analyse(fixtures, {})
    module.analyse(fixtures, {})
    assert fixtures == {"spawner", "proc"}
    tests = {n for n in module.defs if n.startswith("test")}
    assert tests & module.spawning == tests - {"test_reduce"}


def test_every_skip_is_reported_one_line_per_reason(request):
    """Skips of tests and of whole modules, under xdist too (a reason as a list)."""
    root = next(
        p
        for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) == str(ROOT / "conftest.py")
    )
    where = ("tests/x.py", 1)

    def skipped(nodeid: str, reason: str, *, as_list: bool = False) -> pytest.TestReport:
        longrepr = ["tests/x.py", 1, reason] if as_list else ("tests/x.py", 1, reason)
        return pytest.TestReport(nodeid, where, {}, "skipped", longrepr, "setup")

    reports = [
        skipped("tests/x.py::test_a", "Skipped: cold reads: on tmpfs"),
        pytest.CollectReport("tests/y.py", "skipped", ("y", 1, "could not import 'z'"), []),
        skipped("tests/x.py::test_b", "Skipped: cold reads: on tmpfs", as_list=True),
    ]
    lines: list[str] = []
    reporter = type(
        "Reporter",
        (),
        {
            "stats": {"skipped": reports},
            "write_sep": lambda self, sep, title: lines.append(f"{sep} {title}"),
            "write_line": lambda self, line: lines.append(line),
        },
    )()
    root.pytest_terminal_summary(reporter)
    assert lines == [
        "= not tested in this run",
        "2 skipped: cold reads: on tmpfs (first: tests/x.py::test_a)",
        "1 skipped: could not import 'z' (first: tests/y.py)",
    ]
    lines.clear()
    reporter.stats = {"passed": []}
    root.pytest_terminal_summary(reporter)
    assert lines == []
