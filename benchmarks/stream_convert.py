"""Streaming conversions against the in-memory pipeline a user writes by hand.

A GPT-2-like model in PyTorch names and layout (Linear weights ``(out, in)``,
``lm_head.weight`` tied to ``transformer.wte.weight`` and stored once, the tie
in the file's ``jaxshare.alias_map`` metadata), float32, generated with numpy
into a temporary directory: by default width 1536, 20 blocks, vocabulary 50257
(~2.6 GB; the largest tensor, the embedding, ~0.31 GB). Three conversions, each
run by jaxshare and by its hand-written peer, each in a fresh process measured
by ``shared/tools/peakmem`` (peak RssAnon + RssShmem of the process tree; pages
of mapped files do not count):

* **safetensors -> Orbax**: ``jaxshare convert model.safetensors ckpt``
  (``bridge.flax_plan`` + ``checkpoint.write_item``) against
  ``safetensors.numpy.load_file`` + renames and transposes (the same plan) +
  ``ocp.StandardCheckpointer().save(...)`` + ``wait_until_finished()``. Both
  write the same unique tree (the tied head once).
* **Orbax -> safetensors (Flax names)**: ``jaxshare convert ckpt out.safetensors``
  (``consolidate_to_safetensors``: every path, the tied head written out
  transposed) against ``ocp.StandardCheckpointer().restore(ckpt)`` + the head
  as ``wte.T`` + ``safetensors.numpy.save_file``.
* **Orbax -> safetensors (PyTorch names)**: ``jaxshare convert ckpt out.safetensors
  --names torch`` (``bridge.torch_plan`` + ``save_plan``, the tie stored once)
  against ``restore`` + renames and transposes + ``save_file``.

Both sides of the way back read the same item (written by jaxshare). Rounds
alternate who goes first (ours, peer, peer, ours, ...), ``sync`` runs before
each process, and the table gives, per conversion, the medians over rounds of
each side's figures and of the paired ratios (ours / peer). ``time`` is the
whole process (start-up and imports included, as a user runs it); ``work`` the
conversion alone, each process timing itself after its imports (jaxshare's
includes importing the PyTorch bridge, which its route needs). Goals: peak
anonymous memory <= 2 x the largest tensor + 400 MB; time <= 1.0x the peer.

Run (about 10 GB of free disk under ``--dir``, 8 GB of memory for the peers)::

    python benchmarks/stream_convert.py            # --rounds 3
    python benchmarks/stream_convert.py --quick    # a small smoke run

Prints a table; a missed goal is reported, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# shared/tools/peakmem: in the checkout, beside it, or beside a worktree's parent.
PEAKMEM = (
    next(
        (
            p
            for p in (ROOT / "shared", ROOT.parent / "shared", ROOT.parent.parent / "shared")
            if (p / "tools/peakmem").exists()
        ),
        ROOT / "shared",
    )
    / "tools"
    / "peakmem"
)
MB = 2**20


def compiled(root: Path = ROOT) -> None:
    """Byte-compiles the checkout's ``jaxshare`` and ``bridge`` at ``root`` into
    ``__pycache__``, as installing a wheel does (pip compiles its modules), so the
    commands timed start as a user's do. Where ``PYTHONDONTWRITEBYTECODE`` is set,
    as on this project's machines, every process compiled the 59 modules a
    conversion imports again: 0.07 s of each command (``inspect`` of an item took
    0.27 s, and 0.20 s compiled)."""
    import compileall

    for package in ("jaxshare", "bridge"):
        compileall.compile_dir(root / package, quiet=1)


#: The sides of a comparison: jaxshare, the tool a user would otherwise run, the machine.
SIDES = ("ours", "peer", "limit")
GOAL_TIME = 1.0
GOAL_OVERHEAD_MB = 400


# --- the model ------------------------------------------------------------


def model_specs(vocab: int, width: int, blocks: int, context: int) -> list[tuple[str, tuple]]:
    """``(name, shape)`` of a GPT-2-like state dict with Linear layouts; the tied
    ``lm_head.weight`` is not among them (stored once, as its embedding)."""
    d = width
    specs = [("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (context, d))]
    for i in range(blocks):
        p = f"transformer.h.{i}."
        specs += [
            (p + "ln_1.weight", (d,)),
            (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (3 * d, d)),
            (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)),
            (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)),
            (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (4 * d, d)),
            (p + "mlp.c_fc.bias", (4 * d,)),
            (p + "mlp.c_proj.weight", (d, 4 * d)),
            (p + "mlp.c_proj.bias", (d,)),
        ]
    return specs + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def write_model(
    path: Path, specs: list[tuple[str, tuple]], *, embedding: str = "transformer.wte.weight"
) -> None:
    """Writes the model one tensor at a time (random float32, which compresses
    as little as real weights), ``lm_head.weight`` tied to ``embedding`` in the
    file's metadata."""
    import numpy as np

    from jaxshare import AliasMap
    from jaxshare.formats import TensorSpec, write_safetensors
    from jaxshare.internal import tie_metadata

    rng = np.random.default_rng(0)
    tie = AliasMap({"lm_head.weight": embedding})
    tensors = [TensorSpec(n, s, np.dtype("float32")) for n, s in specs]
    with write_safetensors(path, tensors, {"format": "pt", **tie_metadata(tie)}) as write:
        for spec in tensors:
            write((rng.random(spec.shape, dtype=np.float32) - 0.5,))


