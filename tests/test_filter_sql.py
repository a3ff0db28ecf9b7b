"""filter_sql against shared/spec/sql92.md: one table (or test) per rule of the spec.

Each row is (expression, properties, expected) where expected is True / False / None (unknown)
or ERR (evaluate raises FilterEvaluationError). Syntax errors are tables of (expression,
position of the offending token).
"""

from __future__ import annotations

import pytest

from plugmq.core import Filter, FilterCompiler, FilterEvaluationError, FilterSyntaxError
from plugmq.plugins.filter_sql import (
    COMPILER,
    SqlFilter,
    plugmq_declare,
    plugmq_filter_compilers,
)

ERR = "error"


def run(expression: str, props: dict[str, str] | None = None) -> object:
    flt = COMPILER.compile(expression)
    try:
        return flt.evaluate(props or {})
    except FilterEvaluationError:
        return ERR


def check(rows: list[tuple[str, dict[str, str], object]]) -> None:
    for expression, props, expected in rows:
        assert run(expression, props) == expected, (expression, props, expected)
        # the type of the result matters too: exactly True/False/None, never a truthy stand-in
        if expected is not ERR:
            assert run(expression, props) is expected, (expression, props)


def syntax_error(expression: str) -> FilterSyntaxError:
    with pytest.raises(FilterSyntaxError) as info:
        COMPILER.compile(expression)
    return info.value


# ------------------------------------------------------------------------------ plugin surface


def test_plugin_declares_and_offers_the_sql92_compiler() -> None:
    declaration = plugmq_declare()
    assert declaration.name == "filter_sql"
    compilers = plugmq_filter_compilers()
    assert set(compilers) == {"SQL92"}
    compiler = compilers["SQL92"]
    assert isinstance(compiler, FilterCompiler)
    assert compiler.capabilities.expression_type == "SQL92"
    flt = compiler.compile("a IS NULL")
    assert isinstance(flt, Filter)
    assert flt.expression_type == "SQL92" and flt.expression == "a IS NULL"


def test_evaluation_never_walks_the_tree() -> None:
    # Compile once: the closures must not need the parsed tree per message.
    flt = COMPILER.compile("a > 5 AND b IN ('x', 'y') AND c IS NOT NULL")
    assert isinstance(flt, SqlFilter)
    flt.tree = None  # type: ignore[assignment]
    assert flt.evaluate({"a": "7", "b": "x", "c": ""}) is True
    assert flt.evaluate({"a": "7", "b": "z", "c": ""}) is False


def test_matches_is_true_only_for_true() -> None:
    flt = COMPILER.compile("a > 5")
    assert flt.matches({"a": "6"}) is True
    assert flt.matches({"a": "5"}) is False
    assert flt.matches({}) is False  # unknown
    assert flt.matches({"a": "x"}) is False  # evaluation error
    with pytest.raises(FilterEvaluationError):
        flt.evaluate({"a": "x"})
    # an AND / OR root gets a generated matches(): same contract
    chain = COMPILER.compile("a > 5 AND b = 'x'")
    assert chain.matches({"a": "6", "b": "x"}) is True
    assert chain.matches({"a": "6", "b": "y"}) is False
    assert chain.matches({"a": "6"}) is False  # unknown
    assert chain.matches({"a": "z", "b": "x"}) is False  # evaluation error
    either = COMPILER.compile("b = 'x' OR a > 5")
    assert either.matches({"b": "x", "a": "z"}) is True  # short-circuit: a is never parsed
    assert either.matches({"b": "y", "a": "z"}) is False
    assert either.matches({}) is False


def test_tags_are_the_tags_property() -> None:
    flt = COMPILER.compile("TAGS IN ('TagA', 'TagB')")
    assert flt.evaluate({}, "TagA") is True
    assert flt.evaluate({"TAGS": "TagB"}) is True
    assert flt.evaluate({}, "TagC") is False
    assert flt.evaluate({}) is None


# ------------------------------------------------------------------------- grammar and tokens


