"""``AliasMap``: which paths of a tree are aliases of which canonical path.

The direction is DeepSpeed's ``shared_params``: the key is the path that is not
stored (the alias), the value the path that is (the canonical). An alias may
carry an axis permutation, for ties across an axis-order change (PyTorch
``lm_head.weight`` tied to ``wte.weight`` is Flax ``lm_head/kernel ==
wte/embedding.T``), and may be *implicit*: the model computes it from its
canonical (``FlaxGPT2LMHeadModel``'s head from ``wte/embedding``, an ``attend``),
so it is never a leaf of the tree -- :func:`jaxshare.retie`, restores and
``consolidate`` leave it out -- while the way out to PyTorch names re-creates it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jaxshare.core.frozen import FrozenMapping
from jaxshare.core.naming import NamingRecord
from jaxshare.core.perm import Perm, as_perm, compose
from jaxshare.core.strict_json import Kind, load_document

__all__ = ["check_path", "AliasMap", "FORMAT", "MAX_JSON_BYTES", "VERSION", "as_alias_map"]

FORMAT = "jaxshare.alias_map"
VERSION = 1
#: This document kind, for the strict parser.
DOCUMENT = Kind("alias map", FORMAT, VERSION)
#: ``from_json`` refuses larger input; a real alias map is a few kilobytes.
MAX_JSON_BYTES = 16 * 2**20
#: The fields of an alias's entry object: its canonical, and a transform or the
#: implicit mark or both.
_ENTRY_FIELDS = frozenset({"target", "permute", "implicit"})


def check_path(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str path, got {type(value).__name__}: {value!r}")
    if not value or value.startswith("/") or value.endswith("/") or "//" in value:
        raise ValueError(
            f"{what} {value!r} is not a path: expected non-empty '/'-joined keys "
            "such as 'params/wte/embedding'."
        )
    return value


class AliasMap(FrozenMapping[str, str]):
    """An immutable map from alias path to canonical path.

    Invariants, checked on construction: no alias is its own canonical, no
    cycles, and no alias is also a canonical -- a chain ``a -> b -> c`` is
    collapsed to ``a -> c, b -> c`` (composing transforms). Iteration is in
    sorted order, so output built from an ``AliasMap`` is deterministic.

    Args:
      aliases: ``{alias: canonical}`` (a mapping or ``(alias, canonical)`` pairs),
        e.g. DeepSpeed's ``shared_params`` with ``'/'`` paths.
      transforms: ``{alias: permutation}``: the alias holds
        ``jnp.transpose(canonical, permutation)``. Aliases not named here are
        identical to their canonical.
      naming: what a conversion from PyTorch recorded of every leaf (see
        :class:`jaxshare.NamingRecord`), carried with the ties so that the way
        back is exact; ``None`` when the tree was not converted. It is
        provenance, not a tie: maps with the same ties are equal whatever
        their naming.
      implicit: aliases the model computes from their canonical instead of
        holding them: never leaves of the tree (``retie`` does not put them
        back), ties all the same on the way out to PyTorch names. An alias the
        naming record marks implicit is implicit too. Like the naming, it says
        how the tree holds the ties, not which they are: maps with the same ties
        are equal whatever their implicit aliases (:attr:`implicit` tells them
        apart).

    Raises:
      TypeError, ValueError: a path or permutation is malformed, the map has a
        self-alias or a cycle, or ``implicit`` names a path that is no alias; the
        message names the paths.

    >>> m = AliasMap({"lm_head/kernel": "wte/embedding", "b": "a"},
    ...              transforms={"lm_head/kernel": (1, 0)})
    >>> m["b"], m.transform("lm_head/kernel"), m.transform("b")
    ('a', (1, 0), None)
    >>> m.groups()
    {'a': ('b',), 'wte/embedding': ('lm_head/kernel',)}
    >>> AliasMap({"c": "b", "b": "a"})  # chains collapse
    AliasMap({'b': 'a', 'c': 'a'})
    >>> sorted(AliasMap({"lm_head/kernel": "wte/embedding"}, implicit=["lm_head/kernel"]).implicit)
    ['lm_head/kernel']
    """

    __slots__ = ("_entries", "_transforms", "_naming", "_implicit", "_hash")

    def __init__(
        self,
        aliases: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        /,
        *,
        transforms: Mapping[str, Sequence[int] | None] | None = None,
        naming: NamingRecord | None = None,
        implicit: Iterable[str] = (),
    ) -> None:
        if naming is not None and not isinstance(naming, NamingRecord):
            raise TypeError(f"`naming` must be a NamingRecord, got {type(naming).__name__}.")
        raw: dict[str, str] = {}
        items = aliases.items() if isinstance(aliases, Mapping) else aliases
        for item in items:
            alias, canonical = item
            alias = check_path(alias, "alias")
            raw[alias] = check_path(canonical, f"canonical of alias {alias!r}")
            if alias == canonical:
                raise ValueError(f"alias {alias!r} names itself as its canonical path.")
        perms: dict[str, Perm | None] = {}
        for alias, perm in (transforms or {}).items():
            if alias not in raw:
                raise ValueError(
                    f"`transforms` names {alias!r}, which is not an alias in this map."
                )
            perms[alias] = as_perm(perm, f"transform of alias {alias!r}")

        resolved: dict[str, str] = {}
        resolved_perms: dict[str, Perm] = {}
        for alias in sorted(raw):
            chain = [alias]
            target, perm = raw[alias], perms.get(alias)
            while target in raw:
                if target in chain:
                    cycle = " -> ".join([*chain[chain.index(target) :], target])
                    raise ValueError(f"alias map has a cycle: {cycle}.")
                chain.append(target)
                perm = compose(perm, perms.get(target), f" along {' -> '.join(chain)}")
                target = raw[target]
            resolved[alias] = target
            if perm is not None:
                resolved_perms[alias] = perm
        marked = frozenset(implicit)
        unknown = sorted(a for a in marked if a not in resolved)
        if unknown:
            raise ValueError(
                f"`implicit` names {unknown[:5]}, which are not aliases in this map; an "
                "implicit tie is an alias the model computes from its canonical."
            )
        if naming:  # (What the record marks implicit, of this map's aliases.)
            marked |= {a for a in naming.implicit if a in resolved}
        self._entries = resolved
        self._transforms = resolved_perms
        self._naming = naming or None
        self._implicit = marked
        self._hash: int | None = None

    @classmethod
    def checked(cls, aliases: dict[str, str]) -> AliasMap:
        """A map from ``aliases`` that the caller has checked and resolved already
        (valid paths, no self-alias, no canonical that is an alias), without
        transforms: what :func:`jaxshare.find_shared` builds, skipping the checks
        it made. Anything else is :class:`AliasMap`'s own constructor's to check.

        >>> AliasMap.checked({"b": "a"})
        AliasMap({'b': 'a'})
        """
        self = cls.__new__(cls)
        self._entries = {a: aliases[a] for a in sorted(aliases)}
        self._transforms = {}
        self._naming = None
        self._implicit = frozenset()
        self._hash = None
        return self

    # -- Mapping --------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, AliasMap):
            return self._entries == other._entries and self._transforms == other._transforms
        if isinstance(other, Mapping):
            return not self._transforms and self._entries == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(
                (frozenset(self._entries.items()), frozenset(self._transforms.items()))
            )
        return self._hash

    def __repr__(self) -> str:
        extra = f", transforms={self._transforms!r}" if self._transforms else ""
        if self._implicit:
            extra += f", implicit={sorted(self._implicit)!r}"
        if self._naming is not None:
            extra += f", naming={self._naming!r}"
        return f"AliasMap({self._entries!r}{extra})"

    # -- queries --------------------------------------------------------------
    def transform(self, alias: str) -> Perm | None:
        """The axis permutation ``alias`` holds of its canonical, ``None`` for identity.

        Raises:
          KeyError: ``alias`` is not an alias in this map.
        """
        if alias not in self._entries:
            raise KeyError(f"{alias!r} is not an alias in this map.")
        return self._transforms.get(alias)

    @property
    def naming(self) -> NamingRecord | None:
        """The naming record of the conversion that made the tree, if any."""
        return self._naming

    @property
    def implicit(self) -> frozenset[str]:
        """The aliases the model computes: never leaves of the tree (see the class)."""
        return self._implicit

    def explicit(self) -> AliasMap:
        """The ties that are leaves of the tree: this map without its implicit aliases.

        >>> AliasMap({"b": "a", "head": "a"}, implicit=["head"]).explicit()
        AliasMap({'b': 'a'})
        """
        if not self._implicit:
            return self
        kept = {a: c for a, c in self._entries.items() if a not in self._implicit}
        return AliasMap(kept, transforms={a: p for a, p in self._transforms.items() if a in kept})

    def with_naming(self, naming: NamingRecord | None) -> AliasMap:
        """This map with ``naming`` as its naming record (its implicit aliases kept)."""
        return AliasMap(
            self._entries, transforms=self._transforms, naming=naming, implicit=self._implicit
        )

    @property
    def transforms(self) -> Mapping[str, Perm]:
        """``{alias: permutation}`` for the aliases that are not identical."""
        return dict(self._transforms)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """``{canonical: (alias, ...)}``, canonicals and aliases sorted."""
        out: dict[str, list[str]] = {}
        for alias, canonical in self._entries.items():
            out.setdefault(canonical, []).append(alias)
        return {c: tuple(sorted(a)) for c, a in sorted(out.items())}

    def rename(self, fn: Callable[[str], str]) -> AliasMap:
        """A new map with every path (alias and canonical) passed through ``fn``,
        and the paths of its naming record too.

        >>> AliasMap({"a/x": "b/x"}).rename(lambda p: "params/" + p)
        AliasMap({'params/a/x': 'params/b/x'})
        """
        return AliasMap(
            {fn(a): fn(c) for a, c in self._entries.items()},
            transforms={fn(a): p for a, p in self._transforms.items()},
            naming=None if self._naming is None else self._naming.rename(fn),
            implicit=map(fn, self._implicit),
        )

    # -- JSON -----------------------------------------------------------------
    def to_json(self, *, indent: int | None = None) -> str:
        """Serialises to the versioned JSON format (keys sorted). The naming record,
        if any, has a JSON document of its own (``naming.to_json()``), stored beside.
        An implicit alias is an object with ``"implicit": true`` (a map without one
        is written as before).

        >>> AliasMap({"b": "a"}).to_json()
        '{"format": "jaxshare.alias_map", "version": 1, "aliases": {"b": "a"}}'
        >>> json.loads(AliasMap({"b": "a"}, implicit=["b"]).to_json())["aliases"]
        {'b': {'target': 'a', 'implicit': True}}
        """
        entries: dict[str, Any] = {}
        for alias in sorted(self._entries):
            target = self._entries[alias]
            perm = self._transforms.get(alias)
            if perm is None and alias not in self._implicit:
                entries[alias] = target
                continue
            entry: dict[str, Any] = {"target": target}
            if perm is not None:
                entry["permute"] = list(perm)
            if alias in self._implicit:
                entry["implicit"] = True
            entries[alias] = entry
        doc = {"format": FORMAT, "version": VERSION, "aliases": entries}
        return json.dumps(doc, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes, /, *, max_bytes: int = MAX_JSON_BYTES) -> AliasMap:
        """Parses the JSON written by :meth:`to_json`, strictly.

        Raises:
          ValueError: input over ``max_bytes``, not JSON, duplicate keys, unknown
            format or version, unexpected fields or types, or an invalid map.
            Nothing is returned half-loaded.

        >>> AliasMap.from_json('{"format": "jaxshare.alias_map", "version": 1, '
        ...                    '"aliases": {"k": {"target": "e", "permute": [1, 0]}}}')
        AliasMap({'k': 'e'}, transforms={'k': (1, 0)})
        """
        doc = load_document(text, DOCUMENT, {"aliases": dict}, max_bytes=max_bytes)
        entries = doc["aliases"]
        aliases: dict[str, str] = {}
        transforms: dict[str, Any] = {}
        implicit: list[str] = []
        for alias, entry in entries.items():
            if isinstance(entry, dict):
                fields = set(entry)
                if not {"target"} < fields <= _ENTRY_FIELDS:
                    raise ValueError(
                        f"alias {alias!r}: an entry object must have exactly the fields "
                        f"'target' and 'permute', 'implicit' or both, got {sorted(entry)}."
                    )
                if "permute" in entry:
                    if not isinstance(entry["permute"], list):
                        raise ValueError(
                            f"alias {alias!r}: 'permute' must be a list of ints, got "
                            f"{entry['permute']!r}."
                        )
                    transforms[alias] = entry["permute"]
                if "implicit" in entry:
                    if entry["implicit"] is not True:  # (Written only where it holds.)
                        raise ValueError(
                            f"alias {alias!r}: 'implicit' must be true, got {entry['implicit']!r}."
                        )
                    implicit.append(alias)
                aliases[alias] = entry["target"]
            else:
                aliases[alias] = entry
        try:
            return cls(aliases, transforms=transforms, implicit=implicit)
        except TypeError as e:
            raise ValueError(f"alias map JSON is invalid: {e}") from None


def as_alias_map(alias_map: Mapping[str, str] | None, name: str = "alias_map") -> AliasMap:
    """Accepts an ``AliasMap``, any ``{alias: canonical}`` mapping (DeepSpeed's
    ``shared_params`` with ``'/'`` paths) or ``None`` (no ties).

    >>> as_alias_map({"b": "a"})
    AliasMap({'b': 'a'})
    """
    if alias_map is None:
        return AliasMap()
    if isinstance(alias_map, AliasMap):
        return alias_map
    if not isinstance(alias_map, Mapping):
        raise TypeError(
            f"`{name}` must be an AliasMap or a mapping of alias -> canonical paths, "
            f"got {type(alias_map).__name__}."
        )
    return AliasMap(alias_map)
