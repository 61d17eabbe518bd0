"""Mapped files: views copied file to file by the kernel, and writers that use them."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from jaxshare._mapped import _MAPS, copy_view, map_file, scattered_reads
from jaxshare.formats import SafetensorsFile, save_plan
from jaxshare.stream import Plan

LINUX = sys.platform.startswith("linux") and hasattr(os, "copy_file_range")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "in.bin"
    path.write_bytes(bytes(range(256)) * 64)
    return path


@pytest.mark.skipif(not LINUX, reason="copy_file_range is Linux's")
@pytest.mark.parametrize(
    "start, stop, dtype", [(0, 16384, "uint8"), (5, 1029, "uint8"), (8, 4104, "bfloat16")]
)
def test_a_view_of_a_mapped_file_is_copied_file_to_file(data, tmp_path, start, stop, dtype):
    view = map_file(data)[start:stop].view(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    with open(tmp_path / "out", "wb") as out:
        out.write(b"head")
        assert copy_view(view, out)
        assert out.tell() == 4 + view.nbytes
        out.write(b"tail")
    assert (tmp_path / "out").read_bytes() == b"head" + data.read_bytes()[start:stop] + b"tail"


@pytest.mark.parametrize(
    "make",
    [
        lambda m: np.arange(10, dtype=np.uint8),  # memory, not a file
        lambda m: m[:64:2],  # not contiguous
        lambda m: m[:0],  # empty
    ],
)
def test_anything_else_is_left_to_the_writer(data, tmp_path, make):
    with open(tmp_path / "out", "wb") as out:
        assert not copy_view(make(map_file(data)), out)
        assert out.tell() == 0


def test_the_file_stays_the_one_mapped_while_a_view_lives(data, tmp_path):
    view = map_file(data)[:4]
    data.unlink()
    data.write_bytes(b"another file")  # replaced under the same name
    with open(tmp_path / "out", "wb") as out:
        if not copy_view(view, out):
            out.write(view.data)
    assert (tmp_path / "out").read_bytes() == bytes(range(4))


def test_a_map_is_forgotten_and_its_file_closed_with_its_last_view(data):
    before = set(_MAPS)  # (Maps of earlier tests may be collected meanwhile.)
    view = map_file(data)[10:20]
    (key,) = set(_MAPS) - before
    f = _MAPS[key][2]
    del view
    gc.collect()
    assert key not in _MAPS and f.closed


def test_an_identity_copy_of_a_safetensors_file_is_byte_identical(tmp_path):
    from safetensors.numpy import save_file

    tensors = {f"w{i}": np.full((256, 1024), i, np.float32) for i in range(4)}
    tensors["b"] = np.arange(3, dtype=np.int64)
    save_file(tensors, tmp_path / "a.safetensors", metadata={"format": "pt"})
    with SafetensorsFile(tmp_path / "a.safetensors") as source:
        save_plan(tmp_path / "b.safetensors", Plan.identity(source), source)
    with SafetensorsFile(tmp_path / "b.safetensors") as copy:
        for name, value in tensors.items():
            np.testing.assert_array_equal(copy.array(name), value)


# The collector frees a map (and runs its finalizer) inside whatever allocates: here,
# on purpose, exactly while the registry is written (`map_file`) and read (a lookup).
# A finalizer waiting for a lock its own thread held hung a CI run until its timeout.
COLLECTED_INSIDE = """
import gc, pathlib, sys
from jaxshare import _mapped

class Collecting(dict):
    def __setitem__(self, key, value):
        gc.collect()
        super().__setitem__(key, value)

    def values(self):
        gc.collect()
        return super().values()

_mapped._MAPS = Collecting()
path = pathlib.Path(sys.argv[1])
for _ in range(3):
    cycle = [_mapped.map_file(path)]
    cycle.append(cycle)  # A map only the collector frees.
    del cycle
    view = _mapped.map_file(path)[2:5]
    assert _mapped.file_extent(view) == (str(path), 2, 3)
print(len(_mapped._MAPS))
"""


def test_a_map_freed_by_the_collector_inside_the_registry_never_hangs(data):
    done = subprocess.run(
        [sys.executable, "-c", COLLECTED_INSIDE, str(data)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["1"]  # Only the live view's map is left.


def _flags(address: int) -> list[str]:
    """The kernel's flags of the mapping holding ``address`` (``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc")
@pytest.mark.parametrize("private", [False, True])
def test_scattered_reads_turn_the_read_around_off_while_they_last(data, private):
    mapped = map_file(data, private=private)
    address = mapped.ctypes.data
    assert "rr" not in _flags(address)
    with scattered_reads(mapped):
        assert "rr" in _flags(address)  # VM_RAND_READ: a fault reads its page alone.
        assert bytes(mapped[256:260]) == bytes(range(4))
    assert "rr" not in _flags(address)
    with scattered_reads(np.zeros(3)):  # Not a map: nothing to do.
        pass
