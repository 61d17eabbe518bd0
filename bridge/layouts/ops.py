"""The tensor ops of a layout table, each with its inverse.

An entry of a table (:mod:`bridge.layouts.table`) lists the ops that take its
PyTorch tensors to its Flax leaf, in that order; the way back applies each op's
inverse in the reverse order, so a table is never written twice. The ops:

- ``{permute = [1, 0]}``: the axes in a new order (a Linear's ``kernel``); in an
  entry for any module (``{module}.weight``, whose rank the table does not fix),
  a named order of :data:`AXES` (``{permute = "kernel"}``);
- ``{split = 1, into = ["num_attention_heads", "head_dim"]}``: one axis as
  several (heads on axes of their own); one size may be ``-1``;
- ``{merge = 1, sizes = ["num_attention_heads", "head_dim"]}``: consecutive axes
  as one, the inverse of ``split``;
- ``{pad = 0, size = "vocab_size", to = "padded_vocab_size"}``: axis 0, of
  ``size``, with zero rows added up to ``to``; the way back keeps the first
  ``size`` rows (and reads only those);
- ``{stack = "p", axis = 0}``: the tensors of each value of the placeholder
  ``{p}`` (named parts, ``q``/``k``/``v``, or the layers ``{i}``) stacked on a
  new axis; the axis may be an expression (``axis = "param_scan_axis"``);
- stacks one right after another (``{stack = "e", axis = 0}, {stack = "i", axis =
  1}``: a layer's experts on axis 0, then the layers on axis 1) are one
  :class:`Stacks`: each combination's tensor on the grid of their new axes;
- ``{concat = "p", axis = 0, sizes = [...]}``: the same, concatenated along an
  axis (each part's size along it, for the way back; default: equal parts);
- ``{scale = "1 / sqrt(head_dim)"}``, ``{divide = "sqrt(head_dim)"}`` and
  ``{add = 1.0}``: value ops, computed in float32 and cast back (``in =
  "dtype"``: in the tensor's own dtype, the operand cast to it, as ``x /
  np.asarray(d, x.dtype)``; ``in = "promote"``: as numpy computes ``x *
  np.float32(f)``, see :data:`WITHIN`). The way back is the inverse arithmetic (divide,
  multiply, subtract) unless ``back`` gives it: another value op, applied on the
  way back (``{scale = "1 / sqrt(head_dim)", back = {scale = "sqrt(head_dim)"}}``),
  so a table states the exact arithmetic of both directions. They round (not
  bit-exact) unless the factor is a power of two or the term is zero.

Every op but a stack or concat may hold a ``when``: a condition on the config
(``when = "interleaved_rope"``); where it is false the op is left out, both ways.
A stack may hold one where it also says how its parts are spelled unstacked:
``{stack = "i", axis = "param_scan_axis", when = "scan_layers", unstacked = {layers
= "layers_{i}"}}`` stacks the layers into the entry's Flax leaf where the condition
holds; where it does not, each layer is a leaf of its own, at the Flax path with
its segment ``layers`` spelled ``layers_{i}`` (MaxText's scanned and unscanned
layers, in one entry).
Sizes, factors and axes are expressions over the config
(:mod:`bridge.layouts.sizes`). Nothing here imports torch, transformers or JAX.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from bridge.layouts.sizes import Scope, evaluate, names_in
from jaxshare.internal import Index, Perm, inverse, permute_shape

__all__ = [
    "AXES",
    "OPS",
    "Add",
    "Concat",
    "Divide",
    "Merge",
    "Op",
    "Pad",
    "Permute",
    "Scale",
    "Split",
    "Stack",
    "Stacks",
    "When",
    "parse_op",
]

Shape = tuple[int, ...]
#: A box of a tensor: ``(start, stop)`` on each axis.
Box = tuple[tuple[int, int], ...]


class Op:
    """One op: a tensor transform from the PyTorch side to the Flax side, and back.

    Attributes:
      exact: whether the way there and back gives every bit back.
    """

    exact: bool = True

    def bind(self, scope: Scope) -> Op:
        """The op with its sizes and factors evaluated in ``scope``."""
        return self

    def shape(self, shape: Shape) -> Shape:
        """The shape after the op, of a tensor of ``shape`` (each part's, for a
        stack or concat: see :meth:`combined`)."""
        return shape

    def back_shape(self, shape: Shape) -> Shape:
        """The shape before the op, of a result of ``shape``."""
        return shape

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x

    def backward(self, y: np.ndarray) -> np.ndarray:
        return y

    def back_index(self, index: Index, shape: Shape) -> Index | None:
        """The index before the op that gives ``result[index]`` (``shape``: the
        result's), or ``None`` when it is not one slice of the input."""
        return index

    def forward_box(self, x: np.ndarray, extent: Shape) -> np.ndarray:
        """The op on ``x``, the slice of an input that :meth:`back_index` chose,
        giving the result's slice of ``extent``."""
        return self.forward(x)

    def box(self, box: Box, shape: Shape) -> Box | None:
        """Where the box ``box`` of an input of ``shape`` lands in the result, or
        ``None`` where it is not one box of it (a reshape)."""
        return None

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover -- each op has its own.
        raise NotImplementedError


def _size(value: Any, scope: Scope, what: str) -> int:
    size = evaluate(value, scope)
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if type(size) is not int or (size < 1 and size != -1):
        raise ValueError(f"{what} {value!r} is {size!r}, not a positive int (or -1)")
    return size


def _count(value: Any, scope: Scope, what: str, *, least: int = 1) -> int:
    """An int of at least ``least`` (a pad's sizes, a stack's axis)."""
    n = evaluate(value, scope)
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if type(n) is not int or n < least:
        raise ValueError(f"{what} {value!r} is {n!r}, not an int of at least {least}")
    return n


def _sizes(values: Sequence[Any], scope: Scope, what: str) -> tuple[int, ...]:
    sizes = tuple(_size(v, scope, what) for v in values)
    if sizes.count(-1) > 1:
        raise ValueError(f"{what} {list(values)!r} has more than one -1")
    return sizes


def _fill(sizes: tuple[int, ...], total: int, what: str) -> tuple[int, ...]:
    """``sizes`` with its ``-1`` made what makes their product ``total``."""
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known == 0 or total % known:
            raise ValueError(f"{what}: {total} does not divide by {known}")
        sizes = tuple(total // known if s == -1 else s for s in sizes)
    if math.prod(sizes) != total:
        raise ValueError(f"{what}: sizes {list(sizes)} do not make {total}")
    return sizes


def _axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for {ndim} axes")
    return axis % ndim


def _whole(s: Any, n: int) -> bool:
    return isinstance(s, slice) and s.indices(n) == (0, n, 1)


def _padded(index: Index, ndim: int) -> tuple[Any, ...]:
    return (*index, *(slice(None),) * (ndim - len(index)))


@dataclass(frozen=True)
class Permute(Op):
    """The axes in the order ``perm`` (``x.transpose(perm)``).

    >>> Permute((1, 0)).shape((3, 4))
    (4, 3)
    """

    perm: Perm

    def shape(self, shape: Shape) -> Shape:
        if sorted(self.perm) != list(range(len(shape))):
            raise ValueError(f"permute {list(self.perm)} does not fit a {len(shape)}-D tensor")
        return permute_shape(shape, self.perm)

    def back_shape(self, shape: Shape) -> Shape:
        return permute_shape(shape, inverse(self.perm))

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(self.perm)

    def backward(self, y: np.ndarray) -> np.ndarray:
        return y.transpose(inverse(self.perm))

    def back_index(self, index: Index, shape: Shape) -> Index | None:
        full = _padded(index, len(shape))
        out: list[Any] = [None] * len(full)
        for k, p in enumerate(self.perm):
            out[p] = full[k]
        return tuple(out)

    def box(self, box: Box, shape: Shape) -> Box | None:
        return tuple(box[p] for p in self.perm)

    def to_dict(self) -> dict[str, Any]:
        return {"permute": list(self.perm)}


@dataclass(frozen=True)
class Split(Op):
    """Axis ``axis`` as the axes ``into`` (``x.reshape`` splitting one axis).

    >>> Split(1, (2, -1)).shape((3, 8))
    (3, 2, 4)
    """

    axis: int
    into: tuple[Any, ...]

    def bind(self, scope: Scope) -> Split:
        return replace(self, into=_sizes(self.into, scope, "split `into`"))

    def shape(self, shape: Shape) -> Shape:
        a = _axis(self.axis, len(shape), "split")
        sizes = _fill(self.into, shape[a], f"split of axis {a} (size {shape[a]})")
        return (*shape[:a], *sizes, *shape[a + 1 :])

    def back_shape(self, shape: Shape) -> Shape:
        n = len(self.into)
        a = _axis(self.axis, len(shape) - n + 1, "split")
        return (*shape[:a], math.prod(shape[a : a + n]), *shape[a + n :])

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape(x.shape))

    def backward(self, y: np.ndarray) -> np.ndarray:
        return y.reshape(self.back_shape(y.shape))

    def back_index(self, index: Index, shape: Shape) -> Index | None:
        n = len(self.into)
        full = _padded(index, len(shape))
        a = _axis(self.axis, len(shape) - n + 1, "split")
        first, rest = full[a], full[a + 1 : a + n]
        if not isinstance(first, slice) or not all(
            _whole(s, m) for s, m in zip(rest, shape[a + 1 : a + n], strict=True)
        ):
            return None
        start, stop, step = first.indices(shape[a])
        if step != 1:
            return None
        inner = math.prod(shape[a + 1 : a + n])
        return (*full[:a], slice(start * inner, stop * inner), *full[a + n :])

    def forward_box(self, x: np.ndarray, extent: Shape) -> np.ndarray:
        return x.reshape(extent)

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.axis, "into": list(self.into)}


