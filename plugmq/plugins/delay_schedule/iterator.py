"""The iterator (QMQ ``LogIterateService`` + ``IterateOffsetManager``) and its checkpoint.

It reads the message log from its checkpoint and appends each record to the schedule segment
of its deliver-time bucket, then flushes the touched segments and persists the checkpoint, in
that order (QMQ's ``IterateOffsetManager#flush`` flushes the schedule log first, for the same
reason): the checkpoint never claims a record that is not durably in a segment.

A crash between a segment append and the checkpoint makes a restart replay records a segment
already holds. Segments are filled in message-log order, so "the segment's newest source offset
is >= this record's offset" identifies those, and they are skipped, not duplicated.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from pathlib import Path

import attrs

from plugmq.core import Clock, ConfigError, StoreError
from plugmq.core.logs import get_logger
from plugmq.plugins.delay_schedule.files import atomic_write
from plugmq.plugins.delay_schedule.message_log import MessageLog
from plugmq.plugins.delay_schedule.records import MessageLogRecord
from plugmq.plugins.delay_schedule.schedule_log import ScheduleLog, Segment

__all__ = ["Checkpoint", "CheckpointStore", "LogIterator"]

log = get_logger(__name__)

OnAppended = Callable[[Segment, int, int, MessageLogRecord, bool], None]


@attrs.frozen
class Checkpoint:
    """How far the iterator has read, and the layout the files were written with."""

    iterate_offset: int = attrs.field(validator=attrs.validators.ge(0))
    next_seq: int = attrs.field(validator=attrs.validators.ge(0))
    bucket_ms: int = attrs.field(validator=attrs.validators.gt(0))


class CheckpointStore:
    def __init__(self, path: Path, *, fsync: bool) -> None:
        self._path = path
        self._fsync = fsync

    def load(self) -> Checkpoint | None:
        try:
            raw = json.loads(self._path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise StoreError(
                f"delay_schedule: {self._path} is not valid JSON ({exc}); it is written atomically, so "
                f"this is outside damage. Delete it to replay the whole message log"
            ) from exc
        return Checkpoint(raw["iterate_offset"], raw["next_seq"], raw["bucket_ms"])

    def save(self, checkpoint: Checkpoint) -> None:
        atomic_write(self._path, json.dumps(attrs.asdict(checkpoint)).encode(), fsync=self._fsync)


class LogIterator:
    """Moves message-log records into schedule segments. Called under the scheduler's lock."""

    def __init__(
        self,
        message_log: MessageLog,
        schedule_log: ScheduleLog,
        checkpoints: CheckpointStore,
        *,
        clock: Clock,
        on_appended: OnAppended,
    ) -> None:
        self._ml = message_log
        self._schedule = schedule_log
        self._checkpoints = checkpoints
        self._clock = clock
        self._on_appended = on_appended
        self.offset = 0
        self.next_seq = 0
        self.persisted_offset = 0
        # message-log segment base -> buckets its records went to; complete once "sealed".
        self.refs: dict[int, set[int]] = {}
        self.sealed: set[int] = set()

    def recover(self) -> None:
        """Load the checkpoint, fix the message log's tail, rebuild what retention needs."""
        checkpoint = self._checkpoints.load()
        bucket_ms = self._schedule.bucket_ms
        if checkpoint is not None and checkpoint.bucket_ms != bucket_ms:
            raise ConfigError(
                f"plugins.delay_schedule.bucket_minutes is {bucket_ms // 60_000} but the data in "
                f"{self._checkpoints._path.parent} was laid out with {checkpoint.bucket_ms // 60_000}-minute "
                f"buckets; set it back (or drain the delayed messages before changing it)"
            )
        offset = checkpoint.iterate_offset if checkpoint else 0
        next_seq = checkpoint.next_seq if checkpoint else 0
        self.offset = self._ml.recover(offset, next_seq)
        self.next_seq = next_seq
        self.persisted_offset = self.offset
        self._rebuild_refs()
        if checkpoint is None:
            self._save()

    def _rebuild_refs(self) -> None:
        segments = self._ml.segments()
        last = segments[-1][0]
        for base, end in segments:
            if base >= self.offset:
                break
            if end <= self.offset and base != last:
                buckets = self._ml.read_buckets(base)
                if buckets is None:
                    buckets = self._scan_buckets(base, end)
                    self._ml.write_buckets(base, buckets)
                self.refs[base] = buckets
                self.sealed.add(base)
            else:
                # Partly (or, for the active segment, wholly) moved: the rest is added as moved.
                self.refs[base] = self._scan_buckets(base, self.offset)

    def _scan_buckets(self, base: int, limit: int) -> set[int]:
        buckets: set[int] = set()
        offset = base
        while offset < limit:
            records, offset = self._ml.read(offset, 10_000)
            if not records:
                break
            for record in records:
                if record.offset < limit:
                    buckets.add(self._schedule.bucket_of(record.deliver_at_ms))
        return buckets

    @property
    def lag(self) -> int:
        """Message-log records not moved yet."""
        return self._ml.next_seq - self.next_seq

    def run(self, max_records: int) -> int:
        """Move up to ``max_records`` records; return how many were read."""
        records, next_offset = self._ml.read(self.offset, max_records)
        if not records:
            if next_offset != self.offset:
                self.offset = next_offset
                self._seal_and_save()
            return 0
        bases = [b for b, _ in self._ml.segments()]
        touched: set[int] = set()
        now = self._clock.now_ms()
        for record in records:
            start = self._schedule.bucket_of(record.deliver_at_ms)
            segment = self._schedule.segments.get(start)
            if segment is None or segment.last_source < record.offset:
                segment, position, created = self._schedule.append(record, store_ts_ms=now)
                touched.add(start)
                self._on_appended(segment, position, segment.size - position, record, created)
            base = bases[bisect.bisect_right(bases, record.offset) - 1]
            self.refs.setdefault(base, set()).add(start)
        self.offset = next_offset
        self.next_seq = records[-1].seq + 1
        self._schedule.sync(touched)
        self._seal_and_save()
        return len(records)

    def run_all(self) -> int:
        moved = 0
        while True:
            count = self.run(100_000)
            moved += count
            if count == 0:
                return moved

    def _seal_and_save(self) -> None:
        for base, end in self._ml.segments()[:-1]:
            if end <= self.offset and base not in self.sealed:
                self._ml.write_buckets(base, self.refs.get(base, set()))
                self.sealed.add(base)
        self._save()

    def _save(self) -> None:
        self._checkpoints.save(Checkpoint(self.offset, self.next_seq, self._schedule.bucket_ms))
        self.persisted_offset = self.offset
