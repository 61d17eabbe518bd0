"""Each conversion route against the machine's own limit, in one run on one disk.

The machine's limits, measured on the same disk and cores as the routes:

- **read**: ``cat FILE > /dev/null`` of the model file, cold (its pages dropped
  with ``posix_fadvise(DONTNEED)`` after a ``sync``) and warm (read once before);
- **write + fsync**: ``cp`` of the same bytes to a new file, then ``fsync`` of it
  (the source warm, so this is the write);
- **transpose** and **cast**: every 2-D float32 tensor of the model's shapes
  transposed into a contiguous copy (and cast to bfloat16), the best of numpy on
  threads (output rows split over the cores) and XLA (``jax.jit``).

Then each route runs as a user runs it, ``jaxshare convert SRC DST`` in a fresh
process (start-up and imports included), cold and warm (its inputs' pages
dropped, or read just before), ``sync`` before each run:

=============================  =============================================
route                          input
=============================  =============================================
safetensors -> Orbax           the model file (PyTorch names, the head tied)
HF directory -> Orbax          the same file (hard-linked) + a Llama ``config.json``
Orbax -> safetensors           the item written by safetensors -> Orbax
Orbax -> safetensors, torch    the same item, ``--names torch``
Orbax -> HF directory          the item written by HF directory -> Orbax (it carries
                               ``config.json``), ``--format hf``
DeepSpeed -> safetensors       a ZeRO-0 folder (``mp_rank_00_model_states.pt``, by torch)
PyTorch file -> Orbax          ``torch.save`` of the state dict
DCP -> Orbax                   the DCP folder ``jaxshare convert --format dcp`` writes
safetensors -> Orbax, raw      the model file, ``--compression none`` (chunks not zstd'd)
Orbax raw -> safetensors,      the item written by the route above, ``--names torch``
torch
=============================  =============================================

A route's **limit** is the slowest stage a perfect pipeline cannot avoid: the max
of reading its input, writing + fsyncing its output, and (where its plan
transposes or casts) transposing those bytes; its **ratio** is its time over that
limit (goals, from issue 22: <= 1.25x without transposes, <= 1.5x with them).

``cat`` and ``cp`` are what the issue names, but not what the device can do:
``cp`` leaves the disk idle until the ``fsync`` and fills the page cache with the
copy. So the device is measured too, driven for speed -- read with four 16 MiB
``preadv`` s in flight, written with ``dd oflag=direct`` or handed to the disk as
it is written (``sync_file_range``, its pages dropped once on disk), the faster --
and the **device** column is each route's time over the limit those give.

The model is GPT-2-XL-shaped -- width 1600, vocabulary 50257, 12 x 1600^2 weights
per block -- in Hugging Face Llama names and Linear layouts (``q/k/v/o_proj`` 1600 x
1600, ``gate/up/down_proj`` 1600 x 4264, so that every block weight is transposed on
the way to Flax, as a Llama's is), ``lm_head`` tied to the embedding, float32 with
random values: ``--size 2.8`` (20 blocks, 2.8 GB) or ``--size 8`` (63 blocks, 8.0
GB), written by numpy into a temporary directory (``--dir``); a
route's inputs are made just before it and removed after, so the disk holds at
most the model, two items and one more copy. ``--quick`` is a small smoke run.
The load average is printed with each figure (other jobs may share the machine).

    python benchmarks/roofline.py --size 2.8        # ~20 GB of free disk
    python benchmarks/roofline.py --quick
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import stream_convert
from stream_convert import ROOT, remove

GB = 1e9
GOAL_PLAIN, GOAL_TRANSPOSED = 1.25, 1.5
SIZES = {"2.8": 20, "8": 63}  # blocks at width 1600
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
JAXSHARE = [sys.executable, "-m", "jaxshare.cli"]


# --- the machine --------------------------------------------------------------------


def files_of(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in files_of(path))


def drop_cache(path: Path) -> None:
    """Drops the (clean, after a sync) page-cache pages of every file under ``path``."""
    os.sync()
    for p in files_of(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(path: Path) -> None:
    for p in files_of(path):
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)


def read_seconds(path: Path, *, cold: bool) -> float:
    drop_cache(path) if cold else warm(path)
    start = time.perf_counter()
    for p in files_of(path):
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def write_seconds(src: Path, dst: Path) -> float:
    """``cp`` + ``fsync`` of ``src`` (warm) to ``dst``."""
    warm(src)
    os.sync()
    start = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - start
    dst.unlink()
    return seconds


def device_read_seconds(path: Path) -> float:
    """The file read cold as a loader tuned for the device reads it: 16 MiB
    ``preadv`` s into reused buffers, four in flight (``cat`` has one)."""
    drop_cache(path)
    step, size = 16 << 20, path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()

        def read(offsets: range) -> None:
            buf = bytearray(step)
            for offset in offsets:
                os.preadv(fd, [buf], offset)

        threads = [threading.Thread(target=read, args=(range(k * step, size, 4 * step),))
                   for k in range(4)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start
    finally:
        os.close(fd)


def device_write_seconds(src: Path, dst: Path) -> float:
    """The same bytes copied as a writer tuned for the device writes them (the
    source warm): ``dd oflag=direct`` (no page cache), and a copy that hands each
    32 MiB to the disk as it is written (``sync_file_range``), waits for the one
    two steps back and drops its pages -- whichever is faster -- then ``fsync``."""
    warm(src)
    os.sync()
    start = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=16M", "oflag=direct", "conv=fsync",
                    "status=none"], check=True)  # fmt: skip
    direct = time.perf_counter() - start
    dst.unlink()
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    step = 32 << 20
    start = time.perf_counter()
    with open(src, "rb", buffering=0) as f, open(dst, "wb", buffering=0) as out:
        fd, offset, buf = out.fileno(), 0, bytearray(step)
        while n := f.readinto(buf):
            out.write(memoryview(buf)[:n])
            libc.sync_file_range(fd, offset, n, 2)  # SYNC_FILE_RANGE_WRITE
            if offset >= 2 * step:
                libc.sync_file_range(fd, offset - 2 * step, step, 7)  # wait for it
                os.posix_fadvise(fd, offset - 2 * step, step, os.POSIX_FADV_DONTNEED)
            offset += n
        os.fsync(fd)
    behind = time.perf_counter() - start
    dst.unlink()
    return min(direct, behind)


def compute_child(shapes_json: str) -> None:
    """Transpose and cast throughput of the 2-D float32 tensors of these shapes, the
    best of numpy threads and XLA; prints JSON seconds per tensor kind."""
    import concurrent.futures as cf

    import jax
    import ml_dtypes
    import numpy as np

    shapes = [tuple(s) for s in json.loads(shapes_json)]
    cores = os.cpu_count() or 1
    pool = cf.ThreadPoolExecutor(cores)
    rng = np.random.default_rng(0)
    arrays = {s: rng.random(s, dtype=np.float32) for s in set(shapes)}

    def numpy_transpose(x):
        out = np.empty(x.shape[::-1], x.dtype)
        rows = np.array_split(np.arange(out.shape[0]), cores)
        list(pool.map(lambda r: np.copyto(out[r[0] : r[-1] + 1], x[:, r[0] : r[-1] + 1].T), rows))
        return out

    def numpy_cast(x):
        out = np.empty(x.shape, ml_dtypes.bfloat16)
        rows = np.array_split(np.arange(x.shape[0]), cores)

        def part(r):
            np.copyto(out[r[0] : r[-1] + 1], x[r[0] : r[-1] + 1], casting="unsafe")

        list(pool.map(part, rows))
        return out

    xla_t = jax.jit(lambda x: x.T)
    xla_c = jax.jit(lambda x: x.astype(jax.numpy.bfloat16))

    def via_xla(f):
        return lambda x: np.asarray(f(jax.device_put(x)))

    def total(fn) -> float:
        for s in arrays:  # compile / warm up once per shape
            fn(arrays[s])
        best = math.inf
        for _ in range(2):
            start = time.perf_counter()
            for s in shapes:
                fn(arrays[s])
            best = min(best, time.perf_counter() - start)
        return best

    out = {
        "transpose_numpy": total(numpy_transpose),
        "transpose_xla": total(via_xla(xla_t)),
        "cast_numpy": total(numpy_cast),
        "cast_xla": total(via_xla(xla_c)),
        "bytes": sum(4 * math.prod(s) for s in shapes),
    }
    print(json.dumps(out))


def compute_seconds(shapes: list[tuple[int, ...]]) -> dict:
    run = subprocess.run(
        [sys.executable, __file__, "--compute-child", json.dumps(shapes)],
        capture_output=True, text=True, env=ENV, check=True,
    )  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


# --- the inputs -------------------------------------------------------------------


def model_specs(vocab: int, width: int, blocks: int, inner: int) -> list[tuple[str, tuple]]:
    """``(name, shape)`` of a Llama state dict; the tied ``lm_head.weight`` is not
    among them (stored once, as the embedding)."""
    d = width
    specs = [("model.embed_tokens.weight", (vocab, d))]
    for i in range(blocks):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", (d,))]
        specs += [(p + f"self_attn.{x}_proj.weight", (d, d)) for x in "qkvo"]
        specs += [(p + "post_attention_layernorm.weight", (d,))]
        specs += [(p + f"mlp.{x}_proj.weight", (inner, d)) for x in ("gate", "up")]
        specs += [(p + "mlp.down_proj.weight", (d, inner))]
    return specs + [("model.norm.weight", (d,))]


def write_model(path: Path, specs: list[tuple[str, tuple]]) -> None:
    """Writes the model one tensor at a time (random float32), the head tied to
    the embedding in the file's metadata, in Llama names."""
    stream_convert.write_model(path, specs, embedding="model.embed_tokens.weight")


