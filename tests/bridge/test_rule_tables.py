"""The layouts of any module's leaves as tables: jaxshare's and transformers-flax's
rules are data (``tables/*.toml``), a user's table of ``{module}`` entries converts a
model both ways, and a bad one is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax.traverse_util import flatten_dict as flatten
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge.layouts.layout import JAXSHARE, TRANSFORMERS_FLAX, Layout, as_layout
from bridge.layouts.rules import TABLES, Rule
from bridge.layouts.table import Entry, Table, read_table
from jaxshare.cli import main


@pytest.mark.parametrize("layout", [JAXSHARE, TRANSFORMERS_FLAX], ids=lambda x: x.name)
def test_the_rule_layouts_are_their_tables(layout) -> None:
    """Each rule and family comes from the layout's file, which round-trips."""
    (table,) = layout.table_list()
    assert table == read_table(TABLES / f"{layout.name}.toml")
    assert layout.rules == tuple(Rule.from_entry(e) for e in table.entries)
    assert Table.from_dict(table.to_dict()) == table
    assert [f.model_types for f in layout.families] == [f.model_types for f in table.families]
    assert layout.view is None and layout.collections is table.collections


def test_default_rules_are_the_jaxshare_table() -> None:
    assert bridge.DEFAULT_RULES == JAXSHARE.rules
    kernel = bridge.DEFAULT_RULES[0]
    assert (kernel.torch, kernel.flax, kernel.axes) == ("weight", "kernel", "kernel")
    assert kernel.perm(4) == (2, 3, 1, 0)


def test_transformers_flax_differs_from_jaxshare_where_its_table_says() -> None:
    """FlaxConv1D holds (out, in); no collection at the top; the families' quirks."""
    by_layer = {r.layers: r for r in TRANSFORMERS_FLAX.rules}
    assert by_layer[("conv1d",)].axes == "kernel"
    assert {r.layers: r for r in JAXSHARE.rules}[("conv1d",)].axes == "same"
    llama = TRANSFORMERS_FLAX.family({"model_type": "llama"})
    assert llama is not None and llama.rules == (Rule("weight", "weight", ndims=(1,)),)
    assert TRANSFORMERS_FLAX.family({"model_type": "whisper"}).modules == {"proj_out": "lm_head"}
    pegasus = TRANSFORMERS_FLAX.family({"model_type": "pegasus"})
    assert pegasus.computed_by("model.encoder.embed_positions.weight") is not None


NNX = """\
# An NNX model's own naming: no collection, `w` for a Linear's kernel.
name = "my-nnx"
[[entry]]
torch = "{module}.weight"
flax = "{module}/w"
layers = ["linear"]
ops = [{permute = "kernel"}]
[[entry]]
torch = "{module}.weight"
flax = "{module}/table"
layers = ["embedding"]
[[entry]]
torch = "{module}.weight"
flax = "{module}/scale"
[[entry]]
torch = "{module}.bias"
flax = "{module}/b"
"""


class _Tiny(torch.nn.Module):
    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.fc = torch.nn.Linear(d, 2 * d)
        self.norm = torch.nn.LayerNorm(2 * d)
        self.head = torch.nn.Linear(2 * d, vocab, bias=False)


