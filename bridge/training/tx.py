"""Building a ``tx`` for torch's param groups: :func:`optax_for` gives the optax
transformation that makes PyTorch's Adam, AdamW or SGD update, group by group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.training.hyper import torch_hyper
from bridge.training.optax_state import is_tied
from jaxshare.formats import OptimizerState
from jaxshare.internal import keypath_to_path, render

__all__ = ["optax_for"]


def _one_tx(kind: str, h: Mapping[str, Any]) -> Any:
    import optax

    if h.get("maximize") or h.get("amsgrad") or h.get("dampening"):
        key = next(k for k in ("maximize", "amsgrad", "dampening") if h.get(k))
        raise ValueError(
            f"a param group has {key}={h[key]}, which optax's adam/adamw/sgd do not make; "
            "nothing is converted."
        )
    if kind == "adam":
        adam = optax.adamw if h["weight_decay"] else optax.adam
        kw = {"weight_decay": h["weight_decay"]} if h["weight_decay"] else {}
        tx = adam(h["lr"], b1=h["b1"], b2=h["b2"], eps=h["eps"], **kw)
    else:
        tx = optax.sgd(h["lr"], momentum=h["momentum"] or None, nesterov=h["nesterov"])
    return optax.chain(optax.add_decayed_weights(h["l2"]), tx) if h["l2"] else tx


def optax_for(state: OptimizerState | Mapping[str, Any]) -> Any:
    """The optax transformation that makes PyTorch's update for these param groups:
    ``optax.adamw``/``adam``/``sgd`` with the groups' values (an L2 ``weight_decay``
    as ``add_decayed_weights`` before them), and ``optax.multi_transform`` over the
    groups where they differ (parameters in no group are frozen:
    ``optax.set_to_zero``). ``state`` is an :class:`jaxshare.formats.OptimizerState`
    or the record a training step keeps
    (:func:`bridge.training.record.optimizer_record`); the groups are told apart
    by the PyTorch names in the params' naming record.

    >>> from jaxshare.formats import OptimizerState, ParamGroup
    >>> group = ParamGroup(("w",), {"lr": 0.1, "momentum": 0.9})
    >>> tx = optax_for(OptimizerState(None, "torch", (group,), {}, {}))
    >>> import jax.numpy as jnp
    >>> tx.init({"w": jnp.zeros(2)})[0].trace["w"].shape
    (2,)
    """
    import jax
    import optax

    if isinstance(state, OptimizerState):
        kind = state.kind
        groups = [(g.names, torch_hyper(kind, g)) for g in state.groups]
    else:
        kind = state["kind"]
        groups = [(tuple(g["names"]), dict(g["hyper"])) for g in state["groups"]]
    distinct: list[dict[str, Any]] = []
    for _, h in groups:
        if h not in distinct:
            distinct.append(h)
    if len(distinct) == 1:
        return _one_tx(kind, distinct[0])
    label_of = {n: f"group{distinct.index(h)}" for names, h in groups for n in names}

    def labels(params: Any) -> Any:
        naming = params.alias_map.naming if is_tied(params) else None
        if naming is None:
            raise ValueError(
                "the param groups are told apart by PyTorch names: train a `Tied` whose "
                "alias map carries the naming record (as to_optax and checkpoint.restore give)."
            )

        def one(kp: Any, _: Any) -> str:
            record = naming.get(render(keypath_to_path(kp)[1:]))
            name = record.torch if record is not None else None
            return label_of.get(name, "frozen") if name is not None else "frozen"

        return jax.tree_util.tree_map_with_path(one, params)

    txs = {f"group{i}": _one_tx(kind, h) for i, h in enumerate(distinct)}
    txs["frozen"] = optax.set_to_zero()
    return optax.multi_transform(txs, labels)
