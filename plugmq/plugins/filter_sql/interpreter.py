"""filter_sql's reference evaluator: a walk over the parsed tree, message by message.

The compiled filter (:mod:`.compiler`: closures, generated code, memoised conversions) is what a
broker runs; this is the "obvious" implementation of the same semantics - each node evaluated on
every call, conversions chosen per message - kept as the reference the compiled filter must agree
with (tests/test_filter_sql_internals.py) and the baseline ``plugmq bench filter`` measures it
against. It is the project's one second SQL92 evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from plugmq.plugins.filter_sql import nodes
from plugmq.plugins.filter_sql.javanum import java_double_compare, java_double_value_of, make_compare

__all__ = ["interpret"]

_JTAG = {nodes.JType.INT: "I", nodes.JType.LONG: "L", nodes.JType.DOUBLE: "D", nodes.JType.STRING: "S", nodes.JType.BOOLEAN: "B"}
_ORDER = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


def _value(node: nodes.Node, props: Mapping[str, str]) -> tuple[Any, str | None]:
    """(value, Java class tag) of an operand, walking the tree on every call."""
    if isinstance(node, nodes.Constant):
        return node.value, _JTAG.get(node.jtype)
    if isinstance(node, nodes.Property):
        return props.get(node.name), "S"
    if isinstance(node, nodes.Negate):
        value, tag = _value(node.operand, props)
        if tag in ("I", "L", "D") and value is not None:
            return -value, tag
        return None, None
    return interpret(node, props), "B"


def interpret(node: nodes.Node, props: Mapping[str, str]) -> bool | None:
    """Evaluate the parsed tree directly: True, False or None (unknown), as the compiled filter does."""
    evaluate = _EVALUATORS.get(type(node))
    if evaluate is None:
        raise TypeError(f"unknown node {node!r}")
    return evaluate(node, props)


def _constant(node: nodes.Constant, props: Mapping[str, str]) -> bool | None:
    return node.value  # type: ignore[return-value]


def _boolean_cast(node: nodes.BooleanCast, props: Mapping[str, str]) -> bool | None:
    return None if props.get(node.operand.name) is None else False


def _not(node: nodes.Not, props: Mapping[str, str]) -> bool | None:
    inner = interpret(node.operand, props)
    return None if inner is None else not inner


def _logic(node: nodes.Logic, props: Mapping[str, str]) -> bool | None:
    unknown = False
    stop = node.op == "OR"  # the value that short-circuits
    for operand in node.operands:
        result = interpret(operand, props)
        if result is stop:
            return stop
        unknown = unknown or result is None
    return None if unknown else not stop


def _compare(node: nodes.Compare, props: Mapping[str, str]) -> bool | None:
    if node.op in ("=", "<>"):
        return _equality(node, props)
    lv, lt = _value(node.left, props)
    if lv is None:
        return None
    rv, rt = _value(node.right, props)
    if rv is None:
        return None
    if lt == "S" and rt == "S":
        return _ORDER[node.op](_strings(lv, rv))
    return _ORDER[node.op](make_compare(lt, rt)(lv, rv))  # type: ignore[arg-type]


def _equality(node: nodes.Compare, props: Mapping[str, str]) -> bool | None:
    lv, lt = _value(node.left, props)
    rv, rt = _value(node.right, props)
    if lv is None:
        equal = True if rv is None else None
    elif rv is None:
        equal = False
    else:
        equal = make_compare(lt, rt)(lv, rv) == 0  # type: ignore[arg-type]
    return equal if node.op == "=" or equal is None else not equal


def _is_null(node: nodes.IsNull, props: Mapping[str, str]) -> bool | None:
    value, _ = _value(node.operand, props)
    return (value is not None) if node.negated else (value is None)


def _between(node: nodes.Between, props: Mapping[str, str]) -> bool | None:
    if node.negated:
        return interpret(nodes.Logic(node.pos, "OR", (nodes.Compare(node.pos, "<", node.value, node.low),
                                                nodes.Compare(node.pos, ">", node.value, node.high))), props)
    return interpret(nodes.Logic(node.pos, "AND", (nodes.Compare(node.pos, ">=", node.value, node.low),
                                             nodes.Compare(node.pos, "<=", node.value, node.high))), props)


def _in(node: nodes.In, props: Mapping[str, str]) -> bool | None:
    value = props.get(node.operand.name)
    return None if value is None else (value in node.values) != node.negated


def _string_match(node: nodes.StringMatch, props: Mapping[str, str]) -> bool | None:
    if not node.search:
        return False
    value, _ = _value(node.operand, props)
    if not isinstance(value, str):
        return False
    found = {"CONTAINS": node.search in value, "STARTSWITH": value.startswith(node.search),
             "ENDSWITH": value.endswith(node.search)}[node.op]
    return found != node.negated


# One evaluator per node class (exact classes: the parser makes no subclasses).
_EVALUATORS: dict[type, Callable[[Any, Mapping[str, str]], bool | None]] = {
    nodes.Constant: _constant, nodes.BooleanCast: _boolean_cast, nodes.Not: _not, nodes.Logic: _logic,
    nodes.Compare: _compare, nodes.IsNull: _is_null, nodes.Between: _between, nodes.In: _in,
    nodes.StringMatch: _string_match,
}


def _strings(a: str, b: str) -> int:
    return java_double_compare(java_double_value_of(a), java_double_value_of(b))
