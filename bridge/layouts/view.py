"""A source read through a layout table, either way.

:class:`TableToFlax` gives a PyTorch-named source (a Hugging Face directory, a
safetensors file) as the Flax tree of a table (:mod:`bridge.layouts.table`):
each leaf made from its PyTorch tensors by its entry's ops. :class:`TableToTorch`
gives a Flax-named source in the table's layout (an Orbax item of a Tunix model,
an ``nnx.State``, a MaxText run's item) as the PyTorch tensors, each made by the
inverse ops in the reverse order, and the table's implicit ties as aliases. Both
read one tensor at a time; a slice of a leaf (a device's block, one layer of a
stack) reads only what it covers wherever the ops map it to one slice of the
other side.

Both take a ``prefix``, where in the Flax tree the table's paths are
(``("params", "params")`` for a MaxText run's item; on the way back the leaves
outside it -- the run's ``step``, its ``opt_state`` -- are left alone), and
``options``: values the table's expressions see over the config (MaxText's
``scan_layers`` and ``param_scan_axis``). Where the entries give their PyTorch
``shape`` and the table its ``ranges``, every tensor and leaf the config's model
holds is checked before anything is read, and each fault is one line naming it.
"""

from __future__ import annotations

import difflib
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from bridge.layouts.ops import Box, Concat, Merge, Op, Permute, Split, Stack, Stacks, When
from bridge.layouts.table import (
    Bound,
    BoundEntry,
    Table,
    back_chain,
    chain,
    fill,
    invert_shapes,
    placeholders,
)
from jaxshare import AliasMap
from jaxshare.internal import Index, contiguous_transpose, inverse, numpy_dtype
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = ["TableToFlax", "TableToTorch", "pick_table", "table_view"]

Shape = tuple[int, ...]

# (The shape chains, under the names this module's tests know them by.)
_chain = chain
_back_chain = back_chain
_invert_shapes = invert_shapes


def pick_table(tables: Sequence[Table], config: Mapping[str, Any] | None, where: str) -> Table:
    """The table of ``tables`` for ``config``'s ``model_type`` (a table with no
    ``model_types`` fits any).

    Raises:
      ValueError: none fits; the message lists the model types the tables know.
    """
    model_type = (config or {}).get("model_type")
    for table in tables:
        if not table.model_types or model_type in table.model_types:
            return table
    known = sorted({m for t in tables for m in t.model_types})
    if config is None:
        raise ValueError(
            f"{where}: the {tables[0].name} layout is chosen by config.json's model_type "
            f"({', '.join(known)}); pass the model's config.json (--config)."
        )
    raise ValueError(
        f"{where}: the {tables[0].name} layout knows model_type {', '.join(known)}; "
        f"config.json says {model_type!r}."
    )


def _full(index: Index, shape: Shape) -> tuple[tuple[slice, ...], tuple[int, ...]]:
    """``index`` as one slice per axis, and the axes an int picked (to squeeze)."""
    out: list[slice] = []
    picked: list[int] = []
    for k, n in enumerate(shape):
        s = index[k] if k < len(index) else slice(None)
        if isinstance(s, int | np.integer):
            i = int(s) % n
            out.append(slice(i, i + 1))
            picked.append(k)
        else:
            out.append(s)
    return tuple(out), tuple(picked)


def _contiguous(x: np.ndarray) -> np.ndarray:
    """``x`` C-ordered: itself where it is, else copied -- a transposed view of a
    C-ordered array by the tiled, threaded transpose, numpy's being slow."""
    if x.flags.c_contiguous:
        return x
    order = tuple(int(k) for k in np.argsort([-s for s in x.strides], kind="stable"))
    base = x.transpose(order)
    if base.flags.c_contiguous:
        return contiguous_transpose(base, tuple(int(k) for k in np.argsort(order)))
    return np.array(x, order="C")


def _as_one_transpose(ops: Sequence[Op], shape: Shape) -> tuple[tuple[int, ...], Shape] | None:
    """``ops`` undone on a leaf of ``shape`` as one transpose and a reshape, ``(perm,
    shape after)``, where they only move, merge and split axes along the leaf's own
    (the way back of a Tunix or MaxText kernel); ``None`` where they do more."""
    groups = [[k] for k in range(len(shape))]  # (Each axis: the leaf's axes it runs over.)
    for op in reversed(ops):
        if isinstance(op, Permute):
            groups = [groups[k] for k in inverse(op.perm) or range(len(groups))]
        elif isinstance(op, Split):  # (Back: the split axes merged.)
            n = len(op.into)
            a = op.axis % (len(groups) - n + 1)
            groups[a : a + n] = [[k for g in groups[a : a + n] for k in g]]
        elif isinstance(op, Merge):  # (Back: one axis split along the leaf's own axes.)
            a = op.axis % len(groups)
            group, parts, at = groups[a], [], 0
            for size in Split(0, op.sizes).shape((math.prod(shape[k] for k in group),)):
                take: list[int] = []
                while at < len(group) and math.prod(shape[k] for k in take) < size:
                    take.append(group[at])
                    at += 1
                if math.prod(shape[k] for k in take) != size:
                    return None
                parts.append(take)
            parts[-1].extend(group[at:])  # (Axes of size 1 left: they move nothing.)
            groups[a : a + 1] = parts
        else:
            return None
    perm = tuple(k for g in groups for k in g)
    return perm, tuple(math.prod(shape[k] for k in g) for g in groups)


