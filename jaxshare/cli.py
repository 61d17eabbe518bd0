"""The ``jaxshare`` command: ``inspect``, ``convert``, ``demo``.

The CLI is the top of the stack: it dispatches on what a path is. Orbax items
are handled by ``jaxshare.checkpoint``; PyTorch files (``.safetensors``, ``.pt``,
``.bin``, ``.pth``) by the PyTorch ``bridge``, imported only for them, so the
JAX-only commands work without torch installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

TORCH_SUFFIXES = (".pt", ".bin", ".pth")
FILE_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _bridge():
    try:
        import bridge
    except ImportError as e:
        raise CLIError(
            f"PyTorch files need the PyTorch bridge ({e}); install it with "
            "`pip install 'jaxshare[torch]'`."
        ) from e
    return bridge


def _is_weights_file(path: Path) -> bool:
    return path.suffix in FILE_SUFFIXES


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise CLIError(f"{path}: no such file or directory.")
    if path.is_dir():
        from jaxshare import checkpoint

        report = checkpoint.inspect(path)
    elif _is_weights_file(path):
        report = _bridge().inspect(path)
    else:
        raise CLIError(
            f"{path}: expected an Orbax checkpoint directory or a weights file "
            f"({', '.join(FILE_SUFFIXES)})."
        )
    print(report.to_json() if args.json else report.format_table())
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from jaxshare._progress import progress_bar

    src, dst = Path(args.src), Path(args.dst)
    progress = progress_bar(not args.quiet)
    if not src.exists():
        raise CLIError(f"{src}: no such file or directory.")
    if src.is_dir():
        if dst.suffix not in FILE_SUFFIXES:
            raise CLIError(
                f"{dst}: converting an Orbax checkpoint writes a weights file; give it "
                f"one of the suffixes {', '.join(FILE_SUFFIXES)}."
            )
        names = args.names or ("torch" if dst.suffix in TORCH_SUFFIXES else "flax")
        if names == "flax":
            if dst.suffix != ".safetensors":
                raise CLIError(f"{dst}: Flax names are written to .safetensors only.")
            from jaxshare import checkpoint

            checkpoint.consolidate_to_safetensors(
                src, dst, dtype=args.dtype, force=args.force, progress=progress
            )
        else:
            _bridge().convert_from_orbax(
                src, dst, dtype=args.dtype, force=args.force, progress=progress
            )
    elif _is_weights_file(src):
        _bridge().convert_to_orbax(src, dst, dtype=args.dtype, force=args.force, progress=progress)
    else:
        raise CLIError(
            f"{src}: expected an Orbax checkpoint directory or a weights file "
            f"({', '.join(FILE_SUFFIXES)})."
        )
    print(f"wrote {dst}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from jaxshare._demo import run

    run(workdir=args.workdir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxshare",
        description="Find, keep and carry tied weights across JAX, Orbax and PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show the tie groups of a checkpoint or weights file")
    p.add_argument("path", help="Orbax checkpoint item directory, .safetensors, .pt or .bin")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "convert",
        help="PyTorch file -> Orbax checkpoint, or Orbax checkpoint -> .safetensors/.pt",
    )
    p.add_argument("src", help="Orbax checkpoint item directory, or a PyTorch weights file")
    p.add_argument("dst", help="output: a directory for Orbax, or .safetensors/.pt/.bin")
    p.add_argument("--dtype", default=None, help="cast floating arrays, e.g. float32")
    p.add_argument(
        "--names",
        choices=("flax", "torch"),
        default=None,
        help="naming of an Orbax -> file conversion: Flax '/' paths or PyTorch names "
        "(default: flax for .safetensors, torch for .pt/.bin)",
    )
    p.add_argument("--force", action="store_true", help="overwrite DST if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("demo", help="the end-to-end story on a small built-in tied model")
    p.add_argument("--workdir", default=None, help="where to write checkpoints (default: a temp dir)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CLIError as e:
        print(f"jaxshare {args.command}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, FileExistsError) as e:
        print(f"jaxshare {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
