"""Hugging Face model directories, read and written, against transformers 5.

Tiny models built from configs in code (GPT-2, Llama tied and untied, T5's
three-way tie, BERT's tied decoder weight and bias), each saved by
``save_pretrained`` as one file and as shards, and as ``.bin`` shards written
here as transformers 4 wrote them (transformers 5 writes no ``.bin``). Every
route out and back must load in ``from_pretrained`` with no missing, unexpected
or mismatched keys and give the original's logits, bit for bit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

import bridge
from jaxshare import checkpoint, tie
from jaxshare.formats import SafetensorsFile, parse_size, read_header, save_plan
from jaxshare.stream import Plan

transformers = pytest.importorskip("transformers")

MODELS = ("gpt2", "llama_tied", "llama_untied", "t5", "bert")
FLAVOURS = ("one", "sharded", "bin")
SHARD = "6KB"  # Small enough for several shards of every model.


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    t = transformers
    if kind == "gpt2":
        config = t.GPT2Config(
            n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = t.GPT2LMHeadModel(config)
    elif kind.startswith("llama"):
        config = t.LlamaConfig(
            vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
            tie_word_embeddings=kind == "llama_tied", bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = t.LlamaForCausalLM(config)
    elif kind == "t5":
        config = t.T5Config(
            vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=2,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        )  # fmt: skip
        model = t.T5ForConditionalGeneration(config)
    else:
        config = t.BertConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=24, max_position_embeddings=16, pad_token_id=0,
        )  # fmt: skip
        model = t.BertForMaskedLM(config)
        with torch.no_grad():  # A bias that is not all zeros, so its tie shows.
            model.cls.predictions.bias.normal_()
    return model.eval()


def auto_class(kind: str) -> type:
    return {
        "t5": transformers.T5ForConditionalGeneration,
        "bert": transformers.BertForMaskedLM,
    }.get(kind, transformers.AutoModelForCausalLM)


def logits(model: torch.nn.Module, kind: str) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 7, 3, 2, 9]])
    with torch.no_grad():
        if kind == "t5":
            return model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        return model(input_ids=ids).logits


def save_bin(model: torch.nn.Module, directory: Path, max_shard_size: str) -> None:
    """``.bin`` shards and their index, as transformers 4 wrote them: tensors that
    share memory kept in one shard, each storage saved once."""
    from huggingface_hub import split_torch_state_dict_into_shards

    model.config.save_pretrained(directory)
    state = model.state_dict()
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="pytorch_model{suffix}.bin", max_shard_size=max_shard_size
    )
    for file, names in split.filename_to_tensors.items():
        torch.save({n: state[n] for n in names}, directory / file)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {kind: build(kind) for kind in MODELS}


@pytest.fixture(scope="module")
def dirs(models, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind, model in models.items():
        for flavour in FLAVOURS:
            path = root / f"{kind}-{flavour}"
            if flavour == "one":
                model.save_pretrained(path)
            elif flavour == "sharded":
                model.save_pretrained(path, max_shard_size=SHARD)
            else:
                save_bin(model, path, SHARD)
            out[kind, flavour] = path
    return out


def tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def groups(ties) -> set[frozenset[str]]:
    out: dict[str, set[str]] = {}
    for alias, canonical in ties.items():
        out.setdefault(canonical, {canonical}).add(alias)
    return {frozenset(g) for g in out.values()}


def assert_loads_as(path: Path, original: torch.nn.Module, kind: str, dtype=None) -> None:
    loaded, info = auto_class(kind).from_pretrained(path, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
    assert not problems, problems
    assert not info.get("error_msgs")
    expected = original if dtype is None else copy.deepcopy(original).to(dtype)
    assert loaded.dtype == (dtype or torch.float32)
    assert torch.equal(logits(loaded, kind), logits(expected, kind))
    for name, tensor in expected.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


# -- reading ----------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("use_transformers", [True, False], ids=["meta", "table"])
def test_reads_every_flavour_with_its_ties(dirs, models, kind, flavour, use_transformers):
    model = models[kind]
    expected = groups(model.all_tied_weights_keys)
    with bridge.HFDirectory(dirs[kind, flavour], use_transformers=use_transformers) as source:
        assert source.kind == "hf"
        assert source.exact is use_transformers
        assert groups(source.ties) == expected
        origin = "storage" if flavour == "bin" else "config.json"
        assert set(source.origins.values()) <= {origin}
        assert not source.written_out
        state = model.state_dict()
        for name in source.infos:
            np.testing.assert_array_equal(source.array(name), state[name].numpy())
        # Every name of the model is stored or an alias; nothing else is.
        assert set(source.infos) | set(source.ties) == set(state)
        if use_transformers:
            assert source.layers["lm_head" if kind != "bert" else "cls.predictions.decoder"]
        report = source.report()
        assert report.bytes_saved == sum(
            state[a].numel() * state[a].element_size() for a in source.ties
        )


def test_the_index_file_opens_the_directory(dirs):
    path = dirs["gpt2", "sharded"]
    with bridge.open_source(path / "model.safetensors.index.json") as source:
        assert isinstance(source, bridge.HFDirectory)
        assert len(source.weights.files) > 1
        assert dict(source.ties) == {"lm_head.weight": "transformer.wte.weight"}
    with bridge.open_source(dirs["gpt2", "bin"] / "pytorch_model.bin.index.json") as source:
        assert source.weights.flavour == "bin"
    with bridge.open_source(dirs["gpt2", "bin"] / "config.json") as source:
        assert source.path == dirs["gpt2", "bin"]


def test_one_bin_file(models, tmp_path):
    model = models["t5"]
    save_bin(model, tmp_path / "t5", "50GB")
    assert sorted(p.name for p in (tmp_path / "t5").iterdir()) == [
        "config.json",
        "pytorch_model.bin",
    ]
    with bridge.open_source(tmp_path / "t5") as source:
        assert source.weights.index is None and source.weights.flavour == "bin"
        assert groups(source.ties) == groups(model.all_tied_weights_keys)
        assert set(source.origins.values()) == {"storage"}
    dst = bridge.save_hf(tmp_path / "out", tmp_path / "t5")
    assert_loads_as(dst, model, "t5")


def test_layer_types_come_from_the_model_class(dirs):
    with bridge.HFDirectory(dirs["gpt2", "one"]) as source:
        assert source.layers["transformer.h.0.attn.c_attn"] == "conv1d"
        assert source.layers["transformer.wte"] == "embedding"
        assert source.layers["lm_head"] == "linear"
    with bridge.HFDirectory(dirs["gpt2", "one"], use_transformers=False) as source:
        assert source.layers is None


def test_works_without_transformers(dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails.
    with bridge.HFDirectory(dirs["t5", "sharded"]) as source:
        assert source.exact  # The table generated from transformers names them.
        assert dict(source.ties) == dict.fromkeys(
            ["decoder.embed_tokens.weight", "encoder.embed_tokens.weight", "lm_head.weight"],
            "shared.weight",
        )


@pytest.mark.parametrize("kind", MODELS)
def test_every_route_gives_the_same_flax_tree(dirs, models, kind, tmp_path):
    model = models[kind]
    single = tmp_path / "model.safetensors"
    bridge.save_safetensors(model.state_dict(), single)
    inputs = {
        "module": model,
        "state dict": model.state_dict(),
        "file": single,
        **{f"dir {f}": dirs[kind, f] for f in FLAVOURS},
        "dir table": bridge.HFDirectory(dirs[kind, "sharded"], use_transformers=False),
    }

    def layout(variables):
        return jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype)), variables)

    expected_vars, expected_map = bridge.to_flax(model)
    for what, source in inputs.items():
        variables, amap = bridge.to_flax(source)
        assert layout(variables) == layout(expected_vars), what
        assert amap == expected_map and amap.transforms == expected_map.transforms, what
        # The way back is exact without `like=`: names, values, ties as one tensor.
        back = bridge.to_torch(variables, amap)
        assert set(back) == set(model.state_dict()), what
        for name, tensor in model.state_dict().items():
            assert torch.equal(back[name], tensor), (what, name)
        assert groups(bridge.shared_params(back)) == groups(model.all_tied_weights_keys)


# -- writing ----------------------------------------------------------------------

ROUTES = ("orbax", "safetensors", "tree", "reshard", "bfloat16")


def convert(route: str, src: Path, dst: Path, tmp: Path) -> None:
    config = src / "config.json"
    if route == "orbax":
        with bridge.open_source(src) as source:
            checkpoint.write_item(tmp / "ckpt", bridge.flax_plan(source), source)
        bridge.save_hf(dst, tmp / "ckpt", config=config)
    elif route == "safetensors":
        with bridge.open_source(src) as source:
            save_plan(tmp / "w.safetensors", Plan.identity(source), source)
        bridge.save_hf(dst, tmp / "w.safetensors", config=config)
    elif route == "tree":
        variables, amap = bridge.to_flax(src)
        bridge.save_hf(dst, tie(variables, amap), config=json.loads(config.read_text()))
    elif route == "reshard":
        bridge.save_hf(dst, src, max_shard_size="3KB")
    else:
        bridge.save_hf(dst, src, dtype="bfloat16")


@pytest.mark.parametrize(
    "flavour,route",
    [
        ("one", "orbax"),
        ("sharded", "safetensors"),
        ("bin", "tree"),
        ("bin", "reshard"),
        ("sharded", "bfloat16"),
    ],
)
@pytest.mark.parametrize("kind", MODELS)
def test_round_trip_loads_in_transformers(dirs, models, kind, flavour, route, tmp_path):
    src = dirs[kind, flavour]
    before = tree_hash(src)
    dst = tmp_path / "out"
    convert(route, src, dst, tmp_path)
    assert tree_hash(src) == before
    assert_loads_as(dst, models[kind], kind, torch.bfloat16 if route == "bfloat16" else None)
    # What save_pretrained leaves out is left out; jaxshare reads every tie back.
    with bridge.HFDirectory(dst) as back:
        assert not set(back.infos) & set(models[kind].all_tied_weights_keys)
        assert groups(back.ties) == groups(models[kind].all_tied_weights_keys)
        if route == "orbax":  # The naming record came along: the same Flax names again.
            assert back.ties.naming is not None
            assert bridge.flax_plan(back) == bridge.flax_plan(src)


def test_flax_trees_without_a_naming_record_are_named_after_the_config(dirs, models, tmp_path):
    # No naming record: GPT-2's Conv1D kernels keep their layout because the meta
    # model of the config says they are Conv1D, not Linear.
    # The tie written out (lm_head/kernel is wte/embedding.T) is left out, as config.json
    # ties it: one line, saying the two hold the same values.
    variables, _ = bridge.to_flax(dirs["gpt2", "one"])
    same = r"'lm_head.weight' \(from 'lm_head.weight'\) is left out: .* the same values"
    with pytest.warns(UserWarning, match=same):
        dst = bridge.save_hf(tmp_path / "out", variables, config=models["gpt2"].config)
    assert_loads_as(dst, models["gpt2"], "gpt2")
    checkpoint.save(tmp_path / "plain", variables)  # A plain Orbax item, no naming record.
    assert checkpoint.read_alias_map(tmp_path / "plain").naming is None
    with pytest.warns(UserWarning, match=r"\(from 'params/lm_head/kernel'\) is left out"):
        dst = bridge.save_hf(tmp_path / "out2", tmp_path / "plain", config=dirs["gpt2", "one"])
    assert_loads_as(dst, models["gpt2"], "gpt2")


def test_shards_and_index(dirs, models, tmp_path):
    dst = bridge.save_hf(tmp_path / "out", dirs["gpt2", "one"], max_shard_size="3KB")
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 2 and files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [*files, "config.json", "generation_config.json", "model.safetensors.index.json"]
    )
    total = 0
    for file in files:
        header = read_header(dst / file)
        assert header.metadata["format"] == "pt"
        size = sum(e.end - e.begin for e in header.tensors.values())
        assert size <= 3000 or len(header.tensors) == 1  # save_pretrained's split
        total += size
    assert index["metadata"]["total_size"] == total
    # The tie is recorded in the shard that stores its canonical.
    owner = index["weight_map"]["transformer.wte.weight"]
    with SafetensorsFile(dst / owner) as shard:
        assert dict(shard.ties) == {"lm_head.weight": "transformer.wte.weight"}


def test_shards_from_an_item_read_ahead_hold_what_the_directory_holds(dirs, models, tmp_path):
    # An item is not mapped: its tensors are read ahead on threads in the shards'
    # order, which a tensor over the limit (a shard of its own) takes out of the
    # plan's order. Every shard must still hold exactly its own tensors' bytes.
    item = tmp_path / "item"
    bridge.convert(dirs["gpt2", "one"], item)
    direct = bridge.save_hf(tmp_path / "direct", dirs["gpt2", "one"], max_shard_size="3KB")
    ahead = bridge.save_hf(tmp_path / "ahead", item, max_shard_size="3KB")
    index = json.loads((ahead / "model.safetensors.index.json").read_text())
    assert index == json.loads((direct / "model.safetensors.index.json").read_text())
    for file in sorted(set(index["weight_map"].values())):
        with SafetensorsFile(direct / file) as want, SafetensorsFile(ahead / file) as got:
            assert list(got.infos) == list(want.infos)
            for name in want.infos:
                np.testing.assert_array_equal(got.read(name), want.read(name), strict=True)
    assert_loads_as(ahead, models["gpt2"], "gpt2")


@pytest.mark.parametrize("shard", [None, "3MB"])
def test_an_items_tensors_are_made_where_the_directory_writes_them(tmp_path, copied, shard):
    """Each array read ahead from an item (decoded, transposed) is made to line up
    with its place in its shard, which writes it without a copy: only the headers,
    the arrays' partial first and last blocks, and the small tensors are copied."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=600, hidden_size=512, intermediate_size=640, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf")
    bridge.convert(tmp_path / "hf", tmp_path / "item")
    copied.clear()
    out = bridge.save_hf(tmp_path / "out", tmp_path / "item", max_shard_size=shard)
    files = sorted(out.glob("*.safetensors"))
    assert (len(files) > 2) == (shard is not None)
    small = sum(
        e.end - e.begin
        for f in files
        for e in read_header(f).tensors.values()
        if e.end - e.begin < 2**20
    )
    headers = sum(read_header(f).data_start for f in files)
    assert sum(copied) < headers + small + len(files) * 2**16, copied
    assert_loads_as(out, model, "llama")


