"""A won election as the master holds it on ZooKeeper: its lease and its in-sync set.

The lease: the master renews it by reading its in-sync set every quarter lease; a read that comes
back naming this master at its epoch proves ZooKeeper heard from this session no earlier than the
moment the read was sent, so the session cannot expire (and no successor be elected) before that
moment plus the session timeout. The lease is shorter (``lease_fraction`` of it), measured on the
monotonic clock from the send time, so a master frozen (SIGSTOP, a long pause), cut off ZooKeeper
or suspended by kazoo stops acking and serving before anyone else can be elected. It holds again
only when the same session answers once more and the set still names it.

The in-sync set changes only through :meth:`ZkLeadership.change_in_sync`: a write over the
version this master last wrote. The election of a successor rewrites the set (a new version), so
a deposed master's write fails and it learns it lost.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from plugmq.core import Clock, ValidationError
from plugmq.core.contracts.leadership import Eligibility, InSyncSet
from plugmq.core.errors import ClusterError, FencedError
from plugmq.core.logs import get_logger
from plugmq.plugins.cluster_zk.security import json_object

if TYPE_CHECKING:
    from plugmq.plugins.cluster_zk.service import ZkClusterService

__all__ = ["Claim", "ZkLeadership", "claim", "parse_in_sync"]

log = get_logger(__name__)

_ZK_ERRORS = (KazooException, KazooTimeoutError)


def parse_in_sync(raw: bytes | None, version: int) -> InSyncSet:
    """The stored set; ValidationError when the node holds something else."""
    return InSyncSet.from_dict(json_object(raw, "in-sync set node"), version)


def encode_in_sync(in_sync: InSyncSet) -> bytes:
    return json.dumps(in_sync.as_dict(), sort_keys=True).encode()


class ZkLeadership:
    """The lease and in-sync set of one won election (see the module doc). Thread-safe."""

    def __init__(self, service: ZkClusterService, broker_name: str, claimed: InSyncSet, *, session: int,
                 contact: float, clock: Clock, lease_s: float, on_lost: Callable[[], None]) -> None:
        self._service = service
        self._client = service.client
        self._path = service.paths.insync(broker_name)
        self._clock = clock
        self._lease_s = lease_s
        self._session = session
        self._on_lost = on_lost
        self._cond = threading.Condition()
        self._set = claimed
        self._contact = contact  # monotonic send time of the latest answered request of the session
        self._suspended = False
        self._lost = ""
        self._listeners: list[Callable[[], None]] = []
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._log = log.bind(broker=broker_name, broker_id=claimed.master, epoch=claimed.epoch)
        self._thread = threading.Thread(target=self._renew_loop, daemon=True, name=f"plugmq-zk-lease-{broker_name}")
        self._thread.start()

    # ------------------------------------------------------------------------------ Leadership
    @property
    def epoch(self) -> int:
        return self._set.epoch

    @property
    def lost(self) -> bool:
        return bool(self._lost)

    @property
    def lease_s(self) -> float:
        return self._lease_s

    def holds(self) -> bool:
        return not self._lost and not self._suspended and self._same_session() and \
            self._clock.monotonic() - self._contact < self._lease_s

    def why_not(self) -> str:
        if self._lost:
            return self._lost
        if self._suspended:
            return "its connection to ZooKeeper is suspended (the session may be expiring)"
        if not self._same_session():
            return "its ZooKeeper session ended"
        age = self._clock.monotonic() - self._contact
        if age >= self._lease_s:
            return f"its last confirmed contact with ZooKeeper is {age:.2f} s old (lease {self._lease_s:.2f} s)"
        return ""

    def wait_held(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout  # a thread's wait: real time, whatever the broker's clock
        with self._cond:
            while not self.holds():
                remaining = deadline - time.monotonic()
                if self._lost or remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
        return True

    def in_sync(self) -> InSyncSet:
        with self._cond:
            return self._set

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._cond:
            self._listeners.append(listener)

    def change_in_sync(self, members: frozenset[int]) -> InSyncSet:
        with self._write_lock:
            for _attempt in range(2):  # a second time only after adopting our own earlier write's version
                current = self.in_sync()
                if self._lost:
                    raise FencedError(f"cannot change the in-sync set: {self._lost}")
                if members == current.members:
                    return current
                wanted = InSyncSet(current.epoch, current.master, members)
                sent = self._clock.monotonic()
                try:
                    # Bounded by the lease: a write not answered within it comes too late to be relied on.
                    stat = self._client.set_async(self._path, encode_in_sync(wanted),
                                                  version=current.version).get(timeout=self._lease_s)
                except BadVersionError:
                    self._resolve_version()
                    continue
                except NoNodeError:
                    self._lose("its in-sync set node was deleted")
                    raise FencedError(f"cannot change the in-sync set: {self._lost}") from None
                except _ZK_ERRORS as exc:
                    raise ClusterError(f"cannot write the in-sync set to ZooKeeper now ({exc!r}); the set stays "
                                       f"{sorted(current.members)} as far as anyone may rely on") from exc
                written = InSyncSet(wanted.epoch, wanted.master, members, stat.version)
                self._confirmed(sent, written)
                self._log.info("in-sync set changed", members=sorted(members), was=sorted(current.members))
                return written
            raise FencedError(f"cannot change the in-sync set: {self._lost or 'it changed under this master'}")

    # ------------------------------------------------------------------------------ lease upkeep
    def session_state(self, state: str) -> None:
        """kazoo's session listener, forwarded (its connection thread: never block)."""
        if state == KazooState.SUSPENDED:
            with self._cond:
                self._suspended = True
                self._contact = float("-inf")  # only an answer sent after the reconnect counts
            self._log.warning("ZooKeeper connection suspended: this master stops acking and serving until the "
                              "same session answers again")
            self._notify()
        elif state == KazooState.CONNECTED:
            with self._cond:
                self._suspended = False
            self._wake.set()
        elif state == KazooState.LOST:
            self._lose("its ZooKeeper session expired")

    def close(self, reason: str = "it gave mastership up") -> None:
        self._lose(reason)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _same_session(self) -> bool:
        client_id = self._client.client_id
        return client_id is not None and client_id[0] == self._session

    def _renew_loop(self) -> None:
        interval = self._lease_s / 4
        while not self._lost:
            self._wake.wait(interval)
            self._wake.clear()
            if self._lost:
                return
            if self._suspended or not self._same_session():
                continue
            try:
                self._renew()
            except Exception:  # noqa: BLE001 - the lease lapses by itself; the loop must go on
                self._log.exception("lease renewal failed")

    def _renew(self) -> None:
        sent = self._clock.monotonic()
        try:
            raw, stat = self._client.get_async(self._path).get(timeout=self._lease_s)
        except NoNodeError:
            self._lose("its in-sync set node was deleted")
            return
        except _ZK_ERRORS:
            return  # no answer: the lease lapses on its own
        self._check_stored(raw, stat.version, sent)

    def _check_stored(self, raw: bytes | None, version: int, sent: float) -> None:
        try:
            stored = parse_in_sync(raw, version)
        except ValidationError as exc:
            self._lose(f"its in-sync set node is unreadable ({exc})")
            return
        mine = self.in_sync()
        if stored.epoch != mine.epoch or stored.master != mine.master:
            self._lose(f"a newer master was elected (the in-sync set names broker {stored.master} at epoch "
                       f"{stored.epoch})")
            return
        # Only this master writes the set in its epoch: a newer version is a write of ours whose
        # answer was lost (a timeout); take what it wrote.
        self._confirmed(sent, stored if stored.version >= mine.version else None)

    def _resolve_version(self) -> None:
        """A write met another version: read the node back, adopt it if it is still ours."""
        sent = self._clock.monotonic()
        try:
            raw, stat = self._service.wait(self._client.get_async(self._path))
        except NoNodeError:
            self._lose("its in-sync set node was deleted")
            return
        except _ZK_ERRORS as exc:
            raise ClusterError(f"cannot read the in-sync set back from ZooKeeper ({exc!r})") from exc
        self._check_stored(raw, stat.version, sent)

    def _confirmed(self, sent: float, stored: InSyncSet | None) -> None:
        with self._cond:
            if stored is not None:
                self._set = stored
            if not self._suspended:
                self._contact = max(self._contact, sent)
            self._cond.notify_all()
        self._notify()

    def _lose(self, reason: str) -> None:
        with self._cond:
            if self._lost:
                return
            self._lost = reason
            self._cond.notify_all()
        self._wake.set()
        self._log.warning("mastership lost: this broker acks and serves no more", reason=reason)
        self._notify()
        self._on_lost()

    def _notify(self) -> None:
        with self._cond:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a broken listener must not stop the lease; logged
                self._log.exception("leadership listener failed")


