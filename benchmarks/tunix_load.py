"""A Hugging Face Qwen3 directory into Tunix's NNX Qwen3, sharded: jaxshare against Tunix.

The model is Qwen3-0.6B's shape with fewer layers -- hidden 1024, 16 query heads and 8
key/value heads of 128, MLP 3072, vocabulary 151936, the head tied to the embedding --
20 layers by default (0.94 GB, the size of the tied Qwen3 the issue measured; ``--layers
28`` is Qwen3-0.6B's own), bfloat16 with random values, one ``model.safetensors``
(written with ``safetensors.numpy``, names sorted as ``save_pretrained`` writes them; no
``lm_head.weight``, as Qwen3-0.6B's file) and Qwen3-0.6B's ``config.json`` (transformers
4.51's, which transformers 5's ``Qwen3Config`` reads). It is built once and kept under
``--dir`` (default: the temporary directory) as ``jaxshare-bench-cache/qwen3_...``.

Both loaders run on a 2 x 4 mesh (``fsdp`` x ``tp``, Tunix's axis names) of 8 CPU devices
(``--xla_force_host_platform_device_count=8``), into Tunix's ``Qwen3`` of the config
(``tunix_config`` of ``tests/_support/tunix_models.py``: bfloat16 parameters), each leaf
sharded as Tunix's default ``ShardingConfig`` says:

* **Tunix**: ``params.create_model_from_safe_tensors(dir, config, mesh=mesh)`` (its
  ``optimized`` loader, ``mode="auto"`` outside Google: the file mapped, each tensor
  transposed and reshaped as a numpy view, then ``jax.device_put(view, sharding)``);
* **jaxshare**: the model built abstractly as Tunix builds it (``nnx.eval_shape`` under
  ``compat.set_mesh(mesh)``, the leaves' ``NamedSharding`` from
  ``nnx.get_named_sharding``), then ``bridge.to_flax(dir, like=state, layout="tunix")``
  (each device reads only its slices) and ``nnx.update(model, state)``.

Each is timed until every parameter is ready (``jax.block_until_ready``), the file's
pages warm, in one process: a warm-up of each (whose models are compared leaf by leaf:
path, dtype, sharding and bits; the run fails if any differs), then ``--rounds`` rounds,
the order alternating. Tunix's call builds the abstract model itself; jaxshare's side is
timed in two parts, building the abstract model and the load proper (``to_flax`` +
``nnx.update``, the abstract state given, as a user who holds the model's skeleton calls
it). The goal, load / Tunix's whole call <= 0.5, is judged on the load proper; the whole
(both parts) / Tunix is printed beside it, and so is the process's CPU time (every
thread) of each call: other jobs share this machine's two cores, and CPU seconds move
less under their load than wall seconds. Ratios are medians of per-round ratios.

The way back: ``bridge.save_hf(out, model, layout="tunix", config=...)`` of a model just
loaded by jaxshare (its arrays never read to the host, as after training: ``np.asarray``
of a ``jax.Array`` caches a host copy on it, which would make a second save of one model
faster), against the machine's write limit as ``roofline.py`` measures it (the same bytes
-- the input's ``model.safetensors``, warm -- written and ``fsync``'d the fastest of
``cp``, ``dd oflag=direct`` and written behind), the two alternating over the rounds (goal
<= 1.5x); its tensors are checked against the input's, name, dtype, shape and bytes, and
the host copies left on the model's arrays afterwards are reported.

Memory: each loader alone in a fresh process (``--child only tunix|jaxshare``) under
``shared/tools/peakmem`` (peak RssAnon + RssShmem: on CPU devices the arrays are host
memory; the file's mapped pages do not count), ``--mem-rounds`` times each, alternating.
The figure judged is the peak beyond the loaded model's own bytes (every device's shards;
the process's imports included, as in the streaming benchmarks); goal <= 2 x the largest
tensor + 400 MiB.

Run (about 2 GB of free disk under ``--dir``, 6 GB of memory)::

    .venv/bin/python benchmarks/tunix_load.py             # --rounds 5 --mem-rounds 2
    .venv/bin/python benchmarks/tunix_load.py --quick     # a small smoke run

The measured processes run in ``--python`` (default this checkout's ``.venv``, which has
google-tunix, pinned in ``constraints/test.txt``). Prints a table; a missed goal is
reported, and the exit status is 0 either way (1 where the two loaders' models differ
or the way back does not give the input's tensors).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stream_convert import (
    GOAL_OVERHEAD_MB,
    HF_QUIET,
    MB,
    ROOT,
    child_env,
    compiled,
    last_json,
    load_average,
    peakmem,
    remove,
    venv_python,
)

GB = 1e9
GOAL_LOAD = 0.5  # jaxshare / Tunix
GOAL_SAVE = 1.5  # save_hf / the machine's write limit
MESH = (2, 4)  # fsdp x tp, Tunix's axis names
DEVICES = math.prod(MESH)
HARNESS = ROOT / "tests" / "_support" / "tunix_models.py"
#: What Tunix 0.1.7 warns of, loading under flax 0.12 (as the harness ignores them).
LOAD_WARNINGS = (r"'sharding' is deprecated, use 'out_sharding'", r"`flax\.nnx\.State` will be")
SIDES = {"tunix": "Tunix create_model_from_safe_tensors", "jaxshare": "bridge.to_flax + nnx.update"}


# --- the model ------------------------------------------------------------


def qwen3_config(a: argparse.Namespace) -> dict:
    """Qwen3-0.6B's ``config.json`` (as transformers 4.51 wrote it) at these sizes."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate,
        "max_position_embeddings": 40960,
        "max_window_layers": a.layers,
        "model_type": "qwen3",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a.vocab,
    }


