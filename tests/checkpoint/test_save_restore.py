"""jaxshare.checkpoint: save/restore round trips, layout, Orbax interop, targets, bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxshare
from jaxshare import AliasMap, Tied, dedupe, find_shared
from jaxshare import checkpoint as jc
from jaxshare.checkpoint import _empty
from jaxshare.core.alias import MAX_JSON_BYTES

ALIAS_FILE = "jaxshare_alias_map.json"


def assert_ties_are_identity(leaves: dict[str, Any], alias_map: AliasMap) -> None:
    for alias, canonical in alias_map.items():
        if alias_map.transform(alias) is None:
            assert leaves[alias] is leaves[canonical], alias
        else:
            expected = jnp.transpose(leaves[canonical], alias_map.transform(alias))
            assert np.array_equal(leaves[alias], expected), alias


def _pair() -> dict:
    w = jnp.arange(6.0).reshape(3, 2)
    return {"wte": {"embedding": w}, "lm_head": {"kernel": w}, "ln": {"scale": jnp.ones(2)}}


def _triple() -> dict:
    w = jnp.arange(4, dtype=jnp.bfloat16)
    return {"a": w, "b": w, "c": {"d": w}}


def _lists() -> dict:
    w = jnp.ones((2, 2), jnp.int32)
    return {"layers": [w, jnp.zeros(3), w], "out": (w, np.float32(1.5))}


def _shared_module() -> dict:
    block = {"kernel": jnp.arange(4.0).reshape(2, 2), "bias": jnp.zeros(2, jnp.float16)}
    return {"encoder": block, "decoder": block, "step": 3}


def _empty_and_scalars() -> dict:
    e = jnp.zeros((0, 4), jnp.bfloat16)
    return {
        "e": e,
        "f": e,
        "flag": jnp.array([True, False]),
        "x": jnp.array(2.5),
        "n": np.zeros((2, 0)),
    }


def _numpy() -> dict:
    a = np.arange(5, dtype=np.uint8)
    return {"a": a, "b": a, "c": np.ones(2)}


TREES: dict[str, Callable[[], dict]] = {
    "no_ties": lambda: {"a": jnp.ones(3), "b": jnp.ones(3)},
    "pair": _pair,
    "triple_bf16": _triple,
    "lists_and_tuples": _lists,
    "shared_module": _shared_module,
    "empty_and_scalars": _empty_and_scalars,
    "numpy": _numpy,
}


@pytest.mark.parametrize("name", TREES)
def test_round_trip_is_bit_exact_with_ties_as_identity(
    tmp_path: Path, name: str, flat, assert_bit_exact
) -> None:
    tree = TREES[name]()
    jc.save(tmp_path / "ckpt", tree)
    restored = jc.restore(tmp_path / "ckpt")
    assert_bit_exact(restored, tree)
    alias_map = find_shared(tree)
    assert jc.read_alias_map(tmp_path / "ckpt") == alias_map
    assert_ties_are_identity(flat(restored), alias_map)


def test_pair_stores_the_tie_once(tmp_path: Path) -> None:
    jc.save(tmp_path / "ckpt", _pair())
    assert jc.read_alias_map(tmp_path / "ckpt") == AliasMap({"wte/embedding": "lm_head/kernel"})
    report = jc.inspect(tmp_path / "ckpt")
    assert sorted(report.stored) == ["lm_head/kernel", "ln/scale"]
    assert report.bytes_saved == 6 * 4


def test_tied_with_transform_round_trips(tmp_path: Path) -> None:
    emb = jnp.arange(12.0).reshape(4, 3)
    amap = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})
    tied = Tied({"wte": {"embedding": emb}, "lm_head": {}}, amap)
    jc.save(tmp_path / "ckpt", tied)
    assert jc.read_alias_map(tmp_path / "ckpt") == amap

    full = jc.restore(tmp_path / "ckpt")
    assert np.array_equal(full["lm_head"]["kernel"], emb.T)

    back = jc.restore(tmp_path / "ckpt", jax.eval_shape(lambda: tied))
    assert isinstance(back, Tied)
    assert back.alias_map == amap
    assert np.array_equal(back.unique["wte"]["embedding"], emb)
    assert back.tree["lm_head"]["kernel"].shape == (3, 4)


def test_layout_is_an_orbax_pytree_plus_the_alias_map_json(tmp_path: Path) -> None:
    tree = _pair()
    jc.save(tmp_path / "ckpt", tree)
    item = tmp_path / "ckpt"
    assert (item / "_METADATA").is_file()
    doc = json.loads((item / ALIAS_FILE).read_text())
    assert doc == {
        "format": "jaxshare.alias_map",
        "version": 1,
        "aliases": {"wte/embedding": "lm_head/kernel"},
    }
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt"]  # No temporary leftovers.


def test_plain_orbax_restores_a_jaxshare_item_as_the_unique_tree(
    tmp_path: Path, assert_bit_exact
) -> None:
    tree = _shared_module()
    jc.save(tmp_path / "ckpt", tree)
    plain = ocp.StandardCheckpointer().restore(tmp_path / "ckpt")
    unique, _ = dedupe(tree)
    assert_bit_exact(plain, unique)


def test_a_plain_orbax_checkpoint_restores_with_no_ties(tmp_path: Path, assert_bit_exact) -> None:
    w = jnp.arange(3.0)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "plain", {"a": w, "b": w})
    assert jc.read_alias_map(tmp_path / "plain") == AliasMap()
    restored = jc.restore(tmp_path / "plain")
    assert_bit_exact(restored, {"a": w, "b": w})
    assert restored["a"] is not restored["b"]  # Plain Orbax stored two arrays.
    assert jc.inspect(tmp_path / "plain").alias_map == AliasMap()


def test_save_refuses_an_existing_directory_unless_forced(tmp_path: Path) -> None:
    jc.save(tmp_path / "ckpt", {"a": jnp.ones(2)})
    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / "ckpt")) + ".*force=True"):
        jc.save(tmp_path / "ckpt", {"a": jnp.zeros(2)})
    assert np.array_equal(jc.restore(tmp_path / "ckpt")["a"], jnp.ones(2))
    jc.save(tmp_path / "ckpt", {"a": jnp.zeros(2)}, force=True)
    assert np.array_equal(jc.restore(tmp_path / "ckpt")["a"], jnp.zeros(2))


def test_save_rejects_an_item_with_nothing_to_store(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=re.escape(str(tmp_path / "ckpt")) + ".*no non-empty array"
    ):
        jc.save(tmp_path / "ckpt", {"e": jnp.zeros((0,))})
    assert not (tmp_path / "ckpt").exists()


def test_a_train_state_with_tied_params_and_optimizer_state(
    tmp_path: Path, assert_bit_exact
) -> None:
    emb = jnp.arange(12.0).reshape(4, 3)
    amap = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})
    params = Tied({"wte": {"embedding": emb}, "bias": jnp.ones(3)}, amap)
    opt_state = optax.adam(1e-3).init(params)  # Its mu and nu are Tieds as well.
    state = {"params": params, "opt_state": opt_state, "step": jnp.array(5)}
    jc.save(tmp_path / "ckpt", state)
    stored = jc.read_alias_map(tmp_path / "ckpt")
    assert stored == AliasMap(
        {
            f"{p}/lm_head/kernel": f"{p}/wte/embedding"
            for p in ("params", "opt_state/0/mu", "opt_state/0/nu")
        },
        transforms={
            f"{p}/lm_head/kernel": (1, 0) for p in ("params", "opt_state/0/mu", "opt_state/0/nu")
        },
    )

    back = jc.restore(tmp_path / "ckpt", jax.eval_shape(lambda: state))
    assert jax.tree.structure(back) == jax.tree.structure(state)
    assert isinstance(back["params"], Tied) and back["params"].alias_map == amap
    assert isinstance(back["opt_state"][0].mu, Tied)
    assert_bit_exact(back, state)

    full = jc.restore(tmp_path / "ckpt")  # No target: plain full trees.
    assert np.array_equal(full["params"]["lm_head"]["kernel"], emb.T)


# -- restore targets: sharding ------------------------------------------------


def _sharded_tree(mesh: Mesh) -> dict:
    w = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("x", None)))
    return {"embed": w, "lm_head": w, "bias": jax.device_put(jnp.ones(8), NamedSharding(mesh, P()))}


def test_restore_with_target_shards_as_asked_on_another_mesh(
    tmp_path: Path, assert_bit_exact
) -> None:
    tree = {**_sharded_tree(Mesh(np.array(jax.devices()), ("x",))), "empty": jnp.zeros((0, 8))}
    jc.save(tmp_path / "ckpt", tree)
    other = Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("a", "b"))
    spec = {"embed": P("a", "b"), "lm_head": P("a", "b"), "bias": P("b"), "empty": P(None, "b")}
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(other, s)),
        tree,
        spec,
    )
    restored = jc.restore(tmp_path / "ckpt", target)
    assert restored["lm_head"] is restored["embed"]
    for name in tree:
        assert restored[name].sharding == target[name].sharding, name
    assert_bit_exact(restored, tree)


def test_restore_without_target_uses_the_saved_sharding(tmp_path: Path) -> None:
    tree = _sharded_tree(Mesh(np.array(jax.devices()), ("x",)))
    jc.save(tmp_path / "ckpt", tree)
    restored = jc.restore(tmp_path / "ckpt")
    assert restored["embed"].sharding.is_equivalent_to(tree["embed"].sharding, 2)
    assert restored["lm_head"] is restored["embed"]


def test_restore_into_a_tied_target_with_shardings(tmp_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()), ("x",))
    tied = jaxshare.tie(_sharded_tree(mesh))
    jc.save(tmp_path / "ckpt", tied)
    target = jax.eval_shape(lambda: tied)
    target = target.replace(
        jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, P())),
            target.unique,
        )
    )
    back = jc.restore(tmp_path / "ckpt", target)
    assert isinstance(back, Tied) and back.alias_map == tied.alias_map
    assert back.unique["embed"].sharding == NamedSharding(mesh, P())
    assert back.tree["lm_head"] is back.tree["embed"]


# -- restore targets that disagree with the checkpoint ----------------------


def _sds(
    shape: tuple[int, ...], dtype: Any = jnp.float32, sharding: Any = None
) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _mesh_sharding(spec: P) -> NamedSharding:
    return NamedSharding(Mesh(np.array(jax.devices()), ("x",)), spec)


BAD_TARGETS = {
    "alias_shape": (
        lambda: {"embed": _sds((8, 8)), "lm_head": _sds((4, 8)), "bias": _sds((8,))},
        r"'lm_head' \(alias of 'embed'\): expected float32\[8, 8\]",
    ),
    "alias_missing": (
        lambda: {"embed": _sds((8, 8)), "bias": _sds((8,))},
        r"'lm_head': no leaf there, but the checkpoint stores it as an alias of 'embed'",
    ),
    "canonical_missing": (
        lambda: {"lm_head": _sds((8, 8)), "bias": _sds((8,))},
        r"'embed': no leaf there, but the checkpoint stores it as a canonical",
    ),
    "stored_shape": (
        lambda: {"embed": _sds((4, 4)), "lm_head": _sds((4, 4)), "bias": _sds((8,))},
        r"'embed': the checkpoint stores shape \(8, 8\), the target asks for \(4, 4\)",
    ),
    "extra_leaf": (
        lambda: {
            "embed": _sds((8, 8)),
            "lm_head": _sds((8, 8)),
            "bias": _sds((8,)),
            "new": _sds((2,)),
        },
        r"'new', which the checkpoint does not store",
    ),
    "alias_sharding": (
        lambda: {
            "embed": _sds((8, 8), sharding=_mesh_sharding(P("x"))),
            "lm_head": _sds((8, 8), sharding=_mesh_sharding(P(None, "x"))),
            "bias": _sds((8,)),
        },
        r"alias 'lm_head' asks for sharding .* its canonical 'embed' for",
    ),
    "tied_map": (
        lambda: Tied({"embed": _sds((8, 8)), "lm_head": _sds((8, 8)), "bias": _sds((8,))}),
        r"alias 'lm_head': the checkpoint stores alias of 'embed', "
        r"the target Tied has no such alias",
    ),
}


@pytest.mark.parametrize("name", BAD_TARGETS)
def test_restore_rejects_a_target_that_disagrees(tmp_path: Path, name: str) -> None:
    w = jnp.arange(64.0).reshape(8, 8)
    jc.save(tmp_path / "ckpt", {"embed": w, "lm_head": w, "bias": jnp.ones(8)})
    make_target, match = BAD_TARGETS[name]
    with pytest.raises(ValueError, match=re.escape(f"in {tmp_path / 'ckpt'}")) as info:
        jc.restore(tmp_path / "ckpt", make_target())
    assert re.search(match, str(info.value)), str(info.value)


# -- corrupt or hostile alias map files -----------------------------------------


def _json(aliases: dict, version: int = 1) -> str:
    return json.dumps({"format": "jaxshare.alias_map", "version": version, "aliases": aliases})


# (file content, message, whether `read_alias_map` -- JSON only -- sees it too)
BAD_FILES = {
    "unknown_version": (_json({"lm_head": "embed"}, version=2), "version 2", True),
    "cycle": (_json({"lm_head": "embed", "embed": "lm_head"}), "cycle", True),
    "not_json": ("{not json", "alias map is not JSON", True),
    "oversized": (" " * (MAX_JSON_BYTES + 1), "over the limit", True),
    "canonical_not_stored": (
        _json({"lm_head": "nowhere/kernel"}),
        "'nowhere/kernel' is not an array the checkpoint stores",
        False,
    ),
    "transform_does_not_fit": (
        _json({"lm_head": {"target": "embed", "permute": [2, 0, 1]}}),
        r"transform \[2, 0, 1\] permutes 3 axes, but its canonical 'embed' has shape \(8, 8\)",
        False,
    ),
    "alias_also_stored": (_json({"bias": "embed"}), "alias 'bias' is also stored", False),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_bad_alias_map_file_fails_with_its_path(tmp_path: Path, name: str) -> None:
    w = jnp.arange(64.0).reshape(8, 8)
    item = tmp_path / "ckpt"
    jc.save(item, {"embed": w, "lm_head": w, "bias": jnp.ones(8)})
    text, match, json_level = BAD_FILES[name]
    (item / ALIAS_FILE).write_text(text)
    where = re.escape(str(item / ALIAS_FILE))
    for read in (jc.restore, jc.inspect, jc.consolidate):
        with pytest.raises(ValueError, match=f"{where}(.|\n)*{match}"):
            read(item)
    if json_level:
        with pytest.raises(ValueError, match=f"{where}(.|\n)*{match}"):
            jc.read_alias_map(item)
    else:
        jc.read_alias_map(item)  # Valid JSON: only checking against the arrays finds it.


# -- which directory is the item ------------------------------------------------


def test_a_step_directory_resolves_to_its_jaxshare_item(tmp_path: Path) -> None:
    tree = _pair()
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(
            3, args=ocp.args.Composite(params=jc.SharedSave(tree), meta=ocp.args.JsonSave({"a": 1}))
        )
        manager.wait_until_finished()
    restored = jc.restore(tmp_path / "3")
    assert restored["wte"]["embedding"] is restored["lm_head"]["kernel"]
    assert jc.inspect(tmp_path / "3").source == str(tmp_path / "3" / "params")


@pytest.mark.parametrize(
    ("where", "error", "match"),
    [
        ("missing", FileNotFoundError, "no such checkpoint directory"),
        ("", ValueError, r"CheckpointManager directory with steps \[1\]; pass one step"),
        ("1", ValueError, "several checkpoint items"),
        ("1/meta", FileNotFoundError, "not an Orbax checkpoint item"),
    ],
)
def test_directories_that_are_not_one_item(
    tmp_path: Path, where: str, error: type[Exception], match: str
) -> None:
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(
            1,
            args=ocp.args.Composite(
                a=jc.SharedSave({"x": jnp.ones(2)}),
                b=jc.SharedSave({"y": jnp.ones(2)}),
                meta=ocp.args.JsonSave({"a": 1}),
            ),
        )
        manager.wait_until_finished()
    with pytest.raises(error, match=match):
        jc.read_alias_map(tmp_path / where)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"shape": [0, 2], "dtype": "float32"}, "expected an object with fields"),
        ({"shape": [2], "dtype": "float32", "type": "jax"}, "shape \\[2\\] is not zero-size"),
        ({"shape": [0, -1], "dtype": "float32", "type": "jax"}, "'shape' must be a list of sizes"),
        ({"shape": [0], "dtype": "float32", "type": "torch"}, "'type' must be one of"),
        ({"shape": [0], "dtype": "no-such-dtype", "type": "jax"}, "no-such-dtype"),
    ],
)
def test_a_corrupt_empty_array_record_names_its_path(entry: dict, match: str) -> None:
    with pytest.raises(ValueError, match=f"ckpt/_METADATA: empty array 'p/q': .*{match}"):
        _empty.parse_record({"p/q": entry}, "ckpt/_METADATA")


def test_public_names() -> None:
    assert sorted(jc.__all__) == sorted(
        [
            "CheckpointSource",
            "READER",
            "SharedCheckpointHandler",
            "SharedRestore",
            "SharedSave",
            "TreeSource",
            "consolidate",
            "consolidate_to_safetensors",
            "inspect",
            "open_source",
            "read_alias_map",
            "restore",
            "save",
            "write_item",
        ]
    )
    for name in jc.__all__:
        assert getattr(jc, name).__doc__, f"jaxshare.checkpoint.{name} has no docstring"
    assert jaxshare.checkpoint is jc


def test_a_nested_tied_target_must_carry_the_stored_ties(tmp_path: Path) -> None:
    w = jnp.arange(6.0).reshape(3, 2)
    jc.save(tmp_path / "ckpt", {"params": jaxshare.tie({"a": w, "b": w}), "step": jnp.array(1)})
    target = {"params": Tied({"a": _sds((3, 2))}), "step": _sds((), jnp.int32)}
    with pytest.raises(
        ValueError, match="'params/b': no leaf there, but the checkpoint stores it as an alias"
    ):
        jc.restore(tmp_path / "ckpt", target)


def test_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    jc.save("rel/ckpt", _pair())
    restored = jc.restore("rel/ckpt")
    assert restored["wte"]["embedding"] is restored["lm_head"]["kernel"]
    assert sorted(jc.consolidate("rel/ckpt")) == ["lm_head/kernel", "ln/scale", "wte/embedding"]
    jc.consolidate_to_safetensors("rel/ckpt", "rel/out.safetensors")
    assert jc.inspect("rel/ckpt").source == str(tmp_path / "rel" / "ckpt")
