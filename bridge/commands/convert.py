"""``convert``: any checkpoint or weights file to any other, planned from metadata.

The input is opened by :func:`bridge.open_source`, through the first of its readers
(:data:`bridge.sources.registry.READERS`) that knows it: an Orbax item or step, a
``.safetensors``, PyTorch or Flax ``.msgpack`` file, a PyTorch DCP or DeepSpeed
folder, a Hugging Face directory. The output's format is ``format``, or else what
``dst`` says: ``.safetensors``, a PyTorch file (``.pt``/``.bin``/``.pth``), or a
directory -- a Hugging Face directory when ``config`` or ``max_shard_size`` is
given, an Orbax item otherwise (a DCP folder only with ``format="dcp"``). A plan
(:class:`jaxshare.stream.Plan`) then names every output tensor from metadata
alone:

- PyTorch names -> Flax paths: :func:`bridge.flax_plan`;
- Flax paths -> PyTorch names: :func:`bridge.torch_plan` (the naming record a
  conversion stored makes it exact; for a Hugging Face directory without one,
  :func:`bridge.save_hf` names them after the config's model class);
- the same naming: ``Plan.identity`` (re-shard, cast, re-tie);

and the format's writer (:data:`bridge.commands.writers.WRITERS`) streams the
outputs one tensor at a time: an Orbax item, a ``.safetensors`` file, a Hugging
Face directory, a PyTorch DCP folder. A PyTorch file is a pickle of
the whole state dict, so that one output is built in memory (and needs torch).

Every route checks its paths first (the output is no input; ``force`` replaces
only an output of the same kind) and writes through a temporary name.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.commands.outputs import FORMATS, NAMES, Format
from bridge.commands.writers import RUN, WRITERS, Options
from bridge.layouts.layout import Layout, as_layout
from bridge.layouts.rules import Rules, as_rules
from bridge.sources.declared import declare_ties, tie_map
from bridge.sources.registry import find_reader, opened
from jaxshare.formats import TORCH_SUFFIXES
from jaxshare.internal import UsageError, float_dtype
from jaxshare.stream import ProgressFn, TensorSource

__all__ = ["convert", "output_format"]


def output_format(dst: str | os.PathLike, given: str | None, *, hf_options: bool) -> Format:
    """The output format: ``given``, or what ``dst``'s suffix (or the Hugging Face
    options) say.

    Raises:
      UsageError: an unknown format, or a suffix of no output format.

    >>> output_format("out.safetensors", None, hf_options=False)
    'safetensors'
    >>> output_format("model_dir", None, hf_options=True)
    'hf'
    """
    if given is not None:
        if given not in FORMATS:
            raise UsageError(f"`format` {given!r} is not one of {', '.join(FORMATS)}.")
        return given
    dst = Path(dst)
    if dst.suffix == ".safetensors":
        return "safetensors"
    if dst.suffix in TORCH_SUFFIXES:
        return "torch"
    if dst.suffix:
        raise UsageError(
            f"{dst}: an output is a directory (an Orbax item, a Hugging Face directory "
            f"with --config, a DCP folder with --format dcp), a .safetensors file or a "
            f"PyTorch file ({', '.join(TORCH_SUFFIXES)}); pass --format to say which."
        )
    return "hf" if hf_options else "orbax"


def convert(
    src: str | os.PathLike | TensorSource,
    dst: str | os.PathLike,
    /,
    *,
    format: str | None = None,
    names: str | None = None,
    dtype: Any = None,
    config: Any = None,
    max_shard_size: str | int | None = None,
    force: bool = False,
    progress: ProgressFn | None = None,
    rules: Rules | None = None,
    layout: str | Layout | None = None,
    stack: str | Sequence[str] = (),
    stack_axis: int = 0,
    ties: Mapping[str, str] | Sequence[str] = (),
    manifest: bool = False,
    optimizer: bool = False,
    compression: str = "zstd",
    fused_experts: bool = False,
) -> Path:
    """Converts ``src`` to ``dst``, streaming one tensor at a time: what
    ``jaxshare convert SRC DST`` does.

    Args:
      src: any input :func:`bridge.open_source` takes: an Orbax item or step, a
        Hugging Face, DeepSpeed or PyTorch DCP directory, an index, a
        ``.safetensors``, PyTorch or Flax ``.msgpack`` file, or a
        :class:`~jaxshare.stream.TensorSource`.
      dst: the output (see the module docstring for how its format is chosen).
      format: ``"orbax"``, ``"safetensors"``, ``"torch"``, ``"hf"`` or ``"dcp"``: the output
        format, where ``dst`` leaves it open.
      names: the naming of a ``.safetensors`` output: ``"flax"`` (``'/'`` paths)
        or ``"torch"``; default: the input's. An Orbax item in Flax names is
        consolidated, every alias written out for readers that know no ties.
      dtype: cast floating tensors, e.g. ``"bfloat16"``.
      config: ``config.json`` of a Hugging Face directory output (a path, a
        dict or a ``PretrainedConfig``), or, for an output in PyTorch names
        (``names="torch"``, a PyTorch file, a DCP folder), of the model whose
        tensors a Flax input holds, whose model class finds its layout
        (``bridge.naming.torch_naming.flax_layout``); default: the input's own.
      max_shard_size: the largest shard of a Hugging Face directory output,
        e.g. ``"5GB"`` (default ``"50GB"``).
      force: replace ``dst`` if it is an output of the same kind.
      progress: ``progress(done, total, name, nbytes)`` after each tensor.
      rules: naming rules, for conversions between PyTorch and Flax names.
      layout: the Flax layout of a conversion between PyTorch and Flax names:
        ``"jaxshare"`` or ``"transformers-flax"`` (see :data:`bridge.LAYOUTS`);
        default: what the Flax side's paths and ``config.json`` show
        (:func:`bridge.detect_layout`), else jaxshare's.
      stack: PyTorch module prefixes of scanned layers (``"model.layers"``): each
        weight of the layers ``model.layers.{k}`` is one Flax leaf under
        ``model/layers``, the layers on ``stack_axis`` -- stacked on the way to
        Flax, split on the way back (a naming record, which jaxshare writes,
        makes this unneeded there). See ``docs/scanned.md``.
      stack_axis: the Flax axis of the layers of ``stack`` (0: linen ``nn.scan``,
        NNX; MaxText's is 1).
      ties: ties the input does not record (a DCP folder records none), as
        ``{alias: canonical}`` or ``"ALIAS=CANONICAL"`` strings (``--tie``), in
        PyTorch names; each is checked by content before it is stored once. A DCP
        input's ``config`` declares its ties too (see ``docs/dcp.md``).
      manifest: record every tensor's hash as it is written (``--manifest``), in
        the output itself -- a ``.safetensors`` file's metadata, an Orbax item's
        ``jaxshare_manifest.json``, a Hugging Face directory's shards and index --
        so :func:`bridge.verify` of the output alone checks it (``docs/verify.md``).
      optimizer: carry a training run's optimizer state too (``--optimizer``):
        ``src`` a torch run file, DeepSpeed or DCP folder; ``dst`` a
        ``CheckpointManager`` directory, written with one step holding ``params``,
        ``opt_state`` and ``optimizer`` (see ``docs/training-state.md``). A training
        run converted to a ``.pt`` file goes back to torch with its optimizer state,
        with or without it.
      compression: how an Orbax item output stores its chunks (``--compression``):
        ``"zstd"`` (Orbax's default) or ``"none"``, which writes at the disk's
        speed where zstd costs more CPU than the write (see
        :func:`jaxshare.checkpoint.write_item`).
      fused_experts: a Hugging Face directory output holds a mixture of experts
        fused (``--fused-experts``), as ``save_pretrained(save_original_format=False)``
        writes it; default: per expert, as ``save_pretrained`` writes by default
        (``docs/experts.md``).

    Returns:
      ``dst`` as a ``Path``.

    Raises:
      UsageError: options that do not fit the input or the output, or an input
        of no kind jaxshare reads; the message names each option as the command
        spells it (``--names`` is ``names=``).
      FileNotFoundError, FileExistsError, ValueError: a bad input or destination,
        one line naming it; nothing is left behind.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> emb = np.arange(8, dtype=np.float32).reshape(4, 2)
    >>> save_file({"wte.weight": emb}, d + "/model.safetensors")
    >>> convert(d + "/model.safetensors", d + "/ckpt").name
    'ckpt'
    >>> from jaxshare import checkpoint
    >>> checkpoint.restore(d + "/ckpt")["params"]["wte"]["embedding"].shape
    (4, 2)
    """
    dst = Path(dst)
    if optimizer or (dst.suffix in TORCH_SUFFIXES and _is_training_run(src)):
        given = {"--dtype": dtype, "--names": names,
                 "--max-shard-size": max_shard_size, "--stack": stack,
                 "--manifest": manifest, "--format": format not in (None, "orbax", "torch"),
                 "--compression": compression != "zstd",
                 "--fused-experts": fused_experts}  # fmt: skip
        extra = [option for option, value in given.items() if value]
        if extra:
            raise UsageError(
                f"a training run converts as it is: {', '.join(extra)} do not apply (its "
                "weights alone convert without --optimizer)."
            )
        given_layout = None if layout is None else as_layout(layout)
        RUN(dst, src, Options(as_rules(rules), given_layout, ties=ties, config=config, force=force))
        return dst
    rules = _with_stacks(as_rules(rules), stack, stack_axis)
    float_dtype(dtype)  # A bad `dtype` fails before anything is read.
    # An input that records no ties (a DCP folder) has them from its config; any
    # other input's config is the output's.
    reader = find_reader(src) if isinstance(src, (str, os.PathLike)) else None
    declares = reader is not None and reader.ties_from_config
    hf_options = (config is not None and not declares) or max_shard_size is not None
    fmt = output_format(dst, format, hf_options=hf_options)
    if manifest and fmt in ("torch", "dcp"):
        raise UsageError(
            f"--manifest is written into Orbax items, .safetensors files and Hugging Face "
            f"directories, not a {fmt} output; convert to one of those to verify it alone."
        )
    if fused_experts and fmt != "hf":
        raise UsageError(
            f"--fused-experts is how a Hugging Face directory output holds experts, not a "
            f"{fmt} output's."
        )
    if compression != "zstd" and fmt != "orbax":
        raise UsageError(
            f"--compression is how an Orbax item stores its chunks, not a {fmt} output's."
        )
    in_torch_names = fmt in ("torch", "dcp") or (fmt == "safetensors" and names == "torch")
    if fmt != "hf" and (max_shard_size is not None or (hf_options and not in_torch_names)):
        raise UsageError(
            "--config and --max-shard-size are for Hugging Face directory outputs (and "
            "--config for the ties of a DCP input, or the model of a Flax input written in "
            "PyTorch names)."
        )
    try:
        declared = tie_map(ties)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if names is not None and (names not in NAMES or fmt != "safetensors"):
        raise UsageError(
            "--names chooses the naming of a .safetensors output only: 'flax' or 'torch', "
            f"got {names!r} for a {fmt} output."
        )
    try:  # A bad `layout` fails before anything is read.
        chosen = None if layout is None else as_layout(layout)
    except ValueError as error:
        if str(layout).endswith((".toml", ".json")):
            raise  # (A layout file that is wrong is bad input, as any input is.)
        raise UsageError(str(error)) from None
    if fmt == "torch":  # A pickle of torch tensors: torch, before anything is read.
        from bridge.torch.torch_file import save_torch  # noqa: F401
    inputs = [Path(src)] if isinstance(src, (str, os.PathLike)) else []
    with opened(src, rules, arg="src") as source:
        inputs += [source.path] if source.path is not None else []
        if fmt != "hf" and hf_options and not source.flax_named:
            raise UsageError(
                f"{source.where}: --config names a Flax input's tensors in PyTorch names, and "
                f"this input is in PyTorch names already."
            )
        for note in source.notes:  # (What else a training checkpoint holds.)
            warnings.warn(f"{source.where}: {note}", stacklevel=2)
        if declared or declares:
            source = declare_ties(
                source, declared, config=config if declares else None, rules=rules
            )
        options = Options(
            rules,
            chosen,
            names=names,
            dtype=dtype,
            config=config,
            max_shard_size=max_shard_size,
            force=force,
            inputs=inputs,
            progress=progress,
            manifest=manifest,
            compression=compression,
            fused_experts=fused_experts,
        )
        WRITERS[fmt](dst, source, options)
    return dst


def _with_stacks(rules: Rules, stack: str | Sequence[str], axis: int) -> Rules:
    """``rules`` with the scanned layers of ``stack`` on ``axis``."""
    prefixes = [stack] if isinstance(stack, str) else list(stack)
    if type(axis) is not int or axis < 0:
        raise UsageError(f"--stack-axis must be an axis index >= 0, got {axis!r}.")
    if not prefixes:
        return rules
    bad = [p for p in prefixes if not p or "/" in p or any(not x for x in p.split("."))]
    if bad:
        raise UsageError(
            f"--stack names a PyTorch module prefix such as 'model.layers', got {bad[0]!r}."
        )
    return dataclasses.replace(rules, stacks={**rules.stacks, **dict.fromkeys(prefixes, axis)})


def _is_training_run(src: Any) -> bool:
    """Whether ``src`` is a training run jaxshare wrote (``convert --optimizer``)."""
    from bridge.training.run import is_training_run  # (optax: 14 ms to import)

    return is_training_run(src)
