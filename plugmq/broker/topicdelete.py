"""Deleting a topic (``Broker.delete_topic``, ``plugmq admin topic-delete``), RocketMQ's way.

What goes: the topic's entry in the table (and so its route: a cluster broker registers its
topics again), the consumer offsets and pop progress of every group on it, its messages in
flight. What stays: its records in the commit log and its consume queues, until retention
reclaims them; they are never served again, because the deletion records each queue's end as
its floor (plugmq.broker.deletedtopics) and reads start there.

Rules, and why:

* System topics (``rmq_sys_*``, schedule, transaction, trace) are refused: the broker's own
  services write them (RocketMQ's broker refuses them too, ``TopicValidator.isSystemTopic``).
* A group's retry and dead-letter topics (``%RETRY%g``, ``%DLQ%g``) are refused unless asked for
  (``group_topic=True``): RocketMQ deletes them like any topic, but the dead-letter topic is where
  the messages a group gave up on are kept, and a retry topic holds a live group's pending
  retries, so deleting one should be meant.
* Consumers still connected are not a reason to refuse (RocketMQ does not either): the topic is
  gone for them at once (nothing more is served), and the answer names the groups that had
  progress on it so the operator knows whom it touched.
* Delayed messages still pending for the topic are delivered when due, as RocketMQ's schedule
  service does: their delivery creates the topic again (its queues start at the floors, so only
  they and later messages are served).
* On a slave it is refused (ReadOnlyBrokerError): the master deletes, the slave follows.
* A topic declared for the cluster loses its declaration first (``TopicUndeclaring``, else
  refused: its masters would create it again from the declaration); plugmq serve's cluster
  members see the declaration go and delete their copies.
"""

from __future__ import annotations

import attrs

from plugmq.broker.offsets import ConsumerOffsets
from plugmq.broker.pop import PopService
from plugmq.broker.topics import TopicTable
from plugmq.core.contracts import MessageStore
from plugmq.core.errors import TopicError
from plugmq.core.logs import get_logger
from plugmq.core.names import DLQ_PREFIX, RETRY_PREFIX, is_system_topic, validate_topic

__all__ = ["TopicDeletion", "check_deletable", "delete_topic"]

log = get_logger(__name__)


@attrs.frozen
class TopicDeletion:
    """What deleting ``topic`` did: its ``queues``, each queue's ``floors`` (where reads of a topic
    of that name start from now on), the ``groups`` whose offsets or pop progress on it were
    forgotten, and how many messages were in flight (``inflight_dropped``)."""

    topic: str
    queues: int
    floors: dict[int, int]
    groups: tuple[str, ...]
    inflight_dropped: int


def check_deletable(topic: str, *, group_topic: bool = False) -> None:
    """TopicError when ``topic`` may not be deleted (see the module docstring)."""
    validate_topic(topic)
    if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
        if not group_topic:
            kind = "retry" if topic.startswith(RETRY_PREFIX) else "dead-letter"
            raise TopicError(f"topic {topic!r} is a consumer group's {kind} topic; it holds that group's "
                             f"{'pending retries' if kind == 'retry' else 'dead letters'}: delete it with "
                             "group_topic=True (--group-topic) if that is meant")
    elif is_system_topic(topic):
        raise TopicError(f"topic {topic!r} is a system topic the broker's services write; it cannot be deleted")


def delete_topic(table: TopicTable, store: MessageStore, offsets: ConsumerOffsets, pop: PopService,
                 topic: str) -> TopicDeletion:
    """Delete ``topic`` (checked with :func:`check_deletable` by the caller, on a master): the
    record first, so a crash halfway leaves it deleted (pop lanes of a topic the table no longer
    has are dropped at start; offsets left behind lie below the floors and are moved up)."""
    count = table.get(topic)
    if count is None:
        raise TopicError(f"topic {topic!r} does not exist on this broker; nothing to delete (topic-list shows "
                         "the topics)")
    queues = max(count, store.queues().get(topic, 0))
    floors = {q: end for q in range(queues) if (end := store.max_offset(topic, q)) > 0}
    count = table.delete(topic, floors)
    groups = set(offsets.forget_topic(topic))
    pop_groups, inflight = pop.delete_topic(topic)
    deletion = TopicDeletion(topic, count, floors, tuple(sorted(groups | set(pop_groups))), inflight)
    log.info("topic deleted", topic=topic, queues=count, floors=floors, groups=list(deletion.groups),
             inflight_dropped=inflight)
    return deletion
