"""Optax's side of an optimizer state: finding the Adam and SGD-momentum states in
any ``tx.init`` tree (chains, ``multi_transform``, ``inject_hyperparams``), reading
their moments and counts, and filling them.

Optax keeps the tensors a PyTorch optimizer keeps per parameter as trees shaped
like the params (``ScaleByAdamState`` ``mu``/``nu``, ``TraceState`` ``trace``) and
one ``count``; :data:`KINDS` says which optax field holds which torch slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jaxshare.internal import keypath_to_path, render

__all__ = [
    "KINDS",
    "counts",
    "fill_state",
    "found_states",
    "is_tied",
    "leaves_by_path",
    "moments_of",
    "tx_kind",
]

#: The optimizers carried, by the slots of their state: ``{kind: {torch slot: optax field}}``.
KINDS: dict[str, dict[str, str]] = {
    "adam": {"exp_avg": "mu", "exp_avg_sq": "nu"},
    "sgd": {"momentum_buffer": "trace"},
}


def _state_types() -> dict[str, type]:
    import optax

    return {"adam": optax.ScaleByAdamState, "sgd": optax.TraceState}


def _walk(node: Any, fn: Callable[[Any], Any | None]) -> Any:
    """``node`` rebuilt with ``fn`` applied to every container (an optimizer state's
    NamedTuples, tuples, lists, dicts) top down: where ``fn`` returns a value, that
    value replaces the container."""
    done = fn(node)
    if done is not None:
        return done
    if is_tied(node):
        return node
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return type(node)(*(_walk(x, fn) for x in node))
    if isinstance(node, (tuple, list)):
        return type(node)(_walk(x, fn) for x in node)
    if isinstance(node, dict):
        return {k: _walk(v, fn) for k, v in node.items()}
    return node


def is_tied(x: Any) -> bool:
    """Whether ``x`` is a ``jaxshare.Tied`` (asked only of optax trees: JAX is in use)."""
    from jaxshare import Tied

    return isinstance(x, Tied)


def leaves_by_path(tree: Any) -> dict[str, Any]:
    """``{rendered path: leaf}`` of a ``Tied`` (its unique tree) or a tree.

    >>> leaves_by_path({"params": {"w": 1, "b": 2}})
    {'params/b': 2, 'params/w': 1}
    """
    import jax

    if is_tied(tree):
        tree = tree.unique
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {render(keypath_to_path(kp)): leaf for kp, leaf in flat}


def found_states(opt_state: Any) -> dict[str, list[Any]]:
    """The Adam and SGD-momentum states in ``opt_state``, by kind."""
    found: dict[str, list[Any]] = {kind: [] for kind in KINDS}
    types = _state_types()

    def visit(node: Any) -> None:
        for kind, t in types.items():
            if isinstance(node, t):
                found[kind].append(node)

    _walk(opt_state, lambda n: visit(n))
    return found


def tx_kind(opt_state: Any, want: str) -> str | None:
    """The kind of state ``tx`` keeps (``None``: neither, e.g. plain SGD); one line
    where it is not ``want``, or both."""
    found = {k: v for k, v in found_states(opt_state).items() if v}
    if len(found) > 1:
        raise ValueError(
            "`tx` keeps both Adam and SGD-momentum state; jaxshare fills one optimizer's."
        )
    kind = next(iter(found), None)
    if kind is not None and kind != want:
        names = {"adam": "Adam/AdamW", "sgd": "SGD"}
        raise ValueError(
            f"the torch optimizer is {names[want]} (its state has "
            f"{', '.join(KINDS[want])}), but `tx` keeps {names[kind]} state "
            f"({', '.join(KINDS[kind].values())}); pass the optax optimizer that matches it."
        )
    return kind


def fill_state(
    opt_state: Any, kind: str | None, values: Mapping[str, Mapping[str, Any]], count: int
) -> Any:
    """``opt_state`` with every ``count`` set to ``count`` and the fields of each
    Adam/SGD state (``{"mu": {flax path: array}, ...}``) filled, each leaf cast to
    the dtype ``tx.init`` gave it (and placed on its sharding)."""
    import jax
    import jax.numpy as jnp

    types = _state_types()

    def fill_tree(tree: Any, by_path: Mapping[str, Any]) -> Any:
        def one(kp: Any, leaf: Any) -> Any:
            path = render(keypath_to_path(kp)[1:] if is_tied(tree) else keypath_to_path(kp))
            value = by_path.get(path)
            if value is None:  # (No torch state for it: as tx.init made it.)
                return leaf
            sharding = getattr(leaf, "sharding", None)
            out = jnp.asarray(value, dtype=leaf.dtype)
            return out if sharding is None else jax.device_put(out, sharding)

        return jax.tree_util.tree_map_with_path(one, tree)

    def fn(node: Any) -> Any | None:
        if not (isinstance(node, tuple) and hasattr(node, "_fields")):
            return None
        changes: dict[str, Any] = {}
        if kind is not None and isinstance(node, types[kind]):
            for field in KINDS[kind].values():
                changes[field] = fill_tree(getattr(node, field), values[field])
        if "count" in node._fields:
            old = getattr(node, "count")  # noqa: B009 (the field, not tuple.count)
            if hasattr(old, "dtype") and getattr(old, "shape", None) == ():
                changes["count"] = jnp.asarray(count, dtype=old.dtype)
        if not changes:
            return None
        rest = {f: _walk(getattr(node, f), fn) for f in node._fields if f not in changes}
        return node._replace(**rest, **changes)  # type: ignore[attr-defined]

    return _walk(opt_state, fn)


def moments_of(opt_state: Any, kind: str) -> dict[str, dict[str, Any]]:
    """``{optax field: {flax path: array}}`` of every Adam/SGD state in ``opt_state``
    (the states of ``multi_transform``'s groups together).

    >>> import jax.numpy as jnp, optax
    >>> state = optax.sgd(0.1, momentum=0.9).init({"w": jnp.ones(2)})
    >>> moments_of(state, "sgd")["trace"]["w"].shape
    (2,)
    """
    out: dict[str, dict[str, Any]] = {f: {} for f in KINDS[kind].values()}
    for node in found_states(opt_state)[kind]:
        for field in out:
            out[field].update(leaves_by_path(getattr(node, field)))
    return out


def counts(opt_state: Any) -> list[int]:
    """Every scalar ``count`` in ``opt_state``, in the order met."""
    found: list[int] = []

    def fn(node: Any) -> None:
        if isinstance(node, tuple) and hasattr(node, "_fields") and "count" in node._fields:
            value = getattr(node, "count")  # noqa: B009 (the field, not tuple.count)
            if getattr(value, "shape", None) == ():
                found.append(int(value))

    _walk(opt_state, fn)
    return found
