"""A served broker's place in its cluster: registration, topics kept in step, routes over live brokers.

``plugmq serve`` registers the broker with its advertised endpoint once it listens, keeps the
registered topics equal to its topic table, declares every topic it creates for the cluster (so
the other masters create it too and producers spread over all of them), applies the cluster's
declarations to its own topic table, stands for master of its broker name, and answers routes
from the live view the cluster service keeps. A broker whose session is down still routes to
itself: it is alive and serving whoever reaches it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from plugmq.broker.failover import Failover
from plugmq.broker.routes import RoutedQueue, declaration_applies, registered_topics, topic_route
from plugmq.core.contracts import (
    BrokerRegistration,
    BrokerRole,
    ClusterService,
    ClusterTopic,
    ClusterView,
    FailoverReplication,
    Mastership,
    TopicPermission,
)
from plugmq.core.errors import ClusterError, ConfigError, ReadOnlyBrokerError, TopicError
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue
from plugmq.core.names import is_system_topic

if TYPE_CHECKING:
    from plugmq.broker.ports import Served

__all__ = ["ClusterMember", "LocalRoutes", "advertised_endpoint"]

log = get_logger(__name__)


def advertised_endpoint(bound: str, advertise: str | None) -> str:
    """Where other hosts reach this broker: ``[server] advertise``, else the bound address."""
    endpoint = advertise or bound
    host = endpoint.rpartition(":")[0].strip("[]")
    if host in ("0.0.0.0", "::", ""):
        raise ConfigError(f"plugmq serve listens on {bound} but a cluster routes clients to each broker's own "
                          "address; set [server] advertise = \"<this host's address>:<port>\"")
    return endpoint


class LocalRoutes:
    """A broker alone: its own queues, and itself as the whole view (for room-aware groups)."""

    def __init__(self, broker: Served, endpoint: str) -> None:
        config = broker.config
        self.registration = BrokerRegistration(cluster="local", broker_name=broker.name, endpoint=endpoint,
                                               broker_id=config.broker_id, room=config.room,
                                               role=BrokerRole(config.role))

    def view(self) -> ClusterView:
        return ClusterView("local", (self.registration,))

    def routed(self, queues: list[MessageQueue], permission: TopicPermission) -> list[RoutedQueue]:
        return [RoutedQueue(queue, self.registration, permission) for queue in queues]


class ClusterMember:
    """Joins the cluster for a served broker and answers routes from the live view. Thread-safe."""

    def __init__(self, broker: Served, service: ClusterService, endpoint: str) -> None:
        if broker.config.cluster_name is None:
            raise ConfigError("a cluster member needs [cluster] name in the broker config")
        self.broker = broker
        self.service = service
        self.endpoint = endpoint
        self.cluster = broker.config.cluster_name
        self._log = log.bind(cluster=self.cluster, broker=broker.name)
        self._lock = threading.Lock()
        self._declared: dict[str, ClusterTopic] = {}  # our own declarations, until a view shows them
        self._seen_declared: set[str] = set()  # the topics the last connected view declared
        self._mastership: Mastership | None = None
        self._failover: Failover | None = None  # [broker] failover: the election moves the master
        self._applier = ThreadPoolExecutor(1, thread_name_prefix="plugmq-cluster-apply")
        self._unsubscribe: list[Callable[[], None]] = []
        self._joined = False

    # ------------------------------------------------------------------------------ lifecycle
    def registration(self) -> BrokerRegistration:
        config = self.broker.config
        mastership = self._failover.mastership if self._failover is not None else self._mastership
        epoch = mastership.epoch if mastership is not None else 0
        replication = self.broker.replication
        address = replication.master_address if isinstance(replication, FailoverReplication) else ""
        return BrokerRegistration(
            cluster=self.cluster, broker_name=self.broker.name, endpoint=self.endpoint, broker_id=config.broker_id,
            room=config.room, role=self.broker.role, topics=registered_topics(self.broker.topics.all()),
            auto_create_topics=config.auto_create_topic, default_queue_count=config.default_queue_count, epoch=epoch,
            replication=address, log_epoch=self.broker.epoch, failover=config.failover)

    def join(self) -> None:
        """Register, follow the view, stand for master (masters only)."""
        self.service.register(self.registration())
        self._joined = True
        self.broker.topics.subscribe(self._topic_changed)
        self.service.update_topics(registered_topics(self.broker.topics.all()))  # any created meanwhile
        for topic, count in self.broker.topics.all().items():
            self._declare(topic, count)  # topics created before the broker joined (or while it was away)
        self._unsubscribe.append(self.service.subscribe(self._view_changed))
        if self.broker.config.failover:
            self._failover = Failover(self.broker, self.service, self._republish)
            self._failover.start()
        elif BrokerRole(self.broker.config.role).is_master:
            self.service.campaign(self._mastership_changed)

    def leave(self) -> None:
        """Withdraw from the routes at once (clean shutdown); the broker closes the session later."""
        if not self._joined:
            return
        self._joined = False
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._failover is not None:
            self._failover.close()
        self.service.withdraw()
        self.service.unregister()
        self._applier.shutdown(wait=True)

    def _republish(self) -> None:
        """The broker's role changed (failover): publish it, so routes follow at once."""
        if self._joined:
            self.service.register(self.registration())

    # ------------------------------------------------------------------------------ topics
    def _topic_changed(self, topic: str, count: int) -> None:
        """Our topic table grew or lost a topic (the changing thread; ``count`` 0: deleted):
        publish it, and declare a grown topic for the cluster."""
        if not self._joined:
            return
        self.service.update_topics(registered_topics(self.broker.topics.all()))
        if count > 0:
            self._declare(topic, count)

    def _declare(self, topic: str, count: int) -> None:
        if is_system_topic(topic):
            return  # retry, DLQ and internal topics stay where they were created
        known = self.service.view().topics.get(topic)
        with self._lock:
            mine = self._declared.get(topic)
        if (known is not None and known.queue_count >= count) or (mine is not None and mine.queue_count >= count):
            return
        declaration = ClusterTopic(count, TopicPermission.READ_WRITE, auto_created=True)
        with self._lock:
            self._declared[topic] = declaration  # routed at once; written to the name service in the background
        try:
            self._applier.submit(self._publish_declaration, topic, declaration)
        except RuntimeError:
            pass  # leaving

    def _publish_declaration(self, topic: str, declaration: ClusterTopic) -> None:
        try:
            self.service.declare_topic(topic, declaration)
        except ClusterError as exc:
            self._log.warning("topic not declared for the cluster yet; declared again with the next live view",
                              topic=topic, error=str(exc))

    def _view_changed(self, view: ClusterView) -> None:
        """A new view (the cluster service's thread): forget declarations it shows, apply the rest,
        and delete here the topics whose declaration was withdrawn (a cluster-wide topic delete)."""
        with self._lock:
            for topic in [t for t, d in self._declared.items()
                          if (seen := view.topics.get(t)) is not None and seen.queue_count >= d.queue_count]:
                del self._declared[topic]
            withdrawn = self._withdrawn(view)
            unseen = dict(self._declared)
        held = sorted(t for t in withdrawn if self.broker.topics.get(t) is not None)
        if held and self._joined:
            self._later(self._delete_withdrawn, held)
        if view.connected and self._joined:
            for topic, declaration in unseen.items():  # again: it may have failed while ZooKeeper was away
                if not self._later(self._publish_declaration, topic, declaration):
                    break
        me = self.registration()
        missing = {topic: declaration for topic, declaration in view.topics.items()
                   if declaration_applies(declaration, me)
                   and (self.broker.topics.get(topic) or 0) < declaration.queue_count}
        if missing and self._joined:
            self._later(self._apply, missing)

    def _later(self, work: Callable[..., None], *args: Any) -> bool:
        """Run ``work(*args)`` on the applier thread; False when the member is leaving."""
        try:
            self._applier.submit(work, *args)
        except RuntimeError:
            return False  # the applier shut down: leaving
        return True

    def _apply(self, declarations: dict[str, ClusterTopic]) -> None:
        for topic, declaration in declarations.items():
            try:
                self.broker.create_topic(topic, declaration.queue_count)
                self._log.info("created a topic declared for the cluster", topic=topic,
                               queues=declaration.queue_count)
            except Exception:  # noqa: BLE001 - one bad declaration must not stop the others; logged
                self._log.exception("could not create a topic declared for the cluster", topic=topic)

    def _withdrawn(self, view: ClusterView) -> set[str]:
        """The topics the last connected view declared and ``view`` does not (with the lock held).
        A view read while disconnected may lack topics that still stand: it changes nothing."""
        if not view.connected:
            return set()
        withdrawn = self._seen_declared - set(view.topics)
        self._seen_declared = set(view.topics)
        for topic in withdrawn:
            self._declared.pop(topic, None)
        return withdrawn

    def _delete_withdrawn(self, topics: list[str]) -> None:
        """Delete topics whose cluster declaration another member withdrew (``topic-delete``)."""
        for topic in topics:
            try:
                deletion = self.broker.delete_topic(topic)
            except ReadOnlyBrokerError:
                continue  # a slave: its master's deletion reaches it through the replicated log
            except TopicError:
                continue  # gone already (deleted here, or by the member that withdrew it)
            except Exception:  # noqa: BLE001 - one topic must not stop the others; logged
                self._log.exception("could not delete a topic whose cluster declaration was withdrawn", topic=topic)
                continue
            self._log.info("deleted a topic whose cluster declaration was withdrawn", topic=topic,
                           queues=deletion.queues, groups=list(deletion.groups))

    # ------------------------------------------------------------------------------ routes
    def view(self) -> ClusterView:
        """The live view, with this broker in it even while its own session is down."""
        view = self.service.view()
        if view.broker(self.broker.name, self.broker.config.broker_id) is None:
            brokers = sorted((*view.brokers, self.registration()), key=lambda b: (b.broker_name, b.broker_id))
            view = ClusterView(view.cluster or self.cluster, tuple(brokers), view.topics, view.connected)
        return view

    @property
    def auto_creates_topics(self) -> bool:
        return self.broker.config.auto_create_topic

    def live_master(self) -> BrokerRegistration | None:
        """The live master of this broker's name, when it is another broker (None while none is up)."""
        return next((b for b in self.service.view().brokers if b.broker_name == self.broker.name and b.is_master
                     and b.broker_id != self.broker.config.broker_id), None)

    def failover_peers(self, master: BrokerRegistration) -> list[BrokerRegistration]:
        """The other live brokers of ``master``'s name that forward clients to their master
        (failover): routes list them beside it, so a client whose master dies reaches one."""
        return [b for b in self.view().brokers if b.broker_name == master.broker_name
                and b.broker_id != master.broker_id and b.failover]

    def check_consumer_reads(self) -> None:
        """ReadOnlyBrokerError on a slave whose master is up: its consumers read from the master.

        A slave hands out messages only while no master of its name is live (it is then routed
        read-only in the master's place); its pop progress stays in its memory, because its log
        must remain a prefix of the master's. Once a master is back, a receive here would hand out
        what the master hands out too: refused, so a consumer still holding the old route moves on
        with its next route refresh. Acks of what it handed out stay accepted."""
        if self.broker.role is not BrokerRole.SLAVE:
            return
        master = self.live_master()
        if master is not None:
            raise ReadOnlyBrokerError(
                f"broker {self.broker.name!r} (id {self.broker.config.broker_id}) is a slave and its master is up at "
                f"{master.endpoint}: consumers read from the master; query the route again (the official clients "
                "do every 30 s)")

    def route(self, topic: str) -> list[RoutedQueue]:
        with self._lock:
            declared = dict(self._declared)
        return topic_route(self.view(), topic, declared=declared)

    # ------------------------------------------------------------------------------ elections
    def _mastership_changed(self, mastership: Mastership | None) -> None:
        self._mastership = mastership
        if mastership is None:
            self._log.warning("no longer the elected master of this broker name")
