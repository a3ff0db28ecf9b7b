"""Standing for master of a broker name: kazoo's election recipe plus an epoch per win.

The winner takes the next epoch of its broker name with a compare-and-set on ``epochs/<name>``,
so epochs only grow and two winners never share one: a master that lost its session (and may not
know it yet) is fenced by the newer epoch its successor holds.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kazoo.client import KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from plugmq.core.contracts.cluster import Mastership, MastershipListener
from plugmq.core.logs import get_logger

if TYPE_CHECKING:
    from kazoo.recipe.election import Election

    from plugmq.plugins.cluster_zk.service import ZkClusterService

__all__ = ["Campaign"]

log = get_logger(__name__)


class Campaign:
    """One broker standing for master of its name until stopped; re-stands after a lost session."""

    def __init__(self, service: ZkClusterService, broker_name: str, broker_id: int,
                 listener: MastershipListener) -> None:
        self._service = service
        self._broker_name = broker_name
        self._broker_id = broker_id
        self._listener = listener
        self._log = log.bind(broker=broker_name, broker_id=broker_id)
        self._lock = threading.Lock()
        self._stopped = False
        self._interrupt = threading.Event()  # set when the session is lost or the campaign stops
        self._election: Election | None = None
        self._thread = threading.Thread(target=self._run, name=f"plugmq-zk-election-{broker_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def session_state(self, state: str) -> None:
        """kazoo's session listener, forwarded (its connection thread: never block)."""
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
            except (KazooException, KazooTimeoutError) as exc:
                self._log.warning("election interrupted by ZooKeeper; standing again", error=repr(exc))
                self._interrupt.wait(0.5)

    def _lead(self) -> None:
        """Won: take the next epoch, tell the broker, hold until the session is lost or we stop."""
        if self._interrupt.is_set():
            return
        epoch = self._service.bump_epoch(self._broker_name)
        self._log.info("elected master", epoch=epoch)
        self._service.election_changed(epoch)
        self._tell(Mastership(self._broker_name, self._broker_id, epoch))
        self._interrupt.wait()
        with self._lock:
            stopped = self._stopped
        if stopped:
            self._log.info("gave mastership up", epoch=epoch)
        else:
            self._log.warning("mastership lost with the ZooKeeper session", epoch=epoch)
        self._service.election_changed(0)
        self._tell(None)

    def _tell(self, mastership: Mastership | None) -> None:
        try:
            self._listener(mastership)
        except Exception:  # noqa: BLE001 - a broken listener must not end the campaign; logged
            self._log.exception("mastership listener failed")
