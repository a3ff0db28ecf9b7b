"""The wheel: an hour wheel of hours with files, 3600 second slots per hour, a millisecond level.

A message is filed under the second of its due time and carries its millisecond within that
second in its index entry. Its *key* is ``(due ms, localIndex)``; messages are delivered in key
order, never before their due time (a due time at or before now becomes now + 1 ms, "the next
tick"). The *window* is the first two hours (at or after the position's hour) that have files;
only they are mapped, and their non-empty seconds form the delay queue (``_due``, a heap of
seconds). Seconds within ``preload_seconds`` are walked and sorted by key ahead of time; when a
second comes due it is *opened*: its sorted entries (plus a heap of late arrivals into it) are
the millisecond level, and one clock timer waits for its next key (or for the next second, or
for the end of the hour). An idle wheel therefore sets one timer, not one per tick.

Dispatch runs in the clock's timer callback, a batch at a time: under the lock it claims up to
``dispatch_batch`` due entries of one second, reads their records in runs and writes an INTENT
checkpoint; the write-back (``deliver_batch``, one store batch) runs *outside* the lock, so
producers are never blocked behind a burst; then the position moves past the batch. After
``_YIELD_AFTER`` messages a callback re-arms itself for "now" and returns, so a huge backlog
never holds the clock thread from other timers, and ``start()`` only arms the timer: an overdue
backlog at start is delivered in the background.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import threading
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    CorruptRecordError,
    DelayCapabilities,
    DelayContext,
    DelayUnsupportedError,
    Prop,
)
from plugmq.core.clock import Timer
from plugmq.core.errors import DelayError
from plugmq.core.logs import get_logger
from plugmq.kit.intent import IntentFile
from plugmq.kit.lateness import LatenessHistogram
from plugmq.kit.writeback import write_back
from plugmq.plugins.delay_wheel.checkpoint import CheckpointState, Phase, WheelCheckpoint
from plugmq.plugins.delay_wheel.codec import SECONDS_PER_HOUR, IndexEntry, StoredDelay, WheelMsgIds, encode_record
from plugmq.plugins.delay_wheel.hourfiles import HourFiles
from plugmq.plugins.delay_wheel.hours import HourDirectory
from plugmq.plugins.delay_wheel.options import DelayWheelOptions, open_hours_for

__all__ = ["RESOLUTION_MS", "WheelDelayScheduler", "capabilities_for"]

log = get_logger(__name__)

RESOLUTION_MS = 1
HOUR_MS = SECONDS_PER_HOUR * 1000
_WINDOW_HOURS = 2
_YIELD_AFTER = 20_000  # messages per timer callback before it lets other timers run

Key = tuple[int, int]  # (due ms, localIndex)
# key + where the entry points: (due ms, localIndex, globalIndex, log offset, record size, second
# in the hour). A tuple of ints, not the IndexEntry: the cyclic GC stops tracking such tuples, and
# a burst's second holds them by the hundred thousand (tracked, each full collection walked them).
Item = tuple[int, int, int, int, int, int]
_GI, _OFFSET, _SIZE, _SECOND = 2, 3, 4, 5


def capabilities_for(options: DelayWheelOptions, *, no_duplicates: bool = True) -> DelayCapabilities:
    return DelayCapabilities(
        cancel=True, arbitrary_delay=True, levels_ms=None, max_delay_ms=options.max_delay_ms,
        clamps=options.clamp_to_max_delay, resolution_ms=RESOLUTION_MS, no_duplicates_after_restart=no_duplicates,
    )


def _moved_request(request: AppendRequest, deliver_at_ms: int) -> AppendRequest:
    """A stored request (delay properties cleared) as a reschedule files it: an arbitrary deliver time."""
    return attrs.evolve(request, properties={**request.properties, Prop.DELIVER_AT_MS: str(deliver_at_ms)})


def _seconds(ms: int) -> float:
    """A clock deadline whose ``now_ms()`` is not below ``ms`` (``ms / 1000`` may round down)."""
    when = ms / 1000
    while int(when * 1000) < ms:
        when = math.nextafter(when, math.inf)
    return when


def _sorted_items(hour: int, second: int, rows: list[tuple[int, int, int, int, int]]) -> list[Item]:
    """Items of (ms, localIndex, globalIndex, offset, size) rows of one second, in key order."""
    base = (hour * SECONDS_PER_HOUR + second) * 1000
    return sorted([(base + ms, local, gi, offset, size, second) for ms, local, gi, offset, size in rows])


def _items_of_columns(hour: int, second: int, columns: tuple[Any, Any, Any, Any, Any]) -> list[Item]:
    """:func:`_sorted_items` of a big second's checked numpy columns: sorted by (ms, localIndex)
    in numpy and turned into tuples once (a 10k second is preloaded every second at 10k due/s,
    in the clock's thread)."""
    ms, local, gi, offset, size = columns
    order = ms.argsort(kind="stable")  # the columns are in localIndex order: this is (ms, localIndex) order
    due = ms[order].astype("int64") + (hour * SECONDS_PER_HOUR + second) * 1000
    return list(zip(due.tolist(), local[order].tolist(), gi[order].tolist(), offset[order].tolist(),
                    size[order].tolist(), itertools.repeat(second, len(order))))


def _records(files: HourFiles, items: list[Item]) -> list[StoredDelay | None]:
    return files.records_at([i[_OFFSET] for i in items], [i[_SIZE] for i in items])


@attrs.define
class _Outgoing:
    """A claimed batch's write-back, column by column (message i is element i of each)."""

    requests: list[AppendRequest] = attrs.Factory(list)
    deliver_at_ms: list[int] = attrs.Factory(list)  # the real ones (a key may be later: "now" became the next ms)
    dead: list[bool] = attrs.Factory(list)  # going to the dead-letter topic
    global_index: list[int] = attrs.Factory(list)

    def __len__(self) -> int:
        return len(self.requests)


class _OpenSecond:
    """The millisecond level: the pending entries of the second being dispatched, in key order —
    the sorted chain plus a heap of entries that arrived after it was sorted."""

    def __init__(self, second: int, items: list[Item]) -> None:
        self.second = second
        self._sorted = items
        self._next = 0
        self._arrivals: list[Item] = []

    def __len__(self) -> int:
        return len(self._sorted) - self._next + len(self._arrivals)

    def head(self) -> Item | None:
        a = self._sorted[self._next] if self._next < len(self._sorted) else None
        b = self._arrivals[0] if self._arrivals else None
        if a is None or (b is not None and b[:2] < a[:2]):
            return b
        return a

    def pop(self) -> Item:
        a = self._sorted[self._next] if self._next < len(self._sorted) else None
        if a is None or (self._arrivals and self._arrivals[0][:2] < a[:2]):
            return heapq.heappop(self._arrivals)
        self._next += 1
        return a

    def push(self, item: Item) -> None:
        heapq.heappush(self._arrivals, item)

    def take(self, now: int, limit: int) -> list[Item]:
        """Remove and return up to ``limit`` entries due by ``now``, in key order."""
        if not self._arrivals:  # the common case, a burst: one bisect and one slice
            end = min(len(self._sorted), self._next + limit)
            cut = bisect.bisect_right(self._sorted, (now, math.inf), self._next, end)
            taken = self._sorted[self._next:cut]
            self._next = cut
            return taken
        taken = []
        while len(taken) < limit:
            head = self.head()
            if head is None or head[0] > now:
                break
            taken.append(self.pop())
        return taken


class WheelDelayScheduler:
    """seed 000's arbitrary delay over hourly delay logs (see the package docstring)."""

    def __init__(self, context: DelayContext, options: DelayWheelOptions) -> None:
        if context.deliver is None:
            raise DelayError("delay_wheel needs the broker's deliver callback in its DelayContext")
        self._opts = options
        self._clock = context.clock
        self._deliver = context.deliver
        self._deliver_batch = context.deliver_batch
        self._was_delivered = context.was_delivered
        self._ids = WheelMsgIds(context.store_host)
        self.capabilities = capabilities_for(options, no_duplicates=context.was_delivered is not None)
        root = context.plugin_dir("delay_wheel")
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._dir = HourDirectory(root / "hours", fsync=options.fsync, open_cache=open_hours_for(options.open_hours_cache))
        self._ckpt = WheelCheckpoint(root / "wheel.ckpt", fsync=options.fsync)
        self._log = log.bind(plugin="delay_wheel", dir=str(root))

        state = self._ckpt.state
        now_ms = self._clock.now_ms()
        if state is None:
            first = self._dir.hours[0] * HOUR_MS if self._dir.hours else now_ms + 1
            state = CheckpointState(min(first, now_ms + 1), 0)
        self._pos: Key = state.position  # every key below is delivered or cancelled
        self._moves = IntentFile(root / "reschedule.intent", 7, fsync=options.fsync)
        self._settle_move()
        self._claimed: Key = self._pos  # ... or in the batch being written back
        self._in_doubt: tuple[Key, Key] | None = (state.position, state.end) if state.phase != Phase.POSITION else None
        self._skip: set[tuple[int, int]] = set()  # (hour, gi) found delivered when settling a batch
        # End of the intent on disk not yet followed by a position (a batch in flight, failed or
        # left by a crash): then the checkpoint must not be overwritten by a bare position.
        self._unsettled: Key | None = state.end if state.phase != Phase.POSITION else None

        self._window: list[int] = []
        self._due: list[int] = []  # heap of non-empty seconds of the window, not yet opened
        self._due_set: set[int] = set()
        self._preloaded: dict[int, list[Item]] = {}
        self._open: _OpenSecond | None = None
        self._timer: Timer | None = None
        self._retry_at_ms: int | None = None
        self._started = False
        self._start_ms = 0
        self._first_run = False
        self._closed = False
        self._dispatching: threading.Thread | None = None

        self._hist = LatenessHistogram()
        self._counters = dict.fromkeys(
            ("scheduled", "delivered", "cancelled", "rescheduled", "dead_lettered", "clamped", "overdue_at_start",
             "in_doubt_found_delivered", "in_doubt_redelivered", "deliver_errors", "corrupt_skipped", "timers_armed",
             "batches", "hours_mapped", "hours_unmapped", "hours_deleted", "files_deleted",
             "index_entries_preloaded"), 0)

        self._remaining: dict[int, int] = {}
        tick_hour = self._pos[0] // HOUR_MS
        for hour in self._dir.hours:
            if hour < tick_hour:
                continue  # passed: all delivered or cancelled; clean_expired removes the files
            files = self._dir.get(hour)
            assert files is not None
            self._remaining[hour] = files.count - files.cancelled_count()
        self._discount_dispatched_of_tick_hour()
        self._pending = sum(self._remaining.values())
        self._refill_window()
        self._resolve_in_doubt()

    # ================================================================== recovery helpers

    def _discount_dispatched_of_tick_hour(self) -> None:
        second = self._pos[0] // 1000
        hour, in_hour = divmod(second, SECONDS_PER_HOUR)
        files = self._dir.get(hour)
        if files is None:
            return
        done = files.count_before(in_hour)
        before: set[int] = set()
        if files.head(in_hour)[1]:
            before = {i[_GI] for i in self._items_of(files, in_hour)
                      if i[:2] < self._pos}
        done += len(before)
        for gi in files.cancelled():
            entry = files.entry(gi)
            if entry.second < in_hour or gi in before:
                done -= 1
        self._remaining[hour] -= done

    def _resolve_in_doubt(self) -> None:
        """The batch a crash interrupted: ask the broker which of its messages reached their
        topic; those are skipped, the rest are delivered again (they are due)."""
        doubt, self._in_doubt = self._in_doubt, None
        if doubt is None:
            return
        start, end = doubt
        found = redo = 0
        for second in range(start[0] // 1000, end[0] // 1000 + 1):
            hour, in_hour = divmod(second, SECONDS_PER_HOUR)
            files = self._dir.get(hour)
            if files is None or not files.head(in_hour)[1]:
                continue
            cancelled = files.cancelled()
            items = [i for i in self._items_of(files, in_hour)
                     if start <= i[:2] < end and i[_GI] not in cancelled]
            for item, stored in zip(items, _records(files, items), strict=True):
                if stored is not None and self._reached_topic(stored.request):
                    self._skip.add((hour, item[_GI]))
                    self._account_delivered(hour)
                    found += 1
                else:
                    redo += 1
        self._counters["in_doubt_found_delivered"] += found
        self._counters["in_doubt_redelivered"] += redo
        self._log.info("in-doubt delivery batch settled", already_delivered=found, delivering_again=redo)

    def _reached_topic(self, request: AppendRequest) -> bool:
        if self._was_delivered is None:
            return False  # nothing to ask: deliver again (at least once)
        if self._was_delivered(request):
            return True
        return bool(self._opts.dead_letter_older_than_ms) and self._was_delivered(self._dead_letter(request))

    # ================================================================== window (mapped hours)

    def _refill_window(self) -> None:
        wanted = self._dir.first_hours(self._pos[0] // HOUR_MS, _WINDOW_HOURS)
        if wanted == self._window:
            return
        for hour in self._window:
            if hour not in wanted:
                self._dir.unmap(hour)
                self._counters["hours_unmapped"] += 1
                self._preloaded = {s: e for s, e in self._preloaded.items() if s // SECONDS_PER_HOUR != hour}
        for hour in wanted:
            if hour not in self._window:
                self._dir.map(hour)
                self._counters["hours_mapped"] += 1
        self._window = list(wanted)
        first = self._pos[0] // 1000
        opened = self._open.second if self._open is not None else -1
        due: set[int] = set()
        for hour in self._window:
            files = self._dir.get(hour)
            assert files is not None
            base = hour * SECONDS_PER_HOUR
            due.update(base + s for s in files.nonempty_seconds() if base + s >= first and base + s != opened)
        self._due_set = due
        self._due = sorted(due)

    # ================================================================== schedule

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        with self._lock:
            if self._closed:
                raise DelayError("delay_wheel is closed; reopen the broker to schedule delayed messages")
            now_ms = self._clock.now_ms()
            deliver_at_ms = self._within_max(deliver_at_ms, now_ms)
            hour, entry = self._append(request, deliver_at_ms, now_ms, delay_level, self._due_ms(deliver_at_ms, now_ms))
            self._pending += 1
            self._counters["scheduled"] += 1
            return self._result(hour, entry, now_ms)

    def _within_max(self, deliver_at_ms: int, now_ms: int) -> int:
        """The deliver time, clamped to the maximum delay where allowed; DelayUnsupportedError if not."""
        if deliver_at_ms - now_ms <= self._opts.max_delay_ms:
            return deliver_at_ms
        if not self._opts.clamp_to_max_delay:
            raise DelayUnsupportedError(
                f"delay of {deliver_at_ms - now_ms} ms is above delay_wheel's maximum of "
                f"{self._opts.max_delay_ms} ms; raise [plugins.delay_wheel] max_delay_ms or set "
                f"clamp_to_max_delay = true to deliver such messages at the maximum"
            )
        self._counters["clamped"] += 1
        return now_ms + self._opts.max_delay_ms

    def _due_ms(self, deliver_at_ms: int, now_ms: int) -> int:
        """Due now or before: the next millisecond (the current one may be dispatched already).
        Never below the position either, should the clock have stepped back."""
        return max(deliver_at_ms, now_ms + 1, self._claimed[0])

    def _append(self, request: AppendRequest, deliver_at_ms: int, now_ms: int, delay_level: int | None,
                due: int) -> tuple[int, IndexEntry]:
        second, ms = divmod(due, 1000)
        hour, in_hour = divmod(second, SECONDS_PER_HOUR)
        record = encode_record(request, deliver_at_ms, now_ms, delay_level)
        files = self._dir.get(hour, create=True)
        assert files is not None
        entry = files.append(record, in_hour, ms)
        self._remaining[hour] = self._remaining.get(hour, 0) + 1
        self._place(second, hour, (due, entry.local_index, entry.global_index, entry.offset, entry.size, in_hour))
        return hour, entry

    def _result(self, hour: int, entry: IndexEntry, now_ms: int) -> AppendResult:
        return AppendResult(
            status=AppendStatus.PUT_OK, msg_id=self._ids.encode(hour, entry.global_index),
            queue_offset=entry.global_index, commit_log_offset=entry.offset, size=entry.size,
            store_timestamp_ms=now_ms,
        )

    def _place(self, second: int, hour: int, item: Item) -> None:
        if self._open is not None and second == self._open.second:
            self._open.push(item)
        elif hour in self._window:
            preloaded = self._preloaded.get(second)
            if preloaded is not None:
                bisect.insort(preloaded, item)
            if second in self._due_set:
                if second != self._due[0] or preloaded is None:
                    return  # the wake-up for that second is armed already and cannot move
            else:
                self._due_set.add(second)
                heapq.heappush(self._due, second)
        elif len(self._window) < _WINDOW_HOURS or hour < self._window[-1]:
            self._refill_window()
        else:
            return  # a far hour: only its files changed
        self._arm()

    # ================================================================== timers

    def start(self) -> None:
        """Arm the timer (the batch a crash left in doubt was settled when the wheel opened).
        What came due while the broker was down is delivered by that timer, oldest first, in the
        background."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._start_ms = self._clock.now_ms()
            self._first_run = True  # the first timer callback preloads and delivers the overdue backlog
            self._arm()

    def _next_deadline(self) -> int | None:
        if self._retry_at_ms is not None:  # after a failed write-back nothing moves before the retry
            return self._retry_at_ms
        if self._first_run:
            return self._start_ms
        deadline: int | None = None
        head = self._open.head() if self._open is not None else None
        if head is not None:
            deadline = head[0]
        elif self._due:
            preloaded = self._preloaded.get(self._due[0])
            if preloaded:
                deadline = preloaded[0][0]
            else:  # wake up early enough to walk and sort the second before it is due
                deadline = max(self._due[0] - self._opts.preload_seconds, self._pos[0] // 1000) * 1000
        tick_hour = self._pos[0] // HOUR_MS
        if tick_hour in self._dir:
            # The hour wheel's own step: when the position's hour ends the window moves on, even
            # if nothing else is due for a long time.
            end_of_hour = (tick_hour + 1) * HOUR_MS
            deadline = end_of_hour if deadline is None else min(deadline, end_of_hour)
        return deadline

    def _arm(self) -> None:
        if not self._started or self._closed or self._dispatching is not None:
            return  # a running dispatch re-arms when it ends
        deadline = self._next_deadline()
        timer = self._timer
        if timer is not None and not timer.cancelled and not timer.fired and timer.deadline == (
                None if deadline is None else _seconds(deadline)):
            return
        if timer is not None:
            timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self._clock.call_at(_seconds(deadline), self._on_timer)
            self._counters["timers_armed"] += 1

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed or not self._started or self._dispatching is not None:
                return
            self._dispatching = threading.current_thread()
            self._first_run = False
        try:
            self._dispatch_due()
        finally:
            with self._lock:
                self._dispatching = None
                self._idle.notify_all()
                if not self._closed:
                    self._preload(self._clock.now_ms())
                    self._arm()

    # ================================================================== dispatch

    def _dispatch_due(self) -> None:
        """Deliver what is due, a batch at a time, at most ``_YIELD_AFTER`` messages per call."""
        budget = _YIELD_AFTER
        while budget > 0:
            with self._lock:
                if self._closed:
                    return
                now = self._clock.now_ms()
                if self._retry_at_ms is not None:
                    if now < self._retry_at_ms:
                        return
                    self._retry_at_ms = None
                claimed = self._claim(now)
                if claimed is None:
                    self._move_position_to(now + 1)
                    return
                items, outgoing, files = claimed
                start, end = self._pos, (items[-1][0], items[-1][1] + 1)
                self._claimed = self._unsettled = end
                self._ckpt.write(start, end)  # INTENT: these may reach their topic from here on
            stored = self._write_back(outgoing.requests)
            with self._lock:  # lateness counts from when the batch is visible
                self._settle(self._clock.now_ms(), items, outgoing, files, start, end, stored)
            budget -= len(items)

    def _claim(self, now: int) -> tuple[list[Item], _Outgoing, HourFiles] | None:
        """Up to ``dispatch_batch`` due entries of one second, with their write-back requests."""
        while True:
            items = self._claim_items(now)
            if not items:
                return None
            hour = items[0][0] // HOUR_MS
            files = self._dir.get(hour)
            assert files is not None and files.mapped, f"hour {hour} is due but not in the mapped window"
            cancelled = files.cancelled()
            live: list[Item] = []
            for item in items:
                gi = item[_GI]
                if gi in cancelled:
                    continue
                if (hour, gi) in self._skip:
                    self._skip.discard((hour, gi))
                    continue
                live.append(item)
            outgoing = _Outgoing()
            requests, deliver_at, dead_letter, global_index = (
                outgoing.requests, outgoing.deliver_at_ms, outgoing.dead, outgoing.global_index)
            limit = self._opts.dead_letter_older_than_ms
            started = self._start_ms
            for item, stored in zip(live, _records(files, live), strict=True):
                if stored is None:
                    self._counters["corrupt_skipped"] += 1
                    self._log.error("delay log record is corrupt; skipped", hour=hour, second=item[_SECOND],
                                    global_index=item[_GI])
                    self._account_delivered(hour)  # gone for good; a restart counts it done too
                    continue
                request, dead = stored.request, False
                if limit and stored.scheduled_at_ms < started and stored.deliver_at_ms < started - limit:
                    request, dead = self._dead_letter(request), True  # found this overdue at start-up
                requests.append(request)
                deliver_at.append(stored.deliver_at_ms)
                dead_letter.append(dead)
                global_index.append(item[_GI])
            if outgoing:
                return items, outgoing, files
            # Nothing to write back in what was claimed: the position just moves past it.
            self._pos = self._claimed = (items[-1][0], items[-1][1] + 1)
            self._close_intent()

    def _claim_items(self, now: int) -> list[Item]:
        """Up to ``dispatch_batch`` due entries of one second (opening the next due second when
        the open one is exhausted)."""
        while True:
            if self._open is not None and len(self._open):
                return self._open.take(now, self._opts.dispatch_batch)
            self._refill_window()
            if not self._due or self._due[0] * 1000 > now:
                return []
            second = heapq.heappop(self._due)
            self._due_set.discard(second)
            self._open_second(second)

    def _open_second(self, second: int) -> None:
        hour, in_hour = divmod(second, SECONDS_PER_HOUR)
        files = self._dir.get(hour)
        assert files is not None and files.mapped, f"hour {hour} is due but not in the mapped window"
        items = self._preloaded.pop(second, None)
        if items is None:
            items = self._items_of(files, in_hour)
        lost = files.head(in_hour)[1] - len(items)
        if lost > 0:  # index entries that failed their CRC: nothing left to deliver
            self._counters["corrupt_skipped"] += lost
            for _ in range(lost):
                self._account_delivered(hour)
        if items and items[0][:2] < self._pos:
            items = [i for i in items if i[:2] >= self._pos]
        self._open = _OpenSecond(second, items)

    def _items_of(self, files: HourFiles, second: int) -> list[Item]:
        """The entries of a second of ``files`` in key order (its chain; a broken chain is
        logged and the second rebuilt by scanning the index)."""
        try:
            columns = files.chain_columns(second)
            if columns is not None:
                return _items_of_columns(files.hour, second, columns)
            rows = files.chain_rows(second)
        except CorruptRecordError as exc:
            self._log.error("delay index chain is broken; rebuilding the second from the index",
                            hour=files.hour, second=second, error=str(exc))
            rows = [(e.ms, e.local_index, e.global_index, e.offset, e.size) for e in files.scan_second(second)]
        return _sorted_items(files.hour, second, rows)

    def _write_back(self, requests: list[AppendRequest]) -> list[bool] | None:
        """Deliver in order; None when all were stored, else which ones reached the store."""
        outcome = write_back(requests, self._deliver, self._deliver_batch, self._was_delivered)
        if outcome.error is not None:
            self._counters["deliver_errors"] += 1
            self._log.error("delayed message write-back failed; the wheel retries it",
                            messages=len(requests), retry_after_ms=self._opts.retry_after_error_ms,
                            exc_info=outcome.error)
        return outcome.stored

    def _settle(self, now: int, items: list[Item], outgoing: _Outgoing, files: HourFiles,
                start: Key, end: Key, stored: list[bool] | None) -> None:
        hour = files.hour
        deliver_at, dead_letter, global_index = outgoing.deliver_at_ms, outgoing.dead, outgoing.global_index
        if stored is not None:  # only what reached the store counts; it is skipped when the batch is retried
            kept = [i for i, ok in enumerate(stored) if ok]
            deliver_at = [deliver_at[i] for i in kept]
            dead_letter = [dead_letter[i] for i in kept]
            self._skip.update((hour, global_index[i]) for i in kept)
        done = len(deliver_at)
        self._hist.record_many([now - at for at in deliver_at])
        dead = sum(dead_letter)
        self._counters["dead_lettered"] += dead
        self._counters["delivered"] += done - dead
        started = self._start_ms
        self._counters["overdue_at_start"] += sum(at <= started for at in deliver_at)
        self._pending -= done
        self._remaining[hour] = self._remaining.get(hour, 0) - done
        self._counters["batches"] += 1
        if stored is None or all(stored):
            self._pos = self._claimed = end
            if self._skip:
                self._skip.difference_update((hour, i[_GI]) for i in items)
            # If this position is lost to a power cut the intent before it is found instead and
            # was_delivered settles it: only without that callback must it be on disk now.
            self._ckpt.write(end, may_skip_fsync=self._was_delivered is not None)
            self._unsettled = None
            return
        # The batch goes back into the millisecond level (minus what did reach the store); the
        # intent stays on disk, so a crash before the retry settles it the same way.
        self._claimed = start
        assert self._open is not None and self._open.second == items[0][0] // 1000
        for item in items:
            self._open.push(item)
        self._retry_at_ms = now + self._opts.retry_after_error_ms

    def _move_position_to(self, key_ms: int) -> None:
        """Nothing is due below ``key_ms`` any more: the position (and the hour window) move."""
        if self._claimed != self._pos or (key_ms, 0) <= self._pos:
            return
        self._pos = self._claimed = (key_ms, 0)
        self._close_intent()
        if self._open is not None and not len(self._open) and (self._open.second + 1) * 1000 <= key_ms:
            self._open = None
        self._refill_window()

    def _close_intent(self) -> None:
        """Once the position passed an intent left on disk (everything in it settled), record it."""
        if self._unsettled is not None and self._pos >= self._unsettled:
            self._ckpt.write(self._pos, may_skip_fsync=self._was_delivered is not None)
            self._unsettled = None

    def _account_delivered(self, hour: int) -> None:
        self._pending -= 1
        self._remaining[hour] = self._remaining.get(hour, 0) - 1

    def _dead_letter(self, request: AppendRequest) -> AppendRequest:
        props = dict(request.properties)
        props[Prop.REAL_TOPIC] = request.topic
        props[Prop.REAL_QUEUE_ID] = str(request.queue_id)
        return attrs.evolve(request, topic=self._opts.dead_letter_topic, queue_id=0, properties=props)

    def _preload(self, now_ms: int) -> None:
        """Walk and sort the index chains of the non-empty seconds of the next ``preload_seconds``."""
        if not self._due:
            return
        first = max(self._pos[0] // 1000, now_ms // 1000)
        for second in range(first, now_ms // 1000 + self._opts.preload_seconds + 1):
            if second not in self._due_set or second in self._preloaded:
                continue
            hour, in_hour = divmod(second, SECONDS_PER_HOUR)
            files = self._dir.get(hour)
            assert files is not None
            items = self._items_of(files, in_hour)
            self._preloaded[second] = items
            self._counters["index_entries_preloaded"] += len(items)

    # ================================================================== cancel / state

    def cancel(self, msg_id: str) -> bool:
        """True if the message is not due yet and will not be delivered (again True for a repeated
        cancel while it is still not due); False once it is being or has been delivered, moved by
        a reschedule, or for an id this wheel does not know. A malformed id raises ValidationError."""
        with self._lock:
            known = self._ids.decode(msg_id)
            if self._closed:
                raise DelayError("delay_wheel is closed; reopen the broker to cancel delayed messages")
            found = self._entry_of(known)
            if found is None:
                return False
            hour, files, entry = found
            if entry.global_index in files.moved():
                return False  # the message lives on under the id its reschedule returned
            if entry.global_index in files.cancelled():
                return True
            self._drop(hour, files, entry.global_index, moved=False)
            self._counters["cancelled"] += 1
            return True

    def reschedule(self, msg_id: str, deliver_at_ms: int) -> AppendResult | None:
        """Move a pending message to ``deliver_at_ms`` (see ReschedulableDelay): append it again
        at the new time, then cancel the old entry, under an intent file so a kill between the
        two neither loses nor doubles it. None when ``msg_id`` names no pending message."""
        with self._lock:
            known = self._ids.decode(msg_id)
            if self._closed:
                raise DelayError("delay_wheel is closed; reopen the broker to reschedule delayed messages")
            found = self._entry_of(known)
            if found is None or found[2].global_index in found[1].cancelled():
                return None
            old_hour, old_files, old = found
            now_ms = self._clock.now_ms()
            deliver_at_ms = self._within_max(deliver_at_ms, now_ms)
            request = _moved_request(old_files.record(old).request, deliver_at_ms)
            due = self._due_ms(deliver_at_ms, now_ms)
            target = self._dir.get(due // HOUR_MS, create=True)
            assert target is not None
            self._moves.write((old_hour, old.global_index, target.hour, target.count, deliver_at_ms, due, now_ms))
            hour, entry = self._append(request, deliver_at_ms, now_ms, None, due)
            self._pending += 1
            self._drop(old_hour, old_files, old.global_index, moved=True)
            self._moves.clear()
            self._counters["rescheduled"] += 1
            return self._result(hour, entry, now_ms)

    def _entry_of(self, known: tuple[int, int] | None) -> tuple[int, HourFiles, IndexEntry] | None:
        """The hour, files and index entry of a decoded id whose message is not claimed for
        delivery yet (it may be cancelled); None for an unknown, delivered or in-flight one."""
        if known is None:
            return None
        hour, gi = known
        files = self._dir.get(hour)
        if files is None or gi >= files.count:
            return None
        entry = files.entry(gi)
        key = ((hour * SECONDS_PER_HOUR + entry.second) * 1000 + entry.ms, entry.local_index)
        if key < self._claimed or (hour, gi) in self._skip:
            return None
        return hour, files, entry

    def _drop(self, hour: int, files: HourFiles, gi: int, *, moved: bool) -> None:
        files.add_cancel(gi, moved=moved)
        self._pending -= 1
        self._remaining[hour] -= 1

    def _settle_move(self) -> None:
        """A reschedule a crash interrupted (its intent file is there): finish it. The new entry
        is the one appended after the intent (appends are serialised), if it made it to disk;
        otherwise it is appended now. Then the old entry is marked moved. Runs before pending
        counts are taken and before anything is dispatched."""
        move = self._moves.read()
        if move is None:
            return
        old_hour, old_gi, hour, count_before, deliver_at_ms, due, scheduled_at_ms = move
        old_files = self._dir.get(old_hour)
        if old_files is None or old_gi >= old_files.count:
            self._log.error("an interrupted reschedule names a delay entry that is gone", hour=old_hour, gi=old_gi)
        elif old_gi not in old_files.cancelled():
            target = self._dir.get(hour, create=True)
            assert target is not None
            if target.count <= count_before:
                request = _moved_request(old_files.record(old_files.entry(old_gi)).request, deliver_at_ms)
                second, ms = divmod(due, 1000)
                target.append(encode_record(request, deliver_at_ms, scheduled_at_ms, None),
                              second % SECONDS_PER_HOUR, ms)
            old_files.add_cancel(old_gi, moved=True)
            self._log.info("interrupted reschedule finished", hour=old_hour, gi=old_gi, deliver_at_ms=deliver_at_ms)
        self._moves.clear()

    def clean_expired(self, now_ms: int) -> int:
        """Delete the files of hours that ended before ``now_ms`` and that the position has left
        (every entry in them delivered or cancelled); returns how many files went."""
        with self._lock:
            if self._closed:
                return 0
            tick_hour = self._pos[0] // HOUR_MS
            passed = [h for h in self._dir.hours_before(tick_hour) if (h + 1) * HOUR_MS <= now_ms]
            if not passed:
                return 0
            # The position that proves them done must be on disk before the files go. A batch in
            # flight (or unsettled since a crash) has its intent there, which starts at it.
            if (self._dispatching is None and self._in_doubt is None and self._unsettled is None
                    and self._ckpt.durable != self._pos):
                self._ckpt.write(self._pos, sync=True)
            self._ckpt.sync()
            removed = 0
            for hour in passed:
                left = self._remaining.pop(hour, 0)
                if left:
                    self._log.error("delay hour removed with undelivered entries", hour=hour, left=left)
                removed += self._dir.delete(hour)
                self._counters["hours_deleted"] += 1
            self._counters["files_deleted"] += removed
            return removed

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def mapped_hours(self) -> list[int]:
        """Hours whose files are mmap'ed now (the wheel's window; never more than two)."""
        with self._lock:
            return self._dir.mapped_hours()

    def hours_on_disk(self) -> list[int]:
        with self._lock:
            return list(self._dir.hours)

    def metrics(self) -> Mapping[str, float]:
        with self._lock:
            out: dict[str, float] = {k: float(v) for k, v in self._counters.items()}
            out.update(
                pending=float(self._pending), tick=float(self._pos[0] // 1000), position_ms=float(self._pos[0]),
                local=float(self._pos[1]), hours_on_disk=float(len(self._dir.hours)),
                mapped_hours=float(len(self._dir.mapped_hours())),
            )
            out.update(self._hist.figures())
            return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._dispatching is not None and self._dispatching is not threading.current_thread():
                self._idle.wait()  # the batch being written back is recorded first
            if self._in_doubt is None and self._unsettled is None:
                self._ckpt.write(self._pos, sync=True)
            self._dir.close()
            self._ckpt.close()
            self._preloaded.clear()
