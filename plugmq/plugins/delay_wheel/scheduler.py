"""The two-level wheel: 3600 one-second slots per hour over an hour wheel of hours with files.

Slot of a message = ceil(deliver time / 1 s) (never early, at most one tick late); a deliver
time at or before now goes to the next tick. The tick only moves forward: everything in a slot
below the tick is delivered or cancelled. The *window* is the first two hours (at or after the
tick's hour) that have files; only they are mapped, and their non-empty seconds are the delay
queue (``_due``, a heap of slot deadlines). One clock timer waits for the head of that queue, so
an idle wheel does not tick through empty seconds or hours.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Mapping
from pathlib import Path

import attrs

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    CorruptRecordError,
    DelayCapabilities,
    DelayContext,
    DelayError,
    DelayUnsupportedError,
    Prop,
    Timer,
)
from plugmq.core.logs import get_logger
from plugmq.plugins.delay_wheel.checkpoint import (
    CheckpointState,
    Phase,
    WheelCheckpoint,
)
from plugmq.plugins.delay_wheel.codec import (
    SECONDS_PER_HOUR,
    IndexEntry,
    StoredDelay,
    WheelMsgIds,
    encode_record,
)
from plugmq.plugins.delay_wheel.hourfiles import HourFiles
from plugmq.plugins.delay_wheel.hours import HourDirectory
from plugmq.plugins.delay_wheel.lateness import LatenessHistogram
from plugmq.plugins.delay_wheel.options import DelayWheelOptions

__all__ = ["WheelDelayScheduler", "capabilities_for"]

log = get_logger(__name__)

_WINDOW_HOURS = 2


def capabilities_for(options: DelayWheelOptions, *, no_duplicates: bool = True) -> DelayCapabilities:
    return DelayCapabilities(
        cancel=True, arbitrary_delay=True, levels_ms=None, max_delay_ms=options.max_delay_ms,
        clamps=options.clamp_over_max, resolution_ms=1000, no_duplicates_after_restart=no_duplicates,
    )


class WheelDelayScheduler:
    """seed 000's arbitrary-second delay over hourly delay logs (see the package docstring)."""

    def __init__(self, context: DelayContext, options: DelayWheelOptions) -> None:
        if context.deliver is None:
            raise DelayError("delay_wheel needs the broker's deliver callback in its DelayContext")
        self._opts = options
        self._clock = context.clock
        self._deliver = context.deliver
        self._was_delivered = context.was_delivered
        self._ids = WheelMsgIds(context.store_host)
        self.capabilities = capabilities_for(options, no_duplicates=context.was_delivered is not None)
        root = Path(context.plugin_dir("delay_wheel"))
        self._lock = threading.RLock()
        self._dir = HourDirectory(root / "hours", fsync=options.fsync, open_cache=options.open_hours_cache)
        self._ckpt = WheelCheckpoint(root / "wheel.ckpt", fsync=options.fsync)
        self._log = log.bind(dir=str(root))

        state = self._ckpt.state
        now_tick = self._clock.now_ms() // 1000 + 1
        if state is None:
            first = self._dir.hours[0] * SECONDS_PER_HOUR if self._dir.hours else now_tick
            state = CheckpointState(min(first, now_tick), 0)
        self._tick, self._local = state.tick, state.local
        self._in_doubt = state if state.phase != Phase.POSITION else None

        self._window: list[int] = []
        self._due: list[int] = []
        self._due_set: set[int] = set()
        self._preloaded: dict[int, list[IndexEntry]] = {}
        self._timer: Timer | None = None
        self._retry_at: float | None = None
        self._started = False
        self._starting = False
        self._closed = False

        self._hist = LatenessHistogram()
        self._counters = dict.fromkeys(
            ("scheduled", "delivered", "cancelled", "dead_lettered", "clamped", "overdue_at_start",
             "in_doubt_found_delivered", "in_doubt_redelivered", "deliver_errors", "corrupt_skipped", "timers_armed",
             "hours_mapped", "hours_unmapped", "hours_deleted", "index_entries_preloaded"), 0)

        self._remaining: dict[int, int] = {}
        self._retire_passed_hours()
        for hour in self._dir.hours:
            files = self._dir.get(hour)
            assert files is not None
            self._remaining[hour] = files.count - files.cancelled_count()
        self._discount_dispatched_of_tick_hour()
        self._pending = sum(self._remaining.values())
        self._refill_window()

    # ================================================================== recovery helpers

    def _discount_dispatched_of_tick_hour(self) -> None:
        hour, second = divmod(self._tick, SECONDS_PER_HOUR)
        files = self._dir.get(hour)
        if files is None:
            return
        before = files.count_before(second, self._local)
        cancelled_before = 0
        for gi in files.cancelled():
            entry = files.entry(gi)
            if (entry.second, entry.local_index) < (second, self._local):
                cancelled_before += 1
        self._remaining[hour] -= before - cancelled_before

    def _resolve_in_doubt(self) -> None:
        state = self._in_doubt
        self._in_doubt = None
        if state is None:
            return
        files = self._dir.get(state.hour)
        bound = self._log.bind(hour=state.hour, global_index=state.global_index)
        if files is None or state.global_index >= files.count:
            bound.warning("in-doubt delivery refers to a missing delay entry; nothing to settle")
            return
        stored = files.record(files.entry(state.global_index))
        request = self._dead_letter(stored.request) if state.phase == Phase.INTENT_DEAD_LETTER else stored.request
        delivered = bool(self._was_delivered(request)) if self._was_delivered is not None else False
        if delivered:
            self._local = state.local + 1
            self._account_delivered(state.hour)
            self._counters["in_doubt_found_delivered"] += 1
        else:
            self._counters["in_doubt_redelivered"] += 1
        bound.info("in-doubt delivery settled", already_delivered=delivered)
        self._ckpt.write(self._tick, self._local, sync=True)

    # ================================================================== window (mapped hours)

    def _retire_passed_hours(self) -> None:
        """Delete hours the tick has left: every entry in them is delivered or cancelled."""
        tick_hour = self._tick // SECONDS_PER_HOUR
        passed = self._dir.hours_before(tick_hour)
        if not passed:
            return
        # The tick that proves them done must be durable before the files go (an unsettled
        # in-doubt checkpoint already holds this tick and must not be overwritten).
        durable = self._ckpt.durable_tick
        if durable is None or durable < self._tick:
            self._ckpt.write(self._tick, self._local, sync=True)
        for hour in passed:
            left = self._remaining.pop(hour, 0)
            if left:
                self._log.error("delay hour retired with undelivered entries", hour=hour, left=left)
            self._preloaded = {s: e for s, e in self._preloaded.items() if s // SECONDS_PER_HOUR != hour}
            self._dir.delete(hour)
            self._counters["hours_deleted"] += 1
            if hour in self._window:
                self._window.remove(hour)

    def _refill_window(self) -> None:
        wanted = self._dir.first_hours(self._tick // SECONDS_PER_HOUR, _WINDOW_HOURS)
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
        due = set()
        for hour in self._window:
            files = self._dir.get(hour)
            assert files is not None
            base = hour * SECONDS_PER_HOUR
            due.update(base + s for s in files.nonempty_seconds() if base + s >= self._tick)
        self._due_set = due
        self._due = sorted(due)

    def _advance_hours(self) -> None:
        if self._dir.hours and self._dir.hours[0] < self._tick // SECONDS_PER_HOUR:
            self._retire_passed_hours()
        self._refill_window()

    # ================================================================== schedule

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        with self._lock:
            if self._closed:
                raise DelayError("delay_wheel is closed; reopen the broker to schedule delayed messages")
            now_ms = self._clock.now_ms()
            if deliver_at_ms - now_ms > self._opts.max_delay_ms:
                if not self._opts.clamp_over_max:
                    raise DelayUnsupportedError(
                        f"delay of {deliver_at_ms - now_ms} ms is above delay_wheel's maximum of "
                        f"{self._opts.max_delay_ms} ms; raise [plugins.delay_wheel] max_delay_ms or set "
                        f"clamp_over_max = true to deliver such messages at the maximum"
                    )
                deliver_at_ms = now_ms + self._opts.max_delay_ms
                self._counters["clamped"] += 1
            slot = -(-deliver_at_ms // 1000) if deliver_at_ms > now_ms else now_ms // 1000 + 1
            slot = max(slot, self._tick)
            hour, second = divmod(slot, SECONDS_PER_HOUR)
            record = encode_record(request, deliver_at_ms, now_ms, delay_level)
            files = self._dir.get(hour, create=True)
            assert files is not None
            entry = files.append(record, second)
            self._remaining[hour] = self._remaining.get(hour, 0) + 1
            self._pending += 1
            self._counters["scheduled"] += 1
            self._place(slot, hour, entry)
            return AppendResult(
                status=AppendStatus.PUT_OK, msg_id=self._ids.encode(hour, entry.global_index),
                queue_offset=entry.global_index, commit_log_offset=entry.offset, size=entry.size,
                store_timestamp_ms=now_ms,
            )

    def _place(self, slot: int, hour: int, entry: IndexEntry) -> None:
        if hour in self._window:
            preloaded = self._preloaded.get(slot)
            if preloaded is not None:
                preloaded.append(entry)
            if slot not in self._due_set:
                self._due_set.add(slot)
                heapq.heappush(self._due, slot)
                if self._due[0] == slot:
                    self._arm()
        elif len(self._window) < _WINDOW_HOURS or hour < self._window[-1]:
            self._refill_window()
            self._arm()

    # ================================================================== dispatch

    def start(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._starting = True
            try:
                self._resolve_in_doubt()
                before = self._counters["delivered"] + self._counters["dead_lettered"]
                self._run_due(self._clock.now_ms() // 1000)
                overdue = self._counters["delivered"] + self._counters["dead_lettered"] - before
                self._counters["overdue_at_start"] += overdue
                if overdue:
                    self._log.info("overdue delayed messages delivered at start", count=overdue,
                                   late_ms_max=self._hist.max_ms)
            finally:
                self._starting = False
            self._preload()
            self._arm()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed or not self._started:
                return
            if self._retry_at is not None and self._clock.now() >= self._retry_at:
                self._retry_at = None
            self._run_due(self._clock.now_ms() // 1000)
            self._preload()
            self._arm()

    def _arm(self) -> None:
        if not self._started or self._closed:
            return
        deadline: float | None = float(self._due[0]) if self._due else None
        tick_hour = self._tick // SECONDS_PER_HOUR
        if tick_hour in self._dir:
            # The hour wheel's own step: once the tick's hour ends its files can go, even if
            # nothing else is due for a long time.
            end_of_hour = float((tick_hour + 1) * SECONDS_PER_HOUR)
            deadline = end_of_hour if deadline is None else min(deadline, end_of_hour)
        if self._retry_at is not None:  # after a failed write-back nothing moves before the retry
            deadline = self._retry_at
        timer = self._timer
        if timer is not None and not timer.cancelled and not timer.fired and timer.deadline == deadline:
            return
        if timer is not None:
            timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self._clock.call_at(deadline, self._on_timer)
            self._counters["timers_armed"] += 1

    def _run_due(self, target: int) -> None:
        """Deliver every slot <= ``target`` (whole seconds), oldest first."""
        if self._retry_at is not None:
            return
        while True:
            self._advance_hours()
            if not self._due or self._due[0] > target:
                break
            slot = heapq.heappop(self._due)
            self._due_set.discard(slot)
            if slot < self._tick:
                continue
            if slot > self._tick:
                self._tick, self._local = slot, 0
            if not self._dispatch_second(slot):
                self._due_set.add(slot)
                heapq.heappush(self._due, slot)
                self._retry_at = self._clock.now() + self._opts.retry_after_error_ms / 1000
                self._ckpt.write(self._tick, self._local)
                return
            self._tick, self._local = slot + 1, 0
        if target + 1 > self._tick:
            self._tick, self._local = target + 1, 0
            self._advance_hours()
        self._ckpt.write(self._tick, self._local)

    def _dispatch_second(self, slot: int) -> bool:
        hour, second = divmod(slot, SECONDS_PER_HOUR)
        files = self._dir.get(hour)
        assert files is not None and files.mapped, f"hour {hour} is due but not in the mapped window"
        entries = self._preloaded.pop(slot, None)
        if entries is None:
            entries = self._entries_of(files, second)
        cancelled = files.cancelled()
        for entry in entries:
            if entry.local_index < self._local:
                continue
            self._skip_lost(hour, entry.local_index)
            if entry.global_index not in cancelled:
                try:
                    stored = files.record(entry)
                except CorruptRecordError:
                    self._counters["corrupt_skipped"] += 1
                    self._log.error("delay log record is corrupt; skipped", hour=hour, second=second,
                                    global_index=entry.global_index)
                    stored = None
                    self._account_delivered(hour)  # gone for good; a restart counts it done too
                if stored is not None and not self._deliver_one(slot, files, entry, stored):
                    self._preloaded[slot] = entries
                    return False
            self._local = entry.local_index + 1
        self._skip_lost(hour, files.head(second)[1])
        return True

    def _skip_lost(self, hour: int, upto: int) -> None:
        """Step over localIndexes whose index entries failed their CRC: nothing left to deliver."""
        if upto > self._local:
            self._counters["corrupt_skipped"] += upto - self._local
            for _ in range(upto - self._local):
                self._account_delivered(hour)
            self._local = upto

    def _entries_of(self, files: HourFiles, second: int) -> list[IndexEntry]:
        try:
            return files.chain(second)
        except CorruptRecordError as exc:
            self._log.error("delay index chain is broken; rebuilding the second from the index",
                            hour=files.hour, second=second, error=str(exc))
            return files.scan_second(second)

    def _deliver_one(self, slot: int, files: HourFiles, entry: IndexEntry, stored: StoredDelay) -> bool:
        now_ms = self._clock.now_ms()
        late_ms = now_ms - stored.deliver_at_ms
        if late_ms < 0:  # only a clock that jumped backwards could get here; waiting is the safe side
            raise DelayError(f"delay_wheel would deliver {late_ms} ms early at slot {slot}; clock went backwards?")
        limit = self._opts.dead_letter_older_than_ms
        to_dlq = self._starting and limit > 0 and late_ms > limit
        request = self._dead_letter(stored.request) if to_dlq else stored.request
        phase = Phase.INTENT_DEAD_LETTER if to_dlq else Phase.INTENT
        self._ckpt.write(slot, self._local, phase, files.hour, entry.global_index)
        try:
            self._deliver(request)
        except Exception:  # noqa: BLE001 - whatever the store raised, the message stays and is retried
            self._counters["deliver_errors"] += 1
            self._log.exception("delayed message write-back failed; the wheel retries it",
                                topic=request.topic, slot=slot, retry_after_ms=self._opts.retry_after_error_ms)
            return False
        # If this "done" is lost to a power cut the intent before it is found instead, and
        # was_delivered settles it: only without that callback must it be on disk now.
        self._ckpt.write(slot, self._local + 1, may_skip_fsync=self._was_delivered is not None)
        self._hist.record(late_ms)
        self._counters["dead_lettered" if to_dlq else "delivered"] += 1
        self._account_delivered(files.hour)
        return True

    def _account_delivered(self, hour: int) -> None:
        self._pending -= 1
        self._remaining[hour] = self._remaining.get(hour, 0) - 1

    def _dead_letter(self, request: AppendRequest) -> AppendRequest:
        props = dict(request.properties)
        props[Prop.REAL_TOPIC] = request.topic
        props[Prop.REAL_QUEUE_ID] = str(request.queue_id)
        return attrs.evolve(request, topic=self._opts.dead_letter_topic, queue_id=0, properties=props)

    def _preload(self) -> None:
        """Walk the index chains of the non-empty seconds of the next ``preload_seconds`` ahead."""
        horizon = self._clock.now_ms() // 1000 + self._opts.preload_seconds
        for slot in range(max(self._tick, horizon - self._opts.preload_seconds), horizon + 1):
            if slot not in self._due_set or slot in self._preloaded:
                continue
            files = self._dir.get(slot // SECONDS_PER_HOUR)
            assert files is not None
            entries = self._entries_of(files, slot % SECONDS_PER_HOUR)
            self._preloaded[slot] = entries
            self._counters["index_entries_preloaded"] += len(entries)

    # ================================================================== cancel / state

    def cancel(self, msg_id: str) -> bool:
        """True if the message is not due yet and will not be delivered (again True for a repeated
        cancel while it is still not due); False once its second has been dispatched, or for an id
        this wheel does not know. A malformed id raises ValidationError."""
        with self._lock:
            known = self._ids.decode(msg_id)
            if known is None or self._closed:
                return False
            hour, gi = known
            files = self._dir.get(hour)
            if files is None or gi >= files.count:
                return False
            entry = files.entry(gi)
            slot = hour * SECONDS_PER_HOUR + entry.second
            if (slot, entry.local_index) < (self._tick, self._local):
                return False
            if gi in files.cancelled():
                return True
            files.add_cancel(gi)
            self._pending -= 1
            self._remaining[hour] -= 1
            self._counters["cancelled"] += 1
            return True

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
                pending=float(self._pending), tick=float(self._tick), local=float(self._local),
                hours_on_disk=float(len(self._dir.hours)), mapped_hours=float(len(self._dir.mapped_hours())),
                late_ms_max=float(self._hist.max_ms), late_ms_p50=float(self._hist.quantile(0.5)),
                late_ms_p99=float(self._hist.quantile(0.99)),
            )
            return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._in_doubt is None:
                self._ckpt.write(self._tick, self._local, sync=True)
            self._dir.close()
            self._ckpt.close()
            self._preloaded.clear()
