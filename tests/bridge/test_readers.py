"""The registry of readers: every kind of input, what each records, and every command
seeing it alike.

For each reader, an input of its kind that records a tie -- in its own way: an alias
map, ``save_model``'s metadata, one storage, DeepSpeed's ``shared_params``, a
config's tie -- is read by the five commands, and all five agree on the tie:
``inspect`` lists it, ``check`` holds it, ``convert`` stores it once (an alias of the
item it writes), ``to_flax`` returns it as an alias, and ``verify`` finds the input and
the item equal, tie for tie. None finds a tie the input does not record (a Flax file
records none); where every command keeps the input's names (a Flax tree's), ``inspect``,
``convert`` and ``to_flax`` each hold every tensor it stores, and no other. The
registry, the architecture page's table of readers and the opener's one error list the
same readers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import bridge
from bridge.sources.registry import READERS, expected, find_reader, open_training, reader_of
from jaxshare import AliasMap, checkpoint
from jaxshare.formats import write_dcp
from jaxshare.internal import UsageError
from jaxshare.stream import Plan

ROOT = Path(__file__).resolve().parents[2]
DEEPSPEED = ROOT / "tests" / "data" / "deepspeed" / "gpt2_z2_w2_bf16"


#: What a builder of an input returns: its path, the ties it records (in its own names),
#: and ``{path: value}`` of every tensor it stores where every command keeps its names
#: (``None`` where they become others: PyTorch names made Flax paths).
Input = tuple[Path, dict[str, str], dict[str, np.ndarray] | None]


def _tied_module() -> torch.nn.Module:
    """A small model whose head is its embedding, as GPT-2's is."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "wte": torch.nn.Embedding(12, 4),
            "fc": torch.nn.Linear(4, 4),
            "lm_head": torch.nn.Linear(4, 12),
        }
    )
    model["lm_head"].weight = model["wte"].weight
    return model


def _safetensors(tmp: Path) -> Input:
    """``safetensors.torch.save_model``: the dropped duplicate in the metadata."""
    from safetensors.torch import save_model

    save_model(_tied_module(), tmp / "model.safetensors")
    return tmp / "model.safetensors", {"wte.weight": "lm_head.weight"}, None


def _torch(tmp: Path) -> Input:
    """``torch.save`` of a state dict: the tie is one storage."""
    torch.save(_tied_module().state_dict(), tmp / "model.pt")
    return tmp / "model.pt", {"lm_head.weight": "wte.weight"}, None


def _msgpack(tmp: Path) -> Input:
    """A Flax ``.msgpack`` file: a Flax model's own params, which record no tie."""
    from flax.serialization import to_bytes

    emb, bias = np.arange(48, dtype=np.float32).reshape(12, 4), np.linspace(0, 1, 4)
    params = {"wte": {"embedding": emb}, "fc": {"bias": bias}}
    (tmp / "flax_model.msgpack").write_bytes(to_bytes({"params": params}))
    return tmp / "flax_model.msgpack", {}, {"params/wte/embedding": emb, "params/fc/bias": bias}


