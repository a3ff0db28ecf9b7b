"""AVG and AVG_BY_CIRCLE: RocketMQ's AllocateMessageQueueAveragely(ByCircle)."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from plugmq.core import MessageQueue
from plugmq.plugins.alloc._common import CheckedStrategy, Round, take_params


@attrs.frozen
class Averagely(CheckedStrategy):
    """Contiguous blocks; the first ``queues % consumers`` consumers get one queue more."""

    name: ClassVar[str] = "AVG"

    def share(self, round_: Round) -> list[MessageQueue]:
        n, c, index = len(round_.queues), len(round_.consumer_ids), round_.index
        mod = n % c
        size = 1 if n <= c else n // c + (1 if index < mod else 0)
        start = index * size if index < mod else index * size + mod
        count = min(size, n - start)
        return list(round_.queues[start : start + count]) if count > 0 else []


@attrs.frozen
class AveragelyByCircle(CheckedStrategy):
    """Round-robin deal: consumer i gets positions i, i + c, i + 2c, ..."""

    name: ClassVar[str] = "AVG_BY_CIRCLE"

    def share(self, round_: Round) -> list[MessageQueue]:
        return list(round_.queues[round_.index :: len(round_.consumer_ids)])


def make_averagely(**params: Any) -> Averagely:
    take_params(Averagely.name, params, {})
    return Averagely()


def make_averagely_by_circle(**params: Any) -> AveragelyByCircle:
    take_params(AveragelyByCircle.name, params, {})
    return AveragelyByCircle()
