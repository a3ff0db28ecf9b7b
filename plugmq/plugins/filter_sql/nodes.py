"""The parsed form of an SQL92 selector, and its readable rendering.

The node classes mirror the distinctions RocketMQ's compile-time checks make: a *constant* (its
Java type matters: Integer, Long, Double, String, Boolean or NULL), a *property*, a negation, and
the *boolean expressions* (comparisons, logic, NOT, IN, ...). TRUE, FALSE and NULL are both
constants and boolean expressions, as in RocketMQ. Parentheses leave no node.

``describe()`` renders the tree with explicit parentheses wherever precedence decided something
(``NOT a = 'x'`` renders as ``(NOT a) = 'x'``), which is what a person debugging a subscription
needs to see.
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "Between",
    "BooleanCast",
    "Compare",
    "Constant",
    "In",
    "IsNull",
    "JType",
    "Logic",
    "Negate",
    "Node",
    "Not",
    "Property",
    "StringMatch",
    "render_string",
]


class JType(enum.Enum):
    """The Java class of a literal's value."""

    INT = "Integer"
    LONG = "Long"
    DOUBLE = "Double"
    STRING = "String"
    BOOLEAN = "Boolean"
    NULL = "null"

    @property
    def is_number(self) -> bool:
        return self in (JType.INT, JType.LONG, JType.DOUBLE)


def render_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@attrs.frozen
class Node:
    pos: int

    @property
    def is_boolean(self) -> bool:
        """Whether RocketMQ treats the node as a BooleanExpression."""
        return True

    @property
    def atomic(self) -> bool:
        return False

    def children(self) -> tuple[Node, ...]:
        return ()

    def describe(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe()


class _OneOperand:
    """Mixed into the nodes whose one child is ``operand`` (each declares the field)."""

    __slots__ = ()
    operand: Node

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


def _wrap(node: Node) -> str:
    return node.describe() if node.atomic else f"({node.describe()})"


@attrs.frozen
class Constant(Node):
    value: int | float | str | bool | None
    jtype: JType

    @property
    def is_boolean(self) -> bool:
        return self.jtype in (JType.BOOLEAN, JType.NULL)

    @property
    def atomic(self) -> bool:
        return not (self.jtype.is_number and self.value < 0)  # type: ignore[operator]

    def describe(self) -> str:
        if self.jtype is JType.NULL:
            return "NULL"
        if self.jtype is JType.BOOLEAN:
            return "TRUE" if self.value else "FALSE"
        if self.jtype is JType.STRING:
            return render_string(str(self.value))
        if self.jtype is JType.LONG:
            return f"{self.value}L"
        return repr(self.value) if self.jtype is JType.DOUBLE else str(self.value)


@attrs.frozen
class Property(Node):
    name: str

    @property
    def is_boolean(self) -> bool:
        return False

    @property
    def atomic(self) -> bool:
        return True

    def describe(self) -> str:
        return self.name


@attrs.frozen
class Negate(_OneOperand, Node):
    operand: Node

    @property
    def is_boolean(self) -> bool:
        return False

    def describe(self) -> str:
        return f"-{_wrap(self.operand)}"


@attrs.frozen
class BooleanCast(_OneOperand, Node):
    """A bare property used as a condition (RocketMQ's implicit boolean cast)."""

    operand: Property

    @property
    def atomic(self) -> bool:
        return True

    def describe(self) -> str:
        return self.operand.describe()


@attrs.frozen
class Not(_OneOperand, Node):
    operand: Node

    def describe(self) -> str:
        return f"NOT {_wrap(self.operand)}"


@attrs.frozen
class Logic(Node):
    """AND / OR over two or more operands (a chain ``a AND b AND c`` is one node)."""

    op: str
    operands: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.operands

    def describe(self) -> str:
        parts = [f"({o.describe()})" if isinstance(o, Logic) else o.describe() for o in self.operands]
        return f" {self.op} ".join(parts)


@attrs.frozen
class Compare(Node):
    """``= <> > >= < <=``."""

    op: str
    left: Node
    right: Node

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def describe(self) -> str:
        return f"{_wrap(self.left)} {self.op} {_wrap(self.right)}"


@attrs.frozen
class IsNull(_OneOperand, Node):
    operand: Node
    negated: bool

    def describe(self) -> str:
        return f"{_wrap(self.operand)} IS {'NOT ' if self.negated else ''}NULL"


@attrs.frozen
class Between(Node):
    value: Node
    low: Node
    high: Node
    negated: bool

    def children(self) -> tuple[Node, ...]:
        return (self.value, self.low, self.high)

    def describe(self) -> str:
        word = "NOT BETWEEN" if self.negated else "BETWEEN"
        return f"{_wrap(self.value)} {word} {_wrap(self.low)} AND {_wrap(self.high)}"


@attrs.frozen
class In(_OneOperand, Node):
    operand: Property
    values: tuple[str, ...]
    negated: bool

    def describe(self) -> str:
        word = "NOT IN" if self.negated else "IN"
        return f"{self.operand.describe()} {word} ({', '.join(render_string(v) for v in self.values)})"


@attrs.frozen
class StringMatch(_OneOperand, Node):
    """CONTAINS / STARTSWITH / ENDSWITH and their NOT forms (the search is a string literal)."""

    op: str
    operand: Node
    search: str
    negated: bool

    def describe(self) -> str:
        return f"{_wrap(self.operand)} {'NOT ' if self.negated else ''}{self.op} {render_string(self.search)}"


def depth(node: Node) -> int:
    """Height of the tree (iterative, so it is safe on any tree the parser could build)."""
    best = 0
    stack = [(node, 1)]
    while stack:
        current, level = stack.pop()
        best = max(best, level)
        stack.extend((child, level + 1) for child in current.children())
    return best
