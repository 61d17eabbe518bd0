"""``empty_array`` and ``pooled``: freed arrays' memory goes to the next array of its
size while a conversion streams, never while a view of it lives, within the cap,
and back to the operating system once no conversion streams."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import numpy as np
import pytest

from jaxshare.io import buffers as _buffers
from jaxshare.io.buffers import empty_array, pooled

F32 = np.dtype(np.float32)


def test_a_view_keeps_its_memory_from_the_next_array() -> None:
    with pooled():
        a = empty_array((512, 1024), F32)
        a[:] = 1
        view = a[3:5]
        del a
        gc.collect()
        b = empty_array((512, 1024), F32)
        b[:] = 2
        assert (view == 1).all()  # Not b's memory.
        del view
        gc.collect()
        c = empty_array((512, 1024), F32)
        assert c.ctypes.data != b.ctypes.data


def test_the_pool_holds_at_most_its_cap_and_empties_after_the_last_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_buffers, "POOL_BYTES", 3 * 2**20)
    with pooled():
        with pooled():  # (Nested: the pool lives until the outer one ends.)
            arrays = [empty_array((2**18,), F32) for _ in range(5)]  # 1 MiB each
            del arrays
            gc.collect()
            assert _buffers._STATE["free"] == 3 * 2**20
        assert _buffers._STATE["free"] == 3 * 2**20
    assert _buffers._STATE["free"] == 0 and not _buffers._FREE


def test_outside_a_scope_nothing_is_kept_and_arrays_outlive_their_scope() -> None:
    with pooled():
        kept = empty_array((1024, 1024), F32)
    kept[:] = 7  # Still its own memory.
    del kept
    gc.collect()
    assert _buffers._STATE["free"] == 0
    small = empty_array((4,), F32)  # Small arrays are numpy's own.
    assert small.base is None


def test_a_waiting_mapping_up_to_twice_the_size_serves_a_smaller_array() -> None:
    with pooled():
        big = empty_array((3 * 2**18,), F32)  # 3 MiB
        address = big.ctypes.data
        del big
        gc.collect()
        small = empty_array((2**18,), F32)  # 1 MiB: 3 MiB is over twice that.
        assert small.ctypes.data != address
        half = empty_array((2**19 + 2**17,), F32)  # 2.5 MiB
        assert half.ctypes.data == address and half.nbytes == 5 * 2**19
        half[:] = 1
        del half
        gc.collect()
        assert _buffers._STATE["free"] == 3 * 2**20  # Back at its own size.
        again = empty_array((3 * 2**18,), F32)
        assert again.ctypes.data == address


# The collector frees an array (and runs its finalizer) inside whatever allocates:
# here, on purpose, while `empty_array` holds the pool's lock. A finalizer waiting for
# a lock its own thread held would hang (as one in `_mapped` hung a CI run).
COLLECTED_INSIDE = """
import gc
import numpy as np
from jaxshare.io import buffers as _buffers

class Collecting(dict):
    def items(self):
        gc.collect()
        return super().items()

_buffers._FREE = Collecting()
with _buffers.pooled():
    for i in range(3):
        cycle = [_buffers.empty_array((2**20,), np.dtype(np.uint8))]
        cycle.append(cycle)  # An array only the collector frees.
        del cycle
        a = _buffers.empty_array((2**20,), np.dtype(np.uint8))
        a[:] = i
        assert (a == i).all()
    del a
    print(_buffers._STATE["free"])
"""


@pytest.mark.subprocess
def test_an_array_freed_by_the_collector_inside_the_pool_never_hangs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECTED_INSIDE],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    # Kept: the last two `a`, freed by counting (the first went to the third cycle).
    # The cycles, freed by the collector while the lock was held, were unmapped.
    assert done.stdout.split() == [str(2 * 2**20)]


@pytest.mark.parametrize(
    ("offset", "dtype", "skew"),
    [(0, "float32", 0), (4096 + 24, "float32", 24), (4094, "float32", 0), (4094, "bfloat16", 4094),
     (13, "uint8", 13), (8, "complex128", 8)],
)  # fmt: skip
def test_lined_up_arrays_start_where_their_place_in_a_file_does(
    offset: int, dtype: str, skew: int
) -> None:
    """As far into a page as ``offset`` lies into one, where the dtype allows it (else
    at a page), on this thread only; a pooled mapping serves them as any other."""
    import ml_dtypes  # noqa: F401 -- registers bfloat16 with numpy

    kind = np.dtype(dtype)
    seen: list[int] = []
    with pooled(), _buffers.lined_up(offset):
        for _ in range(2):
            a = empty_array((1 << 20,), kind)
            a[:] = 7
            seen.append(a.ctypes.data)
            assert a.ctypes.data % 4096 == skew and a.flags.aligned and (a == 7).all()
            del a
        other: list[int] = []
        thread = threading.Thread(
            target=lambda: other.append(empty_array((1 << 20,), kind).ctypes.data % 4096)
        )
        thread.start()
        thread.join()
        assert other == [0]
    assert seen[0] == seen[1]  # The second took the first's memory.
    assert empty_array((1 << 20,), kind).ctypes.data % 4096 == 0
