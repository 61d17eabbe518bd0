"""PyTorch weight files by their bytes: the suffixes, and what a file looks like.

``torch.save`` writes a zip archive (since torch 1.6) or, in the legacy format,
a pickle stream. A file that is neither is not a PyTorch file whatever its
suffix says, and is refused as such before torch ever sees it: random bytes or
a JSON file named ``.bin`` are not "a pickle that would run code".
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TORCH_SUFFIXES", "WEIGHT_SUFFIXES", "check_torch_file", "looks_like_torch_file"]

#: Suffixes of PyTorch pickle/zip weight files.
TORCH_SUFFIXES = (".pt", ".bin", ".pth")
#: Suffixes of every weight file jaxshare reads.
WEIGHT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)

_ZIP = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"


def looks_like_torch_file(path: str | os.PathLike) -> bool:
    """Whether the file starts like ``torch.save`` output: a zip archive or a
    pickle stream (protocol 2 or higher, as torch writes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if head.startswith((_ZIP, _EMPTY_ZIP)):
        return True
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def check_torch_file(path: str | os.PathLike) -> None:
    """Raises unless ``path`` looks like a PyTorch file.

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line: the file is not a PyTorch zip or pickle file.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/w.bin"
    >>> _ = Path(path).write_text('{"not": "weights"}')
    >>> check_torch_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ...w.bin: not a PyTorch/zip/pickle file (it starts with b'{"no'...
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: expected a PyTorch weights file, found a directory.")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if not looks_like_torch_file(path):
        with open(path, "rb") as f:
            head = f.read(4)
        found = "an empty file" if not head else f"it starts with {head!r}"
        raise ValueError(
            f"{path}: not a PyTorch/zip/pickle file ({found}); expected the output of `torch.save`."
        )
