"""Fixtures of the command-line tests: ``jaxshare demo``, run once for the session."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxshare.cli import main


@dataclass(frozen=True)
class Demo:
    """What ``jaxshare demo --workdir WORKDIR`` returned, printed and left behind."""

    status: int
    output: str
    workdir: Path


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``jaxshare demo``, run once: every test of the demo reads this one run. (Its
    tests are in one file, and under xdist each file runs on one worker.)"""
    workdir = tmp_path_factory.mktemp("demo")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = main(["demo", "--workdir", str(workdir)])
    return Demo(status, output.getvalue(), workdir)
