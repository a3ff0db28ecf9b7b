"""Standing for master of a broker name: kazoo's election recipe plus an epoch per win.

The winner takes the next epoch of its broker name with a compare-and-set on ``epochs/<name>``,
so epochs only grow and two winners never share one: a master that lost its session (and may not
know it yet) is fenced by the newer epoch its successor holds.

A campaign with an eligibility rule (:meth:`ZkClusterService.stand`) claims a win only when the
rule allows it given the stored in-sync set, and claims it in one ZooKeeper transaction that bumps
the epoch and writes the set ``{this broker}`` over the version it read: two winners can never
both claim, and a claim never overwrites a set it did not see. The master then holds a
:class:`~plugmq.plugins.cluster_zk.leadership.ZkLeadership` (lease and set) until it is lost.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kazoo.client import KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from plugmq.core.contracts.cluster import Mastership, MastershipListener
from plugmq.core.contracts.leadership import Eligibility
from plugmq.core.errors import PlugmqError
from plugmq.core.logs import get_logger
from plugmq.plugins.cluster_zk.leadership import ZkLeadership

if TYPE_CHECKING:
    from kazoo.recipe.election import Election

    from plugmq.plugins.cluster_zk.service import ZkClusterService

__all__ = ["RESTAND_S", "Campaign"]

log = get_logger(__name__)

#: How long a broker that may not be master waits (not contending) before it stands again.
RESTAND_S = 0.5


class Campaign:
    """One broker standing for master of its name until stopped; re-stands after a lost session."""

    def __init__(self, service: ZkClusterService, broker_name: str, broker_id: int,
                 listener: MastershipListener, eligible: Eligibility | None = None) -> None:
        self._service = service
        self._broker_name = broker_name
        self._broker_id = broker_id
        self._listener = listener
        self._eligible = eligible
        self._log = log.bind(broker=broker_name, broker_id=broker_id)
        self._lock = threading.Lock()
        self._stopped = False
        self._interrupt = threading.Event()  # set when the session is lost or the campaign stops
        self._election: Election | None = None
        self._leadership: ZkLeadership | None = None
        self._stand_down = False  # the last win was not claimed: wait before contending again
        self._refused = ""  # the last reason a win was not claimed (logged once per reason)
        self._thread = threading.Thread(target=self._run, name=f"plugmq-zk-election-{broker_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def session_state(self, state: str) -> None:
        """kazoo's session listener, forwarded (its connection thread: never block)."""
        leadership = self._leadership
        if leadership is not None:
            leadership.session_state(state)
        if state == KazooState.LOST:
            self._interrupt.set()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._interrupt.set()
            election = self._election
        if election is not None:
            election.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        client = self._service.client
        while True:
            with self._lock:
                if self._stopped:
                    return
                if not self._service.connected:
                    election = None
                else:
                    self._interrupt.clear()
                    election = self._election = client.Election(
                        self._service.paths.election(self._broker_name), f"{self._broker_name}.{self._broker_id}")
            if election is None:
                self._interrupt.wait(0.2)
                continue
            try:
                election.run(self._lead)
            except (KazooException, KazooTimeoutError, PlugmqError) as exc:
                self._log.warning("election interrupted by ZooKeeper; standing again", error=repr(exc))
                self._interrupt.wait(0.5)
            if self._stand_down:
                self._stand_down = False
                self._interrupt.wait(RESTAND_S)

    def _lead(self) -> None:
        """Won: take the next epoch, tell the broker, hold until the session is lost or we stop."""
        if self._interrupt.is_set():
            return
        if self._eligible is None:
            epoch = self._service.bump_epoch(self._broker_name)
            self._hold(Mastership(self._broker_name, self._broker_id, epoch))
            return
        election = self._election
        assert election is not None and election.lock.node is not None
        claim = self._service.claim(self._broker_name, self._broker_id, self._eligible,
                                    lock_node=f"{election.lock.path}/{election.lock.node}")
        if isinstance(claim, str):
            if claim != self._refused:
                self._log.warning("won the election but may not be master; letting it go", reason=claim)
            self._refused = claim
            self._stand_down = True
            return
        self._refused = ""
        leadership = ZkLeadership(self._service, self._broker_name, claim.in_sync, session=claim.session,
                                  contact=claim.contact, clock=self._service.clock, lease_s=self._service.lease_s,
                                  on_lost=self._interrupt.set)
        self._leadership = leadership
        try:
            self._hold(Mastership(self._broker_name, self._broker_id, claim.in_sync.epoch, leadership))
        finally:
            self._leadership = None
            leadership.close()

    def _hold(self, mastership: Mastership) -> None:
        self._log.info("elected master", epoch=mastership.epoch)
        self._service.election_changed(mastership.epoch)
        self._tell(mastership)
        self._interrupt.wait()
        with self._lock:
            stopped = self._stopped
        if stopped:
            self._log.info("gave mastership up", epoch=mastership.epoch)
        elif mastership.leadership is not None and mastership.leadership.lost:
            self._log.warning("mastership lost", epoch=mastership.epoch, reason=mastership.leadership.why_not())
        else:
            self._log.warning("mastership lost with the ZooKeeper session", epoch=mastership.epoch)
        if isinstance(mastership.leadership, ZkLeadership):  # acks stop before the broker hears of it
            mastership.leadership.close("it gave mastership up" if stopped else "its election ended")
        self._service.election_changed(0)
        self._tell(None)

    def _tell(self, mastership: Mastership | None) -> None:
        try:
            self._listener(mastership)
        except Exception:  # noqa: BLE001 - a broken listener must not end the campaign; logged
            self._log.exception("mastership listener failed")
