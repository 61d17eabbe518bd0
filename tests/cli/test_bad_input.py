"""The bad-input catalogue: every bad input gets one clear line, exit status 1 (2 for
usage), no traceback, no partial output, and every input byte-identical afterwards.

Each case builds its inputs in a fresh directory, runs ``jaxshare`` on them (inspect
and every convert route it applies to) and the Python API the command maps to, and
compares a hash of every file and the directory listing before and after.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from jaxshare import AliasMap, Tied
from jaxshare import checkpoint as jc
from jaxshare.checkpoint._read import LeafReader
from jaxshare.cli import main
from jaxshare.formats import read_header


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its bytes (directories as "dir")."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def tied_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    emb = torch.randn(6, 4)
    return {"wte.weight": emb, "ln.weight": torch.ones(4), "lm_head.weight": emb}


def write_safetensors(path: Path) -> Path:
    bridge.save_safetensors(tied_state(), path)
    return path


def write_item(path: Path, alias_json: str | None = None) -> Path:
    emb = jnp.arange(12.0).reshape(3, 4)
    jc.save(path, {"wte": {"embedding": emb}, "head": {"kernel": emb}, "b": jnp.ones(2)})
    if alias_json is not None:
        (path / "jaxshare_alias_map.json").write_text(alias_json)
    return path


def alias_json(aliases: dict, *, version: int = 1) -> str:
    return json.dumps({"format": "jaxshare.alias_map", "version": version, "aliases": aliases})


def with_metadata(path: Path, text: str) -> Path:
    """A safetensors file whose jaxshare alias metadata is ``text``."""
    from safetensors.numpy import save_file

    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file(
        {"wte.weight": emb, "b": np.ones(2, np.float32)},
        path,
        metadata={"jaxshare.alias_map": text},
    )
    return path


def put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def truncated(path: Path, keep: Callable[[int, int], int]) -> Path:
    """A real safetensors file cut to ``keep(header_size, file_size)`` bytes."""
    write_safetensors(path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[: keep(n, len(data))])
    return path


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


class Unknown:
    pass


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input: how to make it, the commands to run on it, what they must say.

    ``make(root)`` builds the inputs under ``root`` and returns the input path; the
    argument lists use ``{src}`` and ``{root}``. ``api`` calls the Python API the
    commands map to with the input path (``None`` where the command is the API).
    """

    make: Callable[[Path], Path]
    commands: tuple[tuple[str, ...], ...]
    message: str
    api: Callable[[Path, Path], object] | None = None
    status: int = 1


SAFETENSORS_ROUTES = (
    ("inspect", "{src}"),
    ("convert", "{src}", "{root}/out"),
    ("convert", "{src}", "{root}/out.safetensors"),
    ("convert", "{src}", "{root}/out.pt"),
)
TORCH_ROUTES = (
    ("inspect", "{src}"),
    ("convert", "{src}", "{root}/out"),
    ("convert", "{src}", "{root}/out.safetensors"),
)
ITEM_ROUTES = (
    ("inspect", "{src}"),
    ("convert", "{src}", "{root}/out.safetensors"),
    ("convert", "{src}", "{root}/out.safetensors", "--names", "torch"),
    ("convert", "{src}", "{root}/out.pt"),
)


def _hostile(obj: object) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        path = root / "model.pt"
        torch.save({"w": torch.zeros(2), "x": obj}, path)
        return path

    return make


def _not_torch(name: str, data: bytes) -> Case:
    """A file ``name`` of ``data`` posing as a PyTorch file."""
    return Case(
        lambda r: put(r / name, data),
        TORCH_ROUTES,
        "not a PyTorch/zip/pickle file",
        lambda src, out: bridge.load_torch(src),
    )


def _same_file(output: str) -> Case:
    """``convert --force`` onto ``output``: the input under another name."""
    return Case(
        lambda r: write_safetensors(r / "m.safetensors"),
        (("convert", "{src}", output, "--force"),),
        "the output is the input",
    )


def _item_map(text: str, message: str, api: Callable[[Path], object] = jc.restore) -> Case:
    """An item whose ``jaxshare_alias_map.json`` is ``text``; ``api(item)`` refuses it."""
    return Case(
        lambda r: write_item(r / "ckpt", text), ITEM_ROUTES, message, lambda src, out: api(src)
    )


def _safetensors_map(text: str, message: str) -> Case:
    """A safetensors file whose alias map metadata is ``text``."""
    return Case(
        lambda r: with_metadata(r / "m.safetensors", text),
        SAFETENSORS_ROUTES,
        message,
        lambda src, out: bridge.load_safetensors(src),
    )


#: An alias map that names one key twice (json.loads would keep the last).
DUPLICATE_KEY = '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"x": "b", "x": "b"}}'


