"""Scanned (stacked) layers unstacked into a Hugging Face directory, against the in-memory route.

A Llama-shaped model in a Hugging Face directory (``config.json`` of a ``LlamaConfig``
written by hand + ``model.safetensors`` in PyTorch names and Linear layouts,
``model.layers.{i}.self_attn.q_proj.weight`` ``(out, in)``, ...), float32, generated
with numpy into a temporary directory: by default width 2048, MLP 5504, 16 layers, 16
attention heads over 4 key/value heads, vocabulary 32000, untied head (3.1 GiB; the
largest tensor, the embedding or the head, 250 MiB; the largest per-layer slice, an MLP
weight, 43 MiB; the largest stacked array, an MLP weight over the 16 layers, 688 MiB).
Set-up, untimed, makes two scanned items of it:

* **jaxshare's item**: ``jaxshare convert MODEL_DIR ITEM --stack model.layers``: each
  per-layer weight one stacked leaf ``params/model/layers/self_attn/q_proj/kernel`` of
  shape ``(L, in, out)`` (stack axis 0), written in per-layer chunks, with jaxshare's
  naming record and ``config.json`` as an asset;
* **plain Orbax's item** ("chunked otherwise"): the same tree built as a user's
  scan-over-layers code holds it, ``np.stack`` of the per-layer weights (transposed where
  Flax's kernels are ``(in, out)``), checked leaf by leaf against jaxshare's item
  restored with plain Orbax, and saved with ``ocp.StandardCheckpointer().save(item,
  tree)`` (Orbax's own chunking; no naming record, no assets).

Each item is then converted back to a Hugging Face directory (per-layer PyTorch names,
``model.safetensors`` + ``config.json``) three ways, each in a fresh process measured by
``shared/tools/peakmem`` (peak RssAnon + RssShmem of the process tree; pages of mapped
files do not count):

* **ours**: ``jaxshare convert ITEM OUT --format hf --quiet``; for plain Orbax's item,
  which carries neither jaxshare's naming record nor assets, with ``--config
  MODEL_DIR/config.json --stack model.layers``;
* **the peer**, the in-memory route a user writes (what MaxText's and Levanter's
  exporters do): ``ocp.StandardCheckpointer().restore(item)`` (the whole tree in memory),
  then for each stacked leaf and each layer ``i`` ``np.ascontiguousarray(leaf[i].T)``
  (kernels; norms ``leaf[i]``) into a dict of per-layer names, ``safetensors.numpy.
  save_file(d, OUT/model.safetensors)`` and the config copied;
* **the machine's limit**: the same bytes, ``MODEL_DIR/model.safetensors`` (the bytes the
  output holds), copied (``shutil.copyfile``, a kernel ``sendfile``) and ``fsync``'d.

After the first round a check (in the peer's interpreter) compares every output
``model.safetensors`` with the original, tensor by tensor (names, shapes, dtypes, bytes),
so ours and the peer's are identical too. Rounds rotate who goes first (ours, peer,
limit; peer, limit, ours; ...), ``sync`` runs before each process, and the table gives,
per item, the medians over rounds of each side's figures and of the paired ratios.
``time`` is the whole process, start-up and imports included, as a user runs it.
jaxshare ``fsync``s what it writes; the peer does not (as users run it). Goals: ours peak
anonymous memory <= 2 x the largest per-layer slice + 400 MiB from jaxshare's item (the
embedding and the head, larger, stream as blocks), <= the largest stacked array + 400 MiB
from plain Orbax's (whose chunks may span layers); time <= 1.0x the peer. The streaming
benchmarks' bound, 2 x the largest tensor + 400 MiB, is printed beside them.

Run (about 25 GB of free disk under ``--dir``, 12 GB of memory for the peer)::

    .venv/bin/python benchmarks/unstack_convert.py            # --rounds 3
    .venv/bin/python benchmarks/unstack_convert.py --quick    # a small smoke run

jaxshare runs in ``--ours-python``, the peer and the set-up in ``--peer-python`` (both
default ``.venv``, which has Orbax and safetensors). Prints a table; a missed goal or a
failed side is reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stream_convert import (
    GOAL_OVERHEAD_MB,
    GOAL_TIME,
    HF_QUIET,
    MB,
    ROOT,
    child_env,
    copy_synced,
    flatten,
    json_child,
    load_average,
    measure_command,
    model_arguments,
    nest,
    parse,
    peer_arguments,
    print_sides,
    rotating_rounds,
)

ITEMS = {"jaxshare": "jaxshare's item -> HF dir", "plain": "plain Orbax item -> HF dir"}
STACK = "model.layers"
LAYER_SPECS = (  # per-layer tensors, (out, in) as torch.nn.Linear holds them
    ("self_attn.q_proj.weight", lambda a: (a.heads * a.head_dim, a.width)),
    ("self_attn.k_proj.weight", lambda a: (a.kv_heads * a.head_dim, a.width)),
    ("self_attn.v_proj.weight", lambda a: (a.kv_heads * a.head_dim, a.width)),
    ("self_attn.o_proj.weight", lambda a: (a.width, a.heads * a.head_dim)),
    ("mlp.gate_proj.weight", lambda a: (a.intermediate, a.width)),
    ("mlp.up_proj.weight", lambda a: (a.intermediate, a.width)),
    ("mlp.down_proj.weight", lambda a: (a.width, a.intermediate)),
    ("input_layernorm.weight", lambda a: (a.width,)),
    ("post_attention_layernorm.weight", lambda a: (a.width,)),
)


# --- the model ------------------------------------------------------------


def llama_specs(args: argparse.Namespace) -> list[tuple[str, tuple]]:
    """``(name, shape)`` of a ``LlamaForCausalLM`` state dict, untied head."""
    specs = [("model.embed_tokens.weight", (args.vocab, args.width))]
    for i in range(args.blocks):
        specs += [(f"{STACK}.{i}.{name}", shape(args)) for name, shape in LAYER_SPECS]
    return specs + [
        ("model.norm.weight", (args.width,)),
        ("lm_head.weight", (args.vocab, args.width)),
    ]


def llama_config(args: argparse.Namespace) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "hidden_size": args.width,
        "initializer_range": 0.02,
        "intermediate_size": args.intermediate,
        "max_position_embeddings": args.context,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": args.heads,
        "num_hidden_layers": args.blocks,
        "num_key_value_heads": args.kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.57.6",
        "use_cache": True,
        "vocab_size": args.vocab,
    }


def hf_names(path: str, shape: tuple, stack: str = STACK) -> list[tuple[str, int | None, bool]]:
    """The PyTorch names of one leaf of the item, as a user's exporter derives them:
    ``(name, layer index or None, transposed)``. ``params/`` off, ``/`` to ``.``,
    ``kernel`` (transposed), ``embedding`` and ``scale`` to ``weight``; a leaf under the
    stacked prefix holds layer ``i`` at index ``i`` of its axis 0."""
    parts = path.split("/")
    parts = parts[1:] if parts[0] == "params" else parts
    *module, leaf = parts
    name = {"kernel": "weight", "embedding": "weight", "scale": "weight"}.get(leaf, leaf)
    transposed = leaf == "kernel"
    prefix = stack.split(".")
    n = len(prefix)
    if module[:n] == prefix and (len(module) == n or not module[n].isdigit()):
        rest = [*module[n:], name]
        return [(".".join([*prefix, str(i), *rest]), i, transposed) for i in range(shape[0])]
    return [(".".join([*module, name]), None, transposed)]


# --- the processes: set-up, peer, limit, check ------------------------------


def child(op: str, *rest: str) -> None:
    if op == "generate":
        generate(Path(rest[0]), json.loads(rest[1]))
    elif op == "plain_item":
        plain_item(*rest)
    elif op == "peer":
        peer(*rest)
    elif op == "limit":
        src, dst = rest
        copy_synced(Path(src) / "model.safetensors", dst)
    elif op == "verify":
        verify(*rest)  # the model, the conversion, ours' output, the peer's
    else:
        raise SystemExit(f"unknown child {op!r}")


def generate(model: Path, args: dict) -> None:
    """``model.safetensors`` (random float32, which compresses as little as real weights)
    and ``config.json``."""
    import numpy as np
    from safetensors.numpy import save_file

    ns = argparse.Namespace(**args)
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in llama_specs(ns):
        tensors[name] = rng.random(shape, dtype=np.float32)
        np.subtract(tensors[name], 0.5, out=tensors[name])
    model.mkdir()
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps(llama_config(ns), indent=2) + "\n")


def plain_item(model: str, ours_item: str, plain: str) -> None:
    """Builds the stacked tree from the per-layer tensors with ``np.stack``, checks it
    against jaxshare's item restored by plain Orbax, saves it with
    ``StandardCheckpointer``, and prints the findings and both items' chunk shapes."""
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors import safe_open

    restored = flatten(ocp.StandardCheckpointer().restore(Path(ours_item).absolute()))
    problems, tree = [], {}
    with safe_open(Path(model) / "model.safetensors", "np") as f:
        known = set(f.keys())
        for path, leaf in restored.items():
            names = hf_names(path, leaf.shape)
            if not all(n in known for n, _, _ in names):
                problems.append(f"{path} {leaf.shape}: no tensors {names[0][0]} ...")
                tree[path] = np.asarray(leaf)
                continue
            parts = [f.get_tensor(n) for n, _, _ in names]
            parts = [p.T if t else p for p, (_, _, t) in zip(parts, names, strict=True)]
            value = np.stack(parts) if names[0][1] is not None else np.ascontiguousarray(parts[0])
            if value.shape != leaf.shape or value.dtype != leaf.dtype:
                problems.append(f"{path}: {leaf.shape} {leaf.dtype} != {value.shape} {value.dtype}")
            elif not np.array_equal(np.asarray(leaf), value):
                problems.append(f"{path}: values differ")
            tree[path] = value
            known.difference_update(n for n, _, _ in names)
    problems += [f"not in jaxshare's item: {sorted(known)[:5]}"] if known else []
    del restored
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(Path(plain).absolute(), nest(tree))
    checkpointer.wait_until_finished()
    stacked = [p for p in tree if hf_names(p, tree[p].shape)[0][1] is not None]
    largest = max(stacked or tree, key=lambda p: tree[p].nbytes)
    chunks = {
        name: _chunks(item, largest) for name, item in (("ours", ours_item), ("plain", plain))
    }
    found = {"leaves": len(tree), "stacked": len(stacked), "largest": largest}
    found |= {"shape": list(tree[largest].shape), "chunks": chunks, "problems": problems}
    print(json.dumps(found))