@attrs.frozen
class Claim:
    """A won election claimed: the set written (epoch, this broker alone), the session that wrote
    it, and the monotonic time the claim was sent (the lease's first contact)."""

    in_sync: InSyncSet
    session: int
    contact: float


def claim(service: ZkClusterService, broker_name: str, broker_id: int, eligible: Eligibility, *,
          lock_node: str) -> Claim | str:
    """Claim a won election if ``eligible`` allows it given the stored set: one transaction checks
    that ``lock_node`` (the won election's ephemeral node) still exists, bumps the epoch and writes
    the set ``{broker_id}``, each over the version read, so a win whose session has ended since can
    never be claimed. Returns the Claim, or why this broker may not be master. Raises kazoo's
    errors when ZooKeeper does not answer."""
    client, paths = service.client, service.paths
    for _attempt in range(16):  # compare-and-set against a concurrent claim or change
        sent = service.clock.monotonic()
        session = client.client_id[0] if client.client_id else None
        stored, stored_version = _read_set(service, paths.insync(broker_name))
        allowed, why = eligible(stored)
        if not allowed:
            return why
        try:
            raw, epoch_stat = service.wait(client.get_async(paths.epoch(broker_name)))
            granted, epoch_version = int(raw or b"0"), epoch_stat.version
        except NoNodeError:
            granted, epoch_version = 0, None
        epoch = max(granted, stored.epoch if stored else 0) + 1
        claimed = InSyncSet(epoch, broker_id, {broker_id})
        transaction = client.transaction()
        transaction.check(lock_node, 0)
        if epoch_version is None:
            transaction.create(paths.epoch(broker_name), str(epoch).encode())
        else:
            transaction.set_data(paths.epoch(broker_name), str(epoch).encode(), version=epoch_version)
        if stored_version is None:
            transaction.create(paths.insync(broker_name), encode_in_sync(claimed))
        else:
            transaction.set_data(paths.insync(broker_name), encode_in_sync(claimed), version=stored_version)
        results = service.wait(transaction.commit_async())
        if isinstance(results[0], NoNodeError):
            return "the election this broker won ended with its ZooKeeper session before it was claimed"
        if any(isinstance(r, Exception) for r in results):
            continue  # someone else wrote in between: read again
        written = results[2]
        version = 0 if isinstance(written, str) else written.version
        if session is None:
            continue
        return Claim(attrs.evolve(claimed, version=version), session, sent)
    raise ClusterError(f"the election of {broker_name!r} could not be claimed: its epoch or in-sync set changed "
                       "16 times in a row")


def _read_set(service: ZkClusterService, path: str) -> tuple[InSyncSet | None, int | None]:
    try:
        raw, stat = service.wait(service.client.get_async(path))
    except NoNodeError:
        return None, None
    try:
        return parse_in_sync(raw, stat.version), stat.version
    except ValidationError as exc:
        log.error("in-sync set node unreadable; treated as absent (the legacy election rules apply)", node=path,
                  error=str(exc))
        return None, stat.version
