"""Start-up time of the ``jaxshare`` command, against reading a header by hand.

Each command runs in a fresh process, the runs interleaved, and the median of
``--repeats`` runs is reported:

- ``jaxshare --help`` (goal: <= 0.5 s on the project's 2-core machine);
- ``jaxshare inspect FILE.safetensors`` and ``jaxshare inspect ITEM`` (an Orbax item;
  goal: <= 1.5 s);
- ``jaxshare inspect HF_DIR``, a GPT-2 directory (``config.json`` + ``model.safetensors``,
  the head tied by the config), with transformers and torch importable, as a user
  with the ``hf`` extra runs it (goal: <= 1 s: the ties come from the table generated
  from transformers, ``bridge/hf/table.json``, and neither is imported);
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

from stream_convert import ROOT, compiled

GOAL_HELP_S = 0.5
GOALS_S = {
    "jaxshare --help": GOAL_HELP_S,
    "jaxshare inspect ITEM (Orbax)": 1.5,
    "jaxshare inspect HF_DIR (torch importable)": 1.0,
}


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
        "import json, os\n"
        "os.mkdir(root + '/gpt2')\n"
        "g = {'transformer.wte.weight': np.ones((64, 16), np.float32)}\n"
        "for i in range(2):\n"
        "    for n, s in (('attn.c_attn', (16, 48)), ('attn.c_proj', (16, 16)),\n"
        "                 ('mlp.c_fc', (16, 64)), ('mlp.c_proj', (64, 16))):\n"
        "        g[f'transformer.h.{i}.{n}.weight'] = np.ones(s, np.float32)\n"
        "save_file(g, root + '/gpt2/model.safetensors', metadata={'format': 'pt'})\n"
        "config = {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2', 'n_embd': 16,\n"
        "          'n_layer': 2, 'n_head': 2, 'vocab_size': 64, 'tie_word_embeddings': True}\n"
        "open(root + '/gpt2/config.json', 'w').write(json.dumps(config))\n"
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
    compiled(args.source.absolute() if args.source is not None else ROOT)
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
            "jaxshare inspect HF_DIR (torch importable)": [
                py,
                "-c",
                "import sys; from jaxshare.cli import main; sys.exit(main(sys.argv[1:]))",
                "inspect",
                str(Path(tmp) / "gpt2"),
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
    print(f"{'command (torch unimportable but where named)':44} {'median s':>9} {'vs peer':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:44} {median:9.3f} {median / peer:7.2f}x")
    for name, goal in GOALS_S.items():
        median = statistics.median(times[name])
        verdict = "met" if median <= goal else "MISSED"
        print(f"goal: {name} <= {goal} s: {median:.3f} s, {verdict}")
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