def qwen3_specs(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of a tied ``Qwen3ForCausalLM``'s file (no ``lm_head.weight``),
    sorted by name as ``save_pretrained`` (safetensors) writes them."""
    e, d, f = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    n, k = c["num_attention_heads"], c["num_key_value_heads"]
    specs = [("model.embed_tokens.weight", (c["vocab_size"], e)), ("model.norm.weight", (e,))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (e,)),
            (p + "post_attention_layernorm.weight", (e,)),
            (p + "self_attn.q_proj.weight", (n * d, e)),
            (p + "self_attn.k_proj.weight", (k * d, e)),
            (p + "self_attn.v_proj.weight", (k * d, e)),
            (p + "self_attn.o_proj.weight", (e, n * d)),
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (f, e)),
            (p + "mlp.up_proj.weight", (f, e)),
            (p + "mlp.down_proj.weight", (e, f)),
        ]
    return sorted(specs)


def build(model: Path, config: dict) -> None:
    """``model.safetensors`` (random normal x 0.02 in bfloat16; norms about 1) and
    ``config.json``, written beside ``model`` and renamed into place when complete."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in qwen3_specs(config):
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= 0.02
        if name.endswith("norm.weight"):
            x += 1.0
        tensors[name] = x.astype(ml_dtypes.bfloat16)
        del x
    tmp = model.with_name(model.name + ".tmp")
    remove(tmp)
    tmp.mkdir(parents=True)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tmp.rename(model)


def cached_model(args: argparse.Namespace, config: dict) -> Path:
    """The model directory, built once (in ``--python``) and kept for later runs."""
    e, layers, v = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    name = f"qwen3_h{e}_l{layers}_v{v}_f{config['intermediate_size']}"
    name += f"_n{config['num_attention_heads']}_k{config['num_key_value_heads']}"
    name += f"_d{config['head_dim']}_bf16_tied"
    model = Path(args.dir or tempfile.gettempdir()) / "jaxshare-bench-cache" / name
    if (model / "config.json").exists() and (model / "model.safetensors").exists():
        return model
    print(f"Building {model} (once) ...", flush=True)
    cmd = [args.python, __file__, "--child", "build", str(model), json.dumps(config)]
    subprocess.run(cmd, check=True, env=child_env(**HF_QUIET))
    return model


# --- the processes measured ------------------------------------------------


def harness() -> Any:
    """``tests/_support/tunix_models.py``: Tunix imported with its package ``__init__``
    bypassed (which imports trainers), and a Hugging Face config as Tunix's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tunix_models", HARNESS)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def rss_anon_mb() -> float:
    """This process's RssAnon + RssShmem now, MiB."""
    kb = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssShmem:")):
            kb += int(line.split()[1])
    return kb / 1024


class Loaders:
    """The two loaders, on a 2 x 4 mesh of this process's 8 CPU devices."""

    def __init__(self, model_dir: Path) -> None:
        import warnings

        import jax
        from flax import nnx

        import bridge

        tm = harness()
        self.t = tm.tunix()
        from tunix.utils import compat  # (Imported by the harness, its __init__ bypassed.)

        self.jax, self.nnx, self.bridge, self.compat = jax, nnx, bridge, compat
        self.dir = str(model_dir)
        self.hf_config = json.loads((model_dir / "config.json").read_text())
        self.config = tm.tunix_config(self.hf_config)
        if len(jax.devices()) != DEVICES:
            raise SystemExit(f"{len(jax.devices())} devices, not {DEVICES}: XLA_FLAGS unset?")
        self.mesh = jax.make_mesh(MESH, ("fsdp", "tp"))
        for message in LOAD_WARNINGS:
            warnings.filterwarnings("ignore", message, DeprecationWarning)

    def params(self, model: Any) -> Any:
        return self.nnx.state(model, self.nnx.Param)

    def tunix(self, stages: dict | None = None) -> Any:
        """Tunix's own loader (eager sharding off, as Tunix's modules set it at import);
        it builds the abstract model itself (``stages`` is left as it is)."""
        with self.nnx.use_eager_sharding(False):
            model = self.t.qwen3.params.create_model_from_safe_tensors(
                self.dir, self.config, mesh=self.mesh
            )
        self.jax.block_until_ready(self.params(model))
        return model

    def abstract(self) -> tuple[Any, Any]:
        """The model built as Tunix's loader builds it, and its params with each leaf's
        ``NamedSharding`` (``nnx.get_named_sharding``, as the loader places them)."""
        jax, nnx = self.jax, self.nnx
        with nnx.use_eager_sharding(False), self.compat.set_mesh(self.mesh):
            qwen3 = self.t.qwen3.model.Qwen3
            model = nnx.eval_shape(lambda: qwen3(self.config, rngs=nnx.Rngs(params=0)))
        state = self.params(model)
        shardings = nnx.get_named_sharding(state, self.mesh)

        def sharded(variable: Any, sharding: Any) -> Any:
            value, where = variable.get_value(), sharding.get_value()
            return variable.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=where))

        is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
        return model, jax.tree.map(sharded, state, shardings, is_leaf=is_var)

    def jaxshare(self, stages: dict | None = None) -> Any:
        """The abstract model, ``to_flax`` into its params, ``nnx.update``; the wall and
        CPU seconds of building the abstract model (``build``) and of the rest
        (``load``) added to ``stages`` where given."""
        marks = [(time.perf_counter(), time.process_time())]
        model, like = self.abstract()
        marks.append((time.perf_counter(), time.process_time()))
        state, _ = self.bridge.to_flax(self.dir, like=like, layout="tunix")
        self.nnx.update(model, state)
        self.jax.block_until_ready(self.params(model))
        marks.append((time.perf_counter(), time.process_time()))
        if stages is not None:
            for k, stage in enumerate(("build", "load")):
                stages[stage] = marks[k + 1][0] - marks[k][0]
                stages[stage + "_cpu"] = marks[k + 1][1] - marks[k][1]
        return model


