"""``check``: a checkpoint's declared ties held against what it stores.

Every kind of input declares ties somewhere, and each declaration can disagree
with the tensors stored:

- ``config.json`` and the model class (a Hugging Face directory's own config,
  or ``config=``): the ties transformers makes on load (:mod:`bridge.hf.config`,
  exactly through the model class on the meta device where transformers is
  installed), and the tensors the model class expects;
- jaxshare's alias map (an Orbax item, a ``.safetensors`` file's
  ``"jaxshare.alias_map"`` metadata);
- ``safetensors.torch.save_model``'s metadata: each name it dropped as a
  duplicate, ``{dropped: kept}``;
- DeepSpeed's ``shared_params`` (a ZeRO folder, or its model-states file);
- tensors stored over one storage in a ``.pt``/``.bin`` file.

:func:`check` opens the input by :func:`bridge.open_source`, gathers every
declaration, and reads only what the declarations and one cheap search need:

- each tie's tensors once: the canonical (is it there, is it all zeros) and
  every alias stored beside it (bit for bit the canonical's, transposed by the
  tie's permutation, or how far from it);
- for tensors equal by content but declared apart, only the tensors that share
  their shape and dtype with another: a strided sample of each (at most 8
  elements per axis, a few pages of a mapped file) is hashed first, and only
  tensors whose samples collide are read whole and compared. Tensors of one
  value throughout (a norm's ones, a bias of zeros) are equal without being one
  tensor, and are never reported.

Each finding is one :class:`Finding`; the :class:`CheckReport` holds them and
renders one line each. Nothing here imports torch: transformers (and torch) are
imported only to build a config's model class on the meta device, as for every
Hugging Face directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bridge.hf.config import (
    ConfigTies,
    config_dict,
    config_ties,
)
from bridge.hf.experts import EXPERT, Fused, experts_family
from bridge.hf.usual_names import INPUT_EMBEDDINGS, WORD_EMBEDDING_HEADS
from bridge.layouts.rules import as_rules
from bridge.sources.registry import open_source, reader_of
from jaxshare.formats import (
    CONFIG_FILE,
)
from jaxshare.internal import ALIAS_MAP, STORAGE, Perm, UnheldTies, format_bytes, same_bytes, words
from jaxshare.stream import ArrayInfo, TensorSource

__all__ = ["KINDS", "CheckReport", "Finding", "check"]

#: Every kind of finding, with its severity: ``"error"`` (exit status 1) or
#: ``"info"`` (reported, still clean).
KINDS: Mapping[str, str] = {
    "alias-differs": "error",
    "canonical-missing": "error",
    "head-missing": "error",
    "tensor-missing": "error",
    "head-overwritten": "error",
    "tie-conflict": "error",
    "all-zero": "error",
    "expert-missing": "error",
    "experts-differ": "error",
    "expert-twice": "error",
    "equal-untied": "info",
    "stored-twice": "info",
}

#: Metadata keys that are not ``save_model``'s ``{dropped: kept}`` entries.
_SAMPLE = 8  # elements per axis of the strided sample hashed first
_BLOCK = 1 << 20  # bytes compared at a time


@dataclass(frozen=True)
class Finding:
    """One disagreement (or note) between declared ties and stored tensors.

    Attributes:
      kind: one of :data:`KINDS` (``"alias-differs"``, ``"equal-untied"``, ...).
      severity: ``"error"`` or ``"info"``.
      names: the tensors concerned, alias first where there is one.
      figure: how much: ``"max |Δ| = 0.03"``, the bytes a dedupe would save, a
        shape.
      line: what it means, one sentence naming where the tie comes from.

    >>> f = Finding("stored-twice", "info", ("lm_head.weight", "wte.weight"), "64 B",
    ...             "stored twice, bit for bit")
    >>> f.render()
    'stored-twice  lm_head.weight, wte.weight  64 B  (stored twice, bit for bit)'
    """

    kind: str
    severity: str
    names: tuple[str, ...]
    figure: str
    line: str

    def render(self) -> str:
        """The finding as one line: kind, names, figure, then what it means."""
        return f"{self.kind}  {', '.join(self.names)}  {self.figure}  ({self.line})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "names": list(self.names),
            "figure": self.figure,
            "line": self.line,
        }


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check` found: the findings, the ties it held against the
    stored tensors and what it read to do so.

    Attributes:
      source: the path checked.
      kind: what it is (``"hf"``, ``"safetensors"``, ``"torch"``, ``"orbax"``, ...).
      findings: one per disagreement, errors first.
      ties: ``{alias: (canonical, origin)}`` of every tie declared, in the names
        checked (PyTorch names where a config names a Flax tree).
      tensors_read: how many tensors were read whole.
      bytes_read: their bytes (samples not counted).
      notes: what was left unchecked, one line each.

    >>> report = CheckReport("m.safetensors", "safetensors", (), {}, 0, 0)
    >>> report.ok, report.lines()
    (True, ['m.safetensors: clean: 0 ties checked, 0 tensors read (0 B)'])
    """

    source: str
    kind: str
    findings: tuple[Finding, ...]
    ties: Mapping[str, tuple[str, str]]
    tensors_read: int
    bytes_read: int
    notes: tuple[str, ...] = ()
    errors: tuple[Finding, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "errors", tuple(f for f in self.findings if f.severity == "error"))

    @property
    def ok(self) -> bool:
        """No errors (information findings allowed)."""
        return not self.errors

    @property
    def kinds(self) -> list[str]:
        """The kinds found, sorted, each once."""
        return sorted({f.kind for f in self.findings})

    def summary(self) -> str:
        read = f"{self.tensors_read} tensors read ({format_bytes(self.bytes_read)})"
        infos = len(self.findings) - len(self.errors)
        state = "clean" if self.ok else f"{len(self.errors)} error(s)"
        notes = f", {infos} note(s)" if infos else ""
        return f"{self.source}: {state}{notes}: {len(self.ties)} ties checked, {read}"

    def lines(self) -> list[str]:
        """One line per finding, then the notes, then the summary."""
        return [
            *(f.render() for f in self.findings),
            *(f"note: {n}" for n in self.notes),
            self.summary(),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "ties": [{"alias": a, "canonical": c, "origin": o} for a, (c, o) in self.ties.items()],
            "tensors_read": self.tensors_read,
            "bytes_read": self.bytes_read,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class _Tie:
    alias: str
    canonical: str
    origin: str
    perm: Perm | None = None


#: A checked name's tensor: ``(source name, permutation, info)``.
_Entry = tuple[str, Perm | None, ArrayInfo]


@dataclass
class _Checked:
    """The tensors checked, by name: ``{name: (source name, perm, info)}`` -- the
    source's own names, or the PyTorch names a config gives a Flax tree."""

    source: TensorSource
    names: dict[str, _Entry]
    tensors_read: int = 0
    bytes_read: int = 0

    def label(self, name: str) -> str:
        """``name``, and the source's own name for it where that differs."""
        src = self.names[name][0] if name in self.names else name
        return name if src == name else f"{name} (stored as {src})"

    def array(self, name: str) -> np.ndarray:
        src, perm, info = self.names[name]
        self.tensors_read += 1
        self.bytes_read += info.nbytes
        a = np.asarray(self.source.array(src))
        return a if perm is None else np.transpose(a, perm)


def check(path: str | os.PathLike | TensorSource, /, *, config: Any = None) -> CheckReport:
    """Holds the ties ``path`` declares against what it stores: what
    ``jaxshare check PATH`` prints (``--json``: :meth:`CheckReport.to_json`).

    Args:
      path: any input :func:`bridge.open_source` takes: an Orbax item, a Hugging
        Face, DeepSpeed or DCP directory, a ``.safetensors``, ``.pt``/``.bin`` or
        Flax ``.msgpack`` file.
      config: a ``config.json`` (a path, a dict or a ``PretrainedConfig``) whose
        ties and tensors the input should hold; default: a Hugging Face
        directory's own (an Orbax item's kept copy).

    Returns:
      The :class:`CheckReport`; ``report.ok`` unless a finding is an error.

    Raises:
      UsageError: ``path`` is of no kind jaxshare reads.
      FileNotFoundError, ValueError: a missing or unreadable input (one line).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> emb = np.arange(8, dtype=np.float32).reshape(4, 2)
    >>> save_file({"wte.weight": emb, "lm_head.weight": emb + 1}, path,
    ...           metadata={"lm_head.weight": "wte.weight"})  # save_model's record
    >>> report = check(path)
    >>> report.ok, [f.kind for f in report.findings], report.findings[0].figure
    (False, ['alias-differs'], 'max |Δ| = 1')
    """
    try:
        with warnings.catch_warnings():  # (Ties that cannot be named are findings here.)
            warnings.simplefilter("ignore")
            source = _as_stored(path)
    except UnheldTies as e:
        return _unheld(e)
    try:
        return _check(source, config)
    finally:
        if source is not path:
            source.close()


def _check(source: TensorSource, config: Any) -> CheckReport:
    cfg = config_dict(config) if config is not None else source.config
    notes: list[str] = []
    view, flax_ties = _view(source, cfg, notes)
    ties: list[_Tie] = list(flax_ties or ())
    if flax_ties is None:  # (The source's own names: every tie it records, as recorded.)
        ties += [
            _Tie(t.alias, t.canonical, t.origin, t.transform)
            for t in source.recorded_ties
            if t.origin != CONFIG_FILE
        ]
    found: ConfigTies | None = None
    findings: list[Finding] = []
    torch_named = not any("/" in n for n in view.names)  # (A config names PyTorch tensors.)
    if cfg is not None and torch_named:
        found = config_ties(cfg, list(view.names), as_rules(None))
        ties += _config_declared(found, view)
    ties = _unique(ties)
    findings += _hold(view, ties, cfg)
    if cfg is not None and found is not None:
        findings += _missing(cfg, found, view, ties)
    findings += _equal_untied(view, ties)
    findings += _experts(view, cfg)
    findings.sort(key=lambda f: (KINDS[f.kind] != "error", list(KINDS).index(f.kind), f.names))
    return CheckReport(
        source.where,
        source.kind,
        tuple(findings),
        {t.alias: (t.canonical, t.origin) for t in ties},
        view.tensors_read,
        view.bytes_read,
        tuple(notes),
    )


def _as_stored(path: str | os.PathLike | TensorSource) -> TensorSource:
    """The input with its tensors named as stored (a mixture of experts' fused
    tensors as they are: :func:`_experts` holds the two namings against each other)."""
    if not isinstance(path, (str, os.PathLike)):
        return open_source(path, arg="path")
    reader = reader_of(path)
    return reader.open(Path(path), rules=as_rules(None), as_stored=True)


def _experts(view: _Checked, cfg: Mapping[str, Any] | None) -> list[Finding]:
    """Every expert of every layer accounted for, where ``cfg``'s model is a mixture
    of experts (:mod:`bridge.hf.experts`): each expert's tensors there (as many
    experts as the config says, else as the layer's highest), and a layer stored
    both fused and per expert compared, slice by slice."""
    family = experts_family(cfg)
    if family is None:
        return []
    expected = family.experts(cfg)
    per: dict[str, dict[tuple[int, int], str]] = {}
    kinds: dict[str, Fused] = {}
    for name in view.names:
        found = family.expert_of(name)
        if found is not None:
            fused, part, prefix, e = found
            key = family.fused_name(prefix) + fused.fused
            per.setdefault(key, {})[(e, part)] = name
            kinds[key] = fused
        elif (held := family.fused_of(name)) is not None:
            kinds[name] = held[0]
    findings = []
    lacking: dict[str, tuple[list[str], int, int]] = {}  # experts module: missing, of, count
    for key, fused in kinds.items():
        members = per.get(key, {})
        stored = key in view.names
        held = view.names[key][2].shape[0] if stored else 1 + max(e for e, _ in members)
        count = expected or held
        if stored and held != count:
            findings.append(Finding(
                "expert-missing", "error", (key,), f"{held} of {count} experts",
                f"the fused tensor holds {held} experts, config.json says {count}",
            ))  # fmt: skip
        if members and not stored:
            prefix = key[: len(key) - len(fused.fused)]
            module = family.per_expert_name(prefix) + fused.experts[0].split(EXPERT)[0]
            missing, total, _ = lacking.get(module.rstrip("."), ([], 0, count))
            missing += [
                fused.experts[k].replace(EXPERT, str(e))
                for e in range(count)
                for k in range(len(fused.experts))
                if (e, k) not in members
            ]
            lacking[module.rstrip(".")] = (missing, total + count * len(fused.experts), count)
        if stored and members:
            findings.append(_both_namings(view, key, fused, members))
    for module, (missing, total, count) in lacking.items():
        if missing:
            findings.append(Finding(
                "expert-missing", "error", (module,), f"{len(missing)} of {total} tensors",
                f"its experts lack {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''} "
                f"({count} experts a layer)",
            ))  # fmt: skip
    return findings


def _both_namings(
    view: _Checked, key: str, fused: Fused, members: Mapping[tuple[int, int], str]
) -> Finding:
    """A layer stored fused and per expert: the two held against each other."""
    whole = view.array(key)
    worst: tuple[str, str] | None = None
    for (e, k), name in sorted(members.items()):
        mine = view.array(name)
        theirs = whole[fused.index(e, k, whole.shape)]
        if not same_bytes(mine, theirs):
            worst = (name, _delta(mine, theirs))
            break
    names = (key, *sorted(members.values())[:2])
    if worst is not None:
        return Finding(
            "experts-differ", "error", (key, worst[0]), worst[1],
            "the layer's experts are stored fused and per expert, and the two differ",
        )  # fmt: skip
    return Finding(
        "expert-twice", "error", names, f"{len(members)} tensors",
        "the layer's experts are stored fused and per expert, bit for bit alike; keep one",
    )  # fmt: skip


def _view(
    source: TensorSource, cfg: Mapping[str, Any] | None, notes: list[str]
) -> tuple[_Checked, list[_Tie] | None]:
    """The names checked, and a Flax tree's ties in them: a Flax-named source with
    a config is checked in the PyTorch names the config's model gives it (``None``:
    the source's own names)."""
    own: dict[str, _Entry] = {n: (n, None, info) for n, info in source.infos.items()}
    if cfg is None or not source.flax_named:
        return _Checked(source, own), None
    from bridge.naming.torch_naming import in_torch_names

    try:
        plan, reads = in_torch_names(source, config=cfg)
    except (ValueError, KeyError, TypeError) as e:
        notes.append(f"the config's ties are not checked: its PyTorch names do not fit ({e})")
        return _Checked(source, own), None
    names: dict[str, _Entry] = {e.name: (e.source, e.perm, e.info) for e in plan.entries}
    amap = plan.alias_map
    ties = [
        _Tie(a, c, source.origins.get(a, ALIAS_MAP), amap.transform(a)) for a, c in amap.items()
    ]
    return _Checked(reads, names), ties


def _config_declared(found: ConfigTies, view: _Checked) -> list[_Tie]:
    """The config's ties in the names checked (a file name transformers 5 loads
    under another name is checked under its own)."""
    declared = dict(found.ties)
    for alias, canonical in found.encoder_decoder.items():
        declared.setdefault(alias, canonical)
    stored = {found.load_name(n): n for n in view.names}
    return [_Tie(stored.get(a, a), stored.get(c, c), CONFIG_FILE) for a, c in declared.items()]


def _unique(ties: Iterable[_Tie]) -> list[_Tie]:
    """One tie per alias: the first declaration of each pair (config.json last, as
    gathered); a second, different canonical for one alias is kept too."""
    seen: set[tuple[str, str]] = set()
    out = []
    for t in ties:
        key = (t.alias, t.canonical)
        if key not in seen and (t.canonical, t.alias) not in seen:
            seen.add(key)
            out.append(t)
    return out


def _untied_by_config(cfg: Mapping[str, Any] | None) -> bool:
    if cfg is None:
        return False
    for part in (cfg, cfg.get("text_config") or {}):
        if isinstance(part, Mapping) and "tie_word_embeddings" in part:
            return part["tie_word_embeddings"] is False
    return False


def _is_word_pair(a: str, b: str) -> bool:
    heads = {h for _, table in WORD_EMBEDDING_HEADS for h in table}
    emb = [re.compile(p) for p in INPUT_EMBEDDINGS]

    def is_emb(n: str) -> bool:
        return any(p.fullmatch(n) for p in emb)

    return (a in heads and is_emb(b)) or (b in heads and is_emb(a))


def _delta(x: np.ndarray, y: np.ndarray) -> str:
    if x.shape != y.shape:
        return f"shapes {x.shape} and {y.shape}"
    if x.dtype != y.dtype:
        return f"dtypes {x.dtype} and {y.dtype}"
    if x.size == 0:
        return "max |Δ| = 0"
    flat_x, flat_y = np.ravel(x), np.ravel(y)
    step = max(1, _BLOCK // 8)
    largest, seen = 0.0, False
    for i in range(0, flat_x.size, step):  # (Blocks: no float64 copy of the tensor.)
        try:
            a, b = (v[i : i + step].astype(np.float64) for v in (flat_x, flat_y))
            d = np.abs(a - b)
        except (TypeError, ValueError):
            return "bits differ"
        d = d[~np.isnan(d)]
        if d.size:
            largest, seen = max(largest, float(d.max())), True
    return f"max |Δ| = {largest:.3g}" if seen else "NaNs differ"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _blocks(*arrays: np.ndarray) -> Iterable[tuple[np.ndarray, ...]]:
    """The same ranges of equally long word arrays, :data:`_BLOCK` bytes at a time: one
    pass over mapped pages, no temporary the size of the tensor."""
    step = max(1, _BLOCK // arrays[0].itemsize)
    for i in range(0, arrays[0].size, step):
        yield tuple(a[i : i + step] for a in arrays)


def _nonzero(a: np.ndarray) -> bool:
    """Whether any bit of ``a`` is set; stops at the first block that has one."""
    return any(block.any() for (block,) in _blocks(words(a)))


def _hold(view: _Checked, ties: list[_Tie], cfg: Mapping[str, Any] | None) -> list[Finding]:
    """Every declared tie against the stored tensors, each tensor read once."""
    findings: list[Finding] = []
    untied = _untied_by_config(cfg)
    by_canonical: dict[str, list[_Tie]] = {}
    for t in ties:
        by_canonical.setdefault(t.canonical, []).append(t)
    aliases = {t.alias for t in ties}
    for canonical, group in by_canonical.items():
        if canonical not in view.names:
            if canonical in aliases:
                continue  # (A chain: its root is checked as its own canonical.)
            for t in group:
                where = f"only {t.alias} is stored" if t.alias in view.names else "neither is"
                findings.append(
                    Finding(
                        "canonical-missing",
                        "error",
                        (t.alias, canonical),
                        "not stored",
                        f"{t.origin} ties {t.alias} to {canonical}, which the input does not "
                        f"store; {where}",
                    )
                )
            continue
        stored = [t for t in group if t.alias in view.names and not _shares_memory(t, view)]
        value = view.array(canonical)
        if value.ndim >= 2 and value.size and not _nonzero(value):  # (A bias may be 0.)
            findings.append(
                Finding(
                    "all-zero",
                    "error",
                    (canonical,),
                    f"{value.size} elements, all 0",
                    f"{canonical}, tied to {', '.join(t.alias for t in group)}, holds only "
                    "zeros: an embedding never trained or never loaded",
                )
            )
        for t in stored:
            if untied and t.origin == CONFIG_FILE and _is_word_pair(t.alias, canonical):
                kind_if_differs = "head-overwritten"
            else:
                kind_if_differs = "alias-differs"
            want = value if t.perm is None else np.transpose(value, t.perm)
            got = view.array(t.alias)
            if same_bytes(got, want):
                findings.append(
                    Finding(
                        "stored-twice",
                        "info",
                        (t.alias, canonical),
                        format_bytes(view.names[t.alias][2].nbytes),
                        f"{t.origin} ties them and the input stores both, bit for bit: a "
                        "dedupe saves these bytes",
                    )
                )
                continue
            if kind_if_differs == "head-overwritten":
                line = (
                    f"{CONFIG_FILE} sets tie_word_embeddings: false, but the model class ties "
                    f"{t.alias} to {canonical}: a loader that applies the tie overwrites the "
                    "distinct stored head"
                )
            else:
                line = (
                    f"{t.origin} ties {view.label(t.alias)} to {view.label(canonical)}, but it "
                    "is stored with other values: the tie and the files disagree"
                )
            findings.append(
                Finding(kind_if_differs, "error", (t.alias, canonical), _delta(got, want), line)
            )
    if untied:
        for t in ties:
            if t.origin != CONFIG_FILE and _is_word_pair(t.alias, t.canonical):
                findings.append(
                    Finding(
                        "tie-conflict",
                        "error",
                        (t.alias, t.canonical),
                        "one tensor" if _shares_memory(t, view) else "tied",
                        f"the {t.origin} ties them, but {CONFIG_FILE} sets "
                        "tie_word_embeddings: false: loading unties them",
                    )
                )
    return findings


def _shares_memory(t: _Tie, view: _Checked) -> bool:
    """A tie whose names the source holds as one memory (a ``.bin`` file's one
    storage): their values cannot differ."""
    if t.origin == STORAGE:
        return True
    source = view.source
    alias, canonical = view.names.get(t.alias), view.names.get(t.canonical)
    if alias is None or canonical is None:
        return False
    if alias[:2] == canonical[:2]:  # (One source tensor, one axis order.)
        return True
    a, c = alias[0], canonical[0]
    if alias[1] != canonical[1] or {a, c} & source.written_out:
        return False
    return source.ties.get(a, a) == source.ties.get(c, c)


def _head(found: ConfigTies) -> str | None:
    """The output embedding's weight name of the config's model class."""
    model = found.model
    if model is None:
        return None
    try:
        out = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if out is None:
        return None
    for prefix, module in model.named_modules(remove_duplicate=False):
        if module is out:
            return f"{prefix}.weight"
    return None


def _missing(
    cfg: Mapping[str, Any], found: ConfigTies, view: _Checked, ties: list[_Tie]
) -> list[Finding]:
    """Tensors the config's model class holds that neither the files nor a tie
    give (the model class decides; without transformers, only the head)."""
    findings: list[Finding] = []
    if found.names is None or not cfg.get("architectures"):
        return findings  # (Without a class named, the guessed one may not be the files'.)
    prefix = getattr(found.model, "base_model_prefix", "") or ""

    def loads_as(name: str) -> set[str]:
        """The model names a file name fills (transformers adds or strips the base
        model's prefix)."""
        name = found.load_name(name)
        bare = name[len(prefix) + 1 :] if prefix and name.startswith(f"{prefix}.") else name
        return {name, bare, f"{prefix}.{bare}" if prefix else bare}

    loaded = {m for n in view.names for m in loads_as(n)}
    # (A tie's canonical that is missing is reported as such.)
    tied = {m for t in ties for n in (t.alias, t.canonical) for m in loads_as(n)}
    head = _head(found)
    arch = (cfg.get("architectures") or [cfg.get("model_type", "?")])[0]
    # (Names transformers expects to miss: computed buffers, an older checkpoint's gaps.)
    ignored = [
        re.compile(p) for p in getattr(found.model, "_keys_to_ignore_on_load_missing", None) or ()
    ]
    for name, shape in found.names.items():
        if name in loaded or name in tied or any(p.search(name) for p in ignored):
            continue
        kind = "head-missing" if name == head else "tensor-missing"
        why = "leaves the head untied" if kind == "head-missing" else "holds it"
        findings.append(
            Finding(
                kind,
                "error",
                (name,),
                f"shape {tuple(shape)}",
                f"{arch} of {CONFIG_FILE} {why}, but the input does not store it: "
                "transformers would initialise it at random",
            )
        )
    return findings


def _sample(view: _Checked, name: str) -> np.ndarray:
    src, _, info = view.names[name]
    index = tuple(slice(None, None, max(1, n // _SAMPLE)) for n in info.shape)
    return np.asarray(view.source.read_slice(src, index))


def _equal_untied(view: _Checked, ties: list[_Tie]) -> list[Finding]:
    """Stored tensors equal bit for bit that no declaration ties: candidates share
    shape and dtype with another; samples are hashed first, and only colliding
    ones read whole."""
    root: dict[str, str] = {}

    def find(n: str) -> str:
        while root.get(n, n) != n:
            n = root[n]
        return n

    for t in ties:
        a, c = find(t.alias), find(t.canonical)
        if a != c:
            root[a] = c
    # Each stored tensor once: a name over another's storage (or source tensor) is not.
    by_src: dict[tuple[str, Perm | None], str] = {}
    for name, (src, perm, _) in view.names.items():
        by_src.setdefault((src, perm), name)
    groups: dict[tuple, list[str]] = {}
    for name in by_src.values():
        info = view.names[name][2]
        if info.nbytes and len(info.shape) and np.prod(info.shape) > 1:
            groups.setdefault((info.shape, info.dtype), []).append(name)
    findings = []
    for members in groups.values():
        if len(members) < 2:
            continue
        hashes: dict[bytes, list[str]] = {}
        samples: dict[str, np.ndarray] = {}
        for name in members:
            samples[name] = s = _sample(view, name)
            digest = hashlib.blake2b(_bits(s).tobytes(), digest_size=16).digest()
            hashes.setdefault(digest, []).append(name)
        for names in hashes.values():
            if len({find(n) for n in names}) < 2:
                continue  # (One tie group: its ties are held against each other above.)
            # A sample of one value throughout may be a constant tensor: never reported.
            values = {n: view.array(n) for n in names}
            names = [n for n in names if not (_constant(samples[n]) and _constant(values[n]))]
            done: set[str] = set()
            for i, a in enumerate(names):
                if a in done:
                    continue
                equal = [b for b in names[i + 1 :] if find(a) != find(b)]
                equal = [b for b in equal if same_bytes(values[a], values[b])]
                if equal:
                    done.update(equal)
                    findings.append(
                        Finding(
                            "equal-untied",
                            "info",
                            (a, *equal),
                            f"{format_bytes(view.names[a][2].nbytes)} each",
                            "equal bit for bit, but nothing declares them tied",
                        )
                    )
    return findings


def _constant(a: np.ndarray) -> bool:
    flat = _bits(a).reshape(a.size, -1) if a.size else _bits(a)
    return a.size == 0 or bool(np.all(flat == flat[:1]))


def _unheld(error: UnheldTies) -> CheckReport:
    """The findings of an input whose recorded ties name tensors it does not store
    (so no reader opens it): from what the reader could tell."""
    findings = tuple(
        Finding(
            "canonical-missing",
            "error",
            (t.alias, t.canonical),
            "not stored",
            f"{t.origin} ties {t.alias} to {t.canonical}, which the file does not store",
        )
        for t in error.ties
    )
    return CheckReport(
        str(error.path),
        error.kind,
        findings,
        {t.alias: (t.canonical, t.origin) for t in error.ties},
        0,
        0,
        (f"values not read: {error}",),
    )
