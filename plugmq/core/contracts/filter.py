"""Filter family: subscription-expression compilers, keyed by expression type (``plugmq_filter_compilers``).

Any number per broker. A :class:`FilterCompiler` turns an expression into a :class:`Filter` with a
cheap broker-side pre-check and an exact check. :class:`FilterCapabilities` says what its filters
offer and carries :class:`FilterExample` s: expressions with messages they must match and must not
match, from which the conformance suite builds the valid input of its semantic clauses. Optional
features of a filter are small Protocols checked with ``isinstance``: :class:`BatchPrecheck`,
:class:`BloomPrecheck`, :class:`DescribedFilter`, :class:`PropertyRequirements`, :class:`MatchAll`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from plugmq.core.errors import ValidationError
from plugmq.core.message import ConsumeQueueEntry

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BatchPrecheck",
    "BloomPrecheck",
    "DescribedFilter",
    "Filter",
    "FilterCapabilities",
    "FilterCompiler",
    "FilterExample",
    "FilterSample",
    "MatchAll",
    "PropertyRequirements",
]


def _properties(value: Mapping[str, str] | None) -> Mapping[str, str]:
    properties = dict(value or {})
    for key, item in properties.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValidationError(f"a filter sample's properties map str to str; got {key!r}: {item!r}")
    return MappingProxyType(properties)


@attrs.frozen
class FilterSample:
    """A message as a filter sees it: user properties and the tags string (``None``: no tags)."""

    properties: Mapping[str, str] = attrs.field(factory=dict, converter=_properties)
    tags: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str)))


def _samples(value: Iterable[FilterSample | Mapping[str, str]]) -> tuple[FilterSample, ...]:
    return tuple(item if isinstance(item, FilterSample) else FilterSample(item) for item in value)


@attrs.frozen
class FilterExample:
    """A valid expression with messages its filter must match and messages it must not match.

    ``matching`` / ``not_matching`` take :class:`FilterSample` s (a plain properties mapping is
    read as a sample without tags). "Not matching" means ``matches`` is False: ``evaluate`` False,
    unknown (None) or an evaluation error.
    """

    expression: str = attrs.field(validator=attrs.validators.instance_of(str))
    matching: tuple[FilterSample, ...] = attrs.field(default=(), converter=_samples)
    not_matching: tuple[FilterSample, ...] = attrs.field(default=(), converter=_samples)

    @property
    def samples(self) -> tuple[FilterSample, ...]:
        return self.matching + self.not_matching


def _examples(value: Iterable[FilterExample]) -> tuple[FilterExample, ...]:
    examples = tuple(value)
    for example in examples:
        if not isinstance(example, FilterExample):
            raise ValidationError(f"FilterCapabilities.examples holds FilterExample values, got {example!r}")
    return examples


@attrs.frozen
class FilterCapabilities:
    """What a compiler's filters offer the broker, and examples of its expressions.

    ``broker_precheck``: ``Filter.precheck`` can reject messages from the consume-queue entry alone
    (False: it always answers "read it"). ``examples``: valid expressions with messages each must
    match and must not match; the conformance suite checks them as declared and draws its valid
    input from them (the ``TAG`` and ``SQL92`` types also have generated input). Declare at least
    one: without examples the semantic clauses of a new expression type cannot run.
    """

    expression_type: str
    broker_precheck: bool = True
    examples: tuple[FilterExample, ...] = attrs.field(default=(), converter=_examples)


@runtime_checkable
class Filter(Protocol):
    """A compiled subscription expression.

    The rules ``plugmq.conformance.filters`` checks (clause names in brackets):

    - ``expression_type`` is the compiler's and ``expression`` the compiled text, unchanged
      [valid_expressions_compile_to_a_filter].
    - The pre-checks are sound: none of them rejects a message the exact check accepts
      [precheck_never_rejects_a_message_the_exact_check_accepts]. Optional extras a broker may
      use when present: ``precheck_many(codes)`` (a numpy bool mask over an int64 array of tag
      codes; must agree with ``precheck`` entry by entry) and ``precheck_bloom(bits)`` with
      ``bits = property_bloom(properties, tags)`` (False only when a property the expression
      needs for TRUE is surely absent).
    - ``evaluate`` returns exactly True, False or None (the bool singletons, not truthy stand-ins)
      or raises FilterEvaluationError — no other exception, for any properties and tags, also
      for filters compiled from fuzzed input; ``matches`` is True exactly when ``evaluate`` is
      True; ``precheck`` never raises [evaluate_is_three_valued_and_matches_agrees, fuzzed_*].
    """

    @property
    def expression_type(self) -> str:
        """The type it was compiled as ("TAG", "SQL92", ...)."""

    @property
    def expression(self) -> str:
        """The subscription text it was compiled from, unchanged."""

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        """Broker-side check on the consume-queue entry alone. False only if the message surely
        does not match; True means "read it and run the exact check"."""

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        """Exact result: True, False or None (unknown). May raise FilterEvaluationError."""

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        """True only when ``evaluate`` is True; unknown and evaluation errors are no match."""


@runtime_checkable
class FilterCompiler(Protocol):
    """Compiles subscription expressions of one type (the key it is offered under)."""

    @property
    def expression_type(self) -> str:
        """The expression type it compiles; equal to the key of ``plugmq_filter_compilers``."""

    @property
    def capabilities(self) -> FilterCapabilities:
        """What its filters offer the broker; ``capabilities.expression_type`` equals
        ``expression_type`` [capabilities_name_the_expression_type]."""

    def compile(self, expression: str) -> Filter:
        """Compile once per subscription. Bad input of any kind (fuzzed text, token soup, decoded
        random bytes, nesting thousands deep) raises FilterSyntaxError only, with a message and a
        position that is None or inside the expression, in bounded time (no RecursionError, no
        hang) [fuzzed_text/bytes/token_soup_raise_only_filter_syntax_errors,
        pathological_nesting_is_refused_or_compiled_cleanly]."""


@runtime_checkable
class BatchPrecheck(Protocol):
    """A filter that pre-checks many consume-queue tag codes at once."""

    def precheck_many(self, codes: np.ndarray) -> np.ndarray:
        """A numpy bool mask over an int64 array of tag codes, equal entry by entry to ``precheck``."""


@runtime_checkable
class BloomPrecheck(Protocol):
    """A filter that rejects a message whose property-name bloom lacks a property it needs."""

    def property_bloom(self, properties: Mapping[str, str], tags: str | None = None) -> int:
        """The bloom bits of a message's property names (the computation ``precheck_bloom`` reads)."""

    def precheck_bloom(self, bits: int) -> bool:
        """False only when a property the expression needs for TRUE is surely absent."""


@runtime_checkable
class DescribedFilter(Protocol):
    """A filter that can show how it parsed its expression (``plugmq filter`` prints it)."""

    def describe(self) -> str:
        """The parsed form, e.g. fully parenthesised."""


@runtime_checkable
class MatchAll(Protocol):
    """A filter that can say it lets every message through (a tag subscription of ``*``).

    The broker then reads a queue's records in runs, as for a pull with no subscription."""

    @property
    def matches_everything(self) -> bool:
        """True only when ``matches`` (and so ``precheck``) is True for every message."""


@runtime_checkable
class PropertyRequirements(Protocol):
    """A filter that knows which properties a message needs for the expression to be TRUE."""

    @property
    def required_properties(self) -> frozenset[str]:
        """Property names every matching message has."""
