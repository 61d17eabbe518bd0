"""Layouts as tables: ops and their inverses, tables from mappings and files, the
views either way, and one line for each kind of bad input."""

from __future__ import annotations

import json
import math

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file

from bridge.layouts.layout import Layout, as_layout
from bridge.layouts.ops import (
    Add,
    Concat,
    Divide,
    Merge,
    Pad,
    Permute,
    Scale,
    Split,
    Stack,
    When,
    parse_op,
)
from bridge.layouts.sizes import Scope, evaluate
from bridge.layouts.table import Entry, Table, read_table
from bridge.layouts.view import TableToFlax, TableToTorch, _as_one_transpose, _chain, _through
from jaxshare.checkpoint import TreeSource
from jaxshare.cli import main
from jaxshare.formats import SafetensorsFile
from jaxshare.internal import nest
from jaxshare.stream import ArrayInfo, TensorSource

# -- ops ------------------------------------------------------------------------------


@st.composite
def _reshaping_ops(draw):
    """A shape and a chain of permutes, splits and merges that fits it."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=ndim, max_size=ndim)))
    ops, current = [], shape
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["permute", "split", "merge"]))
        if kind == "permute":
            op = Permute(tuple(draw(st.permutations(range(len(current))))))
        elif kind == "split":
            axis = draw(st.integers(0, len(current) - 1))
            n = current[axis]
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            first = draw(st.sampled_from(divisors))
            op = Split(axis, (first, -1) if draw(st.booleans()) else (first, n // first))
        else:
            if len(current) < 2:
                continue
            axis = draw(st.integers(0, len(current) - 2))
            op = Merge(axis, current[axis : axis + 2])
        ops.append(op)
        current = op.shape(current)
    return shape, ops


@given(_reshaping_ops(), st.data())
def test_reshaping_ops_invert_bit_for_bit_and_map_slices(case, data) -> None:
    """backward(forward(x)) is x; back_shape undoes shape; a slice of the result read
    through the mapped index equals the slice of the whole result."""
    shape, ops = case
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    y = x
    for op in ops:
        y = op.forward(y)
    shapes = _chain(ops, shape, "")
    assert y.shape == shapes[-1]
    back = y
    for op in reversed(ops):
        back = op.backward(back)
    assert back.shape == x.shape and np.array_equal(back, x)
    index = tuple(
        slice(*sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2))))
        for n in y.shape
    )
    got = _through(ops, shapes, index, lambda i: x[i])
    assert np.array_equal(got, y[index])


@given(_reshaping_ops())
def test_the_way_back_of_moves_and_reshapes_is_one_transpose(case) -> None:
    """Where the ops only move, split and merge axes, their way back is one transpose
    of the leaf and a reshape (read in one pass from a source that can)."""
    shape, ops = case
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    y = x
    for op in ops:
        y = op.forward(y)
    one = _as_one_transpose(ops, y.shape)
    if one is None:
        return
    perm, back_shape = one
    assert np.array_equal(y.transpose(perm).reshape(back_shape), x)


@given(
    hnp.arrays(
        st.sampled_from([np.float32, ml_dtypes.bfloat16]),
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
        elements=st.floats(-4, 4, width=16),
    ),
    st.integers(-3, 3),
)
def test_a_power_of_two_scale_is_exact_and_others_are_marked(x, k) -> None:
    op = Scale(2.0**k)
    assert op.exact
    assert np.array_equal(op.backward(op.forward(x)), x)
    assert not Scale(1 / math.sqrt(3.0)).exact
    assert not Add(1.0).exact and Add(0.0).exact


def test_stack_and_concat_shapes_both_ways() -> None:
    assert Stack("p", 0).combined([(2, 3)] * 3) == (3, 2, 3)
    assert Stack("p", 1).part_shapes((2, 3, 4)) == [(2, 4)] * 3
    concat = Concat("p", 0, (4, 2, 2))
    assert concat.combined([(4, 8), (2, 8), (2, 8)]) == (8, 8)
    assert concat.part_shapes((8, 8), 3) == [(4, 8), (2, 8), (2, 8)]
    assert concat.part_index(1, (8, 8), 3) == (slice(4, 6),)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"transpose": [1, 0]}, "an op is one of add, concat"),
        ({"permute": [1, 0], "split": 1}, "an op is one of"),
        ({"split": 1, "into": [4]}, "`into` must list two sizes or more"),
        (
            {"split": 1, "into": [4, 2], "axis": 0},
            "the split op takes into (and `when`); got 'axis'",
        ),
        ({"permute": "1,0"}, "permute must be a list of ints"),
        ({"stack": "p q"}, "stack names a placeholder"),
    ],
)
def test_a_bad_op_is_one_line(spec, message) -> None:
    with pytest.raises(ValueError, match="^entry 3: ") as e:
        parse_op(spec, "entry 3")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sizes_do_not_divide_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"split of axis 1 \(size 10\): 10 does not divide by 4"):
        Split(1, (4, -1)).shape((3, 10))
    with pytest.raises(ValueError, match="do not make 10"):
        Split(1, (4, 2)).shape((3, 10))


def test_expressions_read_the_config_and_nothing_else() -> None:
    scope = Scope(
        {"hidden_size": 64, "num_attention_heads": 4},
        defaults={"tie_word_embeddings": True},
        derived={"head_dim": "hidden_size // num_attention_heads"},
    )
    assert evaluate("head_dim", scope) == 16
    assert evaluate("tie_word_embeddings and head_dim == 16", scope) is True
    for bad in ("__import__('os')", "hidden_size.bit_length()", "[1][0]", "open('x')"):
        with pytest.raises(ValueError, match="only names, numbers"):
            evaluate(bad, scope)
    with pytest.raises(ValueError, match="reads 'vocab_size', which the config does not set"):
        evaluate("vocab_size", scope)


# -- tables and their views ------------------------------------------------------------

#: An NNX-style model: heads on axes of their own, q/k/v fused into one kernel, the
#: MLP's two input projections concatenated, a scaled norm, a tied head.
TABLE = {
    "name": "fused",
    "defaults": {"tie_word_embeddings": True},
    "derived": {"head_dim": "hidden_size // heads"},
    "entry": [
        {"torch": "embed.weight", "flax": "embed/table"},
        {
            "torch": "layers.{i}.attn.{p}.weight",
            "parts": {"p": ["q", "k", "v"]},
            "flax": "layers/{i}/attn/qkv",
            "ops": [
                {"permute": [1, 0]},
                {"split": 1, "into": ["heads", "head_dim"]},
                {"stack": "p", "axis": 0},
            ],
        },
        {
            "torch": "layers.{i}.mlp.{p}.weight",
            "parts": {"p": ["gate", "up"]},
            "flax": "layers/{i}/mlp/wi",
            "ops": [{"concat": "p", "axis": 0}, {"permute": [1, 0]}],
        },
        {"torch": "layers.{i}.norm.weight", "flax": "layers/{i}/norm/scale", "ops": [{"scale": 2}]},
        {
            "torch": "head.weight",
            "flax": "head/kernel",
            "ops": [{"permute": [1, 0]}],
            "when": "not tie_word_embeddings",
        },
    ],
    "tie": [{"alias": "head.weight", "canonical": "embed.weight", "when": "tie_word_embeddings"}],
}
CONFIG = {"hidden_size": 8, "heads": 2}


def _tensors(rng: np.random.Generator, *, head: bool = False) -> dict[str, np.ndarray]:
    def bf16(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)

    out = {"embed.weight": bf16(10, 8)}
    for i in range(2):
        for p in "qkv":
            out[f"layers.{i}.attn.{p}.weight"] = bf16(8, 8)
        out[f"layers.{i}.mlp.gate.weight"] = bf16(12, 8)
        out[f"layers.{i}.mlp.up.weight"] = bf16(12, 8)
        out[f"layers.{i}.norm.weight"] = bf16(8)
    if head:
        out["head.weight"] = bf16(10, 8)
    return out


@pytest.fixture
def weights(tmp_path):
    tensors = _tensors(np.random.default_rng(0))
    save_file(tensors, tmp_path / "m.safetensors")
    return tmp_path / "m.safetensors", tensors


def test_a_table_places_each_tensor_and_comes_back_bit_for_bit(weights) -> None:
    path, tensors = weights
    table = Table.from_dict(TABLE)
    with SafetensorsFile(path) as file:
        tree = TableToFlax(file, table, CONFIG)
        assert tree.infos["layers/1/attn/qkv"].shape == (3, 8, 2, 4)
        assert tree.infos["layers/0/mlp/wi"].shape == (8, 24)
        qkv = tree.array("layers/1/attn/qkv")
        k = tensors["layers.1.attn.k.weight"]
        assert np.array_equal(qkv[1], k.T.reshape(8, 2, 4))
        wi = tree.array("layers/0/mlp/wi")
        gate, up = tensors["layers.0.mlp.gate.weight"], tensors["layers.0.mlp.up.weight"]
        assert np.array_equal(wi, np.concatenate([gate, up]).T)
        assert tree.placed_by["layers.0.mlp.up.weight"][1].startswith("entry 3 (")
        assert tree.implicit == {}  # (Tied in the table, but the file holds no head.)
        # A device's block reads only its slices, and equals the block of the whole leaf.
        assert np.array_equal(
            tree.read_slice("layers/1/attn/qkv", (slice(1, 3), slice(2, 6), slice(1, 2))),
            qkv[1:3, 2:6, 1:2],
        )
        assert np.array_equal(
            tree.read_slice("layers/0/mlp/wi", (slice(3, 5), slice(10, 14))), wi[3:5, 10:14]
        )
        leaves = {p: tree.array(p) for p in tree.infos}
    back = TableToTorch(TreeSource(nest(leaves)), table, CONFIG)
    assert dict(back.ties) == {"head.weight": "embed.weight"}
    assert sorted(back.infos) == sorted(tensors)
    for name, x in tensors.items():
        got = back.array(name)
        assert got.dtype == x.dtype and np.array_equal(got, x), name


def test_an_untied_table_places_the_head(tmp_path) -> None:
    tensors = _tensors(np.random.default_rng(1), head=True)
    save_file(tensors, tmp_path / "m.safetensors")
    config = {**CONFIG, "tie_word_embeddings": False}
    with SafetensorsFile(tmp_path / "m.safetensors") as file:
        tree = TableToFlax(file, Table.from_dict(TABLE), config)
        assert np.array_equal(tree.array("head/kernel"), tensors["head.weight"].T)


def test_a_stored_tensor_the_table_ties_is_one_line(tmp_path) -> None:
    tensors = _tensors(np.random.default_rng(2), head=True)
    save_file(tensors, tmp_path / "m.safetensors")
    with SafetensorsFile(tmp_path / "m.safetensors") as file:
        with pytest.warns(
            UserWarning, match=r"'head.weight' is stored but the config ties it .*max \|Δ\|"
        ) as caught:
            tree = TableToFlax(file, Table.from_dict(TABLE), CONFIG)
    assert len(caught) == 1 and "head/kernel" not in tree.infos
    assert tree.implicit == {"head.weight": "embed.weight"}


def _bad(tmp_path, table: dict, tensors: dict | None = None) -> str:
    save_file(tensors or _tensors(np.random.default_rng(0)), tmp_path / "m.safetensors")
    with SafetensorsFile(tmp_path / "m.safetensors") as file:
        with pytest.raises(ValueError) as e:
            TableToFlax(file, Table.from_dict(table), CONFIG)
    assert "\n" not in str(e.value)
    return str(e.value)


def _with(entries_change) -> dict:
    table = json.loads(json.dumps(TABLE))
    entries_change(table["entry"])
    return table


def test_a_tensor_no_entry_matches_names_the_nearest_entry(tmp_path) -> None:
    message = _bad(tmp_path, _with(lambda e: e.pop(3)))
    assert (
        "the tensor 'layers.0.norm.weight' has no place in the fused layout (nearest: entry"
        in message
    )


def test_an_entry_that_matches_nothing_names_the_nearest_tensor(tmp_path) -> None:
    extra = {"torch": "layers.{i}.norm.bias", "flax": "layers/{i}/norm/bias"}
    message = _bad(tmp_path, _with(lambda e: e.append(extra)))
    assert "entry 6 (layers.{i}.norm.bias -> layers/{i}/norm/bias) matches no tensor" in message
    assert "nearest tensor: 'layers." in message


def test_two_entries_claiming_one_tensor_is_one_line(tmp_path) -> None:
    twin = {"torch": "layers.{i}.norm.weight", "flax": "layers/{i}/norm/w"}
    message = _bad(tmp_path, _with(lambda e: e.append(twin)))
    assert "two entries claim the tensor 'layers.0.norm.weight': entry 4" in message


def test_sizes_that_do_not_divide_are_one_line(tmp_path) -> None:
    message = _bad(tmp_path, {**TABLE, "derived": {"head_dim": "3"}})
    assert "entry 2 (layers.{i}.attn.{p}.weight -> layers/{i}/attn/qkv)" in message
    assert "sizes [2, 3] do not make 8" in message


def test_a_missing_part_of_a_stack_is_one_line(tmp_path) -> None:
    tensors = _tensors(np.random.default_rng(0))
    del tensors["layers.1.attn.v.weight"]
    message = _bad(tmp_path, TABLE, tensors)
    assert "lacks the part {p}='v'" in message


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        (
            'name = "x"\n[[entry]]\ntorch = "a.weight"\nflax = \n',
            ".toml",
            "not TOML (Invalid value (at line 4, column 8))",
        ),
        ('{"name": "x", "entry": [}', ".json", "not JSON (Expecting value at line 1, column 25)"),
        (
            'name = "x"\n[[entry]]\ntorch = "a.weight"\nflx = "a/w"\n',
            ".toml",
            "entry 1: unknown key 'flx' (did you mean 'flax'?)",
        ),
        (
            'name = "x"\n[[entry]]\ntorch = "a.{i}.w"\nflax = "a/w"\n',
            ".toml",
            "{i} is in the torch name but not in the Flax path",
        ),
        (
            'name = "x"\n[[entry]]\ntorch = "a.w"\nflax = "a/w"\nops = [{turn = 1}]\n',
            ".toml",
            "entry 1, op 1: an op is one of",
        ),
        ('name = "x"\nentry = []\n', ".toml", "`entry` must list one entry or more"),
    ],
)
def test_a_layout_file_that_does_not_parse_names_its_line_or_key(
    tmp_path, text, suffix, message
) -> None:
    path = tmp_path / f"layout{suffix}"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        read_table(path)
    assert str(e.value).startswith(str(path)) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_table_round_trips_through_its_mapping_and_a_file(tmp_path) -> None:
    table = Table.from_dict(TABLE)
    assert Table.from_dict(table.to_dict()) == table
    (tmp_path / "t.json").write_text(json.dumps(table.to_dict()))
    assert read_table(tmp_path / "t.json") == table
    layout = as_layout(str(tmp_path / "t.json"))
    assert isinstance(layout, Layout) and layout.view is not None and layout.name == "fused"


def test_the_command_refuses_a_bad_layout_file_in_one_line(tmp_path, weights, capsys) -> None:
    path, _ = weights
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[[entry]]\ntorch = "a"\n')
    out = tmp_path / "out"
    assert main(["convert", str(path), str(out), "--layout", str(bad), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "entry 1: the key 'flax' is missing" in err, err
    assert not out.exists()


# -- pads, value ops both ways, conditional ops ----------------------------------------


@st.composite
def _padding_ops(draw):
    """A shape and a chain of permutes and pads (zero rows added on an axis) that fits it."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    ops, current = [], shape
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            op = Permute(tuple(draw(st.permutations(range(len(current))))))
        else:
            axis = draw(st.integers(0, len(current) - 1))
            op = Pad(axis, current[axis], current[axis] + draw(st.integers(0, 3)))
        ops.append(op)
        current = op.shape(current)
    return shape, ops


