"""The ZooKeeper name service: one kazoo session per broker, registrations as ephemeral znodes.

Everything that talks to ZooKeeper after start-up runs on one worker thread, fed by kazoo's
watches and session events, so a broker thread never waits on a ZooKeeper that is gone: it
records what it wants published and returns. The view is a snapshot re-read in full after each
change (children of ``brokers/`` and ``topics/``; the data watch on ``changes`` for updates in
place), which is cheap for the tens of brokers a cluster holds and never misses an event that
ZooKeeper's one-shot watches coalesced.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from plugmq.core import BrokerRegistration, ClusterView, ValidationError
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts.cluster import ClusterListener, ClusterTopic, MastershipListener, TopicRegistration
from plugmq.core.contracts.leadership import Eligibility, InSyncSet
from plugmq.core.errors import ClusterError
from plugmq.core.logs import get_logger
from plugmq.kit.clustersecret import read_secret
from plugmq.plugins.cluster_zk.election import Campaign
from plugmq.plugins.cluster_zk.leadership import Claim, claim, parse_in_sync
from plugmq.plugins.cluster_zk.options import ZkOptions
from plugmq.plugins.cluster_zk.paths import ZkPaths
from plugmq.plugins.cluster_zk.security import OPEN_ACL, ZkSecurity

__all__ = ["ZkClusterService"]

log = get_logger(__name__)

# ZooKeeper errors, and kazoo's own timeout for a call that got no answer in time.
_ZK_ERRORS = (KazooException, KazooTimeoutError)
_CLOSE_POLL_S = 0.1  # how often a call in flight looks whether the service is closing


class ZkClusterService:
    """A broker's session with ZooKeeper: registration, the cluster view, topics, elections."""

    def __init__(self, options: ZkOptions, cluster: str, broker_name: str, clock: Clock | None = None) -> None:
        self._options = options
        self.clock: Clock = clock or SystemClock()
        self._negotiated_s = options.session_timeout_s
        self._cluster = cluster
        self._broker_name = broker_name
        self.paths = ZkPaths(options.chroot, cluster)
        self._security = ZkSecurity(read_secret(options.secret_file, what="plugins.cluster_zk.secret_file")
                                    if options.secret_file else None, cluster)
        # A call that gets no answer within this is given up (and retried when the session is back).
        self._op_timeout = min(max(options.session_timeout_s, 5.0), 10.0)
        self._log = log.bind(cluster=cluster, broker=broker_name, zookeeper=options.hosts)
        self._lock = threading.Lock()
        self._notify_lock = threading.Lock()
        self._refresh_lock = threading.Lock()  # one re-read at a time, so views are published in order
        self._closed = False
        self._registration: BrokerRegistration | None = None
        self._published_by: int | None = None  # session id that owns our node, when published
        self._waiting_for: int | None = None  # session id of an earlier run still holding our node
        self._ready = False  # base paths exist: watches may read
        self._session_lost = False
        self._listeners: list[ClusterListener] = []
        self._view = ClusterView(cluster)
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._refresh_queued = False
        self._campaign: Campaign | None = None
        self.client = KazooClient(
            hosts=options.hosts, timeout=options.session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
            command_retry={"max_tries": 3, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
            auth_data=self._security.auth_data, default_acl=self._security.acl,
            use_ssl=options.tls, ca=options.tls_ca or None, certfile=options.tls_cert or None,
            keyfile=options.tls_key or None, verify_certs=True, check_hostname=options.tls_check_hostname,
        )
        self.client.add_listener(self._state_changed)
        self._note_negotiated_timeout()
        try:
            self.client.start(timeout=options.connect_timeout_s)
        except _ZK_ERRORS as exc:
            self.client.stop()
            self.client.close()
            raise ClusterError(
                f"cannot reach ZooKeeper at {options.hosts} within {options.connect_timeout_s:g} s "
                f"({type(exc).__name__}); start ZooKeeper there or fix plugins.cluster_zk.hosts"
                + (" (with tls_ca set: hosts must name TLS ports, whose certificates tls_ca signed, and the "
                   "ensemble must accept tls_cert)" if options.tls else "")
            ) from exc
        self._worker = threading.Thread(target=self._work, name=f"plugmq-zk-{broker_name}", daemon=True)
        self._worker.start()
        try:
            # The chroot may hold other clusters: it stays open; the cluster's own nodes carry its ACL.
            self.wait(self.client.ensure_path_async(options.chroot, acl=OPEN_ACL))
            for path in self.paths.directories():
                self.wait(self.client.ensure_path_async(path))
            try:
                self.wait(self.client.create_async(self.paths.changes, b"0"))
            except NodeExistsError:
                pass
            if self._security.enabled and not self._has_cluster_acl(self.paths.base):
                self._protect(self.paths.base)
        except NoAuthError as exc:
            self.close()
            raise ClusterError(f"ZooKeeper at {options.hosts} refused this broker's credential on {self.paths.base} "
                               "(NoAuth): the cluster's nodes were made with another secret_file, or without one "
                               "by a stranger; give every broker the cluster's [plugins.cluster_zk] secret_file") from exc
        except _ZK_ERRORS as exc:
            self.close()
            raise ClusterError(f"ZooKeeper at {options.hosts} refused to create {self.paths.base}: {exc!r}; "
                               "check the ensemble's health and the chroot option") from exc
        self._ready = True
        try:
            self._refresh()  # the view is accurate from the start (an admin tool reads it at once)
        except _ZK_ERRORS as exc:
            self.close()
            raise ClusterError(f"ZooKeeper at {options.hosts} did not answer reading {self.paths.base}: {exc!r}") from exc
        ChildrenWatch(self.client, self.paths.brokers, self._watched)
        ChildrenWatch(self.client, self.paths.topics, self._watched)
        DataWatch(self.client, self.paths.changes, self._watched)
        self._log.info("joined the cluster's name service", chroot=options.chroot,
                       session_timeout_s=options.session_timeout_s)

    # ------------------------------------------------------------------------------ plumbing
    def _has_cluster_acl(self, path: str) -> bool:
        acls, _ = self.wait(self.client.get_acls_async(path))
        return list(acls) == self._security.acl

    def _protect(self, path: str) -> None:
        """Give ``path`` and every node below it the cluster's ACL when it has another one (a
        cluster that ran without a secret before, or nodes created by hand)."""
        acls, _ = self.wait(self.client.get_acls_async(path))
        if list(acls) != self._security.acl:
            self.wait(self.client.set_acls_async(path, self._security.acl))
            self._log.warning("ZooKeeper node had another ACL; only the cluster's credential may use it now",
                              node=path, was=[str(a) for a in acls])
        for child in self.wait(self.client.get_children_async(path)):
            self._protect(f"{path}/{child}")

    def _note_negotiated_timeout(self) -> None:
        """Keep the session timeout ZooKeeper grants: a lease must be shorter than that one, and
        the server may grant less than asked (its maxSessionTimeout). kazoo only logs it, so the
        connection's handshake (which returns two thirds of it as its read timeout) is wrapped."""
        connection = getattr(self.client, "_connection", None)
        handshake = getattr(connection, "_connect", None)
        if handshake is None:
            self._log.warning("cannot see the session timeout ZooKeeper grants (kazoo changed); the lease "
                              "assumes the one asked for", session_timeout_s=self._options.session_timeout_s)
            return

        def connect(*args: Any, **kwargs: Any) -> Any:
            result = handshake(*args, **kwargs)
            granted = float(result[0]) * 1.5 / 1000
            if abs(granted - self._negotiated_s) > 0.01:
                self._log.info("ZooKeeper granted a session timeout", asked_s=self._options.session_timeout_s,
                               granted_s=round(granted, 3))
            self._negotiated_s = granted
            return result

        connection._connect = connect  # type: ignore[union-attr]

    @property
    def lease_s(self) -> float:
        """How long an elected master's last confirmed contact with ZooKeeper stays good for acks."""
        return min(self._options.session_timeout_s, self._negotiated_s) * self._options.lease_fraction

    def wait(self, result: Any) -> Any:
        """The result of a kazoo async call, waiting at most the call timeout.

        A closing service stops waiting at once: with ZooKeeper gone, a broker's shutdown would
        otherwise sit out every queued call's timeout.
        """
        deadline = time.monotonic() + self._op_timeout
        while not result.ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            result.wait(min(remaining, _CLOSE_POLL_S))
            if self._closed and not result.ready():
                raise ConnectionClosedError("the cluster service is closing; the call was given up")
        return result.get(block=False)


    def _submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except _ZK_ERRORS as exc:
                self._log.warning("ZooKeeper call failed; retried when the session is back", error=repr(exc))
            except Exception:  # noqa: BLE001 - the worker must outlive one failed task; logged
                self._log.exception("cluster service task failed")

    def _watched(self, *_args: Any) -> None:
        """A kazoo watch fired (kazoo's thread): re-read the view on the worker, once per burst."""
        with self._lock:
            if self._refresh_queued or self._closed or not self._ready:
                return
            self._refresh_queued = True
        self._submit(self._refresh)

    def _state_changed(self, state: str) -> None:
        """kazoo's session listener (its connection thread: never block here)."""
        if self._closed:
            return  # close() ends the session on purpose
        if state == KazooState.LOST:
            self._log.warning("ZooKeeper session expired: this broker is out of every route until it registers "
                              "again with a new session")
            with self._lock:
                self._session_lost = True
                self._published_by = None
        elif state == KazooState.SUSPENDED:
            self._log.warning("connection to ZooKeeper lost; the session survives if it comes back within "
                              "the session timeout", session_timeout_s=self._options.session_timeout_s)
        elif state == KazooState.CONNECTED:
            with self._lock:
                renewed, self._session_lost = self._session_lost, False
            if renewed:
                self._log.info("ZooKeeper session renewed; registering again")
            else:
                self._log.info("connected to ZooKeeper")
            self._submit(self._publish)
            self._watched()
        if self._campaign is not None:
            self._campaign.session_state(state)
        self._submit(self._mark_connection)

    # ------------------------------------------------------------------------------ registration
    def register(self, registration: BrokerRegistration) -> None:
        if registration.cluster != self._cluster:
            raise ClusterError(f"registration for cluster {registration.cluster!r} handed to the service of "
                               f"cluster {self._cluster!r}")
        with self._lock:
            previous = self._registration
            self._registration = attrs.evolve(registration, epoch=previous.epoch) if previous else registration
        attempted = threading.Event()
        self._submit(lambda: self._publish_then(attempted))
        # Published (or found held by an earlier session) before this returns, so a broker that
        # says it serves is already in the routes; a ZooKeeper that does not answer is not waited for.
        attempted.wait(self._op_timeout)

    def _publish_then(self, attempted: threading.Event) -> None:
        try:
            self._publish()
        finally:
            attempted.set()

    def update_topics(self, topics: Mapping[str, TopicRegistration]) -> None:
        with self._lock:
            if self._registration is None:
                raise ClusterError("update_topics before register: register the broker first")
            self._registration = attrs.evolve(self._registration, topics=topics)
        self._submit(self._publish)

    def unregister(self) -> None:
        with self._lock:
            registration, self._registration = self._registration, None
        if registration is None:
            return
        path = self.paths.broker(registration.key)
        try:
            stat = self.wait(self.client.exists_async(path))
            if stat is not None and stat.ephemeralOwner == self._session_id():
                self.wait(self.client.delete_async(path))
            self._log.info("unregistered from the cluster")
        except (NoNodeError, *_ZK_ERRORS) as exc:
            self._log.warning("could not delete the registration; it goes when the session ends", error=repr(exc))

    def _session_id(self) -> int | None:
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def _set_epoch(self, epoch: int) -> None:
        with self._lock:
            if self._registration is not None:
                self._registration = attrs.evolve(self._registration, epoch=epoch)
        self._submit(self._publish)

    def _publish(self) -> None:
        """Create or update our ephemeral node (worker thread)."""
        with self._lock:
            registration = self._registration
        if registration is None or self._closed or not self.connected:
            return
        path = self.paths.broker(registration.key)
        data = self._security.seal(registration.as_dict())
        session = self._session_id()
        stat = self.wait(self.client.exists_async(path, watch=self._own_node_event))
        if stat is not None and not stat.ephemeralOwner:
            # Registrations are ephemeral: a persistent node under our name was never a broker's
            # session (forged, or made by hand); it must not keep our routes.
            self._log.warning("a persistent node held this broker's registration; deleted", node=path)
            self.wait(self.client.delete_async(path, version=stat.version))
            self._submit(self._publish)
            return
        if stat is None:
            try:
                self.wait(self.client.create_async(path, data, ephemeral=True))
            except NodeExistsError:
                self._submit(self._publish)  # raced with an earlier session's node: look again
                return
            if self._published_by != session:
                self._log.info("registered", endpoint=registration.endpoint, room=registration.room or None,
                               role=registration.role.value, broker_id=registration.broker_id)
            self._published_by = session
            self._waiting_for = None
        elif stat.ephemeralOwner == session:
            current, _ = self.wait(self.client.get_async(path))
            if current != data:  # our own write fires the watch too: never write the same data again
                self._commit([(path, data, -1), (self.paths.changes, b"", -1)])
        elif self._waiting_for != stat.ephemeralOwner:
            # A previous run that died keeps its node until its session times out; taking it over
            # would also hide a second process misconfigured with our name and id.
            self._waiting_for = stat.ephemeralOwner
            self._log.warning("broker name and id still registered by another ZooKeeper session (a previous run "
                              "that died, or another broker with this name and id); registering once it goes",
                              node=path, owner=hex(stat.ephemeralOwner))

    def _commit(self, writes: list[tuple[str, bytes, int]]) -> None:
        """Set several nodes' data in one ZooKeeper transaction (path, data, expected version or -1).

        kazoo reports a failed transaction as exceptions among the results instead of raising.
        """
        transaction = self.client.transaction()
        for path, data, version in writes:
            transaction.set_data(path, data, version=version)
        results = self.wait(transaction.commit_async())
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failures:
            raise failures[0]

    def _own_node_event(self, _event: WatchedEvent) -> None:
        """Our node (or the one an earlier session holds) changed: look again, re-arming the watch."""
        self._submit(self._publish)

    # ------------------------------------------------------------------------------ topics
    def declare_topic(self, topic: str, declaration: ClusterTopic) -> None:
        path = self.paths.topic(topic)
        data = json.dumps({"queues": declaration.queue_count, "perm": int(declaration.permission),
                           "auto": declaration.auto_created}).encode()
        try:
            for _ in range(16):  # compare-and-set against concurrent declarations
                try:
                    raw, stat = self.wait(self.client.get_async(path))
                except NoNodeError:
                    try:
                        self.wait(self.client.create_async(path, data))
                        return
                    except NodeExistsError:
                        continue
                current = _declaration(raw)
                if current is not None and current.queue_count >= declaration.queue_count and (
                        declaration.auto_created or not current.auto_created):
                    return  # already declared with at least as many queues
                try:
                    self._commit([(path, data, stat.version), (self.paths.changes, b"", -1)])
                    return
                except BadVersionError:
                    continue
        except _ZK_ERRORS as exc:
            raise ClusterError(f"cannot declare topic {topic!r} in ZooKeeper at {self._options.hosts}: {exc!r}") from exc
        raise ClusterError(f"topic {topic!r} was re-declared concurrently 16 times in a row; try again")

    def undeclare_topic(self, topic: str) -> bool:
        """Delete the topic's declaration node (and mark the view changed) in one transaction."""
        transaction = self.client.transaction()
        transaction.delete(self.paths.topic(topic))
        transaction.set_data(self.paths.changes, b"", -1)
        try:
            results = self.wait(transaction.commit_async())
        except _ZK_ERRORS as exc:
            raise ClusterError(f"cannot remove topic {topic!r}'s declaration in ZooKeeper at {self._options.hosts}: "
                               f"{exc!r}") from exc
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if isinstance(failure, NoNodeError):
            return False  # not declared (or another broker removed it first)
        if failure is not None:
            raise ClusterError(f"cannot remove topic {topic!r}'s declaration in ZooKeeper: {failure!r}")
        return True

    # ------------------------------------------------------------------------------ view
    def _refresh(self) -> None:
        """Re-read every registration and declaration (worker thread)."""
        with self._refresh_lock:
            self._read_view()

    def _read_view(self) -> None:
        with self._lock:
            self._refresh_queued = False
        if self._closed:
            return
        brokers: list[BrokerRegistration] = []
        for key in self.wait(self.client.get_children_async(self.paths.brokers)):
            try:
                raw, stat = self.wait(self.client.get_async(self.paths.broker(key)))
                if not stat.ephemeralOwner:
                    raise ValidationError("a persistent node: a broker registers with its session (ephemeral)")
                registration = BrokerRegistration.from_dict(self._security.open(raw))
                if registration.key != key or registration.cluster != self._cluster:
                    raise ValidationError(f"it names {registration.key} of cluster {registration.cluster!r}")
                brokers.append(registration)
            except NoNodeError:
                continue  # gone between the listing and the read
            except (ValueError, ValidationError) as exc:
                self._log.warning("broker registration ignored (never routed)", node=self.paths.broker(key),
                                  error=str(exc))
        topics: dict[str, ClusterTopic] = {}
        for name in self.wait(self.client.get_children_async(self.paths.topics)):
            try:
                raw, _ = self.wait(self.client.get_async(self.paths.topic(name)))
            except NoNodeError:
                continue
            declaration = _declaration(raw)
            if declaration is None:
                # The node stands: keep the last readable declaration, if any. Dropping it would read
                # as a withdrawn declaration, and members delete a withdrawn topic (topic-delete).
                kept = self._view.topics.get(name)
                self._log.warning("unreadable topic declaration ignored", node=self.paths.topic(name),
                                  last_readable_kept=kept is not None)
                if kept is not None:
                    topics[name] = kept
            else:
                topics[name] = declaration
        brokers.sort(key=lambda b: (b.broker_name, b.broker_id))
        self._publish_view(ClusterView(self._cluster, tuple(brokers), topics, connected=self.connected))

    def _mark_connection(self) -> None:
        self._publish_view(attrs.evolve(self._view, connected=self.connected))

    def _publish_view(self, view: ClusterView) -> None:
        with self._notify_lock:
            previous, self._view = self._view, view
            if view == previous:
                return
            self._log_changes(previous, view)
            for listener in list(self._listeners):
                self._call(listener, view)

    def _log_changes(self, before: ClusterView, after: ClusterView) -> None:
        old = {b.key: b for b in before.brokers}
        new = {b.key: b for b in after.brokers}
        for key in new.keys() - old.keys():
            self._log.info("broker joined", node=key, endpoint=new[key].endpoint, room=new[key].room or None)
        for key in old.keys() - new.keys():
            self._log.warning("broker left (session ended)", node=key, endpoint=old[key].endpoint)
        if before.connected != after.connected:
            self._log.info("cluster view is live again" if after.connected else
                           "cluster view may be stale until ZooKeeper is back")

    def _call(self, listener: ClusterListener, view: ClusterView) -> None:
        try:
            listener(view)
        except Exception:  # noqa: BLE001 - a broken listener must not stop the others; logged
            self._log.exception("cluster listener failed", listener=repr(listener))

    def view(self) -> ClusterView:
        return self._view

    def subscribe(self, listener: ClusterListener) -> Callable[[], None]:
        with self._notify_lock:
            self._listeners.append(listener)
            self._call(listener, self._view)

        def unsubscribe() -> None:
            with self._notify_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return unsubscribe

    # ------------------------------------------------------------------------------ elections
    def campaign(self, listener: MastershipListener) -> None:
        self._start_campaign(listener, None)

    def _start_campaign(self, listener: MastershipListener, eligible: Eligibility | None) -> None:
        with self._lock:
            registration = self._registration
        if registration is None:
            raise ClusterError("campaign before register: register the broker first, its name and id stand")
        if self._campaign is not None:
            raise ClusterError(f"broker {registration.key} already stands for master; withdraw first")
        self._campaign = Campaign(self, registration.broker_name, registration.broker_id, listener, eligible)
        self._campaign.start()

    def stand(self, listener: MastershipListener, eligible: Eligibility) -> None:
        self._start_campaign(listener, eligible)

    def in_sync_set(self, broker_name: str) -> InSyncSet | None:
        try:
            raw, stat = self.wait(self.client.get_async(self.paths.insync(broker_name)))
        except NoNodeError:
            return None
        except _ZK_ERRORS as exc:
            raise ClusterError(f"cannot read the in-sync set of {broker_name!r} from ZooKeeper at "
                               f"{self._options.hosts}: {exc!r}") from exc
        try:
            return parse_in_sync(raw, stat.version)
        except ValidationError as exc:
            raise ClusterError(f"the in-sync set of {broker_name!r} in ZooKeeper is unreadable: {exc}") from exc

    def claim(self, broker_name: str, broker_id: int, eligible: Eligibility, *, lock_node: str) -> Claim | str:
        """See :func:`plugmq.plugins.cluster_zk.leadership.claim` (the campaign's thread)."""
        return claim(self, broker_name, broker_id, eligible, lock_node=lock_node)

    def withdraw(self) -> None:
        campaign, self._campaign = self._campaign, None
        if campaign is not None:
            campaign.stop()

    def bump_epoch(self, broker_name: str) -> int:
        """Grant the next epoch of ``broker_name`` (compare-and-set; called by the election winner)."""
        path = self.paths.epoch(broker_name)
        while True:
            try:
                raw, stat = self.wait(self.client.get_async(path))
            except NoNodeError:
                try:
                    self.wait(self.client.create_async(path, b"1"))
                    return 1
                except NodeExistsError:
                    continue
            epoch = int(raw or b"0") + 1
            try:
                self.wait(self.client.set_async(path, str(epoch).encode(), version=stat.version))
                return epoch
            except BadVersionError:
                continue

    def current_epoch(self, broker_name: str) -> int:
        try:
            raw, _ = self.wait(self.client.get_async(self.paths.epoch(broker_name)))
        except NoNodeError:
            return 0
        except _ZK_ERRORS as exc:
            raise ClusterError(f"cannot read the epoch of {broker_name!r} from ZooKeeper at "
                               f"{self._options.hosts}: {exc!r}") from exc
        return int(raw or b"0")

    def election_changed(self, epoch: int) -> None:
        """The campaign won (epoch > 0) or lost (0): publish it with the registration."""
        self._set_epoch(epoch)

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def connected(self) -> bool:
        return not self._closed and self.client.state == KazooState.CONNECTED

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.withdraw()
        self._tasks.put(None)
        if self._worker.is_alive() and self._worker is not threading.current_thread():
            self._worker.join(timeout=self._op_timeout * 2)
        try:
            self.client.stop()  # ends the session: ZooKeeper deletes our ephemeral nodes now
        finally:
            self.client.close()
        self._log.info("left the cluster's name service")


def _declaration(raw: bytes | None) -> ClusterTopic | None:
    try:
        data = json.loads(raw or b"")
        return ClusterTopic(data["queues"], data.get("perm", 6), bool(data.get("auto", False)))
    except (ValueError, KeyError, TypeError, ValidationError):
        return None