def _extent(index: Sequence[slice], shape: Shape) -> Shape:
    return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape, strict=True))


def _through(
    ops: Sequence[Op],
    shapes: Sequence[Shape],
    index: Index,
    read: Callable[[tuple[slice, ...]], np.ndarray],
) -> np.ndarray:
    """``ops`` applied to a tensor of ``shapes[0]``, at ``index`` of the result:
    the slice of the input the ops map ``index`` back to, read by ``read`` and
    taken through the ops; or the whole input, where they map it to no one slice."""
    wanted, picked = _full(index, shapes[-1])
    at: list[tuple[slice, ...] | None] = [None] * len(ops) + [wanted]
    for k in reversed(range(len(ops))):
        back = ops[k].back_index(at[k + 1], shapes[k + 1])  # type: ignore[arg-type]
        if back is None:
            break
        at[k] = back
    if at[0] is None:
        x = read(tuple(slice(None) for _ in shapes[0]))
        for op in ops:
            x = op.forward(x)
        x = x[wanted]
    else:
        x = read(at[0])
        for k, op in enumerate(ops):
            x = op.forward_box(x, _extent(at[k + 1], shapes[k + 1]))  # type: ignore[arg-type]
    return np.squeeze(x, axis=picked) if picked else x


def _box_read(ops: Sequence[Op], shape: Shape) -> tuple[slice, ...] | None:
    """The one slice of the result of ``ops`` that holds every value of an input of
    ``shape`` (the rows a pad kept), or ``None`` where it is the whole result or
    not one slice."""
    box: Box | None = tuple((0, n) for n in shape)
    shapes = chain(ops, shape, "")
    for op, s in zip(ops, shapes, strict=False):
        box = op.box(box, s)  # type: ignore[arg-type]
        if box is None:
            return None
    assert box is not None
    if all(b == (0, n) for b, n in zip(box, shapes[-1], strict=True)):
        return None
    return tuple(
        slice(None) if b == (0, n) else slice(*b) for b, n in zip(box, shapes[-1], strict=True)
    )


@dataclass
class _Leaf:
    """One Flax leaf of a table: its entry, and its PyTorch tensors in order."""

    entry: BoundEntry
    names: list[str] = field(default_factory=list)
    #: Each tensor's values of the placeholders its entry combines over.
    values: list[tuple[str, ...]] = field(default_factory=list)
    torch_shapes: list[Shape] = field(default_factory=list)
    #: Each part's shapes through the ops before the combine (the last: the part's).
    chains: list[list[Shape]] = field(default_factory=list)
    combined: Shape = ()
    #: The shapes from ``combined`` through the ops after it (the last: the leaf's).
    after: list[Shape] = field(default_factory=list)
    dtype: str = ""

    @property
    def shape(self) -> Shape:
        return self.after[-1]

    def part_index(self, k: int) -> Index:
        return _part_index(self.entry, self.combined, len(self.names), k)


def _part_index(entry: BoundEntry, combined: Shape, parts: int, k: int) -> Index:
    """The index of part ``k`` of ``parts`` in a leaf whose combined shape is
    ``combined`` (before the ops after its stack or concat)."""
    combine = entry.combine
    if isinstance(combine, Stack | Stacks):
        return combine.part_index(k, combined)
    assert isinstance(combine, Concat)
    return combine.part_index(k, combined, parts)


def _order(entry: BoundEntry, values: list[tuple[str, ...]], where: str) -> list[int]:
    """The order of a leaf's parts (``values`` of its combined placeholders), checked
    complete: every named part, or layers ``0 .. n-1`` (of stacks one after another:
    every combination, the last stack's placeholder slowest)."""
    combine = entry.combine
    if combine is None:
        return [0]
    ranks: list[dict[str, int]] = []
    for j, over in enumerate(combine.overs):
        column = [v[j] for v in values]
        named = entry.entry.parts.get(over)
        if named is not None:
            missing = [v for v in named if v not in column]
            if missing:
                raise ValueError(
                    f"{where}: {entry.describe()} {combine.to_dict()} lacks the part "
                    f"{{{over}}}={missing[0]!r}"
                )
            ranks.append({v: named.index(v) for v in named})
            continue
        numbers = sorted({int(v) for v in column})
        if numbers != list(range(len(numbers))):
            gap = next(i for i, n in enumerate(numbers) if i != n)
            raise ValueError(
                f"{where}: {entry.describe()} stacks {{{over}}} 0..{numbers[-1]}, "
                f"but {{{over}}}={gap} is missing"
            )
        ranks.append({str(n): n for n in numbers})
    have = set(values)
    for combo in itertools.product(*(list(r) for r in ranks)):
        if combo not in have:
            labels = ", ".join(f"{{{o}}}={v}" for o, v in zip(combine.overs, combo, strict=True))
            raise ValueError(f"{where}: {entry.describe()} stacks no tensor for {labels}")
    return sorted(
        range(len(values)),
        key=lambda k: tuple(r[v] for r, v in zip(ranks[::-1], values[k][::-1], strict=True)),
    )