def _hf(tmp: Path) -> Input:
    """A Hugging Face directory ``save_pretrained`` wrote: the head left out, tied by
    its config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    config.bos_token_id = config.eos_token_id = 0
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp / "gpt2")
    return tmp / "gpt2", {"lm_head.weight": "transformer.wte.weight"}, None


def _deepspeed(tmp: Path) -> Input:
    """A DeepSpeed ZeRO-2 folder (written by DeepSpeed): its ``shared_params``."""
    return DEEPSPEED, {"lm_head.weight": "transformer.wte.weight"}, None


def _dcp(tmp: Path) -> Input:
    """A DCP folder jaxshare wrote: the tie stored once, its alias map beside it."""
    emb = np.arange(48, dtype=np.float32).reshape(12, 4)
    save_file({"wte.weight": emb, "fc.weight": np.ones((4, 4), np.float32)}, tmp / "w.safetensors",
              metadata={"lm_head.weight": "wte.weight"})  # fmt: skip
    with bridge.open_source(tmp / "w.safetensors") as source:
        write_dcp(tmp / "dcp", Plan.identity(source), source)
    return tmp / "dcp", {"lm_head.weight": "wte.weight"}, None


def _orbax(tmp: Path) -> Input:
    """An Orbax item jaxshare wrote: its alias map."""
    import jax.numpy as jnp

    emb = jnp.arange(48.0).reshape(12, 4)
    checkpoint.save(tmp / "ckpt", {"params": {"wte": {"embedding": emb}, "head": {"w": emb}}})
    return tmp / "ckpt", {"params/wte/embedding": "params/head/w"}, None


#: An input of each reader's kind (see :data:`Input`).
INPUTS: dict[str, Callable[[Path], Input]] = {
    "orbax": _orbax,
    "dcp": _dcp,
    "deepspeed": _deepspeed,
    "safetensors": _safetensors,
    "torch": _torch,
    "msgpack": _msgpack,
    "hf": _hf,
}


def _pairs(amap: AliasMap) -> set[frozenset[str]]:
    """The ties of ``amap`` as unordered pairs of source names (through its naming
    record, where the map is in other names)."""
    naming = amap.naming

    def name(path: str) -> str:
        return naming[path].torch if naming is not None and path in naming else path

    return {frozenset((name(a), name(c))) for a, c in amap.items()}


def test_every_reader_has_an_input_here():
    assert sorted(INPUTS) == sorted(r.name for r in READERS)


@pytest.mark.parametrize("name", list(INPUTS))
def test_the_five_commands_agree_on_the_ties_an_input_records(name, tmp_path, flat):
    path, ties, tensors = INPUTS[name](tmp_path)
    assert reader_of(path).name == name
    want = {frozenset(pair) for pair in ties.items()}

    report = bridge.inspect(path)
    assert _pairs(report.alias_map) == want, "inspect"

    checked = bridge.check(path)
    assert checked.ok, checked.lines()
    assert {frozenset((a, c)) for a, (c, _) in checked.ties.items()} == want, "check"

    item = bridge.convert(path, tmp_path / "item")
    stored = checkpoint.read_alias_map(item)
    assert _pairs(stored) == want, "convert"

    variables, flax_ties = bridge.to_flax(path)
    assert _pairs(flax_ties) == want, "to_flax"

    if tensors is not None:  # Every tensor the input stores, and no other, in each result.
        shapes = {key: (value.shape, value.dtype.name) for key, value in tensors.items()}
        assert {key: (i.shape, i.dtype) for key, i in report.arrays.items()} == shapes, "inspect"
        for command, tree in (("convert", checkpoint.restore(item)), ("to_flax", variables)):
            got = flat(tree)
            assert sorted(got) == sorted(tensors), command
            for key, value in tensors.items():
                assert np.asarray(got[key]).dtype == value.dtype, (command, key)
                np.testing.assert_array_equal(got[key], value, err_msg=f"{command}: {key}")

    verified = bridge.verify(path, item)
    assert verified.ok and not verified.notes, verified.lines()


def test_a_tie_a_file_stores_twice_is_recorded_but_not_applied(tmp_path):
    """A ``save_model`` entry whose dropped name the file stores after all: the tie is
    recorded (``check`` holds it against the values), never applied."""
    emb = np.arange(8, dtype=np.float32).reshape(4, 2)
    path = tmp_path / "m.safetensors"
    save_file({"wte.weight": emb, "lm_head.weight": emb + 1}, path,
              metadata={"lm_head.weight": "wte.weight"})  # fmt: skip
    with bridge.open_source(path) as source:
        assert dict(source.ties) == {}
        assert [(t.alias, t.canonical, t.origin) for t in source.recorded_ties] == [
            ("lm_head.weight", "wte.weight", "save_model metadata")
        ]
    assert bridge.inspect(path).alias_map == AliasMap()
    assert bridge.check(path).kinds == ["alias-differs"]


def test_the_registry_the_docs_and_the_error_list_the_same_readers():
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("## Readers and writers") :]
    documented = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section, flags=re.M)
    assert [(n, w.strip()) for n, w in documented] == [(r.name, r.what) for r in READERS]
    for reader in READERS:
        assert reader.what in expected()
    with pytest.raises(UsageError, match=re.escape(expected())):
        bridge.open_source(ROOT / "README.md")


def test_a_path_no_reader_accepts_is_none(tmp_path):
    (tmp_path / "notes.txt").write_text("not weights")
    assert find_reader(tmp_path / "notes.txt") is None
    assert find_reader(tmp_path / "missing") is None


@pytest.mark.parametrize("name", list(INPUTS))
def test_each_input_is_one_readers_and_its_sources_kind_is_the_readers_name(name, tmp_path):
    """No path is two readers' (so the order they are tried in decides nothing), and
    the source says the kind its reader is named for."""
    path = INPUTS[name](tmp_path)[0]
    assert [r.name for r in READERS if r.accepts(path)] == [name]
    with bridge.open_source(path) as source:
        assert source.kind == name


def test_a_dcp_folder_holding_an_orbax_item_is_dcps(tmp_path):
    """A DCP folder beside which a run keeps an item is still the DCP folder."""
    path = _dcp(tmp_path)[0]
    _orbax(path)  # (`path / "ckpt"`: an item in a subfolder.)
    assert [r.name for r in READERS if r.accepts(path)] == ["dcp"]
    assert bridge.inspect(path).kind == "dcp"


def test_a_path_that_holds_no_training_state_is_refused_in_one_line(tmp_path):
    path = _safetensors(tmp_path)[0]
    training = [r.what for r in READERS if r.open_training is not None]
    assert training == ["a PyTorch DCP directory", "a DeepSpeed directory",
                        "a PyTorch file (.pt, .bin, .pth)"]  # fmt: skip
    with pytest.raises(ValueError) as error:
        open_training(path)
    assert str(error.value) == (
        f"{path}: expected a training checkpoint -- {', '.join(training[:-1])} or "
        f"{training[-1]} holding a model's and an optimizer's state -- found a .safetensors file."
    )


@pytest.mark.subprocess
def test_asking_what_a_path_is_imports_no_readers_code(tmp_path):
    """The table's tests are file names alone; each reader's code is imported when a
    path of its kind is opened, so telling a ``.safetensors`` file costs no other's."""
    path = _safetensors(tmp_path)[0]
    code = (
        "import sys\n"
        "from bridge.sources.registry import find_reader, open_source\n"
        f"assert find_reader({str(path)!r}).name == 'safetensors'\n"
        f"open_source({str(path)!r}).close()\n"
        "readers = ['jaxshare.formats.optim', 'jaxshare.formats.dcp.reader',\n"
        "           'jaxshare.formats.deepspeed.checkpoint', 'jaxshare.checkpoint._source',\n"
        "           'bridge.hf.directory']\n"
        "assert not [m for m in readers if m in sys.modules], sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
