"""The ``jaxshare`` command (the top layer): ``main`` is its entry point."""

from jaxshare.cli._main import main

__all__ = ["main"]