def _spellings(entry: BoundEntry) -> list[str]:
    """The named placeholders of ``entry`` that spell one tensor in several ways."""
    in_flax = set(placeholders(entry.entry.flax))
    overs = entry.combine.overs if entry.combine is not None else ()
    return [p for p in entry.entry.parts if p not in in_flax and p not in overs]


def _near(name: str, names: Iterable[str]) -> str:
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.8)
    return f"nearest: {', '.join(near)}" if near else "nothing near it"


def _no_place(
    bound: Bound,
    found: tuple[BoundEntry, dict[str, str]] | None,
    text: str,
    *,
    flax: bool,
    shown: str | None = None,
) -> str | None:
    """The line for a tensor (or, ``flax``, a leaf) ``text`` that no entry places --
    none matches, or the one that does reaches past its range -- naming the nearest
    entry; ``None`` where ``found`` places it."""
    why = None if found is None else bound.beyond(found[1])
    if found is not None and why is None:
        return None
    reason = bound.nearest(text, flax=flax) if why is None else why
    what = "leaf" if flax else "tensor"
    fix = "add an entry for it" if flax else "add an entry, or `ignore` it"
    return (
        f"{bound.where}: the {what} {shown or text!r} has no place in the {bound.table.name} "
        f"layout ({reason}); {fix}."
    )


class _TableSource(TensorSource):
    """What both directions share: the wrapped source and the bound table."""

    _source: TensorSource
    bound: Bound
    #: ``{PyTorch name: (Flax path, the entry that places it)}``.
    placed_by: dict[str, tuple[str, str]]

    def _wrap(
        self,
        source: TensorSource,
        table: Table,
        config: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        prefix: Sequence[str],
    ) -> None:
        self._source = source
        config = config if config is not None else source.config
        self.config, self.live = config, source.live
        self.path, self.kind = source.path, source.kind
        self.parts, self.assets = source.parts, source.assets
        self.other_files = source.other_files
        self.table = table
        where = f"{source.where}: the {table.name} layout"
        self.bound = table.bind(config, where, options=options)
        self.prefix = tuple(prefix)
        self._top = "".join(f"{key}/" for key in self.prefix)
        self.placed_by = {}

    @property
    def where(self) -> str:
        return self._source.where

    def close(self) -> None:
        self._source.close()

    def read(self, name: str) -> np.ndarray:
        return self.array(name)

    def _missing(self, what: str, name: str, entry: BoundEntry, shape: Any, near: str) -> str:
        """The one line for a tensor or leaf ``name`` of ``entry`` that is missing."""
        where, optional = self.bound.where, entry.entry.optional
        given = "" if shape is None else f" {shape}"
        if isinstance(optional, str):
            return (
                f"{where}: the {what} {name!r} is missing, which {entry.describe()} allows "
                f"only where `{optional}` holds; config.json makes it false: set it there, "
                f"or convert a model with the {what}{given}."
            )
        return (
            f"{where}: the {what} {name!r}{given} is missing ({near}); "
            f"{entry.describe()} places it."
        )


