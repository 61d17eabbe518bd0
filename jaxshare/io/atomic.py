"""Writing outputs safely: a temporary name beside the destination, then a rename.

Every file and directory jaxshare writes goes through :func:`atomic_output`:

- the output is written at a temporary name beside its destination
  (``.NAME.jaxshare-tmp-PID-RANDOM``) and renamed into place only when complete,
  so a crash, a full disk or an error never leaves a half-written output, and a
  previous output at the destination stays intact until the new one is whole;
- an existing destination is replaced only with ``force=True``, and only when it
  is an output of the same kind (a ``.safetensors`` file for a ``.safetensors``
  output, an Orbax item for an item...): ``--force`` never deletes a source, a
  directory of unrelated files or a file of another format;
- the destination must not be one of the inputs, reached by any path (symlinks,
  hard links, relative paths), nor lie inside an input directory, nor contain
  one;
- missing parent directories are created, and removed again if the write
  fails;
- temporary names left by a killed run carry its process id: the next write to
  the same destination removes those whose process is gone.

The files inside an output are written by :mod:`jaxshare.io.output_file`; the small
ones by :func:`write_synced`, and their names made durable by :func:`fsync_dir`,
before the rename.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OutputKind",
    "atomic_output",
    "check_not_an_input",
    "destination_of",
    "fsync_dir",
    "remove_path",
    "write_synced",
]

_TMP = ".jaxshare-tmp-"
_OLD = ".jaxshare-old-"


@dataclass(frozen=True)
class OutputKind:
    """What an output is, so that ``force`` replaces only its own kind.

    Attributes:
      name: how messages call it, e.g. ``"a .safetensors file"``.
      is_dir: whether the output is a directory.
      matches: whether an existing path is an output of this kind.
    """

    name: str
    is_dir: bool
    matches: Callable[[Path], bool]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
    except ValueError:
        return False
    return child != parent


def check_not_an_input(dst: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """Refuses a destination that is an input, lies inside one, or contains one.

    Paths are compared resolved (symlinks followed) and by device and inode, so
    hard links and relative spellings of one file are caught too.

    Raises:
      ValueError: one line naming both paths.

    >>> check_not_an_input(Path("/tmp/out"), ["/tmp/in.safetensors"])
    """
    target = dst.resolve()
    target_id = _identity(dst)
    for raw in inputs:
        src = Path(raw)
        source = src.resolve()
        if source == target or (target_id is not None and _identity(src) == target_id):
            raise ValueError(
                f"{dst}: the output is the input {src}; write to another path (the input is "
                "never overwritten, not even with --force)."
            )
        if _inside(target, source):
            raise ValueError(
                f"{dst}: the output would lie inside the input {src}; write it elsewhere."
            )
        if _inside(source, target):
            raise ValueError(
                f"{dst}: the output would replace a directory that holds the input {src}; "
                "write it elsewhere."
            )


def remove_path(path: Path) -> None:
    """Removes a file, a symlink or a directory tree; nothing if it is absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(dst: Path) -> list[tuple[Path, str, int]]:
    """Temporary and displaced outputs of ``dst`` left by earlier runs:
    ``(path, marker, pid)``."""
    out = []
    prefix = f".{dst.name}"
    with contextlib.suppress(OSError):
        for sibling in dst.parent.iterdir():
            name = sibling.name
            if not name.startswith(prefix):
                continue
            for marker in (_TMP, _OLD):
                rest = name[len(prefix) :]
                if rest.startswith(marker):
                    pid = rest[len(marker) :].split("-", 1)[0]
                    if pid.isdigit():
                        out.append((sibling, marker, int(pid)))
    return out


def _clean_leftovers(dst: Path) -> None:
    """Removes what killed runs left beside ``dst``; a displaced previous output
    whose replacement never arrived is put back first."""
    for path, marker, pid in _leftovers(dst):
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if marker == _OLD and not dst.exists() and not dst.is_symlink():
            with contextlib.suppress(OSError):
                os.rename(path, dst)
                continue
        remove_path(path)


def destination_of(path: str | os.PathLike) -> str:
    """The destination a temporary path of :func:`atomic_output` stands for, for
    messages (any other path is returned as it is).

    >>> destination_of("/runs/.ckpt.jaxshare-tmp-123-abcd")
    '/runs/ckpt'
    """
    path = Path(path)
    name = path.name
    if name.startswith(".") and _TMP in name:
        return str(path.with_name(name[1 : name.index(_TMP)]))
    return str(path)


