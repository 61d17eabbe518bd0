"""consolidate / consolidate_to_safetensors: every path again, leaf by leaf."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxshare import AliasMap, Tied
from jaxshare import checkpoint as jc
from jaxshare.checkpoint import _read


def _tied() -> Tied:
    emb = (jnp.arange(12.0).reshape(4, 3) / 7).astype(jnp.bfloat16)
    unique = {
        "wte": {"embedding": emb},
        "blocks": [{"w": jnp.arange(6, dtype=jnp.int32)}, {"w": None}],
        "mask": jnp.array([True, False]),
        "empty": jnp.zeros((0, 3), jnp.bfloat16),
        "ln": {"scale": np.linspace(0, 1, 3, dtype=np.float16)},
        "step": 7,
    }
    amap = AliasMap(
        {"lm_head/kernel": "wte/embedding", "blocks/1/w": "blocks/0/w", "out": "wte/embedding"},
        transforms={"lm_head/kernel": (1, 0)},
    )
    return Tied(unique, amap)


def _expected(dtype: str | None) -> dict[str, np.ndarray]:
    """The full flat tree, floating arrays cast to ``dtype``."""
    emb = np.asarray(_tied().unique["wte"]["embedding"])
    w = np.arange(6, dtype=np.int32)
    flat = {
        "wte/embedding": emb,
        "out": emb,
        "lm_head/kernel": emb.T,
        "blocks/0/w": w,
        "blocks/1/w": w,
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3), emb.dtype),
        "ln/scale": np.linspace(0, 1, 3, dtype=np.float16),
        "step": np.array(7),
    }
    if dtype is not None:
        cast = lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v  # noqa: E731
        flat = {k: cast(v) for k, v in flat.items()}
    return dict(sorted(flat.items()))


def _assert_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for path in want:
        assert (got[path].shape, got[path].dtype) == (want[path].shape, want[path].dtype), path
        assert np.array_equal(got[path], want[path]), path


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    jc.save(tmp_path / "ckpt", _tied())
    return tmp_path / "ckpt"


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_consolidate_gives_every_path_with_aliases(ckpt: Path, dtype: str | None) -> None:
    flat = jc.consolidate(ckpt, dtype=dtype)
    _assert_equal(flat, _expected(dtype))
    assert flat["out"] is flat["wte/embedding"]  # An alias is the canonical's array.


def test_consolidate_a_plain_orbax_checkpoint(tmp_path: Path) -> None:
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(
            tmp_path / "plain", {"a": {"b": np.arange(3.0)}, "c": [np.ones(2, np.int8)]}
        )
    flat = jc.consolidate(tmp_path / "plain")
    _assert_equal(flat, {"a/b": np.arange(3.0), "c/0": np.ones(2, np.int8)})


@pytest.mark.parametrize(
    ("dtype", "match"),
    [
        ("int8", "must be a floating dtype.*got 'int8'"),
        ("nonsense", "`dtype` 'nonsense' is not a dtype"),
    ],
)
def test_consolidate_rejects_a_bad_dtype(ckpt: Path, dtype: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        jc.consolidate(ckpt, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        jc.consolidate_to_safetensors(ckpt, ckpt.parent / "out.safetensors", dtype=dtype)
    assert not (ckpt.parent / "out.safetensors").exists()


def test_safetensors_holds_the_full_flat_dict_and_the_alias_map(ckpt: Path) -> None:
    out = ckpt.parent / "model.safetensors"
    calls: list[tuple[int, int, str]] = []
    jc.consolidate_to_safetensors(ckpt, out, dtype="float32", progress=lambda *a: calls.append(a))

    _assert_equal(dict(sorted(load_file(out).items())), _expected("float32"))  # A plain reader.
    with safe_open(out, framework="np") as f:
        stored_map = AliasMap.from_json(f.metadata()["jaxshare.alias_map"])
    assert stored_map == _tied().alias_map
    assert [c[0] for c in calls] == list(range(1, 10)) and {c[1] for c in calls} == {9}
    assert sorted(c[2] for c in calls) == sorted(_expected(None))


def test_safetensors_keeps_bfloat16_without_a_cast(ckpt: Path) -> None:
    out = ckpt.parent / "model.safetensors"
    jc.consolidate_to_safetensors(ckpt, out)
    header = json.loads(out.read_bytes()[8 : 8 + int.from_bytes(out.read_bytes()[:8], "little")])
    assert header["lm_head/kernel"]["dtype"] == "BF16"
    assert header["lm_head/kernel"]["shape"] == [3, 4]
    assert header["step"] == {
        "dtype": "I64",
        "shape": [],
        "data_offsets": header["step"]["data_offsets"],
    }
    with safe_open(out, framework="flax") as f:  # Reads bf16; int64 only with jax x64.
        got = {k: np.asarray(f.get_tensor(k)) for k in f.keys() if k != "step"}
    want = _expected(None)
    del want["step"]
    _assert_equal(dict(sorted(got.items())), want)


def test_safetensors_refuses_to_overwrite_unless_forced(ckpt: Path) -> None:
    out = ckpt.parent / "model.safetensors"
    save_file({"old": np.zeros(2, np.float32)}, out)
    before = out.read_bytes()
    with pytest.raises(FileExistsError, match=re.escape(str(out)) + ".*force=True"):
        jc.consolidate_to_safetensors(ckpt, out)
    assert out.read_bytes() == before
    jc.consolidate_to_safetensors(ckpt, out, force=True)
    assert len(load_file(out)) == 9


def test_force_replaces_only_a_safetensors_file(ckpt: Path) -> None:
    out = ckpt.parent / "notes.safetensors"
    out.write_text("keep me")
    with pytest.raises(ValueError, match="it is a file of 7 bytes, not a .safetensors file"):
        jc.consolidate_to_safetensors(ckpt, out, force=True)
    assert out.read_text() == "keep me"


def test_a_failure_mid_stream_leaves_no_file(ckpt: Path) -> None:
    out = ckpt.parent / "model.safetensors"

    def fail_at_third(done: int, total: int, name: str, nbytes: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        jc.consolidate_to_safetensors(ckpt, out, progress=fail_at_third)
    assert list(ckpt.parent.iterdir()) == [ckpt]


def test_consolidation_refuses_leaves_that_are_not_arrays(tmp_path: Path) -> None:
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", {"a": np.ones(2), "name": "gpt2"})
    with pytest.raises(ValueError, match="not arrays at 'name'"):
        jc.consolidate(tmp_path / "ckpt")


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (1, 2, 0)])
def test_safetensors_streams_small_blocks_of_transposed_aliases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perm: tuple[int, ...]
) -> None:
    monkeypatch.setattr(_read, "BLOCK_BYTES", 40)  # Many blocks of a few rows each.
    kernel = jnp.arange(4 * 5 * 6, dtype=jnp.float32).reshape(4, 5, 6)
    tied = Tied(
        {"conv": {"kernel": kernel}}, AliasMap({"t": "conv/kernel"}, transforms={"t": perm})
    )
    jc.save(tmp_path / "ckpt", tied)
    jc.consolidate_to_safetensors(tmp_path / "ckpt", tmp_path / "out.safetensors", dtype="bfloat16")
    with safe_open(tmp_path / "out.safetensors", framework="flax") as f:
        got = np.asarray(f.get_tensor("t"))
    assert got.dtype == jnp.bfloat16
    assert np.array_equal(got, np.transpose(np.asarray(kernel), perm).astype(jnp.bfloat16))


def test_consolidate_reads_arrays_stored_in_many_chunks(tmp_path: Path) -> None:
    values = np.arange(300 * 7, dtype=np.float32).reshape(300, 7)
    save_args = {"w": ocp.SaveArgs(chunk_byte_size=256)}  # ~9 rows per storage chunk.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "plain", {"w": values}, save_args=save_args)
    assert (
        ocp.StandardCheckpointHandler()
        .metadata(tmp_path / "plain")
        .tree["w"]
        .storage.chunk_shape[0]
        < 300
    )
    _assert_equal(
        jc.consolidate(tmp_path / "plain", dtype="float16"), {"w": values.astype(np.float16)}
    )
