"""Outputs handed to the disk as they are written: ``WriteBehind`` and
``write_array`` keep every byte, and leave the written pages out of the page
cache (checked with ``mincore``, the kernel's own record of what is resident)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
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
