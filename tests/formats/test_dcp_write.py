"""``jaxshare.formats.dcp.writer``: PyTorch DCP folders written without torch, read by
stock ``torch.distributed.checkpoint.load`` -- into a plain model and into an FSDP2 model
on two gloo ranks -- with each tie stored once (two FQNs over the same bytes) and the
alias map beside them.

Run as a script, this file is the worker of the two-rank test:
``python test_dcp_write.py RANK WORLD PORT FOLDER REFERENCE``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from jaxshare import AliasMap, NamingRecord
from jaxshare.formats import (
    ALIAS_MAP_FILE,
    ALIAS_MAP_KEY,
    NAMING_FILE,
    SafetensorsFile,
    TensorSpec,
    write_safetensors,
)
from jaxshare.formats.dcp import writer as _dcp_write
from jaxshare.formats.dcp.metadata import METADATA_FILE as DCP_METADATA_FILE
from jaxshare.formats.dcp.writer import DCP_DATA_FILE, holds_only_dcp, write_dcp
from jaxshare.formats.torch_save import zip as _torch_zip
from jaxshare.stream import ArrayInfo, Plan, PlanEntry, TensorSource

#: dcp.load warns that it assumes one process when no process group is initialized.
SINGLE = "torch.distributed is disabled, unavailable or uninitialized"


class TinyLM(nn.Module):
    """A tied language model: embedding and head share one weight; a Linear, a LayerNorm,
    a bfloat16 buffer, an int64 buffer and a 0-d buffer. Odd sizes, for uneven shards."""

    def __init__(self, vocab: int = 257, dim: int = 32, hidden: int = 7) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # the tie
        self.register_buffer("calibration", torch.randn(5).to(torch.bfloat16))
        self.register_buffer("positions", torch.arange(7, dtype=torch.int64))
        self.register_buffer("tokens_seen", torch.tensor(14, dtype=torch.int64))


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def _worker(rank: int, world: int, port: int, folder: str, reference: str) -> dict[str, Any]:
    """One rank: a fresh FSDP2-sharded ``TinyLM`` loaded by stock ``dcp.load``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(123)  # Not the weights written: every value must come from disk.
        model = TinyLM()
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        state = model.state_dict()
        sharded = sorted(k for k, v in state.items() if isinstance(v, DTensor))
        dcp.load(state, checkpoint_id=folder)
        model.load_state_dict(state, strict=True)
        want = torch.load(reference, weights_only=True)
        got = {
            k: (v.full_tensor() if isinstance(v, DTensor) else v)
            for k, v in model.state_dict().items()
        }
        wrong = sorted(k for k in want if k not in got or _bits(got[k]) != _bits(want[k]))
        return {"wrong": wrong, "names": sorted(got), "sharded": sharded}
    finally:
        dist.destroy_process_group()


TIE = AliasMap({"lm_head.weight": "wte.weight"})


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class Arrays(TensorSource):
    """Arrays in memory as a source (not mapped: the writer reads ahead)."""

    def __init__(self, arrays: dict[str, np.ndarray], ties: AliasMap | None = None) -> None:
        self.arrays = arrays
        self.infos = {k: ArrayInfo(tuple(a.shape), a.dtype.name) for k, a in arrays.items()}
        self.ties = AliasMap() if ties is None else ties

    def read(self, name: str) -> np.ndarray:
        return self.arrays[name]


def _safetensors(path: Path, state: dict[str, torch.Tensor], ties: AliasMap) -> Path:
    """``state`` less the aliases, as a ``.safetensors`` file recording the ties."""
    arrays = {k: _numpy(v) for k, v in state.items() if k not in ties}
    specs = [TensorSpec(k, a.shape, a.dtype) for k, a in arrays.items()]
    with write_safetensors(path, specs, {ALIAS_MAP_KEY: ties.to_json()}) as write:
        for a in arrays.values():
            write([a])
    return path


def _load(folder: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE)
        dcp.load(state, checkpoint_id=folder, no_dist=True)
    return state


def _save(folder: Path, state: dict[str, torch.Tensor]) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE)
        dcp.save(state, checkpoint_id=folder, no_dist=True)


def _records(folder: Path) -> dict[str, tuple[str, int, int]]:
    """``{fqn: (file, offset, length)}`` as stock DCP reads them."""
    metadata = dcp.FileSystemReader(folder).read_metadata()
    return {
        index.fqn: (info.relative_path, info.offset, info.length)
        for index, info in metadata.storage_data.items()
    }


@pytest.fixture(scope="module")
def model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


