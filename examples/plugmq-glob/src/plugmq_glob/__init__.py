"""glob: GLOB subscriptions, shell-style patterns over message properties and tags.

An expression is one or more terms separated by spaces, all of which must hold::

    region:eu-* tier:gold          property region matches eu-*, and tier is gold
    TAGS:order-* !region:test*     a tag matches order-*, and region does not match test*

A term is ``name:pattern`` (``!name:pattern`` negates it). Patterns are ``fnmatch`` patterns,
case-sensitive: ``*``, ``?``, ``[seq]``, ``[!seq]``. ``TAGS`` holds when any of the message's tags
matches. A term on a property the message lacks is unknown, so the expression is unknown (no
match) unless another term is false: SQL92's three-valued AND.

Broker side, a positive ``TAGS`` term with a plain tag (no pattern characters) lets the pre-check
reject from the consume-queue entry alone: the entry's tag code holds the hash bits of every tag of
the message (``plugmq.core.tags_code``), exactly as filter_tag checks.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from plugmq.core import (
    ConsumeQueueEntry,
    Family,
    FilterCapabilities,
    FilterCompiler,
    FilterExample,
    FilterSample,
    FilterSyntaxError,
    PluginDeclaration,
    Prop,
    hookimpl,
    tags_code,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["COMPILER", "GlobCompiler", "GlobFilter", "plugmq_declare", "plugmq_filter_compilers"]

EXPRESSION_TYPE = "GLOB"
TAGS = Prop.TAGS
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PATTERN_CHARS = frozenset("*?[")

CAPABILITIES = FilterCapabilities(expression_type=EXPRESSION_TYPE, broker_precheck=True, examples=(
    FilterExample("region:eu-* tier:gold",
                  matching=[FilterSample({"region": "eu-west", "tier": "gold"})],
                  not_matching=[FilterSample({"region": "us-east", "tier": "gold"}),
                                FilterSample({"region": "eu-west"}),  # tier unknown: no match
                                FilterSample({"region": "eu-west", "tier": "Gold"})]),
    FilterExample("TAGS:order-created !region:test*",
                  matching=[FilterSample({"region": "prod"}, tags="order-created"),
                            FilterSample({"region": "prod"}, tags="audit||order-created")],
                  not_matching=[FilterSample({"region": "prod"}, tags="order-paid"),
                                FilterSample({"region": "test-1"}, tags="order-created"),
                                FilterSample({"region": "prod"})]),
    FilterExample("TAGS:order-?????",
                  matching=[FilterSample(tags="order-payed"), FilterSample({TAGS: "order-taken"})],
                  not_matching=[FilterSample(tags="order-paid"), FilterSample(tags="pay")]),
))


@attrs.frozen
class Term:
    """One ``[!]name:pattern`` term."""

    name: str
    pattern: str
    negated: bool
    regex: re.Pattern[str]

    def evaluate(self, properties: Mapping[str, str], tags: list[str] | None) -> bool | None:
        if self.name == TAGS:
            if tags is None:
                return None
            found = any(self.regex.fullmatch(tag) for tag in tags)
        else:
            value = properties.get(self.name)
            if value is None:
                return None
            found = self.regex.fullmatch(value) is not None
        return found != self.negated

    @property
    def plain_tag(self) -> str | None:
        """The tag a positive TAGS term names without pattern characters, else None."""
        if self.name != TAGS or self.negated or _PATTERN_CHARS & set(self.pattern):
            return None
        return self.pattern


def _split_tags(properties: Mapping[str, str], tags: str | None) -> list[str] | None:
    text = tags if tags is not None else properties.get(TAGS)
    if text is None:
        return None
    return [tag.strip() for tag in text.split("||") if tag.strip()]


class GlobFilter:
    """A compiled GLOB subscription."""

    expression_type = EXPRESSION_TYPE

    def __init__(self, expression: str, terms: tuple[Term, ...]) -> None:
        self.expression = expression
        self.terms = terms
        self._codes = tuple(sorted({tags_code(t.plain_tag) for t in terms if t.plain_tag is not None}))

    def describe(self) -> str:
        return " AND ".join(f"{'NOT ' if t.negated else ''}{t.name} GLOB {t.pattern!r}" for t in self.terms)

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        return all(code & entry.tags_code == code for code in self._codes)

    def precheck_many(self, codes: np.ndarray) -> np.ndarray:
        import numpy as np

        mask = np.ones(np.shape(codes), dtype=bool)
        for code in self._codes:
            mask &= (codes & np.int64(code)) == np.int64(code)
        return mask

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        message_tags = _split_tags(properties, tags)
        unknown = False
        for term in self.terms:
            result = term.evaluate(properties, message_tags)
            if result is False:
                return False
            unknown = unknown or result is None
        return None if unknown else True

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        return self.evaluate(properties, tags) is True


class GlobCompiler:
    """Compiles GLOB expressions; bad input raises FilterSyntaxError with the term's position."""

    expression_type = EXPRESSION_TYPE
    capabilities = CAPABILITIES

    def compile(self, expression: str) -> GlobFilter:
        if not isinstance(expression, str):
            raise FilterSyntaxError(f"a GLOB expression must be a string, got {type(expression).__name__}",
                                    expression=repr(expression))
        terms = tuple(self._term(expression, match.start(), match.group())
                      for match in re.finditer(r"\S+", expression))
        if not terms:
            raise FilterSyntaxError("a GLOB expression needs at least one term name:pattern",
                                    expression=expression, position=0, expected="name:pattern")
        return GlobFilter(expression, terms)

    @staticmethod
    def _term(expression: str, position: int, text: str) -> Term:
        negated = text.startswith("!")
        name, colon, pattern = text[negated:].partition(":")
        if not colon:
            raise FilterSyntaxError(f"term {text!r} has no ':' between a name and a pattern",
                                    expression=expression, position=position, expected="name:pattern")
        if not _NAME.fullmatch(name):
            raise FilterSyntaxError(f"term {text!r}: {name!r} is not a property name ([A-Za-z0-9_.-]+)",
                                    expression=expression, position=position + negated, expected="a property name")
        try:
            regex = re.compile(fnmatch.translate(pattern))
        except re.error as exc:
            raise FilterSyntaxError(f"term {text!r}: pattern {pattern!r} does not compile: {exc}",
                                    expression=expression, position=position, expected="a glob pattern") from None
        return Term(name, pattern, negated, regex)


COMPILER = GlobCompiler()


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="glob",
        families={Family.FILTER},
        description="GLOB subscriptions: shell-style patterns over properties and tags",
        capabilities=CAPABILITIES,
    )


@hookimpl
def plugmq_filter_compilers() -> Mapping[str, FilterCompiler]:
    return {EXPRESSION_TYPE: COMPILER}