def test_keywords_are_case_insensitive() -> None:
    check([
        ("a is null", {}, True),
        ("a Is NoT nUlL", {"a": "1"}, True),
        ("a between 1 and 5", {"a": "3"}, True),
        ("a not between 1 and 5", {"a": "3"}, False),
        ("a in ('x')", {"a": "x"}, True),
        ("a not in ('x')", {"a": "x"}, False),
        ("true", {}, True),
        ("false or TrUe", {}, True),
        ("not a = 'x' or a is null", {}, True),
        ("a contains 'b'", {"a": "abc"}, True),
        ("a startswith 'a'", {"a": "abc"}, True),
        ("a endswith 'c'", {"a": "abc"}, True),
        ("a = 'x' AND tRUE", {"a": "x"}, True),
    ])


def test_identifiers_are_case_sensitive_and_allow_dollar_and_underscore() -> None:
    check([
        ("A = 'x'", {"a": "x"}, None),
        ("A = 'x'", {"A": "x"}, True),
        ("a = 'x'", {"A": "x"}, None),
        ("$a_1 = 'v'", {"$a_1": "v"}, True),
        ("_x IS NOT NULL", {"_x": ""}, True),
        ("INx = 'k'", {"INx": "k"}, True),  # longer than the keyword IN: an identifier
    ])


def test_integer_literals_are_integer_or_long_by_range() -> None:
    # The literal's type decides how a string property is converted: Integer.valueOf refuses
    # "3000000000", Long.valueOf accepts it.
    check([
        ("a = 2147483647", {"a": "2147483647"}, True),
        ("a > 5", {"a": "3000000000"}, ERR),
        ("a > 2147483648", {"a": "3000000000"}, True),
        ("a = 3000000000", {"a": "3000000000"}, True),
        ("a < 9223372036854775807", {"a": "9223372036854775806"}, True),
        ("a = 5L", {"a": "5"}, True),
    ])
    assert str(COMPILER.compile("a > 2147483648")) == "a > 2147483648L"
    assert str(COMPILER.compile("a > 2147483647")) == "a > 2147483647"


@pytest.mark.parametrize(
    "expression, position",
    [
        ("a > 9223372036854775808", 4),
        ("a > -9223372036854775808", 5),
        ("a > 99999999999999999999999", 4),
    ],
)
def test_integers_beyond_64_bits_are_syntax_errors(expression: str, position: int) -> None:
    assert syntax_error(expression).position == position


@pytest.mark.parametrize("expression", ["a > 0.0", "a > 0.", "a > .0", "a > 0e5", "a > 1e-400", "a > 2e-324"])
def test_zero_and_too_small_decimals_are_syntax_errors(expression: str) -> None:
    assert syntax_error(expression).position == 4


def test_decimal_literals_are_doubles() -> None:
    check([
        ("a > 4.9E-324", {"a": "1"}, True),
        ("a = 1.5", {"a": "1.5"}, True),
        ("a = 1.5", {"a": "15e-1"}, True),
        ("a = .5", {"a": "0.5"}, True),
        ("a = 5.", {"a": "5"}, True),
        ("a = 5e2", {"a": "500"}, True),
        ("a > 1.7976931348623157E308", {"a": "Infinity"}, True),
    ])
    syntax_error("a > 1e309")  # rounds to Infinity: RocketMQ refuses it as above Double.MAX_VALUE


def test_string_literals_use_single_quotes_and_double_them_to_escape() -> None:
    check([
        ("a = 'it''s'", {"a": "it's"}, True),
        ("a = ''''", {"a": "'"}, True),
        ("a = ''", {"a": ""}, True),
        ("a = 'x y'", {"a": "x y"}, True),
    ])
    assert syntax_error("a = 'open").position == 4
    assert syntax_error('a = "x"').position == 4


def test_boolean_and_null_literals() -> None:
    check([("TRUE", {}, True), ("FALSE", {}, False), ("NULL", {}, None), ("NOT NULL", {}, None),
           ("NOT FALSE", {}, True)])


@pytest.mark.parametrize(
    "expression, position",
    [
        ("a LIKE 'x%'", 2),
        ("a = 'x' garbage", 8),
        ("a + 1 > 2", 2),
        ("a = 'x' )", 8),
        ("a = 1 2", 6),
        ("a = 012", 5),  # JavaCC reads 0 then 12
        ("a != 1", 2),
        ("a == 1", 3),
        ("a = 'x' ESCAPE 'y'", 8),
        ("(a = 'x'", 8),
        ("", 0),
        ("a >", 3),
        ("a IS 5", 5),
        ("a IN ()", 6),
        ("a IN ('x',)", 10),
        ("a.b = 1", 1),
        ("a = 1 AND", 9),
        ("a BETWEEN 1 OR 2", 12),
    ],
)
def test_unused_input_and_bad_tokens_are_syntax_errors_with_positions(expression: str, position: int) -> None:
    err = syntax_error(expression)
    assert err.position == position, str(err)
    assert err.expression == expression


