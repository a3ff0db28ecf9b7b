"""filter_sql building blocks: Java number rules, the lexer's longest match, the bloom pre-check."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.conformance.filters import default_message_strategy, sql92_expressions
from plugmq.core import FilterEvaluationError, FilterSyntaxError
from plugmq.plugins.filter_sql import COMPILER, property_bloom
from plugmq.plugins.filter_sql.bloom import name_bits
from plugmq.plugins.filter_sql.interpreter import interpret
from plugmq.plugins.filter_sql.javanum import (
    java_boolean_value_of,
    java_double_compare,
    java_double_value_of,
    java_integer_value_of,
    java_long_value_of,
)
from plugmq.plugins.filter_sql.lexer import Kind, TokenStream

# ------------------------------------------------------------------------------- Double.valueOf


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e3", 1000.0),
        ("10f", 10.0),
        ("10d", 10.0),
        ("10D", 10.0),
        ("1.1f", 1.1),  # parsed as a double: the suffix does not round to float
        (" 5 ", 5.0),
        ("\x00\t5\x1f", 5.0),  # String.trim() removes every char <= U+0020
        ("5.", 5.0),
        (".5", 0.5),
        ("+.5e-1", 0.05),
        ("-0", -0.0),
        ("Infinity", math.inf),
        ("+Infinity", math.inf),
        ("-Infinity", -math.inf),
        ("0x1p3", 8.0),
        ("0X1.8P1", 3.0),
        ("-0x.8p1d", -1.0),
        ("0x1P-1074", 5e-324),
        ("0x1p1024", math.inf),
        ("0x1p-99999999999999999999", 0.0),
        ("1e400", math.inf),
        ("1e-400", 0.0),
        ("00012.50", 12.5),
    ],
)
def test_double_value_of_accepts_what_java_accepts(text: str, value: float) -> None:
    got = java_double_value_of(text)
    assert got == value and math.copysign(1, got) == math.copysign(1, value)


@pytest.mark.parametrize("text", ["NaN", "+NaN", "-NaN", " NaN "])
def test_double_value_of_nan(text: str) -> None:
    assert math.isnan(java_double_value_of(text))


@pytest.mark.parametrize(
    "text",
    ["", " ", "+", "-", ".", "e3", "1e", "1e+", "1_0", "1,5", "inf", "nan", "infinity", "NaNd", "Infinityf", "0x1",
     "0x1.8", "0xp3", "1.2.3", "5ff", "\u0665", "1 0", "1e3.5", "0x1p3x", "++1"],
)
def test_double_value_of_refuses_what_java_refuses(text: str) -> None:
    with pytest.raises(FilterEvaluationError):
        java_double_value_of(text)


@given(st.floats(allow_nan=False))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_double_value_of_round_trips_python_repr(value: float) -> None:
    text = repr(value).replace("inf", "Infinity")
    assert java_double_value_of(text) == value


# ----------------------------------------------------------------------- Integer/Long.valueOf


@pytest.mark.parametrize(
    "text, value",
    [("5", 5), ("+5", 5), ("-5", -5), ("007", 7), ("2147483647", 2**31 - 1), ("-2147483648", -(2**31)),
     ("0000000000000000000000042", 42), ("\u0665", 5), ("\uff15", 5)],
)
def test_integer_value_of(text: str, value: int) -> None:
    assert java_integer_value_of(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "+", "-", " 5", "5 ", "5.0", "2147483648", "-2147483649", "abc", "0x5", "1_0", "5L", "\U0001d7d3", "٥.5"],
)
def test_integer_value_of_refuses(text: str) -> None:
    with pytest.raises(FilterEvaluationError):
        java_integer_value_of(text)


def test_long_value_of_range() -> None:
    assert java_long_value_of("9223372036854775807") == 2**63 - 1
    assert java_long_value_of("-9223372036854775808") == -(2**63)
    for text in ("9223372036854775808", "-9223372036854775809", "1" * 5000):
        with pytest.raises(FilterEvaluationError):
            java_long_value_of(text)


def test_boolean_value_of() -> None:
    assert java_boolean_value_of("true") and java_boolean_value_of("TRUE") and java_boolean_value_of("tRuE")
    for text in ("", "yes", "1", " true", "true ", "truee", "t"):
        assert java_boolean_value_of(text) is False


def test_double_compare_is_javas_total_order() -> None:
    nan = math.nan
    assert java_double_compare(nan, math.inf) == 1
    assert java_double_compare(math.inf, nan) == -1
    assert java_double_compare(nan, nan) == 0
    assert java_double_compare(-0.0, 0.0) == -1
    assert java_double_compare(0.0, -0.0) == 1
    assert java_double_compare(0.0, 0.0) == 0
    assert java_double_compare(1.0, 2.0) == -1


# ------------------------------------------------------------------------------------- lexer


def kinds(text: str) -> list[tuple[Kind, str]]:
    stream = TokenStream(text)
    out: list[tuple[Kind, str]] = []
    while (token := stream.next()).kind is not Kind.EOF:
        out.append((token.kind, token.text))
    return out


def test_lexer_longest_match_like_javacc() -> None:
    assert kinds("5e3") == [(Kind.DECIMAL, "5e3")]
    assert kinds("012") == [(Kind.INTEGER, "0"), (Kind.INTEGER, "12")]
    assert kinds("012.5") == [(Kind.DECIMAL, "012.5")]
    assert kinds("5L 0L") == [(Kind.INTEGER, "5L"), (Kind.INTEGER, "0"), (Kind.ID, "L")]
    assert kinds("1e") == [(Kind.INTEGER, "1"), (Kind.ID, "e")]
    assert kinds("INx IN") == [(Kind.ID, "INx"), (Kind.KEYWORD, "IN")]
    assert kinds("<><=>=") == [(Kind.PUNCT, "<>"), (Kind.PUNCT, "<="), (Kind.PUNCT, ">=")]
    assert kinds("'a''b'") == [(Kind.STRING, "'a''b'")]
    assert kinds("a--x\nb") == [(Kind.ID, "a"), (Kind.ID, "b")]
    assert kinds("a--x") == [(Kind.ID, "a"), (Kind.PUNCT, "-"), (Kind.PUNCT, "-"), (Kind.ID, "x")]
    assert kinds("--5\r") == []


def test_lexer_errors_are_reported_lazily_in_reading_order() -> None:
    # The '=' at 4 is the first problem; the '#' after it is never reached.
    with pytest.raises(FilterSyntaxError) as info:
        COMPILER.compile("a = = #")
    assert info.value.position == 4
    with pytest.raises(FilterSyntaxError) as info:
        COMPILER.compile("a = 'x' AND b # 1")
    assert info.value.position == 14


# ------------------------------------------------------------------------------------- bloom


def test_property_bloom_is_stable_across_processes() -> None:
    # CRC-32 of the UTF-8 name, three 6-bit slices: fixed, so brokers and stored blooms agree.
    assert name_bits("a") == 0x0A00000000000008
    assert property_bloom({"a": "1"}) == 0x0A00000000000008
    assert property_bloom({}) == 0
    assert property_bloom({}, "TagA") == name_bits("TAGS")
    assert 0 <= property_bloom({f"p{i}": "" for i in range(100)}) < 2**64


@pytest.mark.parametrize(
    "expression, required",
    [
        ("a = 5", {"a"}),
        ("5 = a", {"a"}),
        ("a = b", set()),
        ("a <> b", {"a"}),
        ("a IS NULL", set()),
        ("a IS NOT NULL", {"a"}),
        ("NOT a IS NULL", set()),
        ("a > 5 AND b IN ('x') AND c IS NOT NULL", {"a", "b", "c"}),
        ("a > 5 OR b > 5", set()),
        ("(a > 5 AND c = 'x') OR (b > 5 AND c = 'y')", {"c"}),
        ("NOT (a = 'x' OR b = 'y')", {"a", "b"}),
        ("a BETWEEN 1 AND b", {"a", "b"}),
        ("a NOT BETWEEN 1 AND 5", {"a"}),
        ("a CONTAINS 'x'", {"a"}),
        ("a NOT CONTAINS 'x'", {"a"}),
        ("NOT a CONTAINS 'x'", set()),
        ("NOT (a CONTAINS 'x')", set()),
        ("TRUE", set()),
        ("TAGS IN ('A')", {"TAGS"}),
    ],
)
def test_required_properties_follow_rocketmq_null_rules(expression: str, required: set[str]) -> None:
    assert set(COMPILER.compile(expression).required_properties) == required


def test_precheck_bloom_rejects_only_when_a_required_property_is_surely_absent() -> None:
    flt = COMPILER.compile("a > 5 AND b IN ('x')")
    assert flt.precheck_bloom(property_bloom({"a": "6", "b": "x"})) is True
    assert flt.precheck_bloom(property_bloom({"a": "6"})) is False
    assert flt.precheck_bloom(property_bloom({})) is False
    assert COMPILER.compile("a = b").precheck_bloom(0) is True  # both missing is TRUE
    tags_filter = COMPILER.compile("TAGS IN ('A')")
    assert tags_filter.precheck_bloom(property_bloom({}, "A")) is True
    assert tags_filter.precheck_bloom(property_bloom({})) is False
    assert flt.property_bloom is property_bloom


# ------------------------------------------------- compiled closures vs a plain tree walk


@given(
    expression=sql92_expressions(),
    messages=st.lists(default_message_strategy(), max_size=6),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_closures_agree_with_the_tree_walking_interpreter(expression: str, messages: list) -> None:
    # The compiler's fast paths (property vs literal, n-ary AND/OR, ...) must give exactly what
    # the generic walk over the same tree gives, errors included.
    flt = COMPILER.compile(expression)
    for properties, _tags in messages:
        outcomes: list[bool | str | None] = []  # a result, or "error"
        for evaluate in (flt.evaluate, lambda p: interpret(flt.tree, p)):
            try:
                outcomes.append(evaluate(properties))
            except FilterEvaluationError:
                outcomes.append("error")
        assert outcomes[0] is outcomes[1] or outcomes[0] == outcomes[1] == "error", (expression, properties, outcomes)


# ------------------------------------------------------------------------------- number memo


def test_number_memo_remembers_successes_only_and_stays_bounded() -> None:
    from plugmq.plugins.filter_sql.javanum import NumberMemo

    memo = NumberMemo(java_integer_value_of, limit=3)
    assert memo.get("5") is None
    assert memo.convert("5") == 5 and memo.get("5") == 5
    with pytest.raises(FilterEvaluationError):
        memo.convert("5.0")
    assert memo.get("5.0") is None  # a refused string raises again next time
    for text in ("1", "2", "3", "4"):
        assert memo.convert(text) == int(text)
    assert len(memo) == 3 and memo.get("4") is None  # full: new strings are parsed, not kept


@pytest.mark.parametrize("expression, source_counts", [
    ("a > 5 AND a < 10", (1, 1)),
    ("a BETWEEN 2 AND 8", (1, 1)),
    ("a IS NOT NULL AND a > 3 AND a <> 7 AND b = 'x'", (2, 1)),
    ("a = 5 OR a > 5000000000 OR a < 2", (1, 2)),  # an Integer and a Long conversion of a
])
def test_chain_looks_up_and_converts_each_property_once(expression: str, source_counts: tuple[int, int]) -> None:
    """Within one evaluation a property is fetched once and converted once per Java type, and
    the results still equal the interpreter's on numbers, non-numbers and missing values."""
    flt = COMPILER.compile(expression)
    source = getattr(flt.matches, "source", None) or flt.evaluate.source  # type: ignore[attr-defined]
    gets, conversions = source_counts
    assert source.count("= get(") == gets and source.count(" = M_") == conversions, source
    for a in ("3", "5", "9", "11", "abc", "5.0", " 5", "99999999999", "-7", "٣", None):
        for b in ("x", None):
            props = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
            try:
                expected = interpret(flt.tree, props)
            except FilterEvaluationError:
                with pytest.raises(FilterEvaluationError):
                    flt.evaluate(props)
                assert flt.matches(props) is False
                continue
            assert flt.evaluate(props) is expected, (expression, props)
            assert flt.matches(props) is (expected is True)
