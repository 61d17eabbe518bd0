"""Packages whose public names are imported on first use.

``import jaxshare`` and ``import bridge`` should cost little: the ``jaxshare``
command's ``--help`` imports no JAX, and reading a DeepSpeed folder into a
safetensors file imports no JAX either. A package lists where each public name
lives and hands :func:`exports` its ``__name__``; ``__getattr__`` imports a
name's module the first time the name is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public names live in the
    modules ``homes`` gives (a home equal to ``package.name`` is a subpackage).

    >>> getattr_, dir_ = exports("jaxshare", {"AliasMap": "jaxshare._alias"})
    >>> getattr_("AliasMap").__name__
    'AliasMap'
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        setattr(sys.modules[package], name, value)  # Later look-ups skip this function.
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
