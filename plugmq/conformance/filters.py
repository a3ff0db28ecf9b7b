"""Conformance clauses of the filter family, for any filter compiler.

Subclass :class:`FilterConformance` and provide one fixture, ``filter_compiler`` (a
:class:`~plugmq.core.FilterCompiler`). The clauses:

* valid expressions compile to a :class:`~plugmq.core.Filter` of the compiler's type;
* the broker-side pre-check never rejects a message the exact check accepts (property-based),
  for ``precheck(entry)`` and, when the filter has them, ``precheck_many(codes)`` (a boolean mask
  over an int64 array of tag codes, agreeing with ``precheck``) and ``precheck_bloom(bits)`` with
  ``bits = filter.property_bloom(properties, tags)``;
* ``evaluate`` is three-valued (True / False / None) or raises FilterEvaluationError, and
  ``matches`` is True exactly when ``evaluate`` is True;
* compile errors are FilterSyntaxError only, with a position inside the expression, for fuzzed
  text, token soup, random bytes decoded with ``errors='replace'`` and pathological nesting; and a
  fuzzed expression that compiles evaluates without any other exception. Inputs are bounded in
  size, so a clause that never finishes is a hang in the plugin.

* every example the compiler declares (``FilterCapabilities.examples``) compiles, matches the
  messages it says it matches and no message it says it does not, and its pre-check passes the
  matching ones; in a broker, a pull with the compiled subscription returns exactly those.

Valid expressions and messages come from the fixtures ``expression_strategy`` and
``message_strategy`` (hypothesis strategies): the declared examples' expressions, and messages
recombined from their samples, plus generated ones for the types ``TAG`` and ``SQL92``. A type
with neither examples nor a subclass overriding ``expression_strategy`` fails the clauses that
need valid input, saying what to declare: a semantic clause is never skipped for want of input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from plugmq.conformance.budget import examples
from plugmq.core import (
    ConsumeQueueEntry,
    Filter,
    FilterCompiler,
    FilterEvaluationError,
    FilterExample,
    FilterSample,
    FilterSyntaxError,
    Prop,
    tags_code,
)
from plugmq.core.contracts import BatchPrecheck, BloomPrecheck, MatchAll

__all__ = [
    "FilterConformance",
    "default_expression_strategy",
    "default_message_strategy",
    "example_expressions",
    "example_messages",
    "fuzz_token_soup",
    "sql92_expressions",
    "tag_expressions",
]

Message = tuple[dict[str, str], "str | None"]

_settings = settings(
    max_examples=examples(80),
    deadline=None,
    # too_slow: generation time depends on how loaded the machine is, not on the plugin
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors, HealthCheck.too_slow],
)

# Tags chosen so hash collisions happen: "Aa" and "BB" share a Java hash, and so do every
# concatenation of them of equal length ("AaAa", "AaBB", "BBAa", "BBBB").
TAG_VOCABULARY = ("TagA", "TagB", "TagC", "Aa", "BB", "AaAa", "AaBB", "BBAa", "BBBB", "order", "pay", "x")
PROPERTY_NAMES = ("a", "b", "c")
PROPERTY_VALUES = (
    "5", "-3", "0", "7", "3000000000", "2.5", "1e3", "NaN", "Infinity", "0x1p3", "10f", " 7", "10.0",
    "x", "y", "true", "TRUE", "false", "", "abc", "01",
)

# ------------------------------------------------------------------------------ default strategies


def _tag_list(draw: st.DrawFn) -> list[str]:
    return draw(st.lists(st.sampled_from(TAG_VOCABULARY), min_size=1, max_size=4))


@st.composite
def tag_expressions(draw: st.DrawFn) -> str:
    """``*``, empty, or ``T1 || T2 ...`` with random spacing and empty slots."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["*", "", " * ", "  "]))
    parts = [draw(st.sampled_from(["", " ", "  "])) + tag + draw(st.sampled_from(["", " "])) for tag in _tag_list(draw)]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), " ")  # an empty tag, which is dropped
    return "||".join(parts)


