"""Retention run by the broker on its own clock, and the floor it never cleans below.

RocketMQ's broker runs CleanCommitLogService and CleanConsumeQueueService every
``cleanResourceInterval`` (10 s); the store only decides *what* may go. Here the broker's
:class:`RetentionSchedule` calls ``clean_expired(now_ms)`` on the store, the delay scheduler and
the transaction service every :data:`RETENTION_INTERVAL_S` seconds of the broker's clock.

What a store may remove is bounded by a :class:`RetentionFloor`: the lowest commit-log offset some
reader still needs. The broker holds it for its consumer groups (their committed offsets); a
service that keeps messages in the store (transaction halves, delay levels, pop state) adds its
own source through ``context.retention.hold(...)``. A store keeps every record at or above the
floor, however old, unless its disk watermark forces a clean - which it logs and counts.

On a :class:`~plugmq.core.clock.ManualClock` a retention round runs inside ``advance()``, like
every timer, so a test sees files disappear by moving the clock. On a real clock the timer only
wakes a ``plugmq-retention`` thread: deleting files or many records never delays the timers of
other components, which share the clock's one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from plugmq.core.clock import Clock, ManualClock, Timer
from plugmq.core.contracts import CleansExpired
from plugmq.core.logs import get_logger

__all__ = [
    "RETENTION_INTERVAL_S",
    "RetentionSchedule",
    "consumer_group_floor",
    "pop_consumer_floor",
]

log = get_logger(__name__)

#: RocketMQ's cleanResourceInterval: how often (clock seconds) the broker runs retention.
RETENTION_INTERVAL_S = 10.0


class _QueueReader(Protocol):
    """The part of a MessageStore the consumer floor needs."""

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[Any]: ...


def consumer_group_floor(tables: Iterable[Mapping[str, Any]], broker_name: str, store: _QueueReader) -> int | None:
    """The lowest commit-log offset a consumer group has not consumed yet.

    ``tables``: every committed offset table (clustering groups' and broadcasting members',
    ``{"topic@broker@queue": next offset}``; plugmq.broker.offsets). Committed offsets lag what a
    consumer holds in memory by at most one consume step, so the floor is never too high. A
    queue a group consumed completely holds nothing; a group holds a queue only once it
    committed an offset for it (RocketMQ holds nothing at all).
    """
    needed: dict[tuple[str, int], int] = {}
    for table in tables:
        for key, value in table.items():
            parts = str(key).rsplit("@", 2)
            if len(parts) != 3 or parts[1] != broker_name or not parts[2].isdigit():
                continue
            try:
                offset = int(value)
            except (TypeError, ValueError):
                continue
            queue = (parts[0], int(parts[2]))
            if queue not in needed or offset < needed[queue]:
                needed[queue] = offset
    return _commit_log_floor(store, needed)


def _commit_log_floor(store: _QueueReader, needed: Mapping[tuple[str, int], int],
                      extra: Iterable[int] = ()) -> int | None:
    """The lowest commit-log offset among the records at the queue offsets in ``needed`` (a
    queue consumed to its end holds nothing) and the commit-log offsets in ``extra``."""
    low = min(extra, default=None)
    for (topic, queue_id), offset in needed.items():
        if offset >= store.max_offset(topic, queue_id):
            continue
        offset = max(offset, store.min_offset(topic, queue_id))
        entries = store.read_queue(topic, queue_id, offset, 1)
        phys = int(entries[0].commit_log_offset) if entries else 0  # unreadable: hold everything
        if low is None or phys < low:
            low = phys
    return low


class _PopLanes(Protocol):
    """The part of the core's PopState the pop floor reads."""

    @property
    def lock(self) -> Any: ...

    @property
    def lanes(self) -> Mapping[Any, Any]: ...


def pop_consumer_floor(state: _PopLanes, store: _QueueReader) -> int | None:
    """The lowest commit-log offset a pop consumer group still needs: its messages in flight
    (received, not acked) and everything from its cursor on."""
    needed: dict[tuple[str, int], int] = {}
    inflight: list[int] = []
    with state.lock:
        for lane in state.lanes.values():
            queue = (lane.topic, lane.queue_id)
            needed[queue] = min(needed.get(queue, lane.next_offset), lane.next_offset)
            inflight.extend(m.commit_log_offset for m in lane.inflight.values())
    return _commit_log_floor(store, needed, inflight)


class RetentionSchedule:
    """Calls ``clean_expired(now_ms)`` on each target every ``interval_s`` seconds of the clock.

    A target without ``clean_expired`` (a third-party plugin written before it was part of the
    contract) is skipped with one info line; a target that raises is logged and tried again next
    round, and never stops the others.
    """

    def __init__(self, clock: Clock, *, interval_s: float = RETENTION_INTERVAL_S) -> None:
        self._clock = clock
        self._interval = interval_s
        self._targets: list[tuple[str, CleansExpired]] = []
        self._lock = threading.Lock()  # one round at a time
        self._timer: Timer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inline = isinstance(clock, ManualClock)
        self.rounds = 0
        self.failures = 0
        self.removed: dict[str, int] = {}

    def add(self, name: str, target: object | None) -> None:
        """Clean ``target`` each round under ``name``, in place of an earlier target of that name
        (None only removes it: the broker has no such service, or not now)."""
        self._targets = [(n, t) for n, t in self._targets if n != name]
        if target is None:
            return
        if not isinstance(target, CleansExpired):
            log.info("component has no clean_expired(now_ms); the broker cannot remove its old files",
                     component=name, type=type(target).__name__)
            return
        self._targets = [*self._targets, (name, target)]
        self.removed.setdefault(name, 0)

    def start(self) -> None:
        if self._inline:
            self._arm()
        else:
            self._thread = threading.Thread(target=self._loop, name="plugmq-retention", daemon=True)
            self._thread.start()

    def run_once(self) -> int:
        """One round now; returns how many files/records the targets removed."""
        with self._lock:
            now_ms = self._clock.now_ms()
            total = 0
            for name, target in self._targets:
                if self._stop.is_set():
                    break
                try:
                    removed = int(target.clean_expired(now_ms))
                except Exception:
                    self.failures += 1
                    log.exception("retention failed; retried next round", component=name)
                    continue
                self.removed[name] += removed
                total += removed
            self.rounds += 1
            return total

    def _arm(self) -> None:
        if not self._stop.is_set():
            self._timer = self._clock.call_later(self._interval, self._on_timer)

    def _on_timer(self) -> None:
        if self._stop.is_set():
            return
        try:
            self.run_once()
        finally:
            self._arm()

    def _loop(self) -> None:
        while not self._clock.wait(self._stop, self._interval):
            self.run_once()

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {"retention_rounds": self.rounds, "retention_failures": self.failures}
        out.update({f"retention_removed_{name}": count for name, count in self.removed.items()})
        return out

    def close(self) -> None:
        """Stop; a round in progress finishes first. Idempotent."""
        self._stop.set()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            pass