CASES = {
    # -- safetensors files that are not what their header says ---------------------
    "st-header-size-past-end": Case(
        lambda r: truncated(r / "m.safetensors", lambda n, size: 8 + n // 2),
        SAFETENSORS_ROUTES,
        "runs past the end of the file",
        lambda src, out: bridge.load_safetensors(src),
    ),
    "st-data-past-end": Case(
        lambda r: truncated(r / "m.safetensors", lambda n, size: size - 4),
        SAFETENSORS_ROUTES,
        "the file is truncated",
        lambda src, out: read_header(src),
    ),
    "st-bad-json": Case(
        lambda r: put(r / "m.safetensors", struct.pack("<Q", 5) + b"{oops"),
        SAFETENSORS_ROUTES,
        "the header is not JSON",
        lambda src, out: read_header(src),
    ),
    "st-empty": Case(
        lambda r: put(r / "m.safetensors", b""),
        SAFETENSORS_ROUTES,
        "fewer than the 8 of a header size",
        lambda src, out: bridge.load_safetensors(src),
    ),
    # -- files posing as PyTorch files ------------------------------------------------
    "pt-random-bytes": _not_torch("m.pt", bytes(range(7, 200))),
    "bin-json": _not_torch("m.bin", b'{"wte.weight": [1, 2]}'),
    "pt-text": _not_torch("m.pt", b"hello\n"),
    "pt-hostile": Case(
        _hostile(Evil()),
        TORCH_ROUTES,
        "unsupported GLOBAL posix.system",
        lambda src, out: bridge.load_torch(src),
    ),
    "pt-unknown-class": Case(
        _hostile(Unknown()),
        TORCH_ROUTES,
        "refused",
        lambda src, out: bridge.load_torch(src),
    ),
    # -- outputs that are inputs, or hold them -------------------------------------
    "same-path": Case(
        lambda r: write_safetensors(r / "m.safetensors"),
        (("convert", "{src}", "{src}", "--force"),),
        "the output is the input",
        lambda src, out: bridge.save_safetensors(tied_state(), src, force=True, inputs=[src]),
    ),
    "same-file-by-symlink": _same_file("{root}/link.safetensors"),
    "same-file-by-hard-link": _same_file("{root}/hard.safetensors"),
    "same-file-by-relative-path": _same_file("{root}/sub/../m.safetensors"),
    "dst-inside-src": Case(
        lambda r: write_item(r / "ckpt"),
        (("convert", "{src}", "{src}/inner.safetensors"),),
        "would lie inside the input",
        lambda src, out: jc.consolidate_to_safetensors(src, src / "inner.safetensors"),
    ),
    "src-inside-dst": Case(
        lambda r: write_safetensors(r / "d" / "m.safetensors"),
        (("convert", "{src}", "{root}/d", "--force"),),
        "holds the input",
    ),
    # -- --force onto something that is not an output of the same kind --------------
    "force-onto-a-directory-of-files": Case(
        lambda r: write_safetensors(r / "m.safetensors"),
        (("convert", "{src}", "{root}/notes", "--force"),),
        "todo.txt, not an Orbax checkpoint item",
        lambda src, out: jc.save(out / "notes", {"a": jnp.ones(2)}, force=True),
    ),
    "force-onto-a-file-of-another-format": Case(
        lambda r: write_item(r / "ckpt"),
        (("convert", "{src}", "{root}/notes/todo.safetensors", "--force"),),
        "not a .safetensors file; --force replaces only a .safetensors file",
        lambda src, out: jc.consolidate_to_safetensors(
            src, out / "notes/todo.safetensors", force=True
        ),
    ),
    "force-onto-a-text-file-as-pt": Case(
        lambda r: write_item(r / "ckpt"),
        (("convert", "{src}", "{root}/notes/todo.pt", "--force"),),
        "not a PyTorch weights file",
    ),
    # -- alias maps that are bad in any way -----------------------------------------
    "item-map-cycle": _item_map(alias_json({"a": "b", "b": "a"}), "alias map has a cycle"),
    "item-map-dangling": _item_map(
        alias_json({"x/y": "nope"}), "its canonical 'nope' is not an array the checkpoint stores"
    ),
    "item-map-transform-does-not-fit": _item_map(
        alias_json({"head/kernel": {"target": "b", "permute": [1, 0]}}),
        "transform [1, 0] permutes 2 axes",
    ),
    "item-map-duplicate-key": _item_map(DUPLICATE_KEY, "repeats the key 'x'", jc.read_alias_map),
    "item-map-unknown-version": _item_map(alias_json({}, version=7), "version", jc.read_alias_map),
    "item-map-oversized": _item_map(" " * (16 * 2**20 + 1), "over the limit", jc.read_alias_map),
    "st-map-cycle": _safetensors_map(alias_json({"a": "b", "b": "a"}), "alias map has a cycle"),
    "st-map-dangling": _safetensors_map(
        alias_json({"x": "nope"}), "names canonical 'nope', which the file does not store"
    ),
    "st-map-transform-does-not-fit": _safetensors_map(
        alias_json({"x": {"target": "b", "permute": [1, 0]}}), "permutes 2 axes"
    ),
    "st-map-duplicate-key": _safetensors_map(DUPLICATE_KEY, "repeats the key 'x'"),
    "st-map-unknown-version": _safetensors_map(alias_json({}, version=9), "version"),
    # -- checkpoints that are not one item ------------------------------------------
    "manager-root": Case(
        lambda r: _manager(r / "run"),
        ITEM_ROUTES,
        "is a CheckpointManager directory with steps [1, 2]; pass one step",
        lambda src, out: jc.restore(src),
    ),
}


def _manager(root: Path) -> Path:
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root.absolute()) as manager:
        for step in (1, 2):
            manager.save(step, args=jc.SharedSave({"a": jnp.ones(2) * step}))
        manager.wait_until_finished()
    return root


