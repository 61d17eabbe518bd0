"""PyTorch DCP folders end to end, through the command and ``bridge``.

The committed fixtures (``tests/data/dcp``) convert bit for bit to what
``dcp_to_torch_save`` gives; a tied transformers Llama saved by ``dcp.save`` (the tie
stored twice) becomes an item with the head an alias (``--config`` or ``--tie``) and
comes back through a Hugging Face directory tied, with the same logits; a DCP folder
jaxshare writes loads strictly with stock ``dcp.load``, the tie stored once; two
``jax.distributed`` processes read the 2-rank fixture in a sharding of their own, each
only the chunks its shards overlap; bad inputs are one line, exit 1, inputs untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from jaxshare import checkpoint
from jaxshare.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"
#: A tiny Llama whose embedding (128 KiB) dwarfs a record's header (about 1.5 KiB).
LLAMA = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=True,
)  # fmt: skip
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
FLAX_EMBED, FLAX_HEAD = "params/model/embed_tokens/embedding", "params/lm_head/kernel"
#: What a record may add to its tensor's bytes (DCP's records are torch.save archives).
HEADER = 4096


def convert(*argv: object) -> tuple[int, str]:
    """``jaxshare convert --quiet ARGV`` in-process: (exit status, stderr); every warning
    shown (the command prints each as one line)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")
        status = main(["convert", "--quiet", *map(str, argv)])
    return status, err.getvalue()


def raw(t: torch.Tensor) -> bytes:
    """A tensor's bytes, in C order (bfloat16 and 0-d included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def files_of(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def distcp_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.distcp"))


def records(folder: Path) -> dict[str, list]:
    """``{fqn: [_StorageInfo, ...]}`` of a DCP folder, as torch's own reader sees it."""
    out: dict[str, list] = {}
    for key, info in FileSystemReader(folder).read_metadata().storage_data.items():
        out.setdefault(key.fqn, []).append(info)
    return out