def model_bytes(loaders: Loaders, model: Any) -> int:
    """The bytes of every device's shards of the model's parameters."""
    leaves = loaders.jax.tree.leaves(loaders.params(model))
    return sum(s.data.nbytes for x in leaves for s in x.addressable_shards)


def compare(loaders: Loaders, ours: Any, theirs: Any) -> list[str]:
    """What differs between the two models' parameters: paths, dtypes, shardings, bits."""
    import numpy as np

    flat = loaders.jax.tree_util.tree_leaves_with_path
    a, b = flat(loaders.params(ours)), flat(loaders.params(theirs))
    problems = []
    if [k for k, _ in a] != [k for k, _ in b]:
        return [f"paths differ: {[k for k, _ in a][:3]} ... against {[k for k, _ in b][:3]} ..."]
    for (path, x), (_, y) in zip(a, b, strict=True):
        name = loaders.jax.tree_util.keystr(path)
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{name}: {x.dtype}{x.shape} against {y.dtype}{y.shape}")
        elif x.sharding != y.sharding:
            problems.append(f"{name}: sharding {x.sharding} against {y.sharding}")
        else:
            xa, ya = np.asarray(x), np.asarray(y)
            if not np.array_equal(xa.view(np.uint8), ya.view(np.uint8)):
                problems.append(f"{name}: values differ")
    return problems


