"""``jaxshare convert SRC DST``: any input to any output, planned from metadata.

The input is opened as a :class:`jaxshare.TensorSource` (``_open``); the output's
format comes from ``--format``, or else from DST: ``.safetensors``, a PyTorch
file (``.pt``/``.bin``/``.pth``), or a directory -- a Hugging Face directory when
``--config`` or ``--max-shard-size`` is given, an Orbax item otherwise. A plan
(:class:`jaxshare.Plan`) then names every output tensor from metadata alone:

- PyTorch names -> Flax paths: ``bridge.flax_plan``;
- Flax paths -> PyTorch names: ``bridge.torch_plan`` (the naming record a
  conversion stored makes it exact; for a Hugging Face directory without one,
  ``bridge.save_hf`` names them after the config's model class);
- same naming: ``Plan.identity`` (re-shard, cast, re-tie);

and a writer streams the outputs one tensor at a time: an Orbax item, a
``.safetensors`` file, a Hugging Face directory. A PyTorch file is a pickle of
the whole state dict, so that one output is built in memory.

Every route checks its paths first (the output is no input; ``--force`` replaces
only an output of the same kind) and writes through a temporary name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxshare import Plan, ProgressFn, TensorSource
from jaxshare.cli._main import CLIError
from jaxshare.cli._open import bridge, flax_named, open_input
from jaxshare.formats import TORCH_SUFFIXES, save_plan
from jaxshare.internal import float_dtype

__all__ = ["convert", "output_format"]


def output_format(dst: Path, given: str | None, *, hf_options: bool) -> str:
    """The output format: ``given``, or what DST's suffix (or the options) say."""
    if given is not None:
        return given
    if dst.suffix == ".safetensors":
        return "safetensors"
    if dst.suffix in TORCH_SUFFIXES:
        return "torch"
    if dst.suffix:
        raise CLIError(
            f"{dst}: an output is a directory (an Orbax item, or a Hugging Face directory "
            "with --config), a .safetensors file or a PyTorch file (.pt, .bin); pass "
            "--format to say which."
        )
    return "hf" if hf_options else "orbax"


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: Any = None,
    names: str | None = None,
    output: str | None = None,
    config: str | os.PathLike | None = None,
    max_shard_size: str | int | None = None,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> None:
    """Converts ``src`` to ``dst`` (see the module docstring).

    Raises:
      CLIError: options that do not fit the input or output.
      FileNotFoundError, FileExistsError, ValueError: bad input or destination.
    """
    src, dst = Path(src), Path(dst)
    float_dtype(dtype)  # A bad --dtype fails before anything is read.
    fmt = output_format(dst, output, hf_options=config is not None or max_shard_size is not None)
    if fmt != "hf" and (config is not None or max_shard_size is not None):
        raise CLIError("--config and --max-shard-size are for Hugging Face directory outputs.")
    if names is not None and fmt != "safetensors":
        raise CLIError("--names chooses the naming of a .safetensors output only.")
    with open_input(src) as source:
        flax = flax_named(source)
        if fmt == "orbax":
            plan = Plan.identity(source) if flax else bridge().flax_plan(source)
            _write_orbax(dst, plan.cast(dtype), source, force, progress, src)
        elif fmt == "safetensors":
            _write_safetensors(dst, source, flax, names, dtype, force, progress, src)
        elif fmt == "torch":
            _write_torch_file(dst, source, flax, dtype, force, progress, src)
        else:
            # save_hf plans: a naming record, else the config's model class, names Flax leaves.
            bridge().save_hf(
                dst,
                source,
                dtype=dtype,
                config=config if config is not None else _config_of(source, dst),
                max_shard_size=max_shard_size,
                force=force,
                inputs=[src],
                progress=progress,
            )


def _config_of(source: TensorSource, dst: Path) -> Any:
    config = getattr(source, "config", None)
    if config is None:
        raise CLIError(
            f"{dst}: a Hugging Face directory needs a config.json: pass --config "
            "(the input has none)."
        )
    return config


def _write_orbax(
    dst: Path,
    plan: Plan,
    source: TensorSource,
    force: bool,
    progress: ProgressFn | None,
    src: Path,
) -> None:
    from jaxshare import checkpoint

    checkpoint.write_item(dst, plan, source, force=force, inputs=[src], progress=progress)


def _write_safetensors(
    dst: Path,
    source: TensorSource,
    flax: bool,
    names: str | None,
    dtype: Any,
    force: bool,
    progress: ProgressFn | None,
    src: Path,
) -> None:
    names = names or ("flax" if flax else "torch")
    if flax and names == "flax" and source.kind == "orbax":
        from jaxshare import checkpoint

        # Every alias written out too, for readers that know no ties.
        checkpoint.consolidate_to_safetensors(src, dst, dtype=dtype, force=force, progress=progress)
        return
    if names == "flax":
        plan = Plan.identity(source) if flax else bridge().flax_plan(source)
    else:
        plan = bridge().torch_plan(source) if flax else Plan.identity(source)
    save_plan(dst, plan.cast(dtype), source, force=force, inputs=[src], progress=progress)


def _write_torch_file(
    dst: Path,
    source: TensorSource,
    flax: bool,
    dtype: Any,
    force: bool,
    progress: ProgressFn | None,
    src: Path,
) -> None:
    b = bridge()
    plan = b.torch_plan(source) if flax else Plan.identity(source)
    b.save_torch(plan.cast(dtype), source, dst, force=force, inputs=[src], progress=progress)
