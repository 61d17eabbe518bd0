"""SharedSave/SharedRestore through ocp.CheckpointManager: direct, Composite, async, retention."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxshare import AliasMap, Tied, tie
from jaxshare import checkpoint as jc


def _model(step: int) -> dict:
    emb = jnp.full((5, 3), float(step))
    return {
        "wte": {"embedding": emb},
        "lm_head": {"kernel": emb},
        "ln": {"scale": jnp.ones(3) * step},
    }


def _options(**kw: object) -> ocp.CheckpointManagerOptions:
    return ocp.CheckpointManagerOptions(enable_async_checkpointing=True, **kw)


def test_steps_save_async_keep_the_latest_and_restore_by_step(tmp_path: Path) -> None:
    with ocp.CheckpointManager(tmp_path, options=_options(max_to_keep=2)) as manager:
        for step in range(4):
            assert manager.save(step, args=jc.SharedSave(_model(step)))
        manager.wait_until_finished()
        assert manager.all_steps() == [2, 3]
        assert manager.latest_step() == 3
        for step in (2, 3):
            restored = manager.restore(step, args=jc.SharedRestore())
            assert restored["lm_head"]["kernel"] is restored["wte"]["embedding"]
            assert np.array_equal(restored["wte"]["embedding"], jnp.full((5, 3), float(step)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "3"]
    assert jc.read_alias_map(tmp_path / "3" / "default") == AliasMap(
        {"wte/embedding": "lm_head/kernel"}
    )


def test_composite_beside_json_and_plain_pytree_items(tmp_path: Path) -> None:
    tied = tie(_model(1))
    with ocp.CheckpointManager(tmp_path, options=_options()) as manager:
        manager.save(
            10,
            args=ocp.args.Composite(
                params=jc.SharedSave(tied),
                meta=ocp.args.JsonSave({"lr": 0.1}),
                data=ocp.args.StandardSave({"position": np.int64(1234)}),
            ),
        )
        manager.wait_until_finished()

    with ocp.CheckpointManager(tmp_path) as manager:  # A fresh manager, as after a restart.
        assert manager.latest_step() == 10
        restored = manager.restore(
            10,
            args=ocp.args.Composite(
                params=jc.SharedRestore(jax.eval_shape(lambda: tied)),
                meta=ocp.args.JsonRestore(),
                data=ocp.args.StandardRestore(),
            ),
        )
    assert isinstance(restored.params, Tied)
    assert restored.params.alias_map == tied.alias_map
    full = restored.params.tree
    assert full["lm_head"]["kernel"] is full["wte"]["embedding"]
    assert restored.meta == {"lr": 0.1}
    assert int(restored.data["position"]) == 1234


def test_item_metadata_is_the_unique_tree(tmp_path: Path) -> None:
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(0, args=jc.SharedSave(_model(0)))
        manager.wait_until_finished()
        metadata = manager.item_metadata(0)
    assert sorted(metadata.tree) == ["lm_head", "ln"]
    assert metadata.tree["lm_head"]["kernel"].shape == (5, 3)


def test_async_save_commits_the_alias_map_with_the_arrays(tmp_path: Path) -> None:
    with ocp.CheckpointManager(tmp_path, options=_options()) as manager:
        manager.save(0, args=jc.SharedSave(_model(0)))
        manager.wait_until_finished()
    item = tmp_path / "0" / "default"
    assert (item / "jaxshare_alias_map.json").is_file()
    assert (item / "_METADATA").is_file()
    assert not [p.name for p in tmp_path.iterdir() if "tmp" in p.name]


def test_handler_rejects_other_args(tmp_path: Path) -> None:
    handler = jc.SharedCheckpointHandler()
    with pytest.raises(TypeError, match="saves `SharedSave\\(item\\)`, got StandardSaveArgs"):
        handler.save(tmp_path, ocp.args.StandardSave({"a": jnp.ones(2)}))
    jc.save(tmp_path / "ckpt", {"a": jnp.ones(2)})
    with pytest.raises(TypeError, match="`SharedRestore\\(target\\)`, got StandardRestoreArgs"):
        handler.restore(tmp_path / "ckpt", ocp.args.StandardRestore())


def test_handler_refuses_a_subset_of_processes() -> None:
    options = ocp.options.MultiprocessingOptions(active_processes={0})
    with pytest.raises(ValueError, match="`active_processes` is not supported"):
        jc.SharedCheckpointHandler(multiprocessing_options=options)
