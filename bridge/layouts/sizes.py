"""Sizes and conditions a layout table writes in terms of the model's config.

A table says ``"num_attention_heads"`` where it means the number of query heads
and ``"tie_word_embeddings"`` where an entry holds only for a tied model. Such a
text is a small expression over the config's keys (and the caller's options,
the table's own ``defaults`` and ``derived`` values): names, integers, floats
and quoted strings, ``+ - * / // %``, ``**``, comparisons, ``and or not``, and
``sqrt``. Nothing else is evaluated: no attribute, call or subscript of any
other kind, so a layout file never runs code.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Scope", "evaluate", "names_in"]

_BINARY: Mapping[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: Mapping[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS: Mapping[str, Callable[[float], float]] = {"sqrt": math.sqrt}


class Scope:
    """The values a table's expressions see: the caller's ``options`` (a layout's
    own knobs, such as MaxText's ``scan_layers``), over the config, over the
    table's ``defaults``, with ``derived`` values computed from them where none of
    these sets them. A value of ``None`` counts as unset.

    >>> scope = Scope({"hidden_size": 64, "num_attention_heads": 4},
    ...               derived={"head_dim": "hidden_size // num_attention_heads"})
    >>> scope["head_dim"], evaluate("head_dim * 2", scope)
    (16, 32)
    >>> Scope({"scan_layers": True}, options={"scan_layers": False})["scan_layers"]
    False
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        *,
        options: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        derived: Mapping[str, str] | None = None,
    ) -> None:
        self._values = {
            k: v
            for layer in (defaults or {}, config or {}, options or {})
            for k, v in layer.items()
            if v is not None
        }
        self._derived = dict(derived or {})
        self._busy: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return (name in self._values and self._values[name] is not None) or name in self._derived

    def __getitem__(self, name: str) -> Any:
        value = self._values.get(name)
        if value is not None:
            return value
        if name in self._derived and name not in self._busy:
            self._busy.add(name)
            try:
                return evaluate(self._derived[name], self)
            finally:
                self._busy.discard(name)
        raise KeyError(name)


def _parse(text: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"{text!r} is not an expression ({e.msg})") from None


def names_in(text: str) -> set[str]:
    """The config keys an expression reads.

    >>> sorted(names_in("hidden_size // num_attention_heads"))
    ['hidden_size', 'num_attention_heads']
    """
    return {
        node.id
        for node in ast.walk(_parse(text))
        if isinstance(node, ast.Name) and node.id not in _FUNCTIONS
    }


def evaluate(text: str | int | float | bool, scope: Scope) -> Any:
    """The value of ``text`` (an expression, or a number as it is) in ``scope``.

    Raises:
      ValueError: one line: a syntax the tables do not use, or a name neither the
        config nor the table defines.

    >>> evaluate("not tie_word_embeddings", Scope({"tie_word_embeddings": True}))
    False
    >>> evaluate("1 / sqrt(head_dim)", Scope({"head_dim": 16}))
    0.25
    >>> evaluate("rope_type == 'llama3'", Scope({"rope_type": "llama3"}))
    True
    """
    if isinstance(text, bool | int | float):
        return text
    return _value(_parse(text), scope, text)


def _value(node: ast.expr, scope: Scope, text: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float | str):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("true", "false"):
            return node.id == "true"
        try:
            return scope[node.id]
        except KeyError:
            raise ValueError(f"{text!r} reads {node.id!r}, which the config does not set") from None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, scope, text), _value(node.right, scope, text)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        operand = _value(node.operand, scope, text)
        return -operand if isinstance(node.op, ast.USub) else not operand
    if isinstance(node, ast.BoolOp):
        values = (_value(v, scope, text) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _value(node.left, scope, text)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, scope, text)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and len(node.args) == 1
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](_value(node.args[0], scope, text))
    raise ValueError(
        f"{text!r}: only names, numbers, strings, arithmetic, comparisons, and/or/not and sqrt() "
        "are allowed in a layout's sizes and conditions"
    )
