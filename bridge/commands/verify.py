"""``verify``: two checkpoints of any formats compared bit for bit, or one against its manifest.

:func:`verify` opens both inputs by :func:`bridge.open_source` and brings them
to one naming: where one is Flax-named (an Orbax item, a Flax ``.msgpack``, a
Flax-named ``.safetensors``) and the other PyTorch-named (a Hugging Face,
DeepSpeed or DCP directory, a ``.safetensors`` or PyTorch file), the Flax side
is named in PyTorch through its naming record (or the rules, as
:func:`bridge.torch_plan` does), each recorded permutation applied as its
tensor is read. Then, name by name:

- a name on one side only is ``missing`` (in A, not in B) or ``extra``;
- shapes and dtypes must agree; with ``dtype=`` B must be A cast to it (a
  floating tensor; others keep their dtype), bit for bit the cast of A;
- values are compared as bytes (so NaNs with the same bits are equal): the
  count of differing elements, the first one's index and the largest
  ``|A - B|`` over them;
- ties are compared as ties: the same alias of the same canonical, with the
  same transform, on both sides. A tie one side declares and the other does
  not is a difference, unless the other side stores the alias as a copy
  bit-identical to its canonical (then it counts as the tie, and a ``copy``
  line says so); an alias a side stores beside its tie (written out) must be
  its canonical's bytes.

What to compare is settled from the headers first; then the tensors are read
ahead of the comparisons on two background threads (a
:class:`~jaxshare.stream.ReadAhead`, one read per side of each comparison, so
the two sides are read at once and the next tensors while one pair is
compared), each stored tensor once (the canonical of a tie and the tensors the
ties compare again). The bytes held are bounded: the pair compared plus
:data:`_AHEAD` read ahead (a view of a mapped file costs nothing, a transposed
read its tensor twice while it is made), never the model.

:func:`verify` with one input checks it against the manifest jaxshare wrote
into it (``convert(..., manifest=True)``): every stored tensor's shape, dtype
and SHA-256, computed as it was written; tensors are hashed on a few threads
at once (hashlib lets go of the GIL), each block by block.

Every finding is one :class:`VerifyFinding`; the :class:`VerifyReport` holds
them and renders one line each. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bridge.hf.experts import PerExpertView
from bridge.naming.torch_naming import in_torch_names
from bridge.sources.registry import opened
from jaxshare import AliasMap
from jaxshare.internal import (
    Perm,
    UsageError,
    cast_to,
    compose,
    contiguous_transpose,
    float_dtype,
    inverse,
    numpy_dtype,
    parallel_map,
    same_bytes,
    tensor_digest,
)
from jaxshare.stream import ArrayInfo, ReadAhead, TensorSource

__all__ = ["VerifyFinding", "VerifyReport", "verify"]

#: Elements compared at a time: bounds the temporaries of a cast and a comparison.
_CHUNK = 1 << 22

#: Bytes read ahead of the pair of tensors being compared (beside that pair).
_AHEAD = 1 << 28

#: Finding kinds that are information, not differences.
_INFO_KINDS = frozenset({"copy", "unhashed"})


@dataclass(frozen=True)
class VerifyFinding:
    """One difference (or note) :func:`verify` found.

    Attributes:
      kind: ``"missing"``, ``"extra"``, ``"shape"``, ``"dtype"``, ``"values"``,
        ``"swapped"`` (two experts of a layer whose names were swapped, beside their
        values' findings), ``"tie"``, ``"hash"`` (one-sided: a tensor its manifest
        hashes otherwise)
        -- differences -- or ``"copy"`` (an alias stored as a bit-identical copy
        where the other side ties it) and ``"unhashed"`` -- information.
      name: the tensor, in the compared naming.
      detail: what was found, with its figure.
    """

    kind: str
    name: str
    detail: str

    @property
    def error(self) -> bool:
        """Whether this is a difference (the inputs are then not equal)."""
        return self.kind not in _INFO_KINDS

    @property
    def line(self) -> str:
        """The finding as one line: ``kind  name  detail``."""
        return f"{self.kind}  {self.name}  {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` found: ``jaxshare verify`` renders it.

    Attributes:
      a: the first input (or the one input checked against its manifest).
      b: the second input; ``None`` for a check against the manifest.
      dtype: the declared cast of B, if any.
      naming: how names were matched: ``"stored"`` (both sides of one naming, as
        stored), ``"torch"`` (the Flax-named side named in PyTorch), or
        ``"manifest"`` (one input, against its manifest).
      compared: the names compared (against a manifest: the tensors hashed).
      bytes_read: the tensor bytes read, both sides.
      findings: every finding, in name order of A (then B's extra names).
      limit: how many differences :meth:`lines` shows.
    """

    a: str
    b: str | None
    dtype: str | None
    naming: str
    compared: int
    bytes_read: int
    findings: tuple[VerifyFinding, ...]
    limit: int = 10

    @property
    def ok(self) -> bool:
        """Whether the inputs are equal (no finding is a difference)."""
        return not self.differences

    @property
    def differences(self) -> tuple[VerifyFinding, ...]:
        return tuple(f for f in self.findings if f.error)

    @property
    def notes(self) -> tuple[VerifyFinding, ...]:
        return tuple(f for f in self.findings if not f.error)

    def lines(self) -> list[str]:
        """One line per finding (the first :attr:`limit` differences, every note),
        then the summary line."""
        shown = [f.line for f in self.differences[: self.limit]]
        hidden = len(self.differences) - len(shown)
        if hidden > 0:
            shown.append(f"... and {hidden} more differences (--limit to show them)")
        shown += [f.line for f in self.notes]
        return [*shown, self.summary]

    @property
    def summary(self) -> str:
        """The last line: the verdict, what was compared, how names were matched."""
        n = len(self.differences)
        verdict = "equal" if self.ok else f"{n} difference{'s' if n != 1 else ''}"
        if self.b is None:
            return f"{verdict}: {self.a} against its manifest, {self.compared} tensors hashed"
        how = "in PyTorch names" if self.naming == "torch" else "by their stored names"
        cast = f", B cast to {self.dtype}" if self.dtype else ""
        return f"{verdict}: {self.a} and {self.b}, {self.compared} tensors compared {how}{cast}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (``jaxshare verify --json``): every finding."""
        return {
            "a": self.a,
            "b": self.b,
            "dtype": self.dtype,
            "naming": self.naming,
            "equal": self.ok,
            "compared": self.compared,
            "bytes_read": self.bytes_read,
            "differences": [dataclasses.asdict(f) for f in self.differences],
            "notes": [dataclasses.asdict(f) for f in self.notes],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# --- One naming for both sides ---------------------------------------------------


@dataclass
class _Side:
    """A source in the compared naming: each stored name's tensor (the source's
    name it is read from, and the permutation into the compared axis order), and
    the ties in the compared names."""

    source: TensorSource
    names: dict[str, tuple[str, Perm | None]]
    ties: AliasMap
    read: int = 0

    @classmethod
    def as_stored(cls, source: TensorSource) -> _Side:
        return cls(source, {n: (n, None) for n in source.infos}, source.ties)

    @classmethod
    def in_torch_names(cls, source: TensorSource, other: TensorSource | None) -> _Side:
        """A Flax-named source named in PyTorch, as ``convert`` names it: by its
        naming record; without one, after ``other`` (the PyTorch-named side, whose
        layer types settle what names cannot, a GPT-2 ``Conv1D``), else by the rules
        and ``other``'s config."""
        named = None
        if source.ties.naming is None and other is not None:
            try:
                named = in_torch_names(source, like=other)
            except ValueError:  # Names `other` lacks (a renamed layer): the rules, then.
                named = None
        if named is None:
            named = in_torch_names(source, config=None if other is None else other.config)
        plan, reads = named
        names = {e.name: (e.source, e.perm) for e in plan.entries}
        naming = plan.alias_map.naming
        if reads is source and naming is not None:  # Aliases written out: compared too.
            for alias in source.written_out:
                if alias in naming and not naming[alias].stacked:
                    names.setdefault(naming[alias].torch, (alias, inverse(naming[alias].permute)))
        ties = plan.alias_map
        return cls(reads, names, AliasMap(dict(ties), transforms=dict(ties.transforms)))

    def info(self, name: str) -> ArrayInfo:
        stored, perm = self.names[name]
        return self.source.infos[stored].permuted(perm)

    def blocks(self, name: str, perm: Perm | None = None) -> Iterator[np.ndarray]:
        """The tensor ``name`` transposed by ``perm``, in C order, block by block
        (safe beside other reads of the source, on other threads)."""
        stored, own = self.names[name]
        perm = compose(perm, own)
        if perm is None:
            yield from self.source.blocks(stored)
            return
        blocks = self.source.permuted_blocks(stored, perm)
        if blocks is not None:
            yield from blocks
            return
        yield contiguous_transpose(self.source.array(stored), perm)

    def cost(self, name: str, perm: Perm | None = None) -> int:
        """The most bytes reading :meth:`blocks` holds, until its blocks are dropped:
        none for views of a mapped source's memory; a transposed tensor, once more
        while its source array is copied."""
        stored, own = self.names[name]
        nbytes, mapped = self.source.infos[stored].nbytes, self.source.mapped
        if compose(perm, own) is None:
            return 0 if mapped else nbytes
        return nbytes if mapped else 2 * nbytes

    def root(self, name: str) -> tuple[str, Perm | None]:
        """The stored tensor ``name`` is, and the transform from it."""
        if name in self.ties:
            return self.ties[name], self.ties.transform(name)
        return name, None

    def every_name(self) -> list[str]:
        return [*self.names, *(a for a in self.ties if a not in self.names)]


def _views(a: TensorSource, b: TensorSource) -> tuple[_Side, _Side, str]:
    if a.flax_named and b.flax_named:  # Two Flax layouts, maybe: their PyTorch names decide.
        va, vb = _Side.as_stored(a), _Side.as_stored(b)
        if set(va.every_name()) == set(vb.every_name()):
            return va, vb, "stored"
        try:
            ta, tb = _Side.in_torch_names(a, None), _Side.in_torch_names(b, None)
        except (ValueError, KeyError):
            return va, vb, "stored"
        if len(set(ta.every_name()) & set(tb.every_name())) > len(
            set(va.every_name()) & set(vb.every_name())
        ):
            return ta, tb, "torch"
        return va, vb, "stored"
    if a.flax_named == b.flax_named:
        return _Side.as_stored(a), _Side.as_stored(b), "stored"
    if a.flax_named:
        return _Side.in_torch_names(a, b), _Side.as_stored(b), "torch"
    return _Side.as_stored(a), _Side.in_torch_names(b, a), "torch"


# --- Bytes compared ---------------------------------------------------------------


def _flat(blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    for block in blocks:
        flat = np.ascontiguousarray(block).reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            yield flat[start : start + _CHUNK]


def _pairs(xs: Iterable[np.ndarray], ys: Iterable[np.ndarray]) -> Iterator[tuple[int, Any, Any]]:
    """``(offset, x, y)``: the two element streams cut into pieces of equal length."""
    ix, iy = _flat(xs), _flat(ys)
    x, y = next(ix, None), next(iy, None)
    offset = 0
    while x is not None and y is not None:
        if not x.size:
            x = next(ix, None)
            continue
        if not y.size:
            y = next(iy, None)
            continue
        n = min(x.size, y.size)
        yield offset, x[:n], y[:n]
        offset += n
        x, y = x[n:], y[n:]


def _bits(x: np.ndarray) -> np.ndarray:
    """The elements' bytes as one unsigned integer each (or rows of bytes)."""
    size = x.dtype.itemsize
    if size in (1, 2, 4, 8):
        return x.view(f"u{size}")
    return x.view(np.uint8).reshape(-1, size)


def _as_float(x: np.ndarray) -> np.ndarray:
    return np.abs(x.astype(np.complex128)) if x.dtype.kind == "c" else x.astype(np.float64)


@dataclass
class _Diff:
    """Differing elements of one tensor: how many, where the first is, max |Δ|."""

    count: int = 0
    first: int | None = None
    delta: float = 0.0

    def add(self, offset: int, x: np.ndarray, y: np.ndarray, by_value: bool) -> None:
        if by_value:  # Two dtypes: the values compared, as float64.
            fx, fy = _as_float(x), _as_float(y)
            differ = ~((fx == fy) | (np.isnan(fx) & np.isnan(fy)))
        else:
            if same_bytes(x, y):  # (The common case, at memory speed.)
                return
            differ = _bits(x) != _bits(y)
            if differ.ndim > 1:
                differ = differ.any(axis=1)
        count = int(np.count_nonzero(differ))
        if not count:
            return
        if self.first is None:
            self.first = offset + int(np.argmax(differ))
        self.count += count
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(_as_float(x[differ]) - _as_float(y[differ]))
        if d.size and not np.isnan(d).all():
            self.delta = max(self.delta, float(np.nanmax(d)))
        elif self.delta == 0.0:
            self.delta = float("nan")

    def detail(self, shape: tuple[int, ...], what: str) -> str:
        total = int(np.prod(shape))
        where = list(np.unravel_index(self.first or 0, shape)) if shape else []
        first = f", first at {[int(i) for i in where]}" if shape else ""
        return f"{what}{self.count} of {total} elements differ{first}, max |Δ| {self.delta:.6g}"


def _compare(
    xs: Iterable[np.ndarray], ys: Iterable[np.ndarray], cast: np.dtype | None, by_value: bool
) -> _Diff:
    diff = _Diff()
    for offset, x, y in _pairs(xs, ys):
        if cast is not None and x.dtype != cast:
            x = x.astype(cast)
        diff.add(offset, x, y, by_value)
    return diff


@dataclass(frozen=True)
class _Read:
    """One tensor a comparison reads: ``name`` of ``view``, transposed by ``perm``."""

    view: _Side
    name: str
    perm: Perm | None = None

    def blocks(self) -> tuple[np.ndarray, ...]:
        return tuple(self.view.blocks(self.name, self.perm))


@dataclass(frozen=True)
class _Check:
    """Two tensors to compare, and the findings their difference makes.

    Attributes:
      x, y: the tensors, of one shape.
      cast: the dtype ``x`` is cast to first, if any.
      by_value: compare the values as float64 (two dtypes), not the bytes.
      findings: the findings of the difference found.
    """

    x: _Read
    y: _Read
    cast: np.dtype | None
    by_value: bool
    findings: Callable[[_Diff], list[VerifyFinding]]


#: What a name's comparison is, before any tensor is read: findings already
#: settled (from the headers), and checks whose tensors are to be compared.
_Step = VerifyFinding | _Check


def _resolved(steps: Sequence[_Step]) -> list[VerifyFinding]:
    """Every finding of ``steps``, in order: each check's once its tensors are
    compared. The tensors are read ahead on two threads, a read per side of each
    check in turn, holding at most the costliest pair plus :data:`_AHEAD` bytes;
    an error in a read is raised here, as it was raised."""
    checks = [step for step in steps if isinstance(step, _Check)]
    reads = [read for check in checks for read in (check.x, check.y)]
    jobs = [(read.view.cost(read.name, read.perm), read.blocks) for read in reads]
    pairs = (jobs[i][0] + jobs[i + 1][0] for i in range(0, len(jobs), 2))
    budget = max(pairs, default=0) + _AHEAD  # A pair always fits beside nothing else.
    findings: list[VerifyFinding] = []
    with ReadAhead(jobs, budget, workers=2) as ahead:
        held = ahead.held()
        for step in steps:
            if isinstance(step, VerifyFinding):
                findings.append(step)
                continue
            (i, xs), (j, ys) = next(held), next(held)
            for read in (step.x, step.y):
                read.view.read += read.view.info(read.name).nbytes
            diff = _compare(xs, ys, step.cast, step.by_value)
            del xs, ys
            ahead.release(i)
            ahead.release(j)
            findings += step.findings(diff)
    return findings


# --- verify ----------------------------------------------------------------------


def verify(
    a: str | os.PathLike | TensorSource,
    b: str | os.PathLike | TensorSource | None = None,
    /,
    *,
    dtype: Any = None,
    limit: int = 10,
) -> VerifyReport:
    """Compares ``a`` and ``b`` tensor by tensor, bit for bit, through the naming
    records: what ``jaxshare verify A B`` prints (``--json``:
    :meth:`VerifyReport.to_json`). With ``b`` left out, checks ``a`` against the
    manifest jaxshare wrote into it (``convert(..., manifest=True)``).

    Args:
      a: any input :func:`bridge.open_source` takes: an Orbax item, a Hugging
        Face, DeepSpeed or DCP directory, an index, a ``.safetensors``, PyTorch
        or ``.msgpack`` file, or a :class:`~jaxshare.stream.TensorSource`.
      b: the other input, of any format; ``None``: ``a``'s manifest.
      dtype: a cast declared from A to B (``"bfloat16"``): each floating tensor of
        B must be exactly A's cast to it.
      limit: how many differences the report's lines show (all are kept).

    Returns:
      A :class:`VerifyReport`; ``report.ok`` when the inputs are equal.

    Raises:
      UsageError: an input of no kind jaxshare reads; ``dtype`` with one input.
      FileNotFoundError, ValueError: a missing or unreadable input, or (one
        input) one without a manifest; one line naming it.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> save_file({"fc.weight": w}, d + "/a.safetensors")
    >>> w[1, 2] = -1
    >>> save_file({"fc.weight": w}, d + "/b.safetensors")
    >>> verify(d + "/a.safetensors", d + "/a.safetensors").ok
    True
    >>> verify(d + "/a.safetensors", d + "/b.safetensors").differences[0].line
    'values  fc.weight  1 of 6 elements differ, first at [1, 2], max |Δ| 6'
    """
    if type(limit) is not int or limit < 0:
        raise UsageError(f"`limit` must be an int >= 0, got {limit!r}.")
    try:
        cast = float_dtype(dtype)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if b is None:
        if cast is not None:
            raise UsageError(
                "--dtype declares the cast from A to B; a check against the manifest has one input."
            )
        return _against_manifest(a, limit)
    with opened(a, arg="a") as source_a, opened(b, arg="b") as source_b:
        view_a, view_b, naming = _views(source_a, source_b)
        steps, compared = _differences(view_a, view_b, cast)
        findings = _resolved(steps)
        findings += _swapped_experts(view_a, view_b, findings)
        return VerifyReport(
            source_a.where,
            source_b.where,
            None if cast is None else cast.name,
            naming,
            compared,
            view_a.read + view_b.read,
            tuple(findings),
            limit,
        )


_EXPERT_NAME = re.compile(r"(?P<head>.*\.experts\.)(?P<e>0|[1-9][0-9]*)(?P<tail>\..+)")


def _swapped_experts(a: _Side, b: _Side, findings: Sequence[VerifyFinding]) -> list[VerifyFinding]:
    """Experts of one layer whose values differ where each holds, tensor for tensor,
    what the other's names hold on the other side: their names were swapped (one line
    a pair, beside their values' findings). Each differing tensor is hashed once a
    side, and experts are paired by their hashes."""
    differ: dict[str, dict[int, set[str]]] = {}  # experts module: {expert: tensors}
    for f in findings:
        m = _EXPERT_NAME.fullmatch(f.name) if f.kind == "values" else None
        if m is not None:
            differ.setdefault(m["head"], {}).setdefault(int(m["e"]), set()).add(m["tail"])
    out = []
    for head, experts in differ.items():

        def digests(side: _Side, e: int, tails: list[str], head: str = head) -> tuple[str, ...]:
            return tuple(tensor_digest(side.blocks(f"{head}{e}{t}")) for t in tails)

        by_tails: dict[tuple[str, ...], list[int]] = {}
        for e, tails in experts.items():
            by_tails.setdefault(tuple(sorted(tails)), []).append(e)
        for tails, group in by_tails.items():
            if len(group) < 2:
                continue
            in_a = {e: digests(a, e, list(tails)) for e in group}
            in_b = {digests(b, e, list(tails)): e for e in group}
            seen: set[int] = set()
            for x in sorted(group):
                y = in_b.get(in_a[x])  # (B's expert holding A's expert x.)
                if y is None or y <= x or {x, y} & seen or in_b.get(in_a[y]) != x:
                    continue
                seen |= {x, y}
                out.append(VerifyFinding(
                    "swapped", f"{head}{x}", f"B's expert {y} is A's expert {x} and "
                    f"the other way round ({len(tails)} tensors each): their names "
                    "were swapped",
                ))  # fmt: skip
    return out


def _differences(a: _Side, b: _Side, cast: np.dtype | None) -> tuple[list[_Step], int]:
    """What comparing ``a`` and ``b`` is, name by name, and how many names both have."""
    findings: list[_Step] = []
    names_a, names_b = a.every_name(), b.every_name()
    in_a, in_b = set(names_a), set(names_b)
    compared = 0
    for name in names_a:
        if name not in in_b:
            where = "tied" if name in a.ties else "stored"
            findings.append(VerifyFinding("missing", name, f"{where} in A, not in B"))
            continue
        compared += 1
        findings += _one(a, b, name, cast)
    for name in names_b:
        if name not in in_a:
            where = "tied" if name in b.ties else "stored"
            findings.append(VerifyFinding("extra", name, f"{where} in B, not in A"))
    return findings, compared


def _tie_text(view: _Side, name: str) -> str:
    canonical, perm = view.root(name)
    return f"{canonical!r}" + (f" (permute {list(perm)})" if perm is not None else "")


def _one(a: _Side, b: _Side, name: str, cast: np.dtype | None) -> list[_Step]:
    """The findings of one name both sides have (its checks, to resolve)."""
    tied_a, tied_b = name in a.ties, name in b.ties
    out: list[_Step] = []
    if tied_a and tied_b:
        canonical, perm = a.root(name)
        if _related(b, name, canonical) != perm:  # (Through any canonical of the group.)
            out.append(
                VerifyFinding(
                    "tie", name, f"A ties it to {_tie_text(a, name)}, B to {_tie_text(b, name)}"
                )
            )
        for side, view in (("A", a), ("B", b)):  # An alias written out is its canonical.
            if name in view.names:
                out += _copy(view, name, side, written_out=True)
        return out
    if tied_a or tied_b:
        tier, other = (a, b) if tied_a else (b, a)
        tier_side, other_side = ("A", "B") if tied_a else ("B", "A")
        canonical, perm = tier.root(name)
        # The other side may tie the pair the other way round, or through a third name.
        if canonical in other.every_name() and _related(other, name, canonical) == perm:
            return out
        if canonical not in other.every_name():
            return [
                VerifyFinding(
                    "tie",
                    name,
                    f"{tier_side} ties it to {_tie_text(tier, name)}, which {other_side} lacks",
                )
            ]
        return _copy(other, name, other_side, tier=(tier_side, tier, canonical, perm))
    return _values(a, b, name, cast)


def _related(view: _Side, x: str, y: str) -> Perm | None | bool:
    """The transform from ``y`` to ``x`` through ``view``'s ties (``False``: none)."""
    (rx, tx), (ry, ty) = view.root(x), view.root(y)
    if rx != ry:
        return False
    return compose(tx, inverse(ty))


def _copy(
    view: _Side,
    name: str,
    side: str,
    *,
    written_out: bool = False,
    tier: tuple[str, _Side, str, Perm | None] | None = None,
) -> list[_Step]:
    """Whether the stored ``name`` of ``view`` is bit for bit its canonical: by
    ``view``'s own tie (an alias it writes out beside the tie), or by the tie ``tier``
    declares on the other side (a copy, which then counts as the tie)."""
    if tier is None:
        canonical, perm = view.root(name)
    else:
        _, _, canonical, perm = tier
        # The canonical as this side stores it (it may be an alias here).
        canonical, inner = view.root(canonical)
        perm = compose(perm, inner)
    have, want = view.info(name), view.names.get(canonical)
    if want is None:  # (Cannot happen: a canonical is stored.)
        return [VerifyFinding("tie", name, f"{side} stores no {canonical!r}")]
    expected = view.info(canonical).permuted(perm)
    if tier is not None:
        tier_side, tier_view, _, _ = tier
        declared = f"{tier_side} ties it to {_tie_text(tier_view, name)}"
    else:
        declared = f"{side} ties it to {_tie_text(view, name)}"
    if (have.shape, have.dtype) != (expected.shape, expected.dtype):
        return [
            VerifyFinding(
                "tie",
                name,
                f"{declared}, but {side} stores it apart as {have.dtype}{list(have.shape)}, "
                f"not {expected.dtype}{list(expected.shape)}",
            )
        ]

    def findings(diff: _Diff) -> list[VerifyFinding]:
        if diff.count:
            how = "writes it out" if written_out else "stores it apart"
            return [
                VerifyFinding(
                    "tie",
                    name,
                    f"{declared}, but {side} {how} with other values: "
                    + diff.detail(have.shape, ""),
                )
            ]
        if written_out:
            return []
        return [
            VerifyFinding(
                "copy",
                name,
                f"{declared}; {side} stores it as a copy, bit-identical: it counts as the tie",
            )
        ]

    return [_Check(_Read(view, name), _Read(view, canonical, perm), None, False, findings)]


def _values(a: _Side, b: _Side, name: str, cast: np.dtype | None) -> list[_Step]:
    """The findings of a name both sides store (or resolve through one tie each)."""
    ia, ib = a.info(name), b.info(name)
    if ia.shape != ib.shape:
        return [VerifyFinding("shape", name, f"{list(ia.shape)} in A, {list(ib.shape)} in B")]
    dtype_a = numpy_dtype(ia.dtype)
    want = cast_to(dtype_a, cast) if cast is not None else dtype_a
    if want.name != ib.dtype:
        cast_text = f" ({ia.dtype} cast to {cast.name})" if cast is not None else ""

        def dtype_finding(diff: _Diff) -> list[VerifyFinding]:
            values = "values equal" if not diff.count else diff.detail(ia.shape, "")
            return [
                VerifyFinding(
                    "dtype",
                    name,
                    f"expected {want.name}{cast_text}, B stores {ib.dtype}; {values}",
                )
            ]

        return [_Check(_Read(a, name), _Read(b, name), None, True, dtype_finding)]
    what = f"B is not A cast to {want.name}: " if want != dtype_a else ""

    def values_finding(diff: _Diff) -> list[VerifyFinding]:
        if not diff.count:
            return []
        return [VerifyFinding("values", name, diff.detail(ia.shape, what))]

    to = want if want != dtype_a else None
    return [_Check(_Read(a, name), _Read(b, name), to, False, values_finding)]


# --- One side, its manifest ------------------------------------------------------


def _against_manifest(a: str | os.PathLike | TensorSource, limit: int) -> VerifyReport:
    with opened(a, arg="a") as opened_a:
        # (A mixture of experts saved fused: its manifest lists the fused tensors.)
        source = opened_a.stored if isinstance(opened_a, PerExpertView) else opened_a
        manifest = source.manifest()
        if manifest is None:
            raise ValueError(
                f"{source.where}: expected a manifest (written by `jaxshare convert --manifest`); "
                "found none. Pass a second input to compare it with."
            )
        hashed = [
            name
            for name, entry in manifest.items()
            if (info := source.infos.get(name)) is not None
            and (tuple(info.shape), info.dtype) == (entry.shape, entry.dtype)
            and entry.sha256 is not None
        ]
        # A few tensors at once, each block by block (an error raised at its tensor).
        digests = parallel_map(lambda n: tensor_digest(source.blocks(n)), hashed)
        digest = dict(zip(hashed, digests, strict=True))
        findings: list[VerifyFinding] = []
        read = compared = 0
        for name, entry in manifest.items():
            info = source.infos.get(name)
            if info is None:
                findings.append(VerifyFinding("missing", name, "in the manifest, not stored"))
                continue
            if (tuple(info.shape), info.dtype) != (entry.shape, entry.dtype):
                findings.append(
                    VerifyFinding(
                        "shape" if tuple(info.shape) != entry.shape else "dtype",
                        name,
                        f"the manifest has {entry.dtype}{list(entry.shape)}, the file "
                        f"{info.dtype}{list(info.shape)}",
                    )
                )
                continue
            if entry.sha256 is None:
                findings.append(VerifyFinding("unhashed", name, "the manifest holds no hash"))
                continue
            got = digest[name]
            read += info.nbytes
            compared += 1
            if got != entry.sha256:
                findings.append(
                    VerifyFinding(
                        "hash", name, f"sha256 {got[:16]}..., the manifest {entry.sha256[:16]}..."
                    )
                )
        for name in source.infos:
            if name not in manifest:
                findings.append(VerifyFinding("extra", name, "stored, not in the manifest"))
        return VerifyReport(
            source.where, None, None, "manifest", compared, read, tuple(findings), limit
        )
