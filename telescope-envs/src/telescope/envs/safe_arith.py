"""Safe evaluation of arithmetic expressions: numbers and + - * / only, bounded sizes.

Never ``eval``: the expression is parsed with ``ast`` and walked; any other node (names,
calls, attributes, ``**``, subscripts, ...) is rejected before anything runs.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_MAGNITUDE", "UnsafeExpression", "safe_arithmetic"]

MAX_EXPRESSION_CHARS = 200
#: Any intermediate value beyond this magnitude is rejected (keeps work bounded).
MAX_MAGNITUDE = 1e15

_BINOPS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class UnsafeExpression(ValueError):
    """The expression is not plain arithmetic over numbers, or is too large."""


def safe_arithmetic(expression: str) -> float:
    """Value of ``expression`` (float); raises ``UnsafeExpression`` or ``ZeroDivisionError``."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression(f"expression longer than {MAX_EXPRESSION_CHARS} chars")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UnsafeExpression(f"not an expression: {type(exc).__name__}") from None
    return _walk(tree.body)


def _walk(node: ast.AST) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return _bounded(float(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _walk(node.left), _walk(node.right)
        return _bounded(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    raise UnsafeExpression(f"disallowed syntax: {type(node).__name__}")


def _bounded(value: float) -> float:
    if not abs(value) <= MAX_MAGNITUDE:  # also catches nan
        raise UnsafeExpression(f"intermediate value out of range: {value!r}")
    return value
