"""Every ```python block of docs/readme/checkpoint.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SECTION = Path(__file__).resolve().parents[1] / "docs" / "readme" / "checkpoint.md"


def test_checkpoint_readme_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", SECTION.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{SECTION.name} block {i}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{SECTION.name} python block {i} failed:\n{block}") from e
