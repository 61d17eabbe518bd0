"""A training run as an ``ocp.CheckpointManager`` step, and back to a PyTorch run file.

``jaxshare convert run.pt RUN_DIR --optimizer`` (:func:`bridge.convert` with
``optimizer=True``) writes ``RUN_DIR/<step>/`` with three items:

- ``params``: the ``Tied`` of :func:`bridge.to_optax`, a jaxshare item
  (``SharedSave``: each tie stored once, the naming record beside it);
- ``opt_state``: ``tx.init(params)`` filled with the torch optimizer's moments
  and step (``ocp.args.StandardSave``), for the ``tx`` :func:`bridge.optax_for`
  builds from the torch param groups;
- ``optimizer``: a JSON record of the torch optimizer (kind, step, each group's
  PyTorch names and values: :func:`bridge.training.record.optimizer_record`), from which
  :func:`bridge.optax_for` rebuilds that ``tx`` and the way back names the groups.

A Flax loop resumes with ``ocp.args.Composite(params=SharedRestore(...),
opt_state=ocp.args.StandardRestore(...), optimizer=ocp.args.JsonRestore())``.
The way back (``jaxshare convert RUN_DIR run.pt``) needs no flags: the record
says everything, and the file is a ``torch.save`` of ``{"model": state_dict,
"optimizer": optimizer_state_dict}`` that ``torch.load`` and both
``load_state_dict`` take. Nothing here imports torch but that last write.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.layouts.layout import Layout
from bridge.layouts.rules import Rules
from bridge.training.hyper import step_of, torch_group, torch_hyper
from bridge.training.record import optimizer_record
from bridge.training.state import read_training
from bridge.training.tx import optax_for
from jaxshare.internal import UsageError

__all__ = ["ITEMS", "convert_training", "is_training_run", "restore_training", "training_step"]

#: The items of a training step, by name.
ITEMS = ("params", "opt_state", "optimizer")
_RECORD = "optimizer"


def training_step(path: str | os.PathLike) -> Path | None:
    """The step directory of a training run at ``path`` (a step, or a manager root:
    its latest step), or ``None`` where ``path`` is no training run."""
    path = Path(path)
    if (path / _RECORD / "metadata").is_file() and (path / "params").is_dir():
        return path
    if path.is_dir():
        steps = sorted((int(p.name), p) for p in path.iterdir() if p.name.isdigit() and p.is_dir())
        for _, step in reversed(steps):
            if (step / _RECORD / "metadata").is_file():
                return step
    return None


def is_training_run(path: Any) -> bool:
    """Whether ``path`` is a training run written by :func:`convert_training`."""
    return isinstance(path, (str, os.PathLike)) and training_step(path) is not None


def _record(step_dir: Path) -> dict[str, Any]:
    path = step_dir / _RECORD / "metadata"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a training record jaxshare can read ({e}).") from None
    if not (
        isinstance(record, dict)
        and record.get("format") == "jaxshare.optimizer"
        and type(record.get("version")) is int
        and record["version"] == 1
        and record.get("kind") in ("adam", "sgd")
        and isinstance(record.get("groups"), list)
    ):
        raise ValueError(
            f"{path}: expected a jaxshare.optimizer record, version 1 (kind 'adam' or 'sgd', "
            "groups); found something else. Was it written by another tool?"
        )
    return record


def restore_training(path: str | os.PathLike) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(params, opt_state, tx, record)`` of the training run at ``path``: the
    ``Tied``, the optax state, the ``tx`` its record rebuilds, and the record."""
    import jax
    import orbax.checkpoint as ocp

    from jaxshare import checkpoint, tie

    step_dir = training_step(path)
    if step_dir is None:
        raise ValueError(
            f"{path}: expected a training run (a CheckpointManager step with items "
            f"{', '.join(ITEMS)}), found none."
        )
    record = _record(step_dir)
    tree = checkpoint.restore(step_dir / "params")
    params = tie(tree, checkpoint.read_alias_map(step_dir / "params"))
    tx = optax_for(record)
    abstract = jax.eval_shape(tx.init, params)
    with ocp.StandardCheckpointer() as ckptr:
        opt_state = ckptr.restore((step_dir / "opt_state").absolute(), abstract)
    return params, opt_state, tx, record


