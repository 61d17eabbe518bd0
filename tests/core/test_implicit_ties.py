"""Implicit ties: aliases the model computes rather than holds (an ``attend`` head, the
``lm_head`` of transformers' ``FlaxGPT2LMHeadModel``), recorded in the alias map and the
naming record, marked implicit, and never leaves of the tree.

- JSON: an implicit alias is an entry object with ``"implicit": true`` (in the alias map
  and the naming record); a document without one reads, and is written, as before.
- ``retie`` (so ``Tied.tree``) never puts an implicit alias back; ``dedupe`` takes a tree
  without it; the laws hold with implicit aliases (property tests).
- Equality is the ties': implicit marks say how the tree holds them, like the naming.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict as _flatten
from hypothesis import given
from hypothesis import strategies as st

from jaxshare import AliasMap, NamingRecord, Tied, dedupe, retie, tie

EMB = jnp.arange(6.0).reshape(3, 2)
HEAD = AliasMap(
    {"lm_head/kernel": "wte/embedding"},
    transforms={"lm_head/kernel": (1, 0)},
    implicit=["lm_head/kernel"],
)


# -- the alias map and the naming record, in JSON ---------------------------------


@pytest.mark.parametrize(
    "amap, entries",
    [
        (AliasMap({"b": "a"}), {"b": "a"}),
        (AliasMap({"k": "e"}, transforms={"k": (1, 0)}), {"k": {"target": "e", "permute": [1, 0]}}),
        (AliasMap({"b": "a"}, implicit=["b"]), {"b": {"target": "a", "implicit": True}}),
        (
            HEAD,
            {"lm_head/kernel": {"target": "wte/embedding", "permute": [1, 0], "implicit": True}},
        ),
        (
            AliasMap({"b": "a", "c": "a"}, implicit=["c"]),
            {"b": "a", "c": {"target": "a", "implicit": True}},
        ),
    ],
    ids=["identity", "transform", "implicit", "implicit transform", "one of two implicit"],
)
def test_an_implicit_alias_is_an_entry_object_marked_implicit(amap, entries):
    doc = json.loads(amap.to_json())
    assert doc == {"format": "jaxshare.alias_map", "version": 1, "aliases": entries}
    back = AliasMap.from_json(amap.to_json())
    assert back == amap and back.implicit == amap.implicit
    assert back.transforms == amap.transforms


def test_a_document_without_implicit_aliases_reads_and_is_written_as_before():
    old = (
        '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"a/b": "c/d", '
        '"lm_head/kernel": {"target": "wte/embedding", "permute": [1, 0]}}}'
    )
    amap = AliasMap.from_json(old)
    assert amap.implicit == frozenset() and amap.transform("lm_head/kernel") == (1, 0)
    assert amap.to_json() == old  # Byte for byte: old readers read it.
    record = '{"format": "jaxshare.naming", "version": 1, "leaves": {"a/k": {"torch": "a.w"}}}'
    assert NamingRecord.from_json(record).implicit == frozenset()
    assert NamingRecord.from_json(record).to_json() == record


def _doc(aliases):
    return json.dumps({"format": "jaxshare.alias_map", "version": 1, "aliases": aliases})


def _record(leaves):
    return json.dumps({"format": "jaxshare.naming", "version": 1, "leaves": leaves})


@pytest.mark.parametrize(
    "parse, text, match",
    [
        (AliasMap.from_json, _doc({"b": {"target": "a", "implicit": False}}), r"'b'.*must be true"),
        (AliasMap.from_json, _doc({"b": {"target": "a", "implicit": 1}}), r"'b'.*must be true"),
        (AliasMap.from_json, _doc({"b": {"target": "a"}}), r"'b'.*exactly the fields"),
        (
            AliasMap.from_json,
            _doc({"b": {"target": "a", "implicit": True, "x": 1}}),
            r"'b'.*exactly the fields",
        ),
        (AliasMap.from_json, _doc({"b": {"implicit": True}}), r"'b'.*exactly the fields"),
        (
            NamingRecord.from_json,
            _record({"a/k": {"torch": "a.w", "implicit": False}}),
            r"'implicit' of 'a/k' must be true",
        ),
        (
            NamingRecord.from_json,
            _record({"a/k": {"torch": "a.w", "implicit": "yes"}}),
            r"'implicit' of 'a/k' must be true",
        ),
    ],
    ids=[
        "map: false",
        "map: 1 (true is no 1)",
        "map: target alone",
        "map: unknown field",
        "map: no target",
        "record: false",
        "record: a string",
    ],
)
def test_an_implicit_mark_is_parsed_strictly(parse, text, match):
    with pytest.raises(ValueError, match=match):
        parse(text)


def test_the_naming_record_marks_a_leaf_implicit_and_so_does_the_map():
    record = NamingRecord(
        {"wte/embedding": "wte.weight", "lm_head/kernel": ("lm_head.weight", (1, 0))},
        implicit=["lm_head/kernel"],
    )
    back = NamingRecord.from_json(record.to_json())
    assert back == record and back.implicit == {"lm_head/kernel"}
    assert json.loads(record.to_json())["leaves"]["lm_head/kernel"]["implicit"] is True
    # The record's mark makes the alias implicit in a map that carries it...
    amap = AliasMap({"lm_head/kernel": "wte/embedding"}, naming=record)
    assert amap.implicit == {"lm_head/kernel"}
    # ...and renaming keeps both marks.
    renamed = amap.rename(lambda p: f"params/{p}")
    assert renamed.implicit == {"params/lm_head/kernel"}
    assert renamed.naming is not None and renamed.naming.implicit == {"params/lm_head/kernel"}
    assert record != NamingRecord(dict(record))  # The mark is part of the record.


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: AliasMap({"b": "a"}, implicit=["c"]), r"`implicit` names \['c'\]"),
        (lambda: AliasMap({"b": "a"}, implicit=["a"]), r"`implicit` names \['a'\]"),
        (lambda: NamingRecord({"a/k": "a.w"}, implicit=["b/k"]), r"implicit` names \['b/k'\]"),
    ],
    ids=["not in the map", "a canonical", "not in the record"],
)
def test_an_implicit_mark_names_an_alias(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_implicit_marks_say_how_the_tree_holds_the_ties_not_which():
    plain = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})
    assert HEAD == plain and hash(HEAD) == hash(plain)  # The same ties...
    assert HEAD.implicit != plain.implicit  # ...held otherwise,
    assert "implicit=['lm_head/kernel']" in repr(HEAD) and "implicit" not in repr(plain)
    assert HEAD.explicit() == AliasMap() and plain.explicit() is plain  # The ties that are leaves.
    assert HEAD.with_naming(None).implicit == HEAD.implicit
    chain = AliasMap({"c": "b", "b": "a"}, implicit=["c"])  # Chains collapse, marks stay.
    assert dict(chain) == {"b": "a", "c": "a"} and chain.implicit == {"c"}


# -- retie, dedupe, Tied ----------------------------------------------------------


@pytest.mark.parametrize(
    "unique, amap, leaves",
    [
        ({"wte": {"embedding": EMB}}, HEAD, ["wte/embedding"]),
        (
            {"a": EMB},
            AliasMap({"b": "a", "c": "a"}, implicit=["c"]),
            ["a", "b"],
        ),
        (
            {"enc": {"embedding": EMB}},
            AliasMap(
                {"dec/embedding": "enc/embedding", "head/kernel": "enc/embedding"},
                transforms={"head/kernel": (1, 0)},
                implicit=["head/kernel"],
            ),
            ["dec/embedding", "enc/embedding"],
        ),
    ],
    ids=["head", "one of two", "shared embedding, computed head"],
)
def test_an_implicit_alias_is_never_a_leaf(unique, amap, leaves, flat):
    full = retie(unique, amap)
    assert sorted(flat(full)) == leaves
    again, back = dedupe(full, amap)  # The tree without it dedupes with the same map.
    assert again == unique and back == amap
    tied = tie(full, amap)
    assert sorted(flat(tied.tree)) == leaves
    assert len(jax.tree_util.tree_leaves(tied)) == 1  # One leaf: the canonical.
    # The tie is a tie all the same: a gradient through the computed head reaches it.
    heads = [a for a in amap.implicit if amap.transform(a) is not None]
    if heads:
        canonical = amap[heads[0]]

        def loss(t):
            value = t.tree
            for part in canonical.split("/"):
                value = value[part]
            return (value.T.sum(axis=0) ** 2).sum()  # The head, computed: embedding.T

        grads = jax.grad(loss)(tied)
        assert np.asarray(jax.tree_util.tree_leaves(grads)[0]).any()


def test_a_tied_with_implicit_aliases_is_another_tree_structure():
    unique = {"wte": {"embedding": EMB}}
    plain = AliasMap({"lm_head/kernel": "wte/embedding"}, transforms={"lm_head/kernel": (1, 0)})
    with_head, without = Tied(unique, plain), Tied(unique, HEAD)
    assert "lm_head" in with_head.tree and "lm_head" not in without.tree
    # Equal maps, but `tree` differs: jit must not reuse one's trace for the other.
    assert jax.tree.structure(with_head) != jax.tree.structure(without)
    assert sorted(jax.jit(lambda t: t.tree)(without)) == ["wte"]


# -- the laws, with implicit aliases ----------------------------------------------

CANONICALS = [f"c{i}" for i in range(3)]


def flatten_dict(tree: dict) -> dict:
    return _flatten(tree, sep="/")


@st.composite
def tied_trees(draw):
    """``(unique tree, alias map)``: canonicals under ``params/``, aliases of them
    (transposed or not), some marked implicit."""
    n = draw(st.integers(1, len(CANONICALS)))
    unique = {"params": {c: {"w": jnp.arange(6.0).reshape(2, 3) + i} for i, c in
                         enumerate(CANONICALS[:n])}}  # fmt: skip
    aliases = draw(
        st.dictionaries(
            st.sampled_from([f"params/a{i}/w" for i in range(4)]),
            st.tuples(st.sampled_from(CANONICALS[:n]), st.booleans(), st.booleans()),
            max_size=4,
        )
    )
    amap = AliasMap(
        {a: f"params/{c}/w" for a, (c, _, _) in aliases.items()},
        transforms={a: (1, 0) for a, (_, t, _) in aliases.items() if t},
        implicit=[a for a, (_, _, i) in aliases.items() if i],
    )
    return unique, amap


@given(tied_trees())
def test_retie_puts_back_exactly_the_explicit_aliases(case):
    unique, amap = case
    full = retie(unique, amap)
    paths = set(flatten_dict(full))
    assert not paths & amap.implicit
    assert paths == {f"params/{c}/w" for c in unique["params"]} | (set(amap) - amap.implicit)
    assert retie(unique, amap.explicit()).keys() == full.keys()
    again, back = dedupe(full, amap)
    assert jax.tree.structure(again) == jax.tree.structure(unique)
    assert back == amap and back.implicit == amap.implicit


@given(tied_trees())
def test_implicit_marks_survive_json_and_renaming(case):
    _, amap = case
    back = AliasMap.from_json(amap.to_json())
    assert back == amap and back.implicit == amap.implicit and back.transforms == amap.transforms
    renamed = amap.rename(lambda p: f"model/{p}")
    assert renamed.implicit == {f"model/{a}" for a in amap.implicit}
