"""AND / OR chains as one generated Python function, with simple operands inlined.

Most subscriptions are an AND/OR of simple tests on properties (``a > 5``, ``b IN (...)``,
``c IS NOT NULL``). Calling one closure per test costs a Python call each; here the chain becomes
a single function whose body performs the simple tests inline and calls the compiled closure
only for the other operands. Short-circuit order and three-valued results are exactly those of
the closure tree (left to right; FALSE stops an AND, TRUE stops an OR).

Within one evaluation each property is looked up once and converted to each Java number type
once, however many operands of the chain test it (``a > 5 AND a < 10``, BETWEEN); the
conversion itself goes through a process-wide memo of strings already parsed
(:class:`javanum.NumberMemo`), so a value seen before costs one dictionary lookup.

No text of the expression reaches the generated source: property names, literals and closures
are handed to it as generated global names (``N0``, ``K0``, ``F0``...), so an expression cannot
inject code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from plugmq.core.errors import FilterEvaluationError
from plugmq.plugins.filter_sql import nodes
from plugmq.plugins.filter_sql.javanum import MEMOS

__all__ = ["generate_logic"]

_MEMO_TAG = {nodes.JType.INT: "I", nodes.JType.LONG: "L"}
_FAST_DIGITS = {"I": 9, "L": 18}  # up to this many ASCII digits always parse and fit the type
_PY_OP = {"=": "==", "<>": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<="}
_INLINE_LIMIT = 8  # beyond this many operands, track "unknown" with a flag instead of one test


class _Locals:
    """The property values and converted numbers a generated chain has computed so far: every
    statement of a chain runs before the next operand's, so a later operand may reuse them."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self._ns = ns
        self._values: dict[str, str] = {}
        self._numbers: dict[tuple[str, str], str] = {}

    def value(self, name: str, body: list[str]) -> str:
        """The local holding property ``name`` (looked up on first use)."""
        var = self._values.get(name)
        if var is None:
            var = self._values[name] = f"p{len(self._values)}"
            self._ns[f"N_{var}"] = name
            body.append(f"{var} = get(N_{var})")
        return var

    def number(self, name: str, tag: str, body: list[str]) -> str:
        """The local holding property ``name`` as a Java ``tag`` number (None when missing);
        converted on first use, through the memo of strings already parsed."""
        key = (name, tag)
        var = self._numbers.get(key)
        if var is None:
            value = self.value(name, body)
            var = self._numbers[key] = f"n{len(self._numbers)}"
            memo = MEMOS[tag]
            self._ns[f"M_{var}"], self._ns[f"C_{var}"], self._ns[f"R_{var}"] = memo.get, memo.parse, memo.remember
            # Known strings cost one lookup; a new one is parsed inline when it is plain digits
            # that always fit the type (else by the Java rules) and remembered while there is room.
            body += [
                f"if {value} is None: {var} = None",
                "else:",
                f"    {var} = M_{var}({value})",
                f"    if {var} is None:",
                f"        {var} = int({value}) if len({value}) <= {_FAST_DIGITS[tag]} and {value}.isdigit() "
                f"and {value}.isascii() else C_{var}({value})",
                f"        R_{var}({value}, {var})",
            ]
        return var


def _inline(node: nodes.Node, i: int, ns: dict[str, Any], local: _Locals, body: list[str]) -> bool:
    """Append statements setting ``r{i}`` for a simple operand; False when it needs its closure."""
    if isinstance(node, nodes.IsNull) and isinstance(node.operand, nodes.Property):
        value = local.value(node.operand.name, body)
        body.append(f"r{i} = {value} is {'not ' if node.negated else ''}None")
        return True
    if isinstance(node, nodes.BooleanCast):
        value = local.value(node.operand.name, body)
        body.append(f"r{i} = None if {value} is None else False")  # a string is never a Boolean
        return True
    if isinstance(node, nodes.In):
        value = local.value(node.operand.name, body)
        ns[f"K{i}"] = frozenset(node.values)
        body.append(f"r{i} = None if {value} is None else {value} {'not in' if node.negated else 'in'} K{i}")
        return True
    if (isinstance(node, nodes.Compare) and isinstance(node.left, nodes.Property)
            and isinstance(node.right, nodes.Constant)):
        ns[f"K{i}"] = node.right.value
        op = _PY_OP[node.op]
        jtype = node.right.jtype
        if jtype is nodes.JType.STRING and node.op in ("=", "<>"):
            value = local.value(node.left.name, body)
            body.append(f"r{i} = None if {value} is None else {value} {op} K{i}")
            return True
        if jtype in _MEMO_TAG:
            number = local.number(node.left.name, _MEMO_TAG[jtype], body)
            body.append(f"r{i} = None if {number} is None else {number} {op} K{i}")
            return True
    return False


def generate_logic(op: str, operands: Sequence[nodes.Node], compile_operand: Callable[[nodes.Node], Callable[..., Any]],
                   *, as_matches: bool = False) -> Callable[..., Any]:
    """One function evaluating ``operands[0] op operands[1] op ...`` (op is AND or OR).

    With ``as_matches`` the function is ``Filter.matches`` itself: True only for a TRUE result,
    False for FALSE, unknown or an evaluation error (saving the wrapper call per message).
    """
    stop = "False" if op == "AND" else "True"  # the value that decides the chain at once
    rest = "True" if op == "AND" else "False"
    ns: dict[str, Any] = {"__builtins__": {}, "int": int, "len": len, "FilterEvaluationError": FilterEvaluationError}
    body = ["get = p.get"]
    local = _Locals(ns)
    many = len(operands) > _INLINE_LIMIT
    if many:
        body.append("unknown = False")
    for i, node in enumerate(operands):
        if not _inline(node, i, ns, local, body):
            ns[f"F{i}"] = compile_operand(node)
            body.append(f"r{i} = F{i}(p)")
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
    return function
