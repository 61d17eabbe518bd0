"""Checks jaxshare's transformers-flax layout against transformers 4.57, both ways.

The test venv has transformers 5 only, so the tests there cover the round trip into
transformers 5. This script covers transformers 4.57, the last release with Flax classes.
It runs in the bench venv and calls jaxshare's command in the test venv (``.venv``,
where jaxshare's Hugging Face writer runs against transformers 5), as a user of both
would. For every id of ``manifest.json`` (the fixtures of ``make_fixtures.py``):

1. ``flax->hf->torch``: the Flax params (``params.safetensors``) saved as a plain Orbax
   item (orbax ``StandardCheckpointer``), then ``jaxshare convert ITEM OUT --format hf
   --config config.json``, then ``OUT`` loaded by transformers 4.57's PyTorch class
   (``from_pretrained(OUT, output_loading_info=True)``) and run on the fixture inputs.
   Passes if each output is within ``TOLERANCE`` of the Flax model's (``logits.safetensors``)
   and no key is missing, unexpected or mismatched.
2. ``hf->flax->flax``: a 4.57 PyTorch model of the fixture's config (``torch.manual_seed``
   ``SEED``), ``save_pretrained`` (safetensors), then ``jaxshare convert HF_DIR ITEM --layout
   transformers-flax``, then the item restored by plain orbax, with no target, and run by
   4.57's Flax class (``_do_init=False``, ``params=`` the restored tree). Passes if the
   restored tree has the paths, shapes and dtypes of ``jax.eval_shape`` of the Flax model's
   init, and each output is within ``TOLERANCE`` of the PyTorch model's on the same inputs.

Each check prints one line with its figures (max |delta| per output, the keys, the tree),
then a summary; ``check_transformers4.log`` gets the same lines. Everything but the
``time:`` lines is the same from run to run. The exit status is 1 if any check fails;
the only keys a load may report missing are those of ``EXPECTED_MISSING``. Nothing is
downloaded. Run from the repository root (``make check-transformers4``)::

    HF_HUB_OFFLINE=1 .venv-bench/bin/python tests/data/transformers_flax/check_transformers4.py

Given ids as arguments (``... check_transformers4.py gpt2 t5``) it checks those only; the
log then covers that run. The jax 0.10 shims of ``make_fixtures.py`` are installed first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# jaxshare's command in the test venv (transformers 5).
JAXSHARE = [str(ROOT / ".venv" / "bin" / "python"), "-m", "jaxshare.cli", "convert"]
TOLERANCE = 1e-5
# Conversions run as subprocesses, a few at a time.
WORKERS = min(4, os.cpu_count() or 1)

FLAX_TO_TORCH = "flax->hf->torch"
TORCH_TO_FLAX = "hf->flax->flax"


#: Keys ``from_pretrained`` reports missing that check 1 expects, by id, and why: the
#: PyTorch class holds a module unused that the Flax class lacks, so transformers
#: initialises it (exactly these keys, nothing else).
EXPECTED_MISSING: dict[str, tuple[tuple[str, ...], str]] = {
    "big_bird": (
        ("bert.pooler.bias", "bert.pooler.weight"),
        "BigBirdForMaskedLM's bert.pooler is unused, and the Flax class has none",
    ),
}


@dataclass(frozen=True)
class Result:
    """One check of one id: its figures and whether it passed."""

    name: str
    check: str
    passed: bool
    figures: str

    def status(self) -> str:
        return "ok" if self.passed else "FAIL"


def jaxshare(*args: str) -> str | None:
    """Runs ``jaxshare convert ARGS --quiet`` in the test venv; returns its error, or None."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([*JAXSHARE, *args, "--quiet"], capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return f"jaxshare exited {done.returncode}: {lines[-1] if lines else 'no output'}"


