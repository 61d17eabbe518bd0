"""What a PyTorch DCP folder is, told from its file names alone.

The readers' table (:data:`jaxshare.formats.READERS`) asks every path this, so it
imports nothing the reading needs.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxshare.formats.item_files import DCP_METADATA_FILE

__all__ = ["DISTCP_SUFFIX", "is_dcp_folder"]

#: The suffix of DCP's data files (``__{rank}_{i}.distcp``).
DISTCP_SUFFIX = ".distcp"


def is_dcp_folder(path: str | os.PathLike, /) -> bool:
    """Whether ``path`` is a directory holding a DCP ``.metadata`` and ``.distcp`` files.

    >>> import tempfile
    >>> is_dcp_folder(tempfile.mkdtemp())
    False
    """
    path = Path(path)
    return (
        path.is_dir()
        and (path / DCP_METADATA_FILE).is_file()
        and any(p.suffix == DISTCP_SUFFIX for p in path.iterdir())
    )