@given(_padding_ops(), st.data())
def test_a_pad_inverts_by_slicing_and_maps_slices(case, data) -> None:
    """backward(forward(x)) is x, the padding zeros; a slice of the result read through
    the mapped index equals the slice of the whole result."""
    shape, ops = case
    x = np.arange(1, math.prod(shape) + 1, dtype=np.float32).reshape(shape)
    y = x
    for op in ops:
        y = op.forward(y)
    shapes = _chain(ops, shape, "")
    assert y.shape == shapes[-1] and int(np.count_nonzero(y)) == x.size
    back = y
    for op in reversed(ops):
        back = op.backward(back)
    assert back.shape == x.shape and np.array_equal(back, x)
    assert [op.back_shape(s) for op, s in zip(ops, shapes[1:], strict=True)] == shapes[:-1]
    index = tuple(
        slice(*sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2))))
        for n in y.shape
    )
    assert np.array_equal(_through(ops, shapes, index, lambda i: x[i]), y[index])


_FLOATS = st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16, np.float64])


@given(
    _FLOATS.flatmap(
        lambda dtype: hnp.arrays(
            dtype, hnp.array_shapes(max_dims=2, max_side=4), elements=st.floats(-8, 8, width=16)
        )
    ),
    st.sampled_from(["scale", "divide", "add"]),
    st.sampled_from(["float32", "dtype", "promote"]),
    st.floats(0.125, 16),
)
def test_a_value_op_computes_as_its_table_says_both_ways(x, kind, within, f) -> None:
    """Forward is the arithmetic ``in`` names, in the tensor's dtype; the way back is the
    inverse arithmetic, or ``back`` where given."""
    op = parse_op({kind: f, "in": within}, "e").bind(Scope({}))
    sign = {"scale": np.multiply, "divide": np.divide, "add": np.add}[kind]
    inverse = {"scale": np.divide, "divide": np.multiply, "add": np.subtract}[kind]

    def arithmetic(g, y):
        if within == "dtype":
            return g(y, np.asarray(f, y.dtype)).astype(y.dtype)
        if within == "promote":
            return g(y, np.float32(f)).astype(y.dtype)
        return g(y.astype(np.float32), np.float32(f)).astype(y.dtype)

    def bits(a):
        return np.ascontiguousarray(a).view(np.uint8)

    y = op.forward(x)
    assert y.dtype == x.dtype and np.array_equal(bits(y), bits(arithmetic(sign, x)))
    assert np.array_equal(bits(op.backward(y)), bits(arithmetic(inverse, y)))
    given_back = parse_op({kind: f, "in": within, "back": {"scale": 2}}, "e").bind(Scope({}))
    assert np.array_equal(bits(given_back.backward(y)), bits(Scale(2.0).forward(y)))


