"""``UsageError``: a call whose arguments do not fit each other, or fit no input.

Bad input (a truncated file, an alias map with a cycle) is a ``ValueError``
naming the file. A usage error is the caller's to fix in the call itself -- an
option for another kind of output, a path of a kind jaxshare does not read --
and the ``jaxshare`` command exits with status 2 for it (1 for bad input). It
is a ``ValueError`` too, so a caller catching those catches both.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Arguments that do not fit each other or the input; the message says which.

    >>> isinstance(UsageError("`names` is for .safetensors outputs"), ValueError)
    True
    """