def tensors_of(path: Path) -> dict[str, tuple[str, list, bytes]]:
    """``{name: (dtype, shape, bytes)}`` of every ``.safetensors`` file of a directory,
    read from its header and data, no framework involved."""
    import struct

    out = {}
    for file in sorted(path.glob("*.safetensors")):
        data = file.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        for name, info in header.items():
            if name != "__metadata__":
                start, end = info["data_offsets"]
                out[name] = (info["dtype"], info["shape"], data[8 + n + start : 8 + n + end])
    return out


def same_tensors(a: Path, b: Path) -> list[str]:
    """What differs between two directories' tensors (names, dtypes, shapes, bytes)."""
    ta, tb = tensors_of(a), tensors_of(b)
    problems = [f"{n}: only in {a.name}" for n in ta.keys() - tb.keys()]
    problems += [f"{n}: only in {b.name}" for n in tb.keys() - ta.keys()]
    for name in sorted(ta.keys() & tb.keys()):
        if ta[name][:2] != tb[name][:2]:
            problems.append(f"{name}: {ta[name][:2]} against {tb[name][:2]}")
        elif ta[name][2] != tb[name][2]:
            problems.append(f"{name}: bytes differ")
    return problems


def write_limit(src: Path, dst: Path) -> dict[str, float]:
    """The machine's write + fsync of ``src`` (warm) as ``roofline.py`` measures it,
    each way once: ``cp``, ``dd oflag=direct``, written behind."""
    import roofline

    return {
        "cp": roofline.write_seconds(src, dst),
        "dd oflag=direct": roofline.direct_write_seconds(src, dst),
        "written behind": roofline.behind_write_seconds(src, dst),
    }


def host_copies(loaders: Loaders, model: Any) -> int:
    """The bytes of host copies jax keeps on the model's arrays (``np.asarray`` of an
    array caches one on it, until the array dies)."""
    leaves = loaders.jax.tree.leaves(loaders.params(model))
    return sum(x.nbytes for x in leaves if getattr(x, "_npy_value", None) is not None)


