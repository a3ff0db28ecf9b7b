"""The level scheduler: one consume queue of ``SCHEDULE_TOPIC_XXXX`` and one timer per level.

Within a level every message has the same delay, so queue order is deliver-time order and only
the head needs checking (seed 003). A level's timer is armed for its head's deliver time (rounded
up to ``tick_ms``, 1 ms by default: the deliver time itself); when it fires, the due messages of
that level are read (as runs of entries and records in one call from a QueueRunReading store,
else entries then their records) and written back in store batches of up to ``dispatch_batch``
(one ``deliver_batch`` each), the level's offset is persisted after each batch, and the timer is
re-armed for the new head (or for "now" after ``_YIELD_AFTER`` messages, so a burst never holds
the clock's thread from other timers). An empty level has no timer: ``schedule`` arms one when
it appends.

``start()`` returns at once: what came due while the broker was down is delivered by a catch-up
timer, oldest first across levels (a k-way merge of the level heads), in the same batches; the
level timers are armed when it is done.

Locks: ``_append`` orders appends (so a level's tail time never goes backwards), ``_dispatch``
serialises delivery and offset changes, ``_arm`` guards the armed-timer table. No lock is held
while calling into the clock, because ManualClock runs timer callbacks under its own lock.
Producers never wait for a delivery: ``schedule`` takes only ``_append``.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from plugmq.core import (
    AppendRequest,
    AppendResult,
    ConsumeQueueEntry,
    DelayCapabilities,
    DelayContext,
    DelayUnsupportedError,
    StoredMessage,
)
from plugmq.core.clock import Timer
from plugmq.core.contracts import QueueRunReading, has_capability, read_entries
from plugmq.core.errors import DelayError
from plugmq.core.logs import get_logger
from plugmq.core.names import SCHEDULE_TOPIC
from plugmq.kit.lateness import LatenessHistogram
from plugmq.kit.writeback import write_back
from plugmq.plugins.delay_level.offsets import OffsetTable
from plugmq.plugins.delay_level.options import DelayLevelOptions
from plugmq.plugins.delay_level.rewrite import dead_letter_copy, restore_all, to_schedule

__all__ = ["NAME", "LevelDelayScheduler", "capabilities_for"]

NAME = "delay_level"
log = get_logger(__name__)

_READ_CHUNK = 64
_RUN_CHUNK = 16  # a run decodes every record it reads: a timer that finds a few due reads few more
_YIELD_AFTER = 20_000  # messages per timer callback before other timers get the clock's thread


def capabilities_for(options: DelayLevelOptions) -> DelayCapabilities:
    levels = options.levels_ms
    return DelayCapabilities(
        cancel=False, arbitrary_delay=False, levels_ms=levels, max_delay_ms=max(levels),
        clamps=options.clamp_to_max_delay, resolution_ms=options.tick_ms, no_duplicates_after_restart=True,
    )


class _Position(Protocol):
    """Where a due message sits: a ConsumeQueueEntry, or the StoredMessage a run read (it says the same)."""

    @property
    def queue_offset(self) -> int: ...

    @property
    def tags_code(self) -> int: ...  # the deliver time (ms)

    @property
    def commit_log_offset(self) -> int: ...


_P = TypeVar("_P", bound=_Position)


def _deadline(ms: int) -> float:
    """Seconds whose ``int(x * 1000)`` is not below ``ms`` (plain ``ms / 1000`` can round down)."""
    when = ms / 1000.0
    while int(when * 1000) < ms:
        when = math.nextafter(when, math.inf)
    return when


def _stored_prefix(restored: list[AppendRequest | None], stored: list[bool]) -> int:
    """How many entries of a batch are done when the write-back stored only ``stored`` (one per
    request, the entries restored to None sent nothing): those before the first not stored."""
    index = 0
    for done, request in enumerate(restored):
        if request is not None:
            if not stored[index]:
                return done  # this and what follows wait for the retry (a level's offset is a prefix)
            index += 1
    return len(restored)


def _describe(levels: tuple[int, ...]) -> str:
    def one(ms: int) -> str:
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"{ms // size}{unit}"
        return f"{ms}ms"

    return " ".join(one(ms) for ms in levels)


class LevelDelayScheduler:
    """RocketMQ's ScheduleMessageService over the broker's own store."""

    def __init__(self, context: DelayContext, options: DelayLevelOptions) -> None:
        if context.store is None or context.deliver is None:
            raise DelayError(
                "delay_level keeps delayed messages in the broker's store (SCHEDULE_TOPIC_XXXX); it needs a "
                "DelayContext with store and deliver (the broker passes both; outside a broker use "
                "plugmq.broker.components.open_delay_scheduler(..., store=..., deliver=...))"
            )
        self._store = context.store
        self._deliver: Callable[[AppendRequest], AppendResult] = context.deliver
        self._deliver_batch = context.deliver_batch
        self._was_delivered = context.was_delivered
        self._clock = context.clock
        self._options = options
        self._levels = options.levels_ms
        self.capabilities = capabilities_for(options)
        self._offsets = OffsetTable(context.plugin_dir(NAME) / "offsets.bin", fsync=options.fsync)
        self._append = threading.Lock()
        self._dispatch = threading.RLock()
        self._arm_lock = threading.Lock()
        self._armed: dict[int, tuple[int, Timer | None]] = {}  # queue id -> (wake ms, timer)
        self._started = False
        self._catching_up = False
        self._start_ms = 0
        self._closed = False
        self._tail: dict[int, int] = {}
        for qid in self._queue_ids():
            end = self._store.max_offset(SCHEDULE_TOPIC, qid)
            last = self._store.read_queue(SCHEDULE_TOPIC, qid, end - 1, 1) if end else []
            if last:
                self._tail[qid] = last[0].tags_code
        self._lateness = LatenessHistogram()
        self._counts = dict.fromkeys(
            ("scheduled", "clamped", "delivered", "dead_lettered", "overdue_at_start", "in_doubt_settled",
             "in_doubt_unchecked_levels", "missing", "lost_to_retention", "deliver_errors", "batches"), 0)
        self._late_at_start_max = 0
        with self._dispatch:
            for qid in self._queue_ids():
                self._settle_in_doubt(qid)

    # ------------------------------------------------------------------------------ accepting
    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        if self._closed:
            raise DelayError("delay_level scheduler is closed; it accepts no more delayed messages")
        top = len(self._levels)
        if delay_level is None:
            raise DelayUnsupportedError(
                f"delay_level serves only the fixed delay levels 1..{top} ({_describe(self._levels)}); a deliver-at "
                f"time or arbitrary delay (message to {request.topic!r}, due at {deliver_at_ms} ms) cannot be "
                f"expressed by levels, even one that happens to equal a level: send a delay_level instead, or use "
                f"delay_wheel or delay_schedule, which take arbitrary delays"
            )
        level = delay_level
        if level < 1:
            raise DelayUnsupportedError(f"delay level {level} is not a level; levels are 1..{top}")
        if level > top:
            if not self._options.clamp_to_max_delay:
                raise DelayUnsupportedError(
                    f"delay level {level} is above the highest configured level {top} "
                    f"({_describe(self._levels[-1:])}) and plugins.delay_level.clamp_to_max_delay is off; use a "
                    f"level 1..{top}, turn clamp_to_max_delay on, or use delay_wheel / delay_schedule for longer "
                    f"delays"
                )
            level = top
        qid = level - 1
        with self._append:
            if level != delay_level:
                self._counts["clamped"] += 1
            # Equal delays keep a level in deliver-time order; concurrent callers may still hand
            # in times a hair out of order, which would only make the later one wait (never early).
            at = max(deliver_at_ms, self._tail.get(qid, 0))
            result = self._store.append(to_schedule(request, level, at))
            self._tail[qid] = at
            self._counts["scheduled"] += 1
        self._arm(qid, at)
        return result

    def cancel(self, msg_id: str) -> bool:
        raise DelayUnsupportedError(
            f"delay_level cannot cancel delayed message {msg_id}: a level is a queue read in order and "
            f"RocketMQ's levels have no cancel; use delay_wheel or delay_schedule"
        )

    # ------------------------------------------------------------------------------ timers
    def _queue_ids(self) -> range:
        # Queues beyond the configured levels (the level list was shortened) are still served.
        return range(max(len(self._levels), self._store.queues().get(SCHEDULE_TOPIC, 0)))

    def _arm(self, qid: int, at_ms: int) -> None:
        tick = self._options.tick_ms
        wake = -(-at_ms // tick) * tick
        with self._arm_lock:
            if self._closed or not self._started or self._catching_up:
                return  # the catch-up arms every level when it is done
            current = self._armed.get(qid)
            if current is not None and current[0] <= wake:
                return
            self._armed[qid] = (wake, None)
        timer = self._clock.call_at(_deadline(wake), lambda: self._on_timer(qid, wake))
        with self._arm_lock:
            if self._closed:
                timer.cancel()
            elif self._armed.get(qid, (None,))[0] == wake:
                self._armed[qid] = (wake, timer)

    def _on_timer(self, qid: int, wake: int) -> None:
        with self._arm_lock:
            if self._armed.get(qid, (None,))[0] == wake:
                del self._armed[qid]
        self._run_level(qid)

    def _run_level(self, qid: int) -> None:
        rearm: int | None = None
        with self._dispatch:
            if self._closed:
                return
            now = self._clock.now_ms()
            budget = _YIELD_AFTER
            while rearm is None:
                now = self._clock.now_ms()
                offset = self._skip_removed(qid, self._offsets.get(qid))
                positions, messages, rearm = self._due(qid, offset, now)
                if not positions:
                    break
                done = self._deliver_entries([qid] * len(positions), positions, messages, now, at_start=False)
                if done < len(positions):
                    rearm = now + self._options.retry_after_error_ms
                budget -= len(positions)
                if rearm is None and budget <= 0:
                    rearm = now  # come back at once, after other due timers had their turn
        if rearm is not None:
            self._arm(qid, rearm)

    def _due(self, qid: int, offset: int, now: int) -> tuple[Sequence[_Position], Sequence[StoredMessage | None],
                                                           int | None]:
        """The due messages of a level from ``offset`` (as :meth:`_due_prefix` finds them), where
        each sits, and the deliver time of the first one not yet due. From a QueueRunReading store
        the messages are read with their entries in one call per chunk (no ConsumeQueueEntry: a
        message says where it sits); a run the store cannot vouch for goes entry by entry."""
        store = self._store
        if has_capability(store, QueueRunReading):
            messages, rearm = self._due_prefix(functools.partial(store.read_queue_run, SCHEDULE_TOPIC, qid), offset,
                                               _RUN_CHUNK, now)
            if messages is not None:
                return messages, messages, rearm
        entries, rearm = self._due_prefix(functools.partial(store.read_queue, SCHEDULE_TOPIC, qid), offset,
                                          _READ_CHUNK, now)
        return entries or [], read_entries(store, entries) if entries else [], rearm

    def _due_prefix(self, read: Callable[[int, int], Sequence[_P] | None], offset: int, chunk: int,
                    now: int) -> tuple[list[_P] | None, int | None]:
        """Up to ``dispatch_batch`` entries (or messages) due by ``now`` from ``offset`` on (the level
        is in deliver-time order, so they are a prefix), read by ``read(offset, count)`` in growing
        chunks so a timer that finds a few due reads a few; and the deliver time of the first one
        not yet due. None when ``read`` answers None ("not exact") at once; later, that ends the
        batch early (the next one starts there)."""
        due: list[_P] = []
        want = self._options.dispatch_batch
        while len(due) < want:
            got = read(offset, min(chunk, want - len(due)))
            if got is None:
                return (due or None), None
            if not got:
                return due, None
            if got[-1].tags_code <= now:
                due += got
            else:
                for item in got:
                    if item.tags_code > now:
                        return due, item.tags_code
                    due.append(item)
            offset = got[-1].queue_offset + 1
            chunk *= 4
        return due, None

    def _deliver_entries(self, qids: Sequence[int], positions: Sequence[_Position],
                         messages: Sequence[StoredMessage | None], now: int, *, at_start: bool) -> int:
        """Write the due ``messages`` (of levels ``qids``, at ``positions``, in deliver order) back
        in one batch and move each level's offset past what reached the store; returns how many
        of them are done (a prefix, all of them unless the write-back failed). At start-up,
        messages overdue by more than ``dead_letter_older_than_ms`` go to the dead-letter topic."""
        restored = restore_all(messages)
        requests = [r for r in restored if r is not None]  # (`None in restored` would call each request's __eq__)
        whole = len(requests) == len(restored)
        if not whole:
            self._skip_missing(positions, restored)
        dead = self._dead_letters(positions, restored) if at_start else None
        if dead is not None:
            topic = self._options.dead_letter_topic
            requests = [dead_letter_copy(r, topic) if d else r
                        for r, d in zip(restored, dead, strict=True) if r is not None]
        stored = self._write_back(requests) if requests else None
        now = self._clock.now_ms()  # lateness counts from when the batch is visible
        done = len(positions) if stored is None else _stored_prefix(restored, stored)
        settled = positions[:done]
        if whole and dead is None:
            delivered: Sequence[_Position] = settled
        else:
            dead_flags = dead if dead is not None else itertools.repeat(False)
            delivered = [p for p, r, d in zip(settled, restored, dead_flags, strict=False) if r is not None and not d]
        record = self._lateness.record
        for late, count in Counter([now - p.tags_code for p in delivered]).items():  # few distinct values
            record(late, count)
        self._settle_offsets(qids[:done], settled)
        if at_start:
            self._note_overdue([p for p, r in zip(settled, restored, strict=False) if r is not None], now)
        self._counts["delivered"] += len(delivered)
        if dead is not None:
            self._counts["dead_lettered"] += sum(dead[:done])  # True only where a request was restored
        self._counts["batches"] += 1
        if done:
            self._persist()
        return done

    def _settle_offsets(self, qids: Sequence[int], settled: Sequence[_Position]) -> None:
        """Each level's offset past its last settled message."""
        for qid, offset in {qid: p.queue_offset + 1 for qid, p in zip(qids, settled, strict=True)}.items():
            self._offsets.set(qid, offset)

    def _skip_missing(self, positions: Sequence[_Position], restored: list[AppendRequest | None]) -> None:
        for entry, request in zip(positions, restored, strict=True):
            if request is None:  # unreadable: nothing to send, the offset moves past it
                self._counts["missing"] += 1
                log.error("scheduled message unreadable or without its real topic; skipped",
                          commit_log_offset=entry.commit_log_offset, offset=entry.queue_offset)

    def _dead_letters(self, positions: Sequence[_Position],
                      restored: list[AppendRequest | None]) -> list[bool] | None:
        """Per entry, whether it goes to the dead-letter topic (None: none does)."""
        limit = self._options.dead_letter_older_than_ms
        if not limit:
            return None
        oldest = self._start_ms - limit
        return [request is not None and entry.tags_code < oldest
                for entry, request in zip(positions, restored, strict=True)]

    def _note_overdue(self, delivered: list[_Position], now: int) -> None:
        """At start-up: count what came due while the broker was down, and how late it went out."""
        for entry in delivered:
            if entry.tags_code <= self._start_ms:
                self._counts["overdue_at_start"] += 1
                self._late_at_start_max = max(self._late_at_start_max, now - entry.tags_code)

    def _write_back(self, requests: list[AppendRequest]) -> list[bool] | None:
        """Deliver in order; None when all were stored, else which ones reached the store."""
        outcome = write_back(requests, self._deliver, self._deliver_batch, self._was_delivered)
        if outcome.error is not None:
            self._counts["deliver_errors"] += 1
            log.error("delay_level write-back failed; retrying later", messages=len(requests),
                      retry_ms=self._options.retry_after_error_ms, exc_info=outcome.error)
        return outcome.stored

    def _skip_removed(self, qid: int, offset: int) -> int:
        low = self._store.min_offset(SCHEDULE_TOPIC, qid)
        if low > offset:
            self._counts["lost_to_retention"] += low - offset
            log.error("store retention removed undelivered delayed messages", level=qid + 1,
                      lost=low - offset, hint="keep store retention above the longest delay level")
            self._offsets.set(qid, low)
            return low
        return offset

    def _persist(self, *, sync: bool = False) -> None:
        if self._options.fsync or sync:
            self._store.flush()  # the write-backs first: an offset must never be durable ahead of them
        self._offsets.persist(sync=sync)

    # ------------------------------------------------------------------------------ start-up
    def start(self) -> None:
        """Arm the catch-up timer and return: what came due while the broker was down is
        delivered by it, oldest first across levels; it arms the level timers when done. (The
        deliveries a killed process made after its last offset persist were settled on opening.)"""
        with self._arm_lock:
            if self._started or self._closed:
                return
            self._started = True
            self._catching_up = True
            self._start_ms = self._clock.now_ms()
        self._clock.call_at(_deadline(self._start_ms), self._catch_up)
        log.info("delay_level started", pending=self.pending(), in_doubt_settled=self._counts["in_doubt_settled"])

    def _catch_up(self) -> None:
        """Deliver everything due now, oldest first across levels (a k-way merge of the level
        heads), in batches; at most ``_YIELD_AFTER`` per call, then come back at once."""
        with self._dispatch:
            if self._closed:
                return
            now = self._clock.now_ms()
            sent = 0
            finished = False
            while sent < _YIELD_AFTER:
                batch = self._overdue_batch(now)
                if not batch:
                    finished = True
                    break
                qids = [qid for qid, _ in batch]
                entries = [entry for _, entry in batch]
                done = self._deliver_entries(qids, entries, read_entries(self._store, entries), now, at_start=True)
                sent += len(batch)
                if done < len(batch):  # the store refused: try again later, still in order
                    self._clock.call_at(_deadline(now + self._options.retry_after_error_ms), self._catch_up)
                    return
            if not finished:
                self._clock.call_at(_deadline(now), self._catch_up)
                return
            heads = {}
            for qid in self._queue_ids():
                head = self._store.read_queue(SCHEDULE_TOPIC, qid, self._offsets.get(qid), 1)
                if head:
                    heads[qid] = head[0].tags_code
        with self._arm_lock:
            self._catching_up = False
        for qid, at in heads.items():
            self._arm(qid, at)
        if self._counts["overdue_at_start"]:
            log.info("delay_level delivered what came due while it was down",
                     overdue=self._counts["overdue_at_start"], late_ms_max=self._late_at_start_max)

    def _overdue_batch(self, now: int) -> list[tuple[int, ConsumeQueueEntry]]:
        """Up to ``dispatch_batch`` entries due by ``now``, merged across levels by deliver time."""
        want = self._options.dispatch_batch
        queues: dict[int, list[ConsumeQueueEntry]] = {}
        heap: list[tuple[int, int]] = []
        for qid in self._queue_ids():
            offset = self._skip_removed(qid, self._offsets.get(qid))
            entries = self._store.read_queue(SCHEDULE_TOPIC, qid, offset, min(want, _READ_CHUNK))[::-1]
            if entries and entries[-1].tags_code <= now:
                queues[qid] = entries
                heapq.heappush(heap, (entries[-1].tags_code, qid))
        batch: list[tuple[int, ConsumeQueueEntry]] = []
        while heap and len(batch) < want:
            _, qid = heapq.heappop(heap)
            entries = queues[qid]
            entry = entries.pop()
            batch.append((qid, entry))
            if not entries:
                entries.extend(self._store.read_queue(SCHEDULE_TOPIC, qid, entry.queue_offset + 1, _READ_CHUNK)[::-1])
            if entries and entries[-1].tags_code <= now:
                heapq.heappush(heap, (entries[-1].tags_code, qid))
        return batch

    def _settle_in_doubt(self, qid: int) -> None:
        """Entries after the persisted offset that a killed process had already written back.

        Deliveries within a level happen in order and the offset is persisted after each batch,
        so the in-doubt entries are a prefix of at most one batch: walk it while the store says
        the write-back happened.
        """
        offset = self._skip_removed(qid, self._offsets.get(qid))
        if self._was_delivered is None:
            self._counts["in_doubt_unchecked_levels"] += 1
            return
        settled = 0
        entries = self._store.read_queue(SCHEDULE_TOPIC, qid, offset, self._options.dispatch_batch)
        for request in restore_all(read_entries(self._store, entries)):
            if request is not None and not (
                self._was_delivered(request)
                or (self._options.dead_letter_older_than_ms
                    and self._was_delivered(dead_letter_copy(request, self._options.dead_letter_topic)))
            ):
                break
            settled += 1
        if settled:
            self._offsets.set(qid, offset + settled)
            self._persist()
            self._counts["in_doubt_settled"] += settled
            log.warning("delay_level settled deliveries made before a crash", level=qid + 1, count=settled)

    # ------------------------------------------------------------------------------ state
    def pending(self) -> int:
        return sum(max(0, self._store.max_offset(SCHEDULE_TOPIC, q) - self._offsets.get(q)) for q in self._queue_ids())

    def clean_expired(self, now_ms: int) -> int:
        """Nothing to remove: the delayed messages live in the broker's store (``SCHEDULE_TOPIC_XXXX``,
        whose segments the store's own retention removes) and this plugin's only file is its
        offset table. Returns 0."""
        return 0

    def metrics(self) -> Mapping[str, float]:
        figures: dict[str, float] = {k: float(v) for k, v in self._counts.items()}
        figures.update(self._lateness.figures())
        figures["late_at_start_ms_max"] = float(self._late_at_start_max)
        figures["pending"] = float(self.pending())
        figures["offset_persists"] = float(self._offsets.persists)
        figures["armed_timers"] = float(len(self._armed))
        return figures

    def close(self) -> None:
        with self._arm_lock:
            if self._closed:
                return
            self._closed = True
            timers = [timer for _, timer in self._armed.values() if timer is not None]
            self._armed.clear()
        for timer in timers:
            timer.cancel()
        with self._dispatch:
            self._persist(sync=True)
            self._offsets.close()
        log.info("delay_level closed", pending=self.pending())
