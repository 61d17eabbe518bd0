"""PyTorch files read with numpy only: jaxshare's restricted unpickler of ``torch.save``
output, zip and legacy, and ``TorchFile``, a state-dict file as a ``TensorSource``.

Files are written by the real ``torch.save`` (and, where a test needs a pickle torch
would never write, crafted as torch lays them out); the reader never imports torch, and
what it reads is compared with ``torch.load``'s bit for bit.
"""

import collections
import contextlib
import os
import pickle
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxshare.formats import TorchFile, open_weights_file, unpickle_torch_file
from jaxshare.formats.deepspeed.files import (
    STAND_INS,
    FragmentAddress,
    LossScalerState,
    load_deepspeed_file,
)

FORMATS = ["zip", "legacy"]
#: Dtypes torch saves as untyped storages (``_rebuild_tensor_v3``), in zip files only.
NEW_DTYPES = {torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64}


def _save(obj, path, fmt):
    torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
    return path


def _bits(a) -> bytes:
    a = a.detach().contiguous() if isinstance(a, torch.Tensor) else np.ascontiguousarray(a)
    if isinstance(a, torch.Tensor):
        return a.reshape(-1).view(torch.uint8).numpy().tobytes() if a.numel() else b""
    return a.reshape(-1).view(np.uint8).tobytes()


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
]  # fmt: skip


#: Every dtype in every format, but a legacy file of the new dtypes: torch writes one,
#: yet ``torch.load`` itself cannot read it back, so there is nothing to compare with.
DTYPE_CASES = [(d, f) for d in DTYPES for f in FORMATS if not (f == "legacy" and d in NEW_DTYPES)]


@pytest.mark.parametrize(
    ("dtype", "fmt"), DTYPE_CASES, ids=[f"{d}-{f}".removeprefix("torch.") for d, f in DTYPE_CASES]
)
def test_every_dtype_reads_as_torch_load_reads_it(tmp_path, fmt, dtype):
    values = torch.arange(-6, 6).reshape(3, 4).to(dtype)
    state = {"w": values, "t": values.t(), "row": values[1], "p": torch.nn.Parameter(
        torch.arange(4.0), requires_grad=False)}  # fmt: skip
    path = _save(state, tmp_path / "m.pt", fmt)
    want = torch.load(path, weights_only=True)
    got = unpickle_torch_file(path)
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].shape == tuple(tensor.shape), name
        assert got[name].dtype.itemsize == tensor.element_size(), name
        assert _bits(got[name]) == _bits(tensor), name
    assert "torch" in sys.modules  # (the test wrote the file; the reader needs none of it)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_are_storages_and_permuted_views(tmp_path, fmt):
    w = torch.arange(6.0).reshape(2, 3)
    empty = torch.zeros(0, 3)
    state = {"wte.weight": w, "lm_head.weight": w, "proj.weight": w.t(), "row": w[1],
             "gate": empty, "gate2": empty, "other": torch.zeros(0, 3)}  # fmt: skip
    with TorchFile(_save(state, tmp_path / "m.pt", fmt)) as f:
        assert dict(f.ties) == {
            "lm_head.weight": "wte.weight",
            "proj.weight": "wte.weight",
            "gate2": "gate",  # one zero-size object under two names: one tensor
        }
        assert f.ties.transforms == {"proj.weight": (1, 0)}
        assert set(f.origins.values()) == {"storage"} and f.written_out == frozenset()
        np.testing.assert_array_equal(f.array("proj.weight"), w.t().numpy())
        assert list(f.infos) == list(state)


