"""Log shipping for store_mmap (the ReplicableStore half of the storage contract).

A master hands out raw byte ranges of its commit log (``read_log``): whole records, and the blank
filler that ends a segment. A slave with the same segment size writes them at the very same
offsets (``append_log``), after checking every record (magic, sizes, its own offset, both CRCs)
and that every filler ends where the slave's own segment ends; then it writes the consume-queue
entries and notes the keys for the index, exactly as an append does. So both sides hold the same
bytes, and ids, offsets and queries agree. ``truncate_log`` cuts the log back (a returning old
master), the way recovery cuts a torn tail.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Protocol, cast

from plugmq.core import CorruptRecordError, LogChunk, Prop, StoreError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.appender import Appender, IndexEntries
from plugmq.plugins.store_mmap.commitlog import CommitLog
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueues
from plugmq.plugins.store_mmap.flush import GroupCommit
from plugmq.plugins.store_mmap.indexfile import IndexService
from plugmq.plugins.store_mmap.record import BLANK, BLANK_MAGIC, END_FILE_MIN_BLANK, MESSAGE_MAGIC, Decoded, decode

__all__ = ["LOG_FORMAT_VERSION", "ReplicaLog"]

log = get_logger(__name__)

LOG_FORMAT_VERSION = 1

_Pending = tuple[str, str | None, str | None, int, int]


class _Record(Protocol):
    """The fields of a decoded record this module reads (``record.Decoded`` sets them in slots)."""

    total: int
    phys: int
    topic: str
    queue_id: int
    queue_offset: int
    tags_code: int
    store_ts: int
    props_raw: bytes

    def properties(self) -> dict[str, str]: ...


class _Parsed:
    """A checked chunk: the records to write and where each segment filler goes."""

    __slots__ = ("fillers", "records")

    def __init__(self) -> None:
        self.records: list[_Record] = []
        self.fillers: list[int] = []  # commit-log offsets of the blank markers


class ReplicaLog:
    """Mixed into MmapMessageStore: the attributes below are the store's own."""

    _cl: CommitLog
    _cqs: ConsumeQueues
    _index: IndexService
    _group: GroupCommit | None
    _put_lock: threading.Lock
    _derived_lock: threading.Lock
    _unindexed: list[_Pending]  # keys of records written outside the append kernel, not yet indexed
    _index_retry: list[IndexEntries]
    _appender: Appender
    _index_batch: int
    _index_unique: bool
    _sync: bool
    _closed: bool
    _replicated_messages: int
    _replicated_bytes: int
    _log_listener: Callable[[int], None] | None = None

    @abstractmethod
    def drain_index(self) -> int:
        """The store's: index every noted key."""

    @abstractmethod
    def _check_writable(self) -> None:
        """The store's: refuse writes when closed or the disk is full."""

    @abstractmethod
    def _write_checkpoint(self, derived_upto: int, ts: int) -> None:
        """The store's: record how far the commit log and derived files are durable."""

    # -- what a slave must share with its master ----------------------------------------------

    @property
    def log_format(self) -> str:
        return f"store_mmap/{LOG_FORMAT_VERSION} segment_size={self._cl.segment_size}"

    def log_min_offset(self) -> int:
        return self._cl.min_offset

    def log_end_offset(self) -> int:
        return self._cl.wrote

    def set_log_listener(self, listener: Callable[[int], None] | None) -> None:
        self._log_listener = listener

    # -- master side --------------------------------------------------------------------------

    def read_log(self, offset: int, max_bytes: int) -> LogChunk:
        if self._closed:
            raise StoreError("store_mmap is closed")
        cl = self._cl
        offset = max(offset, cl.min_offset)
        end = cl.wrote
        if offset >= end:
            if offset > end:
                raise StoreError(f"log offset {offset} is past the end of the commit log ({end})")
            return LogChunk(offset, b"", 0)
        seg = cl.segment_for(offset)
        if seg is None or not seg.acquire():
            raise StoreError(f"log offset {offset} is in no commit-log segment (removed meanwhile?)")
        try:
            mm = seg.mm
            begin = pos = offset - seg.start
            limit = min(seg.size, end - seg.start)
            records = 0
            while pos < limit:
                total, magic = BLANK.unpack_from(mm, pos)
                if magic == BLANK_MAGIC and total == seg.size - pos:
                    pos = seg.size  # the filler ends the segment and the chunk
                    break
                if magic != MESSAGE_MAGIC or total <= 0 or pos + total > limit:
                    raise StoreError(f"commit-log offset {seg.start + pos} is not the start of a record; "
                                     "replication must start at a record boundary")
                if records and pos + total - begin > max_bytes:
                    break
                pos += total
                records += 1
            return LogChunk(offset, bytes(mm[begin:pos]), records)
        finally:
            seg.release()

    # -- slave side ---------------------------------------------------------------------------

    def _parse_chunk(self, chunk: LogChunk, segment_end: int) -> _Parsed:
        """Check every record of ``chunk`` against this log's layout before anything is written."""
        parsed = _Parsed()
        data = chunk.data
        size = self._cl.segment_size
        pos, length = 0, len(data)
        while pos < length:
            phys = chunk.start + pos
            if length - pos >= BLANK.size:
                total, magic = BLANK.unpack_from(data, pos)
                if magic == BLANK_MAGIC:
                    if phys + total != segment_end or pos + total > length:
                        raise CorruptRecordError(
                            f"segment filler at {phys} ends at {phys + total}, but this slave's segment ends at "
                            f"{segment_end}; master and slave need the same commit_log_segment_size")
                    parsed.fillers.append(phys)
                    pos += total
                    segment_end += size
                    continue
            decoded = decode(data, pos, length - pos, phys)
            if decoded is None:
                raise CorruptRecordError(f"replicated record at commit-log offset {phys} is torn or damaged "
                                         f"(magic, size, offset or CRC check failed); the chunk was refused whole")
            rec = cast(_Record, decoded)
            if phys + rec.total + END_FILE_MIN_BLANK > segment_end:
                raise CorruptRecordError(f"replicated record at {phys} crosses this slave's segment end "
                                         f"{segment_end}; master and slave need the same commit_log_segment_size")
            parsed.records.append(rec)
            pos += rec.total
        return parsed

    def _check_queue_offsets(self, records: list[_Record]) -> None:
        expected: dict[tuple[str, int], int] = {}
        for rec in records:
            key = (rec.topic, rec.queue_id)
            want = expected.get(key)
            if want is None:
                cq = self._cqs.queues.get(key)
                # A queue without readable entries may start anywhere: its earlier messages are
                # older than this slave's log (a slave that started from the master's oldest record).
                want = rec.queue_offset if cq is None or cq.max_offset <= cq.min_offset else cq.max_offset
            if rec.queue_offset != want:
                raise CorruptRecordError(
                    f"replicated record at {rec.phys} has queue offset {rec.queue_offset} in {rec.topic}/"
                    f"{rec.queue_id}, but the slave's queue continues at {want}; the slave's store does not "
                    "hold the master's log (remove the slave's data to copy the master afresh)")
            expected[key] = want + 1

    def append_log(self, chunk: LogChunk) -> int:
        if not chunk.data:
            return self._cl.wrote
        self._check_writable()
        cl = self._cl
        with self._put_lock:
            if self._closed:
                raise StoreError("store_mmap is closed")
            end = cl.wrote
            adopt = chunk.start != end
            if adopt and end != cl.min_offset:
                raise StoreError(f"replicated chunk starts at {chunk.start} but this log ends at {end}; "
                                 "a slave takes the master's log only from its own end")
            assert cl.cur is not None
            # An empty log moves to where the master's log starts, once the chunk proved sound.
            segment_end = chunk.start + cl.segment_size if adopt else cl.cur.end
            parsed = self._parse_chunk(chunk, segment_end)
            self._check_queue_offsets(parsed.records)
            if adopt:
                cl.restart_at(chunk.start)
                log.info("empty store_mmap log adopts the master's start", start=chunk.start)
            self._make_room_for(parsed.records)
            self._write_parsed(chunk, parsed)
            new_end = cl.wrote
        if self._sync:
            cl.flush()
        listener = self._log_listener
        if listener is not None:
            listener(new_end)
        if len(self._unindexed) >= self._index_batch:
            self.drain_index()
        return new_end

    def _make_room_for(self, records: list[_Record]) -> None:
        """Under the put lock, before anything is written: disk blocks for every record and queue
        entry of the chunk, so a full disk refuses the whole chunk (StoreFullError), never SIGBUS."""
        self._cl.ensure_room([rec.total for rec in records])
        first: dict[tuple[str, int], tuple[int, int]] = {}
        for rec in records:
            key = (rec.topic, rec.queue_id)
            start, count = first.get(key, (rec.queue_offset, 0))
            first[key] = (start, count + 1)
        for (topic, queue_id), (start, count) in first.items():
            cq = self._cqs.queues.get((topic, queue_id)) or self._cqs.create(topic, queue_id)
            cq.prepare(start, count)

    def _write_parsed(self, chunk: LogChunk, parsed: _Parsed) -> None:
        """Under the put lock: copy the checked bytes in place, then the derived entries."""
        cl = self._cl
        data = chunk.data
        fillers = iter(parsed.fillers)
        next_filler = next(fillers, None)
        for rec in parsed.records:
            while next_filler is not None and next_filler < rec.phys:
                seg = cl.cur
                assert seg is not None
                cl.reserve(seg.end - cl.wrote)  # writes the same blank marker and rolls over
                next_filler = next(fillers, None)
            seg = cl.cur
            assert seg is not None
            pos = rec.phys - seg.start
            if pos + rec.total + END_FILE_MIN_BLANK > seg.allocated:
                cl.allocate(seg, pos + rec.total + END_FILE_MIN_BLANK)
            rel = rec.phys - chunk.start
            seg.mm[pos : pos + rec.total] = data[rel : rel + rec.total]
            cl.wrote = rec.phys + rec.total
            key = (rec.topic, rec.queue_id)
            cq = self._cqs.queues.get(key)
            if cq is None:
                cq = self._cqs.create(rec.topic, rec.queue_id)
            if cq.max_offset <= cq.min_offset and rec.queue_offset != cq.max_offset:
                cq.min_offset = cq.max_offset = rec.queue_offset
            cq.put(rec.queue_offset, rec.phys, rec.total, rec.tags_code)
            if rec.props_raw:
                props = rec.properties()
                keys = props.get(Prop.KEYS)
                uniq = props.get(Prop.UNIQ_KEY) if self._index_unique else None
                if keys or uniq:
                    self._unindexed.append((rec.topic, keys, uniq, rec.phys, rec.store_ts))
            appender = self._appender
            appender.last_ts = max(appender.last_ts, rec.store_ts)
            self._replicated_messages += 1
            self._replicated_bytes += rec.total
        if next_filler is not None:  # the chunk ends with a filler: roll over as the master did
            seg = cl.cur
            assert seg is not None
            cl.reserve(seg.end - cl.wrote)

    # -- cutting back -------------------------------------------------------------------------

    def _is_record_boundary(self, offset: int) -> bool:
        cl = self._cl
        if offset == cl.wrote or any(seg.start == offset for seg in cl.segments):
            return True
        return cl.read(offset) is not None

    def truncate_log(self, offset: int) -> int:
        if self._closed:
            raise StoreError("store_mmap is closed")
        cl = self._cl
        offset = max(offset, cl.min_offset)
        if offset >= cl.wrote:
            return 0
        if not self._is_record_boundary(offset):
            raise StoreError(f"commit-log offset {offset} is not the start of a record; cut only at a record boundary")
        doomed = [0]

        def count(_rec: Decoded) -> None:
            doomed[0] += 1

        with self._derived_lock, self._index.lock, self._put_lock, cl.flush_lock:
            cl.walk(offset, count, limit=cl.wrote)
            self._unindexed = [p for p in self._unindexed if p[3] < offset]
            hashes, offsets, stamps = self._appender.pending_entries(self._appender.take_pending())
            kept = offsets < offset
            self._index_retry.append((hashes[kept], offsets[kept], stamps[kept]))
            cl.allocator.discard_ready()
            cl.truncate(offset)
            cl.open_for_write(offset)
            for cq in self._cqs:
                cq.cut(offset)
                cq.min_offset = min(cq.min_offset, cq.max_offset)
                cq.flush(everything=True)
            self._index.cut(offset)
            self._index.indexed_upto = min(self._index.indexed_upto, offset)
            self._index.flush(everything=True)
            self._write_checkpoint(offset, self._appender.last_ts)
        log.warning("commit log cut back for replication", at=offset, records=doomed[0])
        return doomed[0]
