"""Every code block of README.md and docs/*.md runs, and what it shows is checked.

A page's blocks run in order in a fresh temporary working directory (with
``tests/data`` linked to the repository's fixtures), so later blocks build on
the files and names earlier ones made:

- ```python: executed in one namespace per page. Every ``__call__`` a page
  defines (an NNX or linen model) must have run by the end of the page: models
  in the docs are callable, and the docs call them.
- ```text / ```json straight after a python block (nothing but blank lines
  between): that block's stdout. Text is compared as doctest does with
  ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``; JSON as parsed values.
- ```console: ``$ COMMAND`` lines run in bash in the page's directory, with
  ``jaxshare`` on the ``PATH`` running this checkout (``python -m
  jaxshare.cli``); the lines after a command, up to the next ``$``, are its
  output (stdout and stderr), compared as text above. A command must exit 0,
  or with N where it ends in ``# exit status N``.
- ```sh / ```bash: one command per line, no output shown, exit 0.
- ``make TARGET`` and ``pip install ...`` lines, in any shell block, set up a
  machine and are not run here; instead ``make -n TARGET`` must succeed in the
  repository and run what the docs say it runs (``SETUP_TARGETS``), and a pip
  extra must exist in pyproject.toml.
- ``<!-- docs-test: file PATH -->`` before a block: the block is the content of
  PATH (in the page's directory) as the blocks before left it.
- ``<!-- docs-test: quote PATH -->`` before a block: the block quotes the
  repository file PATH (its lines appear there, in order), so it is not run.

Nothing is skipped: a fence of any other kind, or an unknown marker, fails.
"""

from __future__ import annotations

import doctest
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The repository root, wherever under tests/ this file lives.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: What ``make -n TARGET`` must mention for each target the docs may name.
SETUP_TARGETS = {
    "demo": "jaxshare demo",
    "test": "pytest",
    "lint": "ruff check",
    "bench": "benchmarks/",
    "fixtures": "make_fixtures.py",
}
_MARKER = re.compile(r"<!--\s*docs-test:\s*(\w+)\s+(\S+)\s*-->")
_EXIT = re.compile(r"#\s*exit status (\d+)\s*$")
_OUTPUT_KINDS = ("text", "json")
_SHELL_KINDS = ("console", "sh", "bash")


@dataclass
class Block:
    kind: str
    code: str
    line: int  # 1-based line of the opening fence
    marker: tuple[str, str] | None
    follows_python: bool  # only blank lines since the previous block, a python one


