"""``jaxshare demo`` tells its whole story with the right answers: one run of the
command (the ``demo`` fixture), its output and the files it left, section by section."""

from __future__ import annotations

from jaxshare import checkpoint
from jaxshare.formats import alias_map_in, read_header


def test_exits_0_and_tells_every_section(demo):
    assert demo.status == 0
    sections = [line for line in demo.output.splitlines() if line.startswith("== ")]
    assert [s.split(".")[0] for s in sections] == ["== 1", "== 2", "== 3", "== 4"], sections
    assert "skipped" not in demo.output


def test_the_problem_and_the_core(demo):
    for expected in (
        "jax.jit(lambda x: (x, x)) returns the same array twice? False",
        "Attempt to donate the same buffer twice",
        "leaves: full tree 4, Tied 3 (the tie is one leaf)",
        "after training, lm_head/kernel == wte/embedding.T: True",
    ):
        assert expected in demo.output, expected


def test_the_checkpoint_part(demo):
    for expected in (
        "keep steps [2, 3]",
        "decoder/embedding is wte/embedding (the same jax.Array)? True",
        "lm_head/kernel == wte/embedding.T? True",
        "restored into a Tied target: Tied with 2 aliases",
        "plain Orbax reads the item as the unique tree: ['mlp', 'wte']",
        "params/wte/embedding  params/decoder/embedding, params/lm_head/kernel (permute [1, 0])",
    ):
        assert expected in demo.output, expected
    steps = demo.workdir / "checkpoint"
    assert sorted(p.name for p in steps.iterdir()) == ["2", "3"]


def test_the_checkpoint_it_leaves_keeps_the_ties(demo):
    item = demo.workdir / "checkpoint" / "3" / "params"
    assert dict(checkpoint.read_alias_map(item)) == {
        "params/decoder/embedding": "params/wte/embedding",
        "params/lm_head/kernel": "params/wte/embedding",
    }


def test_the_pytorch_part(demo):
    for expected in (
        "bridge.shared_params(model) = {'lm_head.weight': 'wte.weight'}",
        "in Flax, lm_head/kernel == wte/embedding.T: True",
        "Flax forward equals the PyTorch forward: True",
        "bridge.to_torch: lm_head.weight is wte.weight: True",
        "load_state_dict(strict=True) into a fresh model: ok",
        "tiny_lm.safetensors: lm_head.weight re-tied on load: True",
        "DeepSpeed walks named_children(): ['encoder', 'other'], so it never names decoder.*",
        "and keys by data_ptr(): {'encoder.gate': 0, 'other.gate': 0}",
        "'decoder.proj.weight': 'encoder.proj.weight'",
    ):
        assert expected in demo.output, expected


def test_the_safetensors_file_it_leaves_stores_the_tie_once(demo):
    header = read_header(demo.workdir / "bridge" / "tiny_lm.safetensors")
    assert "lm_head.weight" not in header.tensors and "wte.weight" in header.tensors
    assert dict(alias_map_in(header)) == {"lm_head.weight": "wte.weight"}