class TableToFlax(_TableSource):
    """A PyTorch-named source as the Flax tree of a layout table.

    Args:
      source: the PyTorch tensors (a Hugging Face directory's, a file's).
      table: the layout table.
      config: the model's ``config.json`` as a dict; default: the source's.
      options: values the table's expressions see over the config.
      prefix: the keys the table's Flax paths go under (``("params",)``).

    Attributes:
      implicit: ``{alias: canonical}`` of the implicit ties (PyTorch names): the
        model computes the alias, which has no leaf.
      placed_by: ``{PyTorch name: (Flax path, entry)}``.
      lines: what the conversion says once, one line each (a stored tensor the
        model computes from a tie).
      prefix: ``prefix``.

    Raises:
      ValueError: one line: a tensor no entry places (naming the nearest entry),
        an entry that matches no tensor (naming the tensor, with its shape, where
        the table gives shapes and ranges), a tensor whose shape is not the one
        the config makes, two entries claiming one tensor or leaf, sizes that do
        not divide, parts of a stack that differ in shape or dtype.

    >>> import tempfile
    >>> from safetensors.numpy import save_file
    >>> from jaxshare.formats import SafetensorsFile
    >>> table = Table.from_dict({"name": "heads", "entry": [
    ...     {"torch": "q.weight", "flax": "q/w", "ops": [{"permute": [1, 0]},
    ...      {"split": 1, "into": ["heads", -1]}]}]})
    >>> save_file({"q.weight": np.arange(24, dtype=np.float32).reshape(6, 4)},
    ...           path := tempfile.mkdtemp() + "/m.safetensors")
    >>> with SafetensorsFile(path) as file:
    ...     tree = TableToFlax(file, table, {"heads": 2}, prefix=("params",))
    ...     print(tree.infos["params/q/w"], tree.array("params/q/w")[1, 0].tolist())
    ArrayInfo(shape=(4, 2, 3), dtype='float32')
    [1.0, 5.0, 9.0]
    """

    flax_named = True

    def __init__(
        self,
        source: TensorSource,
        table: Table,
        config: Mapping[str, Any] | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self._wrap(source, table, config, options, prefix)
        bound, where = self.bound, self.bound.where
        names = [*source.infos, *(a for a in source.ties if a not in source.infos)]
        leaves: dict[str, _Leaf] = {}
        self.implicit: dict[str, str] = {}
        self.lines: list[str] = []
        unplaced: list[str] = []
        for name in names:
            if bound.ignored(name):
                continue
            tie = bound.implicit_tie(name)
            if tie is not None:
                self.implicit[name] = tie.canonical
                if name in source.infos and name not in source.ties:
                    self.lines.append(self._stored_alias(name, tie.canonical))
                continue
            found = bound.match_torch(name)
            if (line := _no_place(bound, found, name, flax=False)) is not None:
                unplaced.append(line)
                continue
            assert found is not None
            entry, values = found
            overs = entry.combine.overs if entry.combine is not None else ()
            path = self._top + fill(
                entry.entry.flax, {k: v for k, v in values.items() if k not in overs}
            )
            leaf = leaves.setdefault(path, _Leaf(entry))
            if leaf.entry is not entry:
                raise ValueError(
                    f"{where}: two entries claim the leaf {path!r}: {leaf.entry.describe()} "
                    f"and {entry.describe()}"
                )
            if leaf.names and not overs:
                raise ValueError(
                    f"{where}: two tensors make the leaf {path!r}: {leaf.names[0]!r} and "
                    f"{name!r} ({entry.describe()} lists other spellings of one tensor)"
                )
            leaf.names.append(name)
            leaf.values.append(tuple(values[o] for o in overs))
            self.placed_by[name] = (path, entry.describe())
        for line in self.lines:
            warnings.warn(line, stacklevel=3)
        self._check_tensors(leaves, names)
        if unplaced:
            raise ValueError(unplaced[0])
        self._leaves = dict(sorted(leaves.items(), key=lambda kv: kv[1].entry.index))
        for path, leaf in self._leaves.items():
            self._plan(path, leaf)
        self.infos = {
            path: ArrayInfo(leaf.shape, leaf.dtype) for path, leaf in self._leaves.items()
        }
        self.ties = self._implicit_ties()

    def _check_tensors(self, leaves: Mapping[str, _Leaf], names: Sequence[str]) -> None:
        """Every tensor each entry holds for the config is there, of the shape the
        config makes (where the table says), entry by entry, layer by layer."""
        bound = self.bound
        by_entry: dict[int, list[str]] = {}
        for leaf in leaves.values():
            by_entry.setdefault(leaf.entry.index, []).extend(leaf.names)
        for entry in bound.entries:
            present = by_entry.get(entry.index, [])
            combos = None if _spellings(entry) else bound.expand(entry, flax=False)
            if combos is None:
                if not present and not entry.optional:
                    near = difflib.get_close_matches(
                        entry.entry.torch, list(names), n=1, cutoff=0.0
                    )
                    found = f"nearest tensor: {near[0]!r}" if near else "the source holds no tensor"
                    raise ValueError(
                        f"{bound.where}: {entry.describe()} matches no tensor ({found}); "
                        "mark it `optional`, or give it a `when`."
                    )
                expected = present
            else:
                expected = [fill(entry.entry.torch, values) for values in combos]
            have = set(present)
            for name in expected:
                if name not in have:
                    if entry.optional:
                        continue
                    raise ValueError(
                        self._missing("tensor", name, entry, entry.shape, _near(name, names))
                    )
                got = tuple(self._torch_info(name).shape)
                if entry.shape is not None and got != entry.shape:
                    raise ValueError(
                        f"{bound.where}: the tensor {name!r} has shape {got}, but config.json "
                        f"({bound.described(entry)}) makes it {entry.shape}; pass the model's "
                        "own config.json."
                    )

    def _implicit_ties(self) -> AliasMap:
        """The implicit ties in Flax paths, marked implicit (never leaves), where the
        table places the alias (an entry its config leaves inactive: a tied model's
        head) and its canonical is a leaf of its own read as stored or permuted."""
        aliases: dict[str, str] = {}
        transforms: dict[str, tuple[int, ...] | None] = {}
        for alias, canonical in self.implicit.items():
            at = self.bound.place_inactive(alias)
            placed = self.placed_by.get(canonical)
            if at is None or placed is None:
                continue
            leaf = self._leaves[placed[0]]
            perms = [op.perm for op in at[1] if isinstance(op, Permute)]
            if leaf.entry.ops or len(perms) != len(at[1]) or len(perms) > 1:
                continue  # (Not a transpose of its canonical: the table alone ties it.)
            path = self._top + at[0]
            aliases[path] = placed[0]
            transforms[path] = perms[0] if perms else None
        return AliasMap(aliases, transforms=transforms, implicit=list(aliases))

    def _stored_alias(self, name: str, canonical: str) -> str:
        """The one line for a stored tensor the model computes from its tie."""
        source = self._source
        a, b = self._torch_array(name), self._torch_array(canonical)
        if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True):
            return (
                f"{source.where}: {name!r} is stored, and equals {canonical!r}: the model "
                "computes it from the tie, so it has no leaf."
            )
        if a.shape != b.shape:
            delta = f"its shape {a.shape} is not {b.shape}"
        else:
            d = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0.0
            delta = f"max |Δ| = {float(d):.6g}"
        return (
            f"{source.where}: {name!r} is stored but the config ties it to {canonical!r} "
            f"({delta}): the model computes it from {canonical!r}, so the stored values are "
            "not used; set tie_word_embeddings: false in config.json to keep them."
        )

    def _torch_info(self, name: str) -> ArrayInfo:
        source = self._source
        if name in source.infos:
            return source.infos[name]
        canonical = source.ties[name]
        return source.infos[canonical].permuted(source.ties.transform(name))

    def _torch_array(self, name: str) -> np.ndarray:
        source = self._source
        if name in source.infos:
            return np.asarray(source.array(name))
        x = np.asarray(source.array(source.ties[name]))
        perm = source.ties.transform(name)
        return x if perm is None else x.transpose(perm)

    def _torch_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        source = self._source
        if name in source.infos:  # (A view of the file, where it maps one: read once.)
            return np.asarray(source.slice_view(name, index))
        return self._torch_array(name)[index]

    def _plan(self, path: str, leaf: _Leaf) -> None:
        entry, where = leaf.entry, f"{self.bound.where}: {leaf.entry.describe()}"
        order = _order(entry, leaf.values, where)
        leaf.names = [leaf.names[k] for k in order]
        leaf.values = [leaf.values[k] for k in order]
        infos = [self._torch_info(n) for n in leaf.names]
        first = infos[0].dtype
        odd = next((k for k, info in enumerate(infos) if info.dtype != first), None)
        if odd is not None:
            overs = entry.combine.overs if entry.combine is not None else ()
            first_part = reversed(list(zip(overs, leaf.values[0], strict=True)))  # (Slowest first.)
            labels = ", ".join(self.bound.label(o, v) for o, v in first_part)
            ranged = overs and all(o in self.table.ranges for o in overs)
            whose = f"{labels}'s" if ranged else repr(leaf.names[0])
            raise ValueError(
                f"{self.bound.where}: {leaf.names[odd]!r} is {infos[odd].dtype}, but {whose} is "
                f"{first}; the leaf {path!r} is one array, of one dtype: cast them first."
            )
        leaf.dtype = first
        leaf.torch_shapes = [tuple(info.shape) for info in infos]
        leaf.chains = [chain(entry.before, s, where) for s in leaf.torch_shapes]
        parts = [c[-1] for c in leaf.chains]
        combine = entry.combine
        try:
            if isinstance(combine, Stacks):
                counts = [len({v[j] for v in leaf.values}) for j in range(len(combine.stacks))]
                leaf.combined = combine.combined(parts, counts)
            else:
                leaf.combined = parts[0] if combine is None else combine.combined(parts)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        leaf.after = chain(entry.after, leaf.combined, where)
        back = invert_shapes(entry, leaf.shape, len(leaf.names), where)
        if back != leaf.torch_shapes:
            raise ValueError(
                f"{where}: the leaf {path!r} {leaf.shape} does not invert to the tensors' "
                f"shapes {leaf.torch_shapes} (it gives {back}); give the concat its `sizes`."
            )

    def array(self, name: str) -> np.ndarray:
        return _contiguous(self.slice_view(name, ()))

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        view = self.slice_view(name, index)
        out = _contiguous(view)
        return np.array(out) if out is view and not view.flags.owndata else out

    def slice_view(self, name: str, index: Index) -> np.ndarray:
        """``index`` of the leaf ``name``, as the ops leave it: a view of the source's
        file where they only slice and transpose it (XLA copies it once into a
        device's buffer), an array of its own where they compute or combine."""
        try:
            leaf = self._leaves[name]
        except KeyError:
            raise KeyError(f"{self.where}: no leaf named {name!r}.") from None
        entry = leaf.entry
        if entry.combine is None:
            shapes = leaf.chains[0]
            return _through(
                entry.before, shapes, index, lambda i: self._torch_slice(leaf.names[0], i)
            )
        return _through(entry.after, leaf.after, index, lambda i: self._combined(leaf, i))

    def _combined(self, leaf: _Leaf, index: tuple[slice, ...]) -> np.ndarray:
        """``index`` of the stacked (or concatenated) parts, reading only the parts
        (and the slices of them) it covers."""
        combine = leaf.entry.combine
        assert combine is not None
        ndim = len(leaf.combined)
        out = np.empty(_extent(index, leaf.combined), numpy_dtype(leaf.dtype))
        if isinstance(combine, Stack | Stacks):  # (Each stack's axis: the parts it covers.)
            axes = combine.axes(ndim) if isinstance(combine, Stacks) else (combine.axis % ndim,)
            covered = [range(*index[a].indices(leaf.combined[a])) for a in axes]
            rest = tuple(s for k, s in enumerate(index) if k not in axes)
        else:
            a = combine.axis % ndim
            start, stop, step = index[a].indices(leaf.combined[a])
        for k, name in enumerate(leaf.names):
            shapes = leaf.chains[k]

            def read(i: tuple[slice, ...], name: str = name) -> np.ndarray:
                return self._torch_slice(name, i)

            if isinstance(combine, Stack | Stacks):
                at = leaf.part_index(k)
                if any(at[a] not in r for a, r in zip(axes, covered, strict=True)):
                    continue
                put: list[Any] = [slice(None)] * ndim
                for a, r in zip(axes, covered, strict=True):
                    put[a] = r.index(at[a])
                out[tuple(put)] = _through(leaf.entry.before, shapes, rest, read)
                continue
            part = leaf.part_index(k)[a]
            lo, hi = max(start, part.start), min(stop, part.stop)
            if lo >= hi or step != 1:
                if step != 1:
                    raise ValueError(f"{self.where}: a strided read of a concatenated leaf")
                continue
            sub = (*index[:a], slice(lo - part.start, hi - part.start), *index[a + 1 :])
            out[(*(slice(None),) * a, slice(lo - start, hi - start))] = _through(
                leaf.entry.before, shapes, sub, read
            )
        return out