def test_a_value_op_is_exact_where_its_way_back_undoes_it() -> None:
    query = {"scale": "1 / sqrt(head_dim)", "back": {"scale": "sqrt(head_dim)"}}
    assert parse_op(query, "e").bind(Scope({"head_dim": 16})).exact
    assert not parse_op(query, "e").bind(Scope({"head_dim": 8})).exact
    assert Divide(4.0, "dtype", Scale(4.0)).exact and not Divide(4.0, back=Scale(2.0)).exact
    assert Add(0.0, back=Add(0.0)).exact and not Scale(0.5, back=Add(0.0)).exact
    x = np.float32([1.0, 3.0, -7.5])
    op = Divide(math.sqrt(8), "dtype", Scale(math.sqrt(8)))
    assert not op.exact and op.forward(x).tolist() == (x / np.float32(math.sqrt(8))).tolist()


def test_an_op_applies_where_its_condition_holds() -> None:
    table = Table.from_dict(
        {
            "name": "t",
            "entry": [
                {
                    "torch": "w",
                    "flax": "w",
                    "ops": [{"permute": [1, 0]}, {"scale": 2, "when": "double"}],
                }
            ],
        }
    )
    assert isinstance(table.entries[0].ops[1], When)
    assert table.bind({"double": True}).entries[0].ops == (Permute((1, 0)), Scale(2.0))
    assert table.bind({"double": False}).entries[0].ops == (Permute((1, 0)),)
    assert Table.from_dict(table.to_dict()) == table