def llama_config(width: int, blocks: int, vocab: int, inner: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": width,
        "num_hidden_layers": blocks, "num_attention_heads": width // 64,
        "num_key_value_heads": width // 64, "intermediate_size": inner, "vocab_size": vocab,
        "max_position_embeddings": 1024, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "torch_dtype": "float32",
    }  # fmt: skip


TORCH_WRITER = """
import sys, torch
from safetensors.torch import load_file
sd = load_file(sys.argv[1])
sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
if sys.argv[3] == "deepspeed":
    sd = {"module": sd, "ds_version": "0.19.8", "mp_world_size": 1, "dp_world_size": 1}
torch.save(sd, sys.argv[2])
"""


def make_input(kind: str, root: Path, model: Path, config: dict) -> Path:
    """The input of a route (made before it, removed after it)."""
    if kind == "hf":
        d = root / "hf_in"
        d.mkdir()
        os.link(model, d / "model.safetensors")
        (d / "config.json").write_text(json.dumps(config))
        return d
    if kind == "pt":
        path = root / "model.pt"
        subprocess.run([sys.executable, "-c", TORCH_WRITER, str(model), str(path), "pt"],
                       check=True, env=ENV)  # fmt: skip
        return path
    if kind == "deepspeed":
        d = root / "ds_in"
        (d / "global_step1").mkdir(parents=True)
        (d / "latest").write_text("global_step1")
        path = d / "global_step1" / "mp_rank_00_model_states.pt"
        subprocess.run([sys.executable, "-c", TORCH_WRITER, str(model), str(path), "deepspeed"],
                       check=True, env=ENV)  # fmt: skip
        return d
    if kind == "dcp":
        d = root / "dcp_in"
        convert([str(model), str(d), "--format", "dcp", "--quiet"])
        return d
    raise ValueError(kind)


