"""Automatic failover: the cluster's election picks the master of a broker name.

With ``[broker] failover = true`` every broker of one name starts as a slave and stands for
master through its cluster service, which keeps the name's in-sync set and the master's lease
(:class:`~plugmq.core.InSyncCluster`: on ZooKeeper, kazoo's election recipe; each claimed win
grants the next epoch and writes the set ``{winner}`` in one step). :class:`Failover` decides who
may claim a win and turns what the election and the live view say into role switches:

* election won: only a member of the stored in-sync set may claim it (:meth:`Failover.eligible`):
  every member holds everything acknowledged, so no acked record is lost (Kafka's clean leader
  election, RocketMQ 5's SyncStateSet). Without a stored set (a cluster from before in-sync
  sets) the name's first election, or the broker that led the newest epoch any live broker knows,
  may claim it. Anyone else lets the win go and stands again a moment later - unless ``[broker]
  failover_unclean_after_s`` is set: once no master of the name has been live that long, any
  broker may claim (an unclean election, RocketMQ 5's ``enableElectUncleanMaster``: acked records
  it lacks are lost, and the old master, if it returns, is cut back to the new master's log);
  the claimed win hands the broker its :class:`~plugmq.core.Leadership` (lease and set) with
  :meth:`Broker.promote`;
* election lost (session expired, withdrawn): the broker stops taking writes at once;
* live view: a slave follows the elected master of its name (the registration names its
  replication address); a master that sees a newer epoch than its own demotes itself. A
  returning old master starts as a slave, follows the new master and is cut back in the
  replication handshake to where both logs agree (epochs, see the ha plugin): it never takes a
  write under its old epoch.

Role switches run on one worker thread of their own: the cluster service's threads (elections,
watches) only hand over what they saw.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from plugmq.core.contracts import (
    BrokerRegistration,
    BrokerRole,
    ClusterService,
    ClusterView,
    FailoverReplication,
    Mastership,
)
from plugmq.core.contracts.leadership import InSyncCluster, InSyncSet
from plugmq.core.errors import PlugmqError
from plugmq.core.logs import get_logger

if TYPE_CHECKING:
    from plugmq.broker.ports import Electable

__all__ = ["Failover", "elected_master"]

log = get_logger(__name__)

#: How long a broker that may not stand (not caught up) waits before it stands again.
RESTAND_S = 1.0


def elected_master(view: ClusterView, broker_name: str, *, other_than: int | None = None) -> BrokerRegistration | None:
    """The live elected master of ``broker_name`` in ``view`` (the newest epoch when a stale one is
    still listed), leaving out broker id ``other_than``; None when there is none."""
    masters = [b for b in view.brokers if b.broker_name == broker_name and b.is_master and b.replication
               and b.broker_id != other_than]
    return max(masters, key=lambda b: b.epoch) if masters else None


class Failover:
    """Drives one broker's role from its cluster's election and live view. Thread-safe."""

    def __init__(self, broker: Electable, service: ClusterService, republish: Callable[[], None],
                 *, restand_s: float = RESTAND_S) -> None:
        replication = broker.replication
        if not isinstance(replication, FailoverReplication):
            raise PlugmqError(f"broker {broker.name!r}: failover needs a replication plugin that switches roles")
        if not isinstance(service, InSyncCluster):
            raise PlugmqError(f"broker {broker.name!r}: failover needs a cluster plugin that keeps in-sync sets and "
                              f"leases ({type(service).__name__} does not); use cluster_zk")
        self.broker = broker
        self.service = service
        self._in_sync: InSyncCluster = service
        self.replication: FailoverReplication = replication
        self._republish = republish
        self._restand_s = restand_s
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="plugmq-failover")
        self._lock = threading.Lock()
        self._mastership: Mastership | None = None
        self._following = ""
        self._closed = False
        self._restand: threading.Timer | None = None
        self._unsubscribe: Callable[[], None] | None = None  # from the view, once started
        self._unclean_after_s = broker.config.failover_unclean_after_s
        self._masterless_since: float | None = None  # broker clock; None while a master is live
        self._log = log.bind(broker=broker.name, broker_id=broker.config.broker_id)

    @property
    def mastership(self) -> Mastership | None:
        """The election this broker holds now (None while it is a slave)."""
        with self._lock:
            return self._mastership

    def start(self) -> None:
        """Stand for master and follow the live view (call after the broker registered)."""
        self._unsubscribe = self.service.subscribe(self.view_changed)
        self._in_sync.stand(self.mastership_changed, self.eligible)

    def close(self) -> None:
        """Stop standing and switching (the broker keeps its present role until it closes)."""
        with self._lock:
            self._closed = True
            timer, self._restand = self._restand, None
        if timer is not None:
            timer.cancel()
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        self.service.withdraw()
        self._worker.shutdown(wait=True)

    # ------------------------------------------------------------------------------ inputs
    def mastership_changed(self, mastership: Mastership | None) -> None:
        """The election's listener (its thread): hand over to the worker."""
        self._submit(self._apply_mastership, mastership)

    def view_changed(self, view: ClusterView) -> None:
        """The cluster service's listener (its thread): hand over to the worker."""
        self._submit(self._apply_view, view)

    def _submit(self, task: Callable[..., None], argument: object) -> None:
        with self._lock:
            if self._closed:
                return
        try:
            self._worker.submit(self._guarded, task, argument)
        except RuntimeError:
            pass  # closing

    def _guarded(self, task: Callable[[object], None], argument: object) -> None:
        try:
            task(argument)
        except Exception:  # noqa: BLE001 - one failed switch must not stop the next; logged
            self._log.exception("failover step failed; the next election or view tries again")

    # ------------------------------------------------------------------------------ switches
    def eligible(self, stored: InSyncSet | None) -> tuple[bool, str]:
        """Whether this broker may claim a won election given the stored in-sync set, and why (or
        why not). Asked on the election's thread, before the win is claimed."""
        me = self.broker.config.broker_id
        if stored is not None:
            if me in stored.members:
                return True, f"a member of the in-sync set {sorted(stored.members)} of epoch {stored.epoch}"
            why_not = (f"not in the in-sync set {sorted(stored.members)} of epoch {stored.epoch}: it may lack records "
                       "that master acknowledged")
        else:
            if self.service.current_epoch(self.broker.name) == 0:
                return True, "first election of this broker name"
            others = [b for b in self.service.view().brokers if b.broker_name == self.broker.name and b.broker_id != me]
            mine = self.replication.epoch
            if mine > 0 and self.replication.led_epoch == mine and all(b.log_epoch <= mine for b in others):
                # No set stored yet (a cluster from before in-sync sets): the last master's log holds
                # everything acked under its epoch, and no live log knows a newer one.
                return True, f"it was the master of epoch {mine}, the newest any live broker of the name knows"
            why_not = (f"no in-sync set is stored and it was not the last master (its log knows epoch {mine}, led "
                       f"{self.replication.led_epoch})")
        with self._lock:
            since = self._masterless_since
        if self._unclean_after_s > 0 and since is not None:
            masterless_s = self.broker.clock.now() - since
            if masterless_s >= self._unclean_after_s:
                why = (f"unclean election: no master for {masterless_s:.1f} s "
                       f"(failover_unclean_after_s = {self._unclean_after_s:g}); {why_not}")
                self._log.error("becoming master without the last master's whole log: acked records it held "
                                "beyond this broker's log, if any, are lost", reason=why)
                return True, why
            why_not += f"; an unclean election is allowed in {self._unclean_after_s - masterless_s:.1f} s"
        return False, why_not

    def _apply_mastership(self, mastership: object) -> None:
        assert mastership is None or isinstance(mastership, Mastership)
        with self._lock:
            if self._closed:
                return
        if mastership is None:
            with self._lock:
                held, self._mastership = self._mastership, None
            if held is not None or self.broker.role.is_master:
                self.broker.demote(None)  # no more writes until the view names the new master
                self._following = ""
                self._republish()
            return
        if mastership.leadership is not None and mastership.leadership.lost:
            return  # lost before the broker got to it: the None that follows demotes nothing
        self.broker.promote(mastership.epoch, mastership.leadership)
        with self._lock:
            self._mastership = mastership
            self._masterless_since = None
        self._following = ""
        self._log.warning("elected master", epoch=mastership.epoch, replication=self.replication.master_address)
        self._republish()

    def _schedule_restand(self) -> None:
        def restand() -> None:
            with self._lock:
                if self._closed:
                    return
                self._restand = None
            self._submit(lambda view: self._publish_log_epoch(view), self.service.view())
            try:
                self._in_sync.stand(self.mastership_changed, self.eligible)
            except PlugmqError as exc:
                self._log.warning("could not stand for master again", error=str(exc))

        timer = threading.Timer(self._restand_s, restand)
        timer.daemon = True
        with self._lock:
            self._restand = timer
        timer.start()

    def _publish_log_epoch(self, view: ClusterView) -> None:
        """Publish the epoch this broker's log knows when the view shows an older one (the
        replication handshake adopts a master's epochs after the role change was published)."""
        me = view.broker(self.broker.name, self.broker.config.broker_id)
        if me is not None and me.log_epoch != self.replication.epoch:
            self._republish()

    def _apply_view(self, view: object) -> None:
        assert isinstance(view, ClusterView)
        self._publish_log_epoch(view)
        master = elected_master(view, self.broker.name, other_than=self.broker.config.broker_id)
        with self._lock:
            if master is not None or self._mastership is not None:
                self._masterless_since = None
            elif self._masterless_since is None:
                self._masterless_since = self.broker.clock.now()
        if master is None:
            return
        mine = self.mastership
        if mine is not None:
            if master.epoch > mine.epoch:
                self._log.error("another broker holds a newer epoch: this one steps down", epoch=mine.epoch,
                                newer=master.epoch, master=master.key)
                with self._lock:
                    self._mastership = None
                self.service.withdraw()
                self.broker.demote(master.replication)
                self._following = master.replication
                self._republish()
                self._schedule_restand()
            return
        if self.broker.role is BrokerRole.SLAVE and master.replication != self._following:
            self._log.info("following the elected master", master=master.key, epoch=master.epoch,
                           replication=master.replication)
            self.broker.follow(master.replication)
            self._following = master.replication