def timed_call(fn: Any) -> tuple[Any, float, float]:
    """``fn()``, its wall and CPU seconds (every thread of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def child_time(model_dir: str, rounds: str, out_dir: str) -> None:
    """The timed comparison, in one process; prints its figures as JSON."""
    import gc

    src, out = Path(model_dir), Path(out_dir)
    config, dst = src / "config.json", out / "back"
    loaders = Loaders(src)
    subprocess.run(["cat", str(src / "model.safetensors")], stdout=subprocess.DEVNULL, check=True)
    # Warm-up (imports, tracing, the file's pages), and the check: bit for bit.
    theirs, ours = loaders.tunix(), loaders.jaxshare()
    nbytes = model_bytes(loaders, ours)
    loaders.bridge.save_hf(dst, ours, layout="tunix", config=config)  # (Warm-up: imports.)
    copies = host_copies(loaders, ours)  # (Before `compare`, which reads every array.)
    problems = compare(loaders, ours, theirs)
    back = same_tensors(src, dst) or ["identical"]
    del theirs, ours
    gc.collect()
    fig: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        fig.setdefault(key, []).append(value)

    for r in range(int(rounds)):
        for side in ("tunix", "jaxshare") if r % 2 == 0 else ("jaxshare", "tunix"):
            stages: dict[str, float] = {}
            model, wall, cpu = timed_call(functools.partial(getattr(loaders, side), stages))
            add(side, wall)
            add(side + "_cpu", cpu)
            for stage, seconds in stages.items():
                add(f"{side}_{stage}", seconds)
            del model
            gc.collect()
        # The way back, from a model just loaded (its arrays never read back to the host),
        # beside the machine's write limit of the same bytes.
        model = loaders.jaxshare()
        for side in ("save", "limit") if r % 2 == 0 else ("limit", "save"):
            if side == "limit":
                fig.setdefault("limits", []).append(  # type: ignore[arg-type]
                    write_limit(src / "model.safetensors", out / "copy.safetensors")
                )
                continue
            remove(dst)
            os.sync()
            save = functools.partial(loaders.bridge.save_hf, dst, model, layout="tunix")
            _, wall, cpu = timed_call(functools.partial(save, config=config))
            add("save", wall)
            add("save_cpu", cpu)
        del model
        gc.collect()
    out_bytes = sum(p.stat().st_size for p in dst.glob("*.safetensors"))
    remove(dst)
    print(json.dumps({**fig, "problems": problems, "back": back, "model_bytes": nbytes,
                      "out_bytes": out_bytes, "host_copies": copies}))  # fmt: skip


def child_only(side: str, model_dir: str) -> None:
    """One loader, once, in this fresh process (peakmem measures it); prints the bytes of
    the model it loaded, the seconds and this process's anonymous memory after imports."""
    loaders = Loaders(Path(model_dir))
    before = rss_anon_mb()
    start = time.perf_counter()
    model = getattr(loaders, side)()
    seconds = time.perf_counter() - start
    print(json.dumps({"work_s": seconds, "model_bytes": model_bytes(loaders, model),
                      "imports_mb": before}))  # fmt: skip


def child(op: str, *rest: str) -> None:
    if op == "build":
        build(Path(rest[0]), json.loads(rest[1]))
    elif op == "time":
        child_time(*rest)
    elif op == "only":
        child_only(*rest)
    else:
        raise SystemExit(f"unknown child {op!r}")


# --- the run ----------------------------------------------------------------


def env() -> dict:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
    return child_env(**HF_QUIET, XLA_FLAGS=flags.strip())


def run_json(cmd: list[str], what: str) -> dict:
    """Runs ``cmd``: the last JSON line it printed; SystemExit with its output if none."""
    run = subprocess.run(cmd, capture_output=True, text=True, env=env(), check=False)
    found = last_json(run.stdout)
    if run.returncode != 0 or found is None:
        output = f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
        raise SystemExit(f"{what} failed ({run.returncode}):\n{output}")
    return found


