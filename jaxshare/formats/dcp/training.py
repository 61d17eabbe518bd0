"""A PyTorch DCP training checkpoint's optimizer state, read with numpy only.

FSDP2 runs save their state with ``get_state_dict(model, optimizer)`` and
``dcp.save({"model": model_sd, "optim": optim_sd})`` (torchtitan names the
second ``"optimizer"``). DCP flattens the optimizer's part by its keys:
``optim.state.<fqn>.exp_avg`` (a tensor, assembled from every rank's chunks by
:class:`~jaxshare.formats.DCPFolder`), ``optim.state.<fqn>.step`` (a 0-d
tensor), ``optim.param_groups.<i>.lr`` (an object: a float, the ``betas``
tuple) and ``optim.param_groups.<i>.params`` (the group's fqns). The state is
keyed by parameter name, so no index needs matching; a plain
``optimizer.state_dict()`` saved so (indices) is matched as
:func:`~jaxshare.formats.optimizer_state` matches it.

DCP records no ties: a tied parameter is one entry of the optimizer (its first
fqn) and the model part stores every name of it as a tensor of its own. The
ties are whatever :class:`~jaxshare.formats.DCPFolder` finds (the alias map
jaxshare writes beside the records) or the caller declares; a model tensor no
group holds is named in the model source's notes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxshare.core.dtype import is_floating
from jaxshare.formats.dcp.reader import DCPFolder
from jaxshare.formats.optim import Stored, TrainingState, optimizer_state

__all__ = ["DCP_OPTIMIZER_KEYS", "is_dcp_training_folder", "read_dcp_training"]

#: The top-level keys a DCP training checkpoint keeps its optimizer under.
DCP_OPTIMIZER_KEYS = ("optim", "optimizer")
_MODEL = "model"


def _optimizer_key(folder: DCPFolder) -> str | None:
    if _MODEL not in folder.top_level:
        return None
    return next((k for k in DCP_OPTIMIZER_KEYS if k in folder.top_level), None)


def is_dcp_training_folder(path: str | os.PathLike, /) -> bool:
    """Whether ``path`` is a DCP folder holding a ``model`` and an ``optim`` (or
    ``optimizer``) part; reads the metadata only and never raises.

    >>> import pathlib, jaxshare
    >>> FIXTURES = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/dcp"
    >>> is_dcp_training_folder(FIXTURES / "sharded"), is_dcp_training_folder(FIXTURES / "flat")
    (True, False)
    """
    try:
        folder = DCPFolder(path, part=None)
    except (OSError, ValueError):
        return False
    return _optimizer_key(folder) is not None


def _set(nested: dict, key: tuple[str | int, ...], value: Any) -> None:
    *parents, last = key
    for part in parents:
        nested = nested.setdefault(part, {})
    nested[last] = value


def _indices_back(optim: dict) -> None:
    """DCP writes a plain ``optimizer.state_dict()``'s state keys (indices) as
    strings (``optim.state.0.exp_avg``) and its groups' ``params`` as ints: the
    state is keyed by the ints again."""
    groups = optim.get("param_groups")
    state = optim.get("state")
    if not isinstance(groups, dict) or not isinstance(state, dict):
        return
    ids = {p for g in groups.values() if isinstance(g, dict) for p in g.get("params", ())}
    if ids and all(isinstance(p, int) and not isinstance(p, bool) for p in ids):
        optim["state"] = {int(k) if isinstance(k, str) and k.isdigit() else k: v
                          for k, v in state.items()}  # fmt: skip


def read_dcp_training(path: str | os.PathLike, /) -> TrainingState:
    """A DCP folder of ``{"model": ..., "optim": ...}`` (from ``get_state_dict``)
    read as the model and its optimizer's state, without torch.

    Returns:
      ``(params, state)``: the model part as a :class:`~jaxshare.formats.DCPFolder`
      (``part="model"``: names without ``model.``), and the optimizer's
      :class:`~jaxshare.formats.OptimizerState` (``producer`` ``"dcp"``), whose
      slots read each moment from the folder when asked, assembled from the
      ranks' chunks bit for bit.

    Raises:
      FileNotFoundError: no such folder.
      ValueError: one line: as :class:`~jaxshare.formats.DCPFolder`; no model
        or no optimizer part; as :func:`~jaxshare.formats.optimizer_state`.

    >>> import pathlib, jaxshare
    >>> FIXTURES = pathlib.Path(jaxshare.__file__).parents[1] / "tests/data/dcp"
    >>> params, state = read_dcp_training(FIXTURES / "sharded")
    >>> state.producer, sorted(state.slots), state.steps["fc.weight"]
    ('dcp', ['exp_avg', 'exp_avg_sq'], 1)
    >>> state.slots["exp_avg"].infos["fc.weight"], params.infos["fc.weight"]
    (ArrayInfo(shape=(7, 6), dtype='float32'), ArrayInfo(shape=(7, 6), dtype='float32'))
    """
    path = Path(path)
    whole = DCPFolder(path, part=None)
    key = _optimizer_key(whole)
    if key is None:
        raise ValueError(
            f"{path}: expected a DCP training checkpoint with top-level 'model' and 'optim' (or "
            f"'optimizer') parts, found {list(whole.top_level)[:8]}; save "
            '`{"model": model_sd, "optim": optim_sd}` from `get_state_dict(model, optimizer)`.'
        )
    params = DCPFolder(path, part=_MODEL)
    optim = DCPFolder(path, part=key)
    nested: dict = {}
    prefix = f"{key}."
    for fqn, flat in whole.metadata.keys.items():
        if str(flat[0]) != key or not fqn.startswith(prefix):
            continue
        name = fqn[len(prefix) :]
        value = Stored(optim, name) if name in optim.infos else optim.read_item(name)
        _set(nested, flat[1:], value)
    _indices_back(nested)
    state = optimizer_state(nested, path=path, params=params, producer="dcp")
    held = {n for g in state.groups for n in g.names}
    idle = [
        n
        for n, info in params.infos.items()
        if n not in held and n not in params.ties and is_floating(info.dtype)
    ]
    if idle and state.groups:
        shown = ", ".join(idle[:6]) + (f" (+{len(idle) - 6} more)" if len(idle) > 6 else "")
        params.notes = (
            *params.notes,
            f"in no optimizer group: {shown} (frozen, buffers, or ties DCP does not record)",
        )
    return TrainingState(params, state)
