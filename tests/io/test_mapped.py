"""Mapped files: views copied file to file by the kernel, and writers that use them;
views of a file the page cache lacks read past it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxshare.formats import SafetensorsFile, save_plan
from jaxshare.io.buffers import pooled
from jaxshare.io.mapped import (
    _MAPS,
    DIRECT_BYTES,
    copy_view,
    file_extent,
    map_file,
    read_direct,
    resident,
    scattered_reads,
)
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


@pytest.mark.parametrize("moved", [False, True])
def test_a_cold_file_copied_as_it_is_is_written_from_its_pages_or_read_past_them(
    tmp_path, moved, drop_cache, cached_mib
):
    """Tensors written as they lie (no cast, no transpose) from a file the page
    cache lacks. Where each lies in the output as far into a page as in the input
    (the same header), the output writes it from the file's pages, read ahead into
    the cache; where not (a longer header), it is copied anyway, so it is read past
    the cache. The copy is byte-identical either way."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(2)
    tensors = {f"w{i}": rng.standard_normal((512, 1024), dtype=np.float32) for i in range(3)}
    tensors["b"] = rng.standard_normal(3).astype(ml_dtypes.bfloat16)
    save_file(tensors, tmp_path / "a.safetensors", metadata={"format": "pt"})
    if not (LINUX and _takes_direct_reads(tmp_path / "a.safetensors")):
        pytest.skip("direct reads (O_DIRECT) and mincore are Linux's, on a disk's file system")
    with SafetensorsFile(tmp_path / "a.safetensors") as source:  # (jaxshare's header.)
        save_plan(tmp_path / "in.safetensors", Plan.identity(source), source)
    source_path = drop_cache(tmp_path / "in.safetensors")
    with SafetensorsFile(source_path) as source:
        metadata = {"moved": "by a few bytes"} if moved else None
        save_plan(tmp_path / "b.safetensors", Plan.identity(source), source, metadata=metadata)
        cached = cached_mib(source_path)[:6]
        assert not any(cached) if moved else all(cached)
    with SafetensorsFile(tmp_path / "b.safetensors") as copy:
        for name, value in tensors.items():
            assert copy.array(name).tobytes() == value.tobytes()


# The collector frees a map (and runs its finalizer) inside whatever allocates: here,
# on purpose, exactly while the registry is written (`map_file`) and read (a lookup).
# A finalizer waiting for a lock its own thread held hung a CI run until its timeout.
COLLECTED_INSIDE = """
import gc, pathlib, sys
from jaxshare.io import mapped as _mapped

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


@pytest.mark.subprocess
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
@pytest.mark.parametrize("start", [0, 100])
def test_scattered_reads_turn_the_read_around_off_while_they_last(data, private, start):
    mapped = map_file(data, private=private)
    address = mapped.ctypes.data
    view = mapped[start:][:4000]  # (From 100: a view of a view, as a record in a file.)
    assert "rr" not in _flags(address)
    with scattered_reads(view):
        assert "rr" in _flags(address)  # VM_RAND_READ: a fault reads its page alone.
        assert bytes(view[256:260]) == bytes((start + 256 + i) % 256 for i in range(4))
    assert "rr" not in _flags(address)
    with scattered_reads(np.zeros(3)):  # Not a map: nothing to do.
        pass


def _takes_direct_reads(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except (AttributeError, OSError):  # (No O_DIRECT, or a file system without it.)
        return False
    return True


@pytest.fixture
def big(tmp_path: Path, drop_cache) -> Path:
    """A 20 MiB file of numbered 4-byte words; its pages out of the page cache."""
    path = tmp_path / "big.bin"
    path.write_bytes(np.arange(5 * 2**20, dtype=np.uint32).tobytes())
    if not (LINUX and _takes_direct_reads(path)):
        pytest.skip("direct reads (O_DIRECT) and mincore are Linux's, on a disk's file system")
    return drop_cache(path)


@pytest.mark.parametrize(
    "start, stop, dtype",
    [
        (0, 20 * 2**20, "uint32"),  # the whole file, in several reads at once
        (4100, 4100 + 3 * 2**20, "uint16"),  # from within a page
        (2, 2 + 2**20 + 6, "bfloat16"),  # an odd tail
        (20 * 2**20 - 9 * 2**20 - 3, 20 * 2**20, "uint8"),  # up to the file's end
    ],
)
def test_a_view_the_page_cache_lacks_is_read_past_it(big, start, stop, dtype):
    dtype = np.dtype(getattr(ml_dtypes, dtype, dtype))
    view = map_file(big)[start:stop].view(dtype)
    with pooled():
        values = read_direct(view)
        assert values is not view and file_extent(values) is None  # The process's own.
        assert values.dtype == view.dtype and values.shape == view.shape
        assert not resident(view)  # The page cache was left as it was.
        assert values.tobytes() == big.read_bytes()[start:stop]


def test_views_in_the_page_cache_small_or_not_of_a_file_are_left_as_they_are(big, drop_cache):
    mapped = map_file(big)
    small = mapped[: DIRECT_BYTES - 1]
    assert read_direct(small) is small  # cold, but small
    warm = mapped[: 2 * DIRECT_BYTES]
    _ = big.read_bytes()  # (Into the page cache.)
    assert read_direct(warm) is warm
    memory = np.zeros(2 * DIRECT_BYTES, np.uint8)
    assert read_direct(memory) is memory
    private = map_file(drop_cache(big), private=True)[: 2 * DIRECT_BYTES]
    assert read_direct(private) is private  # (It may differ from the file.)


def test_a_direct_read_reads_the_file_mapped_even_once_its_path_names_another(big, drop_cache):
    view = map_file(big)[: 2 * DIRECT_BYTES]
    expected = big.read_bytes()[: 2 * DIRECT_BYTES]
    big.unlink()
    big.write_bytes(bytes(4 * DIRECT_BYTES))  # replaced under the same name
    drop_cache(big)
    assert read_direct(view).tobytes() == expected


# (The file is only read: one for every example, dropped from the cache for each.)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.integers(0, 2 * 2**20),
    length=st.integers(DIRECT_BYTES, 4 * 2**20),
    dtype=st.sampled_from(["uint8", "int16", "float32", "bfloat16", "float64"]),
)
def test_any_cold_view_reads_the_bytes_it_views(big, drop_cache, start, length, dtype):
    dtype = np.dtype(getattr(ml_dtypes, dtype, dtype))
    length -= length % dtype.itemsize
    view = map_file(drop_cache(big))[start : start + length].view(dtype)
    values = read_direct(view)
    assert values is not view
    assert values.tobytes() == view.tobytes()
