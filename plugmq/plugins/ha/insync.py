"""The master's in-sync set and commit point (Kafka's ISR and high watermark, RocketMQ 5's SyncStateSet).

``members``: the set as the name service holds it (what an election trusts). A slave **joins**
once it is within ``join_gap_bytes`` of the log end: from then on it is *required* (every ack and
every read waits for it), and once it holds the commit point it had when it became required, the
set is written with it. A member **leaves** when its connection is gone or it did not catch up
with the log for ``max_lag_ms``: only once the set is written without it does it stop being
required. So the required brokers are always a superset of the stored set, and:

* the **commit point** is the log offset every required broker holds (never going back): a sync
  send is acked once the commit point passes it, a consumer sees messages below it only;
* a slave joins the stored set only holding everything committed so far;
* a master that cannot write the set (cut off the name service, or replaced) cannot shrink it,
  so it never acks or serves alone what its members lack.

Set writes run on one thread of their own, in order; a failed write is tried again. Lags and
waits are measured on the monotonic clock (network time, like the stream's heartbeats).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
import time
from collections.abc import Callable

from plugmq.core import PlugmqError, SendStatus
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.errors import ClusterError, FencedError
from plugmq.core.logs import get_logger

__all__ = ["InSync"]

log = get_logger(__name__)

_RETRY_S = 0.2  # a set write that failed (name service away) is tried again this soon


class _Progress:
    """What one slave confirmed, and the log ends it was sent (to tell a laggard)."""

    def __init__(self, confirmed: int, now: float) -> None:
        self.confirmed = confirmed
        self.connected = True
        self.last_ack = now
        self.sent: collections.deque[tuple[int, float]] = collections.deque()


class InSync:
    """One master epoch's set, commit point and waiting sends. Thread-safe."""

    def __init__(self, leadership: Leadership, *, me: int, log_end: Callable[[], int], min_in_sync: int,
                 max_lag_s: float, join_gap_bytes: int, broker_name: str) -> None:
        self.leadership = leadership
        self._me = me
        self._log_end = log_end
        self._min_in_sync = min_in_sync
        self._max_lag_s = max_lag_s
        self._join_gap = join_gap_bytes
        self._log = log.bind(broker=broker_name, epoch=leadership.epoch)
        self._lock = threading.Lock()
        self._members = leadership.in_sync().members
        self._joining: dict[int, int] = {}  # slave -> the commit point it must reach before it is written
        self._writing: frozenset[int] = frozenset()  # a set write under way (its outcome unknown until it returns)
        self._progress: dict[int, _Progress] = {}
        self._commit = log_end() if self._members == {me} else 0
        self._waiting: list[tuple[int, int, threading.Event]] = []
        self._tickets = itertools.count()
        self._closed = False
        self._due = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ha-insync-{broker_name}")
        self._thread.start()
        leadership.add_listener(self._release_all_waiting)

    # ------------------------------------------------------------------------------ what is known
    @property
    def members(self) -> frozenset[int]:
        with self._lock:
            return self._members

    def required(self) -> frozenset[int]:
        with self._lock:
            return self._required()

    def _required(self) -> frozenset[int]:
        return self._members | self._joining.keys() | self._writing

    def is_member(self, broker_id: int) -> bool:
        return broker_id in self.members

    def commit_point(self) -> int:
        """The log offset every required broker holds (grows only)."""
        with self._lock:
            return self._advance()

    def _advance(self) -> int:
        end = self._log_end()
        held = [end]
        for slave in self._required() - {self._me}:
            progress = self._progress.get(slave)
            held.append(progress.confirmed if progress is not None else 0)
        self._commit = max(self._commit, min(held))
        return self._commit

    # ------------------------------------------------------------------------------ slave events
    def connected(self, slave: int, end: int) -> None:
        """A slave finished its handshake holding the log up to ``end``."""
        now = time.monotonic()
        with self._lock:
            progress = self._progress.get(slave)
            if progress is not None and end < progress.confirmed and slave in self._required():
                # It lost what it had confirmed (a crash without sync flush): it holds less than
                # the set says, so it leaves (and joins again once it caught up).
                self._log.warning("in-sync slave came back holding less than it confirmed: it leaves the set",
                                  slave=slave, confirmed=progress.confirmed, holds=end)
                progress.connected = False
                self._due.set()
                return
            self._progress[slave] = _Progress(end, now)
        self._due.set()

    def disconnected(self, slave: int) -> None:
        with self._lock:
            progress = self._progress.get(slave)
            if progress is not None:
                progress.connected = False
        self._due.set()

    def sent(self, slave: int, master_end: int) -> None:
        """The master sent ``slave`` a frame while its log ended at ``master_end``."""
        now = time.monotonic()
        with self._lock:
            progress = self._progress.get(slave)
            if progress is not None and (not progress.sent or progress.sent[-1][0] < master_end
                                         or progress.confirmed >= master_end):
                progress.sent.append((master_end, now))

    def confirmed(self, slave: int, offset: int) -> None:
        now = time.monotonic()
        with self._lock:
            progress = self._progress.get(slave)
            if progress is None or not progress.connected:
                return
            progress.confirmed = max(progress.confirmed, offset)
            progress.last_ack = now
            while progress.sent and progress.sent[0][0] <= progress.confirmed:
                progress.sent.popleft()
            required = slave in self._required()
            commit = self._advance() if required else self._commit
            joining = slave not in self._members and (
                (slave in self._joining and offset >= self._joining[slave])
                or (slave not in self._joining and self._log_end() - offset <= self._join_gap))
        if required:
            self._release(commit)
        if joining:
            self._due.set()

    # ------------------------------------------------------------------------------ acks
    def admit(self, sync: bool) -> SendStatus:
        """Whether a send may be stored now (asked before it is): SEND_OK, or SLAVE_NOT_AVAILABLE
        when a sync send could not get enough copies. FencedError when the leadership lapsed."""
        if not self.leadership.holds():
            raise FencedError(f"this broker is not sure it is still the master: {self.leadership.why_not()}; "
                              "the send was not stored")
        if sync and len(self.required()) < self._min_in_sync:
            return SendStatus.SLAVE_NOT_AVAILABLE
        return SendStatus.SEND_OK

    def await_commit(self, end_offset: int, timeout_s: float, *, sync: bool, members: int | None = None
                     ) -> SendStatus:
        """Wait until the send ending at ``end_offset`` may be acked: committed (sync) with
        ``members`` in the set (default ``min_in_sync_replicas``), and the leadership held.
        FencedError when the leadership was lost."""
        deadline = time.monotonic() + timeout_s
        need = self._min_in_sync if members is None else members
        if sync:
            event = threading.Event()
            with self._lock:
                committed = self._advance() >= end_offset and len(self._members) >= need
                if not committed:
                    heapq.heappush(self._waiting, (end_offset, next(self._tickets), event))
            while not committed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed or self.leadership.lost or self._short_of_members(end_offset, need):
                    break
                event.wait(remaining)
                event.clear()
                with self._lock:
                    committed = self._advance() >= end_offset and len(self._members) >= need
                    if not committed and not self._closed:
                        heapq.heappush(self._waiting, (end_offset, next(self._tickets), event))
            if not committed:
                self._check_held()
                return SendStatus.SLAVE_NOT_AVAILABLE if len(self.members) < need else SendStatus.FLUSH_SLAVE_TIMEOUT
        if not self.leadership.holds() and not self.leadership.wait_held(max(0.0, deadline - time.monotonic())):
            self._check_held()
        return SendStatus.SEND_OK

    def _short_of_members(self, end_offset: int, need: int) -> bool:
        """Committed, but too few brokers in the set and none joining that could make up for it."""
        with self._lock:
            return self._commit >= end_offset and len(self._required()) < need

    def await_committed(self, end_offset: int, timeout_s: float) -> bool:
        """Wait until the commit point passes ``end_offset`` with the leadership held (consumer
        state is confirmed to clients only then; min_in_sync_replicas is about sends). False at
        the timeout, FencedError when the leadership was lost."""
        return self.await_commit(end_offset, timeout_s, sync=True, members=1) is SendStatus.SEND_OK

    def _check_held(self) -> None:
        if not self.leadership.holds():
            raise FencedError(f"this broker is not sure it is still the master: {self.leadership.why_not()}; "
                              "the request was not acknowledged")

    def _release(self, commit: int | None) -> None:
        """Wake the sends the commit point passed (every one when None)."""
        ready: list[threading.Event] = []
        with self._lock:
            while self._waiting and (commit is None or self._waiting[0][0] <= commit):
                ready.append(heapq.heappop(self._waiting)[2])
        for event in ready:
            event.set()

    def _release_all_waiting(self) -> None:
        self._release(None)  # the leadership changed: waiting sends look again (they re-queue)

    # ------------------------------------------------------------------------------ set changes
    def _lagging(self, progress: _Progress | None, now: float, end: int) -> bool:
        if progress is None or not progress.connected:
            return True
        if progress.sent and now - progress.sent[0][1] > self._max_lag_s:
            return True
        return progress.confirmed < end and now - progress.last_ack > self._max_lag_s

    def _wanted(self) -> frozenset[int]:
        """The set to write now (under the lock); also starts joins and drops laggards that were
        never written."""
        now, end = time.monotonic(), self._log_end()
        wanted = {m for m in self._members if m == self._me or m in self._progress}
        for slave, progress in self._progress.items():
            lagging = self._lagging(progress, now, end)
            if slave in self._members:
                if lagging and slave != self._me:
                    wanted.discard(slave)
                continue
            if slave not in self._joining and not lagging and end - progress.confirmed <= self._join_gap \
                    and self.leadership.holds():
                self._joining[slave] = self._advance()  # required from now on
                self._log.info("slave joining the in-sync set", slave=slave, must_reach=self._joining[slave])
            if slave in self._joining:
                if lagging and slave not in self._writing:
                    del self._joining[slave]
                elif not lagging and progress.confirmed >= self._joining[slave]:
                    wanted.add(slave)
        return frozenset(wanted)

    def _run(self) -> None:
        tick = min(0.1, self._max_lag_s / 4)
        while not self._closed:
            self._due.wait(tick)
            self._due.clear()
            if self._closed or self.leadership.lost:
                return
            with self._lock:
                wanted = self._wanted()
                if wanted == self._members:
                    continue
                self._writing |= wanted
            try:
                written = self.leadership.change_in_sync(wanted).members
            except FencedError:
                return  # the election tells the broker; waiting sends fail with the leadership
            except (ClusterError, PlugmqError) as exc:
                # The write's outcome may be unknown (no answer): until one succeeds, whatever it
                # wrote stays required, so the required brokers stay a superset of the stored set.
                self._log.warning("in-sync set not written yet; trying again", wanted=sorted(wanted), error=str(exc))
                self._due.wait(_RETRY_S)
                self._due.set()
                continue
            with self._lock:
                self._members = written
                self._writing = frozenset()
                for slave in written:
                    self._joining.pop(slave, None)
                commit = self._advance()
            self._release(commit)

    def close(self) -> None:
        self._closed = True
        self._due.set()
        self._release(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
