"""Declared ties (``--tie``, ``--config``) held against what a source stores.

A declared canonical may itself be a recorded alias with a transform (a ``.pt``
file whose ``proj.weight`` is ``wte.weight.t()``): the declared alias is then the
transposed root, in the map and in every output. A declaration the stored values
contradict is one line, never a silent wrong result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import bridge
from bridge.sources.declared import declare_ties
from jaxshare.formats import SafetensorsFile, TorchFile

W = torch.arange(6.0).reshape(2, 3)


@pytest.fixture
def transposed(tmp_path):
    """A ``.pt`` file whose ``proj.weight`` is the transpose of ``wte.weight``."""
    path = tmp_path / "m.pt"
    torch.save({"wte.weight": W, "proj.weight": W.t()}, path)
    return path


def test_a_tie_to_a_transposed_alias_is_the_transposed_root(transposed, tmp_path):
    with TorchFile(transposed) as file:
        assert file.ties.transform("proj.weight") == (1, 0)
        source = declare_ties(file, {"lm_head.weight": "proj.weight"})
        assert dict(source.ties.items()) == {
            "proj.weight": "wte.weight",
            "lm_head.weight": "wte.weight",
        }
        assert source.ties.transform("lm_head.weight") == (1, 0)
    out = bridge.convert(transposed, tmp_path / "o.pt", ties={"lm_head.weight": "proj.weight"})
    state = torch.load(out, weights_only=True)
    assert torch.equal(state["lm_head.weight"], W.t())
    assert torch.equal(state["proj.weight"], W.t()) and torch.equal(state["wte.weight"], W)


def test_a_stored_alias_is_checked_against_the_transposed_root(tmp_path):
    path = tmp_path / "m.pt"
    torch.save({"wte.weight": W, "proj.weight": W.t(), "head.weight": W.t().clone()}, path)
    with TorchFile(path) as file:
        source = declare_ties(file, {"head.weight": "proj.weight"})
        assert source.ties["head.weight"] == "wte.weight"
        assert "head.weight" in source.written_out  # (Stored in its own right: kept.)
    torch.save({"wte.weight": W, "proj.weight": W.t(), "head.weight": W.t() + 1}, path)
    with TorchFile(path) as file, pytest.raises(ValueError) as error:
        declare_ties(file, {"head.weight": "proj.weight"})
    assert str(error.value) == (
        f"{path}: --tie ties 'head.weight' to 'proj.weight', but their values differ "
        "(max |Δ| = 1); they are not one tensor, so the tie is refused."
    )


@pytest.mark.parametrize(
    ("ties", "says"),
    [
        ({"a": "missing"}, "--tie ties 'a' to 'missing', but it holds no tensor 'missing'."),
        ({"a": "b"}, "--tie ties 'a' to 'b', but they differ: (2, 3) float32 against (3,) "),
        ({"a": "c", "c": "a"}, "the declared ties"),
    ],
    ids=["missing", "shapes", "cycle"],
)
def test_a_declaration_the_file_contradicts_is_one_line(ties, says, tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(
        {
            "a": np.ones((2, 3), np.float32),
            "b": np.ones(3, np.float32),
            "c": np.ones((2, 3), np.float32),
        },
        str(path),
    )
    with SafetensorsFile(path) as file, pytest.raises(ValueError) as error:
        declare_ties(file, ties)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and says in message and "\n" not in message


def test_a_given_config_is_the_sources_config(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": np.ones(3, np.float32)}, str(path))
    config = {"model_type": "gpt2", "tie_word_embeddings": False}
    with SafetensorsFile(path) as file:
        assert file.config is None
        source = declare_ties(file, config=config)
        assert source.config == config and source.flax_named == file.flax_named
        assert declare_ties(file) is file