def test_an_alias_the_config_does_not_tie_is_written_out(tmp_path):
    model = build("llama_untied")
    with torch.no_grad():
        model.lm_head.weight = model.model.embed_tokens.weight  # Tied, config says untied.
    dst = bridge.save_hf(tmp_path / "out", model, config=model.config)
    assert "lm_head.weight" in read_header(dst / "model.safetensors").tensors
    assert_loads_as(dst, model, "llama_untied")
    with bridge.HFDirectory(dst) as back:
        assert dict(back.ties) == {"lm_head.weight": "model.embed_tokens.weight"}
        assert back.written_out == {"lm_head.weight"}
        assert back.origins == {"lm_head.weight": "metadata"}


def test_a_tie_the_files_contradict_stays_two_tensors(models, tmp_path):
    model = models["gpt2"]
    path = tmp_path / "dir"
    model.save_pretrained(path)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] += 1  # Stored, and not the embedding.
    (path / "model.safetensors").unlink()
    bridge.save_safetensors(state, path / "model.safetensors")
    with bridge.HFDirectory(path) as source:
        assert not source.ties
        assert "lm_head.weight" in source.infos


def test_a_config_tie_that_cannot_be_named_warns(models, tmp_path):
    model = models["gpt2"]
    path = tmp_path / "dir"
    model.save_pretrained(path)
    state = {k: v for k, v in model.state_dict().items() if k not in ("lm_head.weight",)}
    del state["transformer.wte.weight"]
    (path / "model.safetensors").unlink()
    bridge.save_safetensors(state, path / "model.safetensors")
    with pytest.warns(UserWarning, match=r"ties .*lm_head.weight.*hold none of them"):
        source = bridge.HFDirectory(path)
    assert not source.ties
    custom = tmp_path / "custom"
    custom.mkdir()
    config = {"model_type": "mine", "architectures": ["MineForCausalLM"]}
    (custom / "config.json").write_text(json.dumps(config))
    bridge.save_safetensors({"emb.table": torch.zeros(3, 2)}, custom / "model.safetensors")
    with pytest.warns(UserWarning, match=r"^[^\n]*no stored tensor is an input embedding[^\n]*$"):
        source = bridge.HFDirectory(custom)
    assert not source.ties