def write_plans(model: Path, ckpt: Path, out: Path) -> None:
    """The layouts jaxshare decides, for the peers to apply by hand: PyTorch name ->
    (Flax path, transposed) one way, Flax path -> (PyTorch name, transposed) the
    other, and the ties."""
    import bridge
    from jaxshare import checkpoint
    from jaxshare.formats import SafetensorsFile

    with SafetensorsFile(model) as source:
        plan = bridge.flax_plan(source)
    to_flax = {e.source: [e.name, e.perm is not None] for e in plan.entries}
    with checkpoint.open_source(ckpt) as source:
        back = bridge.torch_plan(source)
        amap = source.ties
    to_torch = {e.source: [e.name, e.perm is not None] for e in back.entries}
    ties = {a: [c, amap.transform(a) is not None] for a, c in amap.items()}
    out.write_text(json.dumps({"to_flax": to_flax, "to_torch": to_torch, "ties": ties}))


# --- the processes measured ------------------------------------------------


def nest(flat: dict) -> dict:
    """A flat ``{'a/b': value}`` as a nested dict."""
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested dict as a flat ``{'a/b': value}``."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def child(op: str, side: str, src: str, dst: str, plans: str) -> None:
    """One measured conversion; prints ``{"work_s": ...}`` (time after imports)."""
    import numpy as np

    if side == "ours":
        from bridge import convert
        from jaxshare.checkpoint import open_source, write_item  # noqa: F401 -- imports not
        from jaxshare.formats import save_plan  # noqa: F401 -- timed, as for the peer

        start = time.perf_counter()
        convert(src, dst, names="torch" if op == "torch" else None)
        print(json.dumps({"work_s": time.perf_counter() - start}))
        return
    import orbax.checkpoint as ocp
    from safetensors.numpy import load_file, save_file

    layout = json.loads(Path(plans).read_text())
    start = time.perf_counter()
    if op == "orbax":
        flat = load_file(src)
        tree = {}
        for name, (path, transposed) in layout["to_flax"].items():
            tree[path] = flat.pop(name).T if transposed else flat.pop(name)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(Path(dst).absolute(), nest(tree))
        checkpointer.wait_until_finished()
    else:
        restored = ocp.StandardCheckpointer().restore(Path(src).absolute())
        flat = {k: np.asarray(v) for k, v in flatten(restored).items()}
        out = {}
        if op == "flax":
            out = flat
            for alias, (canonical, transposed) in layout["ties"].items():
                value = flat[canonical]
                out[alias] = np.ascontiguousarray(value.T) if transposed else value
        else:
            for path, (name, transposed) in layout["to_torch"].items():
                value = flat.pop(path)
                out[name] = np.ascontiguousarray(value.T) if transposed else value
        save_file(out, dst, metadata={"format": "pt"})
    print(json.dumps({"work_s": time.perf_counter() - start}))


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (what a child printed), or None."""
    found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return found[-1] if found else None


def child_env(**extra: str) -> dict:
    """The environment of a measured process: JAX on the CPU, this checkout importable."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **extra}


