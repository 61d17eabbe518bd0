"""``jaxshare.formats`` layout: which directory is a checkpoint item, and finding the
item a directory names (an item, a step of a ``CheckpointManager``, or neither)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxshare.formats import ALIAS_MAP_FILE, ORBAX_METADATA_FILE, find_item, is_item


def _item(path: Path, marker: str = ORBAX_METADATA_FILE) -> Path:
    path.mkdir(parents=True)
    (path / marker).write_text("{}")
    return path


@pytest.mark.parametrize("marker", [ORBAX_METADATA_FILE, ALIAS_MAP_FILE])
def test_an_item_is_found_as_itself(tmp_path, marker):
    item = _item(tmp_path / "ckpt", marker)
    assert is_item(item) and find_item(item) == item


def test_a_step_directory_gives_its_one_item(tmp_path):
    item = _item(tmp_path / "3" / "params")
    (tmp_path / "3" / "notes").mkdir()
    assert not is_item(tmp_path / "3") and find_item(tmp_path / "3") == item


def test_the_jaxshare_item_wins_over_plain_orbax_items(tmp_path):
    _item(tmp_path / "3" / "meta")
    params = _item(tmp_path / "3" / "params")
    (params / ALIAS_MAP_FILE).write_text("{}")
    assert find_item(tmp_path / "3") == params


def test_several_candidate_items_are_named(tmp_path):
    _item(tmp_path / "3" / "a")
    _item(tmp_path / "3" / "b")
    with pytest.raises(ValueError, match=r"holds several checkpoint items \(.*/a, .*/b\)"):
        find_item(tmp_path / "3")


def test_a_manager_root_names_its_latest_step(tmp_path):
    _item(tmp_path / "2" / "params")
    _item(tmp_path / "10" / "params")
    with pytest.raises(ValueError, match=r"steps \[2, 10\]; pass one step, e.g. .*/10\."):
        find_item(tmp_path)


def test_what_is_no_item_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        find_item(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not an Orbax checkpoint item \(expected _META"):
        find_item(tmp_path / "empty")
