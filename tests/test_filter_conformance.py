"""The filter conformance suite applied to both filter plugins."""

from __future__ import annotations

import pytest

from plugmq.conformance.filters import FilterConformance
from plugmq.core import FilterCompiler
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

    def compile(self, expression: str):
        flt = filter_tag.COMPILER.compile(expression)
        flt.precheck = lambda entry: False  # type: ignore[method-assign]
        flt.precheck_many = None  # type: ignore[assignment]
        return flt


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


def test_unknown_expression_type_skips_with_a_reason() -> None:
    class Other:
        expression_type = "XPATH"

    fixture = FilterConformance.expression_strategy.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(pytest.skip.Exception, match="override the expression_strategy fixture"):
        fixture(FilterConformance(), Other())