#: What a process that may import transformers gets besides (:func:`child_env`).
HF_QUIET = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def peakmem(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Runs ``cmd`` in a fresh process under peakmem: the finished process and peakmem's
    figures (``None`` if none)."""
    run = subprocess.run(
        [sys.executable, str(PEAKMEM), "--json", "--", *cmd],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    return run, last_json(run.stderr)


def run_measured(
    cmd: list[str], dst: Path, env: dict
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """:func:`peakmem` of ``cmd``, ``dst`` removed and the disk synced first."""
    remove(dst)
    os.sync()  # The previous run's write-back must not land on this one.
    return peakmem(cmd, env)


def venv_python(name: str) -> str:
    """The python of the venv ``name`` of this checkout, else this one."""
    path = ROOT / name / "bin" / "python"
    return str(path) if path.exists() else sys.executable


def remove(path: Path) -> None:
    """Removes a file or a folder, if there is one."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def measure_command(cmd: list[str], dst: Path, env: dict, *, work: bool = False) -> dict | None:
    """Runs ``cmd`` in a fresh process under peakmem; its figures (with ``work``, and the
    last JSON line it printed: the seconds of its call), or None if it failed."""
    run, stats = run_measured(cmd, dst, env)
    printed = last_json(run.stdout) if work else {}
    if run.returncode != 0 or stats is None or printed is None:
        print(f"FAILED ({run.returncode}): {' '.join(cmd)}")
        print(f"{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
        return None
    return {**stats, **printed}


def json_child(cmd: list[str], env: dict) -> dict | str:
    """Runs ``cmd`` (a check): the last JSON line it printed, or what went wrong."""
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = last_json(run.stdout)
    if run.returncode == 0 and found is not None:
        return found
    return f"failed ({run.returncode}): {run.stdout[-1000:]}\n{run.stderr[-3000:]}"


def copy_synced(src: Path | str, dst: Path | str) -> None:
    """The machine's limit of a conversion: ``src``'s bytes copied (``shutil.copyfile``, a
    kernel ``sendfile``) and ``fsync``'d."""
    shutil.copyfile(src, dst)
    fsync(dst)


def fsync(path: Path | str) -> None:
    """``fsync`` of a file or a folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rotating_rounds(
    rounds: int,
    keys: Iterable[str],
    measure: Callable[[str, str], tuple[dict | None, Path]],
    check: list[str],
    env: dict,
) -> tuple[dict[str, dict[str, list]], dict[str, dict | str], list]:
    """``rounds`` rounds of each conversion of ``keys``, the sides rotating who goes first
    (ours, peer, limit; peer, limit, ours; ...): ``measure(key, side)`` runs one, giving its
    figures (``None`` if it failed) and its output, which is removed. In the first round,
    ours' and the peer's outputs of each conversion are kept for the command ``check`` +
    ``[key, ours, peer]`` (:func:`json_child`) and removed before the next conversion (less
    disk). Returns the figures (``results[key][side]``, per round), the checks and the load
    averages."""
    results: dict[str, dict[str, list]] = {key: {side: [] for side in SIDES} for key in keys}
    checks: dict[str, dict | str] = {}
    loads = [os.getloadavg()]
    for r in range(rounds):
        for key in results:
            kept: dict[str, Path] = {}
            for side in SIDES[r % 3 :] + SIDES[: r % 3]:
                figures, dst = measure(key, side)
                results[key][side].append(figures)
                if r == 0 and side != "limit" and dst.exists():
                    kept[side] = dst
                else:
                    remove(dst)
            if r == 0:
                if "ours" in kept and "peer" in kept:
                    checks[key] = json_child(
                        [*check, key, str(kept["ours"]), str(kept["peer"])], env
                    )
                else:
                    checks[key] = "not run: a side failed"
                for dst in kept.values():
                    remove(dst)
        loads.append(os.getloadavg())
    return results, checks, loads


def load_average(loads: list) -> str:
    """The load averages (1 min) of a run, sampled before and after each round."""
    return (
        "Load average (1 min) during the run: "
        + ", ".join(f"{la[0]:.1f}" for la in loads)
        + f" on {os.cpu_count()} CPUs."
    )


def float32_sizes(specs: Sequence[tuple[object, tuple]]) -> tuple[int, int, float]:
    """The bytes of the largest tensor of ``specs`` (float32) and of all, and the memory
    goal: 2 x the largest + ``GOAL_OVERHEAD_MB``, in MiB."""
    sizes = [4 * math.prod(s) for _, s in specs]
    return max(sizes), sum(sizes), 2 * max(sizes) / MB + GOAL_OVERHEAD_MB


def ratio(
    runs: dict[str, list], rounds: list[int], a: str, b: str, key: str, key_b: str | None = None
) -> float:
    """The median over ``rounds`` of side ``a``'s ``key`` over side ``b``'s ``key_b``
    (default: ``key``)."""
    return statistics.median(runs[a][i][key] / runs[b][i][key_b or key] for i in rounds)


#: The ratio columns of :func:`print_sides`: the heading, the side divided by, the figure.
RATIOS = (
    ("ours/peer", "peer", "wall_s"),
    ("ours/limit", "limit", "wall_s"),
    ("peak ours/peer", "peer", "peak_anon_mb"),
)


def print_table(
    results: dict, names: dict[str, str], memory_goals: dict[str, float],
    time_goals: dict[str, float], width: int, columns: tuple = RATIOS, *, work: bool = False,
) -> dict[str, list[int]]:  # fmt: skip
    """The table of ours, the peer and the limit for each conversion of ``names``
    (``results[conversion][side]``: per round, peakmem's figures or ``None``; with
    ``work``, the seconds of the call too), ours' ``columns`` of ratios, and verdicts
    against ``memory_goals[conversion]`` (MiB) and ``time_goals[conversion]`` (ours/peer,
    of the process and with ``work`` of the call). Returns each conversion's rounds where
    every side ran."""
    med = statistics.median
    head = f"\n{'conversion':{width}} {'side':5} {'peak anon MiB':>13} {'time s':>7}"
    head += f" {'work s':>7}" if work else ""
    head += "  " + " ".join(heading for heading, _, _ in columns) + "  verdict"
    print(head)
    print("-" * len(head))
    rounds_of = {}
    for key, name in names.items():
        runs = results[key]
        rounds = [i for i in range(len(runs["ours"])) if all(runs[s][i] for s in SIDES)]
        rounds_of[key] = rounds
        for side in SIDES:
            ok = [x for x in runs[side] if x]
            line = f"{name if side == 'ours' else '':{width}} {side:5} "
            if not ok:
                print(line + f"{'FAILED':>13}")
                continue
            mem, wall = med(x["peak_anon_mb"] for x in ok), med(x["wall_s"] for x in ok)
            line += f"{mem:13.0f} {wall:7.2f}"
            line += f" {med(x['work_s'] for x in ok):7.2f}" if work else ""
            if side == "ours" and rounds:
                misses = []
                if mem > memory_goals[key]:
                    misses.append(f"memory MISSED by {mem - memory_goals[key]:.0f} MiB")
                for what, figure in (("time", "wall_s"), ("work", "work_s"))[: 1 + work]:
                    vs_peer = ratio(runs, rounds, "ours", "peer", figure)
                    if vs_peer > time_goals[key]:
                        misses.append(f"{what} MISSED by {vs_peer - time_goals[key]:.2f}")
                line += "  " + " ".join(
                    f"{ratio(runs, rounds, 'ours', b, figure):{len(heading)}.2f}"
                    for heading, b, figure in columns
                )
                line += "  " + ("; ".join(misses) or "met")
            elif side == "ours":
                line += "  no round with every side: no ratios, goals not judged"
            print(line)
    return rounds_of


def per_round(runs: dict[str, list], rounds: list[int], figures: tuple[str, ...]) -> list[str]:
    """Ours' peak anon in each of ``rounds``, then ours/peer of each of ``figures``."""
    ours, peer = runs["ours"], runs["peer"]
    peaks = ", ".join(f"{ours[i]['peak_anon_mb']:.0f}" for i in rounds)
    found = [f"ours peak anon {peaks} MiB"]
    for figure in figures:  # wall_s (the process's time), work_s (the call's)
        ratios = ", ".join(f"{ours[i][figure] / peer[i][figure]:.2f}" for i in rounds)
        found.append(f"{'time' if figure == 'wall_s' else 'work'} ours/peer {ratios}")
    return found


def print_sides(
    results: dict, names: dict[str, str], memory_goals: dict[str, float], time_goal: float,
    width: int,
) -> None:  # fmt: skip
    """:func:`print_table` (one ``time_goal`` for every conversion), then each
    conversion's figures per round."""
    rounds_of = print_table(results, names, memory_goals, dict.fromkeys(names, time_goal), width)
    print(
        "\npeak anon: medians over rounds (peakmem, 10 ms samples); time: whole process; "
        "ratios: medians of per-round ratios (rounds where every side ran)."
    )
    for key, name in names.items():
        if len(rounds_of[key]) > 1:
            found = per_round(results[key], rounds_of[key], ("wall_s",))
            print(f"Per round, {name}: {'; '.join(found)}.")


def measure(op: str, side: str, src: Path, dst: Path, plans: Path) -> dict:
    """Runs one conversion in a fresh process under peakmem; its figures."""
    cmd = [sys.executable, __file__, "--child", op, side, str(src), str(dst), str(plans)]
    run, stats = run_measured(cmd, dst, child_env())
    work = last_json(run.stdout)
    if run.returncode != 0 or stats is None or work is None:
        raise RuntimeError(f"{side} {op} failed:\n{run.stdout}\n{run.stderr[-3000:]}")
    return {**stats, **work}


# --- the run ----------------------------------------------------------------


OPS = {
    "orbax": "safetensors -> Orbax",
    "flax": "Orbax -> safetensors (Flax names)",
    "torch": "Orbax -> safetensors (PyTorch names)",
}


def model_arguments(doc: str, *, context: bool = True) -> argparse.ArgumentParser:
    """The command line the streaming benchmarks share: the model's shapes (``--context``
    where ``context``), the rounds, where the files go and ``--quick``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--blocks", type=int, default=20)
    if context:
        ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the temporary files go")
    ap.add_argument("--quick", action="store_true", help="a small model, one round")
    return ap


def peer_arguments(
    ap: argparse.ArgumentParser, venv: str = ".venv-bench", what: str = "runs the peers"
) -> None:
    """``--ours-python`` (default this checkout's ``.venv``), which runs jaxshare, and
    ``--peer-python`` (default its ``venv``), which runs the peers and the checks."""
    ap.add_argument("--ours-python", default=venv_python(".venv"), help="runs jaxshare")
    ap.add_argument("--peer-python", default=venv_python(venv), help=what)


def parse(ap: argparse.ArgumentParser, child: Callable[..., None]) -> argparse.Namespace | None:
    """The command line, or None where this is one of the processes a benchmark runs of
    itself (``--child OP ARG ...``, hidden), which ``child(OP, ARG, ...)`` then ran."""
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return None
    return args


def main() -> None:
    args = parse(model_arguments(__doc__), child)
    if args is None:
        return
    compiled()
    if args.quick:
        args.vocab, args.width, args.blocks, args.rounds = 5000, 256, 2, 1
    specs = model_specs(args.vocab, args.width, args.blocks, args.context)
    largest, total, goal_mb = float32_sizes(specs)
    root = Path(tempfile.mkdtemp(prefix="stream_convert_", dir=args.dir))
    try:
        model, ref, plans = root / "model.safetensors", root / "ref_ckpt", root / "plans.json"
        write_model(model, specs)
        subprocess.run(
            [sys.executable, "-m", "jaxshare.cli", "convert", str(model), str(ref)],
            check=True,
            env=child_env(),
        )
        write_plans(model, ref, plans)
        inputs = {"orbax": model, "flax": ref, "torch": ref}
        outputs = {"orbax": "ckpt", "flax": "out.safetensors", "torch": "out.safetensors"}
        results: dict[str, dict[str, list[dict]]] = {op: {"ours": [], "peer": []} for op in OPS}
        loads = [os.getloadavg()]
        for r in range(args.rounds):
            for op in OPS:
                order = ("ours", "peer") if r % 2 == 0 else ("peer", "ours")
                for side in order:
                    dst = root / f"{side}_{outputs[op]}"
                    results[op][side].append(measure(op, side, inputs[op], dst, plans))
                    remove(dst)
            loads.append(os.getloadavg())
        report(args, results, largest, total, goal_mb, loads)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(args, results, largest: int, total: int, goal_mb: float, loads) -> None:
    med = statistics.median
    print(
        f"\nModel: width {args.width}, {args.blocks} blocks, vocabulary {args.vocab}, "
        f"float32: {total / MB:.0f} MiB in {len(model_specs(1, 1, args.blocks, 1))} tensors, "
        f"largest {largest / MB:.0f} MiB; {args.rounds} round(s), peers alternating."
    )
    print(
        f"Goals: peak anon <= 2 x largest + {GOAL_OVERHEAD_MB} MiB = {goal_mb:.0f} MiB; "
        f"time <= {GOAL_TIME:.1f}x the peer. {load_average(loads)}\n"
    )
    head = (
        f"{'conversion':38} {'side':5} {'peak anon MiB':>13} {'time s':>7} {'work s':>7}"
        f"  {'time ratio':>10} {'work ratio':>10}  verdict"
    )
    print(head)
    print("-" * len(head))
    for op, name in OPS.items():
        ours, peer = results[op]["ours"], results[op]["peer"]
        ratio_t = med(o["wall_s"] / p["wall_s"] for o, p in zip(ours, peer, strict=True))
        ratio_w = med(o["work_s"] / p["work_s"] for o, p in zip(ours, peer, strict=True))
        mem = med(o["peak_anon_mb"] for o in ours)
        misses = []
        if mem > goal_mb:
            misses.append(f"memory MISSED by {mem - goal_mb:.0f} MiB")
        if ratio_t > GOAL_TIME:
            misses.append(f"time MISSED by {ratio_t - GOAL_TIME:.2f}")
        for side, runs in (("ours", ours), ("peer", peer)):
            line = (
                f"{name if side == 'ours' else '':38} {side:5} "
                f"{med(x['peak_anon_mb'] for x in runs):13.0f} "
                f"{med(x['wall_s'] for x in runs):7.2f} {med(x['work_s'] for x in runs):7.2f}"
            )
            if side == "ours":
                verdict = "; ".join(misses) or "met"
                line += f"  {ratio_t:10.2f} {ratio_w:10.2f}  {verdict}"
            print(line)
    print(
        "\npeak anon: medians over rounds (peakmem, 10 ms samples); time: whole process; "
        "work: after imports; ratios: medians of per-round ours/peer."
    )


if __name__ == "__main__":
    main()
