"""The schedule log: one segment of full records per deliver-time bucket (QMQ ``ScheduleLog``).

A segment holds every message whose deliver time falls in ``[start, start + bucket)``, in the
order the iterator moved them (message-log order). Each segment has a dispatch log (see
``dispatch_log``) next to it. Opening reads only the first and last record of each segment
(the trailer makes the last one findable), not the whole file: QMQ notes a full validation is
normally unnecessary because the file size is where the checkpoint left it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from plugmq.core import AppendRequest, StoreError
from plugmq.core.logs import get_logger
from plugmq.kit.native import load_kernel
from plugmq.plugins.delay_schedule.dispatch_log import (
    DispatchState,
    encode_dispatch,
    read_dispatch_log,
)
from plugmq.plugins.delay_schedule.files import FdCache, fsync_dir
from plugmq.plugins.delay_schedule.layout import SEGSCAN
from plugmq.plugins.delay_schedule.records import (
    SCH_HEAD,
    SCH_TAIL,
    MessageLogRecord,
    ScheduleRecord,
    decode_due_requests,
    decode_schedule_record,
    encode_schedule_record,
)

__all__ = ["ScheduleLog", "Segment", "SegmentIndex", "scan_records"]

log = get_logger(__name__)

_segscan: Any = load_kernel(SEGSCAN)  # None: the Python loop of _scan_chunk
_ROW = 8  # position, size, seq, schedule time, source, index, delay level, store timestamp


class SegmentIndex(NamedTuple):
    """A loaded segment's records, column by column (record i is element i of each)."""

    positions: list[int]
    sizes: list[int]
    seqs: list[int]
    times: list[int]


def _scan_chunk(data: bytes, number: int, base: int) -> tuple[int, list[int]]:
    """The sound records of ``data`` from its start with indexes ``number``, ``number + 1``...:
    where the walk stopped and ``_ROW`` integers per record (ScheduleRecord's fields but the
    payload; positions are ``base`` + place in ``data``)."""
    if _segscan is not None:
        end, found = _segscan.scan(data, 0, number, base)
        return end, found
    return scan_records(data, 0, number, base)


def scan_records(data: bytes, pos: int, number: int, base: int) -> tuple[int, list[int]]:
    """``_segscan.scan`` in Python (its reference and fallback): the walk from ``pos``."""
    rows: list[int] = []
    while pos >= 0:
        record = decode_schedule_record(data, pos, with_payload=False, base=base)
        if record is None or record.number != number:
            break
        rows += _fields(record)
        pos += record.size
        number += 1
    return pos, rows


def _fields(record: ScheduleRecord) -> tuple[int, ...]:
    return (record.position, record.size, record.seq, record.schedule_time_ms, record.source, record.number,
            record.delay_level, record.store_ts_ms)

_SEG = ".seg"
_DISPATCH = ".dispatch"
_SCAN_CHUNK = 4 << 20
_RUN_GAP = 4096  # neighbouring records closer than this are read in one go
_RUN_MAX = 4 << 20  # ... up to this many bytes per read


@attrs.define(eq=False)
class Segment:
    """One bucket's segment as known in memory (its records stay on disk)."""

    start: int
    count: int = 0
    size: int = 0
    first_source: int = -1
    last_source: int = -1
    loaded: bool = False
    dispatch: DispatchState = attrs.field(factory=DispatchState)

    @property
    def unsettled(self) -> int:
        return self.count - self.dispatch.settled_count

    def holds_source(self, source: int) -> bool:
        """Whether the record moved from message-log offset ``source`` is in this segment
        (given that it went to this bucket): records arrive in message-log order."""
        return self.count > 0 and self.first_source <= source <= self.last_source