def test_tie_encoder_decoder_names_what_transformers_4_left_out(models, tmp_path):
    model = models["t5"]
    path = tmp_path / "dir"
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_encoder_decoder": True}))
    state = {k: v for k, v in model.state_dict().items() if k not in model.all_tied_weights_keys}
    left_out = "decoder.block.0.layer.0.SelfAttention.q.weight"
    state[left_out.replace("decoder", "encoder")] = state[left_out]
    del state[left_out]
    (path / "model.safetensors").unlink()
    bridge.save_safetensors(state, path / "model.safetensors")
    with bridge.HFDirectory(path) as source:
        assert source.ties[left_out] == "encoder.block.0.layer.0.SelfAttention.q.weight"
        assert source.origins[left_out] == "config.json"
    # transformers 5 no longer ties them: the output writes the decoder's weight out.
    dst = bridge.save_hf(tmp_path / "out", path)
    assert left_out in read_header(dst / "model.safetensors").tensors
    with pytest.warns(UserWarning, match="tie_encoder_decoder"):
        bridge.HFDirectory(path, use_transformers=False).close()


@pytest.mark.parametrize(
    "size,expected",
    [("50GB", 50 * 10**9), ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("10KiB", 10240),
     ("1GiB", 2**30), ("8Mb", 10**6), (1234, 1234), ("77", 77)],
)  # fmt: skip
def test_sizes_read_as_transformers_reads_them(size, expected):
    assert parse_size(size) == expected
    if isinstance(size, str) and size[-1].isalpha():
        assert transformers.utils.hub.convert_file_size_to_int(size) == expected