@contextlib.contextmanager
def no_process_group():
    """DCP without a process group warns that it runs in one process; that is the point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


# -- 1. the fixtures, bit for bit ------------------------------------------------------


@pytest.mark.parametrize("name", ["flat", "sharded"])
def test_each_fixture_converts_to_what_dcp_to_torch_save_gives_bit_for_bit(name, tmp_path):
    src, out = DATA / name, tmp_path / "out.safetensors"
    before = files_of(src)
    status, err = convert(src, out)
    assert status == 0, err
    want = torch.load(DATA / f"{name}.pt", weights_only=True)
    if name == "sharded":  # A training checkpoint: its model part, and one line on the rest.
        assert set(want) == {"model", "optimizer", "train_state"}
        want = want["model"]
        assert err == (
            f"jaxshare convert: warning: {src}: also holds: optimizer (21 tensors, 12 other "
            "items), train_state (1 other item)\n"
        )
    else:
        assert err == ""
    got = load_file(out)
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert (got[n].dtype, got[n].shape) == (t.dtype, t.shape), n
        assert raw(got[n]) == raw(t), n
    assert {t.dtype for t in want.values()} == {torch.float32, torch.bfloat16, torch.int64}
    assert any(t.dim() == 0 for t in want.values())
    assert files_of(src) == before


# -- 2. a tied Llama saved by dcp.save, through an item and back -----------------------


@dataclass(frozen=True)
class Tied:
    model: transformers.LlamaForCausalLM
    dcp: Path  # dcp.save of its state dict: the tie stored twice
    config: Path  # its config.json, `architectures` included (as save_pretrained writes it)
    bare_config: Path  # config.to_json_file of a model built from a config: no `architectures`
    hf: Path  # save_pretrained


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> Tied:
    root = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with no_process_group():
        dcp.save(model.state_dict(), checkpoint_id=root / "dcp", no_dist=True)
    model.config.to_json_file(root / "bare_config.json")
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.to_json_file(root / "config.json")
    model.save_pretrained(root / "hf")
    return Tied(model, root / "dcp", root / "config.json", root / "bare_config.json", root / "hf")


IDS = torch.tensor([[1, 7, 42, 511, 3, 99, 0, 256], [5, 5, 300, 12, 8, 64, 128, 2]])


def restored(item: Path) -> dict[str, np.ndarray]:
    tree = ocp.StandardCheckpointer().restore(item.absolute())
    flat = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}/")
            else:
                flat[f"{prefix}{k}"] = np.asarray(v)

    walk(tree, "")
    return flat


def test_a_tied_llama_saved_by_dcp_comes_back_tied_through_an_item(tied, tmp_path):
    state = tied.model.state_dict()
    emb = state[EMBED]
    # DCP stores the tie twice: a record of its own for each name, each all its bytes.
    data = (tied.dcp / "__0_0.distcp").read_bytes()
    assert data.count(raw(emb)) == 2
    found = records(tied.dcp)
    assert found[HEAD][0].offset != found[EMBED][0].offset
    lengths = sum(r.length for rs in found.values() for r in rs)
    assert lengths >= sum(t.nbytes for t in state.values())  # (the embedding twice)

    item, hf = tmp_path / "item", tmp_path / "hf"
    before = files_of(tied.dcp)
    assert convert(tied.dcp, item, "--config", tied.config) == (0, "")
    source = checkpoint.open_source(item)
    assert dict(source.ties.items()) == {FLAX_HEAD: FLAX_EMBED}
    assert source.ties.transform(FLAX_HEAD) == (1, 0)
    assert source.assets["config.json"].read_bytes() == tied.config.read_bytes()
    leaves = restored(item)  # The head is an alias: stored once, as the embedding.
    assert FLAX_HEAD not in leaves and len(leaves) == len(state) - 1
    assert leaves[FLAX_EMBED].tobytes() == raw(emb)
    assert sum(a.nbytes for a in leaves.values()) == sum(
        t.nbytes for n, t in state.items() if n != HEAD
    )

    assert convert(item, hf, "--format", "hf") == (0, "")  # config.json: the item's asset
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(hf, output_loading_info=True)
    assert not {k: v for k, v in info.items() if v}, info
    loaded.eval()
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # One Parameter.
    with torch.no_grad():
        got, want = loaded(IDS).logits, tied.model(IDS).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert files_of(tied.dcp) == before

    # --tie instead of --config: the same item (but the asset, which --tie has none of).
    by_tie = tmp_path / "by_tie"
    assert convert(tied.dcp, by_tie, "--tie", f"{HEAD}={EMBED}") == (0, "")
    other = checkpoint.open_source(by_tie)
    assert dict(other.ties.items()) == dict(source.ties.items())
    assert other.ties.transforms == source.ties.transforms
    assert other.ties.naming == source.ties.naming
    assert other.infos == source.infos and "config.json" not in other.assets
    again = restored(by_tie)
    assert sorted(again) == sorted(leaves)
    assert all(
        again[p].dtype == a.dtype and again[p].tobytes() == a.tobytes() for p, a in leaves.items()
    )


def test_a_config_without_architectures_still_ties_the_head(tied, tmp_path):
    """``config.to_json_file`` of a model built from a config names no class: the
    stored ``lm_head.weight`` says it is the causal LM, whose tie is declared."""
    item = tmp_path / "item"
    assert convert(tied.dcp, item, "--config", tied.bare_config) == (0, "")
    assert dict(checkpoint.open_source(item).ties.items()) == {FLAX_HEAD: FLAX_EMBED}


def test_a_config_that_declares_no_tie_is_kept_among_the_items_assets(tied, tmp_path):
    untied = {**json.loads(tied.config.read_text()), "tie_word_embeddings": False}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(untied))
    item = tmp_path / "item"
    assert convert(tied.dcp, item, "--config", config) == (0, "")
    assert "config.json" in checkpoint.open_source(item).assets


def test_a_dcp_folder_with_config_becomes_a_hugging_face_directory_tied(tied, tmp_path):
    """``--config`` both declares the DCP folder's ties and is the output's config."""
    hf = tmp_path / "hf"
    assert convert(tied.dcp, hf, "--format", "hf", "--config", tied.config) == (0, "")
    assert json.loads((hf / "config.json").read_text()) == json.loads(tied.config.read_text())
    assert HEAD not in load_file(hf / "model.safetensors")  # (The tie stored once.)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, tied.model(IDS).logits, atol=1e-5, rtol=0)


# -- 3. jaxshare's DCP folder, read by stock dcp.load ----------------------------------


def test_a_dcp_folder_jaxshare_writes_loads_strictly_with_stock_dcp_load(tied, tmp_path):
    out = tmp_path / "dcp"
    assert convert(tied.hf, out, "--format", "dcp") == (0, "")
    want = tied.model.state_dict()
    torch.manual_seed(1)
    fresh = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    state = fresh.state_dict()
    assert sorted(state) == sorted(want) and not torch.equal(state[EMBED], want[EMBED])
    with no_process_group():
        dcp.load(state, checkpoint_id=out, no_dist=True)
    result = fresh.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    after = fresh.state_dict()
    for n, t in want.items():
        assert (after[n].dtype, after[n].shape) == (t.dtype, t.shape) and raw(after[n]) == raw(t), n
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    # The tie is stored once: both names point at one record, and the files hold the
    # unique bytes and a header per record; dcp.save's hold the embedding once more.
    found = records(out)
    assert found[HEAD] == found[EMBED] and len(found[EMBED]) == 1
    unique = sum(t.nbytes for n, t in want.items() if n != HEAD)
    written, stock = distcp_bytes(out), distcp_bytes(tied.dcp)
    assert unique <= written <= unique + HEADER * (len(want) - 1), (written, unique)
    emb = want[EMBED].nbytes
    assert emb <= stock - written <= emb + HEADER * len(want), (stock, written, emb)
    assert json.loads((out / "jaxshare_alias_map.json").read_text())["aliases"] == {HEAD: EMBED}


# -- 4. two processes, a sharding of their own -----------------------------------------


@pytest.mark.subprocess
def test_two_processes_read_the_two_rank_folder_each_only_the_chunks_it_needs(
    tmp_path, run_processes
):
    folder = DATA / "sharded"
    model = torch.load(DATA / "sharded.pt", weights_only=True)["model"]
    expected = tmp_path / "expected.npz"
    np.savez(
        expected,
        **{
            n: (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
            for n, t in model.items()
        },
    )
    # Each tensor's chunks, as torch's reader sees them: (offsets, sizes, file).
    metadata = FileSystemReader(folder).read_metadata()
    where = {
        (k.fqn, tuple(k.offset)): v.relative_path
        for k, v in metadata.storage_data.items()
        if k.offset is not None  # (not an item that is no tensor)
    }
    chunks = {
        fqn.removeprefix("model."): [
            (tuple(c.offsets), tuple(c.sizes), where[fqn, tuple(c.offsets)])
            for c in item.chunks
            if math.prod(c.sizes)
        ]
        for fqn, item in metadata.state_dict_metadata.items()
        if fqn.startswith("model.") and hasattr(item, "chunks")
    }
    assert sorted(chunks) == sorted(model)
    whole = sum(t.nbytes for t in model.values())

    def used(name: str, box: list) -> list:
        """The chunks a read of ``box`` of ``name`` overlaps."""
        return [
            (offsets, sizes, file)
            for offsets, sizes, file in chunks[name]
            if all(
                lo < o + n and o < hi for (lo, hi), o, n in zip(box, offsets, sizes, strict=True)
            )
        ]

    results = []
    for status, output in run_processes(
        Path(__file__).with_name("_dcp_worker.py"), folder, expected
    ):
        assert status == 0, output[-3000:]
        results.append(json.loads(output.strip().splitlines()[-1]))
    shards: dict[str, list] = {}
    for p, result in enumerate(results):
        assert "crash" not in result, result.get("crash")
        assert result["process_index"] == p and result["rows_by_process"] == [[0], [1]]
        assert all(result["values_equal"].values()), result["values_equal"]
        assert not result["torch_imported"] and result["aliases"] == 0
        files: dict[str, set] = {}
        counted = 0
        for _method, name, box in result["reads"]:
            hit = used(name, box)
            files.setdefault(name, set()).update(f for _, _, f in hit)
            counted += sum(math.prod(s) * model[name].element_size() for _, s, _ in hit)
        assert sorted(n for _, n, _ in result["reads"]) == sorted(model)  # Each once.
        # bytes_read: the chunks each read overlaps, whole, and no others.
        assert result["bytes_read"] == counted, (result["bytes_read"], counted)
        assert result["bytes_read"] < whole
        # proj.weight's kernel columns and ln.weight lie in this process's rank's chunk only;
        # the other leaves are assembled from both ranks' chunks (calibration and
        # rope_cache live in rank 1's file alone).
        mine = {f"__{p}_0.distcp"}
        assert files["proj.weight"] == mine and files["ln.weight"] == mine
        both = {"__0_0.distcp", "__1_0.distcp"}
        for name in ("wte.weight", "fc.weight", "lm_head.weight", "probe.colwise"):
            assert files[name] == both, name
        assert files["calibration"] == files["rope_cache"] == {"__1_0.distcp"}
        for path, boxes in result["shards"].items():
            shards.setdefault(path, []).extend(boxes)
        proj = [used(name, box) for _, name, box in result["reads"] if name == "proj.weight"]
        assert [[s for _, s, _ in hit] for hit in proj] == [[(3, 7)]]  # Half of it, once.
    # Together the shards cover every element of every leaf (each checked where it lies).
    shapes = results[0]["shapes"]
    for path, boxes in shards.items():
        covered = np.zeros(shapes[path], bool)
        for box in boxes:
            covered[tuple(slice(lo, hi) for lo, hi in box)] = True
        assert covered.all(), path
    print(
        "bytes_read per process:",
        [r["bytes_read"] for r in results],
        f"of {whole} for every tensor whole",
    )


# -- 5. bad inputs: one line, exit 1, inputs untouched ----------------------------------


def truncated(folder: Path, marker: Path) -> tuple[list[str], list[str]]:
    data = folder / "__0_0.distcp"
    end = max(r.offset + r.length for rs in records(folder).values() for r in rs)
    with open(data, "r+b") as f:
        f.truncate(10_000)
    return [], [f"{data}: truncated: expected at least {end} bytes", "found 10000."]


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile(folder: Path, marker: Path) -> tuple[list[str], list[str]]:
    evil = pickle.dumps(_Payload(marker))
    (folder / ".metadata").write_bytes(evil)
    decoy = marker.with_name("decoy")  # The payload is live: plain pickle runs it.
    pickle.loads(pickle.dumps(_Payload(decoy)))
    assert decoy.is_file()
    decoy.unlink()
    return [], [f"{folder / '.metadata'}: refused: not DCP metadata: it names posix.system"]


def differing_tie(folder: Path, marker: Path) -> tuple[list[str], list[str]]:
    return (
        ["--tie", "ln.weight=ln.bias"],
        [
            f"{folder}: --tie ties 'ln.weight' to 'ln.bias', but their values differ "
            "(max |Δ| = 1); they are not one tensor, so the tie is refused."
        ],
    )


@pytest.mark.parametrize("damage", [truncated, hostile, differing_tie], ids=lambda f: f.__name__)
def test_bad_inputs_are_one_line_exit_1_and_leave_the_input_as_it_was(damage, tmp_path):
    src, marker = tmp_path / "flat", tmp_path / "marker"
    shutil.copytree(DATA / "flat", src)
    argv, says = damage(src, marker)
    before = files_of(src)
    out = tmp_path / "out.safetensors"
    status, err = convert(src, out, *argv)
    assert status == 1
    assert err.startswith("jaxshare convert: error: ") and err.count("\n") == 1, err
    assert all(part in err for part in says), err
    assert files_of(src) == before
    assert not marker.exists()  # The hostile payload never ran.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flat"]  # Nothing left behind.
