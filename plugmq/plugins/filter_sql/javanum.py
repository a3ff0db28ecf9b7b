"""Java's number parsing and comparison, bit for bit, for RocketMQ-identical filter results.

RocketMQ converts a string property to the type of the literal it is compared with using
``Integer.valueOf``, ``Long.valueOf``, ``Double.valueOf`` and ``Boolean.valueOf``, and compares
with ``compareTo``. Python's ``int()``/``float()`` accept other inputs (``" 5"``, ``"1_0"``,
``"inf"``) and order NaN and -0.0 differently, so each rule is written out here.

Every conversion failure raises :class:`FilterEvaluationError` (RocketMQ's NumberFormatException
becomes an evaluation error, which means "no match").
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from plugmq.core.errors import FilterEvaluationError

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "LONG_MAX",
    "LONG_MIN",
    "MEMOS",
    "NumberMemo",
    "java_boolean_value_of",
    "java_double_compare",
    "java_double_value_of",
    "java_integer_value_of",
    "java_long_value_of",
    "make_compare",
]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# String.trim() removes every char <= U+0020 at both ends (control characters too).
_JAVA_TRIM = "".join(chr(c) for c in range(0x21))

# FloatingDecimal.readJavaFormatString's decimal form, after trim: sign, digits with at most one
# point (at least one digit), optional exponent with at least one digit, one optional f/F/d/D.
_DECIMAL = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")
# FloatingDecimal.parseHexString's pattern (binary exponent mandatory).
_HEX = re.compile(r"([+-]?)0[xX](?:([0-9a-fA-F]+)\.?|([0-9a-fA-F]*)\.([0-9a-fA-F]+))[pP]([+-]?[0-9]+)[fFdD]?")


def _parse_java_int(text: str, lo: int, hi: int, what: str) -> int:
    """Integer.parseInt / Long.parseLong with radix 10: optional sign, then decimal digits only."""
    body = text
    sign = 1
    if body[:1] in ("+", "-"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if not body:
        raise FilterEvaluationError(f"For input string: {text!r} (not a Java {what})")
    if not (body.isascii() and body.isdigit()):
        # Character.digit accepts any Unicode decimal digit, but Java walks UTF-16 chars, so a
        # digit outside the BMP (a surrogate pair) is not one.
        digits = []
        for ch in body:
            value = unicodedata.decimal(ch, None) if ord(ch) <= 0xFFFF else None
            if value is None:
                raise FilterEvaluationError(f"For input string: {text!r} (not a Java {what})")
            digits.append(str(value))
        body = "".join(digits)
    body = body.lstrip("0") or "0"
    # Leading zeros are legal in Java; past them, more than 19 digits cannot fit a long (and
    # would trip Python's int() digit limit on hostile input).
    if len(body) > 19:
        raise FilterEvaluationError(f"For input string: {text!r} (out of range for a Java {what})")
    value = sign * int(body)
    if not lo <= value <= hi:
        raise FilterEvaluationError(f"For input string: {text!r} (out of range for a Java {what})")
    return value


def java_integer_value_of(text: str) -> int:
    """``Integer.valueOf(text)``: "5" and "-5" parse; "5.0", " 5", "3000000000", "abc" fail."""
    if text.isascii() and text.isdigit() and len(text) <= 9:
        return int(text)  # the common case: short plain digits always fit 32 bits
    return _parse_java_int(text, INT_MIN, INT_MAX, "int")


def java_long_value_of(text: str) -> int:
    """``Long.valueOf(text)``: like Integer.valueOf, over the 64-bit range."""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return _parse_java_int(text, LONG_MIN, LONG_MAX, "long")


def java_double_value_of(text: str) -> float:
    """``Double.valueOf(text)``.

    Trims chars <= U+0020, then accepts an optionally signed decimal ("1e3", "5.", ".5") with an
    optional f/F/d/D suffix ("10f" is the double 10.0, not a float), "NaN", "Infinity", and hex
    floats with a binary exponent ("0x1p3" = 8.0). Out-of-range values become +-Infinity or
    +-0.0 as in Java.
    """
    trimmed = text.strip(_JAVA_TRIM)
    match = _DECIMAL.fullmatch(trimmed)
    if match is not None:
        return float(match.group(1))  # Python's float() is correctly rounded, like Java 8+
    body = trimmed[1:] if trimmed[:1] in ("+", "-") else trimmed
    negative = trimmed[:1] == "-"
    if body == "NaN":
        return math.nan
    if body == "Infinity":
        return -math.inf if negative else math.inf
    hexmatch = _HEX.fullmatch(trimmed)
    if hexmatch is not None:
        return _hex_value(hexmatch)
    raise FilterEvaluationError(f"For input string: {text!r} (not a Java double)")


def _hex_value(match: re.Match[str]) -> float:
    sign, whole_only, whole, fraction, exponent = match.groups()
    if whole_only is not None:
        whole, fraction = whole_only, ""
    mantissa = int((whole or "0") + fraction, 16)
    negative = sign == "-"
    infinity, zero = (-math.inf, -0.0) if negative else (math.inf, 0.0)
    if mantissa == 0:
        return zero
    exp_digits = exponent.lstrip("+-").lstrip("0")
    if len(exp_digits) > 12:  # beyond any double either way; Java gives Infinity or zero too
        return zero if exponent.startswith("-") else infinity
    exp = int(exponent) - 4 * len(fraction)
    top = mantissa.bit_length() + exp
    if top > 1100:
        return infinity
    if top < -1200:
        return zero
    try:
        return float.fromhex(f"{'-' if negative else ''}0x{mantissa:x}p{exp}")
    except OverflowError:
        return infinity


class NumberMemo:
    """One Java conversion of property strings, remembered per string.

    A conversion depends on the string alone, and property values repeat across messages (codes,
    levels, small counters), so a value is parsed once, not once per message and comparison. The
    memo is bounded: once full it keeps what it has and new strings are parsed each time (a
    stream of unique values then costs one extra lookup). Failures are not remembered (they
    raise each time, as the conversion does). ``get`` is the plain ``dict.get`` (None when not
    known), ``parse`` the conversion, ``remember(text, value)`` stores while there is room and
    ``convert`` parses and remembers.
    """

    __slots__ = ("_known", "get", "limit", "parse")

    def __init__(self, convert: Callable[[str], Any], limit: int = 8192) -> None:
        self._known: dict[str, Any] = {}
        self.limit = limit
        self.get = self._known.get
        self.parse = convert

    def remember(self, text: str, value: Any) -> None:
        known = self._known
        if len(known) < self.limit:
            known[text] = value

    def convert(self, text: str) -> Any:
        value = self.parse(text)  # raises FilterEvaluationError for a string Java refuses
        self.remember(text, value)
        return value

    def __len__(self) -> int:
        return len(self._known)


def java_boolean_value_of(text: str) -> bool:
    """``Boolean.valueOf(text)``: "true" in any case is true, anything else false; never fails."""
    return len(text) == 4 and text.lower() == "true"


def java_double_compare(a: float, b: float) -> int:
    """``Double.compare``: a total order where -0.0 < 0.0 and NaN is above +Infinity (NaN == NaN)."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan = math.isnan(a)
    b_nan = math.isnan(b)
    if a_nan or b_nan:
        return 0 if a_nan and b_nan else (1 if a_nan else -1)
    if a == 0.0:
        sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
        return 0 if sa == sb else (-1 if sa < 0 else 1)
    return 0


