"""What the RocketMQ strategies share: the input checks and Java's list/string behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plugmq.core import MessageQueue
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
