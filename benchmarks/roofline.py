"""Each conversion route against the machine's own limit, in one run on one disk.

The machine's limits, measured on the same disk and cores as the routes:

- **read**: ``cat FILE > /dev/null`` of the model file, cold (its pages dropped
  with ``posix_fadvise(DONTNEED)`` after a ``sync``) and warm (read once before);
- **write + fsync**: ``cp`` of the same bytes to a new file, then ``fsync`` of it
  (the source warm, so this is the write);
- **transpose** and **cast**: every 2-D float32 tensor of the model's shapes
  transposed into a contiguous copy (and cast to bfloat16), the best of numpy on
  threads (output rows split over the cores), jaxshare's tiled copy into buffers
  kept hot, and XLA (``jax.jit``);
- **zstd**: level 1 (Orbax's) compressing and decoding, every core at once.

Then each route runs as a user runs it, ``jaxshare convert SRC DST`` in a fresh
process (start-up and imports included), cold and warm (its inputs' pages
dropped, or read just before), ``sync`` before each run; ``--rounds`` times each
(default 2), and the best counts, as for each limit (the best of two):

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

A route's **limit** is the slowest stage a perfect pipeline cannot avoid, its
**ratio** its time over that limit (goals, from issue 22: <= 1.25x where the cores
have no work, <= 1.5x where they transpose or run zstd). The disk's speed moves by
a third within the hour here, so the way of writing (the source warm) that won at
the start, and the ``O_DIRECT`` cold copy, are run again just before each of a
route's runs, warm and cold in turn, and the verdict holds the route to the disk as
it was then (``limit``, ``ratio``; ``run``: the ratio with the disk as measured at
the start). Limits:

- **issue**: as issue 22 defines it, the max of reading the input with ``cat``,
  writing + fsyncing the output with ``cp`` and transposing what the plan
  transposes (the fastest transpose measured);
- **limit** (the verdict's): the machine's own, the max of reading the input and
  writing + fsyncing the output the fastest way measured -- ``cat`` and ``cp``, or
  the device driven for speed: read with four 16 MiB ``preadv`` s in flight,
  written with ``dd oflag=direct`` or handed to the disk as it is written
  (``sync_file_range``, its pages dropped once on disk); ``cp`` leaves the disk
  idle until the ``fsync`` and fills the page cache with the copy -- of, from a
  cold input, moving the input's and the output's bytes as a cold copy moves them
  (the disk's reads and writes share its bandwidth: a cold copy takes about as long
  as its read and its write one after the other), and of the cores' work: the
  transposes plus zstd at Orbax's level, compressing an item's chunks or decoding
  them (both share the cores, so their times add; measured on every core at once,
  on 16 MiB chunks of random normal float32).

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
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import stream_convert
from stream_convert import ROOT, compiled, remove

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
    return cp_seconds(src, dst)


def cp_seconds(src: Path, dst: Path) -> float:
    """``cp`` + ``fsync`` of ``src`` to ``dst`` as it is (warm or cold); ``dst`` removed."""
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


def direct_write_seconds(src: Path, dst: Path) -> float:
    """``dd oflag=direct`` of ``src`` (warm) to ``dst``, then ``fsync``; ``dst`` removed."""
    warm(src)
    os.sync()
    start = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=16M", "oflag=direct", "conv=fsync",
                    "status=none"], check=True)  # fmt: skip
    seconds = time.perf_counter() - start
    dst.unlink()
    return seconds


def behind_write_seconds(src: Path, dst: Path) -> float:
    """``src`` (warm) copied to ``dst`` by a writer that hands each 32 MiB to the disk
    as it is written (``sync_file_range``), waits for the one two steps back and
    drops its pages, then ``fsync``; ``dst`` removed."""
    warm(src)
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
    seconds = time.perf_counter() - start
    dst.unlink()
    return seconds


def cold_cp_seconds(src: Path, dst: Path) -> float:
    """``cp`` + ``fsync`` of ``src``, cold. A route from a cold input reads and writes
    one disk, whose reads and writes share its bandwidth: here a cold copy takes
    about as long as the read and the write one after the other."""
    drop_cache(src)
    return cp_seconds(src, dst)


def direct_copy_seconds(src: Path, dst: Path) -> float:
    """``src``, cold, copied by four 16 MiB ``O_DIRECT`` reads in flight, each block
    written (``O_DIRECT``) as it comes, then ``fsync``; ``dst`` removed."""
    drop_cache(src)
    step, size = 16 << 20, src.stat().st_size
    fin = os.open(src, os.O_RDONLY | os.O_DIRECT)
    fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    offsets = iter(range(0, size, step))
    done: dict[int, tuple[mmap.mmap, int]] = {}
    free = [mmap.mmap(-1, step) for _ in range(12)]
    cond = threading.Condition()
    try:
        start = time.perf_counter()

        def read() -> None:
            while True:
                with cond:  # A buffer first, then the next offset: taken in order.
                    while not free:
                        cond.wait()
                    offset = next(offsets, None)
                    if offset is None:
                        return
                    buf = free.pop()
                n = os.preadv(fin, [buf], offset)
                with cond:
                    done[offset] = (buf, n)
                    cond.notify_all()

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for offset in range(0, size, step):
            with cond:
                while offset not in done:
                    cond.wait()
                buf, n = done.pop(offset)
            os.pwrite(fout, memoryview(buf)[: -(-n // 4096) * 4096], offset)
            with cond:
                free.append(buf)
                cond.notify_all()
        for t in threads:
            t.join()
        os.ftruncate(fout, size)
        os.fsync(fout)
        seconds = time.perf_counter() - start
    finally:
        os.close(fin)
        os.close(fout)
    dst.unlink()
    return seconds


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

    from jaxshare.io.transpose import contiguous_transpose

    hot = {s: np.zeros(s[::-1], np.float32) for s in set(shapes)}  # Buffers kept hot.

    def tiled_transpose(x):  # jaxshare's: tiles that stay in cache, on threads
        return contiguous_transpose(x, (1, 0), out=hot[x.shape])

    out = {
        "transpose_numpy": total(numpy_transpose),
        "transpose_tiles": total(tiled_transpose),
        "transpose_xla": total(via_xla(xla_t)),
        "cast_numpy": total(numpy_cast),
        "cast_xla": total(via_xla(xla_c)),
        "bytes": sum(4 * math.prod(s) for s in shapes),
        **zstd_seconds(pool, rng),
    }
    print(json.dumps(out))


def zstd_seconds(pool, rng) -> dict:
    """The cores' zstd throughput at Orbax's level (1), compressing and decoding
    16 MiB chunks of the model's kind of values (random normal float32) on every
    core at once, seconds per byte."""
    import numpy as np
    import zstandard

    chunks = [(rng.standard_normal(4 << 20) * 0.02).astype(np.float32).tobytes()
              for _ in range(8)]  # fmt: skip
    local = threading.local()

    def compress(raw):
        c = getattr(local, "c", None) or zstandard.ZstdCompressor(level=1)
        local.c = c
        return c.compress(raw)

    def decompress(frame):
        out = bytearray(16 << 20)
        with zstandard.ZstdDecompressor().stream_reader(frame) as reader:
            reader.readinto(out)
        return out

    frames = list(pool.map(compress, chunks))
    best = {"compress": math.inf, "decompress": math.inf}
    for _ in range(3):
        for kind, fn, items in (("compress", compress, chunks), ("decompress", decompress, frames)):
            start = time.perf_counter()
            list(pool.map(fn, items))
            best[kind] = min(best[kind], time.perf_counter() - start)
    nbytes = sum(len(c) for c in chunks)
    return {f"zstd_{k}_per_byte": v / nbytes for k, v in best.items()}


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
        "    if plan is None:  # Flax names: each alias written out, transposed where it is.\n"
        "        n = sum(math.prod(s.infos[c].shape) * 4 for a, c in s.ties.items() "
        "if s.ties.transform(a) is not None)\n"
        "    else:\n"
        "        n = sum(math.prod(s.infos[e.source].shape) * 4 "
        "for e in plan.entries if e.perm is not None and e.source in s.infos)\n"
        "print(n)\n"
    )
    argv = [sys.executable, "-c", code, str(src), str(names), "1" if to_flax else "0"]
    run = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    if run.returncode:
        return -1
    return int(run.stdout.strip().splitlines()[-1])


# --- the run -----------------------------------------------------------------------

# name: (input kind, output name, extra args, plan: to_flax / torch names / none,
#        zstd work: compressing the output item / decoding the input item / none)
ROUTES = {
    "safetensors -> Orbax": ("model", "ckpt", [], "flax", "compress"),
    "HF directory -> Orbax": ("hf", "ckpt_hf", [], "flax", "compress"),
    "Orbax -> safetensors": ("ckpt", "out.safetensors", [], None, "decompress"),
    "Orbax -> safetensors, torch names": (
        "ckpt", "out.safetensors", ["--names", "torch"], "torch", "decompress",
    ),
    "Orbax -> HF directory": ("ckpt_hf", "out_hf", ["--format", "hf"], "torch", "decompress"),
    "DeepSpeed -> safetensors": ("deepspeed", "out.safetensors", [], None, None),
    "PyTorch file -> Orbax": ("pt", "ckpt_pt", [], "flax", "compress"),
    "DCP -> Orbax": (
        "dcp", "ckpt_dcp", ["--tie", "lm_head.weight=model.embed_tokens.weight"], "flax",
        "compress",
    ),
    # The same item routes with the chunks stored raw: no zstd.
    "safetensors -> Orbax, raw": ("model", "ckpt_raw", ["--compression", "none"], "flax", None),
    "Orbax raw -> safetensors, torch": (
        "ckpt_raw", "out.safetensors", ["--names", "torch"], "torch", None,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Machine:
    """The machine's limits, as measured in this run (bytes per second; zstd in
    seconds per byte, every core at work)."""

    cat: dict  # read by `cat`, cold and warm
    cp: float  # write + fsync by `cp`
    read: dict  # read, the faster of `cat` and the device driven for speed
    write: float  # write + fsync, the faster of `cp` and the device driven for speed
    copy: float  # a cold source copied (read and write share the disk), the faster way
    transpose: float  # the fastest transposing copy measured
    zstd: dict  # {"compress": s/B, "decompress": s/B}


@dataclass(frozen=True)
class Row:
    name: str
    state: str
    seconds: float
    nin: int
    nout: int
    moved: int  # bytes transposed
    codec: str | None  # zstd work: "compress", "decompress" or none
    issue: dict  # the issue's stages: cat, cp, transpose
    machine: dict  # the machine's: best read, best write, the cores' work (transposes + zstd)
    beside: dict  # the same, the disk's write (warm) or cold copy measured beside the route
    load: float

    @property
    def cpu(self) -> bool:
        return bool(self.moved or self.codec)


def stages(machine: Machine, state: str, nin: int, nout: int, moved: int, codec: str | None):
    """The issue's stages (``cat``, ``cp``, transposes) and the machine's (the best
    read and write measured, and the cores' work: transposes plus zstd, which
    share the cores, so their times add), in seconds."""
    transpose = moved / machine.transpose
    issue = {"read": nin / machine.cat[state], "write": nout / machine.cp, "cpu": transpose}
    zstd = 0.0 if codec is None else max(nin, nout) * machine.zstd[codec]
    best = {"read": nin / machine.read[state], "write": nout / machine.write,
            "cpu": transpose + zstd}  # fmt: skip
    if state == "cold":  # Read and written on one disk: the bytes of both, as a copy moves them.
        best["copy"] = (nin + nout) / (2 * machine.copy)
    return issue, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="2.8", help="model size, GB")
    ap.add_argument("--dir", default=None, help="where the temporary files go")
    ap.add_argument("--quick", action="store_true", help="a small model: a smoke run")
    ap.add_argument("--routes", nargs="*", default=None, help="only these routes (by name)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of each route, cold and warm; the best counts (default 2)",
    )
    ap.add_argument("--compute-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compute_child:
        return compute_child(args.compute_child)
    compiled()
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
        # The machine: the cores first. Their child's memory, freed, goes back to the
        # host on this virtual machine (free page reporting), and the first process to
        # use it again waits for the host: the disk's measures use it, not the first route.
        two_d = [s for _, s in specs if len(s) == 2]
        compute = compute_seconds(two_d)
        size = model.stat().st_size
        cold = read_seconds(model, cold=True)
        hot = min(read_seconds(model, cold=False) for _ in range(2))
        dev_read = min(device_read_seconds(model) for _ in range(2))
        # Writing (the source warm) and copying a cold source, each way the best of two.
        # The ways that win are run again beside each route's runs: the disk's speed
        # moves by a third within the hour, so a route is held to the disk it ran on.
        tmp = root / "copy"
        write_ways = {"cp": lambda: write_seconds(model, tmp),
                      "dd oflag=direct": lambda: direct_write_seconds(model, tmp),
                      "written behind": lambda: behind_write_seconds(model, tmp)}  # fmt: skip
        copy_ways = {"cp": lambda: cold_cp_seconds(model, tmp),
                     "O_DIRECT": lambda: direct_copy_seconds(model, tmp)}  # fmt: skip
        writes = {k: min(way() for _ in range(2)) for k, way in write_ways.items()}
        copies = {k: min(way() for _ in range(2)) for k, way in copy_ways.items()}
        write, dev_write = writes["cp"], min(writes["dd oflag=direct"], writes["written behind"])
        copy = min(copies.values())
        # (A cold copy beside a route is the O_DIRECT one: `cp`'s, which leaves the disk
        # idle until its fsync, took 2.7-7.7 s beside the routes of one run.)
        again = {"warm": write_ways[min(writes, key=writes.__getitem__)],
                 "cold": copy_ways["O_DIRECT"]}  # fmt: skip
        loads.append(os.getloadavg()[0])
        transposes = {k: compute["bytes"] / compute[f"transpose_{k}"]
                      for k in ("numpy", "tiles", "xla")}  # fmt: skip
        machine = Machine(
            cat={"cold": size / cold, "warm": size / hot},
            cp=size / write,
            read={"cold": size / min(cold, dev_read), "warm": size / hot},
            write=size / min(write, dev_write),
            copy=size / copy,
            transpose=max(transposes.values()),
            zstd={"compress": compute["zstd_compress_per_byte"],
                  "decompress": compute["zstd_decompress_per_byte"]},
        )  # fmt: skip
        c_bw = compute["bytes"] / min(compute["cast_numpy"], compute["cast_xla"])
        print(f"\nread (cat): cold {machine.cat['cold'] / GB:.2f} GB/s, "
              f"warm {machine.cat['warm'] / GB:.2f} GB/s; "
              f"write + fsync (cp): {machine.cp / GB:.2f} GB/s", flush=True)  # fmt: skip
        print(f"the device, driven for speed: read cold (4 x 16 MiB preadv in flight) "
              f"{size / dev_read / GB:.2f} GB/s; write + fsync (dd oflag=direct, or written "
              f"behind) {size / dev_write / GB:.2f} GB/s; a cold source copied (cp, or "
              f"4 x 16 MiB O_DIRECT reads in flight and O_DIRECT writes) "
              f"{machine.copy / GB:.2f} GB/s", flush=True)  # fmt: skip
        print("transpose: " + ", ".join(f"{k} {v / GB:.2f}" for k, v in transposes.items())
              + f" GB/s; zstd level 1 on {os.cpu_count()} cores: compress "
              f"{1 / machine.zstd['compress'] / GB:.2f}, decode "
              f"{1 / machine.zstd['decompress'] / GB:.2f} GB/s; cast to bf16: "
              f"{c_bw / GB:.2f} GB/s (load {loads[-1]:.1f})\n", flush=True)  # fmt: skip
        print(f"beside each route, the disk again: written ({min(writes, key=writes.__getitem__)}) "
              "before each warm run, copied cold (O_DIRECT) "
              "before each cold run\n", flush=True)  # fmt: skip
        inputs = {"model": model}
        rows = []
        routes = {n: r for n, r in ROUTES.items() if not args.routes or n in args.routes}
        read_later = {kind for kind, *_ in routes.values()}  # Outputs kept for later routes.
        last_reader = {kind: name for name, (kind, *_) in routes.items()}
        for name, (kind, out, extra, plan, codec) in routes.items():
            if kind not in inputs:
                inputs[kind] = make_input(kind, root, model, config)
            src = inputs[kind]
            dst = root / out
            moved = transposed_bytes(src, plan, plan == "flax") if plan or kind == "ckpt" else 0
            nbytes_in = size_of(src)
            for state in ("cold", "warm"):
                times, disk = [], []
                for _ in range(args.rounds):  # The best, as each limit is the best of two.
                    disk.append(again[state]())  # The disk, just before the route.
                    remove(dst)
                    drop_cache(src) if state == "cold" else warm(src)
                    times.append(convert([str(src), str(dst), "--quiet", *extra]))
                seconds = min(times)
                if args.rounds > 1:
                    print(f"  ({name}, {state}: " + ", ".join(f"{t:.2f}" for t in times)
                          + " s; the disk beside: " + ", ".join(f"{t:.2f}" for t in disk)
                          + " s)", flush=True)  # fmt: skip
                nbytes_out = size_of(dst)
                issue, best = stages(machine, state, nbytes_in, nbytes_out, moved, codec)
                disk_now = {"cold": "copy", "warm": "write"}[state]
                now = replace(machine, **{disk_now: size / min(disk)})
                _, beside = stages(now, state, nbytes_in, nbytes_out, moved, codec)
                rows.append(Row(name, state, seconds, nbytes_in, nbytes_out, moved, codec,
                                issue, best, beside, os.getloadavg()[0]))  # fmt: skip
                print(format_row(rows[-1]), flush=True)
            # Keep the outputs later routes read; remove each input after its last reader.
            if out in read_later:
                inputs[out] = dst
            else:
                remove(dst)
            if kind != "model" and last_reader[kind] == name:
                remove(inputs.pop(kind))
        met = sum(verdict(r) == "met" for r in rows)
        print(f"\n{met} of {len(rows)} met. Goals: <= {GOAL_PLAIN}x the machine's limit where "
              f"the cores have no work, <= {GOAL_TRANSPOSED}x where they transpose or run zstd. "
              "time: the whole `jaxshare convert` process. issue: the ratio to the issue's "
              "limit; run: to the machine's limit with the disk as measured at the start; "
              "limit, ratio: with the disk as measured beside the route.")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


HEAD = (f"{'route':34} {'cache':5} {'time s':>7} {'GB in':>6} {'GB out':>6} {'GB/s':>5} "
        f"{'T GB':>5} {'zstd':>10}  {'issue':>6}  {'run':>6}  {'limit s':>7} {'bound':5} "
        f"{'ratio':>6}  {'load':>4}  verdict")  # fmt: skip


def verdict(row: Row) -> str:
    goal = GOAL_TRANSPOSED if row.cpu else GOAL_PLAIN
    ratio = row.seconds / max(row.beside.values())
    return "met" if ratio <= goal else f"MISSED (goal {goal}x)"


def format_row(row: Row) -> str:
    if format_row.first:
        print(HEAD)
        print("-" * len(HEAD))
        format_row.first = False
    bound = max(row.beside, key=row.beside.__getitem__)
    limit = row.beside[bound]
    issue = row.seconds / max(row.issue.values())
    run = row.seconds / max(row.machine.values())
    return (f"{row.name:34} {row.state:5} {row.seconds:7.2f} {row.nin / GB:6.2f} "
            f"{row.nout / GB:6.2f} {max(row.nin, row.nout) / row.seconds / GB:5.2f} "
            f"{row.moved / GB:5.2f} {row.codec or '-':>10}  {issue:5.2f}x  {run:5.2f}x  "
            f"{limit:7.2f} {bound:5} {row.seconds / limit:5.2f}x  {row.load:4.1f}  "
            f"{verdict(row)}")  # fmt: skip


format_row.first = True  # type: ignore[attr-defined]

if __name__ == "__main__":
    main()
