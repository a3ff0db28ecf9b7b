"""The filter conformance suite applied to both filter plugins."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugmq.conformance.filters import FilterConformance
from plugmq.core import ConsumeQueueEntry, Filter, FilterCapabilities, FilterCompiler, FilterExample, FilterSample
from plugmq.plugins import filter_sql, filter_tag


class TestTagFilterConformance(FilterConformance):
    @pytest.fixture
    def filter_compiler(self) -> FilterCompiler:
        return filter_tag.plugmq_filter_compilers()["TAG"]


class TestSqlFilterConformance(FilterConformance):
    @pytest.fixture
    def filter_compiler(self) -> FilterCompiler:
        return filter_sql.plugmq_filter_compilers()["SQL92"]


# ----------------------------------------------------------------- the clauses can fail


class _RejectingTagCompiler:
    """A broken plugin: its pre-check rejects everything, even exact matches."""

    expression_type = "TAG"
    capabilities = filter_tag.COMPILER.capabilities

    def compile(self, expression: str) -> Filter:
        return _RejectingFilter(filter_tag.COMPILER.compile(expression))


class _RejectingFilter:
    """The tag filter with a pre-check that rejects everything (and no batch pre-check)."""

    def __init__(self, inner: Filter) -> None:
        self.inner = inner
        self.expression_type, self.expression = inner.expression_type, inner.expression

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        return False

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        return self.inner.evaluate(properties, tags)

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        return self.inner.matches(properties, tags)


class _CrashingSqlCompiler:
    """A broken plugin: it lets a non-FilterSyntaxError escape on bad input."""

    expression_type = "SQL92"
    capabilities = filter_sql.COMPILER.capabilities

    def compile(self, expression: str):
        if expression.strip():
            raise ValueError("parser crashed")
        return filter_sql.COMPILER.compile(expression)


def test_precheck_clause_fails_for_a_precheck_that_rejects_matches() -> None:
    suite = TestTagFilterConformance()
    compiler = _RejectingTagCompiler()
    from plugmq.conformance.filters import default_message_strategy, tag_expressions

    with pytest.raises(AssertionError, match="precheck rejected"):
        suite.test_precheck_never_rejects_a_message_the_exact_check_accepts(
            compiler, tag_expressions(), default_message_strategy()
        )


def test_fuzz_clause_fails_for_a_compiler_raising_other_errors() -> None:
    suite = TestSqlFilterConformance()
    with pytest.raises(ValueError, match="parser crashed"):
        suite.test_fuzzed_token_soup_raises_only_filter_syntax_errors(_CrashingSqlCompiler())


def test_an_unknown_expression_type_without_examples_fails_saying_what_to_declare() -> None:
    class Other:
        expression_type = "XPATH"
        capabilities = FilterCapabilities(expression_type="XPATH")

    fixture = FilterConformance.expression_strategy.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(pytest.fail.Exception, match="declare FilterCapabilities"):
        fixture(FilterConformance(), Other())


def test_an_unknown_expression_type_draws_its_declared_examples() -> None:
    class Other:
        expression_type = "XPATH"
        capabilities = FilterCapabilities(expression_type="XPATH", examples=(
            FilterExample("/a", matching=[FilterSample({"a": "1"})], not_matching=[FilterSample()]),))

    fixture = FilterConformance.expression_strategy.__wrapped__  # type: ignore[attr-defined]
    drawn: list[str] = []

    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        drawn.append(data.draw(fixture(FilterConformance(), Other())))

    draw()
    assert set(drawn) == {"/a"}