def convert_training(
    src: Any,
    dst: str | os.PathLike,
    /,
    *,
    force: bool = False,
    rules: Rules | None = None,
    layout: str | Layout | None = None,
    ties: Mapping[str, str] | Sequence[str] = (),
    config: Any = None,
) -> Path:
    """A torch training checkpoint to a CheckpointManager step (``dst`` a directory),
    or a training run back to a ``.pt`` run file (``dst`` a PyTorch file). ``ties``
    and ``config`` declare the ties a DCP folder does not record (see
    :func:`bridge.to_optax`)."""
    from jaxshare.formats import TORCH_SUFFIXES

    dst = Path(dst)
    if is_training_run(src):
        if dst.suffix not in TORCH_SUFFIXES:
            raise UsageError(
                f"{dst}: a training run goes back to a PyTorch run file (.pt, .bin, .pth); "
                "its weights alone convert with `jaxshare convert RUN/<step>/params ...`."
            )
        if ties or config is not None:
            raise UsageError(
                f"{src}: a training run keeps its ties; --tie and --config do not apply."
            )
        return _to_torch_file(Path(src), dst, force=force)
    if dst.suffix:
        raise UsageError(
            f"{dst}: --optimizer writes a CheckpointManager directory (no suffix), holding "
            f"one step with items {', '.join(ITEMS)}."
        )
    return _to_step(src, dst, force=force, rules=rules, layout=layout, ties=ties, config=config)


def _check_dst(dst: Path, force: bool, inputs: list[Path]) -> None:
    if any(dst.resolve() == Path(i).resolve() for i in inputs):
        raise ValueError(f"{dst}: the output is an input; write it elsewhere.")
    if dst.exists():
        if not force:
            raise FileExistsError(f"{dst}: exists; pass --force to replace it.")
        kind_ok = dst.is_file() if dst.suffix else training_step(dst) is not None
        if not kind_ok:
            raise ValueError(
                f"{dst}: exists and is not an output of the same kind; --force replaces only "
                "a training run (or run file) jaxshare wrote."
            )


def _swap(tmp: Path, dst: Path) -> None:
    """``tmp`` renamed to ``dst``, replacing it."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        tmp.rename(dst)


def _to_step(
    src: Any, dst: Path, *, force: bool, rules: Any, layout: Any, ties: Any, config: Any
) -> Path:
    import orbax.checkpoint as ocp

    from bridge.training.to_optax import to_optax
    from jaxshare.checkpoint import SharedSave

    inputs = [Path(src)] if isinstance(src, (str, os.PathLike)) else []
    _check_dst(dst, force, inputs)
    training = read_training(src, rules, ties=ties, config=config)
    state = training.optimizer
    kind, step = state.kind, step_of(state)
    groups = [(g.names, torch_hyper(kind, g, str(state.path))) for g in state.groups]
    record = optimizer_record(kind, step, groups)
    tx = optax_for(state)
    params, opt_state = to_optax(training, tx, rules=rules, layout=layout)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        with ocp.CheckpointManager(tmp.absolute()) as manager:
            manager.save(
                step,
                args=ocp.args.Composite(
                    params=SharedSave(params),
                    opt_state=ocp.args.StandardSave(opt_state),
                    optimizer=ocp.args.JsonSave(record),
                ),
            )
            manager.wait_until_finished()
        _swap(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dst


def _to_torch_file(src: Path, dst: Path, *, force: bool) -> Path:
    from bridge.training.from_optax import from_optax, save_run  # (A pickle of torch tensors.)

    _check_dst(dst, force, [src])
    params, opt_state, tx, record = restore_training(src)
    names = [g["names"] for g in record["groups"]]
    state_dict, optimizer = from_optax(params, opt_state, tx, groups=names)
    for group, saved in zip(optimizer["param_groups"], record["groups"], strict=True):
        kept = {"params": group["params"], "param_names": group["param_names"]}
        group.update(_torch_values(record["kind"], saved["hyper"]), **kept)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        save_run({"model": state_dict, "optimizer": optimizer}, tmp)
        _swap(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def _torch_values(kind: str, h: dict[str, Any]) -> dict[str, Any]:
    """The torch group entries of the recorded values (exact: the torch file's own)."""
    return {
        k: v for k, v in torch_group(kind, (), h, []).items() if k not in ("params", "param_names")
    }