def parse(text: str, where: str) -> list[Block]:
    """The fenced blocks of a Markdown page, with their markers."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i, prose = 0, []
    while i < len(lines):
        fence = re.match(r"^(`{3,})\s*(\S*)\s*$", lines[i])
        if not fence:
            prose.append(lines[i])
            i += 1
            continue
        start, ticks, kind = i, fence.group(1), fence.group(2)
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{where}:{start + 1}: unclosed code block"
        i += 1
        between = "\n".join(prose)
        markers = _MARKER.findall(between)
        assert len(markers) <= 1, f"{where}:{start + 1}: several docs-test markers"
        assert "docs-test" not in _MARKER.sub("", between), (
            f"{where}:{start + 1}: a docs-test marker this test does not understand"
        )
        blocks.append(
            Block(
                kind=kind,
                code="\n".join(body) + "\n",
                line=start + 1,
                marker=markers[0] if markers else None,
                follows_python=bool(blocks) and blocks[-1].kind == "python" and not between.strip(),
            )
        )
        prose = []
    return blocks


def _same(expected: str, got: str, where: str) -> None:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    if not doctest.OutputChecker().check_output(expected, got, flags):
        raise AssertionError(f"{where}: output differs.\nexpected:\n{expected}\ngot:\n{got}")


def _same_json(expected: str, got: str, where: str) -> None:
    try:
        values = [json.loads(got)] if got.strip() else []
    except json.JSONDecodeError:  # Several documents, one per line.
        values = [json.loads(line) for line in got.splitlines() if line.strip()]
    got_value = values[0] if len(values) == 1 else values
    assert json.loads(expected) == got_value, f"{where}: JSON differs: {got!r}"


def _check_setup(command: str, where: str) -> None:
    """``make TARGET`` and ``pip install`` are checked, not run (see the module docstring)."""
    words = shlex.split(command, comments=True)
    if words[0] == "make":
        assert len(words) == 2 and words[1] in SETUP_TARGETS, f"{where}: unknown {command!r}"
        dry = subprocess.run(
            ["make", "-n", words[1]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert dry.returncode == 0, f"{where}: `make -n {words[1]}` failed: {dry.stderr}"
        assert SETUP_TARGETS[words[1]] in dry.stdout, f"{where}: `make {words[1]}` runs {dry}"
        return
    assert words[:2] == ["pip", "install"], f"{where}: {command!r}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in words[2:]:
        name, _, extras = spec.partition("[")
        assert name == project["name"], f"{where}: {spec!r} is not this project"
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in project["optional-dependencies"], f"{where}: no extra {extra!r}"


def _is_setup(command: str) -> bool:
    return command.startswith(("make ", "pip install "))


class Page:
    """Runs one page's blocks in ``cwd``; ``checked`` lists what each block did."""

    def __init__(self, path: Path, cwd: Path, bin_dir: Path, demo: Any = None) -> None:
        self.path, self.cwd, self.demo = path, cwd, demo
        self.where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        self.namespace: dict = {"__name__": "docs"}
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "COLUMNS": "80",  # argparse wraps --help to the terminal's width
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.checked: list[str] = []
        self.models: dict = {}  # __call__ code objects defined on the page -> called?
        self.last_stdout: str | None = None

    def run(self, blocks: list[Block]) -> None:
        tracer = sys.gettrace()
        sys.settrace(self._trace)
        try:
            for block in blocks:
                where = f"{self.where}:{block.line}"
                self.checked.append(self._run(block, where))
        finally:
            sys.settrace(tracer)
        uncalled = [f"{c.co_qualname} ({c.co_filename})" for c, n in self.models.items() if not n]
        assert not uncalled, f"{self.where}: models defined but never called: {uncalled}"

    def _trace(self, frame, event, arg):
        if frame.f_code in self.models:
            self.models[frame.f_code] = True
        return None

    def _collect_models(self, code) -> None:
        for const in code.co_consts:
            if hasattr(const, "co_consts"):
                if const.co_name == "__call__":
                    self.models.setdefault(const, False)
                self._collect_models(const)

    def _run(self, block: Block, where: str) -> str:
        stdout, self.last_stdout = self.last_stdout, None
        if block.marker is not None:
            what, target = block.marker
            if what == "file":
                got = (self.cwd / target).read_text()
                (_same_json if block.kind == "json" else _same)(block.code, got, where)
                return f"file {target}"
            assert what == "quote", f"{where}: unknown marker {what!r}"
            source = (ROOT / target).read_text().splitlines()
            rest = iter(line.strip() for line in source)
            for line in filter(None, (x.strip() for x in block.code.splitlines())):
                assert any(line == s for s in rest), f"{where}: {line!r} is not in {target}"
            return f"quote {target}"
        if block.kind == "python":
            code = compile(block.code, f"{where}", "exec")
            self._collect_models(code)
            out = io.StringIO()
            try:
                with redirect_stdout(out):
                    exec(code, self.namespace)
            except Exception as e:
                raise AssertionError(f"{where}: python block failed:\n{block.code}") from e
            self.last_stdout = out.getvalue()
            return "python"
        if block.kind in _OUTPUT_KINDS:
            assert block.follows_python and stdout is not None, (
                f"{where}: a ```{block.kind} block must follow a python block (its output) "
                "or carry a `docs-test: file PATH` marker"
            )
            (_same_json if block.kind == "json" else _same)(block.code, stdout, where)
            return f"output of python ({block.kind})"
        assert block.kind in _SHELL_KINDS, f"{where}: a ```{block.kind} block cannot be run"
        for command, expected in self._commands(block):
            if _is_setup(command):
                _check_setup(command, where)
                continue
            status = _EXIT.search(command)
            want = int(status.group(1)) if status else 0
            ran = _in_process(command, self.cwd, self.demo)
            if ran is None:
                result = subprocess.run(
                    ["bash", "-c", command],
                    cwd=self.cwd,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    check=False,
                )
                ran = result.returncode, result.stdout
            status_got, output = ran
            assert status_got == want, (
                f"{where}: `{command}` exited {status_got}, not {want}:\n{output}"
            )
            if expected is not None:
                _same(expected, output, f"{where}: `{command}`")
        return block.kind

    @staticmethod
    def _commands(block: Block) -> list[tuple[str, str | None]]:
        """``(command, expected output or None)`` per command of a shell block."""
        out: list[tuple[str, list[str]]] = []
        for line in block.code.splitlines():
            if block.kind == "console":
                if line.startswith("$ "):
                    out.append((line[2:], []))
                else:
                    assert out, f"a console block must start with `$ `: {line!r}"
                    out[-1][1].append(line)
            elif line.strip() and not line.lstrip().startswith("#"):
                out.append((line.strip(), []))
        return [(c, "\n".join(lines) + "\n" if any(lines) else None) for c, lines in out]


