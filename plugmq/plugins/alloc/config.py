"""CONFIG: RocketMQ's AllocateMessageQueueByConfig, a fixed list set per consumer instance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from plugmq.core import AllocationCapabilities, MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.core.logs import get_logger
from plugmq.plugins.alloc._common import take_params

log = get_logger(__name__)


@attrs.frozen
class ByConfig:
    """Returns the configured queues as-is, whatever the input; no input checks at all.

    Each consumer process is meant to be configured with its own list, so nothing guarantees
    the union covers the topic (hence ``may_leave_queues_unassigned``).
    """

    name: ClassVar[str] = "CONFIG"
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities(may_leave_queues_unassigned=True)

    message_queues: tuple[MessageQueue, ...] | None = None

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        if self.message_queues is None:
            # RocketMQ returns null here, which its rebalance treats as no queues.
            log.warning(
                "CONFIG allocation strategy has no message_queues configured; this consumer gets no queue",
                consumer_group=consumer_group,
                current_id=current_id,
            )
            return []
        return list(self.message_queues)


def _to_queue(item: Any) -> MessageQueue:
    if isinstance(item, MessageQueue):
        return item
    if isinstance(item, Mapping) and set(item) == {"topic", "broker_name", "queue_id"}:
        try:
            return MessageQueue(topic=item["topic"], broker_name=item["broker_name"], queue_id=item["queue_id"])
        except (TypeError, ValueError) as exc:
            raise AllocationError(f"CONFIG parameter message_queues has an invalid queue {item!r}: {exc}") from exc
    raise AllocationError(
        "CONFIG parameter message_queues must be a list of MessageQueue (or of dicts with keys "
        f"topic, broker_name, queue_id), got the item {item!r}"
    )


def make_config(**params: Any) -> ByConfig:
    p = take_params(ByConfig.name, params, {"message_queues": None})
    queues = p["message_queues"]
    if queues is None:
        return ByConfig()
    if isinstance(queues, (str, bytes, Mapping)) or not isinstance(queues, Sequence):
        raise AllocationError(f"CONFIG parameter message_queues must be a list of queues, got {queues!r}")
    return ByConfig(message_queues=tuple(_to_queue(q) for q in queues))
