"""What the commit point means to the broker (Kafka's high watermark; DESIGN.md section 12).

A replication plugin that keeps a commit point (:class:`~plugmq.core.CommitPointReplication`,
e.g. ha) says which part of the log every in-sync broker holds. The broker then:

* asks it before storing a send (:meth:`CommitGate.admit_send`): a master that is not sure it
  still leads, or a ``sync_master`` with too few in-sync brokers, refuses the send *unstored*,
  so the client's retry stores it once;
* shows consumers messages below the commit point only (:meth:`CommitGate.visible_end`), and none
  at all while the master is not sure it leads: a later cut of the log never removes what a
  consumer saw, and a deposed master hands nothing out;
* confirms consumer state (acks, offsets, pop progress) once the commit point passed its record
  (:meth:`CommitGate.settle`): a cut never forgets an ack a client was told succeeded.

Without such a plugin every method lets everything through as before.
"""

from __future__ import annotations

from collections.abc import Callable

from plugmq.core.contracts import BrokerRole, ReplicationService
from plugmq.core.contracts.leadership import CommitPointReplication
from plugmq.core.errors import FencedError, NotEnoughReplicasError
from plugmq.core.message import SendStatus

__all__ = ["CommitGate"]


class CommitGate:
    """The broker's view of its replication plugin's commit point (see the module doc)."""

    def __init__(self, broker_name: str, replication: Callable[[], ReplicationService | None],
                 role: Callable[[], BrokerRole]) -> None:
        self._broker_name = broker_name
        self._replication = replication
        self._role = role
        # isinstance() against a runtime-checkable Protocol costs microseconds: once per plugin object.
        self._checked: tuple[object, CommitPointReplication | None] = (None, None)

    def source(self) -> CommitPointReplication | None:
        """The replication service when it keeps a commit point, else None (cached per object)."""
        replication = self._replication()
        checked, source = self._checked
        if replication is not checked:
            source = replication if isinstance(replication, CommitPointReplication) else None
            self._checked = (replication, source)
        return source

    def admit_send(self) -> None:
        """Before a send is stored on a master: FencedError or NotEnoughReplicasError refuse it."""
        source = self.source()
        if source is None or not self._role().is_master:
            return
        if source.admit_write() is SendStatus.SLAVE_NOT_AVAILABLE:
            raise NotEnoughReplicasError(
                f"broker {self._broker_name!r} is a sync_master whose in-sync set is below min_in_sync_replicas: the "
                "send was not stored; start or reconnect a slave (it joins once it caught up), or lower "
                "[plugins.ha] min_in_sync_replicas")

    def fenced(self) -> bool:
        """True while this broker is master by role but not sure it still leads (its lease lapsed)."""
        source = self.source()
        return source is not None and self._role().is_master and source.committed_offset() is None

    def visible_end(self) -> int | None:
        """The log offset below which consumers may see messages (None: all of them). FencedError
        when this broker may hand out nothing now."""
        source = self.source()
        if source is None:
            return None
        commit = source.committed_offset()
        if commit is None:
            raise FencedError(
                f"broker {self._broker_name!r} hands out no messages now: it is not sure it is still the master of "
                "its name (its ZooKeeper session is suspended or its lease lapsed), or, a slave, it has not heard "
                "from a master yet; consumers read from the current master")
        return commit

    def settle(self, end_offset: int, otherwise: Callable[[int], SendStatus]) -> SendStatus:
        """Wait until the consumer-state record ending at ``end_offset`` is committed (on a master
        with a commit point; ``otherwise`` elsewhere). FLUSH_SLAVE_TIMEOUT when it was not in time."""
        source = self.source()
        if source is None or not self._role().is_master:
            return otherwise(end_offset)
        return SendStatus.SEND_OK if source.await_committed(end_offset) else SendStatus.FLUSH_SLAVE_TIMEOUT
