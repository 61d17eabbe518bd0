"""Axis permutations: the one home of ``Perm`` and everything done with one.

A tie across an axis-order change (PyTorch ``lm_head.weight`` tied to ``wte.weight``
is Flax ``lm_head/kernel == wte/embedding.T``) carries an axis permutation, in
the convention of ``numpy.transpose``: ``out.shape[i] == x.shape[perm[i]]``.
The identity is always normalised to ``None``, so "no transform" has one
spelling. Nothing here imports JAX: ``jaxshare inspect`` of a file uses
permutations without paying for it, and a JAX array can only be handed in once
JAX is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Perm", "as_perm", "compose", "inverse", "permute_shape", "transpose"]

Perm = tuple[int, ...]


def as_perm(value: Any, what: str = "permutation") -> Perm | None:
    """Validates a permutation given as any sequence of ints; the identity is ``None``.

    Raises:
      TypeError: ``value`` is not a sequence.
      ValueError: ``value`` is not a permutation of ``0..n-1``.

    >>> as_perm([1, 0]), as_perm((0, 1)), as_perm(None)
    ((1, 0), None, None)
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{what} must be a sequence of axis indices, got {type(value).__name__}: {value!r}"
        )
    perm = tuple(value)
    if any(type(i) is not int for i in perm) or sorted(perm) != list(range(len(perm))):
        raise ValueError(
            f"{what} must be a permutation of 0..n-1 (as for `numpy.transpose`), "
            f"got {list(value)!r}."
        )
    return None if perm == tuple(range(len(perm))) else perm


def compose(outer: Perm | None, inner: Perm | None, where: str = "") -> Perm | None:
    """The permutation of ``transpose(transpose(x, inner), outer)`` as one transpose.

    Raises:
      ValueError: the two permute a different number of axes; ``where`` is
        appended to the message.

    >>> compose((1, 0), (1, 0)) is None
    True
    >>> compose((2, 0, 1), None)
    (2, 0, 1)
    """
    if outer is None:
        return inner
    if inner is None:
        return outer
    if len(outer) != len(inner):
        raise ValueError(
            f"cannot compose transforms {list(outer)} and {list(inner)}{where}: they "
            "permute a different number of axes."
        )
    perm = tuple(inner[i] for i in outer)
    return None if perm == tuple(range(len(perm))) else perm


def inverse(perm: Perm | None) -> Perm | None:
    """The permutation that undoes ``perm``.

    >>> inverse((2, 0, 1)), inverse(None)
    ((1, 2, 0), None)
    """
    if perm is None:
        return None
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def permute_shape(shape: Sequence[int], perm: Perm | None) -> tuple[int, ...]:
    """``shape`` after ``transpose(perm)``.

    Raises:
      ValueError: ``perm`` permutes another number of axes than ``shape`` has.

    >>> permute_shape((2, 3, 5), (2, 0, 1))
    (5, 2, 3)
    """
    if perm is None:
        return tuple(shape)
    if len(perm) != len(shape):
        raise ValueError(
            f"transform {list(perm)} permutes {len(perm)} axes, but the shape "
            f"{tuple(shape)} has {len(shape)}."
        )
    return tuple(shape[i] for i in perm)


def transpose(x: Any, perm: Perm | None, where: str = "the array") -> Any:
    """``x`` transposed by ``perm``: a numpy or JAX array, or a ``jax.ShapeDtypeStruct``
    (a restore target; permuted abstractly, its sharding dropped, as it does not
    carry over to the transposed axis order).

    Raises:
      TypeError: ``x`` is not an array.
      ValueError: ``perm`` does not fit ``x``'s rank; messages start with ``where``
        (e.g. ``"alias 'lm_head/kernel'"``).

    >>> import numpy as np
    >>> transpose(np.zeros((2, 3)), (1, 0)).shape
    (3, 2)
    """
    if perm is None:
        return x
    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        raise TypeError(
            f"{where} has transform {list(perm)}, which applies to arrays; its "
            f"canonical is a {type(x).__name__}."
        )
    try:
        new_shape = permute_shape(shape, perm)
    except ValueError:
        raise ValueError(
            f"{where} has transform {list(perm)} for {len(perm)} axes, but its "
            f"canonical has shape {tuple(shape)}."
        ) from None
    if isinstance(x, np.ndarray):
        return np.transpose(x, perm)
    jax = sys.modules.get("jax")  # A JAX value means JAX is imported already.
    if jax is not None and isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(new_shape, x.dtype)
    if jax is not None and isinstance(x, jax.Array):
        return jax.numpy.transpose(x, perm)
    raise TypeError(
        f"{where} has transform {list(perm)}, which applies to arrays; its "
        f"canonical is a {type(x).__name__}."
    )