def _chunks(item: str, path: str) -> str:
    """The chunk shape an item stores leaf ``path`` in (zarr metadata inside its OCDBT)."""
    try:
        import tensorstore as ts

        kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{Path(item).absolute()}/"})
        kv = kv.result()
        key = path.replace("/", ".")
        for meta, field in ((".zarray", "chunks"), ("zarr.json", "chunk_grid")):
            found = kv.read(f"{key}/{meta}").result()
            if found.state == "value":
                value = json.loads(bytes(found.value))[field]
                value = value["configuration"]["chunk_shape"] if field == "chunk_grid" else value
                return "x".join(map(str, value))
        return "not found"
    except Exception as e:  # noqa: BLE001 -- information only
        return f"unknown ({type(e).__name__})"


def peer(item: str, dst: str, config: str) -> None:
    """What a user's exporter does: the whole tree restored, each stacked leaf cut into
    its layers (transposed copies for kernels), one ``save_file``."""
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors.numpy import save_file

    restored = ocp.StandardCheckpointer().restore(Path(item).absolute())
    flat = flatten(restored)
    del restored
    out = {}
    for path in sorted(flat):
        value = np.asarray(flat.pop(path))
        for name, index, transposed in hf_names(path, value.shape):
            part = value if index is None else value[index]
            out[name] = np.ascontiguousarray(part.T if transposed else part)
        del value
    Path(dst).mkdir()
    save_file(out, Path(dst) / "model.safetensors", metadata={"format": "pt"})
    shutil.copyfile(config, Path(dst) / "config.json")


