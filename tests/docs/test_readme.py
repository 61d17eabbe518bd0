"""Every ```python block of README.md runs, in order, in one namespace.

A block whose first line is ``# excerpt`` quotes a file (with names defined there)
and is not run.
"""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if not b.startswith("# excerpt")]


def test_readme_has_examples():
    assert len(python_blocks()) >= 15


def test_readme_python_blocks_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # Snippets that write files write them here.
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README.md block {i}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"README.md python block {i} failed:\n{block}") from e
