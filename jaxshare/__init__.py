"""jaxshare: find tied weights in JAX pytrees and NNX graphs, and keep them.

The public API, re-exported here; each name lives in a private module with one
concept. ``jaxshare.checkpoint`` (Orbax) is imported on first use, and nothing in
``jaxshare`` imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from jaxshare._alias import AliasMap
from jaxshare._find import find_shared
from jaxshare._tie import dedupe
from jaxshare._tie import retie
from jaxshare._tied import Tied
from jaxshare._tied import tie

__version__ = "0.1.0"

__all__ = [
    "AliasMap",
    "Tied",
    "checkpoint",
    "dedupe",
    "find_shared",
    "retie",
    "tie",
]


def __getattr__(name: str) -> Any:
    if name == "checkpoint":  # Imports Orbax, which is slow: only when asked for.
        return importlib.import_module("jaxshare.checkpoint")
    raise AttributeError(f"module 'jaxshare' has no attribute {name!r}")