def test_options_are_seen_over_the_config() -> None:
    table = Table.from_dict(
        {
            "name": "t",
            "defaults": {"scan_axis": 0},
            "ranges": {"i": "layers"},
            "entry": [{"torch": "h.{i}.w", "flax": "h/w", "shape": ["d"], "ops": [
                {"stack": "i", "axis": "scan_axis"}]}],
        }
    )  # fmt: skip
    config = {"layers": 3, "d": 2, "scan_axis": 1}
    assert table.bind(config).entries[0].leaf_shape == (2, 3)
    assert table.bind(config, options={"scan_axis": 0}).entries[0].leaf_shape == (3, 2)
    assert table.bind({**config, "scan_axis": None}).entries[0].leaf_shape == (3, 2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"scale": 2, "in": "float16"}, "`in` is one of float32, dtype, promote"),
        ({"scale": 2, "back": {"permute": [1, 0]}}, "`back` is a value op"),
        ({"scale": 2, "back": {"scale": 1, "back": {"scale": 1}}}, "has no `back` of its own"),
        ({"stack": "i", "when": "scan"}, "the stack op takes axis; got 'when'"),
        ({"pad": 0, "size": 3}, "the pad op needs `to`"),
        ({"stack": "i", "axis": 1.5}, "axis must be an int or an expression"),
    ],
)
def test_a_bad_new_op_is_one_line(spec, message) -> None:
    with pytest.raises(ValueError, match="^entry 3: ") as e:
        parse_op(spec, "entry 3")
    assert message in str(e.value) and "\n" not in str(e.value)


