"""A ``convert`` killed with SIGKILL part-way through a large write: the previous
output is intact, and the next run to the same destination leaves no stray file.
Only the run to be killed is a process of its own; the runs before and after it are
``jaxshare`` in this process."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import bridge
from jaxshare.cli import main

MIB = 2**20


def _digest(path: Path) -> str:
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return str(sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*")))


def _assert_same_output(got: Path, want: Path) -> None:
    """Files byte for byte; Orbax items (whose data files have random names) by content."""
    if want.is_file():
        assert _digest(got) == _digest(want)
        return
    from jaxshare import checkpoint

    a, b = checkpoint.consolidate(got), checkpoint.consolidate(want)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert checkpoint.read_alias_map(got) == checkpoint.read_alias_map(want)


def _strays(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def _written(parent: Path, name: str) -> int:
    """Bytes written so far under the temporary names of ``name`` (files the writer
    renames or removes while they are counted are skipped)."""
    total = 0
    for p in parent.iterdir():
        if p.name.startswith(f".{name}.jaxshare-tmp-"):
            for root, _, files in os.walk(p) if p.is_dir() else [(parent, [], [p.name])]:
                for f in files:
                    try:
                        total += os.stat(os.path.join(root, f)).st_size
                    except FileNotFoundError:
                        pass
    return total


def _kill_mid_write(argv: list[str], parent: Path, name: str, at_bytes: int) -> None:
    """Runs ``jaxshare`` and SIGKILLs it once ``at_bytes`` are written under the
    output's temporary name (for an Orbax item, which may buffer: once its temporary
    directory holds data, or exists and a moment has passed)."""
    with subprocess.Popen(
        [sys.executable, "-m", "jaxshare.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    ) as proc:
        deadline = time.monotonic() + 240
        started = None
        while True:
            written = _written(parent, name)
            if written >= at_bytes:
                break
            if _strays(parent, name) and started is None:
                started = time.monotonic()
            if (
                started is not None
                and not Path(name).suffix
                and (written > 0 or time.monotonic() - started > 0.2)
            ):
                break
            if proc.poll() is not None:
                pytest.fail(f"convert ended before it was killed: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("convert wrote too little in time to be killed part-way")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A 192 MiB safetensors file: large enough that a write takes a while. Random
    values, which zstd cannot shrink: constant ones compressed to a few KiB, and an
    item from them was written whole before the watcher saw any of it."""
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    rng = np.random.default_rng(0)
    save_file({f"w{i}": rng.standard_normal(8 * MIB, np.float32) for i in range(6)}, path)
    return path


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "dst_name, extra", [("out.safetensors", ["--names", "torch"]), ("ckpt", [])]
)
def test_a_killed_convert_keeps_the_previous_output(big, tmp_path, dst_name, extra):
    dst = tmp_path / dst_name
    small = tmp_path / "small.safetensors"
    bridge.save_safetensors({"w0": torch.zeros(2)}, small)
    assert main(["convert", "--quiet", str(small), str(dst), *extra]) == 0
    previous = _digest(dst)

    _kill_mid_write(
        ["convert", "--quiet", "--force", str(big), str(dst), *extra],
        tmp_path,
        dst_name,
        at_bytes=32 * MIB,
    )
    # The kill lands mid-write (the usual case): the previous output is intact and
    # the killed run's temporary output is left behind. Or, on a fast disk, it lands
    # after the new output was renamed into place: then that output is complete.
    if _digest(dst) != previous:
        reference = tmp_path / f"reference-{dst_name}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "jaxshare.cli",
                "convert",
                "--quiet",
                str(big),
                str(reference),
                *extra,
            ],
            check=True,
            capture_output=True,
        )
        _assert_same_output(dst, reference)
    else:
        assert _strays(tmp_path, dst_name)

    assert main(["convert", "--quiet", "--force", str(small), str(dst), *extra]) == 0
    assert _strays(tmp_path, dst_name) == []  # ...and the next run clears it away.