def _prepare(root: Path, name: str, case: Case) -> Path:
    src = case.make(root)
    (root / "notes").mkdir(exist_ok=True)
    (root / "notes" / "todo.txt").write_text("keep me")
    (root / "notes" / "todo.safetensors").write_text("not weights")
    (root / "notes" / "todo.pt").write_text("not weights either")
    (root / "sub").mkdir(exist_ok=True)
    if name == "same-file-by-symlink":
        (root / "link.safetensors").symlink_to(src)
    if name == "same-file-by-hard-link":
        os.link(src, root / "hard.safetensors")
    return src


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_gets_one_line_and_changes_nothing(name, tmp_path, capsys, monkeypatch):
    case = CASES[name]
    monkeypatch.chdir(tmp_path)  # A hostile pickle would `touch PWNED` here.
    src = _prepare(tmp_path, name, case)
    before = snapshot(tmp_path)
    for command in case.commands:
        argv = [a.format(src=src, root=tmp_path) for a in command]
        if argv[0] == "convert":
            argv.append("--quiet")
        status = main(argv)
        err = capsys.readouterr().err
        assert status == case.status, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert err.startswith(f"jaxshare {argv[0]}: ") and case.message in err, (argv, err)
        assert snapshot(tmp_path) == before, argv
    if case.api is not None:
        with pytest.raises((ValueError, FileNotFoundError)) as raised:
            case.api(src, tmp_path)
        assert case.message in str(raised.value)
        assert snapshot(tmp_path) == before
    assert not (tmp_path / "PWNED").exists()


def test_the_catalogue_covers_inspect_and_every_convert_route():
    outputs = {
        (c[0], Path(c[2]).suffix if len(c) > 2 else "")
        for case in CASES.values()
        for c in case.commands
    }
    assert {
        ("inspect", ""),
        ("convert", ""),
        ("convert", ".safetensors"),
        ("convert", ".pt"),
    } <= outputs


def test_a_plain_orbax_checkpoint_converts_without_ties(tmp_path, capsys):
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as c:
        c.save((tmp_path / "plain").absolute(), {"w": np.arange(4.0, dtype=np.float32)})
    assert (
        main(["convert", "--quiet", str(tmp_path / "plain"), str(tmp_path / "o.safetensors")]) == 0
    )
    assert read_header(tmp_path / "o.safetensors").tensors.keys() == {"w"}


def test_a_missing_parent_is_created_on_every_route(tmp_path, capsys):
    src = write_safetensors(tmp_path / "m.safetensors")
    for out in ("a/b/ckpt", "c/d/o.safetensors", "e/f/o.pt"):
        assert main(["convert", "--quiet", str(src), str(tmp_path / out)]) == 0
        assert (tmp_path / out).exists()