# -- shapes, ranges, a prefix: every tensor the config's model holds, named ----------------

#: A scanned model: its layers stacked on an axis the caller chooses, a padded
#: vocabulary, a scaled query whose way back is given, a head optional where tied.
LAYERS = {
    "name": "scanned",
    "defaults": {"tied": False, "scan_axis": 1},
    "derived": {"rows": "vocab"},
    "ranges": {"i": {"size": "layers", "noun": "layer"}},
    "entry": [
        {
            "torch": "emb.w",
            "flax": "emb",
            "shape": ["vocab", "d"],
            "ops": [{"pad": 0, "size": "vocab", "to": "rows"}],
        },
        {
            "torch": "h.{i}.q",
            "flax": "h/q",
            "shape": ["heads * 2", "d"],
            "ops": [
                {"permute": [1, 0]},
                {"split": 1, "into": ["heads", 2]},
                {"scale": 0.5, "back": {"scale": 2}},
                {"stack": "i", "axis": "scan_axis"},
            ],
        },
        {
            "torch": "head.w",
            "flax": "head",
            "shape": ["vocab", "d"],
            "ops": [{"permute": [1, 0]}],
            "optional": "tied",
        },
    ],
    "tie": [{"alias": "head.w", "canonical": "emb.w", "when": "tied"}],
}
SIZES = {"layers": 2, "d": 3, "heads": 2, "vocab": 5}


