"""The files of one deliver-time hour: delay log, delay index, the 3600 second heads, cancels.

Append order is log record, index entry, head of the second, header: a crash can leave at most
the last entry written but not counted in the header, and opening the hour adopts such a tail
entry (or rebuilds every head from the index when the head file is lost) — so loading an hour is
O(1) plus the crashed tail, never a sort of its index.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from plugmq.core import CorruptRecordError
from plugmq.core.logs import get_logger
from plugmq.plugins.delay_wheel.codec import (
    HEAD,
    HEAD_FILE_SIZE,
    HEAD_SIZE,
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    NO_ENTRY,
    SECONDS_PER_HOUR,
    HourHeader,
    IndexEntry,
    StoredDelay,
    decode_index_entry,
    decode_record,
    decode_records_at,
    encode_index_entry,
)
from plugmq.plugins.delay_wheel.region import Region

__all__ = ["HOUR_FILE_SUFFIXES", "HourFiles", "hour_file_stem"]

log = get_logger(__name__)

_LOG_PREALLOC = 1 << 20
_INDEX_PREALLOC = 1 << 16
_RUN_GAP = 4096  # neighbouring records closer than this are read in one go
_RUN_MAX = 4 << 20  # ... up to this many bytes per read
_CANCEL = struct.Struct("<I")
_MOVED = 1 << 31  # in a cancel-log word: the entry was moved by a reschedule (globalIndexes stay below)
_INDEX_CRC_AT = INDEX_ENTRY_SIZE - 4


@cache
def _numpy() -> tuple[Any, Any]:
    """numpy and the delay index entry (codec._INDEX) as its columns, imported when a big second
    is first checked (not when a broker starts)."""
    import numpy

    dtype = numpy.dtype([("offset", "<u8"), ("size", "<u4"), ("local", "<u4"), ("gi", "<u4"), ("pre", "<i4"),
                         ("second", "<u2"), ("ms", "<u2"), ("crc", "<u4")])
    assert dtype.itemsize == INDEX_ENTRY_SIZE
    return numpy, dtype


@cache
def _crc_table() -> Any:
    """zlib's CRC-32 (reflected 0xEDB88320) byte table, as numpy uint32."""
    np, _dtype = _numpy()
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table.append(crc)
    return np.array(table, dtype=np.uint32)


