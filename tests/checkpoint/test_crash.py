"""A save killed with SIGKILL mid-write leaves the previous step intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxshare import checkpoint as jc

# Saves step 0, then starts step 1 and stalls it after Orbax wrote the arrays and
# before the alias map is written: the moment a crash is most likely to tear a
# checkpoint. The parent kills the process there.
CHILD = textwrap.dedent(
    """
    import sys, time, pathlib
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jaxshare import checkpoint
    from jaxshare.checkpoint import _handler

    root = pathlib.Path(sys.argv[1])

    def stall(directory, text):
        # Written under a temp name and renamed, so the parent never reads it half-written.
        (root / "stalled.tmp").write_text(str(directory))
        (root / "stalled.tmp").rename(root / "stalled")
        time.sleep(600)

    with ocp.CheckpointManager(root / "ckpt") as manager:
        for step in (0, 1):
            emb = jnp.full((64, 32), float(step))
            if step == 1:
                _handler.write_alias_map = stall
            manager.save(step, args=checkpoint.SharedSave({"embed": emb, "head": emb}))
            manager.wait_until_finished()
    """
)
TIMEOUT_S = 120


@pytest.mark.subprocess
def test_sigkill_mid_save_keeps_the_previous_step(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (tmp_path / "stalled").exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the child never reached the alias map write"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    partial = Path((tmp_path / "stalled").read_text())
    assert partial.exists() and "tmp" in partial.parent.name  # Killed inside Orbax's temp dir.
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        assert manager.all_steps() == [0]
        assert manager.latest_step() == 0
        restored = manager.restore(0, args=jc.SharedRestore())
    assert restored["head"] is restored["embed"]
    assert np.array_equal(restored["embed"], jnp.zeros((64, 32)))
