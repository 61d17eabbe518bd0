"""Stacked layers: per-layer PyTorch tensors as one ``(L, ...)`` array, and back.

A scanned Flax model (linen ``nn.scan``, an NNX stack made with ``nnx.vmap``,
MaxText's ``scan_layers``) holds each weight of its ``L`` layers as one array,
where PyTorch has a tensor per layer: ``model.layers.0.mlp.down_proj.weight``,
``model.layers.1.mlp.down_proj.weight``, ... A *stack* is named by a template
with :data:`LAYER` in place of the layer index, ``model.layers.{i}.mlp.down_proj.weight``,
and its tensor is the layers stacked on axis 0 (``(L, *shape)``); a conversion
moves that axis where the Flax model keeps it, as an ordinary axis permutation
(:func:`lift`), so every rule, tie and naming record applies to a stack
as to any tensor. A naming record whose PyTorch name is a template is a stack.

Two sources do the work, both reading one layer at a time:

- :class:`StackedSource` gives a PyTorch-named source's per-layer tensors under
  some prefixes as stacks (what ``jaxshare convert SRC ITEM --stack model.layers``
  writes): a stack's array is filled layer by layer, and a slice of it (a layer,
  a device's block) reads only the layers it covers;
- :class:`UnstackedSource` gives every stack of a source as its per-layer
  tensors, each read as one slice of the stack (what the way back writes).

Nothing here imports JAX or torch.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from jaxshare.core.alias import AliasMap
from jaxshare.core.dtype import numpy_dtype
from jaxshare.core.naming import (
    EXPERT,
    LAYER,
    STACKED,
    layer_name,
    layer_perm,
    lift,
    stack_axis,
    stack_prefix,
)
from jaxshare.core.perm import Perm
from jaxshare.core.report import ArrayInfo
from jaxshare.io.buffers import empty_array
from jaxshare.io.plan import Plan, PlanEntry, PlannedSource
from jaxshare.io.source import Index, SourceView, TensorSource
from jaxshare.io.threads import parallel_map
from jaxshare.io.transpose import PARALLEL_BYTES, contiguous_transpose

__all__ = ["StackedSource", "UnstackedSource", "layer_prefixes", "per_layer", "unstacked"]

#: Stacks an :class:`UnstackedSource` reads whole ahead of the one it hands out (a layer's
#: experts), each on a thread of its own.
STACKS_AHEAD = 2


def per_layer(
    names: Iterable[str], layers: Callable[[str], int]
) -> list[tuple[str, str, int | None]]:
    """``(name, stack or name, layer or None)`` of ``names`` with each stack
    (``layers(stack)`` layers) given as its layers, in PyTorch's order: a prefix's
    layers at the place of its first stack, layer by layer.

    >>> [n for n, _, _ in per_layer(["e.w", "h.{i}.a", "h.{i}.b"], lambda name: 2)]
    ['e.w', 'h.0.a', 'h.0.b', 'h.1.a', 'h.1.b']
    """
    groups: dict[str, list[str]] = {}
    order: list[tuple[str, bool]] = []
    for name in names:
        prefix = stack_prefix(name)
        if prefix is None:
            order.append((name, False))
        else:
            if prefix not in groups:
                groups[prefix] = []
                order.append((prefix, True))
            groups[prefix].append(name)
    out: list[tuple[str, str, int | None]] = []
    for name, is_prefix in order:
        if not is_prefix:
            out.append((name, name, None))
            continue
        stacks = groups[name]
        counts = {stack: layers(stack) for stack in stacks}
        for k in range(max(counts.values())):
            out += [(layer_name(t, k), t, k) for t in stacks if k < counts[t]]
    return out


def layer_prefixes(names: Iterable[str]) -> list[str]:
    """The module prefixes that numbered layers are under, as ``--stack`` takes them.

    >>> layer_prefixes(["wte.weight", "h.0.attn.weight", "h.1.attn.weight"])
    ['h']
    """
    found = set()
    for name in names:
        parts = name.split(".")
        at = next((j for j, part in enumerate(parts[:-1]) if part.isdigit()), None)
        if at:
            found.add(".".join(parts[:at]))
    return sorted(found)


def _member(
    name: str, prefixes: Collection[str], placeholder: str = LAYER
) -> tuple[str, str, int] | None:
    """``(prefix, template, index)`` of a per-layer name under one of ``prefixes`` (for
    experts, ``placeholder`` :data:`EXPERT`: a prefix may hold :data:`LAYER`, which
    stands for any layer's index, ``model.layers.{i}.mlp.experts``); ``prefix`` is the
    one of ``prefixes`` it is under."""
    for pattern in prefixes:
        head = _prefix_regex(pattern).match(name)
        if head is None:
            continue
        own = head.group(0)[:-1]  # (The layer's index in it.)
        index, dot, rest = name[head.end() :].partition(".")
        if dot and index.isdigit() and (index == "0" or not index.startswith("0")):
            return pattern, f"{own}.{placeholder}.{rest}", int(index)
    return None


@functools.cache
def _prefix_regex(pattern: str) -> re.Pattern[str]:
    parts = [
        "(?:0|[1-9][0-9]*)" if part == LAYER else re.escape(part) for part in pattern.split(".")
    ]
    return re.compile(r"\.".join(parts) + r"\.")


def _check_prefix(prefix: Any, placeholder: str = LAYER) -> str:
    parts = prefix.split(".") if isinstance(prefix, str) else []
    layered = placeholder == EXPERT and parts.count(LAYER) == 1
    if (
        not isinstance(prefix, str)
        or not prefix
        or "/" in prefix
        or (LAYER in prefix and not layered)
        or EXPERT in prefix
        or any(not p for p in parts)
    ):
        raise ValueError(
            f"a stack prefix is a PyTorch module path such as 'model.layers' (experts': "
            f"'model.layers.{{i}}.mlp.experts'), got {prefix!r}."
        )
    return prefix


class StackedSource(SourceView):
    """A PyTorch-named source whose per-layer tensors under ``prefixes`` are stacks.

    ``model.layers.{k}.mlp.weight`` for ``k`` in ``0..L-1`` becomes the stack
    ``model.layers.{i}.mlp.weight`` of shape ``(L, *shape)``, at the place of its
    first layer; other tensors stay as they are. A tie that holds in every layer
    (``model.layers.{k}.a`` is ``model.layers.{k}.b``) is a tie of the stacks.

    Args:
      source: the per-layer source.
      prefixes: module prefixes whose numbered children are layers (``"model.layers"``).

    Raises:
      ValueError: a prefix with no numbered layers under it, missing layer
        indices, layers of one stack with different shapes or dtypes, or a tie
        between a layer and a tensor outside its stack, which one stacked array
        cannot keep; one line, naming the tensors.

    >>> from jaxshare.stream import TensorSource, ArrayInfo
    >>> class Layers(TensorSource):
    ...     infos = {f"h.{k}.w": ArrayInfo((2,), "float32") for k in range(3)}
    ...     def read(self, name):
    ...         return np.full(2, float(name.split(".")[1]), np.float32)
    >>> s = StackedSource(Layers(), ["h"])
    >>> dict(s.infos), s.array("h.{i}.w").tolist()
    ({'h.{i}.w': ArrayInfo(shape=(3, 2), dtype='float32')}, [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    """

    def __init__(
        self, source: TensorSource, prefixes: Iterable[str], placeholder: str = LAYER
    ) -> None:
        super().__init__(source)
        prefixes = sorted({_check_prefix(p, placeholder) for p in prefixes}, key=len, reverse=True)
        self.placeholder = placeholder
        layers: dict[str, dict[int, str]] = {}  # template -> {index: name}
        where: dict[str, tuple[str, int]] = {}  # name -> (template, index)
        order: list[str] = []
        owner: dict[str, str] = {}  # template -> the prefix (pattern) it stacks under
        for name in source.infos:
            found = _member(name, prefixes, placeholder)
            if found is None:
                order.append(name)
                continue
            pattern, template, index = found
            owner[template] = pattern
            if template not in layers:
                layers[template] = {}
                order.append(template)
            layers[template][index] = name
            where[name] = (template, index)
        self._layers = {t: tuple(by[k] for k in sorted(by)) for t, by in layers.items()}
        self._where = where
        empty = [p for p in prefixes if p not in owner.values()]
        if empty:
            raise ValueError(
                f"{source.where}: --stack {empty[0]!r} matches no tensor: no name starts "
                f"with '{empty[0]}.<{'expert' if placeholder == EXPERT else 'layer'} index>.' "
                f"(the prefixes with numbered layers here: "
                f"{layer_prefixes(source.infos)[:5] or 'none'})."
            )
        # Layers 0..L-1 under a prefix (a layer's experts: under its own): one past its highest.
        heads = {t: stack_prefix(t, placeholder) or "" for t in layers}
        counts = {
            head: 1 + max(max(by) for t, by in layers.items() if heads[t] == head)
            for head in set(heads.values())
        }
        infos: dict[str, ArrayInfo] = {}
        for name in order:
            if name not in layers:
                infos[name] = source.infos[name]
                continue
            infos[name] = self._stack_info(name, layers[name], counts[heads[name]])
        self.infos = infos
        self.ties = self._ties(source.ties)
        self.origins = {a: o for a, o in source.origins.items() if a in self.ties}
        self.mapped = source.mapped
        if source.layers is not None:
            self.layers = self._stacked_modules(source.layers, prefixes)
        buffers = source.buffers
        if buffers is not None:
            self.buffers = frozenset(where[b][0] if b in where else b for b in buffers)

    def _stack_info(self, template: str, by: dict[int, str], count: int) -> ArrayInfo:
        missing = [k for k in range(count) if k not in by]
        noun = "expert" if self.placeholder == EXPERT else "layer"
        if missing:
            raise ValueError(
                f"{self.where}: the stack {template!r} misses {noun}(s) {missing[:5]} of "
                f"0..{count - 1} (found {sorted(by)[:8]}); every {noun} needs each tensor."
            )
        infos = {k: self._source.infos[by[k]] for k in sorted(by)}
        first = infos[0]
        odd = next((k for k, info in infos.items() if info != first), None)
        if odd is not None:
            raise ValueError(
                f"{self.where}: the layers of {template!r} differ: {by[0]!r} is "
                f"{first.shape} {first.dtype} but {by[odd]!r} is {infos[odd].shape} "
                f"{infos[odd].dtype}; one stacked array needs equal layers."
            )
        return ArrayInfo((count, *first.shape), first.dtype)

    def _ties(self, ties: AliasMap) -> AliasMap:
        stacked: dict[str, tuple[str, Perm | None]] = {}
        kept: dict[str, str] = {}
        transforms: dict[str, Perm | None] = {}
        for alias, canonical in ties.items():
            a, c = self._where.get(alias), self._where.get(canonical)
            if a is None and c is None:
                kept[alias], transforms[alias] = canonical, ties.transform(alias)
                continue
            if a is None or c is None or a[1] != c[1]:
                raise ValueError(
                    f"{self.where}: {alias!r} is tied to {canonical!r}, across a stack's "
                    "layers or out of it, which one stacked array cannot keep; stack another "
                    "prefix, or untie them."
                )
            ta, tc = a[0], c[0]
            tie = (tc, ties.transform(alias))
            if stacked.setdefault(ta, tie) != tie:
                raise ValueError(
                    f"{self.where}: the layers of {ta!r} are tied unlike one another "
                    f"({alias!r} to {canonical!r}); one stacked array needs equal layers."
                )
        for ta, (tc, perm) in stacked.items():
            tied = sum(1 for a in self._layers[ta] if a in ties)
            if tied != len(self._layers[ta]):
                raise ValueError(
                    f"{self.where}: only {tied} of the {len(self._layers[ta])} layers of "
                    f"{ta!r} are tied to {tc!r}; one stacked array needs equal layers."
                )
            kept[ta] = tc
            transforms[ta] = lift(perm, len(self.infos[tc].shape) - 1, 0)
        return AliasMap(kept, transforms=transforms, naming=ties.naming)

    def _stacked_modules(
        self, layers: Mapping[str, str | None], prefixes: list[str]
    ) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for module, kind in layers.items():
            found = _member(f"{module}.x", prefixes, self.placeholder)
            out[found[1][:-2] if found else module] = kind
        return out

    def members(self, name: str) -> tuple[str, ...] | None:
        """The per-layer names of the stack ``name`` (``None``: not a stack)."""
        return self._layers.get(name)

    def array(self, name: str) -> np.ndarray:
        members = self._layers.get(name)
        if members is None:
            return self._source.array(name)
        info = self.infos[name]
        out = np.empty(info.shape, self._source.array(members[0]).dtype)
        for k, member in enumerate(members):
            out[k] = self._source.array(member)
        return out

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        members = self._layers.get(name)
        if members is None:
            return self._source.blocks(name)
        return (block for member in members for block in self._source.blocks(member))

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        members = self._layers.get(name)
        if members is None:
            return self._source.read_slice(name, index)
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        picked = range(len(members))[first]
        layer = self._source.infos[members[0]]
        shape = np.broadcast_to(np.empty((), np.bool_), layer.shape)[rest].shape
        out = np.empty((len(picked), *shape), numpy_dtype(layer.dtype))
        self._fill(name, index, out)
        return out

    def permuted_slice(self, name: str, index: Index, perm: Perm) -> np.ndarray | None:
        members = self._layers.get(name)
        if members is None:
            return self._source.permuted_slice(name, index, perm)
        if perm[0] != 0:  # (The stack's axis moves: read, then transposed.)
            return None
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        layer = self._source.infos[members[0]]
        shape = np.broadcast_to(np.empty((), np.bool_), layer.shape)[rest].shape
        shape = (len(range(len(members))[first]), *shape)
        out = empty_array(tuple(shape[k] for k in perm), numpy_dtype(layer.dtype))
        jobs: list[Callable[[], object]] = []
        self._transposing(name, index, out, perm, jobs)
        if out.nbytes >= PARALLEL_BYTES and len(jobs) > 1:
            for _ in parallel_map(lambda job: job(), jobs):
                pass
        else:
            for job in jobs:
                job()
        return out

    def _transposing(
        self, name: str, index: Index, out: np.ndarray, perm: Perm, jobs: list[Callable[[], object]]
    ) -> None:
        """The copies that make ``permuted_slice(name, index, perm)`` in ``out``
        (``perm`` keeps the stack's axis first): each layer's slice transposed into
        its place from a view of the source's memory (a stack of stacks, each layer's
        experts so, where the inner stack's axis stays first too)."""
        members = self._layers[name]
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        inner = tuple(p - 1 for p in perm[1:])
        source = self._source
        for j, k in enumerate(range(len(members))[first]):
            member, place = members[k], out[j]
            if isinstance(source, StackedSource) and member in source._layers and inner[0] == 0:
                source._transposing(member, rest, place, inner, jobs)
            else:
                jobs.append(functools.partial(self._transpose, member, rest, inner, place))

    def _transpose(self, member: str, index: Index, perm: Perm, out: np.ndarray) -> None:
        view = self._source.slice_view(member, index)
        contiguous_transpose(view, perm, out=out, threads=False)

    def _fill(self, name: str, index: Index, out: np.ndarray) -> None:
        """``read_slice(name, index)`` written into ``out``: each layer's slice copied
        once, from a view of the source's memory where it has one (a stack of stacks,
        a layer's experts, each filled in place)."""
        members = self._layers[name]
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        for j, k in enumerate(range(len(members))[first]):
            if isinstance(self._source, StackedSource) and members[k] in self._source._layers:
                self._source._fill(members[k], rest, out[j])
            else:
                out[j] = self._source.slice_view(members[k], rest)


class UnstackedSource(SourceView):
    """A source whose stacks (names with :data:`LAYER`, shape ``(L, *shape)``) are
    given as their per-layer tensors, stack after stack, each read as one slice of
    its stack (so a stack stored in per-layer chunks is read one layer at a time;
    one stored in chunks that span layers is read whole once, and kept while its
    layers are read); other tensors and ties as they are, a tie of stacks a tie in
    every layer.

    >>> from jaxshare.stream import TensorSource, ArrayInfo
    >>> class Stack(TensorSource):
    ...     infos = {"h.{i}.w": ArrayInfo((3, 2), "float32")}
    ...     def read(self, name):
    ...         return np.arange(6, dtype=np.float32).reshape(3, 2)
    >>> s = UnstackedSource(Stack())
    >>> list(s.infos), s.array("h.2.w").tolist()
    (['h.0.w', 'h.1.w', 'h.2.w'], [4.0, 5.0])
    """

    def __init__(self, source: TensorSource, placeholder: str = LAYER) -> None:
        super().__init__(source)
        self.placeholder = placeholder
        self._of: dict[str, tuple[str, int]] = {}
        of = functools.partial(stack_prefix, placeholder=placeholder)
        flat = [n for n, info in source.infos.items() if not info.shape and of(n)]
        if flat:
            raise ValueError(f"{source.where}: the stack {flat[0]!r} is 0-D: it has no layers.")
        infos: dict[str, ArrayInfo] = {}
        for stack, info in source.infos.items():  # Stack after stack: see `array`.
            if of(stack) is None:
                infos[stack] = info
                continue
            for k in range(info.shape[0]):
                infos[layer_name(stack, k, placeholder)] = ArrayInfo(info.shape[1:], info.dtype)
                self._of[layer_name(stack, k, placeholder)] = (stack, k)
        self.infos = infos
        self._whole: tuple[str, _Held] | None = None  # The stack read whole, if any.
        # The stacks after it, read whole on threads of their own meanwhile.
        self._ahead: dict[str, Future[np.ndarray]] = {}
        self._pool: ThreadPoolExecutor | None = None
        stacks = [t for t in source.infos if of(t) is not None]
        self._after = dict(zip(stacks, stacks[1:], strict=False))
        self._lock = threading.Lock()
        aliases: dict[str, str] = {}
        transforms: dict[str, Perm | None] = {}
        for alias, canonical in source.ties.items():
            stacks = placeholder in alias.split("."), placeholder in canonical.split(".")
            perm = source.ties.transform(alias)
            if not any(stacks):
                aliases[alias], transforms[alias] = canonical, perm
            elif all(stacks) and stack_axis(perm) == 0:
                for k in range(source.infos[canonical].shape[0]):
                    one = layer_name(alias, k, placeholder)
                    aliases[one] = layer_name(canonical, k, placeholder)
                    transforms[one] = layer_perm(perm)
            else:
                raise ValueError(
                    f"{source.where}: {alias!r} is tied to {canonical!r} but not layer for "
                    "layer, so per-layer names cannot keep the tie."
                )
        self.ties = AliasMap(aliases, transforms=transforms, naming=source.ties.naming)

    def array(self, name: str) -> np.ndarray:
        """One layer: one slice of its stack, read alone where the source stores the
        stack in chunks of one layer (or maps it); else the stack is read whole once,
        and kept while its layers are read (the layers come stack after stack), so a
        chunk that spans layers is decoded once, not once per layer."""
        stack = self._of.get(name)
        if stack is None:
            return self._source.array(name)
        template, k = stack
        layer = (slice(k, k + 1),)
        chunks = self._source.chunk_shape(template)
        # (A layer's experts, each a slice of the layer read once: held while they are read.)
        if (chunks is None or chunks[0] <= 1) and self.placeholder == LAYER:
            return self._source.read_slice(template, layer)[0]
        # Read whole once, as stored: a planned stack's layers are transposed one by one.
        entry = self._origin(template)[1]
        with self._lock:
            if self._whole is None or self._whole[0] != template:
                self._whole = None  # (Freed before the next is read.)
                self._whole = (template, _Held(entry.source, self._read_whole(template)))
            held = self._whole[1]
            if k == self._source.infos[template].shape[0] - 1:
                self._whole = None  # Its last layer: not held while the next tensors are read.
        return Plan((entry,), AliasMap()).read_slice(held, entry, layer)[0]

    def _read_whole(self, template: str) -> np.ndarray:
        """The stack ``template`` read whole as stored (taken from the thread that read
        it ahead, where one did), and the :data:`STACKS_AHEAD` stacks after it begun on
        threads of their own: a layer's experts are read (decoded from an item's
        chunks, transposed) while the layer before is handed out."""
        ahead = self._ahead.pop(template, None)
        if ahead is not None:
            whole = ahead.result()
        else:
            base, entry = self._origin(template)
            whole = base.array(entry.source)
        upcoming: list[str] = []
        after = self._after.get(template)
        while after is not None and len(upcoming) < STACKS_AHEAD:
            upcoming.append(after)
            after = self._after.get(after)
        for other in [t for t in self._ahead if t not in upcoming]:  # (Out of turn.)
            self._ahead.pop(other).cancel()
        for after in upcoming:
            if after not in self._ahead:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        STACKS_AHEAD, thread_name_prefix="jaxshare-stack-ahead"
                    )
                base, entry = self._origin(after)
                self._ahead[after] = self._pool.submit(base.array, entry.source)
        return whole

    def _origin(self, template: str) -> tuple[TensorSource, PlanEntry]:
        """Where the stack ``template`` is stored, and how the plan below reads it."""
        if isinstance(self._source, PlannedSource):
            return self._source.origin(template)
        return self._source, PlanEntry(template, template, None, self._source.infos[template])

    def close(self) -> None:
        if self._pool is not None:  # (A stack being read ahead: done before the source.)
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._ahead.clear()
        super().close()

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        if name not in self._of:
            return self._source.blocks(name)
        return (self.array(name),)

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        stack = self._of.get(name)
        if stack is None:
            return self._source.read_slice(name, index)
        template, k = stack
        return self._source.read_slice(template, (slice(k, k + 1), *index))[0]


class _Held(TensorSource):
    """One array in memory, as a source (a stack read whole, its layers sliced off)."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array
        self.infos = {name: ArrayInfo(tuple(array.shape), array.dtype.name)}

    def read(self, name: str) -> np.ndarray:
        return self._array

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        return self._array[index]


def unstacked(plan: Plan, source: TensorSource) -> tuple[Plan, TensorSource]:
    """A plan whose outputs include stacks, as per-layer outputs: ``(plan, source)``
    where the plan keeps every output name of ``plan`` but the stacks, which are
    each layer's name, read from ``source`` through ``plan`` one slice at a time.
    A plan without stacks comes back as it is."""
    placeholders = [p for p in STACKED if any(p in e.name.split(".") for e in plan.entries)]
    if not placeholders:
        return plan, source
    layers: TensorSource = PlannedSource(source, plan)  # (Its ties carry the plan's record.)
    for placeholder in placeholders:  # (Layers, then each layer's experts.)
        layers = UnstackedSource(layers, placeholder)
    return Plan.identity(layers), layers
