"""The admin verbs that delete: a consumer group (its offsets, pop progress and messages in flight),
a topic (plugmq.broker.topicdelete)."""

from __future__ import annotations

import attrs

from plugmq.admin.insight import ClientDirectory
from plugmq.broker.ports import Administered
from plugmq.core.errors import ClientError
from plugmq.core.names import validate_group

__all__ = ["GroupDeleted", "TopicDeleted", "delete_group", "delete_topic"]


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


@attrs.frozen
class TopicDeleted:
    """``floors``: queue id -> where reads of a topic of this name start from now on;
    ``groups``: whose offsets or pop progress on it were forgotten; ``connected``: those of them
    with consumers connected now (not refused, as in RocketMQ: the topic is gone for them at once)."""

    topic: str
    broker: str
    queues: int
    floors: dict[int, int]
    groups: tuple[str, ...]
    connected: tuple[str, ...]
    inflight_dropped: int


def delete_topic(broker: Administered, clients: ClientDirectory | None, topic: str, *,
                 group_topic: bool = False) -> TopicDeleted:
    """Delete ``topic`` on ``broker``; the answer names the groups it touched, and which of them
    still have consumers connected (a RocketMQ 5 client of plugmq serve, or an in-process consumer)."""
    done = broker.delete_topic(topic, group_topic=group_topic)
    connected = tuple(group for group in done.groups
                      if broker.groups.members(group) or (clients is not None and clients.members(group)))
    return TopicDeleted(done.topic, broker.name, done.queues, done.floors, done.groups, connected,
                        done.inflight_dropped)
