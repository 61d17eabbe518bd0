"""Fixtures shared by every layer's tests: the repository's folders, the scripts (examples,
benchmarks) as modules, and real multi-process ``jax.distributed`` runs on localhost.

Each layer folder (``core``, ``formats``, ``checkpoint``, ``bridge``, ``cli``) has its
own ``conftest.py`` for what only its tests use. Test modules never import each other
or a helper module: pytest imports them with ``--import-mode=importlib``, so two
layers may each have a ``test_api.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import runpy
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository's root: ``examples/``, ``benchmarks/`` and ``docs/`` are under it."""
    return ROOT


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """``load_script("examples/train_tied_lm.py")`` imports a script of the repository
    (an example, a benchmark) as the module ``examples_train_tied_lm``, once per session."""

    def load(path: str) -> ModuleType:
        name = "_".join(Path(path).with_suffix("").parts)
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
        return module

    return load


@dataclass(frozen=True)
class ExampleRun:
    """What an example's ``main`` returned and printed, and the one call of its ``run``
    it made on the way: its arguments and result."""

    status: Any
    args: tuple
    result: Any
    output: str


@pytest.fixture(scope="session")
def run_example() -> Callable[..., ExampleRun]:
    """``run_example(example, *argv)``: the example (a module from ``load_script``) run
    from its command line in this process, its ``main()`` with ``sys.argv`` set to
    ``[its file, *argv]``; what it prints kept, and its ``run``, which it must call
    once, watched."""

    def run_it(example: ModuleType, *argv: str) -> ExampleRun:
        calls: list[tuple[tuple, Any]] = []
        real_run = example.run

        def spy(*args: Any) -> Any:
            calls.append((args, real_run(*args)))
            return calls[-1][1]

        output = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(output):
            mp.setattr(example, "run", spy)
            mp.setattr(sys, "argv", [example.__file__, *argv])
            status = example.main()
        ((args, result),) = calls
        return ExampleRun(status, args, result, output.getvalue())

    return run_it


@pytest.fixture
def run_as_main(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``run_as_main("examples/x.py", *argv)``: the repository's script run as
    ``__main__`` with that command line; the code it exits with (it must exit)."""

    def run(path: str, *argv: str) -> Any:
        script = ROOT / path
        monkeypatch.setattr(sys, "argv", [str(script), *argv])
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(script), run_name="__main__")
        return exit_.value.code

    return run


@pytest.fixture(scope="session")
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """``run_python(code, *args, timeout=300)``: ``python -c CODE ARGS...`` in a fresh
    interpreter (what it imports, this process has not), its output kept as text; the
    test fails, with its stderr, where it exits with an error."""

    def run(code: str, *args: object, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr
        return done

    return run


#: The packages whose faces the API tests read: jaxshare's, then the bridge's.
FACES = (
    "jaxshare",
    "jaxshare.stream",
    "jaxshare.formats",
    "jaxshare.checkpoint",
    "jaxshare.internal",
    "jaxshare.cli",
    "bridge",
)


@pytest.fixture(params=FACES[:-1])
def jaxshare_face(request: pytest.FixtureRequest) -> str:
    """Each jaxshare package with a face, in turn: a test asking for it runs once per
    package (``api_surface`` reads them)."""
    return request.param


@pytest.fixture(scope="session")
def api_surface() -> Callable[[str], dict]:
    """``api_surface("jaxshare.formats")``: what the package's face promises and gives,
    read in a fresh interpreter (``tests/_support/api_surface.py``, every face of
    :data:`FACES` at once), so that nothing an earlier test imported fills a package in."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_support" / "api_surface.py"), *FACES],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    faces = json.loads(done.stdout)
    return faces.__getitem__


@pytest.fixture(scope="session")
def flat() -> Callable[[Any], dict[str, Any]]:
    """``flat(tree)``: ``{rendered path: leaf}``, in ``jax.tree_util`` flatten order."""
    import jax

    from jaxshare.internal import keypath_to_path, render

    def flatten(tree: Any) -> dict[str, Any]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {render(keypath_to_path(kp)): leaf for kp, leaf in leaves}

    return flatten


#: File systems whose files live in memory: no page of theirs ever leaves the page cache.
IN_MEMORY = {"tmpfs", "ramfs"}


