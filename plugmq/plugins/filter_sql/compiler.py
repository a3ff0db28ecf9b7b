"""Compile a checked tree into nested closures: all dispatch happens once, here.

Each condition becomes ``fn(properties) -> True | False | None``. Value operands carry a static
tag for the Java class they produce, which is known at compile time because message properties
are always strings and numbers only come from literals:

====  ===========================================================
P     a property: its string, or None when missing
X     a condition used as a value: Boolean or None
I/L/D an Integer / Long / Double literal (or a negated one)
S/B   a String / Boolean literal
N     always None (NULL; a negated string, boolean or property)
Z     None after evaluating a condition that may fail (``-(a > 1)``)
====  ===========================================================

so each comparison picks its conversion (:func:`javanum.make_compare`) when compiled and the
per-message work is a dictionary lookup, a conversion and a compare. AND/OR chains (and BETWEEN)
become one generated function each (:mod:`.codegen`) that inlines its simple operands; they
short-circuit left to right, which decides whether an evaluation error surfaces (as in RocketMQ).

Every closure takes an ignored optional second argument, so the root closure can serve directly
as ``Filter.evaluate(properties, tags=None)`` without a wrapper call per message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from plugmq.core.errors import FilterEvaluationError
from plugmq.plugins.filter_sql import nodes
from plugmq.plugins.filter_sql.codegen import generate_logic
from plugmq.plugins.filter_sql.javanum import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    MEMOS,
    java_double_compare,
    java_double_value_of,
    java_integer_value_of,
    java_long_value_of,
    make_compare,
)

__all__ = ["Condition", "compile_condition"]

Props = Mapping[str, str]
Condition = Callable[..., "bool | None"]  # (properties, tags=None)
Getter = Callable[..., Any]

_TAG = {nodes.JType.INT: "I", nodes.JType.LONG: "L", nodes.JType.DOUBLE: "D", nodes.JType.STRING: "S",
        nodes.JType.BOOLEAN: "B", nodes.JType.NULL: "N"}
# The class of a non-None runtime value, per static tag.
_RUNTIME = {"P": "S", "X": "B", "I": "I", "L": "L", "D": "D", "S": "S", "B": "B"}
_CONSTANT_TAGS = frozenset("ILDSB")

_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


@attrs.frozen
class _Value:
    get: Getter
    tag: str
    const: Any = None  # the value, when tag is a constant tag
    name: str = ""  # the property name, when tag is P


def compile_condition(node: nodes.Node) -> Condition:
    """The closure for a condition node (the parser guarantees ``node.is_boolean`` or a cast)."""
    kind = type(node)
    if kind is nodes.Constant:
        value = node.value  # type: ignore[attr-defined]
        return lambda _p, _tags=None: value
    if kind is nodes.BooleanCast:
        return _boolean_cast(node.operand.name)  # type: ignore[attr-defined]
    if kind is nodes.Not:
        return _not(compile_condition(node.operand))  # type: ignore[attr-defined]
    if kind is nodes.Logic:
        return generate_logic(node.op, list(node.operands), compile_condition)  # type: ignore[attr-defined]
    if kind is nodes.Compare:
        left, right = _value(node.left), _value(node.right)  # type: ignore[attr-defined]
        op = node.op  # type: ignore[attr-defined]
        if op == "=":
            return _equal(left, right)
        if op == "<>":
            return _not_equal(left, right)
        return _ordering(op, left, right)
    if kind is nodes.IsNull:
        return _is_null(_value(node.operand), node.negated)  # type: ignore[attr-defined]
    if kind is nodes.Between:
        value, low, high = node.value, node.low, node.high  # type: ignore[attr-defined]
        if node.negated:  # type: ignore[attr-defined]
            parts = [nodes.Compare(node.pos, "<", value, low), nodes.Compare(node.pos, ">", value, high)]
            return generate_logic("OR", parts, compile_condition)
        parts = [nodes.Compare(node.pos, ">=", value, low), nodes.Compare(node.pos, "<=", value, high)]
        return generate_logic("AND", parts, compile_condition)
    if kind is nodes.In:
        return _in(node.operand.name, frozenset(node.values), node.negated)  # type: ignore[attr-defined]
    if kind is nodes.StringMatch:
        return _string_match(node.op, _value(node.operand), node.search, node.negated)  # type: ignore[attr-defined]
    raise TypeError(f"not a condition node: {node!r}")  # the parser never builds one


# ---------------------------------------------------------------------------------------- values


def _wrap(value: int, jtype: str) -> int:
    """Java's two's-complement negation overflow (only reachable through double negation)."""
    if jtype == "I" and not INT_MIN <= value <= INT_MAX:
        return (value - INT_MIN) % 2**32 + INT_MIN
    if jtype == "L" and not LONG_MIN <= value <= LONG_MAX:
        return (value - LONG_MIN) % 2**64 + LONG_MIN
    return value


def _value(node: nodes.Node) -> _Value:
    if isinstance(node, nodes.Constant):
        value = node.value
        return _Value(lambda _p, _tags=None: value, _TAG[node.jtype], value)
    if isinstance(node, nodes.Property):
        name = node.name
        return _Value(lambda p, _tags=None: p.get(name), "P", name=name)
    if isinstance(node, nodes.Negate):
        inner = _value(node.operand)
        if inner.tag in ("I", "L", "D"):
            negated = -inner.const if inner.tag == "D" else _wrap(-inner.const, inner.tag)
            return _Value(lambda _p, _tags=None: negated, inner.tag, negated)
        if inner.tag in ("X", "Z"):
            evaluate = inner.get

            def negate_condition(p: Props, _tags: object = None) -> None:
                evaluate(p)  # a failing condition still fails; its Boolean result is not a number

            return _Value(negate_condition, "Z")
        return _Value(lambda _p, _tags=None: None, "N")  # strings (every property value), booleans, NULL
    return _Value(compile_condition(node), "X")


def _runtime_compare(left: _Value, right: _Value) -> Callable[[Any, Any], int]:
    lt, rt = _RUNTIME.get(left.tag), _RUNTIME.get(right.tag)
    if lt is None or rt is None:
        return lambda _a, _b: 0  # unreachable: an N/Z side is always None before comparing
    return make_compare(lt, rt)


# ----------------------------------------------------------------------------------- conditions


def _boolean_cast(name: str) -> Condition:
    # Property values are strings, never Booleans: present means FALSE (even "true").
    def cast(p: Props, _tags: object = None) -> bool | None:
        return None if p.get(name) is None else False

    return cast


def _not(inner: Condition) -> Condition:
    def negation(p: Props, _tags: object = None) -> bool | None:
        value = inner(p)
        return None if value is None else not value

    return negation


def _equal(left: _Value, right: _Value) -> Condition:
    """RocketMQ's ``=``: left missing & right present -> NULL; left present & right missing ->
    FALSE; both missing -> TRUE; else compareTo == 0 after conversion."""
    if left.tag == "P" and right.tag in _CONSTANT_TAGS:
        name, const = left.name, right.const
        if right.tag == "S":
            def prop_eq_string(p: Props, _tags: object = None) -> bool | None:
                v = p.get(name)
                return None if v is None else v == const

            return prop_eq_string
        if right.tag in ("I", "L"):
            known, convert = MEMOS[right.tag].get, MEMOS[right.tag].convert

            def prop_eq_int(p: Props, _tags: object = None) -> bool | None:
                v = p.get(name)
                if v is None:
                    return None
                number = known(v)
                return (convert(v) if number is None else number) == const

            return prop_eq_int
        compare = make_compare("S", right.tag)

        def prop_eq_const(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            return None if v is None else compare(v, const) == 0

        return prop_eq_const
    if left.tag in _CONSTANT_TAGS and right.tag == "P":
        name, const = right.name, left.const
        compare = make_compare(left.tag, "S")

        def const_eq_prop(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            return False if v is None else compare(const, v) == 0

        return const_eq_prop
    get_left, get_right = left.get, right.get
    compare = _runtime_compare(left, right)

    def equal(p: Props, _tags: object = None) -> bool | None:
        lv = get_left(p)
        rv = get_right(p)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return compare(lv, rv) == 0

    return equal


def _not_equal(left: _Value, right: _Value) -> Condition:
    if left.tag == "P" and right.tag == "S":
        name, const = left.name, right.const

        def prop_ne_string(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            return None if v is None else v != const

        return prop_ne_string
    return _not(_equal(left, right))


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "I": java_integer_value_of,
    "L": java_long_value_of,
    "D": java_double_value_of,
}


def _strings_as_doubles(a: str, b: str) -> int:
    try:
        return java_double_compare(java_double_value_of(a), java_double_value_of(b))
    except FilterEvaluationError as exc:
        raise FilterEvaluationError(
            f"strings are ordered only when both parse as doubles: {a!r} vs {b!r} ({exc})"
        ) from None


def _ordering(op: str, left: _Value, right: _Value) -> Condition:
    """``> >= < <=``: NULL if either side is missing; two strings compare as doubles."""
    test = _ORDER_TESTS[op]
    if left.tag == "P" and right.tag in ("I", "L"):
        name, const = left.name, right.const
        known, convert = MEMOS[right.tag].get, MEMOS[right.tag].convert
        compare_int: Callable[[int, int], bool] = {
            ">": int.__gt__, ">=": int.__ge__, "<": int.__lt__, "<=": int.__le__,
        }[op]

        def prop_vs_int(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            if v is None:
                return None
            number = known(v)
            return compare_int(convert(v) if number is None else number, const)

        return prop_vs_int
    if left.tag == "P" and right.tag == "D":
        name, const = left.name, right.const
        known_d, convert_d = MEMOS["D"].get, MEMOS["D"].convert

        def prop_vs_double(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            if v is None:
                return None
            number = known_d(v)
            return test(java_double_compare(convert_d(v) if number is None else number, const))

        return prop_vs_double
    get_left, get_right = left.get, right.get
    both_strings = left.tag == "P" and right.tag == "P"
    compare = _strings_as_doubles if both_strings else _runtime_compare(left, right)

    def ordering(p: Props, _tags: object = None) -> bool | None:
        lv = get_left(p)
        if lv is None:
            return None
        rv = get_right(p)
        if rv is None:
            return None
        return test(compare(lv, rv))

    return ordering


def _is_null(operand: _Value, negated: bool) -> Condition:
    if operand.tag == "P":
        name = operand.name
        if negated:
            return lambda p, _tags=None: p.get(name) is not None
        return lambda p, _tags=None: p.get(name) is None
    get = operand.get
    if negated:
        return lambda p, _tags=None: get(p) is not None
    return lambda p, _tags=None: get(p) is None


def _in(name: str, values: frozenset[str], negated: bool) -> Condition:
    if negated:
        def not_in(p: Props, _tags: object = None) -> bool | None:
            v = p.get(name)
            return None if v is None else v not in values

        return not_in

    def in_list(p: Props, _tags: object = None) -> bool | None:
        v = p.get(name)
        return None if v is None else v in values

    return in_list


def _string_match(op: str, operand: _Value, search: str, negated: bool) -> Condition:
    """Missing or non-string operand, or an empty search string: FALSE for the NOT forms too.
    An empty search is FALSE without evaluating the operand (RocketMQ checks it first)."""
    if not search:
        return lambda _p, _tags=None: False
    test: Callable[[str], bool] = {
        "CONTAINS": lambda s: search in s,
        "STARTSWITH": lambda s: s.startswith(search),
        "ENDSWITH": lambda s: s.endswith(search),
    }[op]
    get = operand.get

    def string_match(p: Props, _tags: object = None) -> bool:
        v = get(p)
        if not isinstance(v, str):
            return False
        return test(v) != negated

    return string_match