def memory(args: argparse.Namespace, model: Path) -> dict[str, list[dict]]:
    """Each loader alone in a fresh process under peakmem, ``--mem-rounds`` times,
    alternating who goes first."""
    found: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(args.mem_rounds):
        for side in list(SIDES)[:: 1 if r % 2 == 0 else -1]:
            cmd = [args.python, __file__, "--child", "only", side, str(model)]
            run, stats = peakmem(cmd, env())
            printed = last_json(run.stdout)
            if run.returncode != 0 or stats is None or printed is None:
                raise SystemExit(f"{side} alone failed ({run.returncode}):\n{run.stderr[-5000:]}")
            found[side].append({**stats, **printed})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=20, help="28 is Qwen3-0.6B's")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of each loader")
    ap.add_argument("--mem-rounds", type=int, default=2, help="peakmem runs of each loader")
    ap.add_argument("--dir", default=None, help="where the cached model and outputs go")
    ap.add_argument("--python", default=venv_python(".venv"), help="runs the measured processes")
    ap.add_argument("--quick", action="store_true", help="a small model, one round: a smoke run")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    if args.quick:
        args.layers, args.hidden, args.intermediate, args.vocab = 2, 256, 768, 8192
        args.heads, args.kv_heads, args.head_dim, args.rounds, args.mem_rounds = 8, 4, 32, 1, 1
    compiled()
    config = qwen3_config(args)
    specs = qwen3_specs(config)
    sizes = [2 * math.prod(s) for _, s in specs]
    total, largest = sum(sizes), max(sizes)
    model = cached_model(args, config)
    print(
        f"Model: Qwen3, hidden {args.hidden}, {args.layers} layers, {args.heads} heads / "
        f"{args.kv_heads} kv heads of {args.head_dim}, MLP {args.intermediate}, vocabulary "
        f"{args.vocab}, tied, bfloat16: {total / GB:.2f} GB ({total / MB:.0f} MiB) in "
        f"{len(specs)} tensors, largest {largest / MB:.0f} MiB; {model}. Mesh "
        f"{MESH[0]} x {MESH[1]} (fsdp, tp) of {DEVICES} CPU devices; {os.cpu_count()} cores.",
        flush=True,
    )
    loads = [os.getloadavg()]
    out = Path(tempfile.mkdtemp(prefix="tunix_load_", dir=args.dir))
    try:
        cmd = [args.python, __file__, "--child", "time", str(model), str(args.rounds), str(out)]
        timed = run_json(cmd, "the timed run")
        loads.append(os.getloadavg())
        mem = memory(args, model)
        loads.append(os.getloadavg())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    report(args, timed, mem, largest, loads)
    if timed["problems"] or timed["back"] != ["identical"]:
        sys.exit(1)


