"""RocketMQ's compile-time checks: each failure is a syntax error raised at subscribe time.

They mirror ``ComparisonExpression.checkLessThanOperand``, ``checkEqualOperand``,
``checkEqualOperandCompatability``, ``createBetween``, ``createInFilter`` and the parser's
``asBooleanExpression``, including their blind spots: only a *literal* is checked as a constant,
so ``a BETWEEN -1 AND -5`` (negations, not literals) compiles in RocketMQ and here.
"""

from __future__ import annotations

from plugmq.core.errors import FilterEvaluationError, FilterSyntaxError
from plugmq.plugins.filter_sql.javanum import make_compare
from plugmq.plugins.filter_sql.nodes import BooleanCast, Constant, JType, Node, Property

__all__ = [
    "as_boolean",
    "check_between_bounds",
    "check_equal_operands",
    "check_in_operand",
    "check_ordering_operand",
]

_RUNTIME_TYPE = {JType.INT: "I", JType.LONG: "L", JType.DOUBLE: "D", JType.STRING: "S", JType.BOOLEAN: "B"}


def _snippet(expression: str, node: Node) -> str:
    if isinstance(node, Constant):
        return node.describe()
    text = expression[node.pos : node.pos + 40].strip()
    return text + ("..." if node.pos + 40 < len(expression) else "")


def _error(expression: str, node: Node, message: str, expected: str | None = None) -> FilterSyntaxError:
    return FilterSyntaxError(message, expression=expression, position=node.pos, expected=expected)


def check_ordering_operand(expression: str, node: Node, op: str) -> None:
    """Operands of ``< <= > >=`` (and BETWEEN) may not be string, boolean or NULL literals, nor
    conditions."""
    if isinstance(node, Constant):
        if node.jtype.is_number:
            return
        kind = {JType.STRING: "a string", JType.BOOLEAN: "a boolean", JType.NULL: "NULL"}[node.jtype]
        raise _error(
            expression, node,
            f"{kind} literal {node.describe()} cannot be an operand of {op}: only numbers and properties are ordered",
            "a number or a property",
        )
    if node.is_boolean:
        raise _error(
            expression, node,
            f"the condition {_snippet(expression, node)!r} cannot be an operand of {op} "
            "(NOT binds tighter than comparisons: write NOT (a > 5))",
            "a number or a property",
        )


def check_equal_operands(expression: str, left: Node, right: Node, op: str) -> None:
    """``=``/``<>``: no NULL literal on either side; a boolean literal on the left only meets a
    boolean literal (``TRUE = 'true'`` is an error, ``'true' = TRUE`` is not)."""
    for side in (left, right):
        if isinstance(side, Constant) and side.jtype is JType.NULL:
            raise _error(expression, side, f"NULL cannot be compared with {op}: use IS NULL / IS NOT NULL",
                         "IS NULL or IS NOT NULL")
    if isinstance(left, Constant) and isinstance(right, Constant) and left.is_boolean and not right.is_boolean:
        raise _error(expression, right,
                     f"{left.describe()} cannot be compared with {right.describe()}: a boolean literal on the "
                     "left of = or <> needs a boolean literal on the right", "TRUE or FALSE")


def check_between_bounds(expression: str, low: Node, high: Node) -> None:
    """Two literal bounds must be non-NULL and low <= high (compared as RocketMQ compares)."""
    if not (isinstance(low, Constant) and isinstance(high, Constant)):
        return
    for bound in (low, high):
        if bound.jtype is JType.NULL:
            raise _error(expression, bound, "BETWEEN bounds cannot be NULL", "a number")
    compare = make_compare(_RUNTIME_TYPE[high.jtype], _RUNTIME_TYPE[low.jtype])
    try:
        order = compare(high.value, low.value)
    except FilterEvaluationError as exc:
        raise _error(expression, high, f"BETWEEN bounds {low.describe()} and {high.describe()} cannot be compared: {exc}",
                     "a number") from None
    if order < 0:
        raise _error(expression, low,
                     f"BETWEEN {low.describe()} AND {high.describe()}: the low bound is above the high bound "
                     "(swap them; only NOT BETWEEN accepts reversed bounds)", "low bound <= high bound")


def check_in_operand(expression: str, node: Node, word: str) -> Property:
    if not isinstance(node, Property):
        raise _error(expression, node, f"the left side of {word} must be a property, got {_snippet(expression, node)!r}",
                     "a property name")
    return node


def as_boolean(expression: str, node: Node, context: str) -> Node:
    """RocketMQ's asBooleanExpression: conditions pass, a bare property becomes a boolean cast,
    anything else (a number, a string, a negation) is an error."""
    if node.is_boolean:
        return node
    if isinstance(node, Property):
        return BooleanCast(node.pos, node)
    raise _error(expression, node,
                 f"{_snippet(expression, node)!r} is not a condition and cannot be used {context}",
                 "a condition")