@pytest.mark.parametrize("fmt", FORMATS)
def test_modes_say_where_the_memory_is_and_never_write_the_file(tmp_path, fmt):
    path = _save({"w": torch.ones(4)}, tmp_path / "m.pt", fmt)
    before = path.read_bytes()
    read = unpickle_torch_file(path)["w"]
    assert not read.flags.writeable
    for mode in ("copy-on-write", "memory"):
        w = unpickle_torch_file(path, mode=mode)["w"]
        w[:] = 7
        assert (unpickle_torch_file(path)["w"] == 1).all(), mode
    assert path.read_bytes() == before


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from([d for d in DTYPES if d not in NEW_DTYPES]), min_size=1, max_size=5),
    st.sampled_from(FORMATS),
    st.lists(st.integers(0, 4), max_size=4),
    st.integers(0, 2),
)
def test_random_state_dicts_read_bit_exact_with_their_ties(
    tmp_path_factory, dtypes, fmt, tied, rank
):
    shape = (2, 3, 2)[: rank + 1]
    state = {f"m{i}.weight": torch.arange(np.prod(shape)).reshape(shape).to(d) for i, d in
             enumerate(dtypes)}  # fmt: skip
    names = list(state)
    for j, i in enumerate(tied):
        state[f"tie{j}.weight"] = state[names[i % len(names)]]
    path = _save(state, tmp_path_factory.mktemp("f") / "m.pt", fmt)
    want = torch.load(path, weights_only=True)
    with TorchFile(path) as f:
        for name, tensor in want.items():
            assert _bits(f.array(name)) == _bits(tensor), name
        for alias, canonical in f.ties.items():
            assert want[alias].data_ptr() == want[canonical].data_ptr(), alias
        assert all(state[a] is state[c] for a, c in f.ties.items() if a.startswith("tie"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_deepspeed_model_file_gives_its_module_with_the_recorded_ties(tmp_path, fmt):
    w = torch.ones(4, 2)
    path = _save({"module": {"wte.weight": w}, "shared_params": {"lm_head.weight": "wte.weight"}},
                 tmp_path / "mp_rank_00_model_states.pt", fmt)  # fmt: skip
    with open_weights_file(path) as f:
        assert f.kind == "torch" and dict(f.ties) == {"lm_head.weight": "wte.weight"}
        assert f.origins == {"lm_head.weight": "shared_params"}


class _RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("fmt", [*FORMATS, "plain pickle"])
def test_a_payload_never_runs(tmp_path, fmt):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    if fmt == "plain pickle":
        path.write_bytes(pickle.dumps({"x": _RunsCode(marker)}, protocol=2))
    else:
        _save({"w": torch.ones(2), "x": _RunsCode(marker)}, path, fmt)
    with pytest.raises(ValueError, match=r"refused: .*GLOBAL posix\.system") as info:
        unpickle_torch_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda data: data[: len(data) // 2], "runs past the end of the file|EOFError|truncated"),
        (lambda data: data[:-3], "runs past the end of the file"),
        (
            lambda data: (
                pickle.dumps(1234, protocol=2)
                + data[len(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)) :]
            ),
            "magic number",
        ),  # fmt: skip
    ],
    ids=["half", "short", "magic"],
)
def test_a_damaged_legacy_file_is_one_line(tmp_path, damage, match):
    path = _save({"w": torch.arange(64.0)}, tmp_path / "old.pt", "legacy")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=match) as info:
        unpickle_torch_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


@contextlib.contextmanager
def fake_deepspeed(on_build=None):
    """Modules named as DeepSpeed's, with classes of those names, so torch.save
    pickles objects as DeepSpeed's files do. ``on_build`` runs if a loader ever
    calls the fake classes' own code."""
    made = {}

    def setstate(self, state):
        if on_build is not None:
            on_build()
        self.__dict__.update(state)

    def getstate(self):
        return self.__dict__["pickled_state"]

    def init(self, *args):
        if on_build is not None:
            on_build()

    for fq in STAND_INS:
        module, name = fq.rsplit(".", 1)
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            made.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        attrs = {"__module__": module, "__init__": init, "__setstate__": setstate,
                 "__getstate__": getstate}  # fmt: skip
        cls = type(name, (), attrs)
        setattr(made[module], name, cls)
    saved = {k: sys.modules.get(k) for k in made}
    sys.modules.update(made)
    try:
        yield {fq: getattr(made[fq.rsplit(".", 1)[0]], fq.rsplit(".", 1)[1]) for fq in STAND_INS}
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


class _Reduce:
    """Pickles as ``func(*args)`` (REDUCE)."""

    def __init__(self, func, args=()):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _built(cls, state):
    """An object of fake class ``cls`` that pickles as DeepSpeed's objects do:
    ``cls.__new__(cls)`` (NEWOBJ), then ``state`` (BUILD)."""
    obj = cls.__new__(cls)
    obj.__dict__["pickled_state"] = state
    return obj


def test_deepspeeds_classes_load_as_inert_stand_ins(tmp_path):
    ran = []
    with fake_deepspeed(on_build=lambda: ran.append("their code")) as ds:
        scaler = _built(ds["deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"],
                        {"cur_scale": 65536.0, "dtype": torch.float16})  # fmt: skip
        address = _built(ds["deepspeed.utils.tensor_fragment.fragment_address"],
                         {"numel": 279, "start": 0})  # fmt: skip
        stage = _Reduce(ds["deepspeed.runtime.zero.config.ZeroStageEnum"], (3,))
        torch.save({"scaler": scaler, "address": address, "stage": stage}, tmp_path / "ds.pt")
        # The fake modules are importable during the load: their code still never runs.
        loaded = load_deepspeed_file(tmp_path / "ds.pt")
        assert ran == []
        torch.load(tmp_path / "ds.pt", weights_only=False)  # what zero_to_fp32 does
        assert ran == ["their code"] * 3
    assert type(loaded["scaler"]) is LossScalerState and loaded["scaler"].cur_scale == 65536.0
    assert type(loaded["address"]) is FragmentAddress
    assert (loaded["address"].numel, loaded["address"].start) == (279, 0)
    assert loaded["stage"] == 3 and loaded["stage"].name == "weights"