@pytest.fixture(scope="session")
def drop_cache() -> Callable[[Path], Path]:
    """``drop_cache(path)``: ``path`` written to the disk and out of the page cache,
    as a cold input is; returns ``path``.

    Skips the test (reported at the end of the run) where no file can leave the page
    cache: without ``posix_fadvise``, or on a file system in memory. On Linux, a file
    on a disk's file system always can, once written back and no longer mapped: one
    the kernel still keeps after 200 tries fails the test, whose premise (a cold file)
    does not hold, rather than hiding the cold path."""

    def drop(path: Path) -> Path:
        cold = "cold reads (a file out of the page cache)"
        if not hasattr(os, "posix_fadvise"):
            pytest.skip(f"{cold}: dropping a file from the page cache is POSIX's")
        kind = _file_system(path)
        if kind in IN_MEMORY:
            pytest.skip(f"{cold}: the temporary files lie on {kind}, in memory")
        # (A page can outlast one call, as one read back in meanwhile: asked again
        # until none is left.)
        for _ in range(200):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            cached = sum(_cached_mib(path))
            if not cached:
                return path
            time.sleep(0.01)
        if not sys.platform.startswith("linux"):
            pytest.skip(f"{cold}: this kernel keeps a file in the page cache when asked")
        pytest.fail(
            f"{path} ({kind or 'file system unknown'}): {cached} MiB still in the page cache "
            "after 200 tries; is it mapped and read meanwhile?"
        )

    return drop


def _file_system(path: Path) -> str:
    """The type of the file system ``path`` lies on, from Linux's
    ``/proc/self/mountinfo`` (the deepest mount point above it); ``""`` elsewhere."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ""
    target, deepest, kind = os.path.realpath(path), "", ""
    for line in mounts:
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")  # (Octal escapes: \040.)
        above = target == point or target.startswith(point.rstrip("/") + "/")
        if above and len(point) >= len(deepest):
            deepest, kind = point, fields[fields.index("-") + 1]
    return kind


@pytest.fixture(scope="session")
def cached_mib() -> Callable[[Path], list[bool]]:
    """``cached_mib(path)``: for each MiB of the file, whether at least half of its
    pages are in the page cache."""
    return _cached_mib


def _cached_mib(path: Path) -> list[bool]:
    from jaxshare.io.mapped import map_file, resident

    whole = map_file(path)
    return [resident(whole[i : i + 2**20]) for i in range(0, whole.size, 2**20)]


@pytest.fixture(scope="session")
def resident() -> Callable[[Any], bool]:
    """``resident(view)``: whether at least half of the pages under ``view`` (a numpy
    view of a mapped file) are in the page cache."""
    from jaxshare.io.mapped import resident

    return resident


@pytest.fixture
def copied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bytes copied into an ``OutputFile`` s staging buffers (not
    written from where they lie), as they are."""
    from jaxshare.io.output_file import OutputFile

    sizes: list[int] = []
    real = OutputFile._append

    def append(self: OutputFile, view: memoryview) -> None:
        sizes.append(view.nbytes)
        real(self, view)

    monkeypatch.setattr(OutputFile, "_append", append)
    return sizes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_once(
    worker: Path, args: Sequence[str], processes: int, timeout: float
) -> list[tuple[int, str]]:
    port = _free_port()
    # Only tests/_support: tests/ itself would shadow the real `bridge` package.
    paths = [str(ROOT / "tests" / "_support"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env.pop("XLA_FLAGS", None)  # Each worker sets its own device count (_jax_process.py).
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(i), str(processes), str(port), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        tails = [proc.communicate()[0][-2000:] for proc in procs]
        pytest.fail(f"multi-process run timed out after {timeout}s: {tails}")
    return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]


@pytest.fixture(scope="session")
def run_processes() -> Callable[..., list[tuple[int, str]]]:
    """Runs ``python WORKER PROCESS_ID NUM_PROCESSES PORT *ARGS`` as ``processes``
    processes of one ``jax.distributed`` job on a free localhost port
    (``tests/_support`` on their path, for ``_jax_process``); returns each one's
    ``(exit status, output)``. A run whose port was taken between choosing it and
    binding it is run again on a new port."""

    def run(
        worker: Path, *args: str, processes: int = 2, timeout: float = 240
    ) -> list[tuple[int, str]]:
        results = _run_once(worker, args, processes, timeout)
        if any("already in use" in out.lower() for _, out in results):
            results = _run_once(worker, args, processes, timeout)
        return results

    return run


@dataclass(frozen=True)
class Demo:
    """What ``jaxshare demo --workdir WORKDIR`` returned, printed and left behind."""

    status: int
    output: str
    workdir: Path


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Demo:
    """``jaxshare demo``, run once for the whole test session: the demo's tests and
    the docs page that shows it read this one run. Under xdist the first worker to
    ask runs it (in-process) while holding a lock; the others read what it left."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    workdir, result = shared / "demo", shared / "demo.json"
    with FileLock(str(shared / "demo.lock")):
        if not result.is_file():
            from jaxshare.cli import main

            output = io.StringIO()
            with contextlib.redirect_stdout(output):
                status = main(["demo", "--workdir", str(workdir)])
            result.write_text(json.dumps({"status": status, "output": output.getvalue()}))
    done = json.loads(result.read_text())
    return Demo(done["status"], done["output"], workdir)
