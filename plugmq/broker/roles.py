"""Roles and replication hooks: which role a broker plays, what it follows as a slave, failover.

:class:`Roles` says whether the broker takes writes and how long a send waits for a slave.
:class:`FollowedState` is what the replication plugin calls on this broker: records arrived from
the master (follow its topics, consumer offsets and pop progress), the log was cut (rebuild them),
and the hand-over of the consumer progress a slave's own readers made. :class:`RoleSwitch`
promotes and demotes the broker when its cluster's election says so (``plugmq.broker.failover``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import attrs

from plugmq.broker.commit import CommitGate
from plugmq.broker.dedup import DedupWindows
from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.events import Arrivals
from plugmq.broker.offsets import ConsumerOffsets
from plugmq.broker.pop import PopService
from plugmq.broker.replication import TopicFollower, read_only_error
from plugmq.broker.services import Services
from plugmq.config.broker import BrokerConfig
from plugmq.core.contracts import (
    BrokerRole,
    ConsumerHandover,
    FailoverReplication,
    LogPositioned,
    MessageStore,
    ReplicationService,
    has_capability,
)
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.errors import FencedError, ReplicationError
from plugmq.core.logs import get_logger
from plugmq.core.message import SendStatus

__all__ = ["FollowedState", "RoleSwitch", "Roles"]

log = get_logger(__name__)

# Read on every send: on Python 3.11 an Enum member read from its class costs ~100 ns, a module
# global ~7 ns (Broker.put takes ~2.5 us in all).
_SLAVE = BrokerRole.SLAVE
_SEND_OK = SendStatus.SEND_OK


class Roles:
    """The role a broker plays now and what it means for writes and acknowledgements.

    Built before the services whose journals ask it; the assembly attaches the replication
    service once it is open, before anything starts (until then nothing can wait for a slave).
    """

    def __init__(self, broker_name: str, config: BrokerConfig, store: MessageStore) -> None:
        self._name = broker_name
        self._store = store
        self._failover = config.failover
        # With failover the election picks the master: every broker starts as a slave, and
        # ``master_role`` names the mode it works in whenever it is master.
        self.master_role = BrokerRole(config.role)
        self.role = BrokerRole.SLAVE if config.failover else self.master_role
        self.lock = threading.RLock()
        self.replication: ReplicationService | None = None
        self.commit = CommitGate(broker_name, lambda: self.replication, lambda: self.role)
        self.promoted_at: float | None = None  # monotonic time of the last promotion (failover)
        self._acked: collections.Counter[int] = collections.Counter()  # sends answered OK, by epoch
        self._acked_lock = threading.Lock()

    def attach(self, replication: ReplicationService | None) -> None:
        """The broker's replication service (None: it has none)."""
        self.replication = replication

    def writable(self) -> bool:
        """False on a slave: only its master takes writes."""
        return self.role is not _SLAVE

    def check_writable(self, action: str = "take writes") -> None:
        """ReadOnlyBrokerError on a slave: only its master takes writes."""
        if self.role is _SLAVE:
            raise read_only_error(self._name, action)

    def await_replication(self, end_offset: int | None = None) -> SendStatus:
        """On a ``sync_master``: wait until a slave holds the log up to ``end_offset`` (default: its
        end now) and say how it went (SEND_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE);
        SEND_OK at once on any other broker."""
        if self.replication is None:
            return _SEND_OK
        if self.role is BrokerRole.ASYNC_MASTER and self.commit.source() is not None:
            # Acked at once, but only while this master is sure it leads (FencedError otherwise).
            return self.replication.await_replicated(end_offset or 0)
        if self.role is not BrokerRole.SYNC_MASTER:
            # A send stored just before a failover demotion: no slave will confirm it here.
            lost_race = self._failover and self.master_role is BrokerRole.SYNC_MASTER
            return SendStatus.SLAVE_NOT_AVAILABLE if lost_race and self.role is BrokerRole.SLAVE else SendStatus.SEND_OK
        if end_offset is None:
            end_offset = self._store.log_end_offset() if has_capability(self._store, LogPositioned) else 0
        return self.replication.await_replicated(end_offset)

    def settle_state(self, end_offset: int) -> SendStatus:
        """A state journal's record must be confirmed (consumer acks, offsets, pop progress): once
        committed where the replication keeps a commit point (plugmq.broker.commit)."""
        return self.commit.settle(end_offset, self.await_replication)

    def check_serving(self) -> None:
        """FencedError while this broker may hand out no messages (see plugmq.broker.commit).

        A failover slave hands out none either: the progress its readers made would live in its
        memory only, and the broker elected next (maybe another) would deliver again what they
        acknowledged. Its clients are forwarded to the master once one is elected."""
        if self._failover and self.role is BrokerRole.SLAVE:
            raise FencedError(f"broker {self._name!r} is a failover slave: it hands out no messages itself; "
                              "consumers read from the elected master (being elected now if none is up)")
        self.commit.visible_end()

    def count_acked(self, sends: int) -> None:
        """The server answered ``sends`` sends OK as this master (status: ``acked_by_epoch``)."""
        with self._acked_lock:
            self._acked[self.epoch] += sends

    def acked_by_epoch(self) -> dict[int, int]:
        with self._acked_lock:
            return dict(self._acked)

    @property
    def epoch(self) -> int:
        """The newest master epoch this broker's log knows (0 without failover)."""
        replication = self.replication  # every answered send asks: has_capability answers per class
        return replication.epoch if has_capability(replication, FailoverReplication) else 0

    def failover_replication(self, action: str) -> FailoverReplication:
        """The replication service, when it switches roles; ReplicationError naming ``action`` if not."""
        replication = self.replication
        if not isinstance(replication, FailoverReplication):
            raise ReplicationError(f"broker {self._name!r} cannot {action}: its replication plugin does not switch "
                                   "roles (capabilities.failover); use the ha plugin")
        return replication