@given(st.integers(2, 9), st.integers(1, 6), st.sampled_from(["float32", "bfloat16"]))
def test_a_users_table_of_any_module_converts_both_ways(vocab, d, dtype) -> None:
    """A table file of ``{module}`` entries names a model's leaves its own way and
    comes back bit for bit (dtypes included)."""
    layout = Layout.from_table(Table.from_dict(__import__("tomllib").loads(NNX)))
    model = _Tiny(vocab, d).to(getattr(torch, dtype))
    variables, aliases = bridge.to_flax(model, layout=layout)
    flat = {"/".join(k): v for k, v in flatten(variables).items()}
    assert sorted(flat) == ["embed/table", "fc/b", "fc/w", "head/w", "norm/b", "norm/scale"]
    assert flat["fc/w"].shape == (d, 2 * d)
    back = bridge.to_torch(variables, aliases, like=model, layout=layout)
    for name, tensor in model.state_dict().items():
        assert back[name].dtype == tensor.dtype
        assert torch.equal(back[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_a_users_table_file_is_a_layout(tmp_path) -> None:
    path = tmp_path / "nnx.toml"
    path.write_text(NNX)
    layout = as_layout(path)
    assert layout.name == "my-nnx" and layout.view is None and not layout.collections
    assert [r.flax for r in layout.rules] == ["w", "table", "scale", "b"]


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            {"torch": "{module}.weight", "flax": "{module}/w", "ops": [{"permute": "sideways"}]},
            "a permute of any module is named, one of kernel, same, transposed_kernel; "
            "found 'sideways'",
        ),
        (
            {"torch": "{module}.weight", "flax": "{module}/w", "ops": [{"permute": [1, 0]}]},
            "found [1, 0]",
        ),
        (
            {"torch": "{module}.weight", "flax": "w/{module}"},
            "its Flax path is '{module}/kernel' or 'params/{module}/kernel' (a collection "
            "first); found 'w/{module}'",
        ),
        (
            {"torch": "{module}.sub.weight", "flax": "{module}/w"},
            "an entry of any module names a leaf of it, '{module}.weight'; found "
            "'{module}.sub.weight'",
        ),
        (
            {"torch": "{module}.weight", "flax": "{module}/w", "when": "tie_word_embeddings"},
            "found 'when'",
        ),
        (
            {"torch": "{module}.weight", "flax": "params/{module}/w", "collection": "cache"},
            "`collection` is for a Flax path without one; 'params/{module}/w' has 'params'",
        ),
        ({"torch": "fc.weight", "flax": "fc/w", "layers": ["linear"]}, "unknown key 'layers'"),
        (
            {"torch": "{module}.weight", "flax": "{module}/w", "ndims": [0]},
            "`ndims` lists ranks (ints > 0), found [0]",
        ),
    ],
)
def test_a_bad_entry_of_any_module_is_one_line(edit, says) -> None:
    with pytest.raises(ValueError) as e:
        Table.from_dict({"name": "bad", "entry": [edit]})
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "table, says",
    [
        (
            {"entry": [{"torch": "{module}.bias", "flax": "{module}/b"},
                       {"torch": "fc.weight", "flax": "fc/w"}]},
            "either all for named tensors or all for any module's leaves ({module}); found both",
        ),
        (
            {"entry": [{"torch": "{module}.bias", "flax": "{module}/b"},
                       {"torch": "{module}.weight", "flax": "params/{module}/w"}]},
            "either all start with a collection",
        ),
        (
            {"entry": [{"torch": "{module}.bias", "flax": "{module}/b"}],
             "tie": [{"alias": "lm_head.weight", "canonical": "embed.weight"}]},
            "takes name, entry and family; found 'tie'",
        ),
        (
            {"entry": [{"torch": "fc.weight", "flax": "fc/w"}],
             "family": [{"model_types": ["gpt2"]}]},
            "`family` is for a table of any module's leaves",
        ),
        (
            {"entry": [{"torch": "{module}.bias", "flax": "{module}/b"}],
             "family": [{"model_types": ["gpt2"], "tied": ["lm_head.weight"]}]},
            "family 1: unknown key 'tied'; expected absent, computed, entry",
        ),
    ],
)  # fmt: skip
def test_a_bad_table_of_any_module_is_one_line(table, says) -> None:
    with pytest.raises(ValueError) as e:
        Table.from_dict({"name": "bad", **table})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_family_computing_by_an_unknown_function_is_one_line() -> None:
    table = {
        "name": "bad",
        "entry": [{"torch": "{module}.bias", "flax": "{module}/b"}],
        "family": [{"model_types": ["pegasus"], "computed": {"embed_positions.weight": "cos"}}],
    }
    with pytest.raises(ValueError, match="computes a tensor by 'cos', which is not one of "):
        Layout.from_table(table)


def test_a_table_of_any_module_is_not_bound() -> None:
    with pytest.raises(ValueError, match="names tensors by rules"):
        Table.from_dict({"name": "r", "entry": [Entry("{module}.b", "{module}/b").to_dict()]}).bind(
            {}
        )


def test_the_command_converts_with_a_table_of_any_module(tmp_path, capsys) -> None:
    """``--layout FILE`` of ``{module}`` entries, for a safetensors file: the kernels
    named and transposed as the file says, and back bit for bit."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    weights = {
        "embed_tokens.weight": rng.standard_normal((5, 4)).astype(np.float32),
        "fc.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "fc.bias": rng.standard_normal(6).astype(np.float32),
    }
    save_file(weights, tmp_path / "model.safetensors")
    (tmp_path / "nnx.toml").write_text(NNX)
    layout = str(tmp_path / "nnx.toml")
    item, back = tmp_path / "item", tmp_path / "back.safetensors"
    assert main(["convert", str(tmp_path / "model.safetensors"), str(item), "--layout", layout,
                 "--quiet"]) == 0  # fmt: skip
    from jaxshare import checkpoint

    tree = {"/".join(k): np.asarray(v) for k, v in flatten(checkpoint.restore(item)).items()}
    assert sorted(tree) == ["embed_tokens/table", "fc/b", "fc/w"]
    np.testing.assert_array_equal(tree["fc/w"], weights["fc.weight"].T)
    assert main(["convert", str(item), str(back), "--names", "torch", "--layout", layout,
                 "--quiet"]) == 0  # fmt: skip
    out = load_file(back)
    assert sorted(out) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(out[name], value)
