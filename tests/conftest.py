"""Fixtures shared by every layer's tests: the repository's folders, the scripts (examples,
benchmarks) as modules, and real multi-process ``jax.distributed`` runs on localhost.

Each layer folder (``core``, ``formats``, ``checkpoint``, ``bridge``, ``cli``) has its
own ``conftest.py`` for what only its tests use. Test modules never import each other
or a helper module: pytest imports them with ``--import-mode=importlib``, so two
layers may each have a ``test_api.py``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_once(
    worker: Path, args: Sequence[str], processes: int, timeout: float
) -> list[tuple[int, str]]:
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # Each worker sets its own device count.
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
    processes of one ``jax.distributed`` job on a free localhost port; returns each
    one's ``(exit status, output)``. A run whose port was taken between choosing it
    and binding it is run again on a new port."""

    def run(
        worker: Path, *args: str, processes: int = 2, timeout: float = 240
    ) -> list[tuple[int, str]]:
        results = _run_once(worker, args, processes, timeout)
        if any("already in use" in out.lower() for _, out in results):
            results = _run_once(worker, args, processes, timeout)
        return results

    return run