def test_syntax_errors_say_what_was_expected() -> None:
    err = syntax_error("a = 'x' garbage")
    assert err.expected and "end of input" in err.expected
    assert "garbage" in str(err)
    assert "LIKE" in str(syntax_error("a LIKE 'x%'"))
    err = syntax_error("a IN ('x'")
    assert err.expected == "')'"


def test_no_arithmetic_and_no_like() -> None:
    for expression in ("a + 1 > 2", "a - 1 > 2", "a * 2 > 2", "a / 2 > 2", "a LIKE 'x'", "a NOT LIKE 'x'"):
        syntax_error(expression)


def test_comments_are_white_space() -> None:
    check([
        ("/* lead */ a = 'x'", {"a": "x"}, True),
        ("a = 'x' -- trailing\n", {"a": "x"}, True),
        ("a = -- to the end of the line\n'x'", {"a": "x"}, True),
        ("a = -- a carriage return ends it too\r'x'", {"a": "x"}, True),
        ("-- a leading line\r\na = 'x'", {"a": "x"}, True),
        ("a /* in the middle */ = /**/ 'x'", {"a": "x"}, True),
        ("a = '--x'", {"a": "--x"}, True),  # not a comment inside a string
        ("a = '/*x*/'", {"a": "/*x*/"}, True),
        ("/* multi\nline ** */ a IS NULL", {}, True),
    ])
    assert syntax_error("a = 'x' /* open").position == 8


def test_double_minus_without_a_line_break_is_two_minus_signs() -> None:
    """RocketMQ's LINE_COMMENT needs a line break to end it; without one ``--`` is two minus signs."""
    check([
        ("a > --5", {"a": "6"}, True),
        ("a > --5", {"a": "5"}, False),
        ("a > --5", {"a": "-4"}, False),  # not a > -5
        ("a = --5", {"a": "5"}, True),
        ("a > ---5", {"a": "-4"}, True),  # three minus signs: a > -5
        ("a > --5 AND b = 'x'", {"a": "6", "b": "x"}, True),  # nothing after -- is commented out
        ("a BETWEEN --1 AND --3", {"a": "2"}, True),
    ])
    # With no line break after it, a trailing "--" note is not a comment but trailing input.
    err = syntax_error("a = 'x' -- note")
    assert err.position == 8
    # A line break later in the text makes the whole rest of the line a comment, as in RocketMQ:
    # here the comment swallows "5", leaving "a >" without a right-hand side.
    assert syntax_error("a > --5\n").position == 8


def test_unary_plus_and_minus_on_numbers() -> None:
    check([
        ("a > +5", {"a": "6"}, True),
        ("a > -5", {"a": "-4"}, True),
        ("a < -5", {"a": "-4"}, False),
        ("a = - -5", {"a": "5"}, True),
        ("a > -1.5", {"a": "-1"}, True),
        ("a = -2147483648", {"a": "3000000000"}, False),  # 2147483648 is a Long, and so is its negation
        ("a > -2147483647", {"a": "3000000000"}, ERR),  # an Integer: Integer.valueOf fails
    ])


# ----------------------------------------------------------------------------------- precedence


def test_or_binds_looser_than_and() -> None:
    props = {"a": "1", "b": "0", "c": "0"}
    check([
        ("a = '1' OR b = '1' AND c = '1'", props, True),
        ("(a = '1' OR b = '1') AND c = '1'", props, False),
        ("c = '1' AND b = '1' OR a = '1'", props, True),
    ])
    assert str(COMPILER.compile("a = '1' OR b = '1' AND c = '1'")) == "a = '1' OR (b = '1' AND c = '1')"