_props = st.sampled_from(PROPERTY_NAMES)
_ints = st.integers(-20, 20).map(str)
_numbers = st.one_of(_ints, st.sampled_from(["3000000000", "2.5", "-1.5", "1e3", "0.5", "+4", "9223372036854775807"]))
_strings = st.sampled_from(["'x'", "'y'", "'5'", "'10.0'", "'true'", "''", "'it''s'", "'a b'"])


@st.composite
def _sql_atom(draw: st.DrawFn) -> str:
    p, q = draw(_props), draw(_props)
    choice = draw(st.integers(0, 13))
    if choice == 0:
        return f"{p} {draw(st.sampled_from(['>', '>=', '<', '<=', '=', '<>']))} {draw(_numbers)}"
    if choice == 1:
        return f"{draw(_numbers)} {draw(st.sampled_from(['>', '>=', '<', '<=', '=', '<>']))} {p}"
    if choice == 2:
        return f"{p} {draw(st.sampled_from(['=', '<>']))} {draw(_strings)}"
    if choice == 3:
        return f"{draw(_strings)} {draw(st.sampled_from(['=', '<>']))} {p}"
    if choice == 4:
        return f"{p} {draw(st.sampled_from(['=', '<>', '<', '>=']))} {q}"
    if choice == 5:
        lo, hi = sorted((draw(st.integers(-5, 10)), draw(st.integers(-5, 10))))
        return f"{p} BETWEEN {lo} AND {hi}"
    if choice == 6:
        return f"{p} NOT BETWEEN {draw(_numbers)} AND {draw(_numbers)}"
    if choice == 7:
        values = ", ".join(draw(st.lists(_strings, min_size=1, max_size=4)))
        return f"{p} {draw(st.sampled_from(['IN', 'NOT IN']))} ({values})"
    if choice == 8:
        return f"{p} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if choice == 9:
        op = draw(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]))
        return f"{p} {draw(st.sampled_from(['', 'NOT ']))}{op} {draw(_strings)}"
    if choice == 10:
        return p
    if choice == 11:
        return draw(st.sampled_from(["TRUE", "FALSE", "NULL", "'true' = TRUE", f"{p} = TRUE", f"{p} <> FALSE"]))
    if choice == 12:
        return f"TAGS IN ({', '.join(repr(t) for t in draw(st.lists(st.sampled_from(TAG_VOCABULARY), min_size=1, max_size=3)))})"
    return f"{p} {draw(st.sampled_from(['>', '<']))} -{draw(st.integers(1, 9))}"


def sql92_expressions() -> SearchStrategy[str]:
    """Valid SQL92 selectors over properties a, b, c (and TAGS), nested with AND / OR / NOT."""

    def extend(children: SearchStrategy[str]) -> SearchStrategy[str]:
        return st.one_of(
            st.tuples(children, children).map(lambda t: f"({t[0]}) AND ({t[1]})"),
            st.tuples(children, children).map(lambda t: f"({t[0]}) OR ({t[1]})"),
            st.tuples(children, children, children).map(lambda t: f"{t[0]} AND {t[1]} OR {t[2]}"),
            children.map(lambda c: f"NOT ({c})"),
        )

    return st.recursive(_sql_atom(), extend, max_leaves=6)


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    names = draw(st.lists(st.sampled_from(PROPERTY_NAMES), unique=True, max_size=3))
    value = st.one_of(st.sampled_from(PROPERTY_VALUES), st.text(max_size=6))
    properties = {name: draw(value) for name in names}
    tags = None if draw(st.integers(0, 4)) == 0 else "||".join(_tag_list(draw))
    return properties, tags


def default_expression_strategy(expression_type: str) -> SearchStrategy[str] | None:
    """Valid expressions for the types this suite knows; None for any other type."""
    return {"TAG": tag_expressions(), "SQL92": sql92_expressions()}.get(expression_type.upper())


def default_message_strategy() -> SearchStrategy[Message]:
    """(properties, tags): up to three of a, b, c with awkward values; tags from a vocabulary with
    hash collisions, one to four per message, sometimes none."""
    return _messages()


def example_expressions(examples: tuple[FilterExample, ...]) -> SearchStrategy[str] | None:
    """The declared examples' expressions (None when there are none)."""
    return st.sampled_from([e.expression for e in examples]) if examples else None


