"""AVG and AVG_BY_CIRCLE: RocketMQ's AllocateMessageQueueAveragely(ByCircle)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from plugmq.core import AllocationCapabilities, MessageQueue
from plugmq.plugins.alloc._common import check_inputs, take_params


@attrs.frozen
class Averagely:
    """Contiguous blocks; the first ``queues % consumers`` consumers get one queue more."""

    name: ClassVar[str] = "AVG"
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
        n, c = len(all_queues), len(all_consumer_ids)
        # list.index is the first occurrence, like Java's indexOf: a duplicated id always
        # takes the first one's share, and the duplicate's share stays unowned.
        index = list(all_consumer_ids).index(current_id)
        mod = n % c
        size = 1 if n <= c else n // c + (1 if index < mod else 0)
        start = index * size if index < mod else index * size + mod
        count = min(size, n - start)
        return list(all_queues[start : start + count]) if count > 0 else []


@attrs.frozen
class AveragelyByCircle:
    """Round-robin deal: consumer i gets positions i, i + c, i + 2c, ..."""

    name: ClassVar[str] = "AVG_BY_CIRCLE"
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
        index = list(all_consumer_ids).index(current_id)
        return list(all_queues[index :: len(all_consumer_ids)])


def make_averagely(**params: Any) -> Averagely:
    take_params(Averagely.name, params, {})
    return Averagely()


def make_averagely_by_circle(**params: Any) -> AveragelyByCircle:
    take_params(AveragelyByCircle.name, params, {})
    return AveragelyByCircle()