def test_equality_binds_looser_than_comparisons() -> None:
    check([
        ("a > 5 = TRUE", {"a": "6"}, True),
        ("a > 5 = FALSE", {"a": "6"}, False),
        ("TRUE = a > 5", {"a": "6"}, True),
        ("a IN ('x') = TRUE", {"a": "x"}, True),
        ("a BETWEEN 1 AND 3 = TRUE", {"a": "2"}, True),
        ("a > 5 IS NULL", {}, True),
    ])
    assert str(COMPILER.compile("a > 5 = TRUE")) == "(a > 5) = TRUE"


def test_not_binds_tighter_than_comparisons() -> None:
    assert str(COMPILER.compile("NOT a = 'x'")) == "(NOT a) = 'x'"
    check([
        ("NOT a = 'x'", {"a": "x"}, ERR),  # (NOT a) is a Boolean, compared with a string
        ("NOT a = 'x'", {}, None),
        ("NOT (a = 'x')", {"a": "x"}, False),
        ("NOT a IS NULL", {}, True),  # (NOT a) IS NULL: NOT of a missing property is NULL
        ("NOT a IS NULL", {"a": "x"}, False),
    ])
    assert str(COMPILER.compile("NOT a IS NULL")) == "(NOT a) IS NULL"
    for expression in ("NOT a > 5", "NOT a BETWEEN 1 AND 2", "NOT a >= 1", "NOT a < 1", "NOT a <= 1"):
        assert syntax_error(expression).position == 0


# --------------------------------------------------------------- semantic checks (syntax errors)


@pytest.mark.parametrize(
    "expression, position",
    [
        ("a > 'x'", 4),
        ("'x' < a", 0),
        ("a >= TRUE", 5),
        ("a <= FALSE", 5),
        ("a > NULL", 4),
        ("NULL < a", 0),
        ("a BETWEEN 'a' AND 'b'", 10),
        ("a BETWEEN TRUE AND TRUE", 10),
        ("a BETWEEN 1 AND 'z'", 16),
        ("a BETWEEN NULL AND 5", 10),
        ("a NOT BETWEEN 'a' AND 'b'", 14),
        ("a NOT BETWEEN 1 AND NULL", 20),
        ("a > (b = 1)", 5),
        ("(a > 1) > 2", 1),
    ],
)
def test_string_boolean_null_literals_or_conditions_cannot_be_ordered(expression: str, position: int) -> None:
    assert syntax_error(expression).position == position


def test_boolean_literal_on_the_left_needs_a_boolean_on_the_right() -> None:
    syntax_error("TRUE = 'true'")
    syntax_error("FALSE <> 5")
    syntax_error("TRUE = 1.5")
    check([
        ("'true' = TRUE", {}, True),
        ("'TRUE' = TRUE", {}, True),
        ("'yes' = TRUE", {}, False),
        ("5 = TRUE", {}, False),  # Integer vs Boolean: no conversion, "left is smaller"
        ("TRUE = TRUE", {}, True),
        ("TRUE <> FALSE", {}, True),
        ("TRUE = a", {}, False),
        ("TRUE = a", {"a": "true"}, ERR),  # RocketMQ's Boolean-vs-String comparison fails
    ])


@pytest.mark.parametrize("expression", ["a = NULL", "NULL = a", "a <> NULL", "NULL <> NULL", "TRUE = NULL", "(NULL) = a"])
def test_equality_with_a_null_literal_is_an_error(expression: str) -> None:
    err = syntax_error(expression)
    assert "IS NULL" in str(err)


def test_between_with_reversed_literal_bounds() -> None:
    assert syntax_error("a BETWEEN 5 AND 1").position == 10
    syntax_error("a BETWEEN 2.5 AND 2")
    syntax_error("a BETWEEN 3000000000 AND 5")
    check([
        ("a NOT BETWEEN 5 AND 1", {"a": "3"}, True),
        ("a BETWEEN 5 AND 5", {"a": "5"}, True),
        ("a BETWEEN 2 AND 2.5", {"a": "2"}, True),
        # negative bounds are negations, not literals: RocketMQ does not check them
        ("a BETWEEN -1 AND -5", {"a": "-3"}, False),
    ])


