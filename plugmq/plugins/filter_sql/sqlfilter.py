"""The compiled SQL92 filter and its compiler (expression type ``SQL92``)."""

from __future__ import annotations

from collections.abc import Mapping

from plugmq.core import (
    ConsumeQueueEntry,
    FilterCapabilities,
    FilterEvaluationError,
    FilterExample,
    FilterSample,
    FilterSyntaxError,
    Prop,
)
from plugmq.plugins.filter_sql.bloom import (
    name_bits,
    property_bloom,
    required_properties,
)
from plugmq.plugins.filter_sql.codegen import generate_logic
from plugmq.plugins.filter_sql.compiler import compile_condition
from plugmq.plugins.filter_sql.nodes import Logic, Node, Property
from plugmq.plugins.filter_sql.parser import parse

__all__ = ["EXPRESSION_TYPE", "SqlFilter", "SqlFilterCompiler"]

EXPRESSION_TYPE = "SQL92"


def _references(node: Node, name: str) -> bool:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Property) and current.name == name:
            return True
        stack.extend(current.children())
    return False


class SqlFilter:
    """One compiled subscription. Thread-safe: it holds no per-message state.

    ``evaluate`` gives RocketMQ's three-valued result (True / False / None) or raises
    FilterEvaluationError; ``matches`` is True only for True. The message's tags are visible to
    the expression as the property ``TAGS`` (as in RocketMQ, where tags are that property).
    """

    expression_type = EXPRESSION_TYPE
    #: The bloom computation the broker must use for :meth:`precheck_bloom`.
    property_bloom = staticmethod(property_bloom)

    def __init__(self, expression: str, tree: Node) -> None:
        self.expression = expression
        self.tree = tree
        self._condition = compile_condition(tree)
        self._uses_tags = _references(tree, Prop.TAGS)
        self.required_properties = required_properties(tree)
        self._required_masks = tuple(sorted({name_bits(n) for n in self.required_properties}))
        if not self._uses_tags:
            self._bind_fast_paths()

    def _bind_fast_paths(self) -> None:
        # Per-message entry points as plain closures: no tags merge, no attribute lookups.
        condition = self._condition

        def matches(properties: Mapping[str, str], tags: str | None = None) -> bool:
            try:
                return condition(properties) is True
            except FilterEvaluationError:
                return False  # a normal outcome per message (RocketMQ: no match); not worth a log line

        matches.__doc__ = SqlFilter.matches.__doc__
        self.evaluate = condition  # type: ignore[method-assign]  # takes (properties, tags=None) too
        self.matches = matches  # type: ignore[method-assign]
        if isinstance(self.tree, Logic):  # the usual shape: a generated matches() saves a call
            self.matches = generate_logic(  # type: ignore[method-assign]
                self.tree.op, list(self.tree.operands), compile_condition, as_matches=True)

    def describe(self) -> str:
        """The parsed form, fully parenthesised where precedence decided something."""
        return self.tree.describe()

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"

    def _with_tags(self, properties: Mapping[str, str], tags: str | None) -> Mapping[str, str]:
        if tags is None or not self._uses_tags or properties.get(Prop.TAGS) == tags:
            return properties
        return {**properties, Prop.TAGS: tags}

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        """True, False or None (unknown); raises FilterEvaluationError when a conversion fails."""
        if self._uses_tags:
            properties = self._with_tags(properties, tags)
        return self._condition(properties)

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        """True only when evaluate is True (unknown and evaluation errors are no match)."""
        if self._uses_tags:
            properties = self._with_tags(properties, tags)
        try:
            return self._condition(properties) is True
        except FilterEvaluationError:
            return False

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        """The tag code says nothing about properties: always "read it and check"."""
        return True

    def precheck_bloom(self, bits: int) -> bool:
        """False only when a property the expression requires for TRUE is surely absent from a
        message whose :func:`property_bloom` is ``bits``."""
        return all(bits & mask == mask for mask in self._required_masks)


class SqlFilterCompiler:
    """Compiles SQL92 selectors with RocketMQ's exact semantics (see ``spec/sql92.md``)."""

    expression_type = EXPRESSION_TYPE
    capabilities = FilterCapabilities(expression_type=EXPRESSION_TYPE, broker_precheck=False, examples=(
        # a missing property makes a comparison unknown; a value that is no number fails it: no match
        FilterExample("a > 5 AND b = 'x'", matching=[{"a": "7", "b": "x"}, {"a": "60", "b": "x"}],
                      not_matching=[{"a": "3", "b": "x"}, {"b": "x"}, {"a": "abc", "b": "x"}, {"a": "7", "b": "y"}]),
        FilterExample("a IS NULL OR a IN ('x', 'y')", matching=[{}, {"a": "y"}], not_matching=[{"a": "z"}]),
        FilterExample("a BETWEEN 1 AND 3", matching=[{"a": "1"}, {"a": "3"}], not_matching=[{"a": "4"}, {}]),
        FilterExample("TAGS = 'TagA'", matching=[FilterSample(tags="TagA")], not_matching=[FilterSample(tags="TagB")]),
    ))

    def compile(self, expression: str) -> SqlFilter:
        if not isinstance(expression, str):
            raise FilterSyntaxError(f"an SQL92 expression must be a string, got {type(expression).__name__}",
                                    expression=repr(expression))
        if not expression.strip():
            raise FilterSyntaxError("an SQL92 expression cannot be empty (subscribe with TAG '*' to get everything)",
                                    expression=expression, position=0, expected="a condition")
        return SqlFilter(expression, parse(expression))
