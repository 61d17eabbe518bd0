"""``Tied``: a pytree of unique leaves that re-ties itself on demand.

``jax.jit``, ``jax.grad``, optax and buffer donation see a ``Tied`` as its unique
leaves only, with the alias map as static aux data. So a tie is one leaf
everywhere that matters: gradients of every use of a tied weight are summed into
it, optimizer state holds it once, and donation never meets one buffer twice.
Models read the full tree through :attr:`Tied.tree`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxshare.core.alias import AliasMap, as_alias_map
from jaxshare.core.edit import Absent, get_paths
from jaxshare.core.leafkey import By
from jaxshare.core.naming import NamingRecord
from jaxshare.core.tie import dedupe, retie

__all__ = ["Tied", "tie"]

_Aux = tuple[AliasMap, NamingRecord | None, frozenset[str]]


@jax.tree_util.register_pytree_with_keys_class
class Tied:
    """A unique tree plus the alias map that re-ties it.

    Args:
      unique: the tree without its aliases, as :func:`dedupe` returns it.
      alias_map: ``{alias: canonical}``; every canonical must be in ``unique``
        and no alias may hold a value there.

    >>> import jax, jax.numpy as jnp
    >>> emb = jnp.ones((3, 2))
    >>> t = tie({"wte": emb, "head": emb})
    >>> len(jax.tree_util.tree_leaves(t))  # one leaf for the tie
    1
    >>> full = t.tree
    >>> full["head"] is full["wte"]
    True
    >>> g = jax.grad(lambda t: t.tree["wte"].sum() + 2 * t.tree["head"].sum())(t)
    >>> g.unique  # gradients of both uses summed into the one leaf
    {'head': Array([[3., 3.],
           [3., 3.],
           [3., 3.]], dtype=float32)}
    """

    __slots__ = ("_unique", "_alias_map")

    def __init__(self, unique: Any, alias_map: Mapping[str, str] | None = None) -> None:
        amap = as_alias_map(alias_map)
        if amap:
            present = get_paths(unique, list(amap))
            held = [a for a, v in present.items() if not (isinstance(v, Absent) or v is None)]
            if held:
                raise ValueError(
                    f"`unique` holds values at alias paths {held}; build a Tied with "
                    "`jaxshare.tie(tree)`, which removes them, or from `dedupe`'s output."
                )
            retie(unique, amap)  # Checks that every canonical exists and transforms fit.
        self._unique = unique
        self._alias_map = amap

    @property
    def unique(self) -> Any:
        """The tree with every alias removed: what training and checkpoints store."""
        return self._unique

    @property
    def alias_map(self) -> AliasMap:
        """``{alias: canonical}``: the paths left out of :attr:`unique`, with their
        transforms and naming record."""
        return self._alias_map

    @property
    def tree(self) -> Any:
        """The full tree, every alias the same object as its canonical (or its transform)."""
        return retie(self._unique, self._alias_map)

    def replace(self, unique: Any) -> Tied:
        """A ``Tied`` with the same alias map over a new unique tree."""
        return Tied(unique, self._alias_map)

    # The aux data pairs the map with its naming record and implicit aliases: maps
    # with the same ties compare equal whatever their naming, but two Tieds are one
    # tree structure for JAX (e.g. one `jit` cache entry) only if their naming and
    # their implicit aliases (which `tree` leaves out) agree too.
    def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], _Aux]:
        return ((jax.tree_util.GetAttrKey("unique"), self._unique),), self._aux()

    def tree_flatten(self) -> tuple[tuple[Any], _Aux]:
        return (self._unique,), self._aux()

    def _aux(self) -> _Aux:
        return self._alias_map, self._alias_map.naming, self._alias_map.implicit

    @classmethod
    def tree_unflatten(cls, aux: _Aux, children: tuple[Any, ...]) -> Tied:
        # No validation: JAX rebuilds Tieds with tracers, placeholders and `None`s.
        obj = object.__new__(cls)
        (obj._unique,) = children
        obj._alias_map = aux[0]
        return obj

    def __repr__(self) -> str:
        return f"Tied(unique={self._unique!r}, alias_map={self._alias_map!r})"


def tie(
    tree: Any,
    /,
    alias_map: Mapping[str, str] | None = None,
    *,
    by: By = "identity",
    is_leaf: Callable[[Any], bool] | None = None,
) -> Tied:
    """Builds a :class:`Tied` from a full tree: ``Tied(*dedupe(tree, alias_map))``.

    >>> import jax.numpy as jnp
    >>> w = jnp.zeros(2)
    >>> tie({"a": w, "b": w}).alias_map
    AliasMap({'b': 'a'})
    """
    unique, amap = dedupe(tree, alias_map, by=by, is_leaf=is_leaf)
    return Tied(unique, amap)