@pytest.mark.parametrize(
    "expression, position",
    [("a IN (1, 2)", 6), ("a IN ('x', 2)", 11), ("a IN (b)", 6), ("'x' IN ('x')", 0), ("(a = 'x') IN ('x')", 1),
     ("-a IN ('x')", 0), ("a NOT IN (TRUE)", 10)],
)
def test_in_needs_string_literals_and_a_property(expression: str, position: int) -> None:
    assert syntax_error(expression).position == position


@pytest.mark.parametrize("expression", ["5", "'x'", "-a", "1.5", "a AND 5", "'x' OR a", "NOT 5", "NOT 'x'", "(5)"])
def test_non_conditions_are_syntax_errors(expression: str) -> None:
    syntax_error(expression)


# ----------------------------------------------------------------------------------- evaluation


def test_bare_property_as_a_condition() -> None:
    check([
        ("a", {}, None),
        ("a", {"a": "true"}, False),  # a string is never a Boolean
        ("a", {"a": "x"}, False),
        ("NOT a", {"a": "x"}, True),
        ("NOT a", {"a": "true"}, True),
        ("NOT a", {}, None),
        ("a AND TRUE", {"a": "true"}, False),
        ("a OR TRUE", {}, True),
    ])


def test_equality_null_handling_is_asymmetric() -> None:
    check([
        ("a = b", {}, True),
        ("5 = a", {}, False),
        ("5 <> a", {}, True),
        ("a = 5", {}, None),
        ("a <> 5", {}, None),
        ("a = 'x'", {}, None),
        ("'x' = a", {}, False),
        ("'x' <> a", {}, True),
        ("a = b", {"a": "1"}, False),
        ("a = b", {"b": "1"}, None),
        ("a <> b", {"b": "1"}, None),
        ("a <> b", {"a": "1"}, True),
        ("a <> b", {}, False),
        ("a = b", {"a": "1", "b": "1"}, True),
    ])


@pytest.mark.parametrize(
    "value, expected",
    [("5", True), ("+5", True), ("05", True), ("5.0", ERR), (" 5", ERR), ("5 ", ERR), ("3000000000", ERR),
     ("abc", ERR), ("", ERR), ("-", ERR), ("0x5", ERR), ("5e0", ERR), ("\u0665", True)],
)
def test_string_vs_integer_literal_uses_integer_value_of(value: str, expected: object) -> None:
    assert run("a = 5", {"a": value}) == expected
    assert run("5 = a", {"a": value}) == expected  # same conversion with the literal on the left


@pytest.mark.parametrize(
    "value, expected",
    [("3000000000", True), ("+3000000000", True), ("3000000000.0", ERR), ("9223372036854775808", ERR),
     (" 3000000000", ERR)],
)
def test_string_vs_long_literal_uses_long_value_of(value: str, expected: object) -> None:
    assert run("a = 3000000000", {"a": value}) == expected


@pytest.mark.parametrize(
    "value, expected",
    [("10", True), (" 10 ", True), ("\t10\n", True), ("1e1", True), ("10f", True), ("10d", True), ("10F", True),
     ("10.0D", True), ("0x1.4p3", True), ("+10", True), ("1_0", ERR), ("ten", ERR), ("10ff", ERR), ("", ERR),
     ("inf", ERR)],
)
def test_string_vs_decimal_literal_uses_double_value_of(value: str, expected: object) -> None:
    assert run("a = 10.0", {"a": value}) == expected


def test_double_value_of_special_values_and_nan_ordering() -> None:
    check([
        ("a > 5.5", {"a": "NaN"}, True),  # NaN sorts above everything
        ("a < 5.5", {"a": "NaN"}, False),
        ("a > 1.7976931348623157E308", {"a": "NaN"}, True),
        ("a = 5.5", {"a": "NaN"}, False),
        ("a > 5.5", {"a": "Infinity"}, True),
        ("a < -5.5", {"a": "-Infinity"}, True),
        ("a > 7.5", {"a": "0x1p3"}, True),
        ("a = 1000.0", {"a": "1e3"}, True),
        ("a > 5.5", {"a": "nan"}, ERR),  # case matters for NaN
        ("a > b", {"a": "NaN", "b": "Infinity"}, True),
        ("a = b", {"a": "NaN", "b": "NaN"}, True),
    ])