#: Shell syntax beyond words, quotes and ``$PWD``: such a command runs in bash.
_SHELL_SYNTAX = re.compile(r"[|;&<>`(){}*?\\]|\$(?!PWD\b|\{PWD\})")


def _in_process(command: str, cwd: Path, demo: Any = None) -> tuple[int, str] | None:
    """Runs a plain ``jaxshare ARGS`` command in this process, as the shim would run
    it in a new one (its exit status, stdout and stderr together), saving the
    interpreter and imports per command; ``None`` for anything else. ``jaxshare
    demo`` is the session's one run of it (the ``demo`` fixture)."""
    words = shlex.split(command.replace("${PWD}", "$PWD"), comments=True)
    if not words or words[0] != "jaxshare" or _SHELL_SYNTAX.search(command.split("#")[0]):
        return None
    if words[1:2] == ["demo"] and demo is not None:
        return demo.status, demo.output
    from jaxshare.cli import main

    argv = [w.replace("$PWD", str(cwd)) for w in words[1:]]
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps --help to the terminal's width
    with warnings.catch_warnings(), redirect_stdout(out), redirect_stderr(out):
        warnings.simplefilter("default")  # As in a fresh interpreter, not pytest's errors.
        try:
            status = main(argv)
        except SystemExit as e:  # argparse: --help, usage errors.
            status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        finally:
            if columns is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = columns
    return status, out.getvalue()


@pytest.fixture
def bin_dir(tmp_path_factory) -> Path:
    """A directory holding a ``jaxshare`` that runs this checkout's CLI."""
    path = tmp_path_factory.mktemp("bin")
    shim = path / "jaxshare"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m jaxshare.cli "$@"\n')
    shim.chmod(0o755)
    return path


