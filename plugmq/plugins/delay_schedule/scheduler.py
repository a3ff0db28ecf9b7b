"""QMQ's delay server as a DelayScheduler: message log -> schedule log -> hashed wheel -> deliver.

Flow (seed 001): ``schedule()`` appends to the message log and kicks the iterator (a clock
timer due now, so bursts are moved in batches off the producer's path). The iterator appends
each record to its bucket's schedule segment; a segment whose bucket starts within
``load_ahead_ms`` is *loaded*: its unsettled records' index goes into the hashed wheel, and
records that arrive for a loaded segment go straight in. One clock timer waits for the earliest
non-empty wheel tick (1 ms ticks by default: the deliver time itself), another for the next
segment to load; nothing spins while idle.

A due batch (up to ``dispatch_batch``) is delivered as: intents to the dispatch logs (fsynced
with ``fsync``), one read per run of neighbouring records, one ``context.deliver_batch`` of the
requests with their delay properties removed — *outside* the scheduler's lock, so the iterator,
cancels and producers never wait behind a burst — then delivered marks. Recovery asks
``context.was_delivered`` about intents without a mark. A timer callback yields after
``_YIELD_AFTER`` messages (re-armed for "now"), so a huge backlog never holds the clock's thread,
and ``start()`` only arms timers: an overdue backlog at start-up is loaded and delivered in the
background. ``clean_expired`` deletes a segment once its bucket is past and its dispatch log
covers all its messages, and a message-log segment once every bucket it fed is gone.

Message ids: ``encode_msg_id(store_host, message-log offset)``; ``AppendResult.queue_offset`` is
the delay sequence and ``commit_log_offset`` the message-log offset. ``cancel`` reads the
record at that offset (the record stores its own offset, so a wrong id cannot alias another).
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Mapping

import attrs

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    DelayCapabilities,
    DelayContext,
    DelayUnsupportedError,
    Prop,
    ValidationError,
    encode_msg_id,
)
from plugmq.core.clock import Clock, Timer
from plugmq.core.errors import DelayError, PluginError
from plugmq.core.logs import get_logger
from plugmq.core.message import decode_msg_id
from plugmq.kit.intent import IntentFile
from plugmq.kit.lateness import LatenessHistogram
from plugmq.kit.writeback import write_back
from plugmq.plugins.delay_schedule.dispatch_log import CANCELLED, DELIVERED, INTENT, MOVED
from plugmq.plugins.delay_schedule.iterator import CheckpointStore, LogIterator
from plugmq.plugins.delay_schedule.message_log import MessageLog
from plugmq.plugins.delay_schedule.options import DelayScheduleOptions
from plugmq.plugins.delay_schedule.records import MessageLogRecord, decode_request, encode_request
from plugmq.plugins.delay_schedule.schedule_log import ScheduleLog, Segment
from plugmq.plugins.delay_schedule.wheel import HashedWheel, WheelEntry

__all__ = ["PLUGIN_NAME", "ScheduleDelayScheduler", "capabilities_for"]

log = get_logger(__name__)

PLUGIN_NAME = "delay_schedule"
_DELAY_PROPS = (Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS)
_YIELD_AFTER = 20_000  # messages per timer callback before other timers get the clock's thread
_LOADS_PER_CALL = 4  # segments loaded per load-timer callback


def capabilities_for(options: DelayScheduleOptions) -> DelayCapabilities:
    return DelayCapabilities(
        cancel=True,
        arbitrary_delay=True,
        max_delay_ms=options.max_delay_ms,
        clamps=options.clamp_to_max_delay,
        resolution_ms=options.tick_ms,
        no_duplicates_after_restart=True,
    )


def _retimed(clock: Clock, timer: Timer | None, timer_ms: int, at: int | None,
             callback: Callable[[], None]) -> tuple[Timer | None, int]:
    """The timer that fires at ``at`` ms (None: no timer) and its time: the running one when it
    already fires then, else a new one (the running one cancelled)."""
    if timer is not None and at is not None and timer_ms == at:
        return timer, timer_ms
    if timer is not None:
        timer.cancel()
    if at is None:
        return None, timer_ms
    return clock.call_at(_seconds(at), callback), at


def _seconds(ms: int) -> float:
    """A clock deadline whose ``now_ms()`` is not below ``ms`` (float rounding would make a
    timer look a millisecond early)."""
    seconds = ms / 1000
    while int(seconds * 1000) < ms:
        seconds = math.nextafter(seconds, math.inf)
    return seconds


def _due_request(payload: bytes | None) -> AppendRequest:
    """The stored request as it is written back: delay properties removed."""
    return decode_request(payload or b"", drop=_DELAY_PROPS)


def _moved_payload(old: MessageLogRecord, deliver_at_ms: int) -> bytes:
    """The stored request of ``old`` as a reschedule files it again: an arbitrary deliver time."""
    request = decode_request(old.payload, drop=_DELAY_PROPS)
    return encode_request(attrs.evolve(request, properties={**request.properties,
                                                            Prop.DELIVER_AT_MS: str(deliver_at_ms)}))


@attrs.define
class _Metrics:
    scheduled: int = 0
    delivered: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    dead_lettered: int = 0
    overdue_at_start: int = 0
    start_late_ms_max: int = 0
    deliver_failures: int = 0
    corrupt_skipped: int = 0
    in_doubt_found_delivered: int = 0
    in_doubt_redelivered: int = 0
    batches: int = 0
    segments_loaded: int = 0
    segments_retired: int = 0
    message_log_segments_deleted: int = 0
    files_deleted: int = 0


class ScheduleDelayScheduler:
    """See the module docstring. Thread-safe; timer callbacks and API calls share one lock, which
    is never held while the broker's write-back runs."""

    def __init__(self, context: DelayContext, options: DelayScheduleOptions) -> None:
        if context.deliver is None:
            raise PluginError(
                "delay_schedule needs DelayContext.deliver (the broker's write-back) to deliver due messages"
            )
        self._ctx = context
        self._opt = options
        self._clock = context.clock
        self._deliver = context.deliver
        self._deliver_batch = context.deliver_batch
        self._was_delivered = context.was_delivered
        self.capabilities = capabilities_for(options)
        # encode_msg_id parses the host on every call; the host part never changes.
        self._msg_id_prefix = encode_msg_id(context.store_host, 0)[:16]
        root = context.plugin_dir(PLUGIN_NAME)
        self._log = log.bind(plugin=PLUGIN_NAME, broker=context.broker_name, dir=str(root))
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._kick_lock = threading.Lock()
        self._kick_pending = False
        self._ml = MessageLog(root / "message_log", segment_bytes=options.message_log_segment_bytes, fsync=options.fsync)
        self._schedule = ScheduleLog(
            root / "schedule_log", bucket_ms=options.bucket_ms, fsync=options.fsync, open_files=options.open_files_limit
        )
        self._iterator = LogIterator(
            self._ml,
            self._schedule,
            CheckpointStore(root / "checkpoint.json", fsync=options.fsync),
            clock=self._clock,
            on_appended=self._on_appended,
        )
        self._wheel = HashedWheel(tick_ms=options.tick_ms, slots=options.wheel_slots)
        self._ready: deque[WheelEntry] = deque()  # taken from the wheel in order, not yet written back
        self._unloaded: list[int] = []  # heap of segment starts waiting to be loaded
        self._wheel_timer: Timer | None = None
        self._wheel_timer_ms = 0
        self._load_timer: Timer | None = None
        self._load_timer_ms = 0
        self._paused_until_ms = 0  # after a failed write-back
        self._metrics = _Metrics()
        self._lateness = LatenessHistogram()
        self._started = False
        self._start_ms = 0
        self._start_seq = 0  # sequences below were scheduled before this start
        self._closed = False
        self._dispatching: threading.Thread | None = None
        self._moves = IntentFile(root / "reschedule.intent", 4, fsync=options.fsync)
        try:
            with self._lock:
                self._schedule.open()
                self._iterator.recover()
                self._iterator.run_all()
                self._settle_move()
        except BaseException:
            self._schedule.close()
            self._ml.close()
            raise
        self._log.info("delay_schedule recovered", pending=self.pending(), segments=len(self._schedule.segments))

    # ================================================================ API

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        if self._closed:
            raise DelayError("delay_schedule is closed; reopen the broker to schedule messages")
        now = self._clock.now_ms()
        deliver_at_ms = self._within_max(deliver_at_ms, now)
        record = self._ml.append(
            deliver_at_ms=deliver_at_ms,
            delay_level=delay_level or 0,
            store_ts_ms=now,
            payload=encode_request(request),
        )
        self._kick(accepted=1)
        return self._result(record, now)

    def _within_max(self, deliver_at_ms: int, now: int) -> int:
        """The deliver time, clamped to the maximum delay where allowed; DelayUnsupportedError if not."""
        if not isinstance(deliver_at_ms, int) or isinstance(deliver_at_ms, bool) or deliver_at_ms < 0:
            raise ValidationError(f"deliver_at_ms must be a non-negative int (epoch ms), got {deliver_at_ms!r}")
        if deliver_at_ms - now <= self._opt.max_delay_ms:
            return deliver_at_ms
        if not self._opt.clamp_to_max_delay:
            raise DelayUnsupportedError(
                f"delay of {deliver_at_ms - now} ms is above delay_schedule's max_delay_ms "
                f"({self._opt.max_delay_ms}); raise plugins.delay_schedule.max_delay_ms or set "
                f"clamp_to_max_delay = true"
            )
        return now + self._opt.max_delay_ms

    def _result(self, record: MessageLogRecord, now: int) -> AppendResult:
        return AppendResult(
            status=AppendStatus.PUT_OK,
            msg_id=f"{self._msg_id_prefix}{record.offset:016X}",
            queue_offset=record.seq,
            commit_log_offset=record.offset,
            size=record.size,
            store_timestamp_ms=now,
        )

    def start(self) -> None:
        """Arm the timers. Segments that came due while the broker was down are loaded, and their
        messages delivered oldest first, by those timers in the background."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._iterator.run_all()
            self._start_ms = self._clock.now_ms()
            self._start_seq = self._iterator.next_seq
            self._unloaded = list(self._schedule.segments)
            heapq.heapify(self._unloaded)
            self._arm()
            self._log.info("delay_schedule started", segments_to_load=len(self._unloaded))

    def cancel(self, msg_id: str) -> bool:
        """True if the message will not be delivered (again True for a repeated cancel); False
        once it is being or has been delivered, moved by a reschedule, or for an id of another
        broker or no message. Something that is not a message id raises ValidationError."""
        with self._lock:
            found = self._pending_record(msg_id, "cancel")
            if found is None:
                return False
            record, segment = found
            if record.seq in segment.dispatch.moved:
                return False  # the message lives on under the id its reschedule returned
            if record.seq in segment.dispatch.cancelled:
                return True
            self._schedule.mark(segment, CANCELLED, [record.seq], sync=True)
            self._metrics.cancelled += 1
            return True

    def reschedule(self, msg_id: str, deliver_at_ms: int) -> AppendResult | None:
        """Move a pending message to ``deliver_at_ms`` (see ReschedulableDelay): append it to the
        message log again with the new time, then mark the old record moved, under an intent file
        so a kill between the two neither loses nor doubles it. None when ``msg_id`` names no
        pending message."""
        with self._lock:
            found = self._pending_record(msg_id, "reschedule")
            if found is None or found[0].seq in found[1].dispatch.cancelled:
                return None
            old, segment = found
            now = self._clock.now_ms()
            deliver_at_ms = self._within_max(deliver_at_ms, now)
            self._moves.write((old.offset, self._ml.end, deliver_at_ms, now))
            record = self._append_moved(old, deliver_at_ms, now)
            self._schedule.mark(segment, MOVED, [old.seq], sync=True)
            self._moves.clear()
            self._metrics.rescheduled += 1
        self._kick(accepted=1)
        return self._result(record, now)

    def _pending_record(self, msg_id: str, action: str) -> tuple[MessageLogRecord, Segment] | None:
        """The record of ``msg_id`` and its segment while it is not delivered or being delivered
        (it may be cancelled); None otherwise. Called under the lock."""
        host, offset = decode_msg_id(msg_id)
        if self._closed:
            raise DelayError(f"delay_schedule is closed; reopen the broker to {action} messages")
        if host != self._ctx.store_host:
            return None
        if offset >= self._iterator.offset:
            self._iterator.run_all()
            self._arm()
        record = self._ml.read_at(offset)
        if record is None:
            return None
        segment = self._schedule.segments.get(self._schedule.bucket_of(record.deliver_at_ms))
        if segment is None or not segment.holds_source(offset):
            return None  # its segment was retired: delivered or cancelled long ago
        dispatch = segment.dispatch
        if record.seq in dispatch.delivered or record.seq in dispatch.intents:
            return None  # delivered, or being delivered
        return record, segment

    def _append_moved(self, old: MessageLogRecord, deliver_at_ms: int, now: int) -> MessageLogRecord:
        return self._ml.append(deliver_at_ms=deliver_at_ms, delay_level=0, store_ts_ms=now,
                               payload=_moved_payload(old, deliver_at_ms))

    def _moved_copy_exists(self, old: MessageLogRecord, start: int, deliver_at_ms: int, scheduled_at: int) -> bool:
        """Whether the message log holds, at or after ``start``, the copy a reschedule of ``old``
        appended. Producers append without the scheduler's lock, so it need not be at ``start``:
        the records from there on are compared with the copy (same time, same bytes)."""
        payload = _moved_payload(old, deliver_at_ms)
        offset = start
        while offset < self._ml.end:
            records, offset = self._ml.read(offset, 256)
            if not records:
                break
            if any(r.deliver_at_ms == deliver_at_ms and r.store_ts_ms == scheduled_at and r.payload == payload
                   for r in records):
                return True
        return False

    def _settle_move(self) -> None:
        """A reschedule a crash interrupted (its intent file is there): finish it. The new record
        is after the message-log end the intent noted, if it made it to disk; otherwise it is
        appended now. Then the old record is marked moved. Runs
        after the iterator's recovery, before anything is dispatched."""
        move = self._moves.read()
        if move is None:
            return
        old_offset, new_offset, deliver_at_ms, scheduled_at = move
        old = self._ml.read_at(old_offset)
        segment = None if old is None else self._schedule.segments.get(self._schedule.bucket_of(old.deliver_at_ms))
        if old is None or segment is None or not segment.holds_source(old_offset):
            self._log.error("an interrupted reschedule names a message-log record that is gone", offset=old_offset)
        elif not segment.dispatch.is_settled(old.seq):
            if not self._moved_copy_exists(old, new_offset, deliver_at_ms, scheduled_at):
                self._append_moved(old, deliver_at_ms, scheduled_at)
                self._iterator.run_all()
            self._schedule.mark(segment, MOVED, [old.seq], sync=True)
            self._log.info("interrupted reschedule finished", offset=old_offset, deliver_at_ms=deliver_at_ms)
        self._moves.clear()

    def pending(self) -> int:
        with self._lock:
            return self._iterator.lag + sum(seg.unsettled for seg in self._schedule.segments.values())

    def metrics(self) -> Mapping[str, float]:
        with self._lock:
            m = attrs.asdict(self._metrics)
            m.update(self._lateness.figures())
            m["pending"] = self._iterator.lag + sum(seg.unsettled for seg in self._schedule.segments.values())
            m["wheel_entries"] = len(self._wheel) + len(self._ready)
            m["schedule_segments"] = len(self._schedule.segments)
            m["message_log_segments"] = len(self._ml.segments())
            m["iterator_lag"] = self._iterator.lag
            return {k: float(v) for k, v in m.items()}

    def clean_expired(self, now_ms: int) -> int:
        """Delete the segments (with their dispatch logs) whose bucket ended before ``now_ms`` and
        whose dispatch log covers every message, then the message-log segments all of whose
        buckets are gone (QMQ deletes both by age, dispatched or not). Returns the files removed."""
        with self._lock:
            if self._closed:
                return 0
            removed = 0
            for start, segment in list(self._schedule.segments.items()):
                if segment.unsettled > 0 or start + self._schedule.bucket_ms > now_ms:
                    continue
                if segment.last_source >= self._iterator.persisted_offset:
                    continue  # a replay could still re-add its records: wait for the checkpoint
                removed += self._schedule.delete(start)
                self._metrics.segments_retired += 1
            if removed:
                removed += self._clean_message_log()
            self._metrics.files_deleted += removed
            return removed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for timer in (self._wheel_timer, self._load_timer):
                if timer is not None:
                    timer.cancel()
            self._wheel_timer = self._load_timer = None
            while self._dispatching is not None and self._dispatching is not threading.current_thread():
                self._idle.wait()  # the batch being written back is recorded first
            try:
                self._iterator.run_all()  # so a restart has nothing to replay
            finally:
                self._schedule.close()
                self._ml.close()
            self._log.info("delay_schedule closed", pending=self.pending())

    # ================================================================ iterator

    def _kick(self, accepted: int = 0) -> None:
        with self._kick_lock:
            self._metrics.scheduled += accepted
            if self._kick_pending:
                return
            self._kick_pending = True
        self._clock.call_at(self._clock.now(), self._on_kick)

    def _on_kick(self) -> None:
        with self._kick_lock:
            self._kick_pending = False
        with self._lock:
            if self._closed:
                return
            moved = self._iterator.run(self._opt.iterate_batch)
            if moved:
                self._arm()
            more = self._iterator.lag > 0
        if more:
            self._kick()

    def _on_appended(self, segment: Segment, position: int, size: int, record: MessageLogRecord, created: bool) -> None:
        if not self._started or self._closed:
            return
        if segment.loaded:
            self._wheel.add(WheelEntry(record.deliver_at_ms, record.seq, segment, position, size))
        elif segment.start <= self._clock.now_ms() + self._opt.load_ahead_ms:
            self._load(segment)
        elif created:
            heapq.heappush(self._unloaded, segment.start)

    # ================================================================ loading

    def _load_due(self, now: int) -> None:
        horizon = now + self._opt.load_ahead_ms
        loaded = 0
        while self._unloaded and self._unloaded[0] <= horizon and loaded < _LOADS_PER_CALL:
            segment = self._schedule.segments.get(heapq.heappop(self._unloaded))
            if segment is not None and not segment.loaded:
                self._load(segment)
                loaded += 1

    def _load(self, segment: Segment) -> None:
        """Put the segment's unsettled messages into the wheel, settling in-doubt ones first."""
        in_doubt = segment.dispatch.in_doubt()
        found_delivered: list[int] = []
        index = self._schedule.index(segment)
        settled = segment.dispatch.is_settled
        add = self._wheel.add_fields
        for position, size, seq, when in zip(index.positions, index.sizes, index.seqs, index.times, strict=True):
            if settled(seq):
                continue
            if seq in in_doubt:
                if self._reached_topic(segment, position, size):
                    found_delivered.append(seq)
                    continue
                self._metrics.in_doubt_redelivered += 1
            add(when, seq, segment, position, size)
        if found_delivered:
            self._schedule.mark(segment, DELIVERED, found_delivered, sync=True)
            self._metrics.in_doubt_found_delivered += len(found_delivered)
            self._metrics.delivered += len(found_delivered)
        segment.loaded = True
        self._metrics.segments_loaded += 1

    def _reached_topic(self, segment: Segment, position: int, size: int) -> bool:
        if self._was_delivered is None:
            return False  # nothing to ask: deliver again (at least once)
        request = _due_request(self._schedule.read(segment, position, size).payload)
        if self._was_delivered(request):
            return True
        return bool(self._opt.dead_letter_older_than_ms) and self._was_delivered(self._to_dead_letter(request))

    # ================================================================ timers

    def _arm(self) -> None:
        """Set the wheel timer (the next due tick) and the load timer (the next segment to load)."""
        if self._closed or not self._started:
            return
        if self._dispatching is None:  # a dispatch in progress re-arms when it ends
            self._arm_wheel(self._wheel_wake())
        self._arm_load()

    def _wheel_wake(self) -> int | None:
        """When the wheel timer should fire (ms): now with messages ready, else the next tick
        holding one, not before a pause ends; None with nothing scheduled."""
        if self._ready:
            wake: int | None = self._clock.now_ms()
        else:
            tick = self._wheel.next_tick()
            wake = None if tick is None else tick * self._opt.tick_ms
        if wake is not None and self._paused_until_ms:
            wake = max(wake, self._paused_until_ms)
        return wake

    def _arm_wheel(self, wake: int | None) -> None:
        self._wheel_timer, self._wheel_timer_ms = _retimed(self._clock, self._wheel_timer, self._wheel_timer_ms,
                                                           wake, self._on_wheel_timer)

    def _arm_load(self) -> None:
        segments = self._schedule.segments
        while self._unloaded and (self._unloaded[0] not in segments or segments[self._unloaded[0]].loaded):
            heapq.heappop(self._unloaded)
        load_at = self._unloaded[0] - self._opt.load_ahead_ms if self._unloaded else None
        self._load_timer, self._load_timer_ms = _retimed(self._clock, self._load_timer, self._load_timer_ms,
                                                         load_at, self._on_load_timer)

    def _on_wheel_timer(self) -> None:
        with self._lock:
            self._wheel_timer = None
            if self._closed or self._dispatching is not None:
                return
            self._dispatching = threading.current_thread()
        try:
            self._dispatch_due()
        finally:
            with self._lock:
                self._dispatching = None
                self._idle.notify_all()
                self._arm()

    def _on_load_timer(self) -> None:
        with self._lock:
            self._load_timer = None
            if self._closed:
                return
            self._load_due(self._clock.now_ms())
            self._arm()

    # ================================================================ delivery

    def _dispatch_due(self) -> None:
        """Deliver what is due, a batch at a time, at most ``_YIELD_AFTER`` messages per call."""
        budget = _YIELD_AFTER
        while budget > 0:
            with self._lock:
                if self._closed:
                    return
                now = self._clock.now_ms()
                if self._paused_until_ms:
                    if now < self._paused_until_ms:
                        return
                    self._paused_until_ms = 0
                batch = self._claim(now)
                if not batch:
                    return
                by_segment: dict[Segment, list[int]] = defaultdict(list)
                for entry in batch:
                    by_segment[entry.segment].append(entry.seq)
                for segment, seqs in by_segment.items():
                    self._schedule.mark(segment, INTENT, seqs, sync=False)
                self._schedule.sync_dispatch({segment.start for segment in by_segment})
                read = self._schedule.read_requests([(e.segment, e.position, e.size) for e in batch],
                                                    drop=_DELAY_PROPS)
                if None in read:
                    batch, read = self._drop_unreadable(batch, read)
                    if not batch:
                        continue
                requests = [r for r in read if r is not None]
                limit = self._opt.dead_letter_older_than_ms
                dead = [bool(limit) and e.seq < self._start_seq and e.deliver_at_ms < self._start_ms - limit
                        for e in batch]
                requests = [self._to_dead_letter(r) if d else r for r, d in zip(requests, dead, strict=True)]
            stored = self._write_back(requests)
            with self._lock:  # lateness counts from when the batch is visible
                self._settle(self._clock.now_ms(), batch, dead, stored)
            budget -= len(batch)

    def _drop_unreadable(self, batch: list[WheelEntry], read: list[AppendRequest | None],
                         ) -> tuple[list[WheelEntry], list[AppendRequest | None]]:
        """A record that fails its checks cannot be delivered: it is logged, counted and marked
        done (so its segment can go), and the rest of the batch goes on."""
        lost: dict[Segment, list[int]] = defaultdict(list)
        for entry, request in zip(batch, read, strict=True):
            if request is None:
                lost[entry.segment].append(entry.seq)
        for segment, seqs in lost.items():
            self._log.error("schedule records unreadable; skipped", segment=segment.start, seqs=seqs)
            self._schedule.mark(segment, DELIVERED, seqs, sync=True)
            self._metrics.corrupt_skipped += len(seqs)
        kept = [(e, r) for e, r in zip(batch, read, strict=True) if r is not None]
        return [e for e, _ in kept], [r for _, r in kept]

    def _claim(self, now: int) -> list[WheelEntry]:
        """Up to ``dispatch_batch`` due entries, oldest first, still unsettled."""
        want = self._opt.dispatch_batch
        if len(self._ready) < want:
            self._ready.extend(self._wheel.pop_due(now, limit=want - len(self._ready)))
        batch: list[WheelEntry] = []
        segments = self._schedule.segments
        while self._ready and len(batch) < want:
            entry = self._ready.popleft()
            segment = entry.segment
            if segments.get(segment.start) is segment and not segment.dispatch.is_settled(entry.seq):
                batch.append(entry)
        return batch

    def _write_back(self, requests: list[AppendRequest]) -> list[bool] | None:
        """Deliver in order; None when all were stored, else which ones reached the store."""
        outcome = write_back(requests, self._deliver, self._deliver_batch, self._was_delivered)
        if outcome.error is not None:
            self._metrics.deliver_failures += 1
            self._log.error("delivery failed; retrying", messages=len(requests),
                            retry_in_ms=self._opt.retry_after_error_ms, exc_info=outcome.error)
        return outcome.stored

    def _settle(self, now: int, batch: list[WheelEntry], dead: list[bool], stored: list[bool] | None) -> None:
        delivered: dict[Segment, list[int]] = defaultdict(list)
        failed: list[WheelEntry] = []
        done: list[WheelEntry] = []
        for i, entry in enumerate(batch):
            if stored is not None and not stored[i]:
                failed.append(entry)
                continue
            delivered[entry.segment].append(entry.seq)
            done.append(entry)
            if dead[i]:
                self._metrics.dead_lettered += 1
        m = self._metrics
        late = [now - entry.deliver_at_ms for entry in done]
        if late:
            self._lateness.record_many(late)
            m.delivered += len(late)
        start_ms, start_seq = self._start_ms, self._start_seq
        overdue = [now - e.deliver_at_ms for e in done if e.seq < start_seq and e.deliver_at_ms <= start_ms]
        if overdue:
            m.overdue_at_start += len(overdue)
            m.start_late_ms_max = max(m.start_late_ms_max, max(overdue))
        m.batches += 1
        for segment, seqs in delivered.items():
            # Not fsynced: a lost D leaves its intent, which recovery settles by asking the broker.
            self._schedule.mark(segment, DELIVERED, seqs, sync=False)
        if failed:
            # Keep delivery order: the failed messages go back in front of everything else due.
            self._ready.extendleft(reversed(failed))
            self._paused_until_ms = now + self._opt.retry_after_error_ms

    def _to_dead_letter(self, request: AppendRequest) -> AppendRequest:
        props = dict(request.properties)
        props[Prop.REAL_TOPIC] = request.topic
        props[Prop.REAL_QUEUE_ID] = str(request.queue_id)
        return attrs.evolve(request, topic=self._opt.dead_letter_topic, queue_id=0, properties=props)

    # ================================================================ retention

    def _clean_message_log(self) -> int:
        removed = 0
        segments = self._schedule.segments
        for base, end in self._ml.segments()[:-1]:
            if end > self._iterator.persisted_offset or base not in self._iterator.sealed:
                break  # segments are sealed in order
            buckets = self._iterator.refs.get(base, set())
            if all(b not in segments or segments[b].first_source >= end for b in buckets):
                removed += self._ml.delete_segment(base)
                self._iterator.refs.pop(base, None)
                self._iterator.sealed.discard(base)
                self._metrics.message_log_segments_deleted += 1
        return removed