def test_string_vs_boolean_literal_never_fails() -> None:
    check([
        ("a = TRUE", {"a": "true"}, True),
        ("a = TRUE", {"a": "TRUE"}, True),
        ("a = TRUE", {"a": "tRuE"}, True),
        ("a = TRUE", {"a": "yes"}, False),
        ("a = TRUE", {"a": "1"}, False),
        ("a = FALSE", {"a": "anything"}, True),
        ("a = FALSE", {"a": ""}, True),
        ("a <> TRUE", {"a": "x"}, True),
    ])


def test_two_strings_equal_as_text_and_order_as_doubles() -> None:
    check([
        ("a = b", {"a": "10", "b": "10.0"}, False),
        ("a = '10'", {"a": "10.0"}, False),
        ("a = 'X'", {"a": "x"}, False),
        ("a < b", {"a": "1e1", "b": "20"}, True),
        ("a >= b", {"a": "10", "b": "10.0"}, True),
        ("a < b", {"a": "x", "b": "1"}, ERR),
        ("a < b", {"a": "1", "b": "x"}, ERR),
        ("a < b", {"a": " 1 ", "b": "2"}, True),
    ])


def test_missing_values_in_ordering_and_between_are_null() -> None:
    check([
        ("a > 5", {}, None),
        ("5 > a", {}, None),
        ("a > b", {"a": "1"}, None),
        ("a > b", {"b": "1"}, None),
        ("a BETWEEN 1 AND 5", {}, None),
        ("a NOT BETWEEN 1 AND 5", {}, None),
        ("a BETWEEN b AND 5", {"a": "1"}, None),
        ("a > -b", {"a": "1", "b": "1"}, None),  # negating a string gives NULL
    ])


def test_mismatched_types_compare_as_left_is_smaller() -> None:
    from plugmq.plugins.filter_sql.javanum import make_compare

    assert make_compare("B", "I")(True, 5) == -1
    assert make_compare("I", "B")(5, True) == -1
    assert make_compare("D", "B")(1.0, False) == -1
    check([
        ("(a = 'x') = 5", {"a": "x"}, False),
        ("(a = 'x') <> 5", {"a": "x"}, True),
        ("5 = (a = 'x')", {"a": "x"}, False),
        ("1.5 <> (a = 'x')", {"a": "y"}, True),
        ("(a = 'x') = 5", {}, None),
    ])


def test_between_is_and_of_ge_and_le_and_not_between_is_or_of_lt_and_gt() -> None:
    check([
        ("a BETWEEN 1 AND 5", {"a": "1"}, True),
        ("a BETWEEN 1 AND 5", {"a": "5"}, True),
        ("a BETWEEN 1 AND 5", {"a": "0"}, False),
        ("a BETWEEN 1 AND 5", {"a": "6"}, False),
        ("a NOT BETWEEN 1 AND 5", {"a": "0"}, True),
        ("a NOT BETWEEN 1 AND 5", {"a": "3"}, False),
        ("a NOT BETWEEN 1 AND 5", {"a": "6"}, True),
        # left to right with short-circuit, like the AND/OR it stands for:
        ("a BETWEEN 1.0 AND 5", {"a": "1.5"}, ERR),  # 1.5 >= 1.0 is TRUE, then Integer.valueOf("1.5") fails
        ("a BETWEEN 2.0 AND 5", {"a": "1.5"}, False),  # 1.5 >= 2.0 is FALSE: the upper bound is never read
        ("a NOT BETWEEN 2.0 AND 5", {"a": "1.5"}, True),
        ("a BETWEEN b AND c", {"a": "2", "b": "1", "c": "3"}, True),
    ])


def test_in_and_not_in_are_exact_and_null_when_missing() -> None:
    check([
        ("a IN ('1')", {"a": "01"}, False),
        ("a IN ('x')", {"a": "X"}, False),
        ("a IN ('x', 'y', 'z', 'w', 'v', 'u')", {"a": "u"}, True),
        ("a IN ('x ')", {"a": "x"}, False),
        ("a NOT IN ('1')", {"a": "01"}, True),
        ("a NOT IN ('1')", {"a": "1"}, False),
        ("a IN ('1')", {}, None),
        ("a NOT IN ('1')", {}, None),
        ("a IN ('it''s')", {"a": "it's"}, True),
    ])


