"""PEFT LoRA adapters as the LoRA params of a Flax model, and back.

A layout table (:mod:`bridge.layouts.table`) says how a base weight ``W`` (out, in),
under its PyTorch name, becomes a Flax leaf: its path and the ops between them
(permute, split heads, merge). A LoRA pair follows from that one entry, never from a
second map: ``W = B @ A`` with ``A`` (r, in) and ``B`` (out, r), so the kernel ``W.T``
is ``A.T @ B.T``, and each axis of the kernel comes either from ``in`` or from ``out``.
:func:`factor_ops` follows the entry's ops axis by axis: ``lora_a`` holds the kernel's
input axes in the kernel's order, then ``r``; ``lora_b`` holds ``r``, then the kernel's
output axes. That is what qwix's ``LoraProvider`` creates beside a weight (its einsum
and dot_general rules), and, for a 2-D kernel, what ``nnx.LoRA`` holds:

============================  ============================  ====================
base leaf (Tunix Qwen3)       ``lora_a``                    ``lora_b``
============================  ============================  ====================
``attn/q_proj/w`` (E, N, D)   ``attn/q_proj/w_lora_a``      ``w_lora_b`` (r, N, D)
                              (E, r)
``attn/o_proj/w`` (N, D, E)   ``w_lora_a`` (N, D, r)        ``w_lora_b`` (r, E)
``mlp/up_proj/kernel`` (E, F) ``kernel_lora_a`` (E, r)      ``kernel_lora_b`` (r, F)
============================  ============================  ====================

Two namings place the pair beside the base leaf (:data:`NAMINGS`):

- ``"qwix"``: ``{leaf}_lora_a`` and ``{leaf}_lora_b`` next to the leaf, as
  ``qwix.apply_lora_to_model`` names them (Tunix's LoRA); the model applies
  ``alpha / rank`` itself (``qwix.LoraProvider(rank=r, alpha=lora_alpha)``, or the
  rules :func:`qwix_rules` derives from the adapter), so the factors are the
  adapter's own, bit for bit.
- ``"nnx"``: ``lora/lora_a`` and ``lora/lora_b`` in the module, as ``nnx.LoRALinear``
  holds them, 2-D only. ``nnx.LoRA`` computes ``x @ lora_a @ lora_b`` with no scaling,
  so ``lora_b`` is ``B.T`` times the adapter's scaling (computed in float32, stored in
  ``B``'s dtype), divided back on the way out: bit-exact where the scaling is a power
  of two (``lora_alpha = 2 r``, say), rounded once each way otherwise.

An op that cannot be carried to one factor alone is refused in one line: a stack or
concat (Gemma 3's ``qkv_einsum`` stacks q, k and v into one kernel, which one LoRA pair
per PyTorch module cannot be), a merge of input with output axes, a pad, a value op.

Nothing here imports torch; JAX and Flax only where an NNX state is given or read, and
Orbax only to read a Tunix checkpoint.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bridge.adapters.peft import Adapter, LoraConfig, LoraPair, read_adapter, save_adapter
from bridge.layouts.layout import Layout, as_layout
from bridge.layouts.ops import AXES, Merge, Op, Permute, Split
from bridge.layouts.table import Bound, Table, fill, placeholders
from bridge.layouts.view import pick_table
from jaxshare.internal import (
    flatten_with_paths,
    is_variable,
    nest,
    render,
    split,
    variable_value,
)

__all__ = [
    "NAMINGS",
    "FactorOps",
    "LoraPlace",
    "adapter_from_flax",
    "adapter_to_flax",
    "factor_ops",
    "qwix_rules",
    "read_tunix_lora",
]

Shape = tuple[int, ...]
Naming = Literal["qwix", "nnx"]

#: How LoRA params sit beside their base leaf: ``(lora_a suffix, lora_b suffix)``
#: appended to the leaf's path (``qwix``: ``w`` -> ``w_lora_a``) or put in its
#: module (``nnx``: ``kernel`` -> ``lora/lora_a``).
NAMINGS: Mapping[str, tuple[str, str]] = {
    "qwix": ("{leaf}_lora_a", "{leaf}_lora_b"),
    "nnx": ("lora/lora_a", "lora/lora_b"),
}


@dataclass(frozen=True)
class FactorOps:
    """The ops that take a LoRA pair from PEFT's layout to a Flax layout's.

    Attributes:
      a: from ``A`` (r, in) to ``lora_a`` (the kernel's input axes, then r).
      b: from ``B`` (out, r) to ``lora_b`` (r, then the kernel's output axes).
      kernel_axes: for each axis of the kernel, ``"in"`` or ``"out"``.

    >>> f = factor_ops([Permute((1, 0)), Split(1, (4, 16))], (64, 32), "q_proj")
    >>> f.kernel_axes, f.a_shape(8, (64, 32)), f.b_shape(8, (64, 32))
    (('in', 'out', 'out'), (32, 8), (8, 4, 16))
    """

    a: tuple[Op, ...]
    b: tuple[Op, ...]
    kernel_axes: tuple[str, ...]

    def to_flax(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lora_a, lora_b)`` of PEFT's ``A`` (r, in) and ``B`` (out, r)."""
        return _forward(self.a, a), _forward(self.b, b)

    def from_flax(self, lora_a: np.ndarray, lora_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """PEFT's ``(A, B)`` of ``lora_a`` and ``lora_b``."""
        return _backward(self.a, lora_a), _backward(self.b, lora_b)

    def a_shape(self, rank: int, weight: Shape) -> Shape:
        """The shape of ``lora_a`` for a weight of shape ``weight`` (out, in)."""
        return _chain(self.a, (rank, weight[1]))

    def b_shape(self, rank: int, weight: Shape) -> Shape:
        """The shape of ``lora_b`` for a weight of shape ``weight`` (out, in)."""
        return _chain(self.b, (weight[0], rank))


def _forward(ops: Sequence[Op], x: np.ndarray) -> np.ndarray:
    for op in ops:
        x = op.forward(x)
    return np.ascontiguousarray(x)


def _backward(ops: Sequence[Op], y: np.ndarray) -> np.ndarray:
    for op in reversed(ops):
        y = op.backward(y)
    return np.ascontiguousarray(y)


def _chain(ops: Sequence[Op], shape: Shape) -> Shape:
    for op in ops:
        shape = op.shape(shape)
    return shape


def factor_ops(ops: Sequence[Op], weight: Shape, where: str) -> FactorOps:
    """The ops of a LoRA pair, from the bound ``ops`` that take a base weight of shape
    ``weight`` (out, in) to its Flax kernel.

    Each axis of the weight is followed through ``ops`` as an input or an output
    axis: a permute reorders them (each factor keeps its own axes in the new order),
    a split of an input axis splits ``A``'s, a split of an output axis ``B``'s, a merge
    merges axes of one side.

    Raises:
      ValueError: one line naming ``where``: an op that one factor alone cannot carry
        (a stack or concat, a merge of input with output axes, a pad, a value op).

    >>> f = factor_ops([Permute((1, 0)), Split(0, (4, 16))], (32, 64), "o_proj")
    >>> f.kernel_axes, f.a_shape(8, (32, 64)), f.b_shape(8, (32, 64))
    (('in', 'in', 'out'), (4, 16, 8), (8, 32))
    """
    if len(weight) != 2:
        raise ValueError(
            f"{where}: a LoRA pair is for a 2-D weight (out, in); found shape {weight}"
        )
    axes: list[str] = ["out", "in"]
    shape: Shape = tuple(weight)
    a_ops: list[Op] = [Permute((1, 0))]  # A (r, in) -> (in, r): r last.
    b_ops: list[Op] = [Permute((1, 0))]  # B (out, r) -> (r, out): r first.
    for op in ops:
        if not isinstance(op, Permute | Split | Merge):
            raise ValueError(
                f"{where}: the layout's op {op.to_dict()} cannot be carried to a LoRA "
                "factor (only permute, split and merge can); merge the adapter instead "
                "(`jaxshare merge`)"
            )
        try:
            after = op.shape(shape)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if isinstance(op, Permute):
            new = [axes[p] for p in op.perm]
            for side, side_ops, offset in (("in", a_ops, 0), ("out", b_ops, 1)):
                old = [k for k, t in enumerate(axes) if t == side]
                perm = [old.index(p) for p in op.perm if axes[p] == side]
                if perm != sorted(perm):
                    full = list(range(offset)) + [offset + p for p in perm]
                    if side == "in":
                        full.append(len(perm))
                    side_ops.append(Permute(tuple(full)))
            axes = new
        elif isinstance(op, Split):
            a = op.axis % len(shape)
            side = axes[a]
            sizes = after[a : a + len(op.into)]
            at = axes[:a].count(side) + (0 if side == "in" else 1)
            (a_ops if side == "in" else b_ops).append(Split(at, tuple(sizes)))
            axes = [*axes[:a], *[side] * len(sizes), *axes[a + 1 :]]
        else:
            a = op.axis % (len(shape) - len(op.sizes) + 1)
            merged = axes[a : a + len(op.sizes)]
            if len(set(merged)) != 1:
                raise ValueError(
                    f"{where}: the layout merges input with output axes ({op.to_dict()}), "
                    "which no LoRA factor alone holds"
                )
            side = merged[0]
            sizes = shape[a : a + len(op.sizes)]
            at = axes[:a].count(side) + (0 if side == "in" else 1)
            (a_ops if side == "in" else b_ops).append(Merge(at, tuple(sizes)))
            axes = [*axes[:a], side, *axes[a + len(op.sizes) :]]
        shape = after
    return FactorOps(tuple(a_ops), tuple(b_ops), tuple(axes))


@dataclass(frozen=True)
class LoraPlace:
    """Where one PyTorch module's LoRA pair lies in a Flax tree.

    Attributes:
      module: the base model's PyTorch module (``model.layers.0.self_attn.q_proj``).
      kernel: the Flax path of its base leaf (``layers/0/attn/q_proj/w``).
      lora_a, lora_b: the Flax paths of its factors.
      ops: the factors' ops (:func:`factor_ops`).
    """

    module: str
    kernel: str
    lora_a: str
    lora_b: str
    ops: FactorOps


def _beside(kernel: str, naming: str) -> tuple[str, str]:
    *module, leaf = split(kernel)
    a, b = (s.format(leaf=leaf) for s in NAMINGS[naming])
    return render((*module, *split(a))), render((*module, *split(b)))


class _Places:
    """A layout bound for one config: a PyTorch module's LoRA place, and the module
    of a Flax LoRA param."""

    def __init__(
        self, layout: str | os.PathLike[str] | Layout | None, config: Mapping[str, Any] | None
    ) -> None:
        self.layout = as_layout(layout if layout is not None else "jaxshare")
        tables = self.layout.table_list()
        where = f"the {self.layout.name} layout"
        self.bound: Bound | None = None
        self.table: Table
        if self.layout.view is not None:
            self.table = pick_table(tables, config, where)
            self.bound = self.table.bind(config, where)
        else:
            self.table = tables[0]
            family = self.layout.family(config)
            if family is not None and family.modules:
                raise ValueError(
                    f"{where}: the {config and config.get('model_type')} family renames "
                    "modules on the Flax side, which LoRA params do not follow yet; use a "
                    "layout of tables (tunix) or the jaxshare layout"
                )
        self.where = where

    def _linear(self) -> tuple[str, tuple[Op, ...]]:
        """For a layout of naming rules: its Linear entry's Flax pattern and ops."""
        for entry in self.table.entries:
            if (not entry.layers or "linear" in entry.layers) and (
                not entry.ndims or 2 in entry.ndims
            ):
                if entry.leaves[1] == "weight":
                    perm = AXES[entry.axes](2)
                    return entry.flax, (() if perm is None else (Permute(perm),))
        raise ValueError(f"{self.where}: no entry names a Linear's weight")  # pragma: no cover

    def place(self, module: str, weight: Shape, naming: str) -> LoraPlace:
        """The place of ``module``'s pair (``weight``: its base weight's shape)."""
        name = f"{module}.weight"
        at = f"{name} in {self.where}"
        if self.bound is None:
            pattern, ops = self._linear()
            parts = split(pattern)
            if naming == "nnx" and parts[0] != "{module}":  # (NNX: no collection.)
                pattern = render(parts[1:])
            kernel = pattern.replace("{module}", module.replace(".", "/"))
        else:
            found = self.bound.match_torch(name)
            tie = self.bound.implicit_tie(name)
            if found is None and tie is not None:
                raise ValueError(
                    f"{at}: the model computes it from {tie.canonical} (a tie), so it has no "
                    "kernel to put a LoRA pair beside; merge the adapter instead (`jaxshare "
                    "merge`, which unties the two where they differ)"
                )
            if found is None:
                raise ValueError(
                    f"{at}: no entry names it ({self.bound.nearest(name, flax=False)}); "
                    "is the adapter for this model?"
                )
            entry, values = found
            if entry.combine is not None:
                raise ValueError(
                    f"{at}: the layout {_combine_verb(entry.combine)} it with others into "
                    f"one leaf ({entry.entry.flax}), which one LoRA pair per PyTorch module "
                    "cannot be: merge the adapter instead (`jaxshare merge`)"
                )
            ops, kernel = entry.ops, fill(entry.entry.flax, values)
        factors = factor_ops(ops, weight, at)
        if naming == "nnx" and factors.kernel_axes != ("in", "out"):
            raise ValueError(
                f"{at}: nnx.LoRA holds 2-D factors (in, r) and (r, out), but the kernel "
                f"{kernel!r} has axes {factors.kernel_axes}; use naming='qwix'"
            )
        lora_a, lora_b = _beside(kernel, naming)
        return LoraPlace(module, kernel, lora_a, lora_b, factors)

    def module_of(self, kernel: str) -> str:
        """The PyTorch module of the base leaf at ``kernel``."""
        if self.bound is None:
            pattern, _ = self._linear()
            parts, leaf = split(pattern), split(kernel)
            top = [p for p in parts[: parts.index("{module}")]]
            body = leaf[len(top) : -1] if list(leaf[: len(top)]) == top else leaf[:-1]
            if not body or leaf[-1] != parts[-1]:
                raise ValueError(
                    f"{kernel!r}: {self.where} names a Linear's kernel {pattern!r}; "
                    "found another leaf"
                )
            return ".".join(body)
        found = self.bound.match_flax(kernel)
        if found is None:
            raise ValueError(
                f"{kernel!r}: no entry of {self.where} names it "
                f"({self.bound.nearest(kernel, flax=True)})"
            )
        entry, values = found
        values = dict(values)
        for p in placeholders(entry.entry.torch):  # (Other spellings: the first.)
            values.setdefault(p, entry.entry.parts.get(p, ("",))[0])
        name = fill(entry.entry.torch, values)
        if not name.endswith(".weight"):
            raise ValueError(f"{kernel!r}: its tensor {name!r} is no module's weight")
        return name[: -len(".weight")]


def _combine_verb(op: Op) -> str:
    return "stacks" if type(op).__name__ == "Stack" else "concatenates"


def _naming(naming: str | None, paths: Sequence[str] = ()) -> str:
    if naming is None:
        if any(p.endswith("/lora/lora_a") for p in paths):
            return "nnx"
        return "qwix"
    if naming not in NAMINGS:
        raise ValueError(f"`naming` is one of {', '.join(NAMINGS)}; found {naming!r}")
    return naming


def _flat(tree: Any) -> dict[str, Any]:
    """``{rendered path: array}`` of a nested mapping or an NNX state (Variables
    unwrapped, ``.value`` segments of a restored state dropped)."""
    if isinstance(tree, Mapping) and all(isinstance(k, str) and "/" in k for k in tree):
        return dict(tree)
    out: dict[str, Any] = {}
    for path, leaf in flatten_with_paths(tree, is_leaf=is_variable):
        if path and path[-1] == "value":
            path = path[:-1]
        out[render(path)] = variable_value(leaf)
    return out


def adapter_to_flax(
    adapter: Adapter | str | os.PathLike[str],
    /,
    *,
    layout: str | os.PathLike[str] | Layout | None = None,
    config: Mapping[str, Any] | None = None,
    naming: Naming | None = None,
    like: Any = None,
) -> Any:
    """A PEFT adapter as the LoRA params of a Flax model of ``layout``.

    Args:
      adapter: a PEFT adapter directory, or what :func:`bridge.adapters.peft.read_adapter`
        read.
      layout: the base model's layout (``"tunix"``, ``"jaxshare"``, a table file): its
        table places each target module's weight, and its pair beside it.
      config: the base model's ``config.json`` (a dict), for a layout chosen by
        ``model_type`` or sized by it.
      naming: ``"qwix"`` (``w_lora_a``, qwix and Tunix) or ``"nnx"``
        (``lora/lora_a``, ``nnx.LoRALinear``); default: as ``like``'s paths say,
        else ``"qwix"``.
      like: the model's LoRA state (``nnx.state(model, nnx.LoRAParam)``, or its pure
        dict): the result has exactly its structure, every shape checked, each value
        cast to its dtype.

    Returns:
      Without ``like``, nested dicts of numpy arrays (``{"layers": {"0": {...}}}``)
      in the adapter's dtype; with it, ``like`` with its values replaced.

    Raises:
      ValueError: one line: a target module the layout has no entry for, an op no
        factor can carry, a shape ``like`` does not have, a LoRA param of ``like`` the
        adapter has no pair for.
    """
    adapter = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
    places = _Places(layout, config)
    like_flat = _flat(like) if like is not None else None
    naming_ = _naming(naming, list(like_flat or ()))
    out: dict[str, np.ndarray] = {}
    for module, pair in sorted(adapter.modules().items()):
        if pair.embedding or adapter.config.fan_in_fan_out:
            raise ValueError(
                f"{adapter.path}: {module!r} is "
                f"{'an Embedding' if pair.embedding else 'a fan_in_fan_out Linear'}, whose "
                "delta is (B @ A).T; qwix and nnx.LoRA hold LoRA of matmul kernels only"
            )
        a, b = np.asarray(pair.A), np.asarray(pair.B)
        place = places.place(module, (b.shape[0], a.shape[1]), naming_)
        lora_a, lora_b = place.ops.to_flax(a, b)
        if naming_ == "nnx":
            lora_b = _scaled(lora_b, adapter.scaling_of(module), multiply=True)
        out[place.lora_a], out[place.lora_b] = lora_a, lora_b
    if like_flat is None:
        return nest(out)
    return _fill_like(like, like_flat, out, str(adapter.path))


def qwix_rules(
    adapter: Adapter | str | os.PathLike[str],
    /,
    *,
    layout: str | os.PathLike[str] | Layout | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The ``qwix.LoraRule`` keywords that give a model LoRA where the adapter has it,
    of its rank and scaling: ``module_path`` (the Flax modules of its pairs, as one
    regex), ``rank`` and ``alpha`` (``alpha / rank`` is PEFT's scaling), one rule per
    rank and scaling.

    ``qwix.LoraProvider([qwix.LoraRule(**kw) for kw in qwix_rules(...)])`` then
    ``qwix.apply_lora_to_model`` makes the params :func:`adapter_to_flax` fills. With
    rsLoRA, ``alpha`` is ``scaling * rank``, rounded once.

    Raises:
      ValueError: as :func:`adapter_to_flax`.
    """
    adapter = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
    places = _Places(layout, config)
    groups: dict[tuple[int, float], list[str]] = {}
    for module, pair in sorted(adapter.modules().items()):
        a, b = pair.A, pair.B
        place = places.place(module, (b.shape[0], a.shape[1]), "qwix")
        key = (int(a.shape[0]), adapter.scaling_of(module) * int(a.shape[0]))
        groups.setdefault(key, []).append(render(split(place.kernel)[:-1]))
    return [
        {
            "module_path": "|".join(re.escape(m) for m in sorted(modules)),
            "rank": rank,
            "alpha": alpha,
        }
        for (rank, alpha), modules in sorted(groups.items())
    ]


def _scaled(x: np.ndarray, scaling: float, *, multiply: bool) -> np.ndarray:
    """``x`` times (or divided by) ``scaling``, in float32, stored in ``x``'s dtype."""
    f = np.float32(scaling)
    y = x.astype(np.float32) * f if multiply else x.astype(np.float32) / f
    return y.astype(x.dtype)


def _fill_like(
    like: Any, like_flat: Mapping[str, Any], out: Mapping[str, np.ndarray], where: str
) -> Any:
    extra = sorted(set(out) - set(like_flat))
    if extra:
        raise ValueError(
            f"{where}: `like` has no LoRA param {extra[0]!r} (it holds "
            f"{len(like_flat)}, e.g. {next(iter(like_flat), None)!r}); apply LoRA to that "
            "module, or check `layout` and `naming`"
        )
    missing = sorted(set(like_flat) - set(out))
    if missing:
        raise ValueError(
            f"{where}: the adapter has no pair for `like`'s {missing[0]!r}; it targets "
            f"{len(out) // 2} modules"
        )
    for path, value in out.items():
        want = tuple(like_flat[path].shape)
        if tuple(value.shape) != want:
            raise ValueError(
                f"{where}: {path!r} is {tuple(value.shape)} from the adapter, but `like` "
                f"has {want}; is the rank or the model another?"
            )
    import jax

    leaves = []
    for path, leaf in flatten_with_paths(like, is_leaf=is_variable):
        if path and path[-1] == "value":
            path = path[:-1]
        key = render(path)
        value = out[key]
        old = leaf.get_value() if is_variable(leaf) else leaf
        new = jax.numpy.asarray(value, dtype=old.dtype)
        sharding = getattr(old, "sharding", None)
        if sharding is not None and isinstance(old, jax.Array):
            new = jax.device_put(new, sharding)
        leaves.append(leaf.replace(new) if is_variable(leaf) else new)
    treedef = jax.tree_util.tree_structure(like, is_leaf=is_variable)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def read_tunix_lora(
    directory: str | os.PathLike[str], /, *, step: int | None = None
) -> dict[str, np.ndarray]:
    """The LoRA params of a Tunix checkpoint: ``{path: array}``.

    Tunix 0.1.7's ``CheckpointManager.save(..., save_only_lora_params=True)`` (what
    ``PeftTrainer`` does when the model has LoRA) writes ``nnx.state(model,
    nnx.LoRAParam)`` as the Orbax item ``model_params`` of each step:
    ``ROOT/STEP/model_params``. ``directory`` is that root (the latest step, or
    ``step``), a step's folder, or the item itself.

    Raises:
      ValueError: one line: no step, no ``model_params`` item, no LoRA param in it.
    """
    from jaxshare.checkpoint import consolidate

    root = Path(directory)
    item = root
    if (root / "model_params").is_dir():
        item = root / "model_params"
    elif not (root / "_METADATA").exists() and not (root / "_CHECKPOINT_METADATA").exists():
        steps = (
            sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())
            if root.is_dir()
            else []
        )
        if step is not None:
            steps = [s for s in steps if s == step]
        if not steps:
            raise ValueError(
                f"{root}: expected a Tunix checkpoint (STEP/model_params, as its "
                f"CheckpointManager writes){'' if step is None else f' with step {step}'}; "
                "found none"
            )
        item = root / str(steps[-1]) / "model_params"
    if not item.is_dir():
        raise ValueError(f"{item}: expected the Orbax item model_params; found no folder")
    flat = consolidate(item)
    out = {}
    for path, value in flat.items():
        parts = split(path)
        if parts[-1] == "value":
            parts = parts[:-1]
        out[render(parts)] = value
    if not any(p.endswith(("_lora_a", "/lora_a")) for p in out):
        raise ValueError(
            f"{item}: expected LoRA params (save_only_lora_params=True); found "
            f"{len(out)} leaves, none a lora_a"
        )
    return out


def adapter_from_flax(
    lora_params: Any,
    out: str | os.PathLike[str],
    /,
    *,
    layout: str | os.PathLike[str] | Layout | None = None,
    config: Mapping[str, Any] | None = None,
    lora_alpha: float,
    naming: Naming | None = None,
    base_model_name_or_path: str | None = None,
    force: bool = False,
) -> Path:
    """A PEFT adapter directory of a Flax model's LoRA params, which PEFT serves
    without merging (``PeftModel.from_pretrained``).

    Args:
      lora_params: the LoRA params: ``nnx.state(model, nnx.LoRAParam)``, its pure dict,
        ``{path: array}``, or a Tunix checkpoint (:func:`read_tunix_lora`).
      out: the adapter directory to write (atomically).
      layout, config: the base model's layout and ``config.json``, as
        :func:`adapter_to_flax` takes them.
      lora_alpha: PEFT's ``lora_alpha``: qwix's ``alpha`` (it scales by
        ``alpha / rank`` as PEFT does).
      naming: as :func:`adapter_to_flax`; default: as the paths say.
      base_model_name_or_path: written into ``adapter_config.json``.
      force: replace an adapter directory at ``out``.

    Returns:
      ``out``.

    Raises:
      ValueError: one line: a ``lora_a`` without its ``lora_b`` (or the reverse), a
        base leaf the layout has no entry for, shapes that do not
        fit.
    """
    if isinstance(lora_params, str | os.PathLike):
        lora_params = read_tunix_lora(lora_params)
    flat = {k: np.asarray(v) for k, v in _flat(lora_params).items()}
    places = _Places(layout, config)
    naming_ = _naming(naming, list(flat))
    a_end, b_end = NAMINGS[naming_]
    pairs: dict[str, tuple[str, str]] = {}
    for path in flat:
        kernel = _kernel_of(path, naming_)
        if kernel is None:
            continue
        lora_a, lora_b = _beside(kernel, naming_)
        if path == lora_a and lora_b not in flat:
            raise ValueError(f"{path!r}: its pair {lora_b!r} is missing")
        if path == lora_b and lora_a not in flat:
            raise ValueError(f"{path!r}: its pair {lora_a!r} is missing")
        pairs[kernel] = (lora_a, lora_b)
    if not pairs:
        raise ValueError(
            f"`lora_params`: expected LoRA params named as {naming_} names them "
            f"({a_end}, {b_end}); found {len(flat)} leaves, e.g. {next(iter(flat), None)!r}"
        )
    modules: dict[str, LoraPair] = {}
    for kernel, (pa, pb) in sorted(pairs.items()):
        module = places.module_of(kernel)
        lora_a, lora_b = flat[pa], flat[pb]
        rank = lora_a.shape[-1]
        if lora_b.shape[0] != rank:
            raise ValueError(
                f"{pa!r} has rank {rank} (its last axis), but {pb!r} {lora_b.shape[0]} (its first)"
            )
        weight = (math.prod(lora_b.shape[1:]), math.prod(lora_a.shape[:-1]))
        place = places.place(module, weight, naming_)
        want = (place.ops.a_shape(rank, weight), place.ops.b_shape(rank, weight))
        if (lora_a.shape, lora_b.shape) != want:
            raise ValueError(
                f"{pa!r}: the {places.layout.name} layout's {module}.weight makes its pair "
                f"{want[0]} and {want[1]}; found {lora_a.shape} and {lora_b.shape}"
            )
        a, b = place.ops.from_flax(lora_a, lora_b)
        modules[module] = LoraPair(a, b)
    # One rank is r; a module of another is in rank_pattern (qwix: a rule each).
    counts = Counter(p.rank for p in modules.values())
    rank = max(sorted(counts), key=lambda k: counts[k])
    rank_pattern = {re.escape(m): p.rank for m, p in modules.items() if p.rank != rank}
    targets = tuple(sorted({m.rsplit(".", 1)[-1] for m in modules}))
    raw = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": lora_alpha,
        "use_rslora": False,
        "target_modules": list(targets),
        "modules_to_save": None,
        "base_model_name_or_path": base_model_name_or_path,
        "rank_pattern": rank_pattern,
        "alpha_pattern": {},
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    config_ = LoraConfig(
        r=rank,
        lora_alpha=lora_alpha,
        use_rslora=False,
        target_modules=targets,
        modules_to_save=(),
        base_model_name_or_path=base_model_name_or_path,
        raw=raw,
    )
    if naming_ == "nnx":
        modules = {
            m: LoraPair(p.A, _scaled(p.B, config_.scaling_of(m), multiply=False))
            for m, p in modules.items()
        }
    return save_adapter(out, config_, modules, force=force)


def _kernel_of(path: str, naming: str) -> str | None:
    """The base leaf whose LoRA param ``path`` is, under ``naming``; ``None`` for a
    path that is no LoRA param."""
    parts = split(path)
    if naming == "qwix":
        for end in ("_lora_a", "_lora_b"):
            if parts[-1].endswith(end) and len(parts[-1]) > len(end):
                return render((*parts[:-1], parts[-1][: -len(end)]))
        return None
    if len(parts) >= 3 and parts[-2] == "lora" and parts[-1] in ("lora_a", "lora_b"):
        return render((*parts[:-2], "kernel"))
    return None
