"""Outputs handed to the disk as they are written: ``WriteBehind`` and
``write_array`` keep every byte, and leave the written pages out of the page
cache (checked with ``mincore``, the kernel's own record of what is resident)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare import _output
from jaxshare._mapped import map_file, write_array
from jaxshare._output import WriteBehind

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page cache")


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache, by ``mincore`` over a map of it."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)
        address = view.ctypes.data
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(address, size, vec) == 0, ctypes.get_errno()
        del view
        return sum(b & 1 for b in vec.raw)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), max_size=12),
    step=st.integers(1, 3000),
    native=st.booleans(),
)
def test_every_byte_written_behind_is_in_the_file(tmp_path_factory, sizes, step, native):
    path = tmp_path_factory.mktemp("wb") / "out"
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    saved = _output._SYNC_FILE_RANGE
    _output._SYNC_FILE_RANGE = saved if native else None  # The posix_fadvise fallback too.
    try:
        with open(path, "wb") as f:
            behind = WriteBehind(f, step=step)
            for piece in pieces:
                f.write(piece)
                behind.wrote()
            behind.close()
    finally:
        _output._SYNC_FILE_RANGE = saved
    assert path.read_bytes() == b"".join(pieces)


@linux
def test_a_file_written_behind_leaves_the_page_cache(tmp_path):
    path = tmp_path / "out"
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        behind = WriteBehind(f, step=4 << 20)
        for _ in range(32):
            f.write(block)
            behind.wrote()
        before = resident_pages(path)
        behind.close()
    pages = (32 << 20) // mmap.PAGESIZE
    # While written, no more than the steps in flight (and the one being filled) stay.
    assert before <= pages * (4 * 4) // 32, before
    assert resident_pages(path) <= pages // 100
    assert path.read_bytes() == block * 32


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
    dtype=st.sampled_from(["uint8", "float32", "int64", "float16"]),
    step=st.integers(1, 700),
    mapped=st.booleans(),
)
def test_write_array_writes_the_bytes_in_steps(tmp_path_factory, shape, dtype, step, mapped):
    d = tmp_path_factory.mktemp("wa")
    array = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    if mapped:  # Copied file to file from a mapped input.
        (d / "in").write_bytes(b"ab" + array.tobytes())
        array = map_file(d / "in")[2:].view(dtype).reshape(shape)
    calls = []
    with open(d / "out", "wb") as out:
        out.write(b"<")
        write_array(array, out, lambda: calls.append(out.tell()), step=step)
        out.write(b">")
    assert (d / "out").read_bytes() == b"<" + array.tobytes() + b">"
    assert calls == [min(1 + k + step, 1 + array.nbytes) for k in range(0, array.nbytes, step)]


# --- OutputFile: O_DIRECT through staging buffers, or the page cache ---------------


@settings(max_examples=40, deadline=None)
@given(
    pieces=st.lists(st.integers(0, 3 * 4096 + 7), max_size=10),
    patches=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 40)), max_size=4),
    direct=st.booleans(),
    step=st.sampled_from([4096, 8192]),
    writers=st.sampled_from([1, 2, 3]),
)
def test_every_byte_and_patch_written_is_in_the_file(
    tmp_path_factory, monkeypatch_module, pieces, patches, direct, step, writers
):
    path = tmp_path_factory.mktemp("of") / "out"
    rng = np.random.default_rng(len(pieces))
    want = bytearray()
    with monkeypatch_module.context() as m:
        m.setattr(_output, "DIRECT_STEP", step)
        m.setattr(_output, "DIRECT_WRITERS", writers)
        if not direct:
            m.delattr(os, "O_DIRECT", raising=False)
        with _output.OutputFile(path) as out:
            for k, n in enumerate(pieces):
                data = rng.integers(0, 256, n, dtype=np.uint8)
                out.write(data.tobytes()) if k % 2 else out.write_array(data)
                want += data.tobytes()
                assert out.tell() == len(want)
            for where, n in patches:
                if len(want) >= n:
                    offset = int(where * (len(want) - n))
                    data = bytes(rng.integers(0, 256, n, dtype=np.uint8))
                    out.patch(offset, data)
                    want[offset : offset + n] = data
    assert path.read_bytes() == bytes(want)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


@linux
def test_an_output_file_bypasses_the_page_cache(tmp_path):
    path = tmp_path / "out"
    block = os.urandom(1 << 20)
    with _output.OutputFile(path) as out:
        for _ in range(32):
            out.write(block)
    assert resident_pages(path) <= (32 << 20) // mmap.PAGESIZE // 100
    assert path.read_bytes() == block * 32


def test_a_failed_write_is_raised_to_the_writer_and_stops_the_thread(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("the page cache path raises at once")
    calls = []
    real = os.pwrite

    def full_disk(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_disk)
    monkeypatch.setattr(_output, "DIRECT_STEP", 4096)
    before = set(threading.enumerate())
    out = _output.OutputFile(tmp_path / "out")
    with pytest.raises(OSError, match="No space left"):
        for _ in range(64):
            out.write(b"x" * 4096)
        out.close()
    out.abort()
    assert not set(threading.enumerate()) - before  # (Threads of earlier tests may end.)


@linux
def test_a_write_failing_at_close_leaves_no_file_open(tmp_path, monkeypatch):
    """(A descriptor left open keeps, e.g., a full tmpfs from being unmounted.)"""

    def full_disk(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk)
    before = len(os.listdir("/proc/self/fd"))
    out = _output.OutputFile(tmp_path / "out")
    out.write(b"x" * 100)  # Less than a buffer: written at close.
    with pytest.raises(OSError, match="No space left"):
        out.close()
    assert len(os.listdir("/proc/self/fd")) == before