@dataclass(frozen=True)
class Merge(Op):
    """The consecutive axes from ``axis`` of sizes ``sizes`` as one (the inverse of
    :class:`Split`).

    >>> Merge(1, (2, 4)).shape((3, 2, 4))
    (3, 8)
    """

    axis: int
    sizes: tuple[Any, ...]

    def bind(self, scope: Scope) -> Merge:
        return replace(self, sizes=_sizes(self.sizes, scope, "merge `sizes`"))

    def _split(self) -> Split:
        return Split(self.axis, self.sizes)

    def shape(self, shape: Shape) -> Shape:
        n = len(self.sizes)
        a = _axis(self.axis, len(shape) - n + 1, "merge")
        _fill(self.sizes, math.prod(shape[a : a + n]), "merge")
        if any(s != -1 and s != m for s, m in zip(self.sizes, shape[a : a + n], strict=True)):
            raise ValueError(f"merge: axes {list(shape[a : a + n])} are not {list(self.sizes)}")
        return self._split().back_shape(shape)

    def back_shape(self, shape: Shape) -> Shape:
        return self._split().shape(shape)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape(x.shape))

    def backward(self, y: np.ndarray) -> np.ndarray:
        return y.reshape(self.back_shape(y.shape))

    def back_index(self, index: Index, shape: Shape) -> Index | None:
        n = len(self.sizes)
        full = _padded(index, len(shape))
        a = _axis(self.axis, len(shape), "merge")
        before = self.back_shape(shape)
        inner = math.prod(before[a + 1 : a + n])
        s = full[a]
        if not isinstance(s, slice):
            return None
        start, stop, step = s.indices(shape[a])
        if step != 1 or start % inner or stop % inner:
            return None
        whole = tuple(slice(None) for _ in range(n - 1))
        return (*full[:a], slice(start // inner, stop // inner), *whole, *full[a + 1 :])

    def forward_box(self, x: np.ndarray, extent: Shape) -> np.ndarray:
        return x.reshape(extent)

    def to_dict(self) -> dict[str, Any]:
        return {"merge": self.axis, "sizes": list(self.sizes)}


@dataclass(frozen=True)
class Pad(Op):
    """Axis ``axis``, of ``size``, with zeros added up to ``to`` (MaxText pads
    Gemma's vocabulary); the way back keeps the first ``size``. Exact: the padding
    is dropped on the way back.

    >>> op = Pad(0, 2, 4)
    >>> op.shape((2, 3)), op.forward(np.ones((2, 1), np.float32)).ravel().tolist()
    ((4, 3), [1.0, 1.0, 0.0, 0.0])
    >>> op.back_shape((4, 3)), op.backward(np.arange(4.0).reshape(4, 1)).ravel().tolist()
    ((2, 3), [0.0, 1.0])
    """

    axis: int
    size: Any
    to: Any

    def bind(self, scope: Scope) -> Pad:
        size = _count(self.size, scope, "pad `size`")
        to = _count(self.to, scope, "pad `to`")
        if to < size:
            raise ValueError(
                f"pad `to` {self.to!r} is {to}, less than `size` {self.size!r} ({size})"
            )
        return replace(self, size=size, to=to)

    def shape(self, shape: Shape) -> Shape:
        a = _axis(self.axis, len(shape), "pad")
        if shape[a] != self.size:
            raise ValueError(
                f"pad of axis {a}: the axis is {shape[a]} long, not `size` {self.size}"
            )
        return (*shape[:a], self.to, *shape[a + 1 :])

    def back_shape(self, shape: Shape) -> Shape:
        a = _axis(self.axis, len(shape), "pad")
        if shape[a] < self.size:
            raise ValueError(f"pad of axis {a}: {shape[a]} is less than `size` {self.size}")
        return (*shape[:a], self.size, *shape[a + 1 :])

    def forward(self, x: np.ndarray) -> np.ndarray:
        shape = self.shape(x.shape)
        out = np.zeros(shape, x.dtype)
        out[self._kept(len(shape))] = x
        return out

    def backward(self, y: np.ndarray) -> np.ndarray:
        return y[self._kept(y.ndim)]

    def _kept(self, ndim: int) -> tuple[slice, ...]:
        a = _axis(self.axis, ndim, "pad")
        return (*(slice(None),) * a, slice(0, self.size))

    def back_index(self, index: Index, shape: Shape) -> Index | None:
        full = _padded(index, len(shape))
        a = _axis(self.axis, len(shape), "pad")
        s = full[a]
        if isinstance(s, int | np.integer):
            return full if int(s) % shape[a] < self.size else None
        start, stop, step = s.indices(shape[a])
        if step != 1 or stop > self.size:
            return None
        return full

    def forward_box(self, x: np.ndarray, extent: Shape) -> np.ndarray:
        return x  # (The slice chosen is within the rows kept: nothing to add.)

    def box(self, box: Box, shape: Shape) -> Box | None:
        return box  # (The rows stay where they are; the padding comes after.)

    def to_dict(self) -> dict[str, Any]:
        return {"pad": self.axis, "size": self.size, "to": self.to}


@dataclass(frozen=True)
class Stack(Op):
    """The tensors of each value of the placeholder ``over``, stacked on a new axis
    ``axis`` (of the result; an expression, such as ``param_scan_axis``).

    ``unstacked``: ``(segment, spelling)``, for a stack with a ``when``: where the
    condition is false, each part is a leaf of its own, at the entry's Flax path
    with the segment ``segment`` spelled ``spelling`` (``("layers", "layers_{i}")``).
    """

    over: str
    axis: Any = 0
    unstacked: tuple[str, str] | None = None

    @property
    def overs(self) -> tuple[str, ...]:
        return (self.over,)

    def bind(self, scope: Scope) -> Stack:
        if type(self.axis) is int:
            return self
        return replace(self, axis=_count(self.axis, scope, "stack `axis`", least=0))

    def shape(self, shape: Shape) -> Shape:
        raise TypeError("a stack combines parts: see `combined`")

    def combined(self, shapes: Sequence[Shape]) -> Shape:
        first = shapes[0]
        if any(s != first for s in shapes):
            raise ValueError(f"stack over {{{self.over}}}: the parts' shapes differ: {shapes}")
        a = _axis(self.axis, len(first) + 1, f"stack over {{{self.over}}}")
        return (*first[:a], len(shapes), *first[a:])

    def part_shapes(self, shape: Shape) -> list[Shape]:
        a = _axis(self.axis, len(shape), f"stack over {{{self.over}}}")
        return [(*shape[:a], *shape[a + 1 :])] * shape[a]

    def part_index(self, k: int, shape: Shape) -> tuple[Any, ...]:
        """The index of part ``k`` in a stacked result of ``shape``."""
        a = _axis(self.axis, len(shape), f"stack over {{{self.over}}}")
        return (*(slice(None),) * a, k)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stack": self.over, "axis": self.axis}
        if self.unstacked is not None:
            out["unstacked"] = dict([self.unstacked])
        return out


@dataclass(frozen=True)
class Stacks(Op):
    """Stacks an entry lists one right after another, as one: the tensor of each
    combination of their placeholders' values, on a new axis per stack (MaxText's
    experts on axis 0, then its layers on ``param_scan_axis``).

    The first stack is applied first (to each tensor), the last last, each axis
    counted as that stack sees the shape; the parts are listed with the last
    stack's placeholder slowest (layer by layer, each layer's experts in order).
    Binding a table makes one of adjacent stacks; a table writes the stacks.

    >>> s = Stacks((Stack("e", 0), Stack("i", 1)))
    >>> s.combined([(2, 3)] * 12, (4, 3)), s.axes(4)
    ((4, 3, 2, 3), (0, 1))
    >>> s.part_index(5, (4, 3, 2, 3))  # expert 1 of layer 1
    (1, 1)
    >>> Stacks((Stack("e", 0), Stack("i", 0))).axes(4)  # the layers first
    (1, 0)
    """

    stacks: tuple[Stack, ...]

    @property
    def over(self) -> str:
        """The placeholders, as messages name the combination (``e, i``)."""
        return ", ".join(s.over for s in self.stacks)

    @property
    def overs(self) -> tuple[str, ...]:
        return tuple(s.over for s in self.stacks)

    def bind(self, scope: Scope) -> Stacks:
        return Stacks(tuple(s.bind(scope) for s in self.stacks))

    def shape(self, shape: Shape) -> Shape:
        raise TypeError("stacks combine parts: see `combined`")

    def axes(self, ndim: int) -> tuple[int, ...]:
        """Each stack's axis in a result of ``ndim`` axes, in the stacks' order."""
        at: list[int] = []
        for k, s in enumerate(self.stacks):
            a = _axis(s.axis, ndim - len(self.stacks) + k + 1, f"stack over {{{s.over}}}")
            at = [b + (b >= a) for b in at] + [a]
        return tuple(at)

    def counts(self, shape: Shape) -> tuple[int, ...]:
        """How many values of each placeholder a result of ``shape`` stacks."""
        return tuple(shape[a] for a in self.axes(len(shape)))

    def combined(self, shapes: Sequence[Shape], counts: Sequence[int]) -> Shape:
        """The result of the parts of ``shapes`` (in :class:`Stacks` order), of
        ``counts`` values of each placeholder."""
        if len(shapes) != math.prod(counts) or len(counts) != len(self.stacks):
            raise ValueError(
                f"stacks over {{{self.over}}}: {len(shapes)} parts are not "
                f"{' x '.join(map(str, counts))}"
            )
        first = shapes[0]
        if any(s != first for s in shapes):
            raise ValueError(f"stacks over {{{self.over}}}: the parts' shapes differ: {shapes}")
        out = first
        for s, n in zip(self.stacks, counts, strict=True):
            out = s.combined([out] * n)
        return out

    def part_shapes(self, shape: Shape) -> list[Shape]:
        axes = self.axes(len(shape))
        part = tuple(n for k, n in enumerate(shape) if k not in axes)
        return [part] * math.prod(shape[a] for a in axes)

    def part_index(self, k: int, shape: Shape) -> tuple[Any, ...]:
        """The index of part ``k`` in a result of ``shape``: an int on each stack's axis."""
        axes = self.axes(len(shape))
        index: list[Any] = [slice(None)] * (max(axes) + 1)
        for a in axes:  # (The first stack's placeholder fastest.)
            k, index[a] = divmod(k, shape[a])
        return tuple(index)

    def to_dict(self) -> dict[str, Any]:
        return {"stacks": [s.to_dict() for s in self.stacks]}


@dataclass(frozen=True)
class Concat(Op):
    """The tensors of each value of the placeholder ``over``, concatenated along
    ``axis``; ``sizes``: each part's size along it (default: equal)."""

    over: str
    axis: Any = 0
    sizes: tuple[Any, ...] | None = None

    @property
    def overs(self) -> tuple[str, ...]:
        return (self.over,)

    def bind(self, scope: Scope) -> Concat:
        axis = (
            self.axis
            if type(self.axis) is int
            else _count(self.axis, scope, "concat `axis`", least=0)
        )
        if self.sizes is None:
            return replace(self, axis=axis)
        return replace(self, axis=axis, sizes=_sizes(self.sizes, scope, "concat `sizes`"))

    def shape(self, shape: Shape) -> Shape:
        raise TypeError("a concat combines parts: see `combined`")

    def combined(self, shapes: Sequence[Shape]) -> Shape:
        first = shapes[0]
        a = _axis(self.axis, len(first), f"concat over {{{self.over}}}")
        rest = [(*s[:a], *s[a + 1 :]) for s in shapes]
        if any(r != rest[0] for r in rest) or any(len(s) != len(first) for s in shapes):
            raise ValueError(f"concat over {{{self.over}}}: the parts' other axes differ: {shapes}")
        return (*first[:a], sum(s[a] for s in shapes), *first[a + 1 :])

    def part_shapes(self, shape: Shape, parts: int) -> list[Shape]:
        a = _axis(self.axis, len(shape), f"concat over {{{self.over}}}")
        sizes = self.sizes if self.sizes is not None else (-1,) * parts
        if len(sizes) != parts:
            raise ValueError(f"concat over {{{self.over}}}: {len(sizes)} sizes for {parts} parts")
        if self.sizes is None:
            if shape[a] % parts:
                raise ValueError(
                    f"concat over {{{self.over}}}: axis {a} (size {shape[a]}) does not split "
                    f"into {parts} equal parts; give `sizes`"
                )
            sizes = (shape[a] // parts,) * parts
        else:
            known = sum(s for s in sizes if s != -1)
            sizes = tuple(shape[a] - known if s == -1 else s for s in sizes)
        if sum(sizes) != shape[a] or min(sizes) < 1:
            raise ValueError(
                f"concat over {{{self.over}}}: sizes {list(sizes)} do not make axis {a} "
                f"(size {shape[a]})"
            )
        return [(*shape[:a], s, *shape[a + 1 :]) for s in sizes]

    def part_index(self, k: int, shape: Shape, parts: int) -> Index:
        a = _axis(self.axis, len(shape), f"concat over {{{self.over}}}")
        sizes = [s[a] for s in self.part_shapes(shape, parts)]
        start = sum(sizes[:k])
        return (*(slice(None),) * a, slice(start, start + sizes[k]))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"concat": self.over, "axis": self.axis}
        if self.sizes is not None:
            out["sizes"] = list(self.sizes)
        return out


def _power_of_two(x: float) -> bool:
    return x != 0 and math.isfinite(x) and math.frexp(abs(x))[0] == 0.5


#: Where a value op computes: ``float32`` (the tensor cast to float32, the operand a
#: float32: ``x.astype(float32) * float32(f)``), ``dtype`` (the tensor's own, the operand
#: cast to it: ``x * asarray(f, x.dtype)``) or ``promote`` (as numpy promotes the tensor
#: with a float32 operand, ``x * float32(f)``: float32, but float64 for a float64
#: tensor); the result in the tensor's dtype.
WITHIN = ("float32", "dtype", "promote")

_ARITHMETIC: Mapping[str, Callable[[Any, Any], Any]] = {
    "*": operator.mul,
    "/": operator.truediv,
    "+": operator.add,
    "-": operator.sub,
}


def _compute(x: np.ndarray, sign: str, value: float, within: str) -> np.ndarray:
    """``x <sign> value`` in ``within``, in ``x``'s dtype."""
    if not (np.issubdtype(x.dtype, np.floating) or x.dtype.kind == "V" or "float" in str(x.dtype)):
        raise TypeError(f"a value op needs a floating tensor, got {x.dtype}")
    f = _ARITHMETIC[sign]
    if within == "dtype":
        return np.asarray(f(x, np.asarray(value, dtype=x.dtype))).astype(x.dtype, copy=False)
    if within == "promote":
        return np.asarray(f(x, np.float32(value))).astype(x.dtype, copy=False)
    return np.asarray(f(x.astype(np.float32), np.float32(value))).astype(x.dtype)


@dataclass(frozen=True)
class _Value(Op):
    """A value op: ``operand`` applied to every value (``sign``), in ``within``;
    ``back``: the value op of the way back, when it is not the inverse arithmetic."""

    sign = "*"
    inverse_sign = "/"
    key = "scale"

    operand: Any
    within: str = "float32"
    back: _Value | None = None

    def bind(self, scope: Scope) -> _Value:
        value = float(evaluate(self.operand, scope))
        if not math.isfinite(value) or (value == 0 and self.sign in "*/"):
            raise ValueError(
                f"{self.key} {self.operand!r} is {value}, not a finite non-zero factor"
            )
        back = None if self.back is None else self.back.bind(scope)
        return replace(self, operand=value, back=back)

    def _multiplier(self) -> float | None:
        """What the op multiplies by (``None``: it adds)."""
        if not isinstance(self.operand, float) or self.sign not in "*/" or self.operand == 0:
            return None
        return self.operand if self.sign == "*" else 1 / self.operand

    def _exact_alone(self) -> bool:
        if self.sign in "+-":
            return self.operand == 0
        m = self._multiplier()
        return m is not None and _power_of_two(m)

    @property
    def exact(self) -> bool:  # type: ignore[override]
        """The way back gives every bit back: a power-of-two factor (or a zero
        term), and a ``back`` that undoes it."""
        if not self._exact_alone():
            return False
        if self.back is None:
            return True
        if not self.back._exact_alone():
            return False
        m, b = self._multiplier(), self.back._multiplier()
        if m is None or b is None:
            return m is None and b is None
        return m * b == 1

    def forward(self, x: np.ndarray) -> np.ndarray:
        return _compute(x, self.sign, self.operand, self.within)

    def backward(self, y: np.ndarray) -> np.ndarray:
        if self.back is not None:
            return self.back.forward(y)
        return _compute(y, self.inverse_sign, self.operand, self.within)

    def box(self, box: Box, shape: Shape) -> Box | None:
        return box

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.key: self.operand}
        if self.within != "float32":
            out["in"] = self.within
        if self.back is not None:
            out["back"] = self.back.to_dict()
        return out


@dataclass(frozen=True)
class Scale(_Value):
    """Every value times ``operand``; the way back divides by it (or applies
    ``back``). Not bit-exact unless the factor is a power of two.

    >>> Scale(2.0).forward(np.float32([1.5])).tolist(), Scale(2.0).exact
    ([3.0], True)
    """

    sign = "*"
    inverse_sign = "/"
    key = "scale"


@dataclass(frozen=True)
class Divide(_Value):
    """Every value divided by ``operand``; the way back multiplies by it (or applies
    ``back``). Not bit-exact unless the divisor is a power of two.

    >>> op = Divide(3.0, "dtype", back=Scale(3.0))
    >>> op.forward(np.float32([1.5])).tolist(), op.exact
    ([0.5], False)
    """

    sign = "/"
    inverse_sign = "*"
    key = "divide"


@dataclass(frozen=True)
class Add(_Value):
    """``operand`` added to every value; the way back subtracts it (or applies
    ``back``). Not bit-exact unless it is zero (``(w + 1) - 1`` rounds)."""

    sign = "+"
    inverse_sign = "-"
    key = "add"


@dataclass(frozen=True)
class When(Op):
    """``op`` where ``condition`` holds for the config, else nothing: a table's
    ``{..., when = "interleaved_rope"}``. :meth:`bridge.layouts.table.Table.bind`
    keeps or drops it; bound ops hold no :class:`When`."""

    op: Op
    condition: str

    def bind(self, scope: Scope) -> Op:
        return self.op.bind(scope) if evaluate(self.condition, scope) else Op()

    def to_dict(self) -> dict[str, Any]:
        return {**self.op.to_dict(), "when": self.condition}


#: The ops by the key that names them in a table, with the keys each takes.
def _kernel(ndim: int) -> Perm:
    """(O, I, *S) -> (*S, I, O): Linear (a 2-D transpose) and ConvNd."""
    return (*range(2, ndim), 1, 0)


def _transposed_kernel(ndim: int) -> Perm:
    """(I, O, *S) -> (*S, I, O): ConvTransposeNd."""
    return (*range(2, ndim), 0, 1)


#: Named axis orders, for entries of any rank: ``ndim -> permutation`` from the
#: PyTorch to the Flax axis order (``None``: as it is).
AXES: Mapping[str, Callable[[int], Perm | None]] = MappingProxyType(
    {"same": lambda ndim: None, "kernel": _kernel, "transposed_kernel": _transposed_kernel}
)

OPS: Mapping[str, tuple[type[Op], tuple[str, ...]]] = {
    "permute": (Permute, ()),
    "split": (Split, ("into",)),
    "merge": (Merge, ("sizes",)),
    "pad": (Pad, ("size", "to")),
    "stack": (Stack, ("axis",)),  # (and `when` with `unstacked`: see Stack)
    "concat": (Concat, ("axis", "sizes")),
    "scale": (Scale, ("in", "back")),
    "divide": (Divide, ("in", "back")),
    "add": (Add, ("in", "back")),
}


def parse_op(spec: Any, where: str) -> Op:
    """One op of a table, from its mapping (``{"permute": [1, 0]}``).

    Raises:
      ValueError: one line naming ``where``: not a mapping, no op key or two, an
        unknown key, a value of the wrong type.

    >>> parse_op({"split": 1, "into": ["num_heads", -1]}, "entry 1")
    Split(axis=1, into=('num_heads', -1))
    >>> parse_op({"scale": "1 / sqrt(d)", "back": {"scale": "sqrt(d)"}}, "entry 1").back
    Scale(operand='sqrt(d)', within='float32', back=None)
    >>> parse_op({"transpose": [1, 0]}, "entry 1")
    Traceback (most recent call last):
    ValueError: entry 1: an op is one of add, concat, divide, merge, ...; got {'transpose': [1, 0]}
    >>> parse_op({"stack": "i", "when": "scan", "unstacked": {"h": "h_{i}"}}, "entry 1")
    When(op=Stack(over='i', axis=0, unstacked=('h', 'h_{i}')), condition='scan')
    """
    try:
        return _op(spec, nested=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _op(spec: Any, *, nested: bool) -> Op:
    kinds = [k for k in (spec if isinstance(spec, Mapping) else {}) if k in OPS]
    if not isinstance(spec, Mapping) or len(kinds) != 1:
        raise ValueError(f"an op is one of {', '.join(sorted(OPS))}; got {spec!r}")
    kind = kinds[0]
    cls, keys = OPS[kind]
    combines = cls in (Stack, Concat)
    respelled = cls is Stack and "unstacked" in spec
    allowed = {kind, *keys, *(("unstacked", "when") if respelled else ())}
    allowed |= set() if combines or nested else {"when"}
    extra = sorted(set(spec) - allowed)
    if extra:
        also = "" if combines or nested else " (and `when`)"
        why = ""
        if cls is Stack and extra[0] == "when":
            why = " without `unstacked` (how its parts are spelled where it does not apply)"
        raise ValueError(
            f"the {kind} op takes {', '.join(keys) or 'no other key'}{also}; got {extra[0]!r}{why}"
        )
    value = spec[kind]
    op: Op
    if cls is Permute:
        op = Permute(_ints(value, "permute"))
    elif cls in (Split, Merge):
        key = "into" if cls is Split else "sizes"
        sizes = spec.get(key)
        if not isinstance(sizes, list | tuple) or len(sizes) < 2:
            raise ValueError(f"`{key}` must list two sizes or more, got {sizes!r}")
        op = cls(_int(value, kind), tuple(_size_spec(s) for s in sizes))
    elif cls is Pad:
        for key in ("size", "to"):
            if key not in spec:
                raise ValueError(f"the pad op needs `{key}`")
        op = Pad(_int(value, "pad"), _size_spec(spec["size"]), _size_spec(spec["to"]))
    elif combines:
        if not isinstance(value, str) or not value.isidentifier():
            raise ValueError(f"{kind} names a placeholder, got {value!r}")
        axis = _axis_spec(spec.get("axis", 0))
        if cls is Stack:
            op = Stack(value, axis, _unstacked(spec, value) if respelled else None)
        else:
            sizes = spec.get("sizes")
            op = Concat(value, axis, None if sizes is None else tuple(map(_size_spec, sizes)))
    else:
        within = spec.get("in", "float32")
        if within not in WITHIN:
            raise ValueError(f"`in` is one of {', '.join(WITHIN)}, got {within!r}")
        back = None
        if "back" in spec:
            if nested:
                raise ValueError("a `back` op has no `back` of its own")
            back = _op(spec["back"], nested=True)
            if not isinstance(back, _Value):
                raise ValueError(f"`back` is a value op (scale, divide, add), got {spec['back']!r}")
        op = cls(_size_spec(value), within, back)  # type: ignore[call-arg]
    when = spec.get("when")
    if when is not None:
        if not isinstance(when, str):
            raise ValueError(f"`when` is an expression string, got {when!r}")
        op = When(op, when)
    return op


def _unstacked(spec: Mapping[str, Any], over: str) -> tuple[str, str]:
    """A stack's ``unstacked = {segment = "spelling"}``, checked."""
    value = spec["unstacked"]
    if "when" not in spec:
        raise ValueError(
            "`unstacked` spells the parts where the stack's `when` does not hold; give it a `when`"
        )
    if (
        not isinstance(value, Mapping)
        or len(value) != 1
        or not all(isinstance(s, str) and s and "/" not in s for s in (*value, *value.values()))
    ):
        raise ValueError(
            f"`unstacked` maps one segment of the Flax path to its spelling unstacked "
            f'({{layers = "layers_{{{over}}}"}}), got {value!r}'
        )
    if not isinstance(spec["when"], str):
        raise ValueError(f"`when` is an expression string, got {spec['when']!r}")
    names_in(spec["when"])  # (A condition that does not parse is refused at load.)
    ((segment, spelling),) = value.items()
    if "{" in segment or f"{{{over}}}" not in spelling:
        raise ValueError(
            f"`unstacked` {{{segment} = {spelling!r}}}: the segment is plain text and its "
            f"spelling holds {{{over}}}"
        )
    return segment, spelling


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{what} must be an int, got {value!r}")
    return value


def _axis_spec(value: Any) -> int | str:
    if type(value) is not int and not isinstance(value, str):
        raise ValueError(f"axis must be an int or an expression, got {value!r}")
    return value


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(type(v) is int for v in value):
        raise ValueError(f"{what} must be a list of ints, got {value!r}")
    return tuple(value)


def _size_spec(value: Any) -> int | float | str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"a size is an int or an expression, got {value!r}")
    return value
