"""The ``transformers-flax`` layout is exactly the ``params`` of transformers 4.57's Flax
models, proved on a zoo of architectures.

The fixtures (``tests/data/transformers_flax/<id>/``, made by ``make_fixtures.py``
with transformers 4.57) hold each Flax model's params, their tree, inputs and
outputs; this test venv has transformers 5 and PyTorch only. Each route is checked
against them, read at test time:

- a transformers 5 directory placed in the layout gives exactly the Flax tree,
  with the heads the Flax port computes (GPT-2's ``lm_head``, BERT's decoder) as
  implicit aliases, by the library and through ``jaxshare convert`` into an Orbax item
  that plain Orbax, ``jaxshare.checkpoint.restore`` and ``consolidate`` read as that
  tree;
- the Flax params in a plain Orbax item convert to a directory transformers 5 loads
  with no missing or unexpected keys and the Flax model's outputs, holding exactly
  the names ``save_pretrained`` writes; under a linen ``params`` collection they do
  so with no ``--layout`` (the model class finds the layout), bit for bit, while
  jaxshare's own layout under ``params`` converts back as before;
- so does every other route that names a Flax tree in PyTorch (``check --config``,
  ``convert --names torch``, ``verify``, ``bridge.to_torch(tree, like=model)``,
  ``bridge.save_hf`` of a tree in memory), through the one detection
  (``flax_layout``): the same names, dtypes (bf16 included), bits and ties as the
  params as they are, and a law over any part of a model's params (hypothesis);
- directory -> item -> directory is bit exact;
- what a family's Flax port does otherwise (:data:`QUIRKS`) comes out as its one
  warning (a Llama head trained apart from a tied embedding is kept, the config
  untied), and a tree that fits no layout is one line naming the leaf.

A parameter registered twice under one parent (``self.b = self.a``) gets a Flax name
of its own and comes back as one tensor.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
from flax.traverse_util import flatten_dict
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_tensors
from torch import nn

import bridge
from bridge.naming.torch_naming import flax_layout
from jaxshare import checkpoint
from jaxshare.cli import main
from jaxshare.internal import nest

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "transformers_flax"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
IDS = sorted(MANIFEST)
TOLERANCE = 1e-5  # max |Δ| between transformers 5's outputs and the Flax model's


@dataclass(frozen=True)
class Quirk:
    """What a family's Flax port does otherwise than the plain rule, by PyTorch name.

    Attributes:
      computed: tensors the Flax port computes (no leaf): written back from their
        formula, equal to transformers 5's own.
      unused: tensors the PyTorch class has and does not use, the Flax port lacks:
        no leaf, and missing from the directory written back.
      extra: tensors the directory written from the Flax params holds that
        ``save_pretrained`` leaves out.
      untied: tensors transformers 5 ties in a new model but loads as tensors of
        their own from that directory, where their values differ.
      retied: Flax leaves of the fixture's tree that a transformers 5 directory's
        tree lacks, as transformers 5 writes its config tied whatever it was given
        (so that directory's Flax model computes them).
      to_flax_warns: what the one warning of directory -> layout says (none if empty).
      to_hf_warns: what the one warning of Flax params -> directory says.
      back_warns: what the one warning of layout item -> directory says.
    """

    computed: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    untied: tuple[str, ...] = ()
    retied: tuple[str, ...] = ()
    to_flax_warns: tuple[str, ...] = ()
    to_hf_warns: tuple[str, ...] = ()
    back_warns: tuple[str, ...] = ()


POOLER = ("bert.pooler.weight", "bert.pooler.bias")
QUIRKS = {
    # Sinusoidal positions: Flax Pegasus computes them.
    "pegasus": Quirk(
        computed=("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
    ),
    # BigBirdForMaskedLM's pooler is unused; FlaxBigBirdForMaskedLM has none.
    "big_bird": Quirk(unused=POOLER, to_flax_warns=POOLER, to_hf_warns=POOLER, back_warns=POOLER),
    # Flax Llama holds its head as a leaf even when tied: here the embedding's bits,
    # transposed (as `from_pt=True` makes it), so the tie stays as it is, no line.
    # transformers 5 ties mT5's head whatever config.json says, but for a file that
    # holds both with values of their own: Flax mT5's own head.
    "mt5": Quirk(
        extra=("lm_head.weight",),
        untied=("lm_head.weight",),
        retied=("lm_head/kernel",),
        to_hf_warns=("tie_word_embeddings: false",),
    ),
}

#: The heads the Flax ports compute from another leaf, spelled out for a few models.
IMPLICIT_TIES = {
    "gpt2": {"lm_head/kernel": "transformer/wte/embedding"},
    "bart": {
        "lm_head/kernel": "model/shared/embedding",
        "model/encoder/embed_tokens/embedding": "model/shared/embedding",
        "model/decoder/embed_tokens/embedding": "model/shared/embedding",
    },
    "bert": {
        "cls/predictions/decoder/kernel": "bert/embeddings/word_embeddings/embedding",
        "cls/predictions/decoder/bias": "cls/predictions/bias",
    },
}


@dataclass(frozen=True)
class Built:
    """A transformers 5 model of a fixture's config and its ``save_pretrained`` directory."""

    model: nn.Module
    directory: Path


def quirk(name: str) -> Quirk:
    return QUIRKS.get(name, Quirk())


def flax_tree(name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The fixture's Flax params tree: ``{path: (shape, dtype)}``."""
    paths = json.loads((FIXTURES / name / "tree.json").read_text())["paths"]
    return {path: (tuple(shape), dtype) for path, shape, dtype in paths}


def directory_tree(name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The Flax params tree of the transformers 5 directory of fixture ``name``."""
    return {p: leaf for p, leaf in flax_tree(name).items() if p not in quirk(name).retied}


def shapes(leaves: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    return {path: (tuple(leaf.shape), str(leaf.dtype)) for path, leaf in leaves.items()}


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory's safetensors files, by name."""
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_tensors(file))
    return out


def save_plain(params: dict[str, np.ndarray], item: Path) -> Path:
    """``'/'``-joined params as a plain Orbax item: no naming record, no alias map."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(item.absolute(), nest(params))
    return item


def convert(*argv: object) -> tuple[int, list[str]]:
    """``jaxshare convert --quiet *argv``: its exit status and stderr lines, every
    warning shown (the command writes each as one line)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")
        status = main(["convert", "--quiet", *map(str, argv)])
    return status, err.getvalue().splitlines()


@contextlib.contextmanager
def recorded() -> Iterator[list[str]]:
    """The messages of the warnings raised inside, every one a ``UserWarning``."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    assert all(issubclass(w.category, UserWarning) for w in caught), caught
    messages.extend(str(w.message) for w in caught)


def assert_warned(messages: list[str], says: tuple[str, ...], prefix: str = "") -> None:
    """One warning, saying each of ``says``, when there is anything to say; else none."""
    if not says:
        assert messages == []
        return
    assert len(messages) == 1, f"expected one warning saying {says}; got {messages}"
    (message,) = messages
    assert message.startswith(prefix), message
    for part in says:
        assert part in message, (part, message)


def shown(lines: list[str], says: tuple[str, ...]) -> None:
    assert_warned(lines, says, prefix="jaxshare convert: warning: ")


def tie_groups(model: nn.Module) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for alias, canonical in bridge.shared_params(model).items():
        groups.setdefault(canonical, {canonical}).add(alias)
    return {frozenset(group) for group in groups.values()}


def outputs(model: nn.Module, name: str) -> dict[str, np.ndarray]:
    """The model's outputs the manifest names, on the fixture's inputs."""
    inputs = {
        k: torch.from_numpy(v).long() if v.dtype.kind == "i" else torch.from_numpy(v)
        for k, v in load_file(FIXTURES / name / "inputs.safetensors").items()
    }
    assert sorted(inputs) == sorted(MANIFEST[name]["inputs"])
    with torch.no_grad():
        out = model(**inputs)
    return {key: getattr(out, key).numpy() for key in MANIFEST[name]["outputs"]}


@pytest.fixture(scope="session")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """``hf(name)``: the transformers 5 model of fixture ``name``'s config (seed 0),
    built and saved once per session."""
    root = tmp_path_factory.mktemp("hf")

    @functools.cache
    def build(name: str) -> Built:
        torch.manual_seed(0)
        config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
        model = getattr(transformers, MANIFEST[name]["torch_class"])(config).eval()
        model.save_pretrained(root / name)
        return Built(model, root / name)

    return build


@pytest.fixture(scope="session")
def item(hf, tmp_path_factory) -> Callable[[str], tuple[Path, list[str]]]:
    """``item(name)``: ``jaxshare convert HF_DIR ITEM --layout transformers-flax``, run
    once per session; the item and the command's stderr lines."""
    root = tmp_path_factory.mktemp("item")

    @functools.cache
    def make(name: str) -> tuple[Path, list[str]]:
        status, err = convert(hf(name).directory, root / name, "--layout", "transformers-flax")
        assert status == 0, err
        return root / name, err

    return make


# -- transformers 5 directory -> the Flax params tree ---------------------------------


@pytest.mark.parametrize("name", IDS)
def test_directory_to_layout_is_the_flax_tree(hf, flat, name):
    built = hf(name)
    with recorded() as messages:
        variables, aliases = bridge.to_flax(built.directory, layout="transformers-flax")
    assert_warned(messages, quirk(name).to_flax_warns)
    leaves = flat(variables)
    assert shapes(leaves) == directory_tree(name)
    assert not set(aliases) & set(leaves)  # An alias has no leaf...
    assert aliases.implicit == set(aliases)  # ...it is implicit: the model computes it...
    assert set(aliases.values()) <= set(leaves)  # ...from its canonical, which has.
    # Every tensor of the directory or tied to one is a leaf or an alias, but what
    # the Flax port lacks.
    ties = bridge.shared_params(built.model)
    torch_names = {naming.torch for naming in aliases.naming.values()}
    left_out = set(quirk(name).computed + quirk(name).unused)
    tied = set(ties) | set(ties.values())
    assert torch_names == (set(tensors(built.directory)) | tied) - left_out
    for alias, canonical in aliases.items():  # ...and each alias one of the model's ties.
        torch_alias, torch_canonical = aliases.naming[alias].torch, aliases.naming[canonical].torch
        assert ties.get(torch_alias, torch_alias) == ties.get(torch_canonical, torch_canonical)
    if name in IMPLICIT_TIES:
        assert dict(aliases) == IMPLICIT_TIES[name]


@pytest.mark.parametrize("name", IDS)
def test_the_commands_item_restores_in_plain_orbax_as_the_flax_tree(item, flat, name):
    path, err = item(name)
    shown(err, quirk(name).to_flax_warns)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(path.absolute())
    assert "params" not in restored  # The Flax model's own tree: no collection on top.
    assert shapes(flat(restored)) == directory_tree(name)


@pytest.mark.parametrize("name", IDS)
def test_an_implicit_tie_is_recorded_and_never_a_leaf_of_the_restored_tree(hf, item, flat, name):
    """The heads the Flax port computes (GPT-2's ``lm_head``, BERT's decoder) are in the
    item's alias map and naming record, marked implicit: ``restore``, ``consolidate``
    and ``to_flax`` of the item give exactly the Flax model's ``params`` tree (as
    transformers 4.57 recorded it), and the way out to PyTorch names re-creates them."""
    path, _ = item(name)
    want = directory_tree(name)
    stored = checkpoint.read_alias_map(path)
    assert stored.implicit == set(stored)  # The port computes every tie it has.
    assert stored.naming is not None and stored.naming.implicit == set(stored)
    if name in IMPLICIT_TIES:
        assert dict(stored) == IMPLICIT_TIES[name]
    restored = checkpoint.restore(path)
    assert shapes(flat(restored)) == want
    assert shapes(checkpoint.consolidate(path)) == want
    variables, aliases = bridge.to_flax(path)
    assert shapes(flat(variables)) == want and aliases.implicit == stored.implicit
    # In PyTorch names every alias is there again: the PyTorch model's own tensor.
    state, model = bridge.to_torch(restored, stored), hf(name).model.state_dict()
    for alias in stored:
        name_of = stored.naming[alias].torch
        assert torch.equal(state[name_of], model[name_of]), name_of


# -- Flax params under a linen `params` collection: the layout is found ----------------


def _linen(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{"params": params}``, as a linen training loop saves a Flax model's params."""
    return {f"params/{path}": value for path, value in params.items()}


def _same_lines(lines: list[str], out: Path, other: list[str], other_out: Path) -> None:
    assert [x.replace(str(out), "OUT") for x in lines] == [
        x.replace(str(other_out), "OUT") for x in other
    ]


@pytest.mark.parametrize("name", IDS)
def test_flax_params_under_a_linen_collection_convert_with_no_layout(name, tmp_path):
    """``{"params": params}`` of a Flax model with its ``config.json`` is found in the
    transformers-flax layout (the config's model class fits that layout's names and
    shapes): no ``--layout``, bit for bit what ``--layout transformers-flax`` writes."""
    fixture = FIXTURES / name
    linen = save_plain(_linen(load_file(fixture / "params.safetensors")), tmp_path / "linen")
    config = fixture / "config.json"
    found, given = tmp_path / "found", tmp_path / "given"
    status, err = convert(linen, found, "--format", "hf", "--config", config)
    assert status == 0, err
    shown(err, quirk(name).to_hf_warns)
    explicit = ("--layout", "transformers-flax")
    status, err_given = convert(linen, given, "--format", "hf", "--config", config, *explicit)
    assert status == 0, err_given
    _same_lines(err, found, err_given, given)
    want, got = tensors(given), tensors(found)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    assert (found / "config.json").read_bytes() == (given / "config.json").read_bytes()


def test_flax_params_under_a_linen_collection_in_a_msgpack_file(hf, tmp_path):
    """The same from a Flax msgpack file (``flax.serialization.to_bytes``), the model's
    outputs included."""
    from flax import serialization

    params = nest(_linen(load_file(FIXTURES / "gpt2" / "params.safetensors")))
    weights = tmp_path / "gpt2.msgpack"
    weights.write_bytes(serialization.to_bytes(params))
    out = tmp_path / "hf"
    status, err = convert(weights, out, "--format", "hf", "--config", FIXTURES / "gpt2")
    assert (status, err) == (0, [])
    loaded, info = type(hf("gpt2").model).from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    want = load_file(FIXTURES / "gpt2" / "logits.safetensors")["logits"]
    assert float(np.abs(outputs(loaded.eval(), "gpt2")["logits"] - want).max()) <= TOLERANCE


@pytest.mark.parametrize("name", IDS)
def test_jaxshare_s_own_layout_under_params_converts_as_before(hf, name, tmp_path):
    """jaxshare's own layout starts with ``params/`` too: the same tree for most models
    (GPT-2's ``Conv1D`` kernels are the other way round). A plain item of it (no naming
    record) converts back to the directory it came from, bit for bit."""
    built = hf(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (What a port lacks: tested above.)
        variables, _ = bridge.to_flax(built.directory)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save((tmp_path / "item").absolute(), variables)
    out = tmp_path / "hf"
    status, err = convert(tmp_path / "item", out, "--format", "hf", "--config", built.directory)
    assert status == 0, err
    want, got = tensors(built.directory), tensors(out)
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


# -- every route that names a Flax tree in PyTorch finds the layout under `params` ------

#: GPT-2 and BERT, and Whisper with a head of its own (``tie_word_embeddings: false``),
#: which the transformers-flax layout names ``proj_out.weight`` (Flax Whisper's
#: ``lm_head``) where jaxshare's rules, taking the tree for jaxshare's, name it
#: ``lm_head.weight``: on that model a route that misses the layout gives other names.
LINEN_MODELS = ["gpt2", "bert", "whisper_head"]
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _fixture(name: str) -> tuple[dict[str, np.ndarray], dict]:
    """The Flax params (``'/'`` paths) of model ``name`` and its ``config.json``."""
    base = name.removesuffix("_head")
    params = load_file(FIXTURES / base / "params.safetensors")
    config = json.loads((FIXTURES / base / "config.json").read_text())
    if name == "whisper_head":  # A head trained apart from the embedding.
        embedding = params["model/decoder/embed_tokens/embedding"]
        head = np.random.default_rng(0).standard_normal(embedding.T.shape)
        params["lm_head/kernel"] = head.astype(embedding.dtype)
        config["tie_word_embeddings"] = False
    return params, config


def _tree(name: str, dtype: str, container: str) -> dict[str, np.ndarray]:
    """The params of ``name`` in ``dtype``, as they are (``plain``) or under a linen
    ``params`` collection (``linen``)."""
    params = {p: v.astype(DTYPES[dtype]) for p, v in _fixture(name)[0].items()}
    return _linen(params) if container == "linen" else params


def _item(params: dict[str, np.ndarray], path: Path, config: dict | None = None) -> Path:
    """``params`` as an Orbax item with no naming record, ``config`` kept with it."""
    assets = None if config is None else {"config.json": json.dumps(config).encode()}
    checkpoint.save(path, nest(params), assets=assets)
    assert checkpoint.read_alias_map(path).naming is None
    return path


@functools.cache
def _torch_model(name: str) -> nn.Module:
    """The transformers 5 model of ``name``'s config (seed 0)."""
    config = _fixture(name)[1]
    torch.manual_seed(0)
    model_class = getattr(transformers, MANIFEST[name.removesuffix("_head")]["torch_class"])
    return model_class(transformers.AutoConfig.for_model(**config)).eval()


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """The same names, dtypes, shapes and bits, and the same ties (one tensor object)."""
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        bits = got[key].contiguous().view(torch.uint8)
        assert torch.equal(bits, value.contiguous().view(torch.uint8)), key
    assert _ties(got) == _ties(want)


def _ties(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """``{alias: canonical}`` of the names that are one tensor object."""
    first: dict[int, str] = {}
    return {k: first[id(v)] for k, v in state.items() if first.setdefault(id(v), k) != k}


def _detected(name: str, state: dict[str, torch.Tensor]) -> None:
    """The names say the transformers-flax layout named the tree."""
    if name == "whisper_head":
        assert "proj_out.weight" in state and "lm_head.weight" not in state
    if name == "gpt2":  # FlaxConv1D's kernel (out, in) is the Conv1D weight (in, out).
        assert state["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)


@pytest.mark.parametrize("config_from", ["--config", "item"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", LINEN_MODELS)
def test_a_linen_tree_converts_to_pytorch_names_as_the_flax_params_do(
    name, dtype, config_from, tmp_path
):
    """``jaxshare convert ITEM OUT --names torch``, with ``--config`` or the config the
    item keeps: the tree under a linen ``params`` collection is found in the
    transformers-flax layout, the same names and bits as the Flax params as they are."""
    config = _fixture(name)[1]
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    given = ("--config", config_file) if config_from == "--config" else ()
    out = {}
    for container in ("plain", "linen"):
        kept = config if config_from == "item" else None
        item = _item(_tree(name, dtype, container), tmp_path / container, kept)
        dst = tmp_path / f"{container}.safetensors"
        status, err = convert(item, dst, "--names", "torch", *given)
        assert (status, err) == (0, [])
        out[container] = bridge.load_safetensors(dst)
    _assert_same(out["linen"], out["plain"])
    _detected(name, out["linen"])
    assert {str(t.dtype) for t in out["linen"].values()} == {f"torch.{dtype}"}


def test_config_for_an_input_in_pytorch_names_is_one_line(hf, tmp_path, capsys):
    """``--config`` names a Flax input's tensors; an input in PyTorch names is refused."""
    config = FIXTURES / "gpt2" / "config.json"
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(hf("gpt2").directory), str(out), "--names", "torch",
                 "--config", str(config)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--config names a Flax input's tensors" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.subprocess
@pytest.mark.parametrize("name, builds", [("gpt2", False), ("bert", False), ("whisper_head", True)])
def test_the_model_class_is_built_only_where_the_layouts_name_a_tree_otherwise(
    name, builds, tmp_path
):
    """``convert --names torch`` of a tree under ``params/``: where jaxshare's rules and
    the transformers-flax layout give every leaf the same PyTorch name and axis order
    (GPT-2, BERT), the layout changes nothing and transformers is not imported; where
    they differ (Whisper's head), the config's model class is built to tell."""
    item = _item(_tree(name, "float32", "linen"), tmp_path / "item", _fixture(name)[1])
    code = (
        "import sys\nfrom jaxshare.cli import main\n"
        "status = main(['convert', '--quiet', sys.argv[1], sys.argv[2], '--names', 'torch'])\n"
        "print('transformers imported:', 'transformers' in sys.modules)\nsys.exit(status)\n"
    )
    out = tmp_path / "out.safetensors"
    done = subprocess.run(
        [sys.executable, "-c", code, str(item), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"transformers imported: {builds}"
    _detected(name, bridge.load_safetensors(out))


@pytest.mark.parametrize("name", LINEN_MODELS)
def test_check_holds_a_linen_tree_as_the_flax_params(name, tmp_path, capsys):
    """``jaxshare check ITEM --config``: the tree under a linen ``params`` collection is
    checked in the names of the Flax params as they are, with the same ties."""
    config = _fixture(name)[1]
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    reports = {}
    for container in ("plain", "linen"):
        item = _item(_tree(name, "float32", container), tmp_path / container)
        status = main(["check", "--json", str(item), "--config", str(config_file)])
        report = json.loads(capsys.readouterr().out)
        assert status == (0 if report["ok"] else 1)
        reports[container] = {k: v for k, v in report.items() if k != "source"}
    assert reports["linen"] == reports["plain"]
    assert reports["linen"]["ok"], reports["linen"]["findings"]
    ties = {t["alias"]: t["canonical"] for t in reports["linen"]["ties"]}
    want = {"gpt2": {"lm_head.weight": "transformer.wte.weight"},
            "bert": {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                     "cls.predictions.decoder.bias": "cls.predictions.bias"},
            "whisper_head": {}}  # fmt: skip
    assert ties == want[name]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", LINEN_MODELS)
def test_to_torch_names_a_linen_tree_after_the_model_as_the_flax_params(name, dtype):
    """``bridge.to_torch(tree, like=model)``: the layout is found by the model's
    config (a linen tree: and by its tensors), every tie the model makes one tensor."""
    model = _torch_model(name)
    plain = bridge.to_torch(nest(_tree(name, dtype, "plain")), like=model)
    linen = bridge.to_torch(nest(_tree(name, dtype, "linen")), like=model)
    _assert_same(linen, plain)
    _detected(name, linen)
    assert list(linen) == list(model.state_dict())
    for alias, canonical in bridge.shared_params(model).items():
        assert linen[alias] is linen[canonical], alias
    want = {"gpt2": {"lm_head.weight"}, "bert": {"cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias"}, "whisper_head": set()}  # fmt: skip
    assert set(_ties(linen)) == want[name]


@pytest.mark.parametrize("name", LINEN_MODELS)
def test_verify_finds_a_linen_tree_equal_to_its_directory(name, tmp_path):
    """``jaxshare verify ITEM DIR``, either way round: the tree under a linen ``params``
    collection is named as the Flax params are, every tensor of the directory equal."""
    params, config = _fixture(name)
    directory = tmp_path / "hf"
    bridge.save_hf(directory, nest(params), config=config)
    compared = {}
    for container in ("plain", "linen"):
        item = _item(_tree(name, "float32", container), tmp_path / container)
        there, back = bridge.verify(item, directory), bridge.verify(directory, item)
        assert there.ok and back.ok, (there.lines(), back.lines())
        assert there.naming == back.naming == "torch"
        compared[container] = (there.compared, back.compared)
    assert compared["linen"] == compared["plain"]


@pytest.mark.parametrize("name", LINEN_MODELS)
def test_save_hf_of_a_linen_tree_in_memory_is_the_flax_params_directory(name, tmp_path):
    """``bridge.save_hf(DIR, tree)`` of a tree in memory under a linen ``params``
    collection writes the directory the Flax params as they are write."""
    config = _fixture(name)[1]
    written = {}
    for container in ("plain", "linen"):
        out = tmp_path / container
        with recorded() as messages:
            bridge.save_hf(out, nest(_tree(name, "float32", container)), config=config)
        written[container] = (tensors(out), (out / "config.json").read_bytes(), messages)
    (linen, linen_config, linen_said), (plain, plain_config, plain_said) = written.values()
    _assert_same(linen, plain)
    _detected(name, linen)
    assert linen_config == plain_config and linen_said == plain_said


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(["gpt2", "bert"]),
    dtype=st.sampled_from(sorted(DTYPES)),
    keep=st.lists(st.booleans(), min_size=42, max_size=42),
)
def test_the_linen_wrapper_never_changes_the_pytorch_names(name, dtype, keep):
    """The law: for any part of a Flax model's params, wrapping it in a linen ``params``
    collection leaves every PyTorch name, axis order and dtype as they were."""
    from jaxshare.checkpoint import TreeSource

    config = _fixture(name)[1]
    plain = _tree(name, dtype, "plain")
    kept = [p for k, p in zip(keep, plain, strict=False) if k] or list(plain)[:1]
    part = {p: plain[p] for p in kept}

    def named(tree: dict) -> list[tuple]:
        plan = bridge.torch_plan(TreeSource(nest(tree)), config=config)
        return [(e.name, e.source.removeprefix("params/"), e.perm, e.info) for e in plan.entries]

    assert named(_linen(part)) == named(part)


def test_a_linen_tree_that_fits_no_layout_is_one_line_naming_the_leaf(tmp_path):
    """A tree under ``params/`` that fits neither layout (a GPT-2 kernel transposed)
    is one line naming the leaf as the transformers-flax layout names it, no output."""
    params = load_file(FIXTURES / "gpt2" / "params.safetensors")
    params[KERNEL] = params[KERNEL].T.copy()
    item, out = save_plain(_linen(params), tmp_path / "item"), tmp_path / "out"
    config = FIXTURES / "gpt2" / "config.json"
    status, err = convert(item, out, "--format", "hf", "--config", config)
    assert status == 1
    (line,) = err
    assert line.startswith(f"jaxshare convert: error: {out}: the Flax leaf 'params/{KERNEL}'")
    assert "fits no layout" in line and "holds it as (16, 48)" in line
    assert not out.exists()


@pytest.mark.parametrize("top", ["params", "params+batch_stats"])
def test_the_one_detection_tells_a_linen_tree_from_jaxshare_s_own(hf, top):
    """:func:`bridge.naming.torch_naming.flax_layout`, of a tree, a source and a
    ``Tied``: the Flax params under ``params/`` are transformers-flax; jaxshare's own
    GPT-2 tree (its ``Conv1D`` kernels ``(in, out)``), and a tree with another
    collection beside ``params``, are jaxshare's (``None``)."""
    from jaxshare import tie
    from jaxshare.checkpoint import TreeSource

    config = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    flax = _linen(load_file(FIXTURES / "gpt2" / "params.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        variables, _ = bridge.to_flax(hf("gpt2").directory)  # jaxshare's layout
    own = {"/".join(path): leaf for path, leaf in flatten_dict(variables).items()}
    assert any(own[path].shape != leaf.shape for path, leaf in flax.items())  # Conv1D's
    if top == "params+batch_stats":
        flax = {**flax, "batch_stats/bn/mean": np.zeros(4, np.float32)}
    for tree, want in [(flax, "transformers-flax" if top == "params" else None), (own, None)]:
        nested = nest(tree)
        tied = tie(nested)
        for found in (
            flax_layout(nested, config=config),
            flax_layout(TreeSource(nested), config=config),
            flax_layout(tied.unique, tied.alias_map, config=config),
        ):
            assert (found and found.name) == want
        assert flax_layout(nested, layout="jaxshare", config=config).name == "jaxshare"


def _fits(answer: bool | None) -> Callable[[bridge.Layout], bool] | None:
    return None if answer is None else lambda layout: answer


GPT2 = {"model_type": "gpt2"}
DETECTED = [
    # paths, config, what the model class says of the transformers-flax layout, found
    (["transformer/wte/embedding"], GPT2, None, "transformers-flax"),
    (["transformer/wte/embedding"], GPT2, False, "transformers-flax"),
    (["params/transformer/wte/embedding"], GPT2, None, None),
    (["params/transformer/wte/embedding"], GPT2, True, "transformers-flax"),
    (["params/transformer/wte/embedding"], GPT2, False, None),
    (["params/bn/scale", "batch_stats/bn/mean"], GPT2, True, None),
    (["buffers/x"], GPT2, True, None),
    (["transformer/wte/embedding"], None, True, None),
    (["params/transformer/wte/embedding"], None, True, None),
    ([], GPT2, True, None),
]


@pytest.mark.parametrize("paths, config, fits, want", DETECTED)
def test_the_layout_is_found_by_the_top_and_the_model_class(paths, config, fits, want):
    asked: list[str] = []

    def recording(layout: bridge.Layout) -> bool:
        asked.append(layout.name)
        return bool(fits)

    found = bridge.detect_layout(None, paths, config, fits=None if fits is None else recording)
    assert (found and found.name) == want
    # The model class is asked only of a tree under `params/` alone, for one layout.
    linen = config is not None and {p.split("/")[0] for p in paths} == {"params"}
    assert asked == (["transformers-flax"] if linen and fits is not None else [])
    assert bridge.detect_layout("jaxshare", paths, config, fits=recording).name == "jaxshare"


TOPS = st.sampled_from(["params", "batch_stats", "buffers", "model", "lm_head"])


@given(
    tops=st.lists(TOPS, min_size=1, max_size=4),
    config=st.sampled_from([None, GPT2, {"model_type": "llama"}]),
    fits=st.sampled_from([None, True, False]),
)
def test_a_tree_is_found_in_the_layout_only_where_its_top_or_the_model_says_so(tops, config, fits):
    paths = [f"{top}/w/kernel" for top in tops]
    found = bridge.detect_layout(None, paths, config, fits=_fits(fits))
    collections = {"params", "batch_stats", "buffers"}
    own = config is not None and not set(tops) & collections  # The Flax model's params.
    linen = config is not None and set(tops) == {"params"} and fits is True
    assert (found is not None) == (own or linen)
    assert found is None or found.name == "transformers-flax"


# -- a trained head the config ties -------------------------------------------------


def _tied_config(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """The fixture's ``config.json`` with ``tie_word_embeddings: true``."""
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path, cfg


CONTAINERS = {
    "plain": lambda params, tmp: save_plain(params, tmp / "item"),
    "linen": lambda params, tmp: save_plain(_linen(params), tmp / "item"),
    "tree": lambda params, tmp: nest(params),  # bridge.save_hf of the tree in memory
}
HEADS = [("llama_untied", c) for c in CONTAINERS] + [("mistral", "plain"), ("mistral", "linen")]


def _save_hf(given: Path | dict, out: Path, config: Path) -> tuple[int, list[str]]:
    if isinstance(given, Path):
        return convert(given, out, "--format", "hf", "--config", config)
    with recorded() as messages:
        bridge.save_hf(out, given, config=config)
    return 0, messages


@pytest.mark.parametrize("name, container", HEADS, ids=["/".join(h) for h in HEADS])
def test_a_trained_head_the_config_ties_is_kept_and_the_config_untied(name, container, tmp_path):
    """transformers 4.57's FlaxLlamaForCausalLM (and Mistral's) computes its logits
    with its own ``lm_head/kernel`` whatever ``tie_word_embeddings`` says: where it
    differs from the embedding, it is written, ``config.json`` says
    ``tie_word_embeddings: false``, and one line says so."""
    fixture = FIXTURES / name
    params = load_file(fixture / "params.safetensors")
    head, embedding = params["lm_head/kernel"], params["model/embed_tokens/embedding"]
    assert not np.array_equal(head, embedding.T)  # A head trained apart.
    config, cfg = _tied_config(name, tmp_path)
    out = tmp_path / "hf"
    status, err = _save_hf(CONTAINERS[container](params, tmp_path), out, config)
    assert status == 0, err
    says = ("'lm_head.weight'", "tie_word_embeddings: false", "max |Δ|")
    if container == "tree":  # (Named in PyTorch in memory: the line names the tensors.)
        assert_warned(err, says)
    else:  # (Read from the item: the line names its Flax leaf too.)
        assert_warned(err, (*says, "lm_head/kernel'"), prefix="jaxshare convert: warning: ")
    written = json.loads((out / "config.json").read_text())
    assert written == {**cfg, "tie_word_embeddings": False}  # That alone changes.
    stored = tensors(out)
    assert torch.equal(stored["lm_head.weight"], torch.from_numpy(np.ascontiguousarray(head.T)))
    assert torch.equal(stored["model.embed_tokens.weight"], torch.from_numpy(embedding))

    model_class = getattr(transformers, MANIFEST[name]["torch_class"])
    loaded, info = model_class.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    loaded.eval()
    assert loaded.lm_head.weight.data_ptr() != loaded.get_input_embeddings().weight.data_ptr()
    ids = torch.from_numpy(load_file(fixture / "inputs.safetensors")["input_ids"]).long()
    with torch.no_grad():
        logits = loaded(ids).logits
        hidden = loaded.model(ids).last_hidden_state
    direct = hidden @ torch.from_numpy(head)  # The head's kernel: (hidden, vocab).
    torch.testing.assert_close(logits, direct, rtol=1e-6, atol=1e-6)
    flax_logits = load_file(fixture / "logits.safetensors")["logits"]  # The Flax model's
    assert float(np.abs(logits.numpy() - flax_logits).max()) <= TOLERANCE


@pytest.mark.parametrize("container", ["plain", "linen"])
def test_a_head_that_is_the_embedding_keeps_the_tie_with_no_line(container, tmp_path):
    """Flax Llama of a tied checkpoint holds the embedding transposed, bit for bit,
    as its head: the tie stays as it is, ``config.json`` byte for byte, and no line."""
    params = load_file(FIXTURES / "llama" / "params.safetensors")
    assert np.array_equal(params["lm_head/kernel"], params["model/embed_tokens/embedding"].T)
    config = FIXTURES / "llama" / "config.json"
    out = tmp_path / "hf"
    status, err = convert(
        CONTAINERS[container](params, tmp_path), out, "--format", "hf", "--config", config
    )
    assert (status, err) == (0, [])
    assert (out / "config.json").read_bytes() == config.read_bytes()
    assert "lm_head.weight" not in tensors(out)  # As save_pretrained leaves it out.


# -- Flax params in a plain Orbax item -> transformers 5 directory --------------------


@pytest.mark.parametrize("name", IDS)
def test_flax_params_to_directory_give_the_flax_outputs(hf, name, tmp_path):
    fixture, built, out = FIXTURES / name, hf(name), tmp_path / "hf"
    plain = save_plain(load_file(fixture / "params.safetensors"), tmp_path / "item")
    status, err = convert(plain, out, "--format", "hf", "--config", fixture / "config.json")
    assert status == 0, err
    shown(err, quirk(name).to_hf_warns)
    written = tensors(out)
    saved = tensors(built.directory)
    assert set(written) == set(saved) - set(quirk(name).unused) | set(quirk(name).extra)
    for computed in quirk(name).computed:
        assert torch.equal(written[computed], saved[computed]), computed

    model_class = type(built.model)
    loaded, info = model_class.from_pretrained(out, output_loading_info=True)
    problems = {key: set(value) for key, value in info.items() if value}
    assert problems == ({"missing_keys": set(quirk(name).unused)} if quirk(name).unused else {})
    untied = set(quirk(name).untied)
    kept = {group - untied for group in tie_groups(built.model)}
    assert tie_groups(loaded) == {group for group in kept if len(group) > 1}
    head = loaded.get_output_embeddings()
    if MANIFEST[name]["tie_word_embeddings"] and head is not None:
        assert head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    want = load_file(fixture / "logits.safetensors")
    got = outputs(loaded.eval(), name)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        assert float(np.abs(got[key] - value).max()) <= TOLERANCE, key


# -- transformers 5 directory -> layout item -> directory -----------------------------


@pytest.mark.parametrize("name", IDS)
def test_directory_to_layout_item_and_back_is_bit_exact(hf, item, name, tmp_path):
    built, (path, _) = hf(name), item(name)
    out = tmp_path / "hf"
    status, err = convert(path, out, "--format", "hf")  # The item keeps config.json.
    assert status == 0, err
    assert (out / "config.json").read_bytes() == (built.directory / "config.json").read_bytes()
    shown(err, quirk(name).back_warns)
    want, got = tensors(built.directory), tensors(out)
    assert set(got) == set(want) - set(quirk(name).unused)
    for key in set(got) & set(want):
        assert torch.equal(got[key], want[key]), key


# -- a parameter registered twice under one parent ------------------------------------


class TwiceParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.arange(3.0))
        self.b = self.a


class TwiceInALinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.lin.register_parameter("weight2", self.lin.weight)


class TwiceModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = self.a


@pytest.mark.parametrize("source", ["module", "state dict"])
@pytest.mark.parametrize(
    "make, ties, permutes",
    [
        (TwiceParameter, {"params/b": "params/a"}, None),
        (TwiceInALinear, {"params/lin/weight2": "params/lin/kernel"}, (1, 0)),
        (
            TwiceModule,
            {"params/b/kernel": "params/a/kernel", "params/b/bias": "params/a/bias"},
            None,
        ),
    ],
    ids=["self.b = self.a", "lin.weight2 = lin.weight", "module twice"],
)
def test_a_parameter_registered_twice_keeps_a_flax_name_and_its_tie(
    make, ties, permutes, source, flat, assert_same_state
):
    torch.manual_seed(0)
    module = make()
    variables, aliases = bridge.to_flax(module if source == "module" else module.state_dict())
    assert dict(aliases) == ties
    leaves = flat(variables)
    for alias, canonical in ties.items():
        if aliases.transform(alias) is None:
            assert leaves[alias] is leaves[canonical]
        else:
            assert aliases.transform(alias) == permutes
            np.testing.assert_array_equal(leaves[alias], np.transpose(leaves[canonical], permutes))
    state = bridge.to_torch(variables, aliases)
    assert_same_state(state, module.state_dict())  # Bits, and each tie one tensor.
    fresh = make()
    fresh.load_state_dict(state, strict=True)
    for key, tensor in module.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], tensor), key


# -- a tree that fits no layout -------------------------------------------------------


KERNEL = "transformer/h/0/mlp/c_fc/kernel"


@pytest.mark.parametrize(
    "spoil, leaf",
    [
        (lambda p: p.update({KERNEL + "s": p.pop(KERNEL)}), KERNEL + "s"),
        (lambda p: p.update({KERNEL: p[KERNEL].T.copy()}), KERNEL),
    ],
    ids=["renamed", "transposed"],
)
def test_a_tree_that_fits_no_layout_is_one_line_and_no_output(spoil, leaf, tmp_path):
    params = load_file(FIXTURES / "gpt2" / "params.safetensors")
    spoil(params)
    plain, out = save_plain(params, tmp_path / "item"), tmp_path / "out"
    config = FIXTURES / "gpt2" / "config.json"
    status, err = convert(plain, out, "--format", "hf", "--config", config)
    assert status == 1
    (line,) = err
    assert line.startswith("jaxshare convert: error: ")
    assert f"'{leaf}' fits no layout" in line and "nearest: " in line
    assert not out.exists()


# -- flax_model.msgpack, as FlaxPreTrainedModel.save_pretrained writes it ------------------

MSGPACK = [("gpt2", "flax_model"), ("llama", "flax_model"), ("bart", "flax_model")]
MSGPACK += [("bart", "flax_model_sharded")]


@pytest.mark.parametrize("name, folder", MSGPACK, ids=["/".join(m) for m in MSGPACK])
def test_a_flax_msgpack_directory_is_the_flax_params_on_every_route(
    hf, flat, name, folder, tmp_path
):
    directory, params = FIXTURES / name / folder, load_file(FIXTURES / name / "params.safetensors")

    report = bridge.inspect(directory)
    assert report.kind == "hf" and set(report.stored) == set(params)
    assert report.assets == ("config.json", "generation_config.json")

    variables, aliases = bridge.to_flax(directory)  # The Flax model's tree, as it is.
    assert dict(aliases) == {}
    leaves = flat(variables)
    assert set(leaves) == set(params)
    for path, value in params.items():
        np.testing.assert_array_equal(np.asarray(leaves[path]), value, err_msg=path)

    status, err = convert(directory, tmp_path / "item")
    assert status == 0 and err == []
    with ocp.StandardCheckpointer() as checkpointer:  # Plain Orbax: the same params.
        restored = flat(checkpointer.restore((tmp_path / "item").absolute()))
    assert set(restored) == set(params)
    for path, value in params.items():
        np.testing.assert_array_equal(np.asarray(restored[path]), value, err_msg=path)

    # To PyTorch names: the directory as save_pretrained writes it, and the outputs.
    saved = set(tensors(hf(name).directory))
    for source in (directory, tmp_path / "item"):  # (The item kept config.json.)
        out = tmp_path / f"hf-{source.name}"
        status, err = convert(source, out, "--format", "hf")
        assert status == 0, err
        shown(err, quirk(name).to_hf_warns)
        assert set(tensors(out)) == saved
        loaded, info = type(hf(name).model).from_pretrained(out, output_loading_info=True)
        assert not any(info.values()), info
        want, got = load_file(FIXTURES / name / "logits.safetensors"), outputs(loaded, name)
        for key, value in want.items():
            assert float(np.abs(got[key] - value).max()) <= TOLERANCE, key

    status, _ = convert(directory, tmp_path / "flax.safetensors")
    assert status == 0 and set(load_file(tmp_path / "flax.safetensors")) == set(params)
    status, err = convert(directory, tmp_path / "torch.safetensors", "--names", "torch")
    assert status == 0, err
    # A flat file of the tree, renamed: a head the HF writer leaves out (llama's) too.
    held = "lm_head/kernel" in params and "lm_head.weight" not in saved
    head = {"lm_head.weight"} if held else set()
    assert set(load_file(tmp_path / "torch.safetensors")) == saved | head


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda b: b[: len(b) // 2], "ends"),
        (lambda b: b"\xc7\x05\x7fhello" + b[8:], "ext"),
    ],
    ids=["truncated", "hostile ext type"],
)
def test_a_bad_msgpack_file_is_one_line_exit_1(spoil, says, tmp_path):
    import shutil

    directory = tmp_path / "flax"
    shutil.copytree(FIXTURES / "gpt2" / "flax_model", directory)
    weights = directory / "flax_model.msgpack"
    weights.write_bytes(spoil(weights.read_bytes()))
    for argv in (["inspect", directory], ["convert", "--quiet", directory, tmp_path / "out"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main([str(a) for a in argv]) == 1
        (line,) = err.getvalue().splitlines()
        assert line.startswith(f"jaxshare {argv[0]}: error: {weights}") and says in line, line
    assert not (tmp_path / "out").exists()


# -- the rest of the model directory travels with the weights ------------------------------


def test_tokenizer_and_config_travel_byte_for_byte_and_other_files_stay(hf, tmp_path, capsys):
    import shutil

    import tokenizers

    directory = tmp_path / "gpt2"
    shutil.copytree(hf("gpt2").directory, directory)
    vocab = {f"w{i}": i for i in range(64)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="w0", eos_token="w1", pad_token="w1"
    )
    tokenizer.save_pretrained(directory)
    (directory / "chat_template.jinja").write_text("{{ messages }}")
    (directory / "README.md").write_text("# tiny\n")
    ran = tmp_path / "ran"
    (directory / "modeling_evil.py").write_text(f"open({str(ran)!r}, 'w')\n")
    assets = sorted(p.name for p in directory.iterdir() if p.suffix in (".json", ".jinja"))

    report = bridge.inspect(directory)
    assert sorted(report.assets) == assets
    assert report.other_files == ("README.md", "modeling_evil.py")
    assert main(["inspect", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "other files, neither read nor carried: README.md, modeling_evil.py" in out

    item, back, copy = tmp_path / "item", tmp_path / "back", tmp_path / "copy"
    assert convert(directory, item, "--layout", "transformers-flax") == (0, [])
    assert convert(item, back, "--format", "hf") == (0, [])  # No --config: the item has it.
    assert convert(directory, copy, "--format", "hf") == (0, [])
    for out_dir in (back, copy):
        names = sorted(p.name for p in out_dir.iterdir() if not p.name.endswith(".safetensors"))
        assert names == assets
        for name in assets:
            assert (out_dir / name).read_bytes() == (directory / name).read_bytes(), name
    assert not ran.exists()

    again = transformers.AutoTokenizer.from_pretrained(back)
    assert again("w5 w6").input_ids == tokenizer("w5 w6").input_ids == [5, 6]
    made = [
        transformers.pipeline("text-generation", model=str(d), tokenizer=str(d))(
            "w5 w6", max_new_tokens=2, do_sample=False
        )[0]["generated_text"]
        for d in (directory, back)
    ]
    assert made[0] == made[1] and made[0].startswith("w5 w6")