def _tensors(folder: Path) -> dict[str, Path]:
    from safetensors import safe_open

    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, "np") as f:
            found.update({k: file for k in f.keys()})
    return found


def verify(model: str, item: str, *outputs: str) -> None:
    """Each output directory's tensors against the original's: names, shapes, dtypes and
    bytes; and its config.json (whichever ``item`` the conversion read). Prints one JSON
    line of findings."""
    import numpy as np
    from safetensors import safe_open

    ref_file = Path(model) / "model.safetensors"
    config = json.loads((Path(model) / "config.json").read_text())
    problems, notes, tensors = [], [], 0
    with safe_open(ref_file, "np") as ref:
        names = sorted(ref.keys())
        for out in map(Path, outputs):
            label = out.name
            got = _tensors(out)
            if sorted(got) != names:
                problems.append(f"{label}: names {sorted(set(got) ^ set(names))[:5]} differ")
                continue
            for name in names:
                a = ref.get_tensor(name)
                with safe_open(got[name], "np") as f:
                    b = f.get_tensor(name)
                tensors += 1
                if a.shape != b.shape or a.dtype != b.dtype:
                    problems.append(f"{label}: {name} {b.shape} {b.dtype} != {a.shape} {a.dtype}")
                elif not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                    problems.append(f"{label}: {name} bytes differ")
            if not (out / "config.json").exists():
                problems.append(f"{label}: no config.json")
                continue
            theirs = json.loads((out / "config.json").read_text())
            keys = sorted(k for k in set(config) | set(theirs) if config.get(k) != theirs.get(k))
            notes += [f"{label}: config.json differs in {keys}"] if keys else []
    print(json.dumps({"tensors": tensors, "problems": problems, "notes": notes}))