def test_is_null_only_for_a_missing_property() -> None:
    check([
        ("a IS NULL", {}, True),
        ("a IS NULL", {"a": ""}, False),
        ("a IS NOT NULL", {"a": ""}, True),
        ("a IS NOT NULL", {}, False),
        ("(a > 5) IS NULL", {}, True),
        ("(a > 5) IS NULL", {"a": "6"}, False),
        ("5 IS NULL", {}, False),
        ("NULL IS NULL", {}, True),
    ])


@pytest.mark.parametrize("op", ["CONTAINS", "STARTSWITH", "ENDSWITH"])
def test_string_matches_are_false_for_missing_non_string_or_empty_search(op: str) -> None:
    for negation in ("", "NOT "):
        check([
            (f"a {negation}{op} 'b'", {}, False),
            (f"a {negation}{op} ''", {"a": "abc"}, False),
            (f"a {negation}{op} ''", {}, False),
            (f"5 {negation}{op} '5'", {}, False),
            (f"(a = 'x') {negation}{op} 'true'", {"a": "x"}, False),
            # an empty search is FALSE before the operand is evaluated, so this cannot fail:
            (f"(a > 1) {negation}{op} ''", {"a": "x"}, False),
        ])


def test_string_matches_on_strings() -> None:
    check([
        ("a CONTAINS 'b'", {"a": "abc"}, True),
        ("a CONTAINS 'B'", {"a": "abc"}, False),
        ("a NOT CONTAINS 'b'", {"a": "abc"}, False),
        ("a NOT CONTAINS 'z'", {"a": "abc"}, True),
        ("a STARTSWITH 'ab'", {"a": "abc"}, True),
        ("a STARTSWITH 'bc'", {"a": "abc"}, False),
        ("a NOT STARTSWITH 'bc'", {"a": "abc"}, True),
        ("a ENDSWITH 'bc'", {"a": "abc"}, True),
        ("a NOT ENDSWITH 'bc'", {"a": "abc"}, False),
        ("'abc' CONTAINS 'b'", {}, True),
        ("a CONTAINS 'abcd'", {"a": "abc"}, False),
        ("NOT a CONTAINS 'x'", {"a": "x"}, False),  # (NOT a) is a Boolean: not a string
    ])


@pytest.mark.parametrize(
    "left, right, and_result, or_result",
    [
        ("TRUE", "TRUE", True, True),
        ("TRUE", "FALSE", False, True),
        ("TRUE", "NULL", None, True),
        ("FALSE", "TRUE", False, True),
        ("FALSE", "FALSE", False, False),
        ("FALSE", "NULL", False, None),
        ("NULL", "TRUE", None, True),
        ("NULL", "FALSE", False, None),
        ("NULL", "NULL", None, None),
    ],
)
def test_three_valued_logic(left: str, right: str, and_result: object, or_result: object) -> None:
    assert run(f"{left} AND {right}") is and_result
    assert run(f"{left} OR {right}") is or_result


def test_short_circuit_left_to_right_decides_whether_errors_surface() -> None:
    x = {"a": "x"}
    check([
        ("a = 'x' OR a > 0", x, True),
        ("a > 0 OR a = 'x'", x, ERR),
        ("a = 'y' AND a > 0", x, False),
        ("a > 0 AND a = 'y'", x, ERR),
        ("b IS NULL AND a > 0", x, ERR),
        ("b IS NOT NULL AND a > 0", x, False),
        ("b = 'q' AND a > 0", x, ERR),  # unknown does not short-circuit AND
        ("b = 'q' OR a > 0", x, ERR),  # nor OR
        ("a = 'y' AND b = 'q' AND a > 0", x, False),
        ("a = 'x' OR b = 'q' OR a > 0", x, True),
    ])


def test_long_chains_and_deep_nesting() -> None:
    chain = " AND ".join(f"p{i} IS NULL" for i in range(500))
    assert run(chain) is True
    assert run(chain, {"p499": "1"}) is False
    nested = "(" * 40 + "a = 'x'" + ")" * 40
    assert run(nested, {"a": "x"}) is True
    assert "nested" in str(syntax_error("(" * 500 + "a" + ")" * 500))
    assert "nested" in str(syntax_error("NOT " * 500 + "a"))
    assert "deep" in str(syntax_error("a" + " = a" * 500))
