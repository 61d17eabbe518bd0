"""The writers of :func:`bridge.convert`: one per output format, the one table of them.

A writer takes the opened input (a :class:`~jaxshare.stream.TensorSource`) and what
the call asked for (:class:`Options`), plans every output tensor from metadata
alone, and streams them into its format:

- ``"orbax"``: Flax paths (a PyTorch-named input placed by :func:`bridge.flax_plan`'s
  rules, a Flax-named one kept, or placed anew in another ``layout``), an Orbax
  item (:func:`jaxshare.checkpoint.write_item`);
- ``"safetensors"``: the input's own naming, or the one ``names`` asks for, a
  ``.safetensors`` file (:func:`jaxshare.formats.save_plan`); an Orbax item in Flax
  names is consolidated, every alias written out for readers that know no ties;
- ``"torch"`` and ``"dcp"``: PyTorch names (:func:`bridge.naming.torch_naming.in_torch_names`),
  a PyTorch file (a pickle of the whole state dict: built in memory, with torch) or
  a DCP folder;
- ``"hf"``: a Hugging Face directory (:func:`bridge.save_hf`, which names a Flax
  tree after the config's model class where no naming record does).

:data:`RUN` converts a training run as a whole (weights and optimizer state),
from the input as given. Adding an output format is one writer and one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.commands.outputs import Format
from bridge.hf.config import config_dict
from bridge.layouts.layout import Layout
from bridge.layouts.rules import Rules
from bridge.naming.relayout import place_any
from bridge.naming.torch_naming import in_torch_names
from jaxshare.formats import is_item
from jaxshare.internal import UsageError
from jaxshare.stream import Plan, ProgressFn, TensorSource

__all__ = ["RUN", "WRITERS", "Options", "Writer"]


@dataclass(frozen=True)
class Options:
    """What a conversion asked for, as every writer takes it (each uses its own)."""

    rules: Rules
    layout: Layout | None = None
    names: str | None = None
    dtype: Any = None
    config: Any = None
    max_shard_size: str | int | None = None
    force: bool = False
    inputs: Sequence[Path] = ()
    progress: ProgressFn | None = None
    manifest: bool = False
    compression: str = "zstd"
    ties: Mapping[str, str] | Sequence[str] = ()
    fused_experts: bool = False

    def given(self, *names: str) -> dict[str, Any]:
        """These options, by name, as a writer's keyword arguments.

        >>> Options(Rules(), force=True).given("force", "manifest")
        {'force': True, 'manifest': False}
        """
        return {name: getattr(self, name) for name in names}


#: A writer: ``write(dst, source, options)`` writes ``source`` at ``dst``.
Writer = Callable[[Path, Any, Options], None]


def _flax_named(source: TensorSource, options: Options) -> tuple[Plan, TensorSource]:
    """The plan in Flax paths, and the source it reads: a Flax-named input as it is
    (in its own layout), any other placed (in ``options.layout``)."""
    if source.flax_named and options.layout is None:
        return Plan.identity(source), source
    placement, placed = place_any(source, like=None, rules=options.rules, layout=options.layout)
    return placement.plan(placed), placed


def _torch_named(source: TensorSource, options: Options, fmt: str) -> tuple[Plan, TensorSource]:
    """The plan in PyTorch names, and the source it reads."""
    if options.layout is not None and not source.flax_named:
        raise UsageError(
            f"{source.where}: --layout is the Flax side of a conversion, and this {fmt} "
            "output keeps the input's PyTorch names."
        )
    config = None  # (A Flax input's model, where --config names it; else its own.)
    if options.config is not None and source.flax_named:
        config = config_dict(options.config)
    return in_torch_names(source, rules=options.rules, layout=options.layout, config=config)


def _streamed(
    write: Callable[..., object],
    dst: Path,
    plan: Plan,
    reads: TensorSource,
    options: Options,
    **more: Any,
) -> None:
    """``write(dst, plan, reads, ...)`` of the plan's outputs, cast as asked."""
    write(
        dst, plan.cast(options.dtype), reads, **options.given("force", "inputs", "progress"), **more
    )


def _orbax(dst: Path, source: TensorSource, options: Options) -> None:
    from jaxshare import checkpoint

    plan, reads = _flax_named(source, options)
    _streamed(
        checkpoint.write_item, dst, plan, reads, options, **options.given("manifest", "compression")
    )


def _safetensors(dst: Path, source: TensorSource, options: Options) -> None:
    from jaxshare.formats import save_plan

    flax = (options.names or ("flax" if source.flax_named else "torch")) == "flax"
    if flax and options.layout is None and source.path is not None and is_item(source.path):
        from jaxshare import checkpoint

        # Every alias written out too, for readers that know no ties.
        checkpoint.consolidate_to_safetensors(
            source.where, dst, **options.given("dtype", "force", "progress", "manifest")
        )
        return
    if flax:
        plan, reads = _flax_named(source, options)
    else:
        plan, reads = _torch_named(source, options, "safetensors")
    _streamed(save_plan, dst, plan, reads, options, **options.given("manifest"))


def _torch(dst: Path, source: TensorSource, options: Options) -> None:
    from bridge.torch.torch_file import save_torch  # (A pickle of torch tensors.)

    def write(dst: Path, plan: Plan, reads: TensorSource, **given: Any) -> None:
        save_torch(plan, reads, dst, **given)

    _streamed(write, dst, *_torch_named(source, options, "torch"), options)


def _dcp(dst: Path, source: TensorSource, options: Options) -> None:
    from jaxshare.formats import write_dcp

    _streamed(write_dcp, dst, *_torch_named(source, options, "dcp"), options)


def _hf(dst: Path, source: TensorSource, options: Options) -> None:
    from bridge.commands.save_hf import save_hf

    config = options.config if options.config is not None else source.config
    if config is None:
        raise UsageError(
            f"{dst}: a Hugging Face directory needs a config.json: pass --config "
            "(the input has none)."
        )
    # save_hf plans: a naming record, else the config's model class, names Flax leaves.
    named = ("dtype", "max_shard_size", "force", "inputs", "progress", "rules", "layout")
    named += ("fused_experts",)
    save_hf(dst, source, config=config, manifest=options.manifest, **options.given(*named))


def _run(dst: Path, src: Any, options: Options) -> None:
    from bridge.training.run import convert_training  # (optax: 14 ms to import)

    convert_training(src, dst, **options.given("force", "rules", "layout", "ties", "config"))


#: The writer of each output format (``format=``, ``--format``).
WRITERS: Mapping[Format, Writer] = MappingProxyType(
    {"orbax": _orbax, "safetensors": _safetensors, "torch": _torch, "hf": _hf, "dcp": _dcp}
)

#: The writer of a training run as a whole: the input as given (a run file, a
#: DeepSpeed or DCP folder, a run jaxshare wrote), to a ``CheckpointManager`` step or
#: back to a PyTorch run file.
RUN: Writer = _run
