"""``bridge.verify``: two checkpoints of any formats, bit for bit, through the naming records.

Each kind of damage a conversion can do (one flipped element, a transposed square
matrix, a swapped pair, a dropped tensor, an undeclared bf16 rounding, a renamed
layer, a shard left out of an index, a partial Orbax item, a tie lost) is made on
purpose and must be caught, with the right kind, for every pair of formats; and
every conversion route must verify clean, against its input and, with
``manifest=True``, against its own manifest.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16
from safetensors.numpy import save_file

import bridge
from jaxshare import AliasMap
from jaxshare.formats import MANIFEST_FILE, read_header
from jaxshare.internal import UsageError, tie_metadata

DATA = Path(__file__).resolve().parents[1] / "data"
TIES = {"lm_head.weight": "wte.weight"}


@pytest.fixture(scope="module")
def assert_verified(load_script: Callable) -> Callable:
    return load_script("tests/_support/verify_routes.py").assert_verified


#: The tensors of :func:`_model`, by name.
SHAPES = {
    "wte.weight": (10, 4),
    "h.0.fc.weight": (4, 4),
    "h.0.fc.bias": (4,),
    "h.1.fc.weight": (4, 4),
    "h.1.fc.bias": (4,),
    "ln_f.weight": (4,),
}


def _model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def _safetensors(tensors: dict, path: Path, ties: dict | None = None) -> Path:
    metadata = {"format": "pt", **tie_metadata(AliasMap(TIES if ties is None else ties))}
    save_file(tensors, str(path), metadata=metadata)
    return path


def _hf(tensors: dict, path: Path, ties: dict | None = None) -> Path:
    """A Hugging Face directory of two shards and an index, as ``save_pretrained`` lays it out."""
    path.mkdir()
    names = list(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for k, half in enumerate(halves, 1):
        shard = f"model-0000{k}-of-00002.safetensors"
        _safetensors({n: tensors[n] for n in half}, path / shard, ties if k == 1 else {})
        weight_map.update(dict.fromkeys(half, shard))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return path


def _orbax(tensors: dict, path: Path, ties: dict | None = None) -> Path:
    """An Orbax item jaxshare converts from the PyTorch-named tensors (Flax paths,
    a naming record)."""
    src = _safetensors(tensors, path.with_suffix(".in.safetensors"), ties)
    bridge.convert(src, path)
    return path


WRITERS = {"safetensors": _safetensors, "hf": _hf, "orbax": _orbax}


def _write(kind: str, tensors: dict, path: Path, ties: dict | None = None) -> Path:
    suffix = ".safetensors" if kind == "safetensors" else ""
    return WRITERS[kind](tensors, path.with_name(path.name + suffix), ties)


def _flip(t: dict) -> dict:
    w = t["h.0.fc.weight"].copy()
    w.view(np.uint32)[1, 2] ^= 1  # The last bit of one element.
    return {**t, "h.0.fc.weight": w}


def _swap(t: dict) -> dict:
    return {**t, "h.0.fc.weight": t["h.1.fc.weight"], "h.1.fc.weight": t["h.0.fc.weight"]}


def _rename(t: dict) -> dict:
    return {k.replace("h.1.", "h.2."): v for k, v in t.items()}


def _rounded(t: dict) -> dict:
    return {**t, "wte.weight": t["wte.weight"].astype(bfloat16).astype(np.float32)}


DAMAGE = {
    "one flipped element": (_flip, {("values", "h.0.fc")}),
    "a transposed square matrix": (
        lambda t: {**t, "h.0.fc.weight": np.ascontiguousarray(t["h.0.fc.weight"].T)},
        {("values", "h.0.fc")},
    ),
    "a swapped pair": (_swap, {("values", "h.0.fc"), ("values", "h.1.fc")}),
    "a dropped tensor": (
        lambda t: {k: v for k, v in t.items() if k != "ln_f.weight"},
        {("missing", "ln_f")},
    ),
    "an undeclared bf16 rounding": (_rounded, {("values", "wte")}),
    "an undeclared bf16 cast": (
        lambda t: {**t, "wte.weight": t["wte.weight"].astype(bfloat16)},
        {("dtype", "wte")},
    ),
    "a renamed layer": (_rename, {("missing", "h.1.fc"), ("extra", "h.2.fc")}),
}
PAIRS = [
    ("safetensors", "safetensors"),
    ("safetensors", "orbax"),
    ("orbax", "safetensors"),
    ("safetensors", "hf"),
    ("hf", "orbax"),
    ("orbax", "orbax"),
]


def _module(name: str) -> str:
    """``h.0.fc.weight`` and ``params/h/0/fc/kernel`` both as ``h.0.fc``."""
    parts = name.split("/") if "/" in name else name.split(".")
    parts = parts[1:] if parts[0] == "params" else parts
    return ".".join(parts[:-1])


def _kinds(report: bridge.VerifyReport) -> set[tuple[str, str]]:
    return {(f.kind, _module(f.name)) for f in report.differences}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reference")
    return {kind: _write(kind, _model(), root / kind) for kind in WRITERS}


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damage_is_caught_with_its_kind(references, tmp_path, a, b, damage):
    make, expected = DAMAGE[damage]
    damaged = _write(b, make(_model()), tmp_path / "b")
    report = bridge.verify(references[a], damaged)
    assert not report.ok
    assert _kinds(report) == expected, report.lines()
    assert all(f.error for f in report.findings), report.lines()


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_the_same_model_is_equal_in_every_pair_of_formats(references, a, b, tmp_path):
    report = bridge.verify(references[a], references[b])
    assert report.ok, report.lines()
    assert report.compared == 7  # Six stored tensors and the tied head.
    assert report.lines()[-1].startswith("equal: ")


def test_a_flipped_element_is_located_and_measured(references, tmp_path):
    damaged = _write("safetensors", _flip(_model()), tmp_path / "b")
    (finding,) = bridge.verify(references["safetensors"], damaged).differences
    want = _model()["h.0.fc.weight"][1, 2]
    got = _flip(_model())["h.0.fc.weight"][1, 2]
    assert finding.line == (
        f"values  h.0.fc.weight  1 of 16 elements differ, first at [1, 2], "
        f"max |Δ| {abs(float(want) - float(got)):.6g}"
    )


def test_a_shard_left_out_of_an_index_is_missing(references, tmp_path):
    damaged = shutil.copytree(references["hf"], tmp_path / "hf")
    index = damaged / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    left_out = "model-00002-of-00002.safetensors"
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if v != left_out}
    index.write_text(json.dumps(doc))
    (damaged / left_out).unlink()
    report = bridge.verify(references["safetensors"], damaged)
    assert {f.kind for f in report.differences} == {"missing"}
    assert {f.name for f in report.differences} == {"h.1.fc.weight", "h.1.fc.bias", "ln_f.weight"}


def test_a_partial_orbax_item_is_missing_the_leaf(references, tmp_path):
    damaged = shutil.copytree(references["orbax"], tmp_path / "item")
    metadata = damaged / "_METADATA"
    doc = json.loads(metadata.read_text())
    doc["tree_metadata"] = {
        k: v for k, v in doc["tree_metadata"].items() if "ln_f" not in k
    }  # Orbax restores what is left, in silence.
    metadata.write_text(json.dumps(doc))
    for a in ("safetensors", "orbax"):
        report = bridge.verify(references[a], damaged)
        assert _kinds(report) == {("missing", "ln_f")}, report.lines()


@pytest.mark.parametrize("b", ["safetensors", "hf", "orbax"])
def test_a_tie_lost_is_a_difference(references, tmp_path, b):
    untied = {**_model(), "lm_head.weight": _model()["wte.weight"] + 1}
    report = bridge.verify(references["safetensors"], _write(b, untied, tmp_path / "b", ties={}))
    assert [f.kind for f in report.differences] == ["tie"], report.lines()
    assert "stores it apart with other values" in report.differences[0].detail
    dropped = bridge.verify(references["safetensors"], _write(b, _model(), tmp_path / "c", {}))
    assert _kinds(dropped) == {("missing", "lm_head")}, dropped.lines()


@pytest.mark.parametrize("b", ["safetensors", "hf"])
def test_a_tie_stored_as_a_bit_identical_copy_counts_and_is_said(references, tmp_path, b):
    copied = {**_model(), "lm_head.weight": _model()["wte.weight"].copy()}
    report = bridge.verify(references["safetensors"], _write(b, copied, tmp_path / "b", ties={}))
    assert report.ok, report.lines()
    (note,) = report.notes
    assert note.kind == "copy" and note.name == "lm_head.weight"
    assert "bit-identical: it counts as the tie" in note.line
    back = bridge.verify(_write(b, copied, tmp_path / "c", ties={}), references["safetensors"])
    assert back.ok and [f.kind for f in back.notes] == ["copy"], back.lines()


def test_a_tie_reversed_is_the_same_tie(references, tmp_path):
    t = _model()
    reversed_ = {
        **{k: v for k, v in t.items() if k != "wte.weight"},
        "lm_head.weight": t["wte.weight"],
    }
    b = _write("safetensors", reversed_, tmp_path / "b", ties={"wte.weight": "lm_head.weight"})
    assert bridge.verify(references["safetensors"], b).ok


def test_a_written_out_alias_must_be_its_canonical(tmp_path):
    t = _model()
    a = _write("safetensors", {**t, "lm_head.weight": t["wte.weight"]}, tmp_path / "a")
    assert bridge.verify(a, a).ok
    b = _write("safetensors", {**t, "lm_head.weight": t["wte.weight"] * 2}, tmp_path / "b")
    report = bridge.verify(a, b)
    assert [f.kind for f in report.differences] == ["tie"], report.lines()


def test_a_declared_cast_must_be_exactly_the_cast(references, tmp_path):
    t = _model()
    cast = {k: v.astype(bfloat16) for k, v in t.items()}
    b = _write("safetensors", cast, tmp_path / "b")
    assert bridge.verify(references["safetensors"], b, dtype="bfloat16").ok
    undeclared = bridge.verify(references["safetensors"], b)
    assert {f.kind for f in undeclared.differences} == {"dtype"}
    # One element off by one bf16 step: not the cast.
    off = {**cast, "h.0.fc.bias": cast["h.0.fc.bias"].copy()}
    off["h.0.fc.bias"].view(np.uint16)[0] ^= 1
    report = bridge.verify(
        references["safetensors"], _write("safetensors", off, tmp_path / "c"), dtype="bfloat16"
    )
    (finding,) = report.differences
    assert finding.kind == "values" and "B is not A cast to bfloat16" in finding.detail
    # A cast declared, none made: B's dtype is not the cast's.
    report = bridge.verify(references["safetensors"], references["safetensors"], dtype="bfloat16")
    assert {f.kind for f in report.differences} == {"dtype"}


def test_nans_with_equal_bits_are_equal_and_other_nans_are_not(tmp_path):
    x = np.array([np.nan, 1.0, -0.0], np.float32)
    a = _write("safetensors", {"w": x}, tmp_path / "a", ties={})
    assert bridge.verify(a, _write("safetensors", {"w": x.copy()}, tmp_path / "b", ties={})).ok
    y = x.copy()
    y.view(np.uint32)[0] ^= 1  # Another NaN.
    y[2] = 0.0  # +0 is not -0, bit for bit.
    (finding,) = bridge.verify(
        a, _write("safetensors", {"w": y}, tmp_path / "c", ties={})
    ).differences
    assert finding.detail.startswith("2 of 3 elements differ, first at [0]")


def test_the_limit_bounds_the_lines_not_the_findings(references, tmp_path):
    b = _write("safetensors", {k: v + 1 for k, v in _model().items()}, tmp_path / "b")
    report = bridge.verify(references["safetensors"], b, limit=2)
    assert len(report.differences) == 6
    assert report.lines()[2] == "... and 4 more differences (--limit to show them)"
    assert report.lines()[-1].startswith("6 differences: ")
    doc = json.loads(report.to_json())
    assert doc["equal"] is False and len(doc["differences"]) == 6


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: bridge.verify(p, limit=-1), UsageError, "`limit` must be an int >= 0"),
        (lambda p: bridge.verify(p, p, dtype="int8"), UsageError, "must be a floating dtype"),
        (lambda p: bridge.verify(p, dtype="bfloat16"), UsageError, "one input"),
        (lambda p: bridge.verify(p), ValueError, "expected a manifest"),
        (lambda p: bridge.verify(p, p.parent / "nope"), FileNotFoundError, "nope"),
    ],
)
def test_bad_calls_are_one_line(references, call, error, match):
    with pytest.raises(error, match=match) as info:
        call(references["safetensors"])
    assert "\n" not in str(info.value)


# --- Manifests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "options"),
    [
        ("safetensors", "item", {}),
        ("safetensors", "out.safetensors", {}),
        ("orbax", "flax.safetensors", {}),
        ("orbax", "torch.safetensors", {"names": "torch"}),
        ("orbax", "hf", {"format": "hf", "max_shard_size": "200"}),
        ("orbax", "hf1", {"format": "hf"}),
        ("safetensors", "bf16", {"dtype": "bfloat16"}),
    ],
)
def test_a_manifest_round_trip_verifies_alone(
    references, tmp_path, src, dst, options, assert_verified
):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "tiny", "tie_word_embeddings": False}))
    if options.get("format") == "hf":
        options = {**options, "config": config}
    out = bridge.convert(references[src], tmp_path / dst, manifest=True, **options)
    report = assert_verified(out)
    assert report.naming == "manifest" and report.compared >= 6
    assert_verified(references[src], out, dtype=options.get("dtype"))


def test_a_tampered_output_is_caught_by_its_manifest(references, tmp_path):
    out = bridge.convert(references["safetensors"], tmp_path / "out.safetensors", manifest=True)
    header = read_header(out)
    entry = header.tensors["h.0.fc.weight"]
    data = bytearray(out.read_bytes())
    data[header.data_start + entry.begin] ^= 1  # One bit of its first element.
    out.write_bytes(bytes(data))
    report = bridge.verify(out)
    assert [(f.kind, f.name) for f in report.differences] == [("hash", "h.0.fc.weight")]


def test_a_tampered_item_is_caught_by_its_manifest(references, tmp_path):
    item = bridge.convert(references["safetensors"], tmp_path / "item", manifest=True)
    doc = json.loads((item / MANIFEST_FILE).read_text())
    assert doc["format"] == "jaxshare.manifest" and doc["version"] == 1
    name = "params/h/0/fc/kernel"
    doc["tensors"][name]["sha256"] = "0" * 64
    doc["tensors"]["params/extra/kernel"] = doc["tensors"].pop("params/ln_f/scale")
    (item / MANIFEST_FILE).write_text(json.dumps(doc))
    report = bridge.verify(item)
    assert {(f.kind, f.name) for f in report.differences} == {
        ("hash", name),
        ("missing", "params/extra/kernel"),
        ("extra", "params/ln_f/scale"),
    }


def test_a_manifest_is_refused_for_outputs_that_cannot_hold_one(references, tmp_path):
    with pytest.raises(UsageError, match="--manifest is written into"):
        bridge.convert(references["orbax"], tmp_path / "out.pt", manifest=True)


def test_an_invalid_manifest_is_one_line_naming_the_file(references, tmp_path):
    item = bridge.convert(references["safetensors"], tmp_path / "item", manifest=True)
    (item / MANIFEST_FILE).write_text('{"format": "jaxshare.manifest", "version": true}')
    with pytest.raises(ValueError, match=f"{MANIFEST_FILE}: manifest JSON has version True"):
        bridge.verify(item)


# --- Properties ---------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16", "int32", "uint8", "bool", "float64", "int64"]


@st.composite
def _trees(draw: st.DrawFn) -> dict[str, np.ndarray]:
    out = {}
    for i in range(draw(st.integers(1, 4))):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
        dtype = np.dtype(draw(st.sampled_from(DTYPES)).replace("bfloat16", "V2"))
        if dtype == np.dtype("V2"):
            dtype = np.dtype(bfloat16)
        size = int(np.prod(shape)) * dtype.itemsize
        raw = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), np.uint8)
        array = (
            raw.view(dtype).reshape(shape)
            if dtype.kind != "b"
            else (raw % 2).astype(bool).reshape(shape)
        )
        out[f"m{i}.weight"] = array.copy()
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=_trees(), data=st.data())
def test_verify_of_a_tree_with_itself_is_clean_and_a_flipped_bit_is_caught(
    tmp_path_factory, tree, data
):
    root = tmp_path_factory.mktemp("prop")
    a = _write("safetensors", tree, root / "a", ties={})
    assert bridge.verify(a, _write("safetensors", tree, root / "same", ties={})).ok
    name = data.draw(st.sampled_from(sorted(tree)))
    flipped = {k: v.copy() for k, v in tree.items()}
    raw = flipped[name].reshape(-1).view(np.uint8)
    byte = data.draw(st.integers(0, raw.size - 1))
    bit = data.draw(st.integers(0, 0 if flipped[name].dtype.kind == "b" else 7))
    raw[byte] ^= np.uint8(1 << bit)
    report = bridge.verify(a, _write("safetensors", flipped, root / "flipped", ties={}))
    assert [(f.kind, f.name) for f in report.differences] == [("values", name)], report.lines()
    assert "1 of" in report.differences[0].detail


# --- Every conversion route -----------------------------------------------------------


def _torch_file(tmp_path: Path) -> Path:
    torch = pytest.importorskip("torch")
    t = {k: torch.from_numpy(v) for k, v in _model().items()}
    t["lm_head.weight"] = t["wte.weight"]  # One storage: the tie.
    path = tmp_path / "model.pt"
    torch.save(t, path)
    return path


def _msgpack(tmp_path: Path) -> Path:
    from flax import serialization

    t = _model()
    params = {
        "params": {
            "wte": {"embedding": t["wte.weight"]},
            "h": {
                str(i): {
                    "fc": {"kernel": t[f"h.{i}.fc.weight"].T.copy(), "bias": t[f"h.{i}.fc.bias"]}
                }
                for i in (0, 1)
            },
        }
    }
    path = tmp_path / "flax_model.msgpack"
    path.write_bytes(serialization.msgpack_serialize(params))
    return path


def _gpt2_hf(tmp_path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    path = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(path, max_shard_size="6KB")
    return path


def _input(kind: str, tmp_path: Path, references: dict[str, Path]) -> Path:
    if kind in references:
        return references[kind]
    if kind == "torch":
        return _torch_file(tmp_path)
    if kind == "msgpack":
        return _msgpack(tmp_path)
    if kind == "gpt2":
        return _gpt2_hf(tmp_path)
    if kind == "gpt2-item":
        return bridge.convert(_gpt2_hf(tmp_path), tmp_path / "gpt2-item")
    if kind.startswith("transformers_flax/"):
        return DATA / kind / "flax_model"
    if kind.startswith("deepspeed/"):
        return DATA / "deepspeed" / kind.split("/", 1)[1]
    if kind.startswith("dcp/"):
        return DATA / "dcp" / kind.split("/", 1)[1]
    raise AssertionError(kind)


#: input -> the routes from it: (output name, convert options). Every output but a
#: PyTorch file and a DCP folder records a manifest, which is checked on its own too.
ROUTES_FROM = {
    "safetensors": [("item", {}), ("bf16-item", {"dtype": "bfloat16"})],
    "orbax": [
        ("flax.safetensors", {}),
        ("torch.safetensors", {"names": "torch"}),
        ("model.pt", {"manifest": False}),
        ("dcp", {"format": "dcp", "manifest": False}),
    ],
    "hf": [("item", {})],
    "gpt2": [("item", {}), ("item.safetensors", {}), ("bf16.safetensors", {"dtype": "bfloat16"})],
    "gpt2-item": [("hf", {"format": "hf"})],
    "torch": [("item", {})],
    "msgpack": [("item", {}), ("torch.safetensors", {"names": "torch"})],
    "deepspeed/gpt2_z2_w2_bf16": [("out.safetensors", {})],
    "deepspeed/gpt2_z3_w2_fp16": [("item", {})],
    "deepspeed/t5_z2_w2_fp32": [("item", {})],
    "dcp/flat": [("item", {})],
    "dcp/sharded": [("out.safetensors", {})],
    "transformers_flax/gpt2": [("item", {"layout": "jaxshare"}), ("hf", {"format": "hf"})],
}
ROUTES = [(src, dst, options) for src, routes in ROUTES_FROM.items() for dst, options in routes]


@pytest.mark.parametrize(("src", "dst", "options"), ROUTES, ids=[f"{s}->{d}" for s, d, _ in ROUTES])
def test_verify_passes_on_every_conversion_route(
    references, tmp_path, src, dst, options, assert_verified
):
    if dst.endswith(".pt"):
        pytest.importorskip("torch")
    source = _input(src, tmp_path, references)
    options = {"manifest": True, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (A training checkpoint's notes.)
        out = bridge.convert(source, tmp_path / dst, **options)
    report = assert_verified(source, out, dtype=options.get("dtype"))
    assert report.compared > 0
    if options["manifest"]:
        assert_verified(out)


def test_a_consolidated_item_with_its_aliases_written_out_against_the_torch_file(
    references, tmp_path
):
    flat = bridge.convert(references["orbax"], tmp_path / "flat.safetensors")
    assert "params/lm_head/kernel" in read_header(flat).tensors  # Written out, transposed.
    report = bridge.verify(references["safetensors"], flat)
    assert report.ok and report.naming == "torch", report.lines()
    # The written-out copy changed: caught though its canonical is intact.
    header = read_header(flat)
    data = bytearray(flat.read_bytes())
    data[header.data_start + header.tensors["params/lm_head/kernel"].begin] ^= 1
    (tmp_path / "bad.safetensors").write_bytes(bytes(data))
    report = bridge.verify(references["safetensors"], tmp_path / "bad.safetensors")
    assert [(f.kind, f.name) for f in report.differences] == [("tie", "lm_head.weight")]


def test_a_sharded_directory_is_checked_against_its_index_manifest(references, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "tiny", "tie_word_embeddings": False}))
    out = bridge.convert(
        references["orbax"], tmp_path / "hf", config=config, max_shard_size="200", manifest=True
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["jaxshare.manifest"]["format"] == "jaxshare.manifest"
    assert bridge.verify(out).ok
    weight_map = index["weight_map"]
    left_out = weight_map["ln_f.weight"]  # A shard left out of the index.
    gone = {n for n, f in weight_map.items() if f == left_out}
    changed = next(n for n, f in weight_map.items() if f != left_out)
    shard = out / weight_map[changed]
    header = read_header(shard)
    data = bytearray(shard.read_bytes())
    data[header.data_start + header.tensors[changed].begin] ^= 1
    shard.write_bytes(bytes(data))
    index["weight_map"] = {n: f for n, f in weight_map.items() if f != left_out}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / left_out).unlink()
    report = bridge.verify(out)
    assert {(f.kind, f.name) for f in report.differences} == {
        ("hash", changed),
        *(("missing", n) for n in gone),
    }


def test_a_directory_with_a_manifest_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    src = _gpt2_hf(tmp_path)
    item = bridge.convert(src, tmp_path / "item", manifest=True)
    out = bridge.convert(item, tmp_path / "out", format="hf", max_shard_size="6KB", manifest=True)
    assert (out / "model.safetensors.index.json").is_file()
    model, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not {k: v for k, v in info.items() if v}, info
    original = transformers.GPT2LMHeadModel.from_pretrained(src)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(model(ids).logits, original(ids).logits)
    assert bridge.verify(out).ok and bridge.verify(src, out).ok


@pytest.mark.parametrize("axis", [0, 1])
def test_stacked_layers_verify_and_a_stack_off_the_first_axis_is_noted_unhashed(tmp_path, axis):
    rng = np.random.default_rng(0)
    t = {f"model.layers.{i}.mlp.weight": rng.standard_normal((3, 5)).astype(np.float32)
         for i in range(4)}  # fmt: skip
    t["model.embed.weight"] = rng.standard_normal((7, 5)).astype(np.float32)
    src = _write("safetensors", t, tmp_path / "layers", ties={})
    item = bridge.convert(
        src, tmp_path / "item", stack="model.layers", stack_axis=axis, manifest=True
    )
    assert bridge.verify(src, item).ok and bridge.verify(item, src).ok
    report = bridge.verify(item)
    assert report.ok
    notes = [(f.kind, f.name) for f in report.notes]
    assert notes == ([] if axis == 0 else [("unhashed", "params/model/layers/mlp/kernel")])
    assert report.compared == (2 if axis == 0 else 1)


def test_a_read_failing_on_a_reader_thread_is_raised_as_it_was(tmp_path: Path) -> None:
    """The tensors are read ahead on threads: a stored chunk cut short fails there,
    and the caller gets that error, its message whole, with no thread left reading."""
    import threading

    import orbax.checkpoint as ocp

    tree = {f"w{i}": np.arange(4096, dtype=np.float32).reshape(64, 64) + i for i in range(4)}
    for name in ("a", "b"):
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False))
        checkpointer.save(tmp_path / name, tree)
        checkpointer.close()
    chunk = tmp_path / "b" / "w2" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:100])  # One array's zstd frame, cut short.
    before = set(threading.enumerate())
    with pytest.raises(
        ValueError, match=r"w2/0\.0: the zstd chunk ends before the bytes its array holds\.$"
    ):
        bridge.verify(tmp_path / "a", tmp_path / "b")
    assert not set(threading.enumerate()) - before  # (Threads of earlier tests may end.)
    assert bridge.verify(tmp_path / "a", tmp_path / "a").ok