def _as_message(sample: FilterSample) -> Message:
    return dict(sample.properties), sample.tags


@st.composite
def _recombined(draw: st.DrawFn, samples: tuple[FilterSample, ...]) -> Message:
    """A message built from the samples' pieces: their property names with their values (or
    awkward ones), and their tags."""
    names = sorted({name for s in samples for name in s.properties}) or list(PROPERTY_NAMES)
    values = sorted({value for s in samples for value in s.properties.values()} | set(PROPERTY_VALUES))
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    properties = {name: draw(st.one_of(st.sampled_from(values), st.text(max_size=6))) for name in chosen}
    tags = draw(st.sampled_from([None, *sorted({s.tags for s in samples if s.tags is not None})]))
    return properties, tags


def example_messages(examples: tuple[FilterExample, ...]) -> SearchStrategy[Message] | None:
    """The declared samples as they are, and messages recombined from their pieces."""
    samples = tuple(sample for example in examples for sample in example.samples)
    if not samples:
        return None
    return st.one_of(st.sampled_from([_as_message(s) for s in samples]), _recombined(samples))


def _declared_examples(compiler: FilterCompiler) -> tuple[FilterExample, ...]:
    return tuple(compiler.capabilities.examples)


NO_EXAMPLES = ("{type!r} has no generated expressions in the suite and its compiler declares no examples: "
               "declare FilterCapabilities(examples=(FilterExample(expression, matching=[...], "
               "not_matching=[...]), ...)) so the semantic clauses have valid input")


_SOUP_TOKENS = (
    "a", "b", "TAGS", "A", "$x", "_", "5", "0", "012", "3000000000", "99999999999999999999", "2.5", "0.0", "1e-400",
    "1e309", ".5", "5.", "'x'", "''", "'unterminated", "TRUE", "FALSE", "NULL", "NOT", "AND", "OR", "BETWEEN", "IN",
    "IS", "CONTAINS", "STARTSWITH", "ENDSWITH", "LIKE", "=", "<>", ">", ">=", "<", "<=", "+", "-", "*", "/", "(", ")",
    ",", "||", "|", "/*", "*/", "--", "\n", "!", "\"", "Aa", "BB", "TagA", " ", "\u00e9", "\x00",
)


def fuzz_token_soup() -> SearchStrategy[str]:
    """Bounded sequences of SQL and tag tokens: near-valid input that reaches deep parser paths."""
    return st.lists(st.sampled_from(_SOUP_TOKENS), max_size=30).map(" ".join)


_PATHOLOGICAL = (
    "(" * 3000 + "a" + ")" * 3000,
    "(" * 3000,
    "NOT " * 3000 + "a",
    "- " * 3000 + "5",
    "+" * 3000 + "5",
    "a" + " = a" * 3000,
    "a" + " CONTAINS 'x'" * 3000,
    "a IS NULL" + " IS NULL" * 3000,
    " AND ".join(["a = 'x'"] * 3000),
    " || ".join(["TagA"] * 3000),
    "'" * 3001,
    "/*" * 3000,
    "a IN (" + ", ".join(["'x'"] * 3000) + ")",
)


# ------------------------------------------------------------------------------------ the clauses


def _entry(properties: Mapping[str, str], tags: str | None) -> ConsumeQueueEntry:
    """The consume-queue entry of a message: its tags code, from its tags or (as a stored message
    carries them) its ``TAGS`` property."""
    code = tags_code(tags if tags is not None else properties.get(Prop.TAGS))
    return ConsumeQueueEntry(queue_offset=0, commit_log_offset=0, size=100, tags_code=code)


def _evaluate_cleanly(flt: Filter, properties: Mapping[str, str], tags: str | None) -> Any:
    """evaluate's result, or FilterEvaluationError's class; anything else propagates."""
    result: bool | type[FilterEvaluationError] | None
    try:
        result = flt.evaluate(properties, tags)
    except FilterEvaluationError:
        result = FilterEvaluationError
    if result is not FilterEvaluationError:
        assert result is None or type(result) is bool, f"evaluate returned {result!r}, not True/False/None"
    assert flt.matches(properties, tags) is (result is True), "matches must be True exactly when evaluate is True"
    return result


