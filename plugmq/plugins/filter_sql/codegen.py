"""AND / OR chains as one generated Python function, with simple operands inlined.

Most subscriptions are an AND/OR of simple tests on properties (``a > 5``, ``b IN (...)``,
``c IS NOT NULL``). Calling one closure per test costs a Python call each; here the chain becomes
a single function whose body performs the simple tests inline and calls the compiled closure
only for the other operands. Short-circuit order and three-valued results are exactly those of
the closure tree (left to right; FALSE stops an AND, TRUE stops an OR).

No text of the expression reaches the generated source: property names, literals and closures
are handed to it as generated global names (``N0``, ``K0``, ``F0``...), so an expression cannot
inject code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugmq.core.errors import FilterEvaluationError
from plugmq.plugins.filter_sql.javanum import java_integer_value_of, java_long_value_of
from plugmq.plugins.filter_sql.nodes import (
    BooleanCast,
    Compare,
    Constant,
    In,
    IsNull,
    JType,
    Node,
    Property,
)

__all__ = ["generate_logic"]

# Up to this many ASCII digits always parse and fit the type, so int() is exact and Java-safe.
_FAST_DIGITS = {JType.INT: 9, JType.LONG: 18}
_CONVERT = {JType.INT: java_integer_value_of, JType.LONG: java_long_value_of}
_PY_OP = {"=": "==", "<>": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<="}
_INLINE_LIMIT = 8  # beyond this many operands, track "unknown" with a flag instead of one test


def _inline(node: Node, i: int, ns: dict[str, Any]) -> list[str] | None:
    """Statements setting ``r{i}`` for a simple operand, or None when it needs its closure."""
    if isinstance(node, IsNull) and isinstance(node.operand, Property):
        ns[f"N{i}"] = node.operand.name
        return [f"r{i} = get(N{i}) is {'not ' if node.negated else ''}None"]
    if isinstance(node, BooleanCast):
        ns[f"N{i}"] = node.operand.name
        return [f"r{i} = None if get(N{i}) is None else False"]  # a string is never a Boolean
    if isinstance(node, In):
        ns[f"N{i}"], ns[f"K{i}"] = node.operand.name, frozenset(node.values)
        return [f"v = get(N{i})", f"r{i} = None if v is None else v {'not in' if node.negated else 'in'} K{i}"]
    if isinstance(node, Compare) and isinstance(node.left, Property) and isinstance(node.right, Constant):
        ns[f"N{i}"], ns[f"K{i}"] = node.left.name, node.right.value
        op = _PY_OP[node.op]
        jtype = node.right.jtype
        if jtype is JType.STRING and node.op in ("=", "<>"):
            return [f"v = get(N{i})", f"r{i} = None if v is None else v {op} K{i}"]
        if jtype in _FAST_DIGITS:
            ns[f"C{i}"] = _CONVERT[jtype]
            limit = _FAST_DIGITS[jtype]
            parse = f"(int(v) if len(v) <= {limit} and v.isdigit() and v.isascii() else C{i}(v))"
            return [f"v = get(N{i})", f"r{i} = None if v is None else {parse} {op} K{i}"]
    return None


def generate_logic(op: str, operands: list[Node], compile_operand: Callable[[Node], Callable[..., Any]],
                   *, as_matches: bool = False) -> Callable[..., Any]:
    """One function evaluating ``operands[0] op operands[1] op ...`` (op is AND or OR).

    With ``as_matches`` the function is ``Filter.matches`` itself: True only for a TRUE result,
    False for FALSE, unknown or an evaluation error (saving the wrapper call per message).
    """
    stop = "False" if op == "AND" else "True"  # the value that decides the chain at once
    rest = "True" if op == "AND" else "False"
    ns: dict[str, Any] = {"__builtins__": {}, "int": int, "len": len, "FilterEvaluationError": FilterEvaluationError}
    body = ["get = p.get"]
    many = len(operands) > _INLINE_LIMIT
    if many:
        body.append("unknown = False")
    for i, node in enumerate(operands):
        statements = _inline(node, i, ns)
        if statements is None:
            ns[f"F{i}"] = compile_operand(node)
            statements = [f"r{i} = F{i}(p)"]
        body.extend(statements)
        body.append(f"if r{i} is {stop}: return {stop}")
        if many:
            body.append(f"if r{i} is None: unknown = True")
    unknown = "unknown" if many else " or ".join(f"r{i} is None" for i in range(len(operands)))
    if not as_matches:
        body.append(f"return None if {unknown} else {rest}")
        source = "def logic(p, _tags=None):\n" + "".join(f"    {line}\n" for line in body)
    else:
        body.append(f"return False if {unknown} else {rest}")
        source = ("def logic(p, _tags=None):\n    try:\n" + "".join(f"        {line}\n" for line in body)
                  + "    except FilterEvaluationError:\n        return False\n")
    exec(compile(source, f"<filter_sql {op}>", "exec"), ns)
    function = ns["logic"]
    function.source = source  # for debugging a subscription
    return function  # type: ignore[no-any-return]