def _scanned(rng: np.random.Generator, **edit: np.ndarray | None) -> dict[str, np.ndarray]:
    out = {"emb.w": rng.standard_normal((5, 3)).astype(np.float32)}
    for i in range(2):
        out[f"h.{i}.q"] = rng.standard_normal((4, 3)).astype(np.float32)
    out["head.w"] = rng.standard_normal((5, 3)).astype(np.float32)
    for name, value in edit.items():
        name = name.replace("_", ".")
        if value is None:
            del out[name]
        else:
            out[name] = value
    return out


class _Recorded(TreeSource):
    """A tree in memory that records what is read."""

    def __init__(self, tree, config=None) -> None:
        super().__init__(tree, config)
        self.calls: list[tuple[str, tuple]] = []

    def read(self, name):
        self.calls.append((name, ()))
        return super().read(name)

    def read_slice(self, name, index):
        self.calls.append((name, tuple(index)))
        return np.asarray(super().read(name))[index]


def test_a_table_with_shapes_and_ranges_comes_back_under_a_prefix(tmp_path) -> None:
    table = Table.from_dict(LAYERS)
    assert Table.from_dict(table.to_dict()) == table
    tensors = _scanned(np.random.default_rng(3))
    save_file(tensors, tmp_path / "m.safetensors")
    with SafetensorsFile(tmp_path / "m.safetensors") as file:
        tree = TableToFlax(file, table, SIZES, options={"rows": 8}, prefix=("params",))
        assert tree.infos["params/h/q"].shape == (3, 2, 2, 2)  # (d, layers, heads, 2)
        assert tree.infos["params/emb"].shape == (8, 3)
        leaves = {p: tree.array(p) for p in tree.infos}
    assert np.array_equal(leaves["params/emb"][5:], np.zeros((3, 3), np.float32))
    source = _Recorded({**nest(leaves), "step": np.zeros((), np.int32)})
    back = TableToTorch(source, table, SIZES, options={"rows": 8}, prefix=("params",))
    assert list(back.infos) == ["emb.w", "h.0.q", "h.1.q", "head.w"]  # (The model's order.)
    assert np.array_equal(back.array("h.1.q"), tensors["h.1.q"])
    assert source.calls[-1] == ("params/h/q", (slice(None), slice(1, 2), slice(None), slice(None)))
    assert np.array_equal(back.array("emb.w"), tensors["emb.w"])
    assert source.calls[-1] == ("params/emb", (slice(0, 5), slice(None)))  # (Not the padding.)
    assert all(name != "step" for name, _ in source.calls)
    tied = Table.from_dict(LAYERS).bind({**SIZES, "tied": True})
    assert list(tied.torch_shapes()) == ["emb.w", "h.0.q", "h.1.q"]


class _Named(TensorSource):
    """PyTorch-named tensors in memory."""

    def __init__(self, tensors: dict) -> None:
        self._tensors = tensors
        self.infos = {n: ArrayInfo(a.shape, a.dtype.name) for n, a in tensors.items()}

    def read(self, name):
        return self._tensors[name]


@pytest.mark.parametrize(
    ("edit", "config", "says"),
    [
        ({"h_1_q": None}, {}, "the tensor 'h.1.q' (4, 3) is missing (nearest: h.0.q)"),
        ({"h_1_q": np.zeros((4, 2), np.float32)}, {},
         "the tensor 'h.1.q' has shape (4, 2), but config.json (heads=2, d=3, layers=2) makes "
         "it (4, 3)"),
        ({"h_2_q": np.zeros((4, 3), np.float32)}, {},
         "the tensor 'h.2.q' has no place in the scanned layout (layer 2 is beyond layers=2)"),
        ({"h_1_q": np.zeros((4, 3), np.float16)}, {},
         "'h.1.q' is float16, but layer 0's is float32"),
        ({"head_w": None}, {},
         "the tensor 'head.w' is missing, which entry 3 (head.w -> head) allows only where "
         "`tied` holds"),
    ],
)  # fmt: skip
def test_a_tensor_the_config_says_is_named_with_its_shape(edit, config, says) -> None:
    with pytest.raises(ValueError) as e:
        TableToFlax(
            _Named(_scanned(np.random.default_rng(4), **edit)),
            Table.from_dict(LAYERS),
            {**SIZES, **config},
        )
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def _leaves(**edit: np.ndarray | None) -> dict[str, np.ndarray]:
    tree = TableToFlax(_Named(_scanned(np.random.default_rng(5))), Table.from_dict(LAYERS), SIZES)
    out = {f"params/{p}": tree.array(p) for p in tree.infos}
    for name, value in edit.items():
        path = f"params/{name}"
        if value is None:
            del out[path]
        else:
            out[path] = value
    return out