def _compile_or_syntax_error(compiler: FilterCompiler, expression: str) -> Filter | None:
    try:
        flt = compiler.compile(expression)
    except FilterSyntaxError as exc:
        assert exc.position is None or 0 <= exc.position <= len(expression), (
            f"error position {exc.position} outside the expression (length {len(expression)})")
        assert str(exc), "a syntax error must say what is wrong"
        return None
    assert isinstance(flt, Filter), f"compile returned {type(flt).__name__}, not a Filter"
    return flt


class FilterConformance:
    """The filter contract. Needs the fixture ``filter_compiler``."""

    @pytest.fixture
    def expression_strategy(self, filter_compiler: FilterCompiler) -> SearchStrategy[str]:
        found = [default_expression_strategy(filter_compiler.expression_type),
                 example_expressions(_declared_examples(filter_compiler))]
        strategies = [strategy for strategy in found if strategy is not None]
        if not strategies:
            pytest.fail(NO_EXAMPLES.format(type=filter_compiler.expression_type), pytrace=False)
        return st.one_of(*strategies)

    @pytest.fixture
    def message_strategy(self, filter_compiler: FilterCompiler) -> SearchStrategy[Message]:
        from_examples = example_messages(_declared_examples(filter_compiler))
        default = default_message_strategy()
        return default if from_examples is None else st.one_of(default, from_examples)

    # --------------------------------------------------------------------------- valid input

    def test_capabilities_name_the_expression_type(self, filter_compiler: FilterCompiler) -> None:
        """A compiler is a FilterCompiler whose capabilities name its own expression type."""
        assert isinstance(filter_compiler, FilterCompiler), (
            f"{type(filter_compiler).__name__} lacks FilterCompiler members (expression_type, capabilities, compile)")
        declared = filter_compiler.capabilities.expression_type
        assert declared == filter_compiler.expression_type, (
            f"capabilities.expression_type is {declared!r}, the compiler's expression_type "
            f"{filter_compiler.expression_type!r}")

    def test_declared_examples_match_as_declared(self, filter_compiler: FilterCompiler) -> None:
        """Each declared example compiles, matches its matching messages (its pre-check passes
        them) and none of its not-matching ones."""
        examples = _declared_examples(filter_compiler)
        if not examples:
            pytest.fail(NO_EXAMPLES.format(type=filter_compiler.expression_type), pytrace=False)
        for example in examples:
            flt = filter_compiler.compile(example.expression)
            for sample in example.matching:
                result = _evaluate_cleanly(flt, sample.properties, sample.tags)
                assert result is True, (
                    f"example {example.expression!r} must match {sample}, but evaluate answered {result!r}")
                assert flt.precheck(_entry(sample.properties, sample.tags)), (
                    f"example {example.expression!r}: precheck rejected {sample}, which it matches")
            for sample in example.not_matching:
                result = _evaluate_cleanly(flt, sample.properties, sample.tags)
                assert result is not True, (
                    f"example {example.expression!r} must not match {sample}, but evaluate answered True")

    @given(data=st.data())
    @_settings
    def test_valid_expressions_compile_to_a_filter(
        self, filter_compiler: FilterCompiler, expression_strategy: SearchStrategy[str], data: st.DataObject
    ) -> None:
        """A valid expression compiles to a Filter of the compiler's type holding the expression unchanged."""
        expression = data.draw(expression_strategy, label="expression")
        flt = filter_compiler.compile(expression)
        assert isinstance(flt, Filter)
        assert flt.expression_type == filter_compiler.expression_type
        assert flt.expression == expression

    @given(data=st.data())
    @_settings
    def test_precheck_never_rejects_a_message_the_exact_check_accepts(
        self,
        filter_compiler: FilterCompiler,
        expression_strategy: SearchStrategy[str],
        message_strategy: SearchStrategy[Message],
        data: st.DataObject,
    ) -> None:
        """No pre-check (precheck, precheck_many, precheck_bloom) rejects a message the exact check
        accepts; precheck_many agrees with precheck; a filter that says it matches everything does."""
        flt = filter_compiler.compile(data.draw(expression_strategy, label="expression"))
        messages = data.draw(st.lists(message_strategy, min_size=1, max_size=8), label="messages")
        entries = [_entry(properties, tags) for properties, tags in messages]
        scalar = [flt.precheck(entry) for entry in entries]
        if isinstance(flt, BatchPrecheck):
            mask = flt.precheck_many(np.array([e.tags_code for e in entries], dtype=np.int64))
            assert [bool(m) for m in mask] == scalar, "precheck_many must agree with precheck entry by entry"
        if isinstance(flt, MatchAll) and flt.matches_everything:
            assert all(scalar) and all(flt.matches(properties, tags) for properties, tags in messages), (
                "a filter that says it matches everything (MatchAll) must pass every message")
        for (properties, tags), passed in zip(messages, scalar):
            if not flt.matches(properties, tags):
                continue
            assert passed, f"precheck rejected a message the exact check accepts: {properties!r} tags={tags!r}"
            if isinstance(flt, BloomPrecheck):
                assert flt.precheck_bloom(flt.property_bloom(properties, tags)), (
                    f"precheck_bloom rejected a message the exact check accepts: {properties!r} tags={tags!r}")

    @given(data=st.data())
    @_settings
    def test_evaluate_is_three_valued_and_matches_agrees(
        self,
        filter_compiler: FilterCompiler,
        expression_strategy: SearchStrategy[str],
        message_strategy: SearchStrategy[Message],
        data: st.DataObject,
    ) -> None:
        """evaluate returns exactly True, False or None or raises FilterEvaluationError, and matches is
        True exactly when evaluate is."""
        flt = filter_compiler.compile(data.draw(expression_strategy, label="expression"))
        properties, tags = data.draw(message_strategy, label="message")
        _evaluate_cleanly(flt, properties, tags)

    # --------------------------------------------------------------------------- fuzzed input

    def _fuzz(self, compiler: FilterCompiler, expression: str, messages: list[Message]) -> None:
        flt = _compile_or_syntax_error(compiler, expression)
        if flt is not None:
            for properties, tags in messages:
                _evaluate_cleanly(flt, properties, tags)
                flt.precheck(_entry(properties, tags))

    @given(expression=st.text(max_size=120), messages=st.lists(default_message_strategy(), max_size=3))
    @_settings
    def test_fuzzed_text_raises_only_filter_syntax_errors(
        self, filter_compiler: FilterCompiler, expression: str, messages: list[Message]
    ) -> None:
        """Random text compiles or raises FilterSyntaxError (position inside the expression), and what
        compiles evaluates cleanly."""
        self._fuzz(filter_compiler, expression, messages)

    @given(raw=st.binary(max_size=160), messages=st.lists(default_message_strategy(), max_size=3))
    @_settings
    def test_fuzzed_bytes_raise_only_filter_syntax_errors(
        self, filter_compiler: FilterCompiler, raw: bytes, messages: list[Message]
    ) -> None:
        """Random bytes, decoded with replacement, compile or raise FilterSyntaxError only, and what
        compiles evaluates cleanly."""
        self._fuzz(filter_compiler, raw.decode("utf-8", errors="replace"), messages)

    @given(expression=fuzz_token_soup(), messages=st.lists(default_message_strategy(), max_size=3))
    @_settings
    def test_fuzzed_token_soup_raises_only_filter_syntax_errors(
        self, filter_compiler: FilterCompiler, expression: str, messages: list[Message]
    ) -> None:
        """Near-valid token soup compiles or raises FilterSyntaxError only, and what compiles evaluates
        cleanly."""
        self._fuzz(filter_compiler, expression, messages)

    @pytest.mark.parametrize("expression", _PATHOLOGICAL, ids=lambda e: repr(e[:12]))
    def test_pathological_nesting_is_refused_or_compiled_cleanly(
        self, filter_compiler: FilterCompiler, expression: str
    ) -> None:
        """Input nested or repeated thousands deep is refused with FilterSyntaxError or compiled, in
        bounded time, never a RecursionError."""
        self._fuzz(filter_compiler, expression, [({"a": "x"}, "TagA"), ({}, None)])
