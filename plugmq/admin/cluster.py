"""Operating a cluster: mqadmin's ``clusterList`` and ``updateTopic -c``, over the name service.

Both verbs talk to the cluster's name service only (a :class:`ClusterService`), never to a store,
so they run from any host with a broker config of the cluster (``plugmq admin --config``, beside
running brokers) or on a served broker (``plugmq admin --server``, through its own session).

``update-topic --cluster`` declares the topic for the whole cluster: every live master applies
the declaration to its topic table and registers the result, and a master that joins later
applies it when it joins. The verb waits (a few seconds at most) until each live master
registers the topic, and says which did and which did not yet.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.admin.verbs import _Args, _take
from plugmq.broker.routes import declaration_applies
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts import ClusterService, ClusterTopic, ClusterView, TopicPermission
from plugmq.core.errors import TopicError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.names import is_system_topic, validate_topic

__all__ = ["CLUSTER_VERBS", "ClusterAdmin", "ClusterTopicUpdate", "execute_cluster"]

log = get_logger(__name__)

_APPLY_WAIT_S = 10.0  # masters apply a declaration within one view change; ZooKeeper's is well under this


@attrs.frozen
class ClusterTopicUpdate:
    """``update-topic --cluster``: the declaration, and which live masters registered it in time.

    ``previous``: the queue count declared before (None: the topic was not declared).
    ``applied``: masters whose registration shows at least ``queue_count`` queues.
    ``pending``: live masters that had not registered it when the wait ended (they apply it as
    soon as they see the declaration; a master that was down applies it when it joins).
    """

    cluster: str
    topic: str
    queue_count: int
    previous: int | None
    applied: tuple[str, ...]
    pending: tuple[str, ...]


class ClusterAdmin:
    """The cluster verbs over one name-service session (``service``, of cluster ``cluster``)."""

    def __init__(self, service: ClusterService, cluster: str, *, clock: Clock | None = None,
                 apply_wait_s: float = _APPLY_WAIT_S) -> None:
        self.service = service
        self.cluster = cluster
        self._clock = clock or SystemClock()
        self._apply_wait_s = apply_wait_s

    def cluster_list(self) -> dict[str, Any]:
        """Live brokers (name, id, role, room, endpoint, epoch, topics) and the cluster-wide topics."""
        return self.service.view().as_dict()

    def update_topic(self, topic: str, queue_count: int, cluster: str) -> ClusterTopicUpdate:
        """Declare ``topic`` with ``queue_count`` queues on every master of ``cluster``."""
        if cluster != self.cluster:
            raise ValidationError(f"this session belongs to cluster {self.cluster!r}, not {cluster!r}; give the "
                                  f"config (or server) of a broker in {cluster!r}")
        validate_topic(topic)
        if is_system_topic(topic):
            raise TopicError(f"topic {topic!r} is a system topic; each broker creates it when it needs it")
        if isinstance(queue_count, bool) or not isinstance(queue_count, int) or queue_count < 1:
            raise ValidationError(f"queue count must be a positive integer, got {queue_count!r}")
        view = self.service.view()
        previous = _largest_known(view, topic)
        if previous is not None and queue_count < previous:
            raise ValidationError(f"topic {topic!r} has {previous} queues on some broker and queues hold data, so "
                                  f"a topic never shrinks; ask for {previous} or more, not {queue_count}")
        declaration = ClusterTopic(queue_count, TopicPermission.READ_WRITE, auto_created=False)
        self.service.declare_topic(topic, declaration)
        log.info("topic declared for the cluster", cluster=cluster, topic=topic, queue_count=queue_count,
                 previous=previous)
        applied, pending = self._wait_applied(topic, declaration)
        return ClusterTopicUpdate(cluster, topic, queue_count, previous, applied, pending)

    def _wait_applied(self, topic: str, declaration: ClusterTopic) -> tuple[tuple[str, ...], tuple[str, ...]]:
        changed = threading.Event()
        unsubscribe = self.service.subscribe(lambda _view: changed.set())
        deadline = self._clock.now() + self._apply_wait_s
        try:
            while True:
                applied, pending = _split_masters(self.service.view(), topic, declaration)
                remaining = deadline - self._clock.now()
                if not pending or remaining <= 0:
                    return applied, pending
                changed.clear()
                self._clock.wait(changed, min(remaining, 0.5))  # 0.5 s: a view may change between reads
        finally:
            unsubscribe()


def _largest_known(view: ClusterView, topic: str) -> int | None:
    counts = [b.topics[topic].queue_count for b in view.brokers if topic in b.topics]
    if topic in view.topics:
        counts.append(view.topics[topic].queue_count)
    return max(counts) if counts else None


def _split_masters(view: ClusterView, topic: str,
                   declaration: ClusterTopic) -> tuple[tuple[str, ...], tuple[str, ...]]:
    applied: list[str] = []
    pending: list[str] = []
    for broker in view.masters():
        if not declaration_applies(declaration, broker):
            continue
        registered = broker.topics.get(topic)
        done = registered is not None and registered.queue_count >= declaration.queue_count
        (applied if done else pending).append(broker.broker_name)
    return tuple(applied), tuple(pending)


# ---------------------------------------------------------------------------------------------- verbs
def _cluster_list(admin: ClusterAdmin, args: _Args) -> Any:
    _take(args, "cluster-list")
    return admin.cluster_list()


def _cluster_update_topic(admin: ClusterAdmin, args: _Args) -> Any:
    a = _take(args, "cluster-update-topic", ["topic", "queue_count", "cluster"])
    return attrs.asdict(admin.update_topic(a["topic"], a["queue_count"], a["cluster"]),
                        value_serializer=lambda _i, _f, v: list(v) if isinstance(v, tuple) else v)


CLUSTER_VERBS = {
    "cluster-list": _cluster_list,
    "cluster-update-topic": _cluster_update_topic,
}
"""The verbs that run against the name service: ``plugmq admin cluster-list`` and
``plugmq admin update-topic --cluster NAME`` (sent as ``cluster-update-topic``)."""


def execute_cluster(admin: ClusterAdmin, verb: str, args: _Args) -> Any:
    """Run cluster ``verb`` with ``args``; returns the JSON-ready result."""
    function = CLUSTER_VERBS.get(verb)
    if function is None:
        raise ValidationError(f"cluster admin verb {verb!r} is unknown; known: {', '.join(CLUSTER_VERBS)}")
    if not isinstance(args, Mapping):
        raise ValidationError(f"{verb}: arguments must be a JSON object, got {type(args).__name__}")
    return function(admin, args)