def convert(args: list[str]) -> float:
    start = time.perf_counter()
    run = subprocess.run([*JAXSHARE, "convert", *args], capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - start
    if run.returncode:
        raise RuntimeError(f"jaxshare convert {' '.join(args)} failed:\n{run.stderr[-3000:]}")
    return seconds


def transposed_bytes(src: Path, names: str | None, to_flax: bool) -> int:
    """Bytes the route's plan permutes (read from the plan, no tensor moved)."""
    code = (
        "import sys, math, json, bridge\n"
        "from jaxshare import checkpoint\n"
        "src, names, to_flax = sys.argv[1], sys.argv[2], sys.argv[3] == '1'\n"
        "with bridge.open_source(src) as s:\n"
        "    plan = bridge.flax_plan(s) if to_flax else (bridge.torch_plan(s) "
        "if names == 'torch' else None)\n"
        "    n = 0 if plan is None else sum(math.prod(s.infos[e.source].shape) * 4 "
        "for e in plan.entries if e.perm is not None and e.source in s.infos)\n"
        "print(n)\n"
    )
    argv = [sys.executable, "-c", code, str(src), str(names), "1" if to_flax else "0"]
    run = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    if run.returncode:
        return -1
    return int(run.stdout.strip().splitlines()[-1])


# --- the run -----------------------------------------------------------------------

# name: (input kind, output name, extra args, plan: to_flax / torch names / none)
ROUTES = {
    "safetensors -> Orbax": ("model", "ckpt", [], "flax"),
    "HF directory -> Orbax": ("hf", "ckpt_hf", [], "flax"),
    "Orbax -> safetensors": ("ckpt", "out.safetensors", [], None),
    "Orbax -> safetensors, torch names": ("ckpt", "out.safetensors", ["--names", "torch"], "torch"),
    "Orbax -> HF directory": ("ckpt_hf", "out_hf", ["--format", "hf"], "torch"),
    "DeepSpeed -> safetensors": ("deepspeed", "out.safetensors", [], None),
    "PyTorch file -> Orbax": ("pt", "ckpt_pt", [], "flax"),
    "DCP -> Orbax": (
        "dcp",
        "ckpt_dcp",
        ["--tie", "lm_head.weight=model.embed_tokens.weight"],
        "flax",
    ),
    # The same item routes with the chunks stored raw: zstd's CPU out of the way.
    "safetensors -> Orbax, raw": ("model", "ckpt_raw", ["--compression", "none"], "flax"),
    "Orbax raw -> safetensors, torch": (
        "ckpt_raw",
        "out.safetensors",
        ["--names", "torch"],
        "torch",
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="2.8", help="model size, GB")
    ap.add_argument("--dir", default=None, help="where the temporary files go")
    ap.add_argument("--quick", action="store_true", help="a small model: a smoke run")
    ap.add_argument("--routes", nargs="*", default=None, help="only these routes (by name)")
    ap.add_argument("--compute-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compute_child:
        return compute_child(args.compute_child)
    width, blocks, vocab, inner = 1600, SIZES[args.size], 50257, 4264
    if args.quick:
        width, blocks, vocab, inner = 256, 2, 5000, 680
    specs = model_specs(vocab, width, blocks, inner)
    total = sum(4 * math.prod(s) for _, s in specs)
    root = Path(tempfile.mkdtemp(prefix="roofline_", dir=args.dir))
    free = shutil.disk_usage(root).free
    print(f"model: width {width}, {blocks} blocks, vocabulary {vocab}, float32, "
          f"{total / GB:.2f} GB in {len(specs)} tensors; {free / GB:.0f} GB free under {root}; "
          f"{os.cpu_count()} cores", flush=True)  # fmt: skip
    if free < 4.5 * total:
        raise SystemExit(f"{root}: {free / GB:.1f} GB free, the run needs {4.5 * total / GB:.1f}")
    loads = [os.getloadavg()[0]]
    try:
        model = root / "model.safetensors"
        write_model(model, specs)
        config = llama_config(width, blocks, vocab, inner)
        # The machine.
        size = model.stat().st_size
        cold = read_seconds(model, cold=True)
        hot = min(read_seconds(model, cold=False) for _ in range(2))
        write = min(write_seconds(model, root / "copy") for _ in range(2))
        dev_read = min(device_read_seconds(model) for _ in range(2))
        dev_write = min(device_write_seconds(model, root / "copy") for _ in range(2))
        two_d = [s for _, s in specs if len(s) == 2]
        compute = compute_seconds(two_d)
        loads.append(os.getloadavg()[0])
        read_bw = {"cold": size / cold, "warm": size / hot}
        write_bw = size / write
        # The device, driven as well as we know: never slower than cat and cp.
        dev_bw = {"read": size / min(cold, dev_read), "write": size / min(write, dev_write)}
        t_bw = compute["bytes"] / min(compute["transpose_numpy"], compute["transpose_xla"])
        c_bw = compute["bytes"] / min(compute["cast_numpy"], compute["cast_xla"])
        print(f"\nread (cat): cold {read_bw['cold'] / GB:.2f} GB/s, "
              f"warm {read_bw['warm'] / GB:.2f} GB/s; "
              f"write + fsync (cp): {write_bw / GB:.2f} GB/s", flush=True)  # fmt: skip
        print(f"the device, driven for speed: read cold (4 x 16 MiB preadv in flight) "
              f"{size / dev_read / GB:.2f} GB/s; write + fsync (dd oflag=direct, or written "
              f"behind) {size / dev_write / GB:.2f} GB/s", flush=True)  # fmt: skip
        print(f"transpose: numpy threads {compute['bytes'] / compute['transpose_numpy'] / GB:.2f}, "
              f"XLA {compute['bytes'] / compute['transpose_xla'] / GB:.2f} GB/s; cast to bf16: "
              f"numpy threads {compute['bytes'] / compute['cast_numpy'] / GB:.2f}, "
              f"XLA {compute['bytes'] / compute['cast_xla'] / GB:.2f} GB/s "
              f"(load {loads[-1]:.1f})\n", flush=True)  # fmt: skip
        inputs = {"model": model}
        rows = []
        routes = {n: r for n, r in ROUTES.items() if not args.routes or n in args.routes}
        read_later = {kind for kind, *_ in routes.values()}  # Outputs kept for later routes.
        last_reader = {kind: name for name, (kind, *_) in routes.items()}
        for name, (kind, out, extra, plan) in routes.items():
            if kind not in inputs:
                inputs[kind] = make_input(kind, root, model, config)
            src = inputs[kind]
            dst = root / out
            moved = transposed_bytes(src, plan, plan == "flax") if plan else 0
            nbytes_in = size_of(src)
            for state in ("cold", "warm"):
                remove(dst)
                drop_cache(src) if state == "cold" else warm(src)
                seconds = convert([str(src), str(dst), "--quiet", *extra])
                nbytes_out = size_of(dst)
                limit = {
                    "read": nbytes_in / read_bw[state],
                    "write + fsync": nbytes_out / write_bw,
                    "transpose": moved / t_bw,
                }
                bound = max(limit, key=limit.__getitem__)
                device = max(
                    nbytes_in / (dev_bw["read"] if state == "cold" else read_bw["warm"]),
                    nbytes_out / dev_bw["write"],
                    moved / t_bw,
                )
                rows.append((name, state, seconds, nbytes_in, nbytes_out, moved, limit, bound,
                             device, os.getloadavg()[0]))  # fmt: skip
                print(format_row(rows[-1]), flush=True)
            # Keep the outputs later routes read; remove each input after its last reader.
            if out in read_later:
                inputs[out] = dst
            else:
                remove(dst)
            if kind != "model" and last_reader[kind] == name:
                remove(inputs.pop(kind))
        print(f"\ncast to bf16 (not on these routes; for --dtype): {c_bw / GB:.2f} GB/s. "
              f"Goals: <= {GOAL_PLAIN}x the limit without transposes, <= {GOAL_TRANSPOSED}x "
              "with them. time: the whole `jaxshare convert` process.")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


HEAD = (f"{'route':34} {'cache':5} {'time s':>7} {'GB in':>6} {'GB out':>6} {'GB/s':>5} "
        f"{'T GB':>5} {'limit s':>7} {'bound':13} {'ratio':>6}  {'device':>6}  {'load':>4}  "
        "verdict")  # fmt: skip


def format_row(row) -> str:
    name, state, seconds, nin, nout, moved, limit, bound, device, load = row
    lim = limit[bound]
    ratio = seconds / lim
    goal = GOAL_TRANSPOSED if moved else GOAL_PLAIN
    verdict = "met" if ratio <= goal else f"MISSED (goal {goal}x)"
    if format_row.first:
        print(HEAD)
        print("-" * len(HEAD))
        format_row.first = False
    return (f"{name:34} {state:5} {seconds:7.2f} {nin / GB:6.2f} {nout / GB:6.2f} "
            f"{max(nin, nout) / seconds / GB:5.2f} {moved / GB:5.2f} {lim:7.2f} {bound:13} "
            f"{ratio:5.2f}x  {seconds / device:5.2f}x  {load:4.1f}  {verdict}")  # fmt: skip


format_row.first = True  # type: ignore[attr-defined]

if __name__ == "__main__":
    main()