@pytest.fixture(scope="module")
def written(model: TinyLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model`` through a ``.safetensors`` file (the tie recorded) and ``write_dcp``."""
    tmp = tmp_path_factory.mktemp("dcp")
    path = _safetensors(tmp / "model.safetensors", model.state_dict(), TIE)
    with SafetensorsFile(path) as source:
        return write_dcp(tmp / "out", Plan.identity(source), source, inputs=[path])


def test_stock_dcp_load_fills_a_fresh_model_bit_for_bit(model, written):
    torch.manual_seed(1)
    fresh = TinyLM()
    state = _load(written, fresh.state_dict())
    fresh.load_state_dict(state, strict=True)
    for name, want in model.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert _bits(got) == _bits(want), name
    assert sorted(p.name for p in written.iterdir()) == sorted(
        [DCP_METADATA_FILE, DCP_DATA_FILE, ALIAS_MAP_FILE]
    )
    assert AliasMap.from_json((written / ALIAS_MAP_FILE).read_text()) == TIE


def test_the_tie_is_stored_once_where_dcp_save_stores_it_twice(model, written, tmp_path):
    records = _records(written)
    assert records["lm_head.weight"] == records["wte.weight"]  # Same file, offset, length.
    assert len(set(records.values())) == len(records) - 1
    state = model.state_dict()
    unique = sum(t.nbytes for k, t in state.items() if k != "lm_head.weight")
    ours = (written / DCP_DATA_FILE).stat().st_size
    assert unique <= ours <= unique + 1536 * len(set(records.values()))  # Headers only.
    _save(tmp_path / "stock", state)
    theirs = (tmp_path / "stock" / DCP_DATA_FILE).stat().st_size
    assert theirs >= unique + state["lm_head.weight"].nbytes  # The tie, twice.
    assert ours < theirs - 0.9 * state["wte.weight"].nbytes


def test_the_metadata_is_what_dcp_save_writes_but_the_offsets(model, written, tmp_path):
    _save(tmp_path / "stock", model.state_dict())
    ours = dcp.FileSystemReader(written).read_metadata()
    theirs = dcp.FileSystemReader(tmp_path / "stock").read_metadata()
    assert ours.state_dict_metadata == theirs.state_dict_metadata  # dtypes, sizes, chunks
    assert ours.planner_data == theirs.planner_data
    assert ours.version == theirs.version
    assert set(ours.storage_data) == set(theirs.storage_data)
    assert ours.storage_meta.modules == [] and ours.storage_meta.checkpoint_id is None
    # Written without torch, and deterministic: the same plan gives the same bytes.
    data = (written / DCP_METADATA_FILE).read_bytes()
    assert data == _dcp_write._metadata_pickle(_fqns(written))


def _fqns(folder: Path) -> dict:
    """The ``(info, record)`` of each FQN of ``folder``, read back with torch."""
    metadata = dcp.FileSystemReader(folder).read_metadata()
    out = {}
    for index, info in metadata.storage_data.items():
        md = metadata.state_dict_metadata[index.fqn]
        dtype = str(md.properties.dtype).removeprefix("torch.")
        out[index.fqn] = (
            ArrayInfo(tuple(md.size), dtype),
            _torch_zip.Record(info.offset, info.length),
        )
    return out


def test_every_record_is_a_valid_aligned_torch_save_archive(model, written, tmp_path):
    data = (written / DCP_DATA_FILE).read_bytes()
    state = model.state_dict()
    for fqn, (_, offset, length) in _records(written).items():
        record = data[offset : offset + length]
        with zipfile.ZipFile(io.BytesIO(record)) as z:
            assert z.testzip() is None, fqn  # Every CRC right.
            info = z.getinfo("archive/data/0")
            local = info.header_offset
            names, extra = struct.unpack("<HH", record[local + 26 : local + 30])
            start = offset + local + 30 + names + extra
            assert start % 64 == 0, fqn
            assert z.read("archive/byteorder") == b"little"
        got = torch.load(io.BytesIO(record), weights_only=True)
        assert _bits(got) == _bits(state[fqn]) and got.stride() == state[fqn].stride(), fqn
        (tmp_path / "record.pt").write_bytes(record)  # Its storage a view of the file:
        mapped = torch.load(tmp_path / "record.pt", weights_only=True, mmap=True)
        assert _bits(mapped) == _bits(state[fqn]), fqn


def test_a_permuted_tie_is_written_out_as_its_own_record(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    ties = AliasMap({"head.weight": "wte.weight", "proj.weight": "wte.weight"},
                    transforms={"proj.weight": (1, 0)})  # fmt: skip
    source = Arrays({"wte.weight": w}, ties)
    seen = []
    out = write_dcp(
        tmp_path / "out", Plan.identity(source), source, progress=lambda *a: seen.append(a)
    )
    state = {k: torch.zeros(s) for k, s in [("wte.weight", (3, 4)), ("head.weight", (3, 4))]}
    state["proj.weight"] = torch.zeros(4, 3)
    _load(out, state)
    assert np.array_equal(state["proj.weight"].numpy(), w.T)
    assert np.array_equal(state["head.weight"].numpy(), w)
    records = _records(out)
    assert records["head.weight"] == records["wte.weight"] != records["proj.weight"]
    assert AliasMap.from_json((out / ALIAS_MAP_FILE).read_text()) == ties  # Still recorded.
    assert seen == [(1, 2, "wte.weight", 48), (2, 2, "proj.weight", 48)]


def test_the_naming_record_stands_beside_the_alias_map(tmp_path):
    naming = NamingRecord({"params/wte/embedding": "wte.weight"})
    source = Arrays({"wte.weight": np.ones((2, 2), np.float32)}, AliasMap().with_naming(naming))
    out = write_dcp(tmp_path / "out", Plan.identity(source), source)
    assert NamingRecord.from_json((out / NAMING_FILE).read_text()) == naming


def test_zip64_records_load_too(tmp_path, monkeypatch):
    """Records past 4 GiB take zip64 fields; forced here on small ones."""
    monkeypatch.setattr(_torch_zip, "_ZIP64_AT", 0)
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "e": np.zeros(0, np.int8)}
    source = Arrays(arrays)
    out = write_dcp(tmp_path / "out", Plan.identity(source), source)
    data = (out / DCP_DATA_FILE).read_bytes()
    for _, offset, length in _records(out).values():
        with zipfile.ZipFile(io.BytesIO(data[offset : offset + length])) as z:
            assert z.testzip() is None
            assert all(i.extract_version == 45 for i in z.infolist())
    state = _load(out, {"a": torch.zeros(2, 3), "e": torch.ones(0, dtype=torch.int8)})
    assert np.array_equal(state["a"].numpy(), arrays["a"])


def test_big_endian_arrays_are_stored_little_endian(tmp_path):
    want = np.arange(5, dtype=np.int32)
    source = Arrays({"x": want.astype(">i4")})
    out = write_dcp(tmp_path / "out", Plan.identity(source), source)
    assert np.array_equal(_load(out, {"x": torch.zeros(5, dtype=torch.int32)})["x"].numpy(), want)


@pytest.mark.subprocess
def test_written_without_torch(tmp_path, run_python):
    arrays = {"wte.weight": np.arange(8, dtype=np.float32).reshape(4, 2)}
    path = tmp_path / "m.safetensors"
    specs = [TensorSpec("wte.weight", (4, 2), np.dtype("float32"))]
    with write_safetensors(
        path, specs, {ALIAS_MAP_KEY: AliasMap({"h": "wte.weight"}).to_json()}
    ) as w:
        w([arrays["wte.weight"]])
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from jaxshare.formats import SafetensorsFile\n"
        "from jaxshare.formats.dcp.writer import write_dcp\n"
        "from jaxshare.stream import Plan\n"
        "with SafetensorsFile(sys.argv[1]) as s:\n"
        "    write_dcp(sys.argv[2], Plan.identity(s), s)\n"
        "assert sys.modules['torch'] is None\n"
        "print('jax' in sys.modules)\n"
    )
    done = run_python(script, path, tmp_path / "out", timeout=120)
    assert done.stdout.strip() == "False"  # No JAX either.
    state = _load(tmp_path / "out", {"wte.weight": torch.zeros(4, 2), "h": torch.zeros(4, 2)})
    assert np.array_equal(state["h"].numpy(), arrays["wte.weight"])


class Failing(Arrays):
    def read(self, name: str) -> np.ndarray:
        if name == "b":
            raise OSError("disk gone")
        return super().read(name)


def test_a_failure_leaves_nothing_and_an_output_is_replaced_only_with_force(tmp_path):
    arrays = {"a": np.ones(3, np.float32), "b": np.ones(2, np.int64)}
    failing = Failing(arrays)
    with pytest.raises(OSError, match="disk gone"):
        write_dcp(tmp_path / "new" / "out", Plan.identity(failing), failing)
    assert list(tmp_path.iterdir()) == []  # No folder, no temporary, no parent made for it.

    source = Arrays(arrays)
    out = write_dcp(tmp_path / "out", Plan.identity(source), source)
    before = (out / DCP_METADATA_FILE).read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        write_dcp(out, Plan.identity(source), source)
    with pytest.raises(OSError, match="disk gone"):
        write_dcp(out, Plan.identity(failing), failing, force=True)
    assert (out / DCP_METADATA_FILE).read_bytes() == before  # The old output intact.
    smaller = Arrays({"a": arrays["a"]})
    write_dcp(out, Plan.identity(smaller), smaller, force=True)
    assert list(_records(out)) == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    other = tmp_path / "other"
    other.mkdir()
    (other / DCP_METADATA_FILE).touch()
    (other / "notes.txt").write_text("mine")
    assert not holds_only_dcp(other)
    with pytest.raises(ValueError, match="not a PyTorch DCP folder"):
        write_dcp(other, Plan.identity(source), source, force=True)
    with pytest.raises(ValueError, match="is the input"):
        write_dcp(out, Plan.identity(source), source, force=True, inputs=[out])


def test_plans_that_dcp_cannot_hold_are_refused_before_writing(tmp_path):
    entry = PlanEntry("x", "x", None, ArrayInfo((2,), "float8_e3m4"))
    source = Arrays({"x": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="'x' has dtype float8_e3m4"):
        write_dcp(tmp_path / "out", Plan((entry,), AliasMap()), source)
    ok = PlanEntry("x", "x", None, ArrayInfo((2,), "float32"))
    with pytest.raises(ValueError, match="'b' names 'missing'"):
        write_dcp(tmp_path / "out", Plan((ok,), AliasMap({"b": "missing"})), source)
    with pytest.raises(ValueError, match=r"stores \['x'\] more than once"):
        write_dcp(tmp_path / "out", Plan((ok, ok), AliasMap()), source)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_fsdp2_on_two_gloo_ranks_loads_it(model, written, run_processes):
    reference = written.parent / "reference.pt"
    torch.save(model.state_dict(), reference)
    results = run_processes(Path(__file__), str(written), str(reference), timeout=120)
    for status, output in results:
        assert status == 0, output[-3000:]
        result = json.loads(output.strip().splitlines()[-1])
        assert result["wrong"] == [], result
        assert result["names"] == sorted(model.state_dict())
        assert {"wte.weight", "lm_head.weight", "fc.weight"} <= set(result["sharded"])


# -- the round-trip law --------------------------------------------------------------------

DTYPES = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool, "complex64": torch.complex64,
    # Pickled as untyped storages (torch has no typed storage class for them):
    "uint16": torch.uint16, "uint64": torch.uint64, "float8_e4m3fn": torch.float8_e4m3fn,
}  # fmt: skip


@st.composite
def state_dicts(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], AliasMap]:
    names = draw(
        st.lists(st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
                 min_size=1, max_size=5, unique=True)
    )  # fmt: skip
    arrays = {}
    for name in names:
        dtype = np.dtype(draw(st.sampled_from(sorted(DTYPES))))  # (bfloat16: ml_dtypes)
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        count = int(np.prod(shape))
        raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        array = np.frombuffer(raw, np.uint8).copy()
        if dtype == np.bool_:
            array %= 2
        arrays[name] = array.view(dtype).reshape(shape)
    tied = [n for n in names[1:] if draw(st.booleans())]  # Aliases of the first name.
    ties = AliasMap(dict.fromkeys(tied, names[0]))
    for alias in tied:
        del arrays[alias]
    return arrays, ties


def _expanded(arrays: dict, ties: AliasMap) -> Iterator[tuple[str, np.ndarray]]:
    yield from arrays.items()
    for alias, canonical in ties.items():
        yield alias, arrays[canonical]


@settings(max_examples=25, deadline=None)
@given(state_dicts())
def test_any_small_state_dict_round_trips_through_stock_dcp_load(case):
    arrays, ties = case
    source = Arrays(arrays, ties)
    with tempfile.TemporaryDirectory() as tmp:
        out = write_dcp(Path(tmp) / "out", Plan.identity(source), source)
        want = dict(_expanded(arrays, ties))
        state = {
            k: torch.empty(a.shape, dtype=DTYPES[a.dtype.name]).fill_(1) for k, a in want.items()
        }
        _load(out, state)
        for name, a in want.items():
            assert _bits(state[name]) == a.tobytes(), name
        records = _records(out)
        for alias, canonical in ties.items():
            assert records[alias] == records[canonical]


def test_the_metadata_unpickles_with_only_dcp_classes(written):
    """What a restricted reader must allow: the globals the pickle names."""
    names = set()

    class Names(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            names.add(f"{module}.{name}")
            return super().find_class(module, name)

    with open(written / DCP_METADATA_FILE, "rb") as f:
        Names(f).load()
    metadata = "torch.distributed.checkpoint.metadata."
    assert names == {
        f"{metadata}{n}"
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
        )
    } | {  # fmt: skip
        "torch.distributed.checkpoint.filesystem._StorageInfo",
        "torch.Size",
        "torch.serialization._get_layout",
        "torch.float32",
        "torch.bfloat16",
        "torch.int64",
    }


if __name__ == "__main__":  # One rank of the two-rank test.
    rank, world, port, folder, reference = sys.argv[1:6]
    print(json.dumps(_worker(int(rank), int(world), int(port), folder, reference)), flush=True)