@pytest.mark.parametrize("size", ["5 G", "GB", "-1KB", 0, "1.5GB"])
def test_bad_sizes_are_refused(size):
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size(size)


def test_outputs_are_replaced_only_with_force_and_only_hf_directories(dirs, tmp_path):
    src = dirs["gpt2", "one"]
    dst = bridge.save_hf(tmp_path / "out", src)
    with pytest.raises(FileExistsError, match="--force"):
        bridge.save_hf(dst, src)
    bridge.save_hf(dst, src, force=True, max_shard_size="3KB")
    assert (dst / "model.safetensors.index.json").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a Hugging Face model directory"):
        bridge.save_hf(other, src, force=True)
    assert (other / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="is the input"):
        bridge.save_hf(src, src, force=True)
    with bridge.HFDirectory(src) as source, pytest.raises(ValueError, match="is the input"):
        bridge.save_hf(src, source, force=True)
    with pytest.raises(ValueError, match="needs a config.json"):
        bridge.save_hf(tmp_path / "none", {"w": torch.zeros(2)})
    assert not (tmp_path / "none").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


# -- bad input ----------------------------------------------------------------------


def broken(dirs, tmp_path, how: str) -> tuple[Path, str]:
    """A copy of the sharded GPT-2 directory, broken ``how``; the path to open and
    the message expected."""
    import shutil

    flavour = "bin" if how == "bin shard alone" else "sharded"
    path = tmp_path / "broken"
    shutil.copytree(dirs["gpt2", flavour], path)
    index = path / (
        "pytorch_model.bin.index.json" if flavour == "bin" else "model.safetensors.index.json"
    )
    data = json.loads(index.read_text())
    first = sorted(set(data["weight_map"].values()))[0]
    if how in ("shard alone", "bin shard alone"):
        return path / first, "one shard of the .* Open the directory"
    if how == "shard without its index":
        index.unlink()
        return path / first, "named as shard 1 of .* no index"
    if how == "missing shard":
        (path / first).unlink()
        return path, f"lists shard.*{first}.*does not hold"
    if how == "corrupt index":
        index.write_text(index.read_text()[:-20])
        return path, "the Hugging Face index is not JSON"
    if how == "tensor not in its shard":
        data["weight_map"]["transformer.ghost.weight"] = first
        index.write_text(json.dumps(data))
        return path, "lists 'transformer.ghost.weight' in .* but no shard holds it"
    del data["weight_map"]["transformer.wte.weight"]
    index.write_text(json.dumps(data))
    return path, r"holds \['transformer.wte.weight'\], which .* does not list"


BAD = (
    "shard alone",
    "shard without its index",
    "bin shard alone",
    "missing shard",
    "corrupt index",
    "tensor not in its shard",
    "unlisted tensor",
)


@pytest.mark.parametrize("how", BAD)
def test_bad_directories_get_one_line(dirs, tmp_path, how):
    path, message = broken(dirs, tmp_path, how)
    before = tree_hash(path.parent)
    with pytest.raises(ValueError, match=message) as e:
        bridge.open_source(path)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=message):
        bridge.save_hf(tmp_path / "out", path)
    assert not (tmp_path / "out").exists()
    assert tree_hash(path.parent) == before