def report(args, timed: dict, mem: dict, largest: int, loads: list) -> None:
    med = statistics.median

    def ratio(a: str, b: str) -> float:  # The median of the per-round ratios.
        return med(x / y for x, y in zip(timed[a], timed[b], strict=True))

    def beyond(side: str) -> float:  # The highest peak anon less the model's bytes.
        return max(m["peak_anon_mb"] for m in mem[side]) - mem[side][0]["model_bytes"] / MB

    build, load = timed["jaxshare_build"], timed["jaxshare_load"]
    timed["jaxshare_whole"] = [b + lo for b, lo in zip(build, load, strict=True)]
    timed["limit"] = limits = [min(way.values()) for way in timed["limits"]]
    goal_mb = 2 * largest / MB + GOAL_OVERHEAD_MB
    print(
        f"\nGoals: load time jaxshare/Tunix <= {GOAL_LOAD}; peak anon beyond the model's bytes "
        f"<= 2 x largest + {GOAL_OVERHEAD_MB} MiB = {goal_mb:.0f} MiB; save_hf <= {GOAL_SAVE}x "
        f"the write limit. {args.rounds} round(s), order alternating. " + load_average(loads)
    )
    check = "; ".join(timed["problems"][:5]) or "bit-identical (paths, dtypes, shardings, bits)"
    print(f"Tunix's model against jaxshare's: {check}.")
    print(f"save_hf's output against the input's tensors: {'; '.join(timed['back'][:5])}.")
    head = f"\n{'':44} {'time s':>6} {'cpu s':>6} {'ratio':>6} {'cpu ratio':>9}  "
    head += f"{'peak anon MiB':>13} {'imports':>7} {'beyond model':>12}  verdict"
    print(head)
    print("-" * len(head))

    def row(name: str, key: str, ratios: str = "", side: str = "") -> str:
        cpu = f"{med(timed[key + '_cpu']):6.2f}" if key + "_cpu" in timed else f"{'':6}"
        line = f"{name:44} {med(timed[key]):6.2f} {cpu} {ratios:16}"
        if side:
            peak = max(m["peak_anon_mb"] for m in mem[side])
            imports = med(m["imports_mb"] for m in mem[side])
            line += f"  {peak:13.0f} {imports:7.0f} {beyond(side):12.0f}"
        return line

    print(row(SIDES["tunix"], "tunix", side="tunix"))
    loaded = ratio("jaxshare_load", "tunix")
    misses = [f"time MISSED (goal {GOAL_LOAD})"] if loaded > GOAL_LOAD else []
    if beyond("jaxshare") > goal_mb:
        misses.append(f"memory MISSED by {beyond('jaxshare') - goal_mb:.0f} MiB")
    ratios = f"{loaded:6.2f} {ratio('jaxshare_load_cpu', 'tunix_cpu'):9.2f}"
    line = row("jaxshare: to_flax(like=) + nnx.update", "jaxshare_load", ratios, "jaxshare")
    print(line + "  " + ("; ".join(misses) or "met"))
    build_ratios = f"{ratio('jaxshare_build', 'tunix'):6.2f}"
    print(row("  the abstract model, built as Tunix does", "jaxshare_build", build_ratios))
    whole = f"{ratio('jaxshare_whole', 'tunix'):6.2f}"
    print(row("  both: the whole load", "jaxshare_whole", whole))
    save = ratio("save", "limit")
    verdict = "  met" if save <= GOAL_SAVE else f"  MISSED (goal {GOAL_SAVE}x)"
    print(row("bridge.save_hf(layout=tunix) / write limit", "save", f"{save:6.2f}") + verdict)
    way = min(timed["limits"][0], key=timed["limits"][0].__getitem__)
    print(
        row("  the machine: write + fsync, the best way", "limit")
        + f"({timed['out_bytes'] / GB:.2f} GB written; the best way in round 1: {way})"
    )
    print(
        f"\nModel bytes on the devices: {timed['model_bytes'] / MB:.0f} MiB. time: medians over "
        "rounds, each call until every parameter is ready (imports and a warm-up excluded); cpu: "
        "the process's CPU seconds (every thread) during the call; ratio: median of per-round "
        "ratios (jaxshare / Tunix; save_hf / the write limit measured beside it). peak anon: the "
        "highest of the fresh processes (peakmem, 10 ms samples; jaxshare's builds the abstract "
        "model too); imports: RssAnon + RssShmem after imports; beyond model: peak anon - the "
        "model's bytes. save_hf writes a model just loaded (its arrays never read to the host)."
    )
    if timed["host_copies"]:
        print(
            f"After save_hf, jax keeps host copies of {timed['host_copies'] / MB:.0f} MiB on the "
            "model's arrays (np.asarray caches one on each array it reads)."
        )
    rounds = zip(timed["tunix"], load, build, strict=True)
    found = [f"Tunix {t:.2f}, jaxshare {lo:.2f} + {b:.2f} ({lo / t:.2f}; {(lo + b) / t:.2f})"
             for t, lo, b in rounds]  # fmt: skip
    print("Per round, load s (jaxshare: to_flax + update, + building): " + "; ".join(found))
    found = [f"{s:.2f} / {w:.2f} ({s / w:.2f})" for s, w in zip(timed["save"], limits, strict=True)]
    print("Per round, save_hf s / write limit s: " + "; ".join(found))
    found = [f"{side} " + ", ".join(f"{m['peak_anon_mb']:.0f}" for m in mem[side]) for side in mem]
    print("Peak anon per run, MiB: " + "; ".join(found))


if __name__ == "__main__":
    main()