def _int_compare(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _bool_compare(a: bool, b: bool) -> int:
    return 0 if a == b else (1 if a else -1)


def _str_compare(a: str, b: str) -> int:
    # Only equality of strings is ever observable (ordering of two strings goes through
    # Double.valueOf first), so code-point order is as good as Java's UTF-16 order here.
    return (a > b) - (a < b)


def _left_smaller(_a: Any, _b: Any) -> int:
    return -1


def _bool_vs_string(_a: Any, b: Any) -> int:
    # RocketMQ casts the Boolean left value to String here and fails with ClassCastException.
    raise FilterEvaluationError(f"a boolean cannot be compared with the string {b!r}")


Compare = Callable[[Any, Any], int]

# Runtime types: S string, I Integer, L Long, D Double, B Boolean (RocketMQ's value classes).
_SAME: dict[str, Compare] = {
    "S": _str_compare,
    "I": _int_compare,
    "L": _int_compare,
    "D": java_double_compare,
    "B": _bool_compare,
}


_MIXED: dict[str, Compare] = {
    "BS": _bool_vs_string,
    "IL": _int_compare,
    "LI": _int_compare,
    "ID": lambda a, b: java_double_compare(float(a), b),
    "LD": lambda a, b: java_double_compare(float(a), b),
    "DI": lambda a, b: java_double_compare(a, float(b)),
    "DL": lambda a, b: java_double_compare(a, float(b)),
    "IS": lambda a, b: _int_compare(a, java_integer_value_of(b)),
    "LS": lambda a, b: _int_compare(a, java_long_value_of(b)),
    "DS": lambda a, b: java_double_compare(a, java_double_value_of(b)),
    "SB": lambda a, b: _bool_compare(java_boolean_value_of(a), b),
    "SI": lambda a, b: _int_compare(java_integer_value_of(a), b),
    "SL": lambda a, b: _int_compare(java_long_value_of(a), b),
    "SD": lambda a, b: java_double_compare(java_double_value_of(a), b),
}


def make_compare(left: str, right: str) -> Compare:
    """RocketMQ's ``ComparisonExpression.__compare`` for values of the given runtime types.

    Mixed types are converted the way Java widens them (int -> long -> double); a string meeting
    a typed value is parsed to that type; pairs with no conversion compare as "left is smaller".
    """
    if left == right:
        return _SAME[left]
    return _MIXED.get(left + right, _left_smaller)


#: The process-wide memos of the three number conversions a comparison with a literal needs.
MEMOS: dict[str, NumberMemo] = {
    "I": NumberMemo(java_integer_value_of),
    "L": NumberMemo(java_long_value_of),
    "D": NumberMemo(java_double_value_of),
}