@pytest.mark.parametrize(
    ("edit", "config", "says"),
    [
        ({"emb": None}, {}, "the leaf 'params/emb' (5, 3) is missing"),
        ({}, {"layers": 3},
         "the leaf 'params/h/q' (3, 2, 2, 2) stacks 2 layers on its axis 1 (scan_axis), but "
         "config.json has layers=3"),
        ({}, {"d": 4}, "the leaf 'params/emb' has shape (5, 3), but config.json (vocab=5, d=4"),
        ({"h/k": np.zeros(2, np.float32)}, {}, "the leaf 'params/h/k' has no place in the "
         "scanned layout (nearest: entry 2"),
        ({"head": None}, {}, "the leaf 'params/head' is missing, which entry 3"),
    ],
)  # fmt: skip
def test_a_leaf_the_config_says_is_named_with_its_shape(edit, config, says) -> None:
    source = _Recorded(nest(_leaves(**edit)))
    with pytest.raises(ValueError) as e:
        TableToTorch(source, Table.from_dict(LAYERS), {**SIZES, **config}, prefix=("params",))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not source.calls  # (Refused before anything is read.)


def test_leaves_beside_the_tables_are_refused_or_left_alone() -> None:
    tree = {k.removeprefix("params/"): v for k, v in _leaves().items()}
    tree["step"] = np.zeros((), np.int32)
    with pytest.raises(ValueError, match="the leaf 'step' has no place in the scanned layout"):
        TableToTorch(TreeSource(nest(tree)), Table.from_dict(LAYERS), SIZES)
    back = TableToTorch(TreeSource(nest(tree)), Table.from_dict(LAYERS), SIZES, others="leave")
    assert sorted(back.infos) == ["emb.w", "h.0.q", "h.1.q", "head.w"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda t: t["entry"][1].update(shape=["heads * 3", "d"]),
         "split of axis 1 (size 6): sizes [2, 2] do not make 6"),
        (lambda t: t["derived"].update(rows="vocab - 1"), "pad `to` 'rows' is 4, less than `size`"),
        (lambda t: t["ranges"].update(i="layers - 2"), "ranges.i: 'layers - 2' is 0"),
        (lambda t: t["entry"][0].update(optional=3), "`optional`: true, false or a condition"),
    ],
)  # fmt: skip
def test_a_table_that_does_not_fit_its_shapes_is_refused_at_load(change, says) -> None:
    data = json.loads(json.dumps(LAYERS))
    change(data)
    with pytest.raises(ValueError) as e:
        Table.from_dict(data).bind(SIZES)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- a stack with a condition: one entry for stacked and unstacked layers ------------------

#: Layers stacked into ``h/w`` where ``scan`` holds, else one leaf ``h_{i}/w`` each.
UNSTACKED = {
    "name": "scannable",
    "defaults": {"scan": True, "axis": 0},
    "ranges": {"i": {"size": "layers", "noun": "layer"}},
    "entry": [
        {"torch": "emb.w", "flax": "emb", "shape": ["d", "d"]},
        {
            "torch": "h.{i}.w",
            "flax": "h/w",
            "shape": ["d", "d + 1"],
            "ops": [
                {"permute": [1, 0]},
                {"stack": "i", "axis": "axis", "when": "scan", "unstacked": {"h": "h_{i}"}},
            ],
        },
    ],
}


def _layers(rng: np.random.Generator, layers: int, d: int) -> dict[str, np.ndarray]:
    out = {"emb.w": rng.standard_normal((d, d)).astype(np.float32)}
    for i in range(layers):
        out[f"h.{i}.w"] = rng.standard_normal((d, d + 1)).astype(np.float32)
    return out


@pytest.mark.parametrize(
    ("options", "leaves", "placed"),
    [
        ({}, {"emb": (3, 3), "h/w": (2, 4, 3)}, ("h/w", "entry 2 (h.{i}.w -> h/w)")),
        ({"axis": 2}, {"emb": (3, 3), "h/w": (4, 3, 2)}, ("h/w", "entry 2 (h.{i}.w -> h/w)")),
        ({"scan": False}, {"emb": (3, 3), "h_0/w": (4, 3), "h_1/w": (4, 3)},
         ("h_0/w", "entry 2 (h.{i}.w -> h_{i}/w)")),
    ],
)  # fmt: skip
def test_a_stack_with_a_condition_stacks_or_spells_each_part(options, leaves, placed) -> None:
    table = Table.from_dict(UNSTACKED)
    assert Table.from_dict(table.to_dict()) == table
    assert table.entries[1].unstacked == "h_{i}/w"
    sizes = {"layers": 2, "d": 3}
    tensors = _layers(np.random.default_rng(6), 2, 3)
    tree = TableToFlax(_Named(tensors), table, sizes, options=options)
    assert {p: i.shape for p, i in tree.infos.items()} == leaves
    assert tree.placed_by["h.0.w"] == placed
    bound = table.bind(sizes, options=options)
    assert bound.torch_shapes() == {n: x.shape for n, x in tensors.items()}
    back = TableToTorch(TreeSource(nest({p: tree.array(p) for p in tree.infos})), table, sizes,
                        options=options)  # fmt: skip
    assert list(back.infos) == list(tensors)
    for name, x in tensors.items():
        assert np.array_equal(back.array(name), x), name