@attrs.frozen
class FollowedState:
    """What the replication plugin calls on this broker (the ReplicationContext callbacks)."""

    _name: str
    _roles: Roles
    _topics: TopicFollower
    _offsets: ConsumerOffsets
    _pop: PopService
    _arrivals: Arrivals

    def follow(self) -> None:
        """Take what the log holds of the master's state: its topics, offsets and pop progress."""
        self._topics.refresh()
        self._offsets.follow()
        self._pop.state.follow()

    def replicated(self, _end_offset: int) -> None:
        """A slave appended replicated records: follow the master's state, wake long polls."""
        self.follow()
        self._arrivals.wake()

    def truncated(self, end_offset: int) -> None:
        """A slave cut its log back to where it agrees with a new master: the state it followed
        from the cut records is gone with them; rebuild it from the log."""
        self._topics.reload()
        self._offsets.reload()
        self._pop.state.reload()
        log.warning("followed state rebuilt after the log was cut", broker=self._name, log_end=end_offset)

    def handover(self) -> ConsumerHandover:
        """A slave connecting to a master: the pop progress its own readers made (served while no
        master was up), for the master to adopt."""
        return self._pop.state.handover()

    def handed_over(self, lanes: ConsumerHandover) -> None:
        """The master took the progress :meth:`handover` offered."""
        self._pop.state.handed_over(lanes)

    def adopt(self, lanes: ConsumerHandover, shared_end: int) -> int:
        """A master: a connecting slave's readers' progress moves this broker's pop lanes forward
        (within the log both share, up to ``shared_end``)."""
        if not self._roles.writable():
            # Between listening as master and taking writes (a promotion): the slave offers it again.
            raise read_only_error(self._name, "take a slave's consumer progress before it takes writes")
        moved = self._pop.adopt(ConsumerHandover(lanes), shared_end)  # a plugin may hand (g, t, q, d) rows
        if moved:
            self._arrivals.wake()
        return moved


@attrs.frozen
class RoleSwitch:
    """Promotion and demotion at failover: which services run and which state is followed."""

    _name: str
    _roles: Roles
    _followed: FollowedState
    _offsets: ConsumerOffsets
    _pop: PopService
    _services: Services
    _ledger: DelayLedger | None
    _dedup: DedupWindows
    _check_open: Callable[[], None]

    def promote(self, epoch: int, leadership: Leadership | None = None) -> None:
        """Become the master of this broker name for ``epoch`` (the election was won): take the
        rest of the followed state, write it as the services' first snapshots (the changes this
        broker's own readers made as a slave become durable), start the delay and transaction
        services (they replay their journals: what the old master decided stays decided, what
        it had open is checked back), and take writes as the master role. ``leadership``: the
        won election's lease and in-sync set, for the replication plugin."""
        roles = self._roles
        with roles.lock:
            self._check_open()
            replication = roles.failover_replication("become master")
            if leadership is None:
                replication.promote(epoch, roles.master_role)
            else:
                replication.promote(epoch, roles.master_role, leadership)
            self._followed.follow()
            self._dedup.load()  # the windows of what the log holds: a retry to this master is a duplicate too
            roles.role = roles.master_role
            self._offsets.compact()
            self._pop.state.compact()
            # Pending intents first: the delay plugin may hold stale copies from an earlier
            # mastership and deliver them as it starts; the write-back checks them against these.
            ledger = self._ledger
            taken_over = ledger.load() if ledger is not None else []
            self._services.start()
            delay = self._services.delay
            if ledger is not None and delay is not None and taken_over:
                ledger.schedule_taken_over(delay, taken_over)
            self._pop.start()  # dead-letter what ran out of attempts while no master could
            roles.promoted_at = time.monotonic()
        log.warning("broker promoted to master", broker=self._name, epoch=epoch, mode=roles.master_role.value)

    def demote(self, master: str | None) -> None:
        """Stop being master (the election was lost, or another broker holds a newer epoch): take
        no more writes, stop the delay and transaction services (rebuilt, not started, for a later
        promotion), and follow the master at replication address ``master`` (None: follow later,
        with :meth:`follow`). Sends of a ``sync_master`` still waiting for a slave are answered."""
        roles = self._roles
        with roles.lock:
            was_master = roles.role.is_master
            roles.role = BrokerRole.SLAVE
            if was_master:
                self._services.stop()
            if master is not None:
                roles.failover_replication("follow a master").follow(master)
        if was_master:
            log.warning("broker demoted to slave", broker=self._name, epoch=roles.epoch, master=master)

    def follow(self, master: str) -> None:
        """As a slave, copy the log of the master at replication address ``master``."""
        with self._roles.lock:
            if self._roles.role.is_master:
                self.demote(master)
                return
            self._roles.failover_replication("follow a master").follow(master)
