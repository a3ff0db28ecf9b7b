"""The message log: QMQ's write-ahead log of delayed messages (seed 001, ``MessageLog``).

``schedule()`` appends here and returns; an iterator moves records into the schedule log later,
which keeps the producer path to one sequential write ("削谷填峰": the log absorbs bursts).
Segments are files named by their first global offset; a record never spans two segments (a
record that does not fit starts the next segment, whose base is where the previous one ends).

A segment can carry a ``.buckets`` sidecar, written once the iterator has moved all its records:
the schedule buckets those records went to. Retention deletes a segment only when every one of
those buckets has been retired, i.e. every message of the segment is delivered or cancelled.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from pathlib import Path

from plugmq.core import StoreError
from plugmq.core.logs import get_logger
from plugmq.plugins.delay_schedule.files import fsync_dir
from plugmq.plugins.delay_schedule.records import (
    ML_HEAD,
    MessageLogRecord,
    decode_message_log_record,
    encode_message_log_record,
)

__all__ = ["MessageLog"]

log = get_logger(__name__)

_READ_CHUNK = 1 << 20
_SUFFIX = ".log"
_BUCKETS = ".buckets"


class MessageLog:
    """Append-only segmented log; thread-safe (appends come from producer threads)."""

    def __init__(self, directory: Path, *, segment_bytes: int, fsync: bool) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._segment_bytes = segment_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        self._bases: list[int] = sorted(int(p.stem) for p in directory.glob(f"*{_SUFFIX}") if p.stem.isdigit())
        self._sizes: dict[int, int] = {b: self._path(b).stat().st_size for b in self._bases}
        for path in [*directory.glob(f"*{_BUCKETS}"), *directory.glob("*.tmp")]:
            # A sidecar whose segment is gone: the deletion died between the two unlinks.
            if path.suffix == ".tmp" or not path.stem.isdigit() or int(path.stem) not in self._sizes:
                path.unlink()
        self._fds: dict[int, int] = {}
        self.next_seq = 0
        self._closed = False

    # ---------------------------------------------------------------- recovery

    def recover(self, checkpoint_offset: int, checkpoint_next_seq: int) -> int:
        """Validate everything from ``checkpoint_offset`` on, cut a torn tail, set the next
        sequence. Returns the offset reading should start at (the checkpoint, or the first
        segment's base if the checkpoint points into a deleted gap)."""
        bind = log.bind(dir=str(self._dir))
        self.next_seq = checkpoint_next_seq
        if not self._bases:
            self._bases = [checkpoint_offset]
            self._sizes[checkpoint_offset] = 0
            self._path(checkpoint_offset).touch()
            return checkpoint_offset
        if checkpoint_offset > self.end:
            raise StoreError(
                f"delay_schedule: the iterator checkpoint ({checkpoint_offset}) is past the end of the "
                f"message log in {self._dir} ({self.end}); message-log files were removed or truncated "
                f"by hand. Restore them, or delete checkpoint.json to replay what is left"
            )
        start = max(checkpoint_offset, self._bases[0])
        first = bisect.bisect_right(self._bases, start) - 1
        for base in self._bases[max(first, 0) :]:
            position = max(start - base, 0)
            data = self._read_file(base, position, self._sizes[base] - position)
            pos = 0
            while pos < len(data):
                record = decode_message_log_record(data, pos)
                if record is None or record.offset != base + position + pos:
                    break
                self.next_seq = record.seq + 1
                pos += record.size
            if pos < len(data):
                bind.warning("message log tail cut", segment=base, valid=position + pos, size=self._sizes[base])
                os.truncate(self._path(base), position + pos)
                self._sizes[base] = position + pos
        return start

    # ---------------------------------------------------------------- writing

    def append(self, *, deliver_at_ms: int, delay_level: int, store_ts_ms: int, payload: bytes) -> MessageLogRecord:
        with self._lock:
            if self._closed:
                raise StoreError("delay_schedule: the message log is closed")
            base = self._bases[-1]
            size = ML_HEAD.size + len(payload)
            if self._sizes[base] and self._sizes[base] + size > self._segment_bytes:
                base = self._roll()
            offset = base + self._sizes[base]
            data = encode_message_log_record(
                offset=offset,
                seq=self.next_seq,
                deliver_at_ms=deliver_at_ms,
                delay_level=delay_level,
                store_ts_ms=store_ts_ms,
                payload=payload,
            )
            fd = self._fd(base)
            if os.pwrite(fd, data, self._sizes[base]) != len(data):
                raise StoreError(f"delay_schedule: short write to message log segment {self._path(base)}")
            if self._fsync:
                os.fsync(fd)
            self._sizes[base] += len(data)
            self.next_seq += 1
            return MessageLogRecord(offset, len(data), self.next_seq - 1, deliver_at_ms, delay_level, store_ts_ms, payload)

    def _roll(self) -> int:
        old = self._bases[-1]
        base = old + self._sizes[old]
        self._path(base).touch()
        if self._fsync:
            fsync_dir(self._dir)
        self._bases.append(base)
        self._sizes[base] = 0
        return base

    # ---------------------------------------------------------------- reading

    @property
    def end(self) -> int:
        base = self._bases[-1]
        return base + self._sizes[base]

    def read(self, offset: int, max_records: int) -> tuple[list[MessageLogRecord], int]:
        """Up to ``max_records`` records from ``offset`` on and the offset after the last one."""
        records: list[MessageLogRecord] = []
        with self._lock:
            while len(records) < max_records:
                index = bisect.bisect_right(self._bases, offset) - 1
                if index < 0:
                    offset = self._bases[0]
                    continue
                base = self._bases[index]
                position = offset - base
                remaining = self._sizes[base] - position
                if remaining <= 0:
                    if index + 1 >= len(self._bases):
                        break
                    offset = self._bases[index + 1]
                    continue
                data = self._read_file(base, position, min(remaining, _READ_CHUNK))
                pos = 0
                while pos < len(data) and len(records) < max_records:
                    record = decode_message_log_record(data, pos)
                    if record is None:
                        break
                    records.append(record)
                    pos += record.size
                if pos == 0:
                    # A record larger than one chunk: read exactly that record.
                    if len(data) < ML_HEAD.size:
                        raise StoreError(
                            f"delay_schedule: truncated message-log record at offset {offset} in {self._path(base)}"
                        )
                    (size,) = struct.unpack_from(">I", data, 4)
                    data = self._read_file(base, position, size)
                    record = decode_message_log_record(data, 0)
                    if record is None:
                        raise StoreError(
                            f"delay_schedule: corrupt message-log record at offset {offset} in {self._path(base)}"
                        )
                    records.append(record)
                    pos = record.size
                offset += pos
        return records, offset

    def read_at(self, offset: int) -> MessageLogRecord | None:
        """The record that starts exactly at ``offset``, or None (unknown, deleted, not a record)."""
        with self._lock:
            index = bisect.bisect_right(self._bases, offset) - 1
            if index < 0:
                return None
            base = self._bases[index]
            position = offset - base
            if position + ML_HEAD.size > self._sizes[base]:
                return None
            head = self._read_file(base, position, ML_HEAD.size)
            (size,) = struct.unpack_from(">I", head, 4)
            if size < ML_HEAD.size or position + size > self._sizes[base]:
                return None
            record = decode_message_log_record(self._read_file(base, position, size), 0)
        if record is None or record.offset != offset:
            return None
        return record

    # ---------------------------------------------------------------- segments and retention

    def segments(self) -> list[tuple[int, int]]:
        """(base, end) of every segment, oldest first; the last one is the active segment."""
        with self._lock:
            return [(b, b + self._sizes[b]) for b in self._bases]

    def write_buckets(self, base: int, buckets: set[int]) -> None:
        data = struct.pack(f">{len(buckets)}q", *sorted(buckets))
        path = self._dir / f"{base:020d}{_BUCKETS}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def read_buckets(self, base: int) -> set[int] | None:
        path = self._dir / f"{base:020d}{_BUCKETS}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % 8:
            return None
        return set(struct.unpack(f">{len(data) // 8}q", data))

    def delete_segment(self, base: int) -> int:
        """Remove a segment and its bucket sidecar; returns how many files went."""
        with self._lock:
            if base == self._bases[-1]:
                raise StoreError("delay_schedule: refusing to delete the active message-log segment")
            fd = self._fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            self._bases.remove(base)
            del self._sizes[base]
            removed = 0
            for path in (self._path(base), self._dir / f"{base:020d}{_BUCKETS}"):
                if path.exists():
                    path.unlink()
                    removed += 1
            if self._fsync:
                fsync_dir(self._dir)
            return removed

    def flush(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.fsync(fd)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in self._fds.values():
                os.fsync(fd)
                os.close(fd)
            self._fds.clear()

    # ---------------------------------------------------------------- helpers

    def _path(self, base: int) -> Path:
        return self._dir / f"{base:020d}{_SUFFIX}"

    def _fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            # Only the active segment is written; older ones are kept open for reads until
            # deleted. Readers of old segments are rare (cancel, recovery), so few stay open.
            if len(self._fds) > 8:
                for old in [b for b in self._fds if b != self._bases[-1]][:4]:
                    os.close(self._fds.pop(old))
            fd = os.open(self._path(base), os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[base] = fd
        return fd

    def _read_file(self, base: int, position: int, size: int) -> bytes:
        if size <= 0:
            return b""
        return os.pread(self._fd(base), size, position)
