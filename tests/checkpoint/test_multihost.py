"""Two real ``jax.distributed`` processes on localhost (CPU, gloo), two devices each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("_multihost_worker.py")
NUM_PROCESSES = 2
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_processes(workdir: Path, scenario: str) -> list[dict]:
    """Runs the processes; a second time on a new port if the first was taken
    between choosing it and binding it."""
    for attempt in range(2):
        results = _run_once(workdir / f"attempt{attempt}", scenario)
        crashes = [r["crash"] for r in results if "crash" in r]
        if not any("already in use" in c.lower() for c in crashes):
            break
    for process, result in enumerate(results):
        assert "crash" not in result, f"process {process} crashed:\n{result['crash']}"
    return results


def _run_once(workdir: Path, scenario: str) -> list[dict]:
    """Starts the processes, waits for all, and returns each one's result."""
    workdir.mkdir()
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # The worker sets its own device count.
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(i),
                str(NUM_PROCESSES),
                str(port),
                str(workdir),
                scenario,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(NUM_PROCESSES)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [p.communicate()[0][-2000:] for p in procs]
        pytest.fail(f"multi-process run timed out after {TIMEOUT_S}s: {outputs}")
    results = []
    for i, log in enumerate(logs):
        path = workdir / f"result_{i}.json"
        assert path.exists(), f"process {i} wrote no result; its output:\n{log[-4000:]}"
        result = json.loads(path.read_text())
        if "crash" in result:
            result["crash"] += f"\noutput:\n{log[-4000:]}"
        results.append(result)
    return results


def test_two_processes_save_and_restore_ties_sharded(tmp_path: Path) -> None:
    results = _run_processes(tmp_path, "roundtrip")
    for process, result in enumerate(results):
        assert result["process_count"] == NUM_PROCESSES, process
        assert result["global_devices"] == 4, process
        assert result["fully_addressable"] is False, process
        assert result["alias_map"] == {"lm_head": "embed"}, process
        assert result["tie_is_identity"] is True, process
        assert result["sharding_as_asked"] is True, process
        assert result["restored_fully_addressable"] is False, process
        assert result["values_equal"] is True, process
        assert result["manager_steps"] == [7], process
        assert result["manager_tie_is_identity"] is True, process


def test_processes_that_find_different_ties_fail_together(tmp_path: Path) -> None:
    results = _run_processes(tmp_path, "mismatch")
    for process, result in enumerate(results):
        assert result["error"] is not None, f"process {process} saved without an error"
        assert "processes found different alias maps" in result["error"], process
    assert not list(tmp_path.glob("attempt*/ckpt"))
