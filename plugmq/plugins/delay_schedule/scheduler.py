"""QMQ's delay server as a DelayScheduler: message log -> schedule log -> hashed wheel -> deliver.

Flow (seed 001): ``schedule()`` appends to the message log and kicks the iterator (a clock
timer due now, so bursts are moved in batches off the producer's path). The iterator appends
each record to its bucket's schedule segment; a segment whose bucket starts within
``load_ahead_ms`` is *loaded*: its unsettled records' index goes into the hashed wheel, and
records that arrive for a loaded segment go straight in. One clock timer waits for the earliest
non-empty wheel tick, another for the next segment to load; nothing spins while idle.

A due batch is delivered as: intents to the dispatch logs (fsynced), ``context.deliver`` of
each request with its delay properties removed, then delivered marks. Recovery asks
``context.was_delivered`` about intents without a mark. Retention deletes a segment once its
dispatch log covers all its messages, and a message-log segment once every bucket it fed is gone.

Message ids: ``encode_msg_id(store_host, message-log offset)``; ``AppendResult.queue_offset`` is
the delay sequence and ``commit_log_offset`` the message-log offset. ``cancel`` reads the
record at that offset (the record stores its own offset, so a wrong id cannot alias another).
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import defaultdict
from collections.abc import Mapping

import attrs

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    DelayCapabilities,
    DelayContext,
    DelayError,
    DelayUnsupportedError,
    PluginError,
    Prop,
    Timer,
    ValidationError,
    decode_msg_id,
    encode_msg_id,
)
from plugmq.core.logs import get_logger
from plugmq.plugins.delay_schedule.dispatch_log import CANCELLED, DELIVERED, INTENT
from plugmq.plugins.delay_schedule.iterator import CheckpointStore, LogIterator
from plugmq.plugins.delay_schedule.message_log import MessageLog
from plugmq.plugins.delay_schedule.options import DelayScheduleOptions
from plugmq.plugins.delay_schedule.records import (
    MessageLogRecord,
    decode_request,
    encode_request,
)
from plugmq.plugins.delay_schedule.schedule_log import ScheduleLog, Segment
from plugmq.plugins.delay_schedule.wheel import HashedWheel, WheelEntry

__all__ = ["PLUGIN_NAME", "ScheduleDelayScheduler", "capabilities_for"]

log = get_logger(__name__)

PLUGIN_NAME = "delay_schedule"
_DELAY_PROPS = (Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS)


def capabilities_for(options: DelayScheduleOptions) -> DelayCapabilities:
    return DelayCapabilities(
        cancel=True,
        arbitrary_delay=True,
        max_delay_ms=options.max_delay_ms,
        clamps=options.clamp_to_max_delay,
        resolution_ms=options.tick_ms,
        no_duplicates_after_restart=True,
    )


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


@attrs.define
class _Metrics:
    scheduled: int = 0
    delivered: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    overdue_at_start: int = 0
    start_late_ms_max: int = 0
    late_ms_max: int = 0
    late_ms_sum: int = 0
    deliver_failures: int = 0
    in_doubt_found_delivered: int = 0
    in_doubt_redelivered: int = 0
    segments_loaded: int = 0
    segments_retired: int = 0
    message_log_segments_deleted: int = 0


class ScheduleDelayScheduler:
    """See the module docstring. Thread-safe; timer callbacks and API calls share one lock."""

    def __init__(self, context: DelayContext, options: DelayScheduleOptions) -> None:
        if context.deliver is None:
            raise PluginError(
                "delay_schedule needs DelayContext.deliver (the broker's write-back) to deliver due messages"
            )
        self._ctx = context
        self._opt = options
        self._clock = context.clock
        self._deliver = context.deliver
        self._was_delivered = context.was_delivered
        self.capabilities = capabilities_for(options)
        # encode_msg_id parses the host on every call; the host part never changes.
        self._msg_id_prefix = encode_msg_id(context.store_host, 0)[:16]
        root = context.plugin_dir(PLUGIN_NAME)
        self._log = log.bind(broker=context.broker_name, dir=str(root))
        self._lock = threading.RLock()
        self._kick_lock = threading.Lock()
        self._kick_pending = False
        self._ml = MessageLog(root / "message_log", segment_bytes=options.message_log_segment_bytes, fsync=options.fsync)
        self._schedule = ScheduleLog(
            root / "schedule_log", bucket_ms=options.bucket_ms, fsync=options.fsync, open_files=options.open_files
        )
        self._iterator = LogIterator(
            self._ml,
            self._schedule,
            CheckpointStore(root / "checkpoint.json", fsync=options.fsync),
            clock=self._clock,
            on_appended=self._on_appended,
        )
        self._wheel = HashedWheel(tick_ms=options.tick_ms, slots=options.wheel_slots)
        self._unloaded: list[int] = []  # heap of segment starts waiting to be loaded
        self._wheel_timer: Timer | None = None
        self._wheel_timer_ms = 0
        self._load_timer: Timer | None = None
        self._load_timer_ms = 0
        self._retry: list[WheelEntry] = []
        self._paused_until_ms = 0
        self._done_candidates: set[int] = set()
        self._metrics = _Metrics()
        self._started = False
        self._starting = False
        self._closed = False
        try:
            with self._lock:
                self._schedule.open()
                self._iterator.recover()
                self._iterator.run_all()
        except BaseException:
            self._schedule.close()
            self._ml.close()
            raise
        self._log.info("delay_schedule recovered", pending=self.pending(), segments=len(self._schedule.segments))

    # ================================================================ API

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        if not isinstance(deliver_at_ms, int) or isinstance(deliver_at_ms, bool) or deliver_at_ms < 0:
            raise ValidationError(f"deliver_at_ms must be a non-negative int (epoch ms), got {deliver_at_ms!r}")
        if self._closed:
            raise DelayError("delay_schedule is closed; reopen the broker to schedule messages")
        now = self._clock.now_ms()
        if deliver_at_ms - now > self._opt.max_delay_ms:
            if not self._opt.clamp_to_max_delay:
                raise DelayUnsupportedError(
                    f"delay of {deliver_at_ms - now} ms is above delay_schedule's max_delay_ms "
                    f"({self._opt.max_delay_ms}); raise plugins.delay_schedule.max_delay_ms or set "
                    f"clamp_to_max_delay = true"
                )
            deliver_at_ms = now + self._opt.max_delay_ms
        record = self._ml.append(
            deliver_at_ms=deliver_at_ms,
            delay_level=delay_level or 0,
            store_ts_ms=now,
            payload=encode_request(request),
        )
        self._kick(accepted=1)
        return AppendResult(
            status=AppendStatus.PUT_OK,
            msg_id=f"{self._msg_id_prefix}{record.offset:016X}",
            queue_offset=record.seq,
            commit_log_offset=record.offset,
            size=record.size,
            store_timestamp_ms=now,
        )

    def start(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._iterator.run_all()
            now = self._clock.now_ms()
            self._unloaded = list(self._schedule.segments)
            heapq.heapify(self._unloaded)
            self._starting = True
            try:
                self._load_due(now)
            finally:
                self._starting = False
            dead_letter_before = now - self._opt.dead_letter_older_than_ms if self._opt.dead_letter_older_than_ms else None
            self._dispatch(now, dead_letter_before=dead_letter_before, at_start=True)
            self._log.info("delay_schedule started", overdue=self._metrics.overdue_at_start)
            self._arm()

    def cancel(self, msg_id: str) -> bool:
        try:
            host, offset = decode_msg_id(msg_id)
        except ValidationError:
            return False
        if host != self._ctx.store_host:
            return False
        with self._lock:
            if self._closed:
                raise DelayError("delay_schedule is closed; reopen the broker to cancel messages")
            if offset >= self._iterator.offset:
                self._iterator.run_all()
                self._arm()
            record = self._ml.read_at(offset)
            if record is None:
                return False
            segment = self._schedule.segments.get(self._schedule.bucket_of(record.deliver_at_ms))
            if segment is None or not segment.holds_source(offset):
                return False  # its segment was retired: delivered or cancelled long ago
            if record.seq in segment.dispatch.delivered:
                return False
            if record.seq in segment.dispatch.cancelled:
                return True
            self._schedule.mark(segment, CANCELLED, [record.seq], sync=True)
            self._metrics.cancelled += 1
            self._done_candidates.add(segment.start)
            self._retire()
            return True

    def pending(self) -> int:
        with self._lock:
            return self._iterator.lag + sum(seg.unsettled for seg in self._schedule.segments.values())

    def metrics(self) -> Mapping[str, float]:
        with self._lock:
            m = attrs.asdict(self._metrics)
            late_sum = m.pop("late_ms_sum")
            m["late_ms_mean"] = late_sum / self._metrics.delivered if self._metrics.delivered else 0.0
            m["pending"] = self._iterator.lag + sum(seg.unsettled for seg in self._schedule.segments.values())
            m["wheel_entries"] = len(self._wheel)
            m["schedule_segments"] = len(self._schedule.segments)
            m["message_log_segments"] = len(self._ml.segments())
            m["iterator_lag"] = self._iterator.lag
            return {k: float(v) for k, v in m.items()}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for timer in (self._wheel_timer, self._load_timer):
                if timer is not None:
                    timer.cancel()
            self._wheel_timer = self._load_timer = None
            try:
                self._iterator.run_all()  # so a restart has nothing to replay
            finally:
                self._closed = True
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
                self._retire()
                self._arm()
            more = self._iterator.lag > 0
        if more:
            self._kick()

    def _on_appended(self, segment: Segment, position: int, size: int, record: MessageLogRecord, created: bool) -> None:
        if not self._started:
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
        while self._unloaded and self._unloaded[0] <= horizon:
            segment = self._schedule.segments.get(heapq.heappop(self._unloaded))
            if segment is not None and not segment.loaded:
                self._load(segment)

    def _load(self, segment: Segment) -> None:
        """Put the segment's unsettled messages into the wheel, settling in-doubt ones first."""
        in_doubt = segment.dispatch.in_doubt()
        found_delivered: list[int] = []
        now = self._clock.now_ms()
        for record in self._schedule.index(segment):
            if segment.dispatch.is_settled(record.seq):
                continue
            if record.seq in in_doubt and self._reached_topic(segment, record.position, record.size):
                found_delivered.append(record.seq)
                continue
            if record.seq in in_doubt:
                self._metrics.in_doubt_redelivered += 1
            if self._starting and record.schedule_time_ms <= now:
                self._metrics.overdue_at_start += 1
            self._wheel.add(WheelEntry(record.schedule_time_ms, record.seq, segment, record.position, record.size))
        if found_delivered:
            self._schedule.mark(segment, DELIVERED, found_delivered, sync=True)
            self._metrics.in_doubt_found_delivered += len(found_delivered)
            self._metrics.delivered += len(found_delivered)
            self._done_candidates.add(segment.start)
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
        if self._closed or not self._started:
            return
        tick = self._wheel.next_tick()
        wake = None if tick is None else tick * self._opt.tick_ms
        if self._retry:
            wake = self._paused_until_ms if wake is None else max(wake, self._paused_until_ms)
        if wake is None:
            if self._wheel_timer is not None:
                self._wheel_timer.cancel()
                self._wheel_timer = None
        elif self._wheel_timer is None or self._wheel_timer_ms != wake:
            if self._wheel_timer is not None:
                self._wheel_timer.cancel()
            self._wheel_timer_ms = wake
            self._wheel_timer = self._clock.call_at(_seconds(wake), self._on_wheel_timer)
        segments = self._schedule.segments
        while self._unloaded and (self._unloaded[0] not in segments or segments[self._unloaded[0]].loaded):
            heapq.heappop(self._unloaded)
        load_at = self._unloaded[0] - self._opt.load_ahead_ms if self._unloaded else None
        if load_at is None:
            if self._load_timer is not None:
                self._load_timer.cancel()
                self._load_timer = None
        elif self._load_timer is None or self._load_timer_ms != load_at:
            if self._load_timer is not None:
                self._load_timer.cancel()
            self._load_timer_ms = load_at
            self._load_timer = self._clock.call_at(_seconds(load_at), self._on_load_timer)

    def _on_wheel_timer(self) -> None:
        with self._lock:
            self._wheel_timer = None
            if self._closed:
                return
            now = self._clock.now_ms()
            if self._retry and now >= self._paused_until_ms:
                for entry in self._retry:
                    self._wheel.add(entry)
                self._retry.clear()
            if not self._retry:
                self._dispatch(now)
            self._arm()

    def _on_load_timer(self) -> None:
        with self._lock:
            self._load_timer = None
            if self._closed:
                return
            self._load_due(self._clock.now_ms())
            self._arm()

    # ================================================================ delivery

    def _dispatch(self, now: int, *, dead_letter_before: int | None = None, at_start: bool = False) -> None:
        """Deliver every wheel entry due at ``now`` (deliver time <= now), oldest first."""
        tick = self._wheel.tick_of(now)
        not_yet: list[WheelEntry] = []
        while not self._retry:
            due = self._wheel.pop_due(tick, limit=self._opt.dispatch_batch)
            if not due:
                break
            ready = []
            for entry in due:
                if entry.deliver_at_ms > now:
                    not_yet.append(entry)  # same tick as "now", but later within it
                    continue
                segment = entry.segment
                if self._schedule.segments.get(segment.start) is segment and not segment.dispatch.is_settled(entry.seq):
                    ready.append(entry)
            if ready:
                self._deliver_batch(ready, now, dead_letter_before=dead_letter_before, at_start=at_start)
        for entry in not_yet:
            self._wheel.add(entry)
        self._retire()

    def _deliver_batch(
        self, entries: list[WheelEntry], now: int, *, dead_letter_before: int | None, at_start: bool
    ) -> None:
        by_segment: dict[Segment, list[int]] = defaultdict(list)
        for entry in entries:
            by_segment[entry.segment].append(entry.seq)
        for segment, seqs in by_segment.items():
            self._schedule.mark(segment, INTENT, seqs, sync=False)
        self._schedule.sync_dispatch({segment.start for segment in by_segment})
        delivered: dict[Segment, list[int]] = defaultdict(list)
        for i, entry in enumerate(entries):
            segment = entry.segment
            request = _due_request(self._schedule.read(segment, entry.position, entry.size).payload)
            dead = dead_letter_before is not None and entry.deliver_at_ms < dead_letter_before
            if dead:
                request = self._to_dead_letter(request)
            try:
                self._deliver(request)
            except Exception:  # noqa: BLE001 - any write-back failure is retried, as QMQ does
                self._metrics.deliver_failures += 1
                self._log.exception(
                    "delivery failed; retrying", topic=request.topic, seq=entry.seq, retry_in_ms=self._opt.retry_delay_ms
                )
                # Keep delivery order: the failed message and everything after it wait together.
                self._retry = entries[i:] + self._wheel.pop_due(self._wheel.tick_of(now))
                self._paused_until_ms = now + self._opt.retry_delay_ms
                break
            delivered[segment].append(entry.seq)
            late = now - entry.deliver_at_ms
            self._metrics.delivered += 1
            self._metrics.late_ms_sum += late
            self._metrics.late_ms_max = max(self._metrics.late_ms_max, late)
            if at_start:
                self._metrics.start_late_ms_max = max(self._metrics.start_late_ms_max, late)
            if dead:
                self._metrics.dead_lettered += 1
        for segment, seqs in delivered.items():
            # Not fsynced: a lost D leaves its intent, which recovery settles by asking the broker.
            self._schedule.mark(segment, DELIVERED, seqs, sync=False)
            self._done_candidates.add(segment.start)

    def _to_dead_letter(self, request: AppendRequest) -> AppendRequest:
        props = dict(request.properties)
        props[Prop.REAL_TOPIC] = request.topic
        props[Prop.REAL_QUEUE_ID] = str(request.queue_id)
        return attrs.evolve(request, topic=self._opt.dead_letter_topic, queue_id=0, properties=props)

    # ================================================================ retention

    def _retire(self) -> None:
        """Delete segments whose dispatch log covers every message, then message-log segments
        all of whose buckets are gone (QMQ deletes both by age, whether dispatched or not)."""
        if not self._done_candidates:
            return
        retired = False
        for start in sorted(self._done_candidates):
            segment = self._schedule.segments.get(start)
            if segment is None or segment.unsettled > 0:
                continue
            if segment.last_source >= self._iterator.persisted_offset:
                continue  # a replay could still re-add its records: wait for the checkpoint
            self._schedule.delete(start)
            self._metrics.segments_retired += 1
            retired = True
        self._done_candidates = {
            s for s in self._done_candidates if s in self._schedule.segments and self._schedule.segments[s].unsettled == 0
        }
        if retired:
            self._clean_message_log()

    def _clean_message_log(self) -> None:
        segments = self._schedule.segments
        for base, end in self._ml.segments()[:-1]:
            if end > self._iterator.persisted_offset or base not in self._iterator.sealed:
                break  # segments are sealed in order
            buckets = self._iterator.refs.get(base, set())
            if all(b not in segments or segments[b].first_source >= end for b in buckets):
                self._ml.delete_segment(base)
                self._iterator.refs.pop(base, None)
                self._iterator.sealed.discard(base)
                self._metrics.message_log_segments_deleted += 1
