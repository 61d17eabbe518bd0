"""The Hugging Face directory's reader: the last one ``bridge.open_source`` tries.

A path is a Hugging Face directory when it holds a model's weights beside its
``config.json`` (or is its ``*.index.json``, or that ``config.json``): told from
file names alone, with none of what reading the directory needs (its config's
ties, the table of model classes) imported until a directory is opened. A directory
of a mixture of experts saved fused (``save_original_format=False``) reads in the
per-expert names (:mod:`bridge.hf.experts`).
"""

from __future__ import annotations

from pathlib import Path

from bridge.layouts.rules import Rules
from jaxshare.formats import CONFIG_FILE, INDEX_SUFFIX, Reader, is_hf_input
from jaxshare.stream import TensorSource

__all__ = ["READER"]


def _open(path: Path, *, rules: Rules | None = None, as_stored: bool = False) -> TensorSource:
    from bridge.hf.directory import HFDirectory  # (Its config's ties: only to read one.)
    from bridge.hf.experts import per_expert

    # (A mixture of experts saved fused reads in the per-expert names save_pretrained
    # writes by default: both namings of one model convert alike. `as_stored`: the
    # names as the files hold them, for `check`.)
    directory = HFDirectory(path.parent if path.name == CONFIG_FILE else path, rules=rules)
    if as_stored:
        return directory
    try:
        return per_expert(directory)
    except BaseException:
        directory.close()
        raise


#: The reader of Hugging Face directories (given as the directory, its index or its
#: ``config.json``).
READER = Reader(
    "hf",
    f"a Hugging Face directory (or its *{INDEX_SUFFIX})",
    is_hf_input,
    _open,
    options=("rules", "as_stored"),
)
