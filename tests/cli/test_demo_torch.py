"""The PyTorch part of ``jaxshare demo`` tells its story with the right answers."""

from jaxshare.cli._demo_torch import demo_story


def test_demo_story(tmp_path):
    lines: list[str] = []
    demo_story(tmp_path, lines.append)
    text = "\n".join(lines)
    for expected in (
        "bridge.shared_params(model) = {'lm_head.weight': 'wte.weight'}",
        "in Flax, lm_head/kernel == wte/embedding.T: True",
        "Flax forward equals the PyTorch forward: True",
        "bridge.to_torch: lm_head.weight is wte.weight: True",
        "load_state_dict(strict=True) into a fresh model: ok",
        "tiny_lm.safetensors: lm_head.weight re-tied on load: True",
        "DeepSpeed _get_shared_params: {'other.gate': 'encoder.gate'}",
        "'decoder.proj.weight': 'encoder.proj.weight'",
    ):
        assert expected in text, expected
    assert (tmp_path / "tiny_lm.safetensors").is_file()
