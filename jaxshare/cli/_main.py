"""The ``jaxshare`` command: ``inspect``, ``convert``, ``merge``, ``verify``, ``check``, ``demo``.

The top layer, a thin shell over the library: it parses arguments, calls
:func:`bridge.inspect`, :func:`bridge.convert`, :func:`bridge.merge_lora`,
:func:`bridge.verify` or :func:`bridge.check`, renders what they return
(``_render``) and sets the exit status. At start-up only the standard library
and the package faces of ``bridge`` and ``jaxshare`` (whose names load on first
use) are imported, so ``--help`` is instant; the library imports what each input
needs (JAX and Orbax for checkpoints, torch only for torch tensors).

Every failure the user can fix is one line on stderr: exit status 2 for a
usage error (a ``jaxshare.internal.UsageError``: options that do not fit, an
input of no kind jaxshare reads, a framework not installed), 1 for bad input or
a failed write, and for the differences ``verify`` or the errors ``check``
finds; 130 when interrupted. No input is ever modified and no partial output
is left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

import bridge
from jaxshare.internal import UsageError, missing_extra

__all__ = ["build_parser", "main"]


def _layout_arg(value: str) -> str:
    """``--layout``: a layout's name or a layout file."""
    if value in bridge.LAYOUTS or value.endswith((".toml", ".json")):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not one of {', '.join(sorted(bridge.LAYOUTS))}, nor a .toml or .json file"
    )


def _layout_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument(
        "--layout",
        type=_layout_arg,
        default=None,
        metavar="{" + ",".join(sorted(bridge.LAYOUTS)) + "} or FILE",
        help=help,
    )