class ScheduleLog:
    """Segments by bucket start (epoch ms, a multiple of ``bucket_ms``). Not thread-safe: the
    scheduler calls it under its lock."""

    def __init__(self, directory: Path, *, bucket_ms: int, fsync: bool, open_files: int) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._prefix = f"{directory}{os.sep}"
        self.bucket_ms = bucket_ms
        self._fsync = fsync
        self._files = FdCache(open_files, fsync=fsync)
        self.segments: dict[int, Segment] = {}

    def bucket_of(self, when_ms: int) -> int:
        return when_ms - when_ms % self.bucket_ms

    # ---------------------------------------------------------------- open

    def open(self) -> None:
        for path in sorted(self._dir.glob(f"*{_SEG}")):
            if not path.stem.isdigit():
                continue
            segment = self._open_segment(int(path.stem), str(path))
            if segment is not None:
                self.segments[segment.start] = segment
        for path in self._dir.glob(f"*{_DISPATCH}"):
            start = int(path.stem) if path.stem.isdigit() else None
            segment = self.segments.get(start) if start is not None else None
            if segment is None:
                # The segment went first when it was retired; its log is left over.
                path.unlink()
                continue
            segment.dispatch = read_dispatch_log(path)
        for path in self._dir.glob("*.tmp"):
            path.unlink()

    def _open_segment(self, start: int, path: str) -> Segment | None:
        size = os.path.getsize(path)
        segment = Segment(start)
        first = self._record_at(path, 0, size) if size else None
        last = None
        if first is not None and size >= SCH_TAIL.size:
            tail_size, _ = SCH_TAIL.unpack(self._files.read(path, size - SCH_TAIL.size, SCH_TAIL.size))
            last = self._record_at(path, size - tail_size, size) if tail_size <= size else None
        if first is not None and last is not None and last.position + last.size == size:
            segment.count, segment.size = last.number + 1, size
            segment.first_source, segment.last_source = first.source, last.source
            return segment
        # A torn tail (or worse): keep the valid prefix.
        records = self._scan(path, size)
        valid = records[-1].position + records[-1].size if records else 0
        log.warning("schedule segment tail cut", path=path, valid=valid, size=size)
        if not records:
            self._files.forget(path)
            os.unlink(path)
            return None
        os.truncate(path, valid)
        segment.count, segment.size = len(records), valid
        segment.first_source, segment.last_source = records[0].source, records[-1].source
        return segment

    def _record_at(self, path: str, position: int, size: int) -> ScheduleRecord | None:
        if position < 0 or position + SCH_HEAD.size > size:
            return None
        head = self._files.read(path, position, SCH_HEAD.size)
        (length,) = struct.unpack_from(">I", head, 4)
        if position + length > size:
            return None
        data = self._files.read(path, position, length)
        return decode_schedule_record(data, 0, with_payload=False, base=position)

    def _scan(self, path: str, size: int) -> list[ScheduleRecord]:
        rows = self._scan_rows(path, size)
        return [ScheduleRecord._make((*rows[i:i + _ROW], None)) for i in range(0, len(rows), _ROW)]

    def _scan_rows(self, path: str, size: int) -> list[int]:
        """The sound prefix of a segment file, ``_ROW`` integers per record."""
        rows: list[int] = []
        position = 0
        while position < size:
            data = self._files.read(path, position, min(_SCAN_CHUNK, size - position))
            pos, found = _scan_chunk(data, len(rows) // _ROW, position)
            rows += found
            if pos == 0:  # a record longer than a chunk
                record = self._record_at(path, position, size)
                if record is None or record.number != len(rows) // _ROW:
                    break
                rows += _fields(record)
                pos = record.size
            position += pos
        return rows

    # ---------------------------------------------------------------- records

    # Paths are plain strings: they key the descriptor cache on every read and write, and
    # pathlib's hashing showed up as a fifth of the dispatch time.
    def path(self, start: int) -> str:
        return f"{self._prefix}{start:016d}{_SEG}"

    def dispatch_path(self, start: int) -> str:
        return f"{self._prefix}{start:016d}{_DISPATCH}"

    def append(self, record: MessageLogRecord, *, store_ts_ms: int) -> tuple[Segment, int, bool]:
        """Append ``record`` to its bucket's segment: (segment, position in it, newly created)."""
        start = self.bucket_of(record.deliver_at_ms)
        segment = self.segments.get(start)
        created = segment is None
        if segment is None:
            segment = self.segments[start] = Segment(start)
        data = encode_schedule_record(record, index=segment.count, store_ts_ms=store_ts_ms)
        position = segment.size
        self._files.write(self.path(start), position, data)
        if created and self._fsync:
            fsync_dir(self._dir)
        segment.size += len(data)
        segment.count += 1
        if segment.first_source < 0:
            segment.first_source = record.offset
        segment.last_source = record.offset
        return segment, position, created

    def index(self, segment: Segment) -> SegmentIndex:
        """Where the records of ``segment`` are, and their seqs and times (payloads are read at delivery)."""
        path = self.path(segment.start)
        rows = self._scan_rows(path, segment.size)
        if len(rows) != segment.count * _ROW:
            raise StoreError(
                f"delay_schedule: schedule segment {path} holds {len(rows) // _ROW} readable records where "
                f"{segment.count} were written; the file is damaged (restore it from a replica)"
            )
        return SegmentIndex(rows[0::_ROW], rows[1::_ROW], rows[2::_ROW], rows[3::_ROW])

    def read(self, segment: Segment, position: int, size: int) -> ScheduleRecord:
        """The full record of ``size`` bytes at ``position`` (both from the index)."""
        path = self.path(segment.start)
        record = decode_schedule_record(self._files.read(path, position, size), 0, base=position)
        if record is None or record.size != size:
            raise StoreError(f"delay_schedule: no valid schedule record of {size} bytes at {path}:{position}")
        return record

    def read_requests(self, wanted: Sequence[tuple[Segment, int, int]], *,
                      drop: Collection[str] = ()) -> list[AppendRequest | None]:
        """The requests of the records at ``(segment, position, size)`` (same order; None for a
        record that fails its checks), without the properties in ``drop``. Records of a segment
        are read in runs of neighbours: one read per run instead of one per message."""
        out: list[AppendRequest | None] = [None] * len(wanted)
        places = [(segment.start, position) for segment, position, _ in wanted]
        order = sorted(range(len(wanted)), key=places.__getitem__)
        i = 0
        while i < len(order):
            segment, start, size = wanted[order[i]]
            end = start + size
            j = i + 1
            while j < len(order):
                seg, pos, length = wanted[order[j]]
                if seg is not segment or pos - end > _RUN_GAP or pos + length - start > _RUN_MAX:
                    break
                end = max(end, pos + length)
                j += 1
            path = self.path(segment.start)
            raw = self._files.read(path, start, end - start)
            run = order[i:j]
            decoded = decode_due_requests(raw, [wanted[k][1] - start for k in run], [wanted[k][2] for k in run],
                                          tuple(drop))
            for k, request in zip(run, decoded, strict=True):
                out[k] = request
                if request is None:
                    log.error("schedule record unreadable", path=path, position=wanted[k][1], size=wanted[k][2])
            i = j
        return out

    # ---------------------------------------------------------------- dispatch logs

    def mark(self, segment: Segment, kind: int, seqs: list[int], *, sync: bool) -> None:
        """Append ``kind`` records for ``seqs`` to the segment's dispatch log."""
        if not seqs:
            return
        path = self.dispatch_path(segment.start)
        created = segment.dispatch.size == 0
        data = encode_dispatch(kind, seqs)
        self._files.write(path, segment.dispatch.size, data)
        segment.dispatch.size += len(data)
        segment.dispatch.apply_many(kind, seqs)
        if self._fsync and created:
            fsync_dir(self._dir)
        if sync and self._fsync:
            self._files.sync({path})

    # ---------------------------------------------------------------- durability and retention

    def sync(self, starts: set[int] | None = None) -> None:
        if not self._fsync:
            return
        self._files.sync(None if starts is None else {self.path(s) for s in starts})

    def sync_dispatch(self, starts: set[int]) -> None:
        if self._fsync:
            self._files.sync({self.dispatch_path(s) for s in starts})

    def delete(self, start: int) -> int:
        """Retire a segment; returns how many files went. The segment goes before its dispatch
        log: a crash in between leaves an orphan log (removed at open), never a segment whose
        deliveries are forgotten."""
        self.segments.pop(start, None)
        removed = 0
        for path in (self.path(start), self.dispatch_path(start)):
            self._files.forget(path)
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
            if self._fsync:
                fsync_dir(self._dir)
        return removed

    def close(self) -> None:
        self._files.close()
