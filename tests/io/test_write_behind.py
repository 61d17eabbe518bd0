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

from jaxshare.io import buffers as _buffers
from jaxshare.io import output_file as _output
from jaxshare.io.buffers import empty_array, lined_up, pooled
from jaxshare.io.mapped import map_file, write_array
from jaxshare.io.output_file import WriteBehind

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


# How a piece is written: as bytes, as an array (copied), as an array kept and made
# to line up with the file (`lined_up`, or zeros written first: `gap`), or kept but
# not lined up.
WAYS = ["bytes", "array", "lined up", "gap", "kept"]


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(st.integers(0, 5 * 4096 + 7), st.sampled_from(WAYS), st.integers(0, 3)),
        max_size=10,
    ),
    patches=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 40)), max_size=4),
    direct=st.booleans(),
    step=st.sampled_from([4096, 8192, 16384]),
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
        m.setattr(_output, "LEND_BYTES", 4096)
        m.setattr(_buffers, "MAP_BYTES", 4096)
        if not direct:
            m.delattr(os, "O_DIRECT", raising=False)
        with _output.OutputFile(path) as out:
            for n, way, skew in pieces:
                data = rng.integers(0, 256, n, dtype=np.uint8)
                if way == "bytes":
                    out.write(data.tobytes())
                elif way == "array":
                    out.write_array(data)
                elif way == "lined up":  # As a plan's arrays are made for a safetensors file.
                    with lined_up(out.tell()):
                        array = empty_array((n,), np.dtype(np.uint8))
                    array[:] = data
                    out.write_array(array, kept=True)
                    del array  # (Its memory freed, or pooled, once written.)
                else:  # The item writer's way: a few zeros where the addresses differ.
                    array = data[skew:]
                    if way == "gap":
                        zeros = bytes(out.gap(array))
                        out.write(zeros)
                        want += zeros
                    out.write_array(array, kept=True)
                    data = array
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


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="written through the page cache")
@pytest.mark.parametrize("skew", [0, 8, 4092])
def test_a_kept_array_lined_up_with_the_file_is_not_copied(tmp_path, monkeypatch, skew):
    """Only its first and last partial blocks go through the staging buffers; its
    whole blocks are written from where they lie."""
    copied = []
    real = _output.OutputFile._append

    def append(self, view):
        copied.append(len(view))
        real(self, view)

    monkeypatch.setattr(_output.OutputFile, "_append", append)
    path = tmp_path / "out"
    header = b"h" * (1000 + skew)
    with pooled(), _output.OutputFile(path) as out:
        out.write(header)
        with lined_up(out.tell()):
            array = empty_array((3 << 20,), np.dtype(np.float32))
        array[:] = np.arange(array.size, dtype=np.float32)
        out.write_array(array, kept=True)
        del array
        out.write(b"end")
    assert sum(copied) - len(header) - 3 < 2 * 4096, copied
    data = path.read_bytes()
    assert data[: len(header)] == header and data[-3:] == b"end"
    got = np.frombuffer(data[len(header) : -3], np.float32)
    assert np.array_equal(got, np.arange(3 << 20, dtype=np.float32))


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
    real = os.pwritev

    def full_disk(fd, parts, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, parts, offset)

    monkeypatch.setattr(os, "pwritev", full_disk)
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

    def full_disk(fd, parts, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full_disk)
    before = len(os.listdir("/proc/self/fd"))
    out = _output.OutputFile(tmp_path / "out")
    out.write(b"x" * 100)  # Less than a buffer: written at close.
    with pytest.raises(OSError, match="No space left"):
        out.close()
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="written through the page cache")
def test_staging_buffers_come_back_however_fast_the_disk_writes(tmp_path, monkeypatch):
    """A write done at once, before the writer's next step, still gives back the
    staging buffer it held: the writer never waits forever for a free one."""
    real = _output.OutputFile._hand_on

    def at_once(self):  # Every write done before the writer goes on.
        real(self)
        with self._cond:
            while self._writes and self._error is None:
                self._cond.wait()

    monkeypatch.setattr(_output.OutputFile, "_hand_on", at_once)
    monkeypatch.setattr(_output, "DIRECT_STEP", 8192)
    rng = np.random.default_rng(0)
    want = bytearray()
    done = threading.Event()

    def write() -> None:
        with _output.OutputFile(tmp_path / "out") as out:
            for n in rng.integers(1, 3 * 8192, 200):
                data = rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
                out.write(data)
                want.extend(data)
        done.set()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    assert done.wait(30), "the writer waits for a staging buffer that never comes back"
    assert (tmp_path / "out").read_bytes() == bytes(want)


@pytest.mark.parametrize("direct", [True, False])
def test_a_later_patch_wins_over_one_across_the_bytes_in_a_write(tmp_path, monkeypatch, direct):
    """A patch over bytes already handed to the disk and bytes still buffered, then
    a patch over the buffered ones: the later patch's bytes are in the file (the
    first had been put in place after the second, at close)."""
    monkeypatch.setattr(_output, "DIRECT_STEP", 8192)
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    with _output.OutputFile(tmp_path / "out") as out:
        out.write(bytes(16384 + 100))  # Two buffers handed on, 100 bytes in the third.
        out.patch(16383, b"ab")
        out.patch(16384, b"c")
    assert (tmp_path / "out").read_bytes()[16382:16386] == b"\x00ac\x00"