@dataclass(frozen=True)
class _Tensor:
    """One PyTorch tensor of a Flax leaf: the leaf, the entry, the part's place."""

    path: str
    entry: BoundEntry
    part: int | None
    parts: int
    leaf_shape: Shape
    shape: Shape
    values: Mapping[str, str]


class TableToTorch(_TableSource):
    """A Flax-named source in a table's layout as the PyTorch tensors of the model.

    Args:
      source: the Flax tree (an Orbax item, an ``nnx.State`` in memory); leaves
        that all end in ``value`` (an ``nnx.State`` saved whole) are read
        without it.
      table: the layout table.
      config: the model's ``config.json`` as a dict; default: the source's.
      options: values the table's expressions see over the config.
      prefix: the keys the table's Flax paths are under (``("params", "params")``
        in a MaxText run's item); the leaves outside it are left alone.
      others: what becomes of a leaf under ``prefix`` whose first key is none of
        the table's paths' (``step`` at the top of an item): ``"refuse"`` it, or
        ``"leave"`` it alone.

    ``ties`` holds the table's implicit ties (``lm_head.weight`` of a model that
    computes it from the embedding), as aliases of their canonicals, where no
    leaf gives the alias. :attr:`infos` lists the tensors in the model's own order
    (:meth:`bridge.layouts.table.Bound.order_key`).

    Raises:
      ValueError: one line: a leaf no entry places (naming the nearest entry), a
        leaf the config's model holds that is missing (with the shape it would
        have, where the table gives shapes), a leaf whose shape is not the one
        the config makes (or that stacks another number of layers), a leaf whose
        shape does not invert on the config's sizes.

    >>> table = Table.from_dict({"name": "heads", "entry": [
    ...     {"torch": "q.weight", "flax": "q/w", "ops": [{"permute": [1, 0]},
    ...      {"split": 1, "into": ["heads", -1]}]}]})
    >>> from jaxshare.checkpoint import TreeSource
    >>> tree = TreeSource({"params": {"q": {"w": np.zeros((4, 2, 3), np.float32)}}, "step": 0})
    >>> TableToTorch(tree, table, {"heads": 2}, prefix=("params",)).infos
    {'q.weight': ArrayInfo(shape=(6, 4), dtype='float32')}
    """

    def __init__(
        self,
        source: TensorSource,
        table: Table,
        config: Mapping[str, Any] | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        prefix: Sequence[str] = (),
        others: Literal["refuse", "leave"] = "refuse",
    ) -> None:
        self._wrap(source, table, config, options, prefix)
        bound, top = self.bound, self._top
        roots = {
            _placeholders_free_root(flax)
            for e in table.entries
            for flax in (e.flax, e.unstacked)
            if flax is not None
        }
        own: list[tuple[str, str]] = []
        for stored in source.infos:
            if stored in source.ties or not stored.startswith(top):
                continue
            rel = stored[len(top) :]
            if others == "leave" and None not in roots and rel.split("/", 1)[0] not in roots:
                continue
            own.append((stored, rel))
        self._suffix = "/value" if own and all(r.endswith("/value") for _, r in own) else ""
        matched: dict[int, list[tuple[str, str, dict[str, str]]]] = {}
        unplaced: list[str] = []
        for stored, rel in own:
            path = rel[: len(rel) - len(self._suffix)]
            found = bound.match_flax(path)
            if (line := _no_place(bound, found, path, flax=True, shown=stored)) is not None:
                unplaced.append(line)
                continue
            assert found is not None
            entry, values = found
            matched.setdefault(entry.index, []).append((stored, path, values))
        tensors: dict[str, _Tensor] = {}
        for entry in bound.entries:
            leaves = matched.get(entry.index, [])
            leaves.sort(key=lambda leaf: bound.order_key(entry, leaf[2]))
            self._check_leaves(entry, leaves, [s for s, _ in own])
            for stored, _, values in leaves:
                self._place(entry, stored, values, tensors)
        if unplaced:
            raise ValueError(unplaced[0])
        order = {name: bound.order_key(t.entry, t.values) for name, t in tensors.items()}
        self._tensors = {name: tensors[name] for name in sorted(tensors, key=order.__getitem__)}
        self.infos = {
            name: ArrayInfo(t.shape, source.infos[t.path].dtype)
            for name, t in self._tensors.items()
        }
        ties = {
            t.alias: t.canonical
            for t in bound.ties
            if t.implicit and t.canonical in tensors and t.alias not in tensors
        }
        self.ties = AliasMap(ties)
        self.origins = {alias: f"the {table.name} layout" for alias in ties}
        self._cache: tuple[str, np.ndarray] | None = None

    def _check_leaves(
        self,
        entry: BoundEntry,
        leaves: Sequence[tuple[str, str, dict[str, str]]],
        own: Sequence[str],
    ) -> None:
        """The leaves of ``entry``: each of the shape the config makes (where the table
        says), and every one the config's model holds there."""
        bound, where = self.bound, self.bound.where
        combos = bound.expand(entry, flax=True)
        if combos is None:
            if not leaves and not entry.optional:
                near = difflib.get_close_matches(entry.entry.flax, list(own), n=1, cutoff=0.0)
                found = f"nearest leaf: {near[0]!r}" if near else "the tree is empty"
                raise ValueError(f"{where}: {entry.describe()} matches no leaf ({found}).")
            expected = [path for _, path, _ in leaves]
        else:
            expected = [fill(entry.entry.flax, values) for values in combos]
        have = {path: stored for stored, path, _ in leaves}
        want = entry.leaf_shape
        for path in expected:
            stored = have.get(path)
            if stored is None:
                if entry.optional:
                    continue
                name = self._top + path + self._suffix
                raise ValueError(self._missing("leaf", name, entry, want, _near(name, own)))
            got = tuple(self._source.infos[stored].shape)
            if want is None or got == want:
                continue
            combine = entry.combine
            stacks: list[tuple[Stack, int]] = []
            if isinstance(combine, Stack):
                stacks = [(combine, combine.axis % len(want))]
            elif isinstance(combine, Stacks):
                stacks = list(zip(combine.stacks, combine.axes(len(want)), strict=True))
            for stack, a in stacks:
                if (
                    stack.over not in bound.ranges
                    or entry.after
                    or len(got) != len(want)
                    or got[a] == want[a]
                ):
                    continue
                written = (op.op if isinstance(op, When) else op for op in entry.entry.ops)
                axis = next(
                    op.axis for op in written if isinstance(op, Stack) and op.over == stack.over
                )
                named = f" ({axis})" if isinstance(axis, str) else ""
                size = self.table.ranges[stack.over].size
                raise ValueError(
                    f"{where}: the leaf {stored!r} {got} stacks "
                    f"{bound.counted(stack.over, got[a])} on its axis {a}{named}, but "
                    f"config.json has {size}={want[a]}; pass the config of the model the "
                    "item holds."
                )
            raise ValueError(
                f"{where}: the leaf {stored!r} has shape {got}, but config.json "
                f"({bound.described(entry)}) makes it {want}; pass the config of the model "
                "the item holds."
            )

    def _place(
        self,
        entry: BoundEntry,
        stored: str,
        values: dict[str, str],
        tensors: dict[str, _Tensor],
    ) -> None:
        """The PyTorch tensors the leaf ``stored`` of ``entry`` gives, into ``tensors``."""
        where = self.bound.where
        # (Other spellings of one tensor: the way back writes the first.)
        overs = entry.combine.overs if entry.combine is not None else ()
        spelled = {
            k: v[0] for k, v in entry.entry.parts.items() if k not in values and k not in overs
        }
        values = {**values, **spelled}
        shape = tuple(self._source.infos[stored].shape)
        at = f"{where}: {entry.describe()}, leaf {stored!r}"
        combine = entry.combine
        if combine is None:
            fills: list[dict[str, str]] = [values]
            count = 1
        elif isinstance(combine, Stacks):  # (Every combination, the first fastest.)
            counts = combine.counts(back_chain(entry.after, shape, at)[0])
            labels_of = []
            for over, n in zip(combine.overs, counts, strict=True):
                named = entry.entry.parts.get(over)
                labels_of.append(list(named) if named is not None else [str(k) for k in range(n)])
                if len(labels_of[-1]) != n:
                    raise ValueError(
                        f"{at}: {shape} stacks {n} parts of {{{over}}}, which lists "
                        f"{len(labels_of[-1])}: {labels_of[-1]}"
                    )
            slowest = combine.overs[::-1]
            fills = [
                {**values, **dict(zip(slowest, combo, strict=True))}
                for combo in itertools.product(*labels_of[::-1])
            ]
            count = len(fills)
        else:
            combined = back_chain(entry.after, shape, at)[0]
            named = entry.entry.parts.get(combine.over)
            if isinstance(combine, Stack):
                count = combined[combine.axis % len(combined)]
            else:
                if named is None:
                    raise ValueError(f"{at}: a concat over a number needs `parts`")
                count = len(named)
            labels = list(named) if named is not None else [str(k) for k in range(count)]
            if len(labels) != count:
                raise ValueError(
                    f"{at}: {shape} stacks {count} parts on axis {combine.axis}, but "
                    f"{{{combine.over}}} lists {len(labels)}: {labels}"
                )
            fills = [{**values, combine.over: label} for label in labels]
        torch_shapes = invert_shapes(entry, shape, count, at)
        for k, vals in enumerate(fills):
            name = fill(entry.entry.torch, vals)
            forward = chain(entry.before, torch_shapes[k], at)[-1]
            if combine is None:
                again = chain(entry.after, forward, at)[-1]
                if again != shape and entry.leaf_shape is None:
                    raise ValueError(f"{at}: {shape} does not invert (it comes back {again})")
            if name in tensors:
                raise ValueError(
                    f"{where}: two leaves make the tensor {name!r}: "
                    f"{tensors[name].path!r} and {stored!r}"
                )
            part = None if combine is None else k
            tensors[name] = _Tensor(stored, entry, part, count, shape, torch_shapes[k], vals)
            self.placed_by[name] = (stored, entry.describe())

    def blocks(self, name: str) -> Iterable[np.ndarray]:
        """A tensor that is its leaf with axes moved (and split or merged) in C order,
        as the source's blocks of the leaf moved so, where it hands them out (a
        Flax tree in memory: bands of rows); else the one array."""
        t = self._tensors.get(name)
        one = (
            None
            if t is None or t.part is not None
            else _as_one_transpose(t.entry.ops, t.leaf_shape)
        )
        if t is not None and one is not None:  # (A reshape of C-ordered bytes moves none.)
            perm = one[0]
            moved = (
                self._source.blocks(t.path)
                if perm == tuple(range(len(perm)))
                else self._source.permuted_blocks(t.path, perm)
            )
            if moved is not None:
                yield from moved
                return
        yield self.array(name)

    def array(self, name: str) -> np.ndarray:
        try:
            t = self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.where}: no tensor named {name!r}.") from None
        entry, source = t.entry, self._source
        if t.part is None:
            one = _as_one_transpose(entry.ops, t.leaf_shape)
            if one is not None:  # (In one pass, where the source can: an item's chunks.)
                perm, shape = one
                moved = source.permuted_array(t.path, perm)
                if moved is not None:
                    return moved.reshape(shape)
            box = _box_read(entry.ops, t.shape)
            y = np.asarray(source.array(t.path) if box is None else source.read_slice(t.path, box))
            for op in reversed(entry.ops):
                y = op.backward(y)
            return _contiguous(y)
        combine = entry.combine
        assert combine is not None
        ndim = len(t.leaf_shape)
        if not entry.after:
            index = _part_index(entry, t.leaf_shape, t.parts, t.part)
            if isinstance(combine, Stack | Stacks):  # (A slice of one, read as such, squeezed.)
                index = (*index, *(slice(None),) * (ndim - len(index)))
                picked = tuple(k for k, i in enumerate(index) if isinstance(i, int))
                whole = tuple(slice(i, i + 1) if isinstance(i, int) else i for i in index)
                y = np.squeeze(source.read_slice(t.path, whole), axis=picked)
            else:
                y = np.asarray(
                    source.read_slice(t.path, (*index, *(slice(None),) * (ndim - len(index))))
                )
        else:
            if self._cache is None or self._cache[0] != t.path:
                full = np.asarray(source.array(t.path))
                for op in reversed(entry.after):
                    full = op.backward(full)
                self._cache = (t.path, full)
            full = self._cache[1]
            y = full[_part_index(entry, tuple(full.shape), t.parts, t.part)]
        for op in reversed(entry.before):
            y = op.backward(y)
        return _contiguous(y)


def _placeholders_free_root(pattern: str) -> str | None:
    """The first key of a Flax path pattern, ``None`` where it holds a placeholder."""
    root = pattern.split("/", 1)[0]
    return None if "{" in root else root


def table_view(
    tables: Sequence[Table],
) -> Callable[[TensorSource, Mapping[str, Any] | None], TensorSource]:
    """The view of a layout made of ``tables`` (one per model family): a Flax-named
    source as its PyTorch tensors, a PyTorch-named one as the Flax tree, through
    the table of the config's ``model_type``."""

    def view(source: TensorSource, config: Mapping[str, Any] | None) -> TensorSource:
        config = config if config is not None else source.config
        table = pick_table(tables, config, source.where)
        return (TableToTorch if source.flax_named else TableToFlax)(source, table, config)

    return view
