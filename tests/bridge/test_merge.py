"""``bridge.merge_lora``: a PEFT adapter merged into its base, held against the real
PEFT 0.21's ``merge_and_unload`` bit for bit, its ties settled explicitly (kept when
both sides agree; else untied with ``tie_word_embeddings: false`` and one line, or
refused with ``keep_tie``), bad input one line with nothing written.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from bridge import merge_lora, read_adapter  # noqa: E402
from bridge.adapters.lora import fma_product  # noqa: E402
from jaxshare.internal import numpy_dtype  # noqa: E402

LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
)


def base_model(tied: bool, dtype: Any = None, kind: str = "llama", **more: Any) -> Any:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(**{**LLAMA, **more}, tie_word_embeddings=tied)
        model = transformers.LlamaForCausalLM(config)
    return model.to(dtype or torch.float32).eval()


def make(tmp: Path, tied: bool, options: dict, dtype: Any = None, **base: Any) -> Any:
    """The base saved by ``save_pretrained`` at ``tmp/base``, the adapter of ``options``
    (random factors; modules_to_save changed) at ``tmp/adapter``; returns PEFT's
    ``merge_and_unload`` model of them."""
    options = {"r": 8, "lora_alpha": 16, "init_lora_weights": False, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's notes on tied layers
        base_model(tied, dtype, **base).save_pretrained(tmp / "base")
        pm = peft.get_peft_model(base_model(tied, dtype, **base), peft.LoraConfig(**options))
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "modules_to_save" in name:
                    p.add_(torch.randn_like(p).to(p.dtype))
        pm.save_pretrained(tmp / "adapter")
        return pm.merge_and_unload().eval()


def state(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    return {k: v for f in files for k, v in load_file(f).items()}


def bits(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().view(torch.uint8).numpy()
    return np.ascontiguousarray(x).tobytes()


def merge(*args: Any, **kwargs: Any) -> tuple[Path, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = merge_lora(*args, **kwargs)
    return out, [str(w.message) for w in caught]


def loaded(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


PEFT_RIGHT = [
    ("fp32", None, dict(target_modules=["q_proj", "v_proj", "down_proj", "lm_head"])),
    ("fp32 embedding", None, dict(target_modules=["q_proj", "embed_tokens"])),
    ("fp32 rslora", None, dict(target_modules=["k_proj", "o_proj"], use_rslora=True)),
    (
        "fp32 patterns",
        None,
        dict(
            target_modules=r".*\.(q|gate)_proj",
            rank_pattern={"layers.1.self_attn.q_proj": 4},
            alpha_pattern={"gate_proj": 5},
        ),
    ),
    ("bf16", "bfloat16", dict(target_modules=["q_proj", "v_proj", "up_proj", "lm_head"])),
    ("fp16", "float16", dict(target_modules=["q_proj", "o_proj"])),
    ("untied modules_to_save", None, dict(target_modules=["q_proj"], modules_to_save=["lm_head"])),
]


@pytest.mark.parametrize(("case", "dtype", "options"), PEFT_RIGHT, ids=[c[0] for c in PEFT_RIGHT])
def test_bit_equal_to_peft(tmp_path: Path, case: str, dtype: str | None, options: dict) -> None:
    torch_dtype = None if dtype is None else getattr(torch, dtype)
    want = make(tmp_path, False, options, torch_dtype).state_dict()
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert lines == []
    got = state(out)
    assert set(got) == set(want)
    changed = 0
    base = state(tmp_path / "base")
    for name, value in want.items():
        assert got[name].dtype == numpy_dtype(str(value.dtype).removeprefix("torch."))
        assert bits(got[name]) == bits(value), name
        changed += bits(got[name]) != bits(base[name])
    assert changed >= 2  # (The merge changed what the adapter targets.)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False


def test_gpt2_conv1d_fan_in_fan_out(tmp_path: Path) -> None:
    options = dict(target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    want = make(tmp_path, True, options, kind="gpt2").state_dict()
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    got = state(out)
    assert lines == [] and "lm_head.weight" not in got  # (untouched: still tied)
    for name, value in want.items():
        if name in got:
            assert bits(got[name]) == bits(value), name


def _exact(weight: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """The merge in float64, the reference both roundings are held against."""
    return weight.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64)).T


def test_bf16_embedding_rounds_once_where_peft_rounds_twice(tmp_path: Path) -> None:
    want = make(tmp_path, False, dict(target_modules=["embed_tokens"]), torch.bfloat16)
    out, _ = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    name = "model.embed_tokens.weight"
    ours = state(out)[name]
    theirs = want.state_dict()[name].float().numpy()
    pair = read_adapter(tmp_path / "adapter").modules()["model.embed_tokens"]
    base = state(tmp_path / "base")[name]
    # What PEFT does: the float32 delta rounded to bfloat16, then added and rounded.
    bf16 = numpy_dtype("bfloat16")
    delta = (fma_product(pair.B, pair.A).T * np.float32(2.0)).astype(bf16)
    twice = (base.astype(np.float32) + delta.astype(np.float32)).astype(bf16)
    assert bits(twice.astype(np.float32)) == bits(theirs)
    exact = _exact(base, pair.A, pair.B, 2.0)
    err_ours = np.abs(ours.astype(np.float64) - exact)
    err_peft = np.abs(theirs.astype(np.float64) - exact)
    differ = ours.astype(np.float32) != theirs
    assert differ.any()  # (The two roundings do differ here, ...)
    assert (err_ours[differ] <= err_peft[differ]).mean() > 0.9  # (... ours mostly nearer.)
    assert (err_ours <= err_peft + 1e-30).mean() > 0.99


def test_tied_head_adapter_unties_with_one_line(tmp_path: Path) -> None:
    want = make(tmp_path, True, dict(target_modules=["q_proj", "lm_head"]))
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert len(lines) == 1 and "'lm_head.weight' and 'model.embed_tokens.weight' differ" in lines[0]
    assert "tie_word_embeddings: false" in lines[0] and "\n" not in lines[0]
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    got, base = state(out), state(tmp_path / "base")
    # The head is PEFT's merged head; the input embedding stays the base's (PEFT's merge
    # added the head's delta to the shared tensor, the embedding too: there it is wrong).
    assert bits(got["lm_head.weight"]) == bits(want.lm_head.weight)
    assert bits(got["model.embed_tokens.weight"]) == bits(base["model.embed_tokens.weight"])
    assert bits(want.model.embed_tokens.weight) != bits(base["model.embed_tokens.weight"])
    model = loaded(out)
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert bits(model.lm_head.weight) == bits(got["lm_head.weight"])


def test_keep_tie_refuses_with_both_names_and_nothing_written(tmp_path: Path) -> None:
    make(tmp_path, True, dict(target_modules=["lm_head"]))
    with pytest.raises(ValueError, match=r"'lm_head.weight' and 'model.embed_tokens.weight' "
                       r"differ \(max \|delta\| \d") as info:  # fmt: skip
        merge_lora(tmp_path / "base", tmp_path / "adapter", tmp_path / "out", keep_tie=True)
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_modules_to_save_on_one_side_unties(tmp_path: Path) -> None:
    want = make(tmp_path, True, dict(target_modules=["q_proj"], modules_to_save=["lm_head"]))
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert len(lines) == 1 and "tie_word_embeddings: false" in lines[0]
    got = state(out)
    assert bits(got["lm_head.weight"]) == bits(want.lm_head.weight)
    assert bits(got["model.embed_tokens.weight"]) == bits(
        state(tmp_path / "base")["model.embed_tokens.weight"]
    )


def test_weight_tying_adapter_keeps_the_tie(tmp_path: Path) -> None:
    # PEFT's ensure_weight_tying: the head's adapter is the embedding's, so both sides
    # merge to the same bits and the tie is kept, stored once.
    options = dict(target_modules=["q_proj", "embed_tokens"], ensure_weight_tying=True)
    make(tmp_path, True, options)
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert lines == []
    got = state(out)
    assert "lm_head.weight" not in got
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    model = loaded(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    pair = read_adapter(tmp_path / "adapter").modules()["model.embed_tokens"]
    base = state(tmp_path / "base")["model.embed_tokens.weight"]
    scale = 16 / 8
    want = base + fma_product(pair.A.T, pair.B.T) * np.float32(scale)
    assert bits(got["model.embed_tokens.weight"]) == bits(want)


def test_untouched_tie_is_kept(tmp_path: Path) -> None:
    make(tmp_path, True, dict(target_modules=["q_proj", "v_proj"]))
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert lines == [] and "lm_head.weight" not in state(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_safetensors_output_and_base(tmp_path: Path) -> None:
    want = make(tmp_path, False, dict(target_modules=["q_proj", "lm_head"])).state_dict()
    out, _ = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged.safetensors")
    got = state(out)
    assert all(bits(got[k]) == bits(v) for k, v in want.items())
    # A .safetensors base, merged again into another file: the same bytes.
    again, _ = merge(
        tmp_path / "base" / "model.safetensors",
        tmp_path / "adapter",
        tmp_path / "again.safetensors",
    )
    assert all(bits(state(again)[k]) == bits(v) for k, v in want.items())


def _one_line_nothing_written(tmp_path: Path, match: str, base: Path | None = None) -> None:
    with pytest.raises(ValueError, match=match) as info:
        merge_lora(base or tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_target_not_in_the_base(tmp_path: Path) -> None:
    make(tmp_path, False, dict(target_modules=["q_proj"]), num_hidden_layers=3)
    base_model(False, num_hidden_layers=2).save_pretrained(tmp_path / "small")
    _one_line_nothing_written(
        tmp_path,
        r"adapter changes 'model.layers.2.self_attn.q_proj.weight', which the base .*small does "
        r"not hold; is it this adapter's base\?",
        tmp_path / "small",
    )


def test_shape_mismatch(tmp_path: Path) -> None:
    make(tmp_path, False, dict(target_modules=["q_proj"]))
    base_model(False, hidden_size=32, head_dim=16).save_pretrained(tmp_path / "narrow")
    _one_line_nothing_written(
        tmp_path,
        r"'model.layers.0.self_attn.q_proj.weight' is \(64, 32\) in the base .*narrow, but its "
        r"rank-8 factors make it \(64, 64\)",
        tmp_path / "narrow",
    )


def test_rank_mismatch_and_unknown_type(tmp_path: Path) -> None:
    make(tmp_path, False, dict(target_modules=["q_proj"]))
    config_file = tmp_path / "adapter" / "adapter_config.json"
    doc = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**doc, "r": 4}))
    _one_line_nothing_written(tmp_path, r"expected rank 4")
    config_file.write_text(json.dumps({**doc, "peft_type": "LOHA"}))
    _one_line_nothing_written(tmp_path, r"key 'peft_type' is 'LOHA'")
    config_file.write_text(json.dumps({**doc, "use_dora": True}))
    _one_line_nothing_written(tmp_path, r"key 'use_dora' is True: DoRA")


def test_scaling_is_peft_s(tmp_path: Path) -> None:
    # rsLoRA's alpha / sqrt(r), PEFT's float, rounded to float32 as torch multiplies.
    make(tmp_path, False, dict(target_modules=["q_proj"], use_rslora=True, r=3, lora_alpha=7))
    adapter = read_adapter(tmp_path / "adapter")
    assert adapter.scaling_of("model.layers.0.self_attn.q_proj") == 7 / math.sqrt(3)


def _round_f32(x: Fraction) -> np.float32:
    """``x`` rounded to float32 exactly (to nearest, ties to even), from a fraction."""
    if x == 0:
        return np.float32(0.0)
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = max(math.floor(math.log2(x)), -126)
    while e > -126 and Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    q = x / Fraction(2) ** (e - 23)
    n, rest = math.floor(q), q - math.floor(q)
    n += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1)
    return np.float32(sign * float(n * Fraction(2) ** (e - 23)))


def _fma_reference(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    out = np.zeros((b.shape[0], a.shape[1]), np.float32)
    for i in range(b.shape[0]):
        for j in range(a.shape[1]):
            acc = np.float32(0.0)
            for k in range(b.shape[1]):
                exact = Fraction(float(b[i, k])) * Fraction(float(a[k, j])) + Fraction(float(acc))
                acc = _round_f32(exact)
            out[i, j] = acc
    return out


#: Where the float64 sum lands on a float32 midpoint: 1 + 2**-23 plus a product just
#: under half its ulp rounds down in a fused multiply-add, up (to even) if rounded twice.
MIDPOINT = (
    np.array([[1 + 2.0**-23, (1 + 2.0**-23) * 2.0**-12]], np.float32),
    np.array([[1.0], [(1 - 2.0**-23) * 2.0**-12]], np.float32),
)


def test_fma_product_settles_midpoints() -> None:
    b, a = MIDPOINT
    got = fma_product(b, a)
    assert got[0, 0] == np.float32(1 + 2.0**-23) == _fma_reference(b, a)[0, 0]
    assert (b.astype(np.float64) @ a.astype(np.float64)).astype(np.float32)[0, 0] != got[0, 0]


floats = st.floats(-4, 4, width=32, allow_subnormal=False)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 3), st.data())
def test_fma_product_is_a_chain_of_fused_multiply_adds(m: int, r: int, n: int, data: Any) -> None:
    b = np.array(data.draw(st.lists(floats, min_size=m * r, max_size=m * r)), np.float32)
    a = np.array(data.draw(st.lists(floats, min_size=r * n, max_size=r * n)), np.float32)
    b, a = b.reshape(m, r), a.reshape(r, n)
    assert bits(fma_product(b, a)) == bits(_fma_reference(b, a))


def test_an_orbax_item_base(tmp_path: Path) -> None:
    # The base converted to an Orbax item (Flax names, with its naming record) merges
    # to the same bytes as the Hugging Face directory it came from.
    import bridge

    make(tmp_path, True, dict(target_modules=["q_proj", "lm_head"]))
    bridge.convert(tmp_path / "base", tmp_path / "item")
    want, _ = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "a.safetensors")
    got, lines = merge(tmp_path / "item", tmp_path / "adapter", tmp_path / "b.safetensors")
    assert len(lines) == 1 and "tie_word_embeddings: false" in lines[0]
    a, b = state(want), state(got)
    assert set(a) == set(b) and all(bits(a[k]) == bits(b[k]) for k in a)


def test_tied_modules_to_save_with_weight_tying_keeps_the_tie(tmp_path: Path) -> None:
    # PEFT's ensure_weight_tying saves one trained embedding for both sides of the tie:
    # the same bits on both, so the tie is kept and the trained values stored once.
    options = dict(target_modules=["q_proj"], modules_to_save=["lm_head"], ensure_weight_tying=True)
    want = make(tmp_path, True, options)
    out, lines = merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "out")
    got = state(out)
    assert lines == [] and "lm_head.weight" not in got
    saved = read_adapter(tmp_path / "adapter").saved()
    assert set(saved) == {"lm_head.weight", "model.embed_tokens.weight"}
    assert bits(got["model.embed_tokens.weight"]) == bits(saved["model.embed_tokens.weight"])
    assert bits(got["model.embed_tokens.weight"]) == bits(want.model.embed_tokens.weight)
    assert bits(got["model.embed_tokens.weight"]) != bits(
        state(tmp_path / "base")["model.embed_tokens.weight"]
    )