def test_a_failed_write_removes_the_parents_it_created(tmp_path, capsys, monkeypatch):
    src = write_item(tmp_path / "ckpt")

    read, blocks, in_rows = LeafReader.read, LeafReader.blocks, LeafReader.read_in_rows

    def full_disk(real):  # The first array is written; the disk fills up after.
        def reader(self, path, *args):
            if path != "b":
                raise OSError(28, "No space left on device")
            return real(self, path, *args)

        return reader

    # (Read whole and ahead, streamed as blocks, or in bands of rows: whichever way
    # the plan reads it.)
    monkeypatch.setattr(LeafReader, "read", full_disk(read))
    monkeypatch.setattr(LeafReader, "blocks", full_disk(blocks))
    monkeypatch.setattr(LeafReader, "read_in_rows", full_disk(in_rows))
    assert main(["convert", "--quiet", str(src), str(tmp_path / "x/y/o.safetensors")]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.subprocess
def test_a_full_disk_leaves_the_previous_output_intact(tmp_path, capsys):
    """A 2 MiB tmpfs fills up mid-write; the previous output and no temp file remain."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.system(f"mount -t tmpfs -o size=2m tmpfs {mount} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here; the injected ENOSPC test covers this")
    try:
        big = {"w": torch.arange(2**20, dtype=torch.float32)}  # 4 MiB: more than fits
        src = tmp_path / "big.safetensors"
        bridge.save_safetensors(big, src)
        out = mount / "o.safetensors"
        bridge.save_safetensors({"old": torch.ones(4)}, out)
        before = snapshot(mount)
        assert main(["convert", "--quiet", "--force", str(src), str(out), "--names", "torch"]) == 1
        err = capsys.readouterr().err
        assert "No space left on device" in err and err.count("\n") == 1
        assert snapshot(mount) == before
    finally:
        os.system(f"umount {mount}")


@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "page-cache"])
def test_an_injected_full_disk_leaves_the_previous_output_intact(
    tmp_path, capsys, monkeypatch, direct
):
    """Where no small tmpfs can be mounted, the disk fills up by injection, on either
    way an output is written (O_DIRECT where the file system takes it)."""
    src = write_safetensors(tmp_path / "m.safetensors")
    out = tmp_path / "o.safetensors"
    bridge.save_safetensors({"old": torch.ones(4)}, out)
    before = snapshot(tmp_path)
    left = [64]  # Bytes the disk takes before it is full.

    def take(n):
        left[0] -= n
        if left[0] < 0:
            raise OSError(28, "No space left on device")

    if direct:
        real = os.pwritev
        monkeypatch.setattr(
            os,
            "pwritev",
            lambda fd, parts, at: take(sum(map(len, parts))) or real(fd, parts, at),
        )
    else:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)

        class Full(io.FileIO):
            def write(self, data):
                take(len(data))
                return super().write(data)

        monkeypatch.setattr("jaxshare.io.output_file.open", lambda p, m: Full(p, m), raising=False)
    assert main(["convert", "--quiet", "--force", str(src), str(out), "--names", "torch"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and err.count("\n") == 1
    assert snapshot(tmp_path) == before


@pytest.mark.subprocess
def test_a_read_only_destination_is_one_line(tmp_path, capsys):
    src = write_safetensors(tmp_path / "m.safetensors")
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.system(f"mount -t tmpfs -o ro,size=1m tmpfs {mount} 2>/dev/null") != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        assert main(["convert", "--quiet", str(src), str(mount / "o.safetensors")]) == 1
        err = capsys.readouterr().err
        assert "Read-only file system" in err and err.count("\n") == 1
    finally:
        os.system(f"umount {mount}")


def test_the_api_refuses_a_pickle_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.bin"
    with open(path, "wb") as f:
        pickle.dump({"x": Evil()}, f, protocol=2)
    with pytest.raises(ValueError, match="posix.system"):
        bridge.load_torch(path)
    assert not (tmp_path / "PWNED").exists()


def test_our_own_flat_output_converts_back(tmp_path, capsys):
    """`convert ckpt out.safetensors` (Flax names, aliases written out, the map in the
    metadata) converts back to an item whose ties are aliases, and to PyTorch names."""
    emb = jnp.arange(12.0).reshape(3, 4)
    jc.save(
        tmp_path / "ckpt",
        Tied(
            {"wte": {"embedding": emb}, "b": jnp.ones(2)},
            AliasMap({"head/kernel": "wte/embedding"}, transforms={"head/kernel": (1, 0)}),
        ),
    )
    flat = tmp_path / "flat.safetensors"
    assert main(["convert", "--quiet", str(tmp_path / "ckpt"), str(flat)]) == 0
    assert set(read_header(flat).tensors) == {"wte/embedding", "head/kernel", "b"}
    assert main(["convert", "--quiet", str(flat), str(tmp_path / "again")]) == 0
    assert jc.read_alias_map(tmp_path / "again") == jc.read_alias_map(tmp_path / "ckpt")
    restored = jc.restore(tmp_path / "again")
    np.testing.assert_array_equal(restored["head"]["kernel"], emb.T)
    assert (
        main(
            [
                "convert",
                "--quiet",
                str(flat),
                str(tmp_path / "torch.safetensors"),
                "--names",
                "torch",
            ]
        )
        == 0
    )
    state = bridge.load_safetensors(tmp_path / "torch.safetensors")
    np.testing.assert_array_equal(state["wte.weight"].numpy(), np.asarray(emb))
