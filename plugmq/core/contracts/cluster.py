"""Cluster family: the name service a broker of a cluster registers with (``plugmq_make_cluster_service``).

Zero or one per broker (none: a single machine). The service (:class:`ClusterService`) publishes
this broker's :class:`BrokerRegistration` as ephemeral state, watches the live brokers and declared
topics (:class:`ClusterView`) and elects a master per broker name (:class:`Mastership`, with an
epoch that fences an old master).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.contracts._checks import non_negative_int
from plugmq.core.contracts.declaration import PluginContext
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.errors import ValidationError
from plugmq.core.names import validate_broker_name, validate_cluster_name, validate_room

__all__ = [
    "BrokerRegistration",
    "BrokerRole",
    "ClusterContext",
    "ClusterListener",
    "ClusterService",
    "ClusterTopic",
    "ClusterView",
    "Mastership",
    "MastershipListener",
    "TopicPermission",
    "TopicRegistration",
    "TopicUndeclaring",
]


class BrokerRole(enum.Enum):
    """A broker's role among the brokers sharing its name (RocketMQ's ``brokerRole``).

    The master of a broker name has broker id 0; a slave has an id above 0.
    """

    ASYNC_MASTER = "async_master"
    SYNC_MASTER = "sync_master"
    SLAVE = "slave"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


class TopicPermission(enum.IntFlag):
    """What clients may do with a topic's queues on one broker (RocketMQ's ``PermName`` bits)."""

    NONE = 0
    WRITE = 2
    READ = 4
    READ_WRITE = 6


def _check_queue_count(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValidationError(f"{attribute.name} must be an integer 1..1024, got {value!r}")


def _check_endpoint(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError(f"{attribute.name} must be 'host:port' with a port 1..65535, got {value!r}")


def _checked_name(check: Callable[[object], str], *, empty_ok: bool = False) -> Callable[..., None]:
    def validate(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
        if not (empty_ok and value == ""):
            check(value)
    return validate


def _permission(value: object) -> TopicPermission:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 2, 4, 6):
        raise ValidationError(f"a topic permission is one of 0, 2 (write), 4 (read), 6 (read+write); got {value!r}")
    return TopicPermission(value)


def _role(value: object) -> BrokerRole:
    try:
        return BrokerRole(value)
    except ValueError:
        raise ValidationError(f"broker role must be one of {', '.join(r.value for r in BrokerRole)}; "
                              f"got {value!r}") from None


@attrs.frozen
class TopicRegistration:
    """One topic on one broker as the name service knows it (RocketMQ's ``QueueData``)."""

    queue_count: int = attrs.field(validator=_check_queue_count)
    permission: TopicPermission = attrs.field(default=TopicPermission.READ_WRITE, converter=_permission)


@attrs.frozen
class ClusterTopic:
    """A topic declared for the whole cluster: every master it applies to creates (or grows) it.

    ``auto_created``: declared because a broker auto-created the topic; such a declaration applies
    only to masters that auto-create topics themselves. An explicit one (an admin's
    ``update-topic --cluster``) applies to every master.
    """

    queue_count: int = attrs.field(validator=_check_queue_count)
    permission: TopicPermission = attrs.field(default=TopicPermission.READ_WRITE, converter=_permission)
    auto_created: bool = False


def _topic_registrations(topics: Mapping[str, TopicRegistration]) -> dict[str, TopicRegistration]:
    return dict(topics)


def _cluster_topics(topics: Mapping[str, ClusterTopic]) -> dict[str, ClusterTopic]:
    return dict(topics)


@attrs.frozen
class BrokerRegistration:
    """What a live broker publishes about itself: ephemeral state of its name-service session.

    ``endpoint`` is where clients reach it (the advertised gRPC address). ``room``: its machine
    room ("" when none is configured). ``epoch``: the master epoch this broker holds, 0 when it
    holds none. ``auto_create_topics`` / ``default_queue_count``: how it treats an unknown topic.
    ``replication``: where this broker's slaves connect while it is master (its replication
    plugin's address; "" when it serves none), so a failover slave finds the elected master.
    ``log_epoch``: the newest master epoch its log knows (failover: who may stand when no broker
    of the name is caught up). ``failover``: it stands in its name's elections and, while not the
    master, forwards clients to the one that is (routes may list it beside the master).
    """

    cluster: str = attrs.field(validator=_checked_name(validate_cluster_name))
    broker_name: str = attrs.field(validator=_checked_name(validate_broker_name))
    endpoint: str = attrs.field(validator=_check_endpoint)
    broker_id: int = attrs.field(default=0, validator=non_negative_int)
    room: str = attrs.field(default="", validator=_checked_name(validate_room, empty_ok=True))
    role: BrokerRole = attrs.field(default=BrokerRole.ASYNC_MASTER, converter=_role)
    topics: Mapping[str, TopicRegistration] = attrs.field(factory=dict, converter=_topic_registrations)
    auto_create_topics: bool = True
    default_queue_count: int = attrs.field(default=4, validator=_check_queue_count)
    epoch: int = attrs.field(default=0, validator=non_negative_int)
    replication: str = ""
    log_epoch: int = attrs.field(default=0, validator=non_negative_int)
    failover: bool = False

    @property
    def key(self) -> str:
        """``<broker name>.<broker id>``: unique in a cluster ("." never occurs in a broker name)."""
        return f"{self.broker_name}.{self.broker_id}"

    @property
    def is_master(self) -> bool:
        """Broker id 0 in a master role, or (failover) the elected master: a master role and an epoch."""
        return self.role.is_master and (self.broker_id == 0 or self.epoch > 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a name-service plugin stores, what ``--json`` output shows)."""
        return {
            "cluster": self.cluster, "broker_name": self.broker_name, "broker_id": self.broker_id,
            "endpoint": self.endpoint, "room": self.room, "role": self.role.value, "epoch": self.epoch,
            "replication": self.replication, "log_epoch": self.log_epoch, "failover": self.failover,
            "auto_create_topics": self.auto_create_topics, "default_queue_count": self.default_queue_count,
            "topics": {name: {"queues": t.queue_count, "perm": int(t.permission)}
                       for name, t in sorted(self.topics.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BrokerRegistration:
        """Rebuild a registration from :meth:`as_dict` output; ValidationError names what is wrong."""
        try:
            topics = {str(name): TopicRegistration(t["queues"], t.get("perm", 6))
                      for name, t in dict(data.get("topics", {})).items()}
            return cls(cluster=data["cluster"], broker_name=data["broker_name"], endpoint=data["endpoint"],
                       broker_id=data.get("broker_id", 0), room=data.get("room", ""),
                       role=data.get("role", BrokerRole.ASYNC_MASTER.value), topics=topics,
                       auto_create_topics=bool(data.get("auto_create_topics", True)),
                       default_queue_count=data.get("default_queue_count", 4), epoch=data.get("epoch", 0),
                       replication=str(data.get("replication", "")), log_epoch=data.get("log_epoch", 0),
                       failover=bool(data.get("failover", False)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValidationError(f"not a broker registration ({type(exc).__name__}: {exc}): {dict(data)!r:.200}") from exc


@attrs.frozen
class Mastership:
    """An election won: this broker is the master of ``broker_name`` for ``epoch``.

    Epochs of a broker name only grow, by one per election won, so anything stamped with an older
    epoch comes from a master that has lost its place since (a fencing token). ``leadership``:
    the lease and in-sync set the win holds (:class:`~plugmq.core.contracts.leadership.Leadership`),
    from a cluster service that keeps them (None from one that does not).
    """

    broker_name: str
    broker_id: int
    epoch: int
    leadership: Leadership | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class ClusterView:
    """A snapshot of the cluster: the live brokers and the declared topics.

    ``brokers`` is sorted by (broker name, broker id). ``connected`` is False when the service has
    lost its connection to the name service; the view is then the last one seen, possibly stale.
    """

    cluster: str
    brokers: tuple[BrokerRegistration, ...] = ()
    topics: Mapping[str, ClusterTopic] = attrs.field(factory=dict, converter=_cluster_topics)
    connected: bool = True

    def broker(self, broker_name: str, broker_id: int = 0) -> BrokerRegistration | None:
        return next((b for b in self.brokers if b.broker_name == broker_name and b.broker_id == broker_id), None)

    def masters(self) -> list[BrokerRegistration]:
        """The live masters (broker id 0, a master role), in broker-name order."""
        return [b for b in self.brokers if b.is_master]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every live broker (name, id, role, room, endpoint, epoch, topics) and the
        topics declared for the whole cluster (what ``plugmq admin cluster-list`` shows)."""
        return {
            "cluster": self.cluster, "connected": self.connected,
            "brokers": [b.as_dict() for b in self.brokers],
            "topics": {name: {"queues": t.queue_count, "perm": int(t.permission), "auto_created": t.auto_created}
                       for name, t in sorted(self.topics.items())},
        }


ClusterListener = Callable[[ClusterView], None]
"""Called with every new ClusterView (on the cluster service's thread: return quickly)."""

MastershipListener = Callable[["Mastership | None"], None]
"""Called with the Mastership when an election is won, and with None when it is lost."""


@attrs.frozen
class ClusterContext(PluginContext):
    """PluginContext plus the name of the cluster the broker joins (``[cluster] name``)."""

    cluster_name: str = ""


@runtime_checkable
class ClusterService(Protocol):
    """A broker's session with its cluster's name service.

    The registration is ephemeral: it disappears when the session ends (``close``, or a crash once
    the session timeout passes), and the service registers again by itself when a lost session is
    replaced by a new one. A dead peer, a lost connection or an expired session never raises into
    the broker: the service logs what happened and heals when the name service is back. Listeners
    run on the service's own thread and must return quickly.
    """

    def register(self, registration: BrokerRegistration) -> None:
        """Publish this broker (replacing this service's earlier registration), waiting briefly for it.

        If an earlier session (a previous run that died) still holds the same broker name and id,
        the registration is published once that session expires. Raises ClusterError only for a
        registration of another cluster than the service's.
        """

    def update_topics(self, topics: Mapping[str, TopicRegistration]) -> None:
        """Replace the registered topics; kept and published on reconnect while disconnected."""

    def unregister(self) -> None:
        """Withdraw the registration at once (clean shutdown); routes stop naming this broker."""

    def declare_topic(self, topic: str, declaration: ClusterTopic) -> None:
        """Record a cluster-wide topic (create, or grow its queue count); persistent, not ephemeral.

        Raises ClusterError when the name service cannot be reached.
        """

    def view(self) -> ClusterView:
        """The latest snapshot of the live brokers and declared topics (no round trip); already
        read when the factory returns the service, so a one-shot admin tool can use it at once."""

    def subscribe(self, listener: ClusterListener) -> Callable[[], None]:
        """Call ``listener(view)`` now and after every change; returns the function that unsubscribes."""

    def campaign(self, listener: MastershipListener) -> None:
        """Stand for master of the registered broker name, until ``withdraw`` or ``close``.

        ``listener`` gets the Mastership (with a new, higher epoch) each time an election is won and
        None when mastership is lost (session expired, withdrawn). Call ``register`` first.
        """

    def withdraw(self) -> None:
        """Stop standing for master, giving mastership up if held."""

    def current_epoch(self, broker_name: str) -> int:
        """The latest epoch granted for ``broker_name`` (0 if none), read from the name service."""

    @property
    def connected(self) -> bool:
        """Whether the session with the name service is up right now."""

    def close(self) -> None:
        """End the session: the registration disappears and campaigns stop. Idempotent."""


@runtime_checkable
class TopicUndeclaring(Protocol):
    """A cluster service that can withdraw a topic's cluster-wide declaration (an optional
    capability: ``plugmq admin topic-delete`` of a declared topic needs it)."""

    def undeclare_topic(self, topic: str) -> bool:
        """Remove the declaration of ``topic``; True when there was one. Every member that watches
        the view sees it go (and its masters delete the topic: plugmq serve's cluster member).

        Raises ClusterError when the name service cannot be reached.
        """
