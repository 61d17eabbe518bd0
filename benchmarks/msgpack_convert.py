"""Flax ``flax_model.msgpack`` directories converted, against a user's script and the disk.

A directory as transformers' ``FlaxPreTrainedModel.save_pretrained`` writes it
(``flax_model.msgpack`` + ``config.json``) for a GPT-2-like model in the
transformers-flax layout, as ``FlaxGPT2LMHeadModel`` holds it: ``transformer/wte/embedding``,
``transformer/h/{i}/attn/c_attn/kernel`` ``(3d, d)`` (``FlaxConv1D`` kernels are
``(out, in)``), ``ln_1/scale``, ..., ``transformer/ln_f/bias``, no ``lm_head`` (tied,
computed). float32, generated with numpy and written with
``flax.serialization.msgpack_serialize``; by default width 1536, 20 blocks, vocabulary
50257 (2462 MiB, the largest tensor, the embedding, 294 MiB), the shapes of
``stream_convert.model_specs``. Two conversions, each run three ways, each in a fresh
process measured by ``shared/tools/peakmem`` (peak RssAnon + RssShmem of the process
tree; pages of mapped files do not count):

* **msgpack -> Orbax**: ``jaxshare convert DIR ITEM --quiet`` against what a Flax user
  writes: ``flax.serialization.msgpack_restore(Path(...).read_bytes())`` +
  ``ocp.StandardCheckpointer().save(item, tree)`` + ``wait_until_finished()``. Both items
  hold exactly the Flax params tree, which plain Orbax restores.
* **msgpack -> Hugging Face directory** (PyTorch names, ``model.safetensors``):
  ``jaxshare convert DIR OUT --format hf --quiet`` against transformers 4.57.
  ``GPT2LMHeadModel.from_pretrained(DIR, from_flax=True)`` is the documented route, but
  in 4.57 it is broken for every model: the model is built on the meta device, the Flax
  weights are handed to ``load_state_dict`` (a no-op on meta parameters) and
  ``save_pretrained`` fails with "Cannot copy out of meta tensor; no data!" (not a jax
  0.10 matter: no shim helps). The peer is therefore what ``from_flax=True`` runs, on a
  model with memory: ``GPT2LMHeadModel(config)`` built under ``no_init_weights()`` (the
  random initialisation a user's plain ``GPT2LMHeadModel(config)`` would also pay is
  spared), ``tie_weights()``, ``load_flax_checkpoint_in_pytorch_model(model, msgpack)``,
  ``save_pretrained(OUT)``. Both write the same tensors; neither stores the tied head.
* **the machine's limit**, beside each: the msgpack file's bytes copied to a new file
  (``shutil.copyfile``, which the kernel does with ``sendfile``) and ``fsync``'d.

In the first round, after each conversion, a check (in the peer's interpreter) restores
both items with plain Orbax and compares them with the msgpack tree, or compares the two
``model.safetensors`` tensor by tensor; then the outputs are removed. Rounds rotate who
goes first (ours, peer, limit; peer, limit, ours; ...), ``sync`` runs before each process,
and the table gives, per conversion, the medians over rounds of each side's figures and of
the paired ratios. ``time`` is the whole process, start-up and imports included, as a
user runs it. jaxshare ``fsync``s what it writes; the peers do not (as users run them), so
some of their write-back may fall after they exit (``sync`` before the next process keeps
it off the next one's clock).
Goals: jaxshare's peak anonymous memory <= 2 x the largest tensor + 400 MB; its time
<= 1.0x the peer's.

Run (about 15 GB of free disk under ``--dir``, 8 GB of memory for the peers)::

    .venv/bin/python benchmarks/msgpack_convert.py            # --rounds 3
    .venv/bin/python benchmarks/msgpack_convert.py --quick    # a small smoke run

jaxshare runs in ``--ours-python`` (default ``.venv``), the peers in ``--peer-python``
(default ``.venv-bench``, which has transformers 4.57 and torch). Prints a table; a
missed goal or a failed side is reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from stream_convert import (
    GOAL_OVERHEAD_MB,
    GOAL_TIME,
    HF_QUIET,
    MB,
    child_env,
    copy_synced,
    float32_sizes,
    load_average,
    measure_command,
    model_arguments,
    model_specs,
    parse,
    peer_arguments,
    print_sides,
    rotating_rounds,
)

OPS = {"orbax": "msgpack -> Orbax item", "hf": "msgpack -> HF directory"}


# --- the model ------------------------------------------------------------


def flax_specs(vocab: int, width: int, blocks: int, context: int) -> list[tuple[tuple, tuple]]:
    """``(path, shape)`` of ``FlaxGPT2LMHeadModel``'s params: ``stream_convert``'s state
    dict renamed. ``FlaxConv1D`` kernels are ``(out, in)``, Linear's layout, so no shape
    changes."""
    specs = []
    for name, shape in model_specs(vocab, width, blocks, context):
        *parents, last = name.split(".")
        if last == "weight":
            kind = parents[-1]
            last = {"wte": "embedding", "wpe": "embedding"}.get(kind, "kernel")
            last = "scale" if kind.startswith("ln") else last
        specs.append(((*parents, last), shape))
    return specs


def write_model(model: Path, specs: list[tuple[tuple, tuple]], args: argparse.Namespace) -> None:
    """``flax_model.msgpack`` (random float32, which compresses as little as real weights)
    and the ``config.json`` of a ``GPT2Config`` of those sizes."""
    import numpy as np
    from flax.serialization import msgpack_serialize

    rng = np.random.default_rng(0)
    tree: dict = {}
    for path, shape in specs:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = rng.random(shape, dtype=np.float32) - 0.5
    model.mkdir()
    (model / "flax_model.msgpack").write_bytes(msgpack_serialize(tree))
    config = {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_embd": args.width,
        "n_head": args.heads,
        "n_inner": None,
        "n_layer": args.blocks,
        "n_positions": args.context,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "tie_word_embeddings": True,
        "transformers_version": "4.57.6",
        "use_cache": True,
        "vocab_size": args.vocab,
    }
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")


# --- the processes measured ------------------------------------------------


def child(op: str, src: str, dst: str, *rest: str) -> None:
    """One measured peer or limit run, or the check of the outputs."""
    if op == "limit":
        copy_synced(Path(src) / "flax_model.msgpack", dst)
    elif op == "orbax":
        import orbax.checkpoint as ocp
        from flax.serialization import msgpack_restore

        tree = msgpack_restore(Path(src, "flax_model.msgpack").read_bytes())
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(Path(dst).absolute(), tree)
        checkpointer.wait_until_finished()
    elif op == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.modeling_flax_pytorch_utils import load_flax_checkpoint_in_pytorch_model
        from transformers.modeling_utils import no_init_weights

        config = GPT2Config.from_pretrained(src)
        with no_init_weights():
            model = GPT2LMHeadModel(config)
        model.tie_weights()  # init_weights, skipped above, would have tied them.
        model = load_flax_checkpoint_in_pytorch_model(model, str(Path(src, "flax_model.msgpack")))
        model.save_pretrained(dst)
    elif op == "verify":
        verify(src, dst, *rest)  # the model, the conversion, ours' output, the peer's
    else:
        raise SystemExit(f"unknown child {op!r}")


def verify(model: str, op: str, ours: str, peer: str) -> None:
    """``orbax``: both items restore with plain Orbax to the msgpack tree; ``hf``: both HF
    directories hold the same tensors. Prints one JSON line of findings."""
    import numpy as np
    from safetensors import safe_open

    problems = []
    if op == "orbax":
        import orbax.checkpoint as ocp
        from flax.serialization import msgpack_restore
        from flax.traverse_util import flatten_dict

        tree = msgpack_restore(Path(model, "flax_model.msgpack").read_bytes())
        ref = flatten_dict(tree, sep="/")
        for name, item in (("ours", ours), ("peer", peer)):
            restored = ocp.StandardCheckpointer().restore(Path(item).absolute())
            got = flatten_dict(restored, sep="/")
            if sorted(got) != sorted(ref):
                problems.append(f"{name} item: paths {sorted(set(got) ^ set(ref))[:5]} differ")
            else:
                bad = [p for p in ref if not np.array_equal(np.asarray(got[p]), ref[p])]
                problems += [f"{name} item: {bad[:5]} differ"] if bad else []
            del got
        print(json.dumps({"leaves": len(ref), "problems": problems}))
        return
    files = [sorted(Path(d).glob("*.safetensors")) for d in (ours, peer)]
    if [f.name for f in files[0]] != [f.name for f in files[1]]:
        problems.append(f"HF shards differ: {files}")
    tensors = 0
    for a, b in zip(*files, strict=False):
        with safe_open(a, "np") as fa, safe_open(b, "np") as fb:
            if sorted(fa.keys()) != sorted(fb.keys()):
                problems.append(f"{a.name}: names {sorted(set(fa.keys()) ^ set(fb.keys()))} differ")
                continue
            for key in fa.keys():
                tensors += 1
                if not np.array_equal(fa.get_tensor(key), fb.get_tensor(key)):
                    problems.append(f"{a.name}: {key} differs")
    print(json.dumps({"hf_tensors": tensors, "problems": problems}))


def command(op: str, side: str, src: Path, dst: Path, args: argparse.Namespace) -> list[str]:
    if side == "ours":
        fmt = ["--format", "hf"] if op == "hf" else []
        cli = [args.ours_python, "-m", "jaxshare.cli", "convert"]
        return [*cli, str(src), str(dst), *fmt, "--quiet"]
    python = args.peer_python if side == "peer" else sys.executable
    return [python, __file__, "--child", "limit" if side == "limit" else op, str(src), str(dst)]


# --- the run ----------------------------------------------------------------


def main() -> None:
    ap = model_arguments(__doc__)
    ap.add_argument("--heads", type=int, default=12, help="n_head, a divisor of the width")
    peer_arguments(ap)
    args = parse(ap, child)
    if args is None:
        return
    if args.quick:
        args.vocab, args.width, args.blocks, args.rounds = 5000, 384, 2, 1
    specs = flax_specs(args.vocab, args.width, args.blocks, args.context)
    largest, total, goal_mb = float32_sizes(specs)
    env = child_env(**HF_QUIET)
    root = Path(tempfile.mkdtemp(prefix="msgpack_convert_", dir=args.dir))
    try:
        model = root / "flax_model"
        write_model(model, specs, args)
        file_mb = (model / "flax_model.msgpack").stat().st_size / MB
        outputs = {"orbax": "item", "hf": "hf", "limit": "copy.msgpack"}

        def run(op: str, side: str) -> tuple[dict | None, Path]:
            dst = root / f"{side}_{op}_{outputs['limit' if side == 'limit' else op]}"
            return measure_command(command(op, side, model, dst, args), dst, env), dst

        check = [args.peer_python, __file__, "--child", "verify", str(model)]
        results, checks, loads = rotating_rounds(args.rounds, OPS, run, check, env)
        report(args, results, largest, total, file_mb, goal_mb, loads, checks)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(args, results, largest, total, file_mb, goal_mb, loads, checks) -> None:
    print(
        f"\nModel: width {args.width}, {args.blocks} blocks, vocabulary {args.vocab}, float32: "
        f"{total / MB:.0f} MiB in {len(flax_specs(1, 1, args.blocks, 1))} leaves, largest "
        f"{largest / MB:.0f} MiB; flax_model.msgpack {file_mb:.0f} MiB; {args.rounds} round(s), "
        "sides rotating."
    )
    print(
        f"Goals: ours peak anon <= 2 x largest + {GOAL_OVERHEAD_MB} MiB = {goal_mb:.0f} MiB; "
        f"time <= {GOAL_TIME:.1f}x the peer. {load_average(loads)}"
    )
    items, hf = checks["orbax"], checks["hf"]
    if isinstance(items, dict) and isinstance(hf, dict):
        print(
            f"Check of round 1's outputs: both items against the msgpack tree "
            f"({items['leaves']} leaves), ours against the peer's model.safetensors "
            f"({hf['hf_tensors']} tensors): "
            f"{'; '.join(items['problems'] + hf['problems']) or 'identical'}."
        )
    else:
        failed = "; ".join(c for c in (items, hf) if isinstance(c, str))
        print(f"Check of round 1's outputs: {failed}.")
    print_sides(results, OPS, dict.fromkeys(OPS, goal_mb), GOAL_TIME, 24)


if __name__ == "__main__":
    main()
