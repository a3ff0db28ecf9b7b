"""How consumers consume: where a new group starts, what listeners answer, clustering or broadcasting."""

from __future__ import annotations

import enum

__all__ = ["ConsumeFrom", "ConsumeStatus", "MessageModel", "OrderlyStatus"]


class ConsumeStatus(enum.Enum):
    """What a concurrent push listener answers."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class OrderlyStatus(enum.Enum):
    """What an orderly push listener answers."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(enum.Enum):
    """Clustering: each message to one member of the group. Broadcasting: to every member."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    """Where a group starts on a queue it has no position on yet."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"