@pytest.mark.parametrize(
    "fq, how, match",
    [
        (
            "deepspeed.runtime.fp16.loss_scaler.LossScaler",
            "call",
            "refused: .*LossScalerState is rebuilt from its attributes only",
        ),
        ("deepspeed.runtime.zero.config.ZeroStageEnum", "call", "not a valid ZeroStage"),
        ("deepspeed.utils.tensor_fragment.fragment_address", "list", "expects a dict"),
    ],
)
def test_a_stand_in_used_otherwise_is_refused(tmp_path, fq, how, match):
    with fake_deepspeed() as ds:
        obj = (_Reduce(ds[fq], ("rm -rf /",)) if how == "call" else
               _built(ds[fq], ["__class__", "x"]))  # fmt: skip
        if fq.endswith("ZeroStageEnum"):
            obj = _Reduce(ds[fq], (9,))
        torch.save({"x": obj}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=match) as info:
        load_deepspeed_file(tmp_path / "odd.pt")
    assert str(info.value).startswith(f"{tmp_path / 'odd.pt'}: ") and "\n" not in str(info.value)


def test_a_stand_in_keeps_state_as_data(tmp_path):
    with fake_deepspeed() as ds:
        obj = _built(
            ds["deepspeed.runtime.fp16.loss_scaler.LossScaler"],
            {"__class__": "builtins.dict", "__reduce__": "x", "cur_scale": 1.0},
        )
        torch.save(obj, tmp_path / "s.pt")
    loaded = load_deepspeed_file(tmp_path / "s.pt")
    assert type(loaded) is LossScalerState
    assert loaded.state == {"__class__": "builtins.dict", "__reduce__": "x", "cur_scale": 1.0}


def test_deepspeeds_names_stay_refused_elsewhere(tmp_path):
    # The stand-ins are allowed only while a DeepSpeed file loads.
    with fake_deepspeed() as ds:
        torch.save(_Reduce(ds["deepspeed.runtime.zero.config.ZeroStageEnum"], (2,)),
                   tmp_path / "s.pt")  # fmt: skip
    assert load_deepspeed_file(tmp_path / "s.pt") == 2
    with pytest.raises(Exception, match="ZeroStageEnum"):
        torch.load(tmp_path / "s.pt", weights_only=True)


class _Tensor:
    """Pickles as ``func(storage, *args)``, the storage by persistent id, as torch does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, (_StorageRef(), *self.args))


class _StorageRef:
    pass


def _torch_zip(path, obj, key="0"):
    """A zip laid out as torch.save lays it out: ``obj`` pickled with each storage
    reference as ``("storage", torch.FloatStorage, key, "cpu", 4)``, storage "0"
    holding 0, 1, 2, 3."""
    import io
    import pickle
    import zipfile

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, _StorageRef):
                return ("storage", torch.FloatStorage, key, "cpu", storage.size)
            return None

    storage = np.arange(4, dtype=np.float32)
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        z.writestr("archive/data/0", storage.tobytes())
    return path


_REBUILD = torch._utils._rebuild_tensor_v2


def test_a_crafted_torch_zip_loads_as_torch_loads_it(tmp_path):
    path = _torch_zip(tmp_path / "ok.pt", {"w": _Tensor(_REBUILD, 1, (3,), (1,), False, {})})
    loaded = unpickle_torch_file(path)
    np.testing.assert_array_equal(loaded["w"], [1.0, 2.0, 3.0])
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.tensor([1.0, 2.0, 3.0]))
    assert not loaded["w"].flags.writeable


@pytest.mark.parametrize(
    "obj, match",
    [
        ({"w": _Tensor(_REBUILD, 0, (10,), (1,), False, {})}, "refused: .*reaches element 9"),
        ({"w": _Tensor(_REBUILD, 0, (2,), (-1,), False, {})}, "refused: .*stride"),
        ({"w": _Tensor(_REBUILD, 0, "x", (1,), False, {})}, "refused: .*not a tuple of ints"),
        (
            {"w": _Tensor(torch._tensor._rebuild_from_type_v2, torch.nn.Parameter, (), {})},
            r"refused: .*GLOBAL torch\.nn\.parameter\.Parameter",
        ),
        (
            {
                "w": _Reduce(
                    torch._tensor._rebuild_from_type_v2,
                    (collections.OrderedDict, torch.Tensor, (), {}),
                )
            },  # fmt: skip
            "refused: .*of anything but a plain torch.Tensor",
        ),
        ({"w": _Tensor(print, "x")}, r"refused: .*GLOBAL __builtin__\.print"),
    ],
)
def test_a_crafted_tensor_is_refused_in_one_line(tmp_path, obj, match):
    path = _torch_zip(tmp_path / "bad.pt", obj)
    with pytest.raises(ValueError, match=match) as info:
        unpickle_torch_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_a_storage_the_archive_lacks_is_named(tmp_path):
    path = _torch_zip(tmp_path / "bad.pt", {"w": _Tensor(_REBUILD, 0, (2,), (1,), False, {})},
                      key="7")  # fmt: skip
    with pytest.raises(ValueError, match="names storage '7', which the archive lacks"):
        unpickle_torch_file(path)
