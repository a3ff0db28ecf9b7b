"""Routes over a cluster view: which brokers serve a topic's queues, in the order clients get them.

A topic's route names, for every live broker: the queues it registered for the topic, or, when
the topic is declared for the cluster and the broker is a master that applies the declaration
(every master for an explicit declaration, the masters that auto-create topics for an
auto-created one), the declared queues, which that broker creates as soon as it sees the
declaration. So a topic auto-created on one broker is routed over every master at once, as
RocketMQ's multi-master clusters spread "the queues of one topic evenly over the masters".

Queues are ordered by queue id first, then broker: ``a/0 b/0 c/0 a/1 b/1 ...``. Clients pick
queues round-robin and a failed send retries on the next queue, which is then on another broker.

A broker name with no live master (killed with failover off, before a promotion, or no slave
eligible) keeps being read, as RocketMQ consumers fall back to a slave while its master is down:
the slave with the lowest broker id *stands in* - its queues are routed read-only (never WRITE,
so producers never send to it) and served as the name's broker id 0, which the official clients
read from. Once a master of the name registers again, the route is the master's.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from plugmq.core.contracts import BrokerRegistration, ClusterTopic, ClusterView, TopicPermission, TopicRegistration
from plugmq.core.message import MessageQueue
from plugmq.core.names import DLQ_PREFIX, is_system_topic

__all__ = ["RoutedQueue", "declaration_applies", "registered_topics", "topic_route"]


@attrs.frozen
class RoutedQueue:
    """One queue of a route: where it lives (the broker's registration) and what clients may do."""

    queue: MessageQueue
    broker: BrokerRegistration
    permission: TopicPermission
    #: A slave serving reads for its broker name while no master of the name is live (the
    #: permission then has no WRITE): clients get it as the name's broker id 0.
    standing_in: bool = attrs.field(default=False, kw_only=True)

    @property
    def readable(self) -> bool:
        return bool(self.permission & TopicPermission.READ)

    @property
    def writable(self) -> bool:
        return bool(self.permission & TopicPermission.WRITE)


def registered_topics(topics: Mapping[str, int]) -> dict[str, TopicRegistration]:
    """What a broker registers of its topic table: clients' topics read-write, %DLQ% topics
    read-only, the broker's internal topics (retry, schedule, transactions) not at all."""
    registered = {}
    for topic, count in topics.items():
        if topic.startswith(DLQ_PREFIX):
            registered[topic] = TopicRegistration(count, TopicPermission.READ)
        elif not is_system_topic(topic):
            registered[topic] = TopicRegistration(count, TopicPermission.READ_WRITE)
    return registered


def declaration_applies(declaration: ClusterTopic, broker: BrokerRegistration) -> bool:
    """Whether ``broker`` creates a topic declared for the cluster with ``declaration``."""
    return broker.is_master and (broker.auto_create_topics or not declaration.auto_created)


def topic_route(view: ClusterView, topic: str, *,
                declared: Mapping[str, ClusterTopic] | None = None) -> list[RoutedQueue]:
    """The queues of ``topic`` over the live brokers of ``view`` (empty when none serves it).

    ``declared``: declarations known locally that the view may not show yet (this broker's own,
    just written), merged over the view's.
    """
    declaration = (declared or {}).get(topic) or view.topics.get(topic)
    mastered = {b.broker_name for b in view.brokers if b.is_master}
    stand_ins: set[tuple[str, int]] = set()  # (broker name, broker id) of the slave read in a master's place
    for broker in view.brokers:  # sorted by (name, id): the first slave holding the topic stands in
        if (broker.broker_name not in mastered and topic in broker.topics
                and broker.topics[topic].permission & TopicPermission.READ
                and all(name != broker.broker_name for name, _ in stand_ins)):
            stand_ins.add((broker.broker_name, broker.broker_id))
    routed: list[RoutedQueue] = []
    for broker in view.brokers:
        registration = broker.topics.get(topic)
        if registration is not None:
            count, permission = registration.queue_count, registration.permission
            if declaration is not None and declaration_applies(declaration, broker):
                count = max(count, declaration.queue_count)  # growing: the broker catches up soon
        elif declaration is not None and declaration_applies(declaration, broker):
            count, permission = declaration.queue_count, declaration.permission
        else:
            continue
        standing_in = (broker.broker_name, broker.broker_id) in stand_ins
        if standing_in:
            permission = TopicPermission.READ  # read while the master is away; sends wait for a master
        routed.extend(RoutedQueue(MessageQueue(topic, broker.broker_name, i), broker, permission,
                                  standing_in=standing_in) for i in range(count))
    routed.sort(key=lambda r: (r.queue.queue_id, r.queue.broker_name, r.broker.broker_id))
    return routed