@given(
    layers=st.integers(1, 4),
    d=st.integers(1, 3),
    axis=st.integers(0, 2),
    scan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_stack_with_a_condition_comes_back_bit_for_bit(layers, d, axis, scan, seed) -> None:
    table = Table.from_dict(UNSTACKED)
    sizes, options = {"layers": layers, "d": d}, {"scan": scan, "axis": axis}
    tensors = _layers(np.random.default_rng(seed), layers, d)
    tree = TableToFlax(_Named(tensors), table, sizes, options=options)
    leaves = {p: tree.array(p) for p in tree.infos}
    parts = [tensors[f"h.{i}.w"].T for i in range(layers)]
    if scan:
        assert sorted(leaves) == ["emb", "h/w"]
        assert np.array_equal(leaves["h/w"], np.stack(parts, axis))
    else:
        assert sorted(leaves) == ["emb", *(f"h_{i}/w" for i in range(layers))]
        assert all(np.array_equal(leaves[f"h_{i}/w"], parts[i]) for i in range(layers))
    back = TableToTorch(TreeSource(nest(leaves)), table, sizes, options=options)
    assert sorted(back.infos) == sorted(tensors)
    for name, x in tensors.items():
        got = back.array(name)
        assert got.dtype == x.dtype and np.array_equal(got, x), name


@pytest.mark.parametrize(
    ("flax", "op", "says"),
    [
        ("h/w", {"stack": "i", "when": "scan"},
         "the stack op takes axis; got 'when' without `unstacked`"),
        ("h/w", {"stack": "i", "unstacked": {"h": "h_{i}"}},
         "`unstacked` spells the parts where the stack's `when` does not hold; give it a `when`"),
        ("h/w", {"stack": "i", "when": "scan", "unstacked": "h_{i}"},
         "`unstacked` maps one segment of the Flax path to its spelling unstacked"),
        ("h/w", {"stack": "i", "when": "scan", "unstacked": {"h": "h/{i}"}},
         "`unstacked` maps one segment of the Flax path to its spelling unstacked"),
        ("h/w", {"stack": "i", "when": "scan", "unstacked": {"h": "h_{j}"}},
         "`unstacked` {h = 'h_{j}'}: the segment is plain text and its spelling holds {i}"),
        ("h/w", {"stack": "i", "when": "scan", "unstacked": {"x": "x_{i}"}},
         "`unstacked` respells the segment 'x', which the Flax path 'h/w' holds not"),
        ("h/h/w", {"stack": "i", "when": "scan", "unstacked": {"h": "h_{i}"}},
         "`unstacked` respells the segment 'h', which the Flax path 'h/h/w' holds twice or more"),
        ("h/w", {"stack": "i", "when": "scan", "unstacked": {"h": "h_{i}_{i}"}},
         "`unstacked` spells 'h' as 'h_{i}_{i}', which must hold {i}, the placeholder it stacks, "
         "and no other"),
        ("h/w", {"concat": "i", "when": "scan", "unstacked": {"h": "h_{i}"}},
         "the concat op takes axis, sizes; got 'unstacked'"),
        ("h/w", {"stack": "i", "when": "scan unless", "unstacked": {"h": "h_{i}"}},
         "op 1: 'scan unless' is not an expression"),
    ],
)  # fmt: skip
def test_a_bad_stack_with_a_condition_is_refused_at_load_in_one_line(flax, op, says) -> None:
    data = {"name": "t", "entry": [{"torch": "h.{i}.w", "flax": flax, "ops": [op]}]}
    with pytest.raises(ValueError, match=r"^layout: entry 1") as e:
        Table.from_dict(data).bind({"scan": True})
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_python_entry_with_a_conditional_stack_is_checked_alike() -> None:
    def entry(op):
        return Entry("h.{i}.w", "h/w", (op,))

    with pytest.raises(ValueError, match=r"always applies, but for a stack with `unstacked`"):
        Table("t", (entry(When(Stack("i"), "scan")),))
    with pytest.raises(ValueError, match=r"`unstacked` spells the parts .* give the stack a"):
        Table("t", (entry(Stack("i", 0, ("h", "h_{i}"))),))
    table = Table("t", (entry(When(Stack("i", 0, ("h", "h_{i}")), "scan")),))
    assert table.entries[0].resolved(True).ops == (Stack("i", 0),)
    assert table.entries[0].resolved(False) == Entry("h.{i}.w", "h_{i}/w")