def torch_inputs(inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The fixture inputs as PyTorch takes them: integer ids as int64."""
    import torch

    return {
        name: torch.from_numpy(value.astype(np.int64) if value.dtype.kind == "i" else value)
        for name, value in inputs.items()
    }


def max_deltas(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Max |got - want| per output (a float), or the two shapes where they differ (a str)."""
    deltas: dict[str, Any] = {}
    for name, expected in want.items():
        actual = np.asarray(got[name], dtype=np.float32)
        if actual.shape != expected.shape:
            deltas[name] = f"shape {list(actual.shape)} != {list(expected.shape)}"
        else:
            deltas[name] = float(np.max(np.abs(actual - expected)))
    return deltas


def render_deltas(deltas: Mapping[str, Any], want: Mapping[str, np.ndarray]) -> tuple[str, bool]:
    """``logits max|d| 3.7e-08 of 0.32`` per output (against the largest |expected|), and
    whether all are within ``TOLERANCE``."""
    parts = []
    for name, delta in deltas.items():
        if isinstance(delta, float):
            parts.append(f"{name} max|d| {delta:.1e} of {float(np.max(np.abs(want[name]))):.2g}")
        else:
            parts.append(f"{name} {delta}")
    passed = all(isinstance(d, float) and d <= TOLERANCE for d in deltas.values())
    return ", ".join(parts), passed


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def check_flax_to_torch(
    name: str, entry: Mapping[str, Any], hf_dir: Path, error: str | None
) -> Result:
    """Check 1: the Hugging Face directory jaxshare wrote, in 4.57's PyTorch class."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    if error is not None:
        return Result(name, FLAX_TO_TORCH, False, error)
    fixture = HERE / name
    try:
        cls = getattr(transformers, entry["torch_class"])
        model, info = cls.from_pretrained(hf_dir, output_loading_info=True)
        model.eval()
        with torch.no_grad():
            out = model(**torch_inputs(load_file(fixture / "inputs.safetensors")))
        got = {key: getattr(out, key).numpy() for key in entry["outputs"]}
    except Exception as e:  # reported; the other ids still run
        return Result(name, FLAX_TO_TORCH, False, f"4.57 load/run failed: {first_line(e)}")
    want = load_file(fixture / "logits.safetensors")
    figures, passed = render_deltas(max_deltas(got, want), want)
    allowed, why = EXPECTED_MISSING.get(name, ((), ""))
    keys = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = sorted(str(key) for key in info.get(kind, []))
        if kind == "missing_keys" and allowed and found == sorted(allowed):
            keys.append(f"missing {found} (expected: {why})")
            continue
        keys.append(f"{kind.removesuffix('_keys')} {found or 'none'}")
        passed = passed and not found
    return Result(name, FLAX_TO_TORCH, passed, f"{figures}; {'; '.join(keys)}")


def check_torch_to_flax(
    name: str,
    entry: Mapping[str, Any],
    config: Any,
    item: Path,
    want: Mapping[str, np.ndarray],
    error: str | None,
) -> Result:
    """Check 2: the Orbax item jaxshare wrote, restored by plain orbax, in 4.57's Flax class."""
    import orbax.checkpoint as ocp
    import transformers
    from flax.core import unfreeze
    from flax.traverse_util import flatten_dict
    from safetensors.numpy import load_file

    if error is not None:
        return Result(name, TORCH_TO_FLAX, False, error)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(item.absolute())
        # _do_init=False: the model holds jax.eval_shape of its init, and no params.
        model = getattr(transformers, entry["flax_class"])(config, _do_init=False)
        expected = flatten_dict(unfreeze(model.params_shape_tree), sep="/")
        got_tree = flatten_dict(restored, sep="/")
        tree, tree_ok = compare_trees(got_tree, expected)
        if not tree_ok:
            return Result(name, TORCH_TO_FLAX, False, tree)
        out = model(**load_file(HERE / name / "inputs.safetensors"), params=restored)
        got = {key: np.asarray(getattr(out, key)) for key in entry["outputs"]}
    except Exception as e:  # reported; the other ids still run
        return Result(name, TORCH_TO_FLAX, False, f"restore/Flax run failed: {first_line(e)}")
    figures, passed = render_deltas(max_deltas(got, want), want)
    return Result(name, TORCH_TO_FLAX, passed, f"{figures} (vs 4.57 PyTorch); {tree}")


def compare_trees(got: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple[str, bool]:
    """How a restored tree's paths, shapes and dtypes differ from the Flax init's."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    differ = [
        f"{path} {list(got[path].shape)} {got[path].dtype} != "
        f"{list(expected[path].shape)} {expected[path].dtype}"
        for path in sorted(set(got) & set(expected))
        if (got[path].shape, got[path].dtype) != (expected[path].shape, expected[path].dtype)
    ]
    if not (missing or extra or differ):
        return f"tree: {len(got)} leaves as the Flax init's", True
    return f"tree: missing {missing or 'none'}; extra {extra or 'none'}; differ {differ}", False


def main(names: list[str]) -> int:
    """Checks the ids ``names`` (all of the manifest's if empty); returns the exit status."""
    manifest = json.loads((HERE / "manifest.json").read_text())
    unknown = [name for name in names if name not in manifest]
    if unknown:
        raise SystemExit(f"unknown ids {unknown}; expected some of {list(manifest)}")
    names = names or list(manifest)
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(HERE))
    from make_fixtures import SEED, install_jax_shims

    shims = install_jax_shims()
    import flax
    import jax
    import orbax.checkpoint as ocp
    import torch
    import transformers
    from flax.traverse_util import unflatten_dict
    from safetensors.numpy import load_file

    transformers.logging.set_verbosity_error()
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(
        f"transformers {transformers.__version__}, flax {flax.__version__}, "
        f"jax {jax.__version__}, torch {torch.__version__}; jaxshare: {' '.join(JAXSHARE[1:])} "
        f"in .venv; tolerance {TOLERANCE:g}"
    )
    log(f"shims: {shims or 'none'}")
    start = time.perf_counter()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="check_transformers4-") as tmp:
        configs: dict[str, Any] = {}
        torch_outputs: dict[str, dict[str, np.ndarray]] = {}
        jobs: dict[tuple[str, str], Callable[[], str | None]] = {}
        for name in names:
            fixture, work = HERE / name, Path(tmp) / name
            work.mkdir()
            # Check 1's input: the Flax params as a plain Orbax item.
            params = unflatten_dict(load_file(fixture / "params.safetensors"), sep="/")
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save((work / "flax_item").absolute(), params)
            args1 = (str(work / "flax_item"), str(work / "hf"), "--format", "hf")
            jobs[name, FLAX_TO_TORCH] = lambda a=args1, c=fixture: jaxshare(
                *a, "--config", str(c / "config.json")
            )
            # Check 2's input: a seeded 4.57 PyTorch model's save_pretrained, and its outputs.
            config = transformers.AutoConfig.from_pretrained(fixture)
            configs[name] = config
            torch.manual_seed(SEED)
            model = getattr(transformers, manifest[name]["torch_class"])(config).eval()
            with torch.no_grad():
                out = model(**torch_inputs(load_file(fixture / "inputs.safetensors")))
            torch_outputs[name] = {k: getattr(out, k).numpy() for k in manifest[name]["outputs"]}
            model.save_pretrained(work / "torch_hf", safe_serialization=True)
            args2 = (str(work / "torch_hf"), str(work / "flax_from_hf"))
            jobs[name, TORCH_TO_FLAX] = lambda a=args2: jaxshare(
                *a, "--layout", "transformers-flax"
            )
        log(f"time: prepared {len(names)} ids in {time.perf_counter() - start:.1f} s")
        with ThreadPoolExecutor(WORKERS) as pool:
            futures: dict[tuple[str, str], Future[str | None]] = {
                key: pool.submit(job) for key, job in jobs.items()
            }
            for name in names:
                entry, work = manifest[name], Path(tmp) / name
                error = futures[name, FLAX_TO_TORCH].result()
                results.append(check_flax_to_torch(name, entry, work / "hf", error))
                log(f"{name} {FLAX_TO_TORCH}: {results[-1].status()}: {results[-1].figures}")
                error = futures[name, TORCH_TO_FLAX].result()
                item, want = work / "flax_from_hf", torch_outputs[name]
                results.append(check_torch_to_flax(name, entry, configs[name], item, want, error))
                log(f"{name} {TORCH_TO_FLAX}: {results[-1].status()}: {results[-1].figures}")
    for check in (FLAX_TO_TORCH, TORCH_TO_FLAX):
        of = [r for r in results if r.check == check]
        passed = [r.name for r in of if r.passed]
        failed = [r.name for r in of if not r.passed]
        log(f"summary {check}: {len(passed)}/{len(of)} ok; FAILED {failed or 'none'}")
    log(f"time: {time.perf_counter() - start:.1f} s")
    (HERE / "check_transformers4.log").write_text("\n".join(lines) + "\n")
    return 1 if any(not r.passed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
