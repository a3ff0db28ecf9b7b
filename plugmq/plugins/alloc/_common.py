"""What the RocketMQ strategies share: the input checks and Java's list/string behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from plugmq.core import AllocationCapabilities, MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.core.logs import get_logger

log = get_logger(__name__)


def check_inputs(
    consumer_group: str, current_id: str, all_queues: Sequence[MessageQueue], all_consumer_ids: Sequence[str]
) -> bool:
    """RocketMQ's ``AbstractAllocateMessageQueueStrategy.check``, same order, same messages.

    False (not an error) when the current consumer is not in the list: it gets nothing this
    round, which happens while the broker's view of the group catches up.
    """
    if not current_id:
        raise AllocationError("currentCID is empty")
    if not all_queues:
        raise AllocationError("mqAll is null or mqAll empty")
    if not all_consumer_ids:
        raise AllocationError("cidAll is null or cidAll empty")
    if current_id not in all_consumer_ids:
        log.info(
            "consumer not in the group's consumer list, it gets no queue",
            consumer_group=consumer_group,
            current_id=current_id,
            consumer_ids=list(all_consumer_ids),
        )
        return False
    return True


@attrs.frozen
class Round:
    """One consumer's question in a rebalance, asked once the input checks passed."""

    consumer_group: str
    current_id: str
    queues: Sequence[MessageQueue]
    consumer_ids: Sequence[str]

    @property
    def index(self) -> int:
        """The current consumer's position in ``consumer_ids``.

        list.index is the first occurrence, like Java's indexOf: a duplicated id always takes
        the first one's share, and the duplicate's share stays unowned.
        """
        return list(self.consumer_ids).index(self.current_id)


class CheckedStrategy:
    """A strategy that runs RocketMQ's input checks (:func:`check_inputs`) before its ``share``."""

    __slots__ = ()
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities()

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        if not check_inputs(consumer_group, current_id, all_queues, all_consumer_ids):
            return []
        return self.share(Round(consumer_group, current_id, all_queues, all_consumer_ids))

    def share(self, round_: Round) -> list[MessageQueue]:
        """The queues of ``round_.current_id``, a member of a non-empty group over some queues."""
        raise NotImplementedError


def java_split(text: str, separator: str) -> list[str]:
    """Java's ``String.split`` with a literal separator: trailing empty parts are dropped.

    "a@" -> ["a"], "@b" -> ["", "b"], "@" -> [], but "" -> [""] (Java keeps the lone empty input).
    """
    if text == "":
        return [""]
    parts = text.split(separator)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def take_params(strategy: str, params: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy's parameters with defaults filled in; an unknown name is an AllocationError."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        accepted = ", ".join(defaults) if defaults else "none"
        raise AllocationError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"for allocation strategy {strategy}; accepted parameters: {accepted}"
        )
    return {**defaults, **params}
