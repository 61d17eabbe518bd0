"""Two real ``jax.distributed`` processes on localhost (CPU, gloo), two devices each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NUM_PROCESSES = 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multihost")


@pytest.fixture(scope="module")
def results(run_processes, workdir: Path) -> list[dict]:
    """Both scenarios, in one two-process job: each process's observations by scenario."""
    worker = Path(__file__).with_name("_multihost_worker.py")
    outputs = run_processes(worker, str(workdir), "roundtrip", "mismatch")
    results = []
    for process, (status, output) in enumerate(outputs):
        assert status == 0, f"process {process} failed:\n{output[-4000:]}"
        result = json.loads(output.strip().splitlines()[-1])
        assert "crash" not in result, f"process {process} crashed:\n{result['crash']}"
        results.append(result)
    return results


@pytest.mark.subprocess
def test_two_processes_save_and_restore_ties_sharded(results: list[dict]) -> None:
    for process, by_scenario in enumerate(results):
        result = by_scenario["roundtrip"]
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


@pytest.mark.subprocess
def test_processes_that_find_different_ties_fail_together(
    results: list[dict], workdir: Path
) -> None:
    for process, by_scenario in enumerate(results):
        result = by_scenario["mismatch"]
        assert result["error"] is not None, f"process {process} saved without an error"
        assert "processes found different alias maps" in result["error"], process
    assert not (workdir / "mismatch" / "ckpt").exists()