def run_page(path: Path, cwd: Path, bin_dir: Path, demo: Any = None) -> Page:
    (cwd / "tests").mkdir()
    (cwd / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    blocks = parse(path.read_text(), path.name)
    page = Page(path, cwd, bin_dir, demo)
    old = Path.cwd()
    os.chdir(cwd)
    try:
        page.run(blocks)
    finally:
        os.chdir(old)
    assert len(page.checked) == len(blocks)
    return page


@pytest.mark.subprocess
@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_page_runs_and_shows_what_it_prints(path, tmp_path, bin_dir, request):
    (tmp_path / "cwd").mkdir()
    # The page's `jaxshare demo` is the session's one run of the demo.
    demo = request.getfixturevalue("demo") if "jaxshare demo" in path.read_text() else None
    page = run_page(path, tmp_path / "cwd", bin_dir, demo)
    assert page.checked, f"{path.name} has no code block"


def test_the_readme_is_the_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in text, f"README.md does not link docs/{page.name}"
    for cmd in ("make demo", "make test"):
        assert cmd in text


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_the_architecture_page_names_every_module():
    """docs/architecture.md says where each concept lives: a module it does not name is
    one a contributor cannot find, and a name it gives that is no module is stale."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = {
        str(p.relative_to(ROOT))
        for pkg in ("jaxshare", "bridge")
        for p in (ROOT / pkg).rglob("*.py")
    }
    named = set(re.findall(r"`((?:jaxshare|bridge)/[\w/]+\.py)`", page))
    assert sorted(modules - named) == [], "modules the page does not name"
    assert sorted(named - modules) == [], "names on the page that are no module"


def test_the_formats_page_documents_every_name_of_jaxshare_formats():
    import jaxshare.formats

    page = (ROOT / "docs" / "formats.md").read_text()
    undocumented = [n for n in jaxshare.formats.__all__ if f"`{n}" not in page]
    assert undocumented == []


@pytest.mark.parametrize(
    "path", [*PAGES, ROOT / "benchmarks" / "README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_and_named_files_exist(path):
    text = path.read_text()
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        linked = path.parent / target if target else path
        assert linked.exists(), f"{path.name} links {target}, which is missing"
        if anchor:
            assert anchor in _anchors(linked), (
                f"{path.name} links {target}#{anchor}: no such heading"
            )
    for script in re.findall(r"\b((?:benchmarks|examples)/\w+\.py)\b", text):
        assert (ROOT / script).is_file(), f"{path.name} names {script}, which is missing"


# -- the checker itself can fail -----------------------------------------------------------

BAD_PAGES = {
    "wrong output": "```python\nprint(1)\n```\n\n```text\n2\n```\n",
    "wrong console output": "```console\n$ echo hello\ngoodbye\n```\n",
    "wrong exit status": "```console\n$ false\n```\n",
    "failing python": "```python\nassert 1 == 2\n```\n",
    "uncalled model": "```python\nclass M:\n    def __call__(self):\n        pass\n```\n",
    "output with no python": "```text\nhello\n```\n",
    "unknown kind": "```ruby\nputs 1\n```\n",
    "unknown marker": "<!-- docs-test: skip x -->\n```python\npass\n```\n",
    "unknown make target": "```sh\nmake install\n```\n",
    "unknown extra": "```sh\npip install 'jaxshare[nope]'\n```\n",
    "misquoted": "<!-- docs-test: quote Makefile -->\n```python\nnot in the Makefile\n```\n",
}


@pytest.mark.subprocess
@pytest.mark.parametrize("case", sorted(BAD_PAGES))
def test_a_page_that_does_not_hold_fails(case, tmp_path, bin_dir):
    page = tmp_path / "page.md"
    page.write_text(BAD_PAGES[case])
    (tmp_path / "cwd").mkdir()
    with pytest.raises(AssertionError):
        run_page(page, tmp_path / "cwd", bin_dir)


@pytest.mark.subprocess
def test_a_page_that_holds_passes(tmp_path, bin_dir):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nclass M:\n    def __call__(self):\n        return 1\n\n"
        "assert M()() == 1\nprint({'a': [1, 2]})\n```\n\n```text\n{'a': [1, ...]}\n```\n\n"
        "```console\n$ printf '{\"x\": 1}' > f.json; echo made\nmade\n"
        "$ exit 3  # exit status 3\n```\n\n"
        '<!-- docs-test: file f.json -->\n```json\n{"x": 1}\n```\n\n'
        "```sh\nmake test\npip install 'jaxshare[torch]'\n```\n\n"
        "<!-- docs-test: quote Makefile -->\n```make\ndemo: $(STAMP)\n\t$(BIN)/jaxshare demo\n```\n"
    )
    (tmp_path / "cwd").mkdir()
    checked = run_page(page, tmp_path / "cwd", bin_dir).checked
    assert checked == [
        "python",
        "output of python (text)",
        "console",
        "file f.json",
        "sh",
        "quote Makefile",
    ]
