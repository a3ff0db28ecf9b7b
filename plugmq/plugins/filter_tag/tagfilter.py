"""Tag subscriptions (expression type ``TAG``): ``*``, ``TAGA``, ``TAGA || TAGB``.

Broker side, the consume-queue entry holds the message's tag code (core ``tags_code``: the Java
hash of its tag, or the OR of its tags' hashes for a multi-tag message). A subscription tag ``t``
can match when ``hash(t) & code == hash(t)`` — exact for an equal single tag, a bloom-style test
for several. Hashes collide ("Aa" and "BB" share one), so the client re-checks the real strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from plugmq.core import ConsumeQueueEntry, FilterCapabilities, FilterExample, FilterSample, FilterSyntaxError, Prop
from plugmq.core.hashing import java_string_hash, split_tags

if TYPE_CHECKING:
    import numpy as np

__all__ = ["EXPRESSION_TYPE", "SUB_ALL", "TagFilter", "TagFilterCompiler", "precheck_block"]

EXPRESSION_TYPE = "TAG"
SUB_ALL = "*"


class TagFilter:
    """A compiled tag subscription. ``tags`` is empty for "everything"."""

    expression_type = EXPRESSION_TYPE

    def __init__(self, expression: str, tags: tuple[str, ...]) -> None:
        self.expression = expression
        self.tags = tags
        self.tag_set = frozenset(tags)
        self.codes = tuple(sorted({java_string_hash(t) for t in tags}))
        self.subscribes_all = not tags

    @property
    def matches_everything(self) -> bool:
        """MatchAll: ``*`` lets every message through (the broker reads records in runs)."""
        return self.subscribes_all

    def describe(self) -> str:
        if self.subscribes_all:
            return "* (every message)"
        return " || ".join(self.tags) + "   [codes: " + ", ".join(str(c) for c in self.codes) + "]"

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"

    # ------------------------------------------------------------------ broker side

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        if self.subscribes_all:
            return True
        code = entry.tags_code
        return any(wanted & code == wanted for wanted in self.codes)

    def precheck_many(self, codes: np.ndarray) -> np.ndarray:
        """:meth:`precheck` over an int64 array of tag codes, as a boolean mask."""
        # numpy (and the vectorised module) load here, on the first block pre-check
        import numpy as np

        from plugmq.plugins.filter_tag.vectorised import match_codes

        if self.subscribes_all:
            return np.ones(np.shape(codes), dtype=bool)
        return match_codes(codes, self.codes)

    def precheck_block(self, raw: bytes | bytearray | memoryview) -> np.ndarray:
        """:meth:`precheck` over raw 20-byte big-endian consume-queue entries."""
        from plugmq.plugins.filter_tag.vectorised import decode_block

        return self.precheck_many(decode_block(raw)["tag_hash"])

    # ------------------------------------------------------------------ client side

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        """Exact check on the real tag strings (``tags``, else the ``TAGS`` property): True when
        any of the message's tags is subscribed. Never unknown, never fails."""
        if self.subscribes_all:
            return True
        if tags is None:
            tags = properties.get(Prop.TAGS)
        return any(tag in self.tag_set for tag in split_tags(tags))

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        return self.evaluate(properties, tags) is True


def precheck_block(raw: bytes | bytearray | memoryview, subscription: TagFilter | str) -> np.ndarray:
    """Boolean mask over the entries in ``raw``: False where the entry surely does not match."""
    flt = subscription if isinstance(subscription, TagFilter) else TagFilterCompiler().compile(subscription)
    return flt.precheck_block(raw)


class TagFilterCompiler:
    """Compiles tag subscriptions as RocketMQ's ``FilterAPI.buildSubscriptionData`` reads them."""

    expression_type = EXPRESSION_TYPE
    capabilities = FilterCapabilities(expression_type=EXPRESSION_TYPE, broker_precheck=True, examples=(
        FilterExample("TagA || TagB", matching=[FilterSample(tags="TagA"), FilterSample(tags="TagB"),
                                                FilterSample({Prop.TAGS: "TagB"})],
                      not_matching=[FilterSample(tags="TagC"), FilterSample()]),
        # "Aa" and "BB" share a Java hash: the pre-check passes BB, the exact check rejects it
        FilterExample("Aa", matching=[FilterSample(tags="Aa")], not_matching=[FilterSample(tags="BB")]),
        FilterExample("*", matching=[FilterSample(), FilterSample(tags="x")]),
    ))

    def compile(self, expression: str) -> TagFilter:
        if not isinstance(expression, str):
            raise FilterSyntaxError(f"a tag expression must be a string, got {type(expression).__name__}",
                                    expression=repr(expression))
        stripped = expression.strip()
        if stripped in ("", SUB_ALL):
            return TagFilter(expression, ())
        tags = tuple(dict.fromkeys(split_tags(expression)))  # ordered, duplicates dropped
        if not tags:
            raise FilterSyntaxError(
                f"tag expression {expression!r} names no tag: write TAGA || TAGB, or * for every message",
                expression=expression, position=0, expected="a tag or *",
            )
        return TagFilter(expression, tags)
