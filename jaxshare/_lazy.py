"""Packages whose public names are imported on first use, listed once.

``import jaxshare`` and ``import bridge`` should cost little: the ``jaxshare``
command's ``--help`` imports no JAX, and reading a DeepSpeed folder into a
safetensors file imports neither JAX nor torch. A package lists, once, which
module is the home of each public name (as ``lazy_loader.attach`` does);
:func:`exports` derives its ``__all__`` from that list and gives the
``__getattr__`` that imports a name's home the first time the name is used.

A home that needs an optional framework which is not installed (torch,
transformers) fails on that first use with one line naming the extra to
install; the rest of the package works without it. A name that moved keeps
working for a while from its old place, with a ``DeprecationWarning`` naming
the new one.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["EXTRAS", "exports", "missing_extra"]

#: Optional frameworks -> the ``jaxshare`` extra that installs them.
EXTRAS = {"torch": "torch", "transformers": "hf"}


def exports(
    package: str,
    homes: Mapping[str, Iterable[str]],
    *,
    submodules: Iterable[str] = (),
    moved: Mapping[str, str] | None = None,
    renamed: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``.

    Args:
      package: the package's ``__name__``.
      homes: ``{module: names it defines}``: the one list of the package's
        public names, grouped by home.
      submodules: public subpackages (``"checkpoint"`` for
        ``jaxshare.checkpoint``), imported on first use too.
      moved: ``{old name: module that now exports it}``: names that work from
        here with a ``DeprecationWarning``; not in ``__all__``.
      renamed: ``{old name: new name}`` of names this package renamed: the old
        one works with a ``DeprecationWarning``; not in ``__all__``.

    >>> getattr_, dir_, all_ = exports("jaxshare", {"jaxshare.core.alias": ["AliasMap"]})
    >>> getattr_("AliasMap").__name__, all_
    ('AliasMap', ['AliasMap'])
    """
    where = {name: home for home, names in homes.items() for name in names}
    subs = tuple(submodules)
    moved = dict(moved or {})
    renamed = dict(renamed or {})
    public = sorted([*where, *subs])
    if len(public) != len(set(public)):
        twice = sorted({n for n in public if public.count(n) > 1})
        raise ValueError(f"{package}: {twice} are listed twice in its exports.")

    def __getattr__(name: str) -> Any:
        if name in subs:
            value = _import(f"{package}.{name}", package, name)
        elif name in where:
            value = getattr(_import(where[name], package, name), name)
        elif name in moved:
            warnings.warn(
                f"`{package}.{name}` moved to `{moved[name]}.{name}`; import it from there.",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        elif name in renamed:
            warnings.warn(
                f"`{package}.{name}` is now `{package}.{renamed[name]}`; use that name.",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(sys.modules[package], renamed[name])
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # Later look-ups skip this function.
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return __getattr__, __dir__, public


def missing_extra(error: ModuleNotFoundError, what: str) -> ModuleNotFoundError | None:
    """The one-line error saying that ``what`` needs the optional framework ``error``
    found missing, and which extra installs it; ``None`` if it is no optional one.

    >>> str(missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"), "this"))
    "this needs torch, which is not installed; install it with `pip install 'jaxshare[torch]'`."
    """
    framework = (error.name or "").partition(".")[0]
    extra = EXTRAS.get(framework)
    if extra is None:
        return None
    return ModuleNotFoundError(
        f"{what} needs {framework}, which is not installed; install it with "
        f"`pip install 'jaxshare[{extra}]'`.",
        name=framework,
    )


def _import(module: str, package: str, name: str) -> Any:
    """Imports ``module``; a missing optional framework is one line naming its extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise (missing_extra(e, f"`{package}.{name}`") or e) from None
