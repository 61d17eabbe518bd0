"""What the ``jaxshare`` command prints: tie tables and progress, with ``rich``.

On a terminal, tables are drawn with a rule under the header and progress is a
live bar with tensors, bytes per second and time left. Anywhere else (a pipe, a
file, a test's captured output) the output is plain and stable: tables as
space-aligned columns with no colour or box characters, and no progress bar,
only one summary line once the work is done.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from jaxshare.internal import format_bytes
from jaxshare.stream import ProgressFn, TieReport

if TYPE_CHECKING:  # rich is imported where it draws (a summary line needs none of it).
    from rich.console import Console
    from rich.table import Table

    from bridge import CheckReport, VerifyReport

__all__ = ["print_check", "print_report", "print_verify", "progress_bar", "report_lines"]


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    # Off a terminal: no colour, and a width no table reaches, so lines never wrap.
    if stream.isatty():
        return Console(file=stream, highlight=False)
    return Console(file=stream, width=100_000, no_color=True, highlight=False)


def _table(report: TieReport, terminal: bool) -> Table:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD if terminal else None,
        show_edge=False,
        pad_edge=False,
        header_style="bold" if terminal else "",
    )
    for name in ("canonical", "aliases", "origin", "shape", "dtype"):
        table.add_column(name)
    table.add_column("bytes each", justify="right")
    for group in report.to_dict()["tie_groups"]:
        aliases = ", ".join(
            a["path"]
            + (f" (permute {a['permute']})" if a["permute"] else "")
            + (" (written out)" if a["written_out"] else "")
            + (" (implicit: computed, no leaf)" if a.get("implicit") else "")
            for a in group["aliases"]
        )
        cells = (
            group["canonical"],
            aliases,
            ", ".join(group["origins"]),
            str(tuple(group["shape"])),
            group["dtype"],
            format_bytes(group["bytes_each"]),
        )
        table.add_row(*(Text(c) for c in cells))  # Text: names are never read as markup.
    return table


def report_lines(report: TieReport) -> tuple[str, str]:
    """The heading and the byte summary around the tie table."""
    heading = (
        f"{report.source} ({report.kind}): {len(report.arrays)} arrays, {len(report.stored)} stored"
    )
    summary = (
        f"bytes stored: {format_bytes(report.bytes_stored)}   with aliases written out: "
        f"{format_bytes(report.bytes_total)}   saved by dedupe: {format_bytes(report.bytes_saved)}"
    )
    return heading, summary


def print_report(report: TieReport, stream: TextIO | None = None) -> None:
    """Prints ``report``: a heading, the tie groups as a table, the byte counts."""
    from rich.text import Text

    stream = stream or sys.stdout
    console = _console(stream)
    heading, summary = report_lines(report)
    console.print(Text(heading))
    for part in report.parts:
        console.print(Text(f"  {part}"))
    for note in report.notes:
        console.print(Text(f"  {note}"))
    if report.assets:
        console.print(Text(f"  assets, carried with the weights: {', '.join(report.assets)}"))
    if report.other_files:
        listed = ", ".join(report.other_files)
        console.print(Text(f"  other files, neither read nor carried: {listed}"))
    if report.chunks:
        console.print(Text("  chunks:"))
        for line in report.chunks:
            console.print(Text(f"    {line}"))
    if report.alias_map:
        console.print(_table(report, stream.isatty()))
    else:
        console.print("no ties")
    stacks = report.stacks
    if stacks:
        console.print(Text(f"stacks of layers: {len(stacks)}"))
        for path, (name, layers, axis) in stacks.items():
            info = report.arrays[path]
            console.print(
                Text(
                    f"  {path}  {layers} layers on axis {axis}  {info.shape} {info.dtype}  "
                    f"<- {name}"
                )
            )
    console.print(Text(summary))


def print_check(report: CheckReport, stream: TextIO | None = None) -> None:
    """Prints ``report`` (:func:`bridge.check`'s): one line per finding, the notes,
    the summary."""
    from rich.text import Text

    console = _console(stream or sys.stdout)
    for line in report.lines():
        console.print(Text(line))


def print_verify(report: VerifyReport, stream: TextIO | None = None) -> None:
    """Prints ``report`` (:func:`bridge.verify`'s): one line per finding (the first
    ``limit`` differences), the notes, the summary."""
    from rich.text import Text

    console = _console(stream or sys.stdout)
    for line in report.lines():
        console.print(Text(line))


def _rate(bytes_per_second: float) -> str:
    """A transfer rate in decimal units, as disks are measured: ``'1.23 GB/s'``
    (``'45.6 MB/s'`` under 0.1 GB/s)."""
    if bytes_per_second >= 1e8:
        return f"{bytes_per_second / 1e9:.2f} GB/s"
    return f"{bytes_per_second / 1e6:.1f} MB/s"


@contextmanager
def progress_bar(
    enabled: bool = True, stream: TextIO | None = None, what: str = "tensors"
) -> Iterator[ProgressFn | None]:
    """Yields a ``progress(done, total, name, nbytes)`` callback, or ``None`` when
    disabled. On a terminal it drives a live bar; elsewhere it prints one
    summary line when the block ends without an error."""
    if not enabled:
        yield None
        return
    stream = stream or sys.stderr
    start = time.monotonic()
    state = {"done": 0, "bytes": 0}
    if not stream.isatty():  # One plain line: rich is not even imported.

        def record(done: int, total: int, name: str, nbytes: int) -> None:
            state["done"] = done
            state["bytes"] += nbytes

        yield record
        seconds = max(time.monotonic() - start, 1e-9)
        print(
            f"{state['done']} {what}, {format_bytes(state['bytes'])} in {seconds:.1f} s "
            f"({_rate(state['bytes'] / seconds)})",
            file=stream,
        )
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = _console(stream)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(what + "  {task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("", total=None, rate="")

        def update(done: int, total: int, name: str, nbytes: int) -> None:
            state["bytes"] += nbytes
            rate = state["bytes"] / max(time.monotonic() - start, 1e-9)
            bar.update(
                task,
                completed=done,
                total=total,
                description=name[-40:],
                rate=f"{format_bytes(state['bytes'])}  {_rate(rate)}",
            )

        yield update
