"""filter_sql: SQL92 property filters (expression type ``SQL92``) giving RocketMQ's results.

Lexer (:mod:`.lexer`) -> parser with RocketMQ's compile-time checks (:mod:`.parser`,
:mod:`.semantics`) -> tree (:mod:`.nodes`) -> closures (:mod:`.compiler`), with Java's number
rules in :mod:`.javanum` and the optional property-name bloom pre-check in :mod:`.bloom`.
plugmq differs from RocketMQ in one place: input left over after a complete expression is a
syntax error (RocketMQ silently ignores it).
"""

from __future__ import annotations

from collections.abc import Mapping

from plugmq.core import Family, FilterCompiler, PluginDeclaration, hookimpl
from plugmq.plugins.filter_sql.bloom import property_bloom
from plugmq.plugins.filter_sql.sqlfilter import (
    EXPRESSION_TYPE,
    SqlFilter,
    SqlFilterCompiler,
)

__all__ = ["COMPILER", "SqlFilter", "SqlFilterCompiler", "plugmq_declare", "plugmq_filter_compilers", "property_bloom"]

COMPILER = SqlFilterCompiler()


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="filter_sql",
        families={Family.FILTER},
        description="SQL92 property filters with RocketMQ's semantics; optional property-name bloom pre-check",
        options=None,
        capabilities=COMPILER.capabilities,
    )


@hookimpl
def plugmq_filter_compilers() -> Mapping[str, FilterCompiler]:
    return {EXPRESSION_TYPE: COMPILER}
