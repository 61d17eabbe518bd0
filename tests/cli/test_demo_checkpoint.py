"""The checkpoint part of `jaxshare demo` tells a true story."""

from __future__ import annotations

from pathlib import Path

from jaxshare.cli._demo_checkpoint import demo_story


def test_demo_story(tmp_path: Path) -> None:
    lines: list[str] = []
    demo_story(tmp_path / "ckpt", lines.append)
    text = "\n".join(lines)
    assert "keep steps [2, 3]" in text
    assert "decoder/embedding is wte/embedding (the same jax.Array)? True" in text
    assert "lm_head/kernel == wte/embedding.T? True" in text
    assert "restored into a Tied target: Tied with 2 aliases" in text
    assert "plain Orbax reads the item as the unique tree: ['mlp', 'wte']" in text
    assert (
        "params/wte/embedding  params/decoder/embedding, params/lm_head/kernel (permute [1, 0])"
        in text
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["2", "3"]
