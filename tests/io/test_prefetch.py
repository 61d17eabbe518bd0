"""Reading ahead: ``Prefetch`` asks for each tensor's input in order, never more
than its window past the tensor reached; and every source that says where its
tensors lie (``extents``) names exactly their bytes."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from jaxshare.formats import SafetensorsFile
from jaxshare.formats.dcp.reader import DCPFolder
from jaxshare.formats.deepspeed.checkpoint import DeepSpeedCheckpoint
from jaxshare.formats.pytorch import TorchFile
from jaxshare.io.prefetch import Prefetch

DATA = Path(__file__).resolve().parents[1] / "data"


def _settle(asked: list[int], n: int) -> None:
    """Waits until the prefetch thread has asked for ``n`` tensors' extents, or a
    moment has passed with no more asked (it waits for the conversion)."""
    deadline = time.monotonic() + 5
    last, still = -1, time.monotonic()
    while len(asked) < n and time.monotonic() < deadline:
        if len(asked) != last:
            last, still = len(asked), time.monotonic()
        elif time.monotonic() - still > 0.2:
            return
        time.sleep(0.005)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    window=st.integers(0, 120),
    steps=st.lists(st.integers(0, 11), max_size=4),
)
def test_each_tensor_is_asked_for_in_order_within_the_window(
    sizes, window, steps, tmp_path_factory
):
    path = tmp_path_factory.mktemp("prefetch") / "input"
    path.write_bytes(bytes(sum(sizes) + 1))
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    asked: list[int] = []
    lock = threading.Lock()

    def extents(i: int) -> list[tuple[str, int, int]]:
        with lock:
            asked.append(i)
        return [(str(path), starts[i], sizes[i])]

    ahead = Prefetch(extents, sizes, window=window)
    try:
        reached = 0
        for step in [0, *sorted(steps)]:
            reached = max(reached, min(step, len(sizes) - 1))
            ahead.reached(reached)
            # The window runs from the end of the tensor reached.
            allowed = [i for i in range(len(sizes)) if starts[i] <= starts[reached + 1] + window]
            _settle(asked, len(allowed))
            with lock:
                assert asked == list(range(len(asked)))  # In order, each once.
                assert set(asked) <= set(allowed)  # Never past the window.
                assert len(asked) >= len(allowed) - 1  # Up to it (one may be in flight).
    finally:
        ahead.close()
    assert not ahead._thread.is_alive()


def test_a_missing_file_only_stops_reading_ahead(tmp_path: Path) -> None:
    with Prefetch(lambda i: [(str(tmp_path / "gone"), 0, 10)], [10, 10]) as ahead:
        ahead.reached(1)
        ahead._thread.join(timeout=5)
        assert not ahead._thread.is_alive()


def _bytes_at(extents: list[tuple[str, int, int]]) -> bytes:
    out = b""
    for path, offset, length in extents:
        with open(path, "rb") as f:
            f.seek(offset)
            out += f.read(length)
    return out


def _assert_extents_hold_the_bytes(source, want_some: bool = True) -> None:
    named = 0
    for name in source.infos:
        extents = list(source.extents(name))
        if not extents:
            continue
        named += 1
        array = np.ascontiguousarray(source.array(name))
        assert _bytes_at(extents) == array.tobytes(), name
    assert named or not want_some


def test_a_safetensors_file_names_each_tensors_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    save_file(
        {
            "a": rng.standard_normal((5, 3), dtype=np.float32),
            "b": rng.standard_normal(7).astype(ml_dtypes.bfloat16),
            "c": np.zeros((0, 2), np.float32),
        },
        tmp_path / "m.safetensors",
    )
    with SafetensorsFile(tmp_path / "m.safetensors") as source:
        _assert_extents_hold_the_bytes(source)
        assert source.extents("c")[0][2] == 0


def test_a_torch_file_names_each_tensors_bytes(tmp_path: Path) -> None:
    w = torch.randn(6, 4)
    torch.save({"w": w, "b": torch.randn(3).to(torch.bfloat16), "t": w.t()}, tmp_path / "m.pt")
    source = TorchFile(tmp_path / "m.pt")
    try:
        _assert_extents_hold_the_bytes(source)
        assert source.extents("t") == ()  # A strided view: not one range.
    finally:
        source.close()


@pytest.mark.parametrize("name", ["flat", "sharded"])
def test_a_dcp_folder_names_each_chunks_record(name: str) -> None:
    # Each chunk's record, whole: its raw bytes, or a small torch.save archive
    # around them.
    source = DCPFolder(DATA / "dcp" / name)
    try:
        for tensor in source.infos:
            item = source._item(tensor)
            chunks = [source._chunk(item, c) for c in source._filled(item)]
            extents = list(source.extents(tensor))
            assert len(extents) == len(chunks)
            for chunk, extent in zip(chunks, extents, strict=True):
                assert np.ascontiguousarray(chunk).tobytes() in _bytes_at([extent]), tensor
    finally:
        source.close()


@pytest.mark.parametrize("name", ["gpt2_z0_w2_bf16", "gpt2_z3_w2_fp32"])
def test_a_deepspeed_folder_names_each_pieces_bytes(name: str) -> None:
    compared = 0
    with DeepSpeedCheckpoint(DATA / "deepspeed" / name) as source:
        for tensor in source.infos:
            extents = list(source.extents(tensor))
            pieces = [p for p in source.pieces(tensor) if p.nbytes]
            if extents and len(extents) == len(pieces):  # (Else some are in memory.)
                assert _bytes_at(extents) == b"".join(p.tobytes() for p in pieces), tensor
                compared += 1
    assert compared


@settings(max_examples=200, deadline=None)
@given(
    head=st.integers(0, 40),
    values=st.integers(0, 200),
    tail=st.integers(0, 40),
    cuts=st.lists(st.integers(1, 279), max_size=3),
)
def test_the_bytes_read_ahead_beside_the_values_cover_what_lies_beside_the_values(
    head, values, tail, cuts
):
    # A record of `head` bytes, the values, then `tail` bytes, in ranges cut anywhere
    # (one file, at 1000): `beside_values` covers its head and tail, within the ranges, and
    # at most twice what lies beside the values in each range.
    from jaxshare.io.ahead import beside_values

    total = head + values + tail
    bounds = sorted({0, total, *(c for c in cuts if c < total)})
    extents = [("f", 1000 + a, b - a) for a, b in itertools.pairwise(bounds)]
    read = beside_values(extents, values)
    covered = np.zeros(total, bool)
    for path, offset, length in read:
        assert path == "f" and length > 0
        assert any(o <= offset and offset + length <= o + n for _, o, n in extents)
        covered[offset - 1000 : offset - 1000 + length] = True
    assert covered[:head].all() and covered[head + values :].all()
    assert sum(n for *_, n in read) <= 2 * (head + tail) * len(extents)
    assert read or head + tail == 0
