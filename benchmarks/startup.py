"""Start-up time of the ``jaxshare`` command, against reading a header by hand.

Each command runs in a fresh process, the runs interleaved, and the median of
``--repeats`` runs is reported:

- ``jaxshare --help`` (goal: <= 0.5 s on the project's 2-core machine);
- ``jaxshare inspect FILE.safetensors`` and ``jaxshare inspect ITEM`` (an Orbax item);
- the peer: ``python -c "import safetensors; read the header"``, what a user runs to
  look into a file, and ``python -c pass``, the interpreter alone.

Every command runs with torch made unimportable, to show none of them needs it
(``--allow-torch`` lifts that, for an older checkout whose ``inspect`` needed torch).

    python benchmarks/startup.py [--repeats 7] [--source DIR]

``--source`` runs the commands from another checkout of jaxshare (e.g. an older
commit) with this interpreter, for before/after figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_HELP_S = 0.5


def _make_inputs(root: Path) -> tuple[Path, Path]:
    code = (
        "import sys, numpy as np, jax.numpy as jnp\n"
        "from safetensors.numpy import save_file\n"
        "from jaxshare import checkpoint\n"
        "root = sys.argv[1]\n"
        "w = {f'h.{i}.weight': np.ones((64, 64), np.float32) for i in range(24)}\n"
        "save_file(w, root + '/model.safetensors')\n"
        "emb = jnp.ones((64, 64))\n"
        "checkpoint.save(root + '/item', {'wte': emb, 'head': emb, 'b': jnp.ones(3)})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root)], check=True)
    return root / "model.safetensors", root / "item"


def _run(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--source", type=Path, default=None, help="another jaxshare checkout")
    parser.add_argument(
        "--allow-torch",
        action="store_true",
        help="let the commands import torch (an older checkout whose inspect needs it)",
    )
    args = parser.parse_args()
    env = dict(os.environ)
    if args.source is not None:
        env["PYTHONPATH"] = str(args.source.absolute())
    no_torch = "import sys; " + ("" if args.allow_torch else "sys.modules['torch'] = None; ")
    with tempfile.TemporaryDirectory() as tmp:
        st, item = _make_inputs(Path(tmp))
        py = sys.executable
        commands = {
            "python -c pass": [py, "-c", "pass"],
            "import safetensors + read the header": [
                py,
                "-c",
                "import safetensors, sys; f = safetensors.safe_open(sys.argv[1], 'np'); "
                "f.metadata(); list(f.keys())",
                str(st),
            ],
            "jaxshare --help": [
                py,
                "-c",
                no_torch + "from jaxshare.cli import main; "
                "sys.argv = ['jaxshare', '--help']; main()",
            ],
            "jaxshare inspect FILE.safetensors": [
                py,
                "-c",
                no_torch + "from jaxshare.cli import main; sys.exit(main(sys.argv[1:]))",
                "inspect",
                str(st),
            ],
            "jaxshare inspect ITEM (Orbax)": [
                py,
                "-c",
                no_torch + "from jaxshare.cli import main; sys.exit(main(sys.argv[1:]))",
                "inspect",
                str(item),
            ],
        }
        # From the temp directory: `python -c` puts its working directory first on the path.
        for argv in commands.values():  # Warm the file cache once.
            _run(argv, env, tmp)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                times[name].append(_run(argv, env, tmp))
    peer = statistics.median(times["import safetensors + read the header"])
    print(f"{'command (torch unimportable)':40} {'median s':>9} {'vs peer':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40} {median:9.3f} {median / peer:7.2f}x")
    help_s = statistics.median(times["jaxshare --help"])
    verdict = "met" if help_s <= GOAL_HELP_S else "MISSED"
    print(f"goal: jaxshare --help <= {GOAL_HELP_S} s: {help_s:.3f} s, {verdict}")


if __name__ == "__main__":
    main()
