"""The `jaxshare` command's own behaviour; each reader's commands are tested beside it,
the demo in test_demo.py."""

import subprocess
import sys

import pytest

from jaxshare.cli import main


@pytest.mark.subprocess
def test_console_script_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "jaxshare.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("inspect", "convert", "demo"):
        assert command in out


@pytest.mark.parametrize(
    "argv, match",
    [
        (
            ["inspect", "{tmp}/notes.txt"],
            "expected an Orbax checkpoint, a PyTorch DCP directory, a DeepSpeed directory",
        ),
        (  # A directory of no kind: the same one line.
            ["inspect", "{tmp}/empty"],
            "expected an Orbax checkpoint, a PyTorch DCP directory, a DeepSpeed directory",
        ),
        (["convert", "{tmp}", "{tmp}/out.npz"], "pass --format to say which"),
        (
            ["convert", "{tmp}", "{tmp}/out.pt", "--names", "flax"],
            "--names chooses the naming of a .safetensors output only",
        ),
        (
            ["convert", "{tmp}", "{tmp}/out.safetensors", "--config", "c.json"],
            "--config and --max-shard-size are for",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, argv, match):
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "empty").mkdir()
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv", [["inspect", "/no/such/path"], ["convert", "/no/such/dir", "{tmp}/x.safetensors"]]
)
def test_a_missing_input_exits_1_with_one_line(tmp_path, capsys, argv):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 1
    err = capsys.readouterr().err
    assert "no such file or directory" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