def _cmd_inspect(args: argparse.Namespace) -> int:
    report = bridge.inspect(args.path, layout=args.layout, config=args.config)
    if args.json:
        print(report.to_json())
    else:
        from jaxshare.cli._render import print_report

        print_report(report)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from jaxshare.cli._render import progress_bar

    with progress_bar(not args.quiet) as progress:
        bridge.convert(
            args.src,
            args.dst,
            dtype=args.dtype,
            names=args.names,
            format=args.format,
            config=args.config,
            max_shard_size=args.max_shard_size,
            layout=args.layout,
            stack=args.stack,
            stack_axis=args.stack_axis,
            ties=args.tie,
            force=args.force,
            progress=progress,
            manifest=args.manifest,
            optimizer=args.optimizer,
            compression=args.compression,
            fused_experts=args.fused_experts,
        )
    print(f"wrote {args.dst}")
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from jaxshare.cli._render import progress_bar

    with progress_bar(not args.quiet) as progress:
        bridge.merge_lora(
            args.base,
            args.adapter,
            args.out,
            keep_tie=args.keep_tie,
            format=args.format,
            max_shard_size=args.max_shard_size,
            force=args.force,
            progress=progress,
        )
    print(f"wrote {args.out}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    report = bridge.verify(args.a, args.b, dtype=args.dtype, limit=args.limit)
    return _verdict(args, report, "print_verify")


def _cmd_check(args: argparse.Namespace) -> int:
    return _verdict(args, bridge.check(args.path, config=args.config), "print_check")


def _verdict(
    args: argparse.Namespace, report: bridge.VerifyReport | bridge.CheckReport, printer: str
) -> int:
    """Prints a ``verify`` or ``check`` report, by ``printer`` of ``_render`` (``--json``:
    as JSON, with no table library imported); 0 when it is clean."""
    if args.json:
        print(report.to_json())
    else:
        from jaxshare.cli import _render

        getattr(_render, printer)(report)
    return 0 if report.ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from jaxshare.cli._demo import run

    run(workdir=args.workdir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxshare",
        description="Find, keep and carry tied weights across JAX, Orbax and PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "inspect", help="show the tie groups of a checkpoint, model directory or weights file"
    )
    p.add_argument(
        "path",
        help="an Orbax item (or step) directory, a Hugging Face, DeepSpeed or PyTorch DCP "
        "directory, an index .json, .safetensors, .pt, .bin, .pth or a Flax .msgpack",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _layout_option(
        p,
        "also show, for each tensor, the leaf of this layout (a name, or a .toml or .json "
        "file) it goes to and the entry that places it",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="CONFIG",
        help="the model's config.json (file or directory) where the input holds none, for "
        "--layout, or an adapter's base (its ties)",
    )
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser(
        "convert",
        help="between Orbax items, Hugging Face, DeepSpeed and DCP directories and weight files",
    )
    p.add_argument("src", help="any input `inspect` takes")
    p.add_argument(
        "dst",
        help="output: a directory (an Orbax item; a Hugging Face directory with --config or "
        "--max-shard-size; a DCP folder with --format dcp), .safetensors, or .pt/.bin/.pth",
    )
    p.add_argument(
        "--format",
        choices=bridge.FORMATS,
        default=None,
        help="the output format, if DST leaves it open",
    )
    p.add_argument("--dtype", default=None, help="cast floating arrays, e.g. float32")
    p.add_argument(
        "--config",
        default=None,
        help="config.json of a Hugging Face directory output (of a DCP input: its ties; of "
        "a Flax input written in PyTorch names: its model)",
    )
    p.add_argument(
        "--max-shard-size",
        default=None,
        help="largest shard of a Hugging Face directory output, e.g. 5GB (default 50GB)",
    )
    p.add_argument(
        "--names",
        choices=bridge.NAMES,
        default=None,
        help="naming of a .safetensors output: Flax '/' paths or PyTorch names "
        "(default: the input's own)",
    )
    _layout_option(
        p,
        "the Flax layout of a conversion between PyTorch and Flax names, by name or a layout "
        "file (.toml, .json: docs/your-own-model.md) (default: what the Flax tree and its "
        "config.json show, else jaxshare)",
    )
    p.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="PREFIX",
        help="scanned layers: the tensors PREFIX.{i}.* are one Flax leaf per weight, "
        "stacked on the way to Flax and split on the way back (e.g. model.layers; repeatable); "
        "a layer's experts: 'model.layers.{i}.mlp.experts'",
    )
    p.add_argument(
        "--stack-axis",
        type=int,
        default=0,
        metavar="K",
        help="the Flax axis of the layers of --stack (default 0; MaxText's is 1)",
    )
    p.add_argument(
        "--tie",
        action="append",
        default=[],
        metavar="ALIAS=CANONICAL",
        help="a tie the input does not record (a DCP folder records none), in PyTorch names, "
        "checked by content; repeatable",
    )
    p.add_argument(
        "--force", action="store_true", help="replace DST if it is an output of the same kind"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--manifest",
        action="store_true",
        help="record every tensor's hash in the output, for `jaxshare verify DST` alone",
    )
    p.add_argument(
        "--fused-experts",
        action="store_true",
        help="a Hugging Face directory output holds a mixture of experts fused "
        "(mlp.experts.gate_up_proj), as save_pretrained(save_original_format=False) writes "
        "it (default: per expert, as save_pretrained writes by default)",
    )
    p.add_argument(
        "--compression",
        choices=["zstd", "none"],
        default="zstd",
        help="how an Orbax item output stores its chunks: zstd (Orbax's default) or none, "
        "which writes at the disk's speed (default: zstd)",
    )
    p.add_argument(
        "--optimizer",
        action="store_true",
        help="carry a training run's optimizer state too: SRC a torch run file, DeepSpeed or "
        "DCP folder, DST a CheckpointManager directory (params, opt_state, optimizer items)",
    )
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "merge", help="merge a PEFT LoRA adapter into its base, one tensor at a time"
    )
    p.add_argument("base", help="the base model: any input `convert` takes, in PyTorch names")
    p.add_argument("adapter", help="a PEFT LoRA adapter directory (adapter_config.json)")
    p.add_argument(
        "out",
        help="output: a Hugging Face directory (where the base has a config.json; else an "
        "Orbax item), .safetensors, or .pt/.bin/.pth",
    )
    p.add_argument(
        "--keep-tie",
        action="store_true",
        help="refuse, rather than untie, a tie whose two sides the merge makes differ",
    )
    p.add_argument(
        "--format",
        choices=bridge.FORMATS,
        default=None,
        help="the output format, if OUT leaves it open",
    )
    p.add_argument(
        "--max-shard-size", default=None, help="largest shard of a Hugging Face directory output"
    )
    p.add_argument(
        "--force", action="store_true", help="replace OUT if it is an output of the same kind"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser(
        "verify",
        help="compare two checkpoints of any formats bit for bit, or one with its manifest",
    )
    p.add_argument("a", help="any input `inspect` takes")
    p.add_argument("b", nargs="?", default=None, help="the other input (default: A's manifest)")
    p.add_argument(
        "--dtype", default=None, help="a cast declared from A to B: B must be exactly A cast"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.add_argument(
        "--limit", type=int, default=10, metavar="N", help="differences shown (default 10)"
    )
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("check", help="hold the ties a checkpoint declares against what it stores")
    p.add_argument("path", help="any input `inspect` takes")
    p.add_argument(
        "--config",
        default=None,
        help="config.json whose ties and tensors PATH should hold (default: PATH's own)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("demo", help="the end-to-end story on a small built-in tied model")
    p.add_argument(
        "--workdir", default=None, help="where to write checkpoints (default: a temp dir)"
    )
    p.set_defaults(func=_cmd_demo)
    return parser


def _one_line(error: BaseException | str) -> str:
    """An error message on one line: its lines joined with ``'; '``."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns its exit status: 0, 1 for bad input or a failed
    write (and for differences ``verify`` or errors ``check`` finds), 2 for a usage
    error, 130 when interrupted."""
    if "numpy" not in sys.modules:
        # No command multiplies matrices: numpy's BLAS threads, started on its import,
        # would only spin beside the threads that read and write (80 ms of CPU here).
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        # A warning is one line too (e.g. a tie config.json declares that cannot be named).
        print(f"jaxshare {args.command}: warning: {_one_line(message)}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            return args.func(args)
    except UsageError as e:
        print(f"jaxshare {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # A framework the input or output needs is absent.
        hint = e if "jaxshare[" in str(e) else missing_extra(e, "this")
        if hint is None:
            raise
        print(f"jaxshare {args.command}: {_one_line(hint)}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError, KeyError) as e:
        message = _one_line(e)
        if isinstance(e, KeyError) and e.args:
            message = str(e.args[0])
        print(f"jaxshare {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"jaxshare {args.command}: interrupted; no output was left behind.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