def crc32_rows(rows: Any) -> Any:
    """``zlib.crc32`` of each row of a 2-D uint8 array, one table step per column for all rows
    at once (a big second's index entries are checked in a few ms, not one call per entry)."""
    np, _dtype = _numpy()
    table = _crc_table()
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for column in range(rows.shape[1]):
        crc = table[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


HOUR_FILE_SUFFIXES = (".log", ".idx", ".head", ".cancel")


def hour_file_stem(hour: int) -> str:
    return f"{hour:010d}"


class HourFiles:
    """Delay log + delay index + heads (+ cancel log) of one hour, mapped or not."""

    def __init__(self, directory: Path, hour: int, *, fsync: bool) -> None:
        self.hour = hour
        self._fsync = fsync
        stem = f"{directory}/{hour_file_stem(hour)}"  # plain strings: opened per far append
        self._paths = [stem + suffix for suffix in HOUR_FILE_SUFFIXES]
        self.log = Region(self._paths[0], fsync=fsync)
        self.idx = Region(self._paths[1], fsync=fsync)
        self.heads = Region(self._paths[2], fsync=fsync)
        self._cancel_path = self._paths[3]
        self._cancelled: set[int] | None = None
        self._moved: set[int] = set()
        self._cancel_fd = -1
        header = None
        if self.heads.file_size() >= HEAD_FILE_SIZE:
            header = HourHeader.decode(self.heads.read(0, HEADER_SIZE))
        if header is None or header.hour != hour:
            # New hour, or a lost/garbled head file: the index is the truth, rebuild from entry 0.
            self.heads.write(0, b"\0" * HEAD_FILE_SIZE)
            header = HourHeader(hour, 0, 0)
            self.heads.write(0, header.encode())
        self.header = header
        self._adopt_tail()

    # ------------------------------------------------------------------ recovery

    def _adopt_tail(self) -> None:
        gi, log_end = self.header.count, self.header.log_end
        while True:
            raw = self.idx.read(gi * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE)
            if len(raw) < INDEX_ENTRY_SIZE:
                break
            entry = decode_index_entry(raw)
            if entry is None or entry.global_index != gi:
                break
            try:
                decode_record(self.log.read(entry.offset, entry.size))
            except CorruptRecordError:
                break
            last, count = self.head(entry.second)
            applied = last == gi and count == entry.local_index + 1
            if not applied and not (last == entry.pre_global_index and count == entry.local_index):
                break
            self._set_head(entry.second, gi, entry.local_index + 1)
            gi, log_end = gi + 1, entry.offset + entry.size
        if gi != self.header.count:
            log.info("delay hour tail adopted", hour=self.hour, entries=gi - self.header.count)
            self.header = HourHeader(self.hour, gi, log_end)
            self.heads.write(0, self.header.encode())

    # ------------------------------------------------------------------ heads

    def head(self, second: int) -> tuple[int, int]:
        """(last globalIndex of the second or NO_ENTRY, entries in the second)."""
        last_plus_one, count, _ = self.heads.unpack(HEAD, HEADER_SIZE + second * HEAD_SIZE)
        return last_plus_one - 1, count

    def _set_head(self, second: int, last: int, count: int) -> None:
        self.heads.write(HEADER_SIZE + second * HEAD_SIZE, HEAD.pack(last + 1, count, 0))

    def nonempty_seconds(self) -> list[int]:
        raw = self.heads.read(HEADER_SIZE, SECONDS_PER_HOUR * HEAD_SIZE)
        return [s for s, (last_plus_one, _c, _r) in enumerate(HEAD.iter_unpack(raw)) if last_plus_one]

    def count_before(self, second: int) -> int:
        """Entries in the seconds of this hour before ``second``."""
        raw = self.heads.read(HEADER_SIZE, second * HEAD_SIZE)
        return sum(c for _l, c, _r in HEAD.iter_unpack(raw))

    # ------------------------------------------------------------------ append / read

    @property
    def count(self) -> int:
        return self.header.count

    def append(self, record: bytes, second: int, ms: int = 0) -> IndexEntry:
        last, count = self.head(second)
        gi, offset = self.header.count, self.header.log_end
        self.log.write(offset, record)
        entry = IndexEntry(offset, len(record), count, gi, last, second, ms)
        self.idx.write(gi * INDEX_ENTRY_SIZE, encode_index_entry(entry))
        self._set_head(second, gi, count + 1)
        self.header = HourHeader(self.hour, gi + 1, offset + len(record))
        self.heads.write(0, self.header.encode())
        if self._fsync:  # in write order; an unsynced tail is what _adopt_tail settles
            self.log.sync(offset, len(record))
            self.idx.sync(gi * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE)
            self.heads.sync(0, HEADER_SIZE + (second + 1) * HEAD_SIZE)
        return entry

    def entry(self, gi: int) -> IndexEntry:
        if not 0 <= gi < self.header.count:
            raise CorruptRecordError(f"hour {self.hour} has no delay index entry {gi} (count {self.header.count})")
        entry = decode_index_entry(self.idx.read(gi * INDEX_ENTRY_SIZE, INDEX_ENTRY_SIZE))
        if entry is None or entry.global_index != gi:
            raise CorruptRecordError(f"delay index entry {gi} of hour {self.hour} failed its CRC check")
        return entry

    def chain(self, second: int) -> list[IndexEntry]:
        """The second's entries in localIndex order, found by walking preGlobalIndex backwards.

        A big second (a burst) is walked in one read of the whole index instead of one read per
        entry."""
        gi, count = self.head(second)
        bulk = count > 64 and count * 16 >= self.header.count
        raw = self.idx.read(0, self.header.count * INDEX_ENTRY_SIZE) if bulk else b""
        entries: list[IndexEntry] = []
        while gi != NO_ENTRY:
            if bulk:
                entry = decode_index_entry(raw, gi * INDEX_ENTRY_SIZE) if 0 <= gi < self.header.count else None
                if entry is None or entry.global_index != gi:
                    raise CorruptRecordError(f"delay index entry {gi} of hour {self.hour} failed its CRC check")
            else:
                entry = self.entry(gi)
            if entry.second != second or entry.local_index != count - 1 - len(entries):
                raise CorruptRecordError(
                    f"delay index chain of hour {self.hour} second {second} is broken at entry {gi}"
                )
            entries.append(entry)
            gi = entry.pre_global_index
        if len(entries) != count:
            raise CorruptRecordError(f"hour {self.hour} second {second}: head says {count} entries, chain has {len(entries)}")
        entries.reverse()
        return entries

    def chain_rows(self, second: int) -> list[tuple[int, int, int, int, int]]:
        """The second's entries as (ms, localIndex, globalIndex, offset, size), in localIndex
        order; CorruptRecordError as :meth:`chain`.

        A big second (a burst, or a steady stream's second being preloaded) is checked
        column-wise: its entries, their CRCs, localIndex 0..count-1 and every preGlobalIndex
        pointing at the entry before - the chain :meth:`chain` walks. Only the part of the index
        from the second's first entry to its last is read (found by doubling a window back from
        the head), so preloading a second costs its own entries, not the hour's. When anything
        there does not hold, it walks the chain itself (same result or same error)."""
        columns = self.chain_columns(second)
        if columns is not None:
            return list(zip(*(column.tolist() for column in columns)))
        return [(e.ms, e.local_index, e.global_index, e.offset, e.size) for e in self.chain(second)]

    def chain_columns(self, second: int) -> tuple[Any, Any, Any, Any, Any] | None:
        """:meth:`chain_rows` of a big second as numpy columns (ms, localIndex, globalIndex,
        offset, size), checked as described there; None for a small second (64 entries or
        fewer: the walk is cheaper) or when a check fails (the walk then decides the error)."""
        last, count = self.head(second)
        if count <= 64 or not 0 <= last < self.header.count:
            return None
        np, index_dtype = _numpy()
        low = max(0, last + 1 - count)  # the second's entries are at most this dense
        while True:
            span = last + 1 - low
            raw = self.idx.read(low * INDEX_ENTRY_SIZE, span * INDEX_ENTRY_SIZE)
            if len(raw) < span * INDEX_ENTRY_SIZE:
                return None
            table = np.frombuffer(raw, dtype=index_dtype, count=span)
            picked = np.flatnonzero(table["second"] == second)
            if len(picked) >= count or low == 0:
                break
            low = max(0, last + 1 - 2 * span)
        if len(picked) != count:
            return None
        rows = table[picked]
        order = np.argsort(rows["local"], kind="stable")
        picked, rows = picked[order], rows[order]
        gis = picked + low
        entry_bytes = np.frombuffer(raw, dtype=np.uint8).reshape(span, INDEX_ENTRY_SIZE)
        if not (np.array_equal(rows["gi"], gis) and np.array_equal(rows["local"], np.arange(count))
                and int(rows["pre"][0]) == NO_ENTRY and np.array_equal(rows["pre"][1:], gis[:-1])
                and int(gis[-1]) == last and bool((rows["size"] > 0).all()) and bool((rows["ms"] < 1000).all())
                and np.array_equal(crc32_rows(entry_bytes[picked, :_INDEX_CRC_AT]), rows["crc"])):
            return None
        return rows["ms"], rows["local"], gis, rows["offset"], rows["size"]

    def scan_second(self, second: int) -> list[IndexEntry]:
        """The second's readable entries found by reading the whole index: the slow way round a
        broken chain, so one bad entry costs that entry and not the rest of its second."""
        raw = self.idx.read(0, self.header.count * INDEX_ENTRY_SIZE)
        found = []
        for gi in range(self.header.count):
            entry = decode_index_entry(raw, gi * INDEX_ENTRY_SIZE)
            if entry is not None and entry.global_index == gi and entry.second == second:
                found.append(entry)
        return sorted(found, key=lambda e: e.local_index)

    def record(self, entry: IndexEntry) -> StoredDelay:
        return decode_record(self.log.read(entry.offset, entry.size))

    def records(self, entries: Sequence[IndexEntry]) -> list[StoredDelay | None]:
        """The records of ``entries`` (same order; None for one that fails its checks)."""
        return self.records_at([entry.offset for entry in entries], [entry.size for entry in entries])

    def records_at(self, offsets: Sequence[int], sizes: Sequence[int]) -> list[StoredDelay | None]:
        """The records at ``offsets`` of ``sizes`` bytes (same order; None for one that fails its
        checks), read in runs of neighbouring records: one read per run instead of one per message."""
        out: list[StoredDelay | None] = [None] * len(offsets)
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        i = 0
        while i < len(order):
            start = offsets[order[i]]
            end = start + sizes[order[i]]
            j = i + 1
            while j < len(order):
                offset, size = offsets[order[j]], sizes[order[j]]
                if offset - end > _RUN_GAP or offset + size - start > _RUN_MAX:
                    break
                end = max(end, offset + size)
                j += 1
            raw = self.log.read(start, end - start)
            run = order[i:j]
            decoded = decode_records_at(raw, [offsets[k] - start for k in run], [sizes[k] for k in run])
            for k, stored in zip(run, decoded, strict=True):
                out[k] = stored
            i = j
        return out

    # ------------------------------------------------------------------ cancel log

    def cancelled(self) -> set[int]:
        """globalIndexes that will not be delivered here: cancelled, or moved to another entry."""
        if self._cancelled is None:
            try:
                with open(self._cancel_path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                raw = b""
            usable = len(raw) - len(raw) % _CANCEL.size
            words = [word for (word,) in _CANCEL.iter_unpack(raw[:usable])]
            self._cancelled = {word & ~_MOVED for word in words}
            self._moved = {word & ~_MOVED for word in words if word & _MOVED}
        return self._cancelled

    def moved(self) -> set[int]:
        """The cancelled globalIndexes whose message was rescheduled (it lives on in a new entry)."""
        self.cancelled()
        return self._moved

    def cancelled_count(self) -> int:
        if self._cancelled is not None:
            return len(self._cancelled)
        try:
            return os.stat(self._cancel_path).st_size // _CANCEL.size
        except FileNotFoundError:
            return 0

    def add_cancel(self, gi: int, *, moved: bool = False) -> None:
        """Record that entry ``gi`` is not to be delivered (``moved``: its message was rescheduled)."""
        done = self.cancelled()
        if self._cancel_fd < 0:
            self._cancel_fd = os.open(self._cancel_path, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(self._cancel_fd, _CANCEL.pack(gi | _MOVED if moved else gi), len(done) * _CANCEL.size)
        if self._fsync:
            os.fdatasync(self._cancel_fd)
        done.add(gi)
        if moved:
            self._moved.add(gi)

    # ------------------------------------------------------------------ mapping / lifetime

    @property
    def mapped(self) -> bool:
        return self.heads.mapped

    def map(self) -> None:
        self.heads.map(HEAD_FILE_SIZE)
        self.idx.map(max(_INDEX_PREALLOC, self.header.count * INDEX_ENTRY_SIZE * 2))
        self.log.map(max(_LOG_PREALLOC, self.header.log_end * 2))
        self.cancelled()

    def unmap(self) -> None:
        self.log.unmap(self.header.log_end)
        self.idx.unmap(self.header.count * INDEX_ENTRY_SIZE)
        self.heads.unmap(None)
        self._cancelled = None

    def close(self, *, sync: bool = True) -> None:
        self.log.close(self.header.log_end, sync=sync)
        self.idx.close(self.header.count * INDEX_ENTRY_SIZE, sync=sync)
        self.heads.close(None, sync=sync)
        if self._cancel_fd >= 0:
            if sync:
                os.fdatasync(self._cancel_fd)
            os.close(self._cancel_fd)
            self._cancel_fd = -1

    def delete(self) -> int:
        """Close and remove the hour's files; returns how many existed."""
        self.close(sync=False)
        removed = 0
        for path in self._paths:
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
        return removed
