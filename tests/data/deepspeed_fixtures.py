"""The driver both DeepSpeed fixture scripts share (``deepspeed/make_fixtures.py``,
``deepspeed_optim/make_fixtures.py``): the command line, the log, and each fixture
trained by the real DeepSpeed under ``torchrun`` in a temporary folder, then copied
into place. The scripts run as scripts, not as a package: each loads this file by its
path (``runpy.run_path``) and calls :func:`main`.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(script: str, name: str, world: int, out: Path, *, tries: int) -> None:
    """Fixture ``name`` trained by ``world`` ranks of ``script --worker`` under torchrun,
    which save its checkpoint to ``out``; run again up to ``tries`` times in all where
    it fails."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", str(world), "--master_port",
           str(_free_port()), script, "--worker", name, "--out", str(out)]  # fmt: skip
    for _ in range(tries):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if not run.returncode:
            return
    sys.stderr.write(run.stdout + run.stderr)
    raise SystemExit(f"{name}: training failed ({' '.join(cmd)})")


def main(
    script: str,
    doc: str,
    fixtures: Mapping[str, tuple],
    worker: Callable[[str, str], None],
    describe: Callable[[str], str],
    check: Callable[[str, Path, Callable[[str], None]], None],
    *,
    heading: Sequence[str] = (),
    sizes: bool = False,
    tries: int = 1,
    after: Callable[[list[str], Path, Callable[[str], None]], None] | None = None,
) -> None:
    """``script [--out DIR] [NAME ...]``, ``doc`` its docstring: each fixture named
    (every one of ``fixtures`` by default; world size its third field) logged as
    ``describe(name)``, trained into ``DIR/NAME`` (DIR: the script's folder by default),
    checked by ``check(name, root, log)`` and its files listed (with their size where
    ``sizes``); then ``after(names, DIR, log)``. The log (the versions, ``heading``,
    what each step logs) is printed, and written to ``make_fixtures.log`` beside the
    script where every fixture was made there. ``script --worker NAME --out DIR`` (as
    :func:`train` starts it) runs ``worker(NAME, DIR)``: one rank of a training run."""
    import deepspeed
    import torch
    import transformers

    here = Path(script).resolve().parent
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=here)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("names", nargs="*", default=list(fixtures))
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, str(args.out))
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}")  # fmt: skip
    for line in heading:
        log(line)
    for name in args.names:
        log(describe(name))
        root = args.out / name
        with tempfile.TemporaryDirectory() as tmp:
            train(script, name, fixtures[name][2], Path(tmp) / name, tries=tries)
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(Path(tmp) / name, root)
        for copy in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's copies, 40 KB
            (root / copy).unlink(missing_ok=True)
        check(name, root, log)
        paths = [p for p in root.rglob("*") if p.is_file()]
        listed = ", ".join(sorted(p.relative_to(root).as_posix() for p in paths))
        if sizes:
            log(f"  files ({sum(p.stat().st_size for p in paths) // 1024} KiB): {listed}")
        else:
            log(f"  files: {listed}")
    if after is not None:
        after(args.names, args.out, log)
    if args.out == here and args.names == list(fixtures):
        (here / "make_fixtures.log").write_text("\n".join(lines) + "\n")
