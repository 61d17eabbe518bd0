"""Strict JSON: one parser for every document jaxshare reads, its messages in one place.

jaxshare reads JSON it wrote (the alias map, the naming record) and JSON others
wrote (a safetensors header, a Hugging Face index). :func:`loads` parses any of
them strictly: a size limit checked before parsing, UTF-8 only, and a key given
twice refused (Python's ``json`` would keep the last one silently).
:func:`load_document` also checks a versioned document -- ``"format"``, an
``int`` ``"version"`` (``True`` and ``1.0`` are not ``1``), and exactly the
fields it expects, each of the right type, for a :class:`Kind` of document. Every
message names what is read (the kind's ``what``), and :func:`reading` adds where it
was read from.

>>> X_DOC = Kind("x doc", "x.doc", 1)
>>> load_document('{"format": "x.doc", "version": 1, "items": {}}', X_DOC, {"items": dict})
{'format': 'x.doc', 'version': 1, 'items': {}}
>>> load_document('{"format": "x.doc", "version": true, "items": {}}', X_DOC, {"items": dict})
... # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: x doc JSON has version True; this jaxshare reads version 1. Upgrade jaxshare...
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

__all__ = ["Kind", "load_document", "loads", "reading"]

#: JSON type names, for messages.
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


class _DuplicateKey(Exception):
    """Raised by the object hook: a key given twice in one object."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def loads(
    text: str | bytes,
    /,
    *,
    what: str,
    max_bytes: int | None = None,
    limit_arg: str | None = "max_bytes",
) -> Any:
    """Parses ``text`` as JSON, strictly.

    Args:
      text: the JSON, as text or UTF-8 bytes.
      what: what the text is, for messages (``"alias map"``, ``"the header"``).
      max_bytes: refuse larger input before parsing it; ``None``: no limit.
      limit_arg: the argument that raises the limit, named in the message
        (``None``: the caller takes none).

    Raises:
      ValueError: over the limit, not UTF-8, not JSON, or a key repeated in one
        object; one sentence naming ``what``.

    >>> loads('{"a": 1, "a": 2}', what="the header")
    Traceback (most recent call last):
    ValueError: the header JSON repeats the key 'a'.
    """
    size = len(text.encode() if isinstance(text, str) else text)
    if max_bytes is not None and size > max_bytes:
        hint = f"; pass a larger `{limit_arg}` if this input is trusted" if limit_arg else ""
        raise ValueError(f"{what} JSON is {size} bytes, over the limit of {max_bytes}{hint}.")
    try:
        # (Bytes as UTF-8 only: `json.loads` would take UTF-16 and UTF-32 too.)
        return json.loads(
            text.decode("utf-8") if isinstance(text, bytes) else text,
            object_pairs_hook=_no_duplicates,
        )
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text, so not JSON.") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not JSON ({e}).") from None
    except _DuplicateKey as e:
        raise ValueError(f"{what} JSON repeats the key {e.args[0]!r}.") from None


class Kind(NamedTuple):
    """A kind of versioned document: how messages name it, its ``format`` and the
    ``version`` this jaxshare reads and writes."""

    what: str
    format: str
    version: int


def load_document(
    text: str | bytes,
    kind: Kind,
    fields: Mapping[str, type],
    /,
    *,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Parses a versioned document of ``kind``: ``{"format": ..., "version": ...}``
    plus exactly ``fields`` (name -> JSON type: ``dict``, ``list``, ``str``, ``int``).

    Returns:
      The document, every field checked.

    Raises:
      ValueError: anything :func:`loads` refuses; not an object; another format;
        a version that is not the ``int`` ``version`` (newer files name the fix:
        upgrade); a field missing, unexpected or of the wrong type. Each is one
        sentence naming ``kind.what``.
    """
    what, format, version = kind
    doc = loads(text, what=what, max_bytes=max_bytes)
    if not isinstance(doc, dict):
        raise ValueError(f"{what} JSON must be an object, got {_json_type(doc)}.")
    if doc.get("format") != format:
        raise ValueError(f"{what} JSON has format {doc.get('format')!r}, expected {format!r}.")
    found = doc.get("version")
    if type(found) is not int or found != version:
        raise ValueError(
            f"{what} JSON has version {found!r}; this jaxshare reads version {version}. "
            "Upgrade jaxshare to read newer files."
        )
    expected = {"format", "version", *fields}
    if extra := sorted(set(doc) - expected):
        raise ValueError(f"{what} JSON has unexpected fields {extra}.")
    if missing := sorted(expected - set(doc)):
        raise ValueError(f"{what} JSON lacks the fields {missing}.")
    for name, kind in fields.items():
        value = doc[name]
        if type(value) is not kind:  # (`type`: a bool is no int here.)
            raise ValueError(
                f"{what} JSON field {name!r} must be {_TYPE_NAMES.get(kind, kind.__name__)}, "
                f"got {_json_type(value)}."
            )
    return doc


@contextlib.contextmanager
def reading(where: object, fix: str = "") -> Iterator[None]:
    """Reads a document at ``where``: a ``ValueError`` raised inside (a parser's
    sentence) becomes one line naming ``where`` first, and ``fix`` last.

    >>> from jaxshare.core.alias import AliasMap
    >>> with reading("ckpt/jaxshare_alias_map.json"):
    ...     AliasMap.from_json("[]")
    Traceback (most recent call last):
    ValueError: ckpt/jaxshare_alias_map.json: alias map JSON must be an object, got list.
    """
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{where}: {e}" + (f" {fix}" if fix else "")) from None