def _make_parents(dst: Path) -> list[Path]:
    """Creates the missing parents of ``dst``; returns those created, deepest first."""
    created = []
    parent = dst.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{dst}: {parent} is a file, not a directory.")
    for path in reversed(created):
        path.mkdir()
    return created


def _remove_empty(dirs: list[Path]) -> None:
    for path in dirs:  # Deepest first; a directory something else filled stays.
        with contextlib.suppress(OSError):
            path.rmdir()


def _check_destination(dst: Path, kind: OutputKind, force: bool) -> None:
    if not dst.exists() and not dst.is_symlink():
        return
    if not force:
        raise FileExistsError(
            f"{dst} already exists; pass --force (`force=True`) to replace it, or choose "
            "another path."
        )
    if dst.is_symlink():
        raise ValueError(
            f"{dst} is a symbolic link; --force replaces only {kind.name}, never a link. "
            "Remove it or choose another path."
        )
    if not kind.matches(dst):
        raise ValueError(
            f"{dst}: {_describe(dst)}, not {kind.name}; --force replaces only "
            f"{kind.name}. Remove it yourself or choose another path."
        )


def _describe(path: Path) -> str:
    """What is at ``path``, for messages."""
    if path.is_dir():
        try:
            names = sorted(p.name for p in path.iterdir())
        except OSError:
            return "it is a directory"
        if not names:
            return "it is an empty directory"
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} entries)" if len(names) > 3 else "")
        return f"it is a directory holding {shown}"
    return f"it is a file of {path.stat().st_size} bytes"


@contextlib.contextmanager
def atomic_output(
    dst: str | os.PathLike,
    kind: OutputKind,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    token: str | None = None,
    commit: bool = True,
) -> Iterator[Path]:
    """Yields a temporary path beside ``dst`` to write the output at; renames it
    to ``dst`` when the block ends without an error, removes it otherwise.

    With ``force``, an existing ``dst`` of the same kind is replaced: it is moved
    aside, the new output renamed into place, then the old one removed; until
    the new output is complete the old one is untouched.

    Args:
      dst: the destination.
      kind: what the output is (see :class:`OutputKind`).
      force: replace an existing output of the same kind.
      inputs: paths the output is made from; ``dst`` may be none of them.
      token: names the temporary path (default: this process and a random
        suffix); the processes of a multi-process job that write one output
        together pass the same token.
      commit: whether this process renames the output into place (and cleans
        up); in a multi-process job only the primary process does, after the
        others have written their part.

    Raises:
      FileExistsError: ``dst`` exists and ``force`` is false.
      NotADirectoryError: a parent of ``dst`` is a file.
      ValueError: ``dst`` is an input, is inside or contains one, or (with
        ``force``) holds something that is not an output of this kind.

    >>> import tempfile
    >>> dst = Path(tempfile.mkdtemp()) / "out.txt"
    >>> FILE = OutputKind("a text file", False, lambda p: p.suffix == ".txt")
    >>> with atomic_output(dst, FILE) as tmp:
    ...     _ = tmp.write_text("hello")
    >>> dst.read_text()
    'hello'
    """
    dst = Path(dst)
    check_not_an_input(dst, inputs)
    if commit:
        _clean_leftovers(dst)
    _check_destination(dst, kind, force)
    tmp = dst.with_name(f".{dst.name}{_TMP}{token or f'{os.getpid()}-{secrets.token_hex(4)}'}")
    if not commit:
        yield tmp
        return
    created = _make_parents(dst)
    done = False
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"{dst}: nothing was written (internal error).")
        if dst.exists() or dst.is_symlink():
            _check_destination(dst, kind, force)  # Still ours to replace?
            old = dst.with_name(f".{dst.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}")
            os.rename(dst, old)
            try:
                os.rename(tmp, dst)
            except BaseException:
                os.rename(old, dst)
                raise
            remove_path(old)
        else:
            os.rename(tmp, dst)
        fsync_dir(dst.parent)
        done = True
    finally:
        remove_path(tmp)
        if not done:
            _remove_empty(created)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` as the file ``path`` and ``fsync`` s it: a small file of an
    output, on disk before the output is renamed into place."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Makes the names in the directory ``path`` durable (the files created in it, a
    rename), where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # Some file systems cannot fsync a directory.
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)
