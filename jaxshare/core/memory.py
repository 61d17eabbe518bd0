"""Ties by memory: names whose arrays are the same bytes.

A tensor stored under several names in a PyTorch file, a parameter a module
registers twice, the numpy views of one storage of a mapped file: each is one
memory reached by several names, and that is the tie. :class:`Extent` says where
an array's elements lie -- its device, the address of its first element, its
shape, byte strides and dtype -- and :func:`memory_ties` groups names by it, so
every reader and writer that ties by memory (PyTorch state dicts and files,
DeepSpeed's stored module, numpy leaves of a pytree) decides the same way.

Zero-size arrays have no memory: their addresses mean nothing, so they have no
extent and never tie by address.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from jaxshare.core.perm import Perm, compose

__all__ = ["Extent", "MemoryTies", "array_key", "memory_ties", "numpy_extent"]


@dataclass(frozen=True)
class Extent:
    """Where the elements of one (non-empty) array lie.

    Attributes:
      address: the address of its first element.
      shape: its shape.
      strides: its strides, in bytes.
      dtype: its dtype's name.
      itemsize: bytes per element.
      device: where the memory is; ``None`` for host memory.
    """

    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    itemsize: int
    device: Hashable = None

    @property
    def bounds(self) -> tuple[int, int]:
        """The byte range ``[lo, hi)`` its elements lie in (negative strides included)."""
        low = sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True) if s < 0)
        high = sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True) if s > 0)
        return self.address + low, self.address + high + self.itemsize

    def permutation_of(self, base: Extent) -> Perm | None:
        """``perm`` with this array the very view ``base.transpose(perm)``, if there is
        one other than the identity.

        >>> a = np.zeros((2, 3))
        >>> numpy_extent(a.T).permutation_of(numpy_extent(a))
        (1, 0)
        """
        if (
            (self.address, self.dtype, self.device) != (base.address, base.dtype, base.device)
            or len(self.shape) != len(base.shape)
            or len(self.shape) < 2
        ):
            return None
        free = list(range(len(base.shape)))
        perm = []
        for size, stride in zip(self.shape, self.strides, strict=True):
            j = next((j for j in free if (base.shape[j], base.strides[j]) == (size, stride)), None)
            if j is None:
                return None
            free.remove(j)
            perm.append(j)
        return tuple(perm) if perm != list(range(len(perm))) else None


def numpy_extent(array: np.ndarray) -> Extent | None:
    """The extent of a numpy array; ``None`` for a zero-size one.

    >>> a = np.zeros(10)
    >>> numpy_extent(a) == numpy_extent(a[:]), numpy_extent(a) == numpy_extent(a[:5])
    (True, False)
    """
    if not array.size:
        return None
    return Extent(
        array.__array_interface__["data"][0],
        tuple(array.shape),
        tuple(array.strides),
        array.dtype.name,
        array.dtype.itemsize,
    )


def array_key(array: np.ndarray) -> Hashable:
    """What makes two numpy arrays one: their extent, or -- for a zero-size array,
    which has no memory -- the very array object (the same object twice is one
    array, as a pickle gives a tensor stored under two names).

    >>> empty = np.zeros(0)
    >>> array_key(empty) == array_key(empty), array_key(empty) == array_key(np.zeros(0))
    (True, False)
    """
    return numpy_extent(array) or ("object", id(array))


@dataclass(frozen=True)
class MemoryTies:
    """What :func:`memory_ties` found.

    Attributes:
      aliases: ``{alias: canonical}``, aliases in the given order; the canonical
        of each tie is its first name.
      transforms: ``{alias: permutation}`` of the aliases that are permuted views
        of their canonical (only with ``views=True``).
      overlaps: pairs ``(name, earlier name)`` whose memory overlaps without one
        being the other or a permutation of it (only with ``views=True``): one
        memory that cannot be stored once.
    """

    aliases: dict[str, str]
    transforms: dict[str, Perm] = field(default_factory=dict)
    overlaps: list[tuple[str, str]] = field(default_factory=list)


def memory_ties(keys: Mapping[str, Hashable | None], /, *, views: bool = False) -> MemoryTies:
    """Ties the names whose keys are equal: an :class:`Extent` (one memory), or any
    other hashable that makes two values one (a ZeRO-3 ``ds_id``, an object's id).
    ``None`` never ties.

    With ``views``, an :class:`Extent` that is a permuted view of an earlier one
    (same first element, shape and strides permuted) is an alias of it with that
    permutation, and other overlapping extents are reported.

    Args:
      keys: ``{name: key}`` in the order that decides canonicals.
      views: also tie permuted views, and report overlaps.

    >>> w = np.zeros((2, 3))
    >>> ties = memory_ties({n: numpy_extent(a) for n, a in
    ...                     {"w": w, "v": w[:], "w_t": w.T, "row": w[1]}.items()}, views=True)
    >>> ties.aliases, ties.transforms, ties.overlaps
    ({'v': 'w', 'w_t': 'w'}, {'w_t': (1, 0)}, [('row', 'w')])
    """
    first: dict[Hashable, str] = {}
    aliases: dict[str, str] = {}
    for name, key in keys.items():
        if key is None:
            continue
        canonical = first.setdefault(key, name)
        if canonical != name:
            aliases[name] = canonical
    if not views:
        return MemoryTies(aliases)
    transforms: dict[str, Perm] = {}
    overlaps: list[tuple[str, str]] = []
    order = {name: i for i, name in enumerate(keys)}
    extents = {n: k for n, k in keys.items() if n not in aliases and isinstance(k, Extent)}
    for name, partners in _overlapping(extents, order).items():
        kept = [p for p in partners if p not in aliases]
        for base in kept:
            perm = extents[name].permutation_of(extents[base])
            if perm is not None:
                aliases[name], transforms[name] = base, perm
                break
        else:
            overlaps += [(name, p) for p in kept]
    # A name the first pass tied to one that turned out a view: to that view's base.
    for alias, canonical in aliases.items():
        if canonical in aliases:
            perm = compose(transforms.get(alias), transforms.get(canonical))
            aliases[alias] = aliases[canonical]
            transforms.pop(alias, None)
            if perm is not None:
                transforms[alias] = perm
    aliases = dict(sorted(aliases.items(), key=lambda item: order[item[0]]))
    return MemoryTies(aliases, transforms, overlaps)


def _overlapping(extents: Mapping[str, Extent], order: Mapping[str, int]) -> dict[str, list[str]]:
    """``{name: earlier names whose memory overlaps it}``, names in ``order``: a sweep
    over the extents sorted by address, so arrays apart in memory cost no comparison."""
    found: dict[str, list[str]] = {}
    by_device: dict[Hashable, list[tuple[int, int, str]]] = {}
    for name, extent in extents.items():
        by_device.setdefault(extent.device, []).append((*extent.bounds, name))
    for spans in by_device.values():
        spans.sort()
        active: list[tuple[int, str]] = []  # (end, name) of the spans that may still overlap
        for lo, hi, name in spans:
            active = [(end, other) for end, other in active if end > lo]
            for _, other in active:
                later, earlier = sorted((name, other), key=order.__getitem__, reverse=True)
                found.setdefault(later, []).append(earlier)
            active.append((hi, name))
    return {
        n: sorted(found[n], key=order.__getitem__) for n in sorted(found, key=order.__getitem__)
    }
