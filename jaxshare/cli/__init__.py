"""The ``jaxshare`` command (the top layer): ``main`` is its entry point."""

import typing as _typing

from jaxshare.internal import exports as _exports

if _typing.TYPE_CHECKING:
    from jaxshare.cli._main import main as main

__getattr__, __dir__, __all__ = _exports(__name__, {"jaxshare.cli._main": ["main"]})