# --- the run ----------------------------------------------------------------


def command(item: str, side: str, src: Path, dst: Path, model: Path, args) -> list[str]:
    if side == "ours":
        cli = [args.ours_python, "-m", "jaxshare.cli", "convert", str(src), str(dst)]
        # Plain Orbax's item has neither jaxshare's naming record nor assets.
        plain = ["--config", str(model / "config.json"), "--stack", STACK]
        return [*cli, "--format", "hf", *(plain if item == "plain" else []), "--quiet"]
    if side == "peer":
        config = str(model / "config.json")
        return [args.peer_python, __file__, "--child", "peer", str(src), str(dst), config]
    return [sys.executable, __file__, "--child", "limit", str(model), str(dst)]


def _sources() -> str:
    """A digest of the library's sources, to tell whether they changed during a run."""
    import hashlib

    digest = hashlib.sha256()
    for file in sorted([*ROOT.glob("jaxshare/**/*.py"), *ROOT.glob("bridge/**/*.py")]):
        digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


def _du(path: Path) -> int:
    """Bytes of a file, or of the files under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = model_arguments(__doc__)
    ap.set_defaults(vocab=32000, width=2048, blocks=16, context=2048)
    ap.add_argument("--intermediate", type=int, default=5504, help="the MLP's width")
    ap.add_argument("--heads", type=int, default=16, help="attention heads")
    ap.add_argument("--kv-heads", type=int, default=4, help="key/value heads")
    peer_arguments(ap, ".venv", "runs the peer")
    args = parse(ap, child)
    if args is None:
        return
    if args.quick:
        args.vocab, args.width, args.intermediate, args.blocks = 1000, 256, 688, 2
        args.heads, args.kv_heads, args.context, args.rounds = 4, 2, 256, 1
    args.head_dim = args.width // args.heads
    specs = llama_specs(args)
    sizes = {name: 4 * math.prod(shape) for name, shape in specs}
    total, largest = sum(sizes.values()), max(sizes.values())
    per_layer = [4 * math.prod(shape(args)) for _, shape in LAYER_SPECS]
    largest_slice, largest_stacked = max(per_layer), max(per_layer) * args.blocks
    goals = {
        "jaxshare": 2 * largest_slice / MB + GOAL_OVERHEAD_MB,
        "tensor": 2 * largest / MB + GOAL_OVERHEAD_MB,  # For information.
        "plain": largest_stacked / MB + GOAL_OVERHEAD_MB,
    }
    env = child_env(**HF_QUIET)
    sources = _sources()
    git = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
    head = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    print(
        f"Model: Llama, width {args.width}, MLP {args.intermediate}, {args.blocks} layers, "
        f"{args.heads} heads / {args.kv_heads} kv heads, vocabulary {args.vocab}, float32: "
        f"{total / MB:.0f} MiB in {len(specs)} tensors; largest tensor {largest / MB:.0f} MiB, "
        f"largest per-layer slice {largest_slice / MB:.1f} MiB, largest stacked array "
        f"{largest_stacked / MB:.0f} MiB. Checkout {head or 'unknown'}.",
        flush=True,
    )
    root = Path(tempfile.mkdtemp(prefix="unstack_convert_", dir=args.dir))
    try:
        model, items = root / "model", {"jaxshare": root / "item", "plain": root / "plain_item"}
        sizes_arg = {k: getattr(args, k) for k in ("vocab", "width", "intermediate", "blocks")}
        sizes_arg |= {k: getattr(args, k) for k in ("heads", "kv_heads", "head_dim", "context")}
        gen = [sys.executable, __file__, "--child", "generate", str(model), json.dumps(sizes_arg)]
        subprocess.run(gen, check=True, env=env)
        make = [args.ours_python, "-m", "jaxshare.cli", "convert", str(model)]
        made = subprocess.run(
            [*make, str(items["jaxshare"]), "--stack", STACK, "--quiet"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if made.returncode != 0:
            print(f"FAILED ({made.returncode}): {' '.join(made.args)}\n{made.stdout}")
            print(made.stderr[-4000:])
            return
        setup = json_child(
            [args.peer_python, __file__, "--child", "plain_item", str(model)]
            + [str(items["jaxshare"]), str(items["plain"])],
            env,
        )
        if isinstance(setup, str):
            print(f"Set-up of plain Orbax's item {setup}")
            return
        describe_items(model, items, setup)

        def run(item: str, side: str) -> tuple[dict | None, Path]:
            dst = root / (f"{side}_{item}_hf" if side != "limit" else "copy.safetensors")
            cmd = command(item, side, items[item], dst, model, args)
            return measure_command(cmd, dst, env), dst

        check = [args.peer_python, __file__, "--child", "verify", str(model)]
        results, checks, loads = rotating_rounds(args.rounds, ITEMS, run, check, env)
        report(args, results, goals, loads, checks)
        if _sources() != sources:
            print("WARNING: jaxshare's or the bridge's sources changed during the run.")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def describe_items(model: Path, items: dict[str, Path], setup: dict) -> None:
    found = "; ".join(setup["problems"]) or "identical"
    print(
        f"Items: model.safetensors {_du(model / 'model.safetensors') / MB:.0f} MiB; jaxshare's "
        f"item {_du(items['jaxshare']) / MB:.0f} MiB, plain Orbax's {_du(items['plain']) / MB:.0f}"
        f" MiB; {setup['leaves']} leaves, {setup['stacked']} stacked. {setup['largest']} "
        f"{tuple(setup['shape'])} is stored in chunks of {setup['chunks']['ours']} by jaxshare, "
        f"{setup['chunks']['plain']} by plain Orbax. np.stack of the original against "
        f"jaxshare's item restored by plain Orbax: {found}.",
        flush=True,
    )


def report(args, results, goals, loads, checks) -> None:
    print(
        f"Goals: ours peak anon <= 2 x largest per-layer slice + {GOAL_OVERHEAD_MB} MiB = "
        f"{goals['jaxshare']:.0f} MiB from jaxshare's item, <= largest stacked array + "
        f"{GOAL_OVERHEAD_MB} MiB = {goals['plain']:.0f} MiB from plain Orbax's (for "
        f"information, 2 x largest tensor + {GOAL_OVERHEAD_MB} MiB = {goals['tensor']:.0f} "
        f"MiB); time <= {GOAL_TIME:.1f}x the peer. {args.rounds} round(s), sides rotating. "
        + load_average(loads)
    )
    for item, name in ITEMS.items():
        check = checks.get(item, "not run")
        if isinstance(check, dict):
            found = "; ".join(check["problems"]) or "identical"
            notes = f" ({'; '.join(check['notes'])})" if check["notes"] else ""
            print(
                f"Check of round 1, {name}: ours and the peer's model.safetensors against the "
                f"original ({check['tensors']} tensors): {found}{notes}."
            )
        else:
            print(f"Check of round 1, {name}: {check}.")
    print_sides(results, ITEMS, goals, GOAL_TIME, 27)


if __name__ == "__main__":
    main()
