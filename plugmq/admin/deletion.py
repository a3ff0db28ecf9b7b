"""The admin verbs that delete: a consumer group (its offsets, pop progress and messages in flight)."""

from __future__ import annotations

import attrs

from plugmq.admin.insight import ClientDirectory
from plugmq.broker.ports import Administered
from plugmq.core.errors import ClientError
from plugmq.core.names import validate_group

__all__ = ["GroupDeleted", "delete_group"]


@attrs.frozen
class GroupDeleted:
    """``pop_queues``: how many queues the group had pop progress on (now forgotten)."""

    group: str
    broker: str
    pop_queues: int


def delete_group(broker: Administered, clients: ClientDirectory | None, group: str) -> GroupDeleted:
    """Forget ``group`` on ``broker``; refused while any consumer of it is connected (a RocketMQ 5
    client of plugmq serve, or an in-process push consumer)."""
    validate_group(group)
    connected = clients.members(group) if clients is not None else []
    if connected:
        raise ClientError(f"group {group!r} still has connected consumers ({', '.join(sorted(connected))}); "
                          "shut them down (or wait for their heartbeats to expire) before deleting the group")
    return GroupDeleted(group, broker.name, broker.delete_group(group))
