"""``FrozenMapping``: the immutable mapping every record of jaxshare is.

An alias map, a naming record and a manifest are each a mapping from a path or a
name to what is recorded of it, checked when it is made and never changed after:
a dict of their own (``_entries``) behind the read-only ``Mapping`` interface,
kept in one place here. Each record adds its own checks, equality and JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["FrozenMapping"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMapping(Mapping[K, V]):
    """A read-only mapping over the dict ``_entries``, which a subclass fills once.

    >>> class Squares(FrozenMapping[int, int]):
    ...     __slots__ = ("_entries",)
    ...     def __init__(self, n: int) -> None:
    ...         self._entries = {i: i * i for i in range(n)}
    >>> dict(Squares(3)), len(Squares(3)), 2 in Squares(3)
    ({0: 0, 1: 1, 2: 4}, 3, True)
    """

    __slots__ = ()
    _entries: dict[Any, Any]

    def __getitem__(self, key: K) -> V:
        return self._entries[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
