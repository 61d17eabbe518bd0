"""An implicit tie (the model computes the alias: an ``attend`` head, transformers-flax
GPT-2's ``lm_head``) is stored in the item's alias map and naming record, marked implicit,
and never comes back as a leaf: ``restore`` (with or without a target),
``consolidate`` and ``consolidate_to_safetensors`` give exactly the model's own tree. An
item written before the mark existed restores as it did."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors import safe_open

from jaxshare import AliasMap, NamingRecord, Tied
from jaxshare import checkpoint as jc
from jaxshare.formats import ALIAS_MAP_FILE

EMB = (jnp.arange(12.0).reshape(4, 3) / 7).astype(jnp.bfloat16)
RECORD = NamingRecord(
    {
        "wte/embedding": "wte.weight",
        "ln/scale": "ln.weight",
        "lm_head/kernel": ("lm_head.weight", (1, 0)),
        "out/embedding": "out.weight",
    },
    implicit=["lm_head/kernel"],
)
TIES = AliasMap(
    {"lm_head/kernel": "wte/embedding", "out/embedding": "wte/embedding"},
    transforms={"lm_head/kernel": (1, 0)},
    naming=RECORD,
)
#: The model's own tree: the embedding, a norm, and an explicit alias (a leaf).
OWN = ["ln/scale", "out/embedding", "wte/embedding"]


def _unique() -> dict:
    return {"wte": {"embedding": EMB}, "ln": {"scale": jnp.ones(3)}}


@pytest.fixture
def item(tmp_path):
    path = tmp_path / "item"
    jc.save(path, Tied(_unique(), TIES))
    return path


def test_the_item_records_the_implicit_alias_in_its_map_and_naming_record(item):
    stored = jc.read_alias_map(item)
    assert stored == TIES and stored.implicit == {"lm_head/kernel"}
    assert stored.naming == RECORD and stored.naming.implicit == {"lm_head/kernel"}
    doc = json.loads((item / ALIAS_MAP_FILE).read_text())
    assert doc["aliases"]["lm_head/kernel"] == {
        "target": "wte/embedding",
        "permute": [1, 0],
        "implicit": True,
    }


@pytest.mark.parametrize(
    "restore",
    [
        lambda path: jc.restore(path),
        lambda path: jc.restore(
            path, jax.eval_shape(lambda: {**_unique(), "out": {"embedding": EMB}})
        ),
        lambda path: jc.restore(path, Tied(jax.eval_shape(_unique), TIES)).tree,
        lambda path: jc.consolidate(path),
    ],
    ids=["restore", "restore into the model's tree", "restore a Tied", "consolidate"],
)
def test_every_way_back_gives_exactly_the_models_own_tree(item, restore, flat):
    tree = restore(item)
    leaves = flat(tree) if not all("/" in k for k in tree) else tree
    assert sorted(leaves) == OWN
    np.testing.assert_array_equal(np.asarray(leaves["out/embedding"]), np.asarray(EMB))


def test_a_target_that_holds_the_implicit_alias_is_one_clear_error(item):
    target = jax.eval_shape(
        lambda: {**_unique(), "out": {"embedding": EMB}, "lm_head": {"kernel": EMB.T}}
    )
    with pytest.raises(ValueError, match=r"'lm_head/kernel': a leaf, but .* implicit alias"):
        jc.restore(item, target)


def test_a_consolidated_file_holds_the_models_tree_and_the_whole_map(item, tmp_path):
    out = tmp_path / "flat.safetensors"
    jc.consolidate_to_safetensors(item, out)
    with safe_open(out, "np") as f:
        assert sorted(f.keys()) == OWN
        amap = AliasMap.from_json(f.metadata()["jaxshare.alias_map"])
    assert amap == TIES and amap.implicit == {"lm_head/kernel"}


def test_the_manager_restores_the_models_own_tree(tmp_path, flat):
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(0, args=jc.SharedSave(Tied(_unique(), TIES)))
        manager.wait_until_finished()
        restored = manager.restore(0, args=jc.SharedRestore())
    assert sorted(flat(restored)) == OWN


def test_an_item_without_the_mark_restores_as_before(tmp_path, flat):
    """An item written before implicit ties were marked (its alias map has no
    ``implicit``): every alias is put back, as it was."""
    path = tmp_path / "old"
    old = AliasMap(dict(TIES), transforms=TIES.transforms)
    jc.save(path, Tied(_unique(), old))
    assert "implicit" not in (path / ALIAS_MAP_FILE).read_text()
    restored = jc.restore(path)
    assert sorted(flat(restored)) == sorted([*OWN, "lm_head/kernel"])
    np.testing.assert_array_equal(np.asarray(restored["lm_head"]["kernel"]), np.asarray(EMB).T)
