"""The commit log: every record of every topic, appended to fixed-size mapped segment files.

Segments are named by their 20-digit start offset. The next segment is created ahead of time by
a background thread (:class:`SegmentAllocator`), so a roll-over rarely waits for file creation.
All writes happen under the store's put lock; reads go through reference-counted segments and
only see records below ``wrote`` (the position the put lock publishes after a record is complete).
"""

from __future__ import annotations

import bisect
import mmap
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from plugmq.core import StoredMessage, StoreError
from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.layout import CQ_ENTRY
from plugmq.plugins.store_mmap.mapped_file import MappedFile, fsync_dir, offset_name
from plugmq.plugins.store_mmap.record import (
    BLANK,
    BLANK_MAGIC,
    BORN_HOST_PROPERTY,
    END_FILE_MIN_BLANK,
    Decoded,
    decode,
)
from plugmq.plugins.store_mmap.scan import STORED_SETTERS, STORED_TYPE, ScanKernel

__all__ = ["ALLOCATION_CHUNK", "CommitLog", "SegmentAllocator"]

log = get_logger(__name__)

_NAME = re.compile(r"\d{20}")
#: Bytes a bulk read asks the kernel to read ahead of a run (MADV_WILLNEED).
_READ_AHEAD = 8 << 20
#: Bytes of a segment given blocks at a time ahead of the writes (fewer posix_fallocate calls).
ALLOCATION_CHUNK = 16 << 20


class SegmentAllocator:
    """Creates the next commit-log segment on a background thread (RocketMQ's AllocateMappedFileService)."""

    def __init__(self, directory: Path, size: int, *, warm: bool, enabled: bool) -> None:
        self._dir = directory
        self._size = size
        self._warm = warm
        self._enabled = enabled
        self._cond = threading.Condition()
        self._wanted: int | None = None
        self._busy: int | None = None
        self._ready: dict[int, MappedFile] = {}
        self._stopped = False
        self.waits = 0  # roll-overs that had to create the file themselves
        self._thread: threading.Thread | None = None
        if enabled:
            self._thread = threading.Thread(target=self._run, name="store_mmap-allocate", daemon=True)
            self._thread.start()

    def _create(self, start: int, reserve: int = ALLOCATION_CHUNK) -> MappedFile:
        return MappedFile.create(self._dir / offset_name(start), start, self._size, reserve=reserve,
                                 warm=self._warm, sync_dir=True)

    def request(self, start: int) -> None:
        if not self._enabled:
            return
        with self._cond:
            if start in self._ready or self._busy == start or self._stopped:
                return
            self._wanted = start
            self._cond.notify_all()

    def take(self, start: int, *, rolling: bool = True) -> MappedFile:
        """The segment starting at ``start``: the pre-allocated one, or created now (counted as a
        wait when a roll-over had to do it). StoreFullError when the disk has no room for it."""
        with self._cond:
            while self._busy == start:
                self._cond.wait()
            made = self._ready.pop(start, None)
            if self._wanted == start:
                self._wanted = None
        if made is not None:
            return made
        if rolling:
            self.waits += 1
        return self._create(start)

    def prepare(self, start: int, need: int) -> None:
        """Create the segment starting at ``start`` now unless it is ready, with its first
        ``need`` bytes allocated (StoreFullError when the disk has no room), so a later ``take``
        and the writes into it cannot fail."""
        with self._cond:
            while self._busy == start:
                self._cond.wait()
            made = self._ready.get(start)
            if self._wanted == start:
                self._wanted = None  # made here: the background thread must not make it at the same time
        if made is None:
            made = self._create(start)
            with self._cond:
                self._ready[start] = made
        made.reserve(need, ALLOCATION_CHUNK)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                start = self._wanted
                assert start is not None
                self._wanted = None
                self._busy = start
            made: MappedFile | None = None
            try:
                if not (self._dir / offset_name(start)).exists():
                    # Blocks come with the first write: a segment made ahead costs no disk until used.
                    made = self._create(start, reserve=0)
            except (OSError, StoreError) as exc:
                # Not fatal: the roll-over tries again and refuses the append if there is still no room.
                log.warning("pre-allocating the next commit-log segment failed", start=start, error=str(exc))
            with self._cond:
                if made is not None:
                    for old in [k for k in self._ready if k < start]:
                        self._ready.pop(old).destroy()
                    self._ready[start] = made
                self._busy = None
                self._cond.notify_all()

    def discard_ready(self) -> None:
        """Delete every pre-allocated segment (the log is cut back or moved: they would start at
        the wrong offset); waits for a file being created."""
        with self._cond:
            while self._busy is not None:
                self._cond.wait()
            self._wanted = None
            for made in self._ready.values():
                made.destroy()
            self._ready.clear()

    def close(self) -> None:
        """Stop the thread; a pre-allocated file stays on disk (recovery removes empty tails)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            for made in self._ready.values():
                made.close()
            self._ready.clear()


class CommitLog:
    """Segments plus the write and flush positions (global byte offsets)."""

    def __init__(self, directory: Path, segment_size: int, *, warm: bool = False, preallocate: bool = True) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self._segments: tuple[MappedFile, ...] = ()
        self._starts: tuple[int, ...] = ()
        self.cur: MappedFile | None = None
        self.wrote = 0  # where the next record goes; everything below is complete
        self.flushed = 0  # everything below is durable
        self.flush_lock = threading.Lock()
        self.flush_count = 0
        self.regrown: list[int] = []  # starts of segments load() found truncated and grew back
        self.flush_seconds = 0.0  # time spent in flushes that wrote something (metrics: mean flush latency)
        self.allocator = SegmentAllocator(directory, segment_size, warm=warm, enabled=preallocate)
        self._asked_ahead: dict[int, int] = {}  # segment start -> segment-relative end asked for (read_many)

    # -- segments -----------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[MappedFile, ...]:
        return self._segments

    def load(self) -> None:
        """Map the existing segment files and check that they are contiguous.

        A segment shorter than its successor's name says (truncated by a crash of the file system
        or by hand) is grown back to that size, zero-filled: recovery then cuts or skips what was
        lost instead of refusing to start. A gap the size of a whole segment or more (a missing
        file) is still refused: that is not something to guess about."""
        for leftover in self.dir.glob("*.tmp"):
            leftover.unlink()
        names = sorted(p.name for p in self.dir.iterdir() if _NAME.fullmatch(p.name))
        sizes = [(self.dir / name).stat().st_size for name in names]
        native = max([self.segment_size, *sizes])
        if names and sizes[-1] == 0:
            # An empty newest file holds nothing; it is re-created when needed.
            log.warning("empty newest commit-log segment removed", segment=names[-1])
            (self.dir / names.pop()).unlink()
            sizes.pop()
        self.regrown = []
        segments: list[MappedFile] = []
        try:
            for i, name in enumerate(names):
                start = int(name)
                want = None
                if i + 1 < len(names):
                    room = int(names[i + 1]) - start
                    if sizes[i] < room <= native:
                        want = room
                seg = MappedFile.open(self.dir / name, start, size=want)
                if want is not None:
                    log.error("truncated commit-log segment grown back to its size; what it lost is cut or "
                              "skipped by recovery", segment=name, had_bytes=sizes[i], size=want)
                    self.regrown.append(start)
                if segments and segments[-1].end != seg.start:
                    prev = segments[-1]
                    segments.append(seg)
                    raise StoreError(
                        f"commit log {self.dir} has a gap: {prev.path.name} ends at {prev.end} but the next file "
                        f"starts at {seg.start}; a segment file is missing or has the wrong size (restore it from "
                        "a backup, or move the files after the gap away to keep the log before it)"
                    )
                segments.append(seg)
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        self._set_segments(segments)
        if segments:
            self.wrote = self.flushed = segments[0].start

    def _set_segments(self, segments: list[MappedFile]) -> None:
        # Readers take a snapshot without locks, so the tuples are replaced, never mutated.
        self._segments = tuple(segments)
        self._starts = tuple(s.start for s in segments)

    def segment_for(self, offset: int) -> MappedFile | None:
        segments, starts = self._segments, self._starts
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0 or i >= len(segments):
            return None
        seg = segments[i]
        return seg if offset < seg.end else None

    @property
    def min_offset(self) -> int:
        segments = self._segments
        return segments[0].start if segments else self.wrote

    def open_for_write(self, position: int) -> None:
        """Set the write position (after recovery) and make sure a segment holds it.

        On a full disk the store still opens: if the segment for ``position`` cannot be created,
        the last segment stays current (full), and the first append tries again (StoreFullError
        until there is room)."""
        self.wrote = self.flushed = position
        seg = self.segment_for(position)
        if seg is None:
            try:
                seg = self.allocator.take(position, rolling=False)
            except StoreFullError:
                if not self._segments or self._segments[-1].end != position:
                    raise
                log.warning("no room for the next commit-log segment; appends are refused until space is freed",
                            start=position)
                self.cur = self._segments[-1]
                return
            self._set_segments([*list(self._segments), seg])
        self.cur = seg
        self.allocator.request(seg.end)

    def allocate(self, seg: MappedFile, upto: int) -> None:
        """Before a write reaches byte ``upto`` of ``seg``: give it blocks (StoreFullError)."""
        seg.reserve(upto, ALLOCATION_CHUNK)

    def ensure_room(self, sizes: list[int]) -> None:
        """Under the put lock, before a batch writes anything: allocate every byte the records of
        ``sizes`` will take, creating the segments they roll into (StoreFullError if the disk has
        no room), so a batch is never cut short half-way by a full disk. One reservation per
        segment touched (to the furthest byte the batch needs in it), not one per record."""
        cur = self.cur
        assert cur is not None
        pos = self.wrote - cur.start
        size, start = cur.size, cur.start
        end = pos + sum(sizes) + END_FILE_MIN_BLANK
        if end <= size:  # the common case, the batch fits the segment: what the loop below gives, in C
            if sizes:
                self._reserve_in(cur, start, end)
            return
        seg: MappedFile | None = cur  # None once the records roll into segments yet to be made
        need = 0  # furthest byte (exclusive) the batch needs in the segment at ``start``
        for total in sizes:
            if pos + total + END_FILE_MIN_BLANK > size:
                self._reserve_in(seg, start, max(need, min(size, pos + END_FILE_MIN_BLANK)))  # + the blank marker
                start, pos, size, seg, need = start + size, 0, self.segment_size, None, 0
            pos += total
            need = pos + END_FILE_MIN_BLANK
        if need:
            self._reserve_in(seg, start, need)

    def _reserve_in(self, seg: MappedFile | None, start: int, need: int) -> None:
        if seg is not None:
            seg.reserve(need, ALLOCATION_CHUNK)
        else:
            self.allocator.prepare(start, need)

    def restart_at(self, position: int) -> None:
        """Under the put lock, for a log holding no record: drop its segments and start it anew
        at ``position`` (a slave whose master's oldest record is there)."""
        self.allocator.discard_ready()
        for seg in self._segments:
            seg.destroy()
        self._set_segments([])
        fsync_dir(self.dir)
        self.open_for_write(position)

    def reserve(self, total: int) -> tuple[MappedFile, int]:
        """Under the put lock: the segment and in-file position for a record of ``total`` bytes,
        rolling to a new segment (after writing the blank filler) when it does not fit."""
        cur = self.cur
        assert cur is not None
        pos = self.wrote - cur.start
        if pos + total + END_FILE_MIN_BLANK > cur.size:
            # The next segment first: a full disk refuses the append before anything is written.
            nxt = self.allocator.take(cur.end)
            if pos + BLANK.size <= cur.size:
                cur.reserve(pos + BLANK.size)
                BLANK.pack_into(cur.mm, pos, cur.size - pos, BLANK_MAGIC)
            cur = nxt
            self._set_segments([*list(self._segments), cur])
            self.cur = cur
            self.wrote = cur.start
            self.allocator.request(cur.end)
            pos = 0
        return cur, pos

    @property
    def max_record(self) -> int:
        return self.segment_size - END_FILE_MIN_BLANK

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int) -> Decoded | None:
        seg = self.segment_for(offset)
        if seg is None or not seg.acquire():
            return None
        try:
            limit = min(seg.size - END_FILE_MIN_BLANK, self.wrote - seg.start)
            pos = offset - seg.start
            if pos >= limit:
                return None
            return decode(seg.mm, pos, limit - pos, offset)
        finally:
            seg.release()

    def read_many(self, offsets: list[int], kernel: ScanKernel) -> list[StoredMessage | None]:
        """The message at each of ``offsets`` (None where :meth:`read` finds none), decoded by the
        kernel's ``read_records`` in one call over the segments the run spans."""
        if not offsets:
            return []
        held, spans = self._hold(min(offsets), max(offsets))
        try:
            return kernel.read_records(offsets, spans, STORED_TYPE, STORED_SETTERS, BORN_HOST_PROPERTY)
        finally:
            for seg in held:
                seg.release()

    def read_run(self, entries: bytes, first_qoff: int, queue_id: int, topic: bytes,
                 kernel: ScanKernel) -> list[StoredMessage] | None:
        """The messages of a run of one queue's 20-byte consume-queue entries (queue offsets from
        ``first_qoff``) in one kernel call (``read_run``), or None where a record is not exactly
        what its entry says. The run's records lie between its first and last entry's offsets
        (a queue's records follow each other in the log); entries that do not are not exact."""
        whole = len(entries) - len(entries) % CQ_ENTRY.size
        if not whole:
            return []
        first = CQ_ENTRY.unpack_from(entries, 0)[0]
        last = CQ_ENTRY.unpack_from(entries, whole - CQ_ENTRY.size)[0]
        held, spans = self._hold(first, last)
        try:
            return kernel.read_run(entries, first_qoff, queue_id, topic, spans, STORED_TYPE, STORED_SETTERS,
                                   BORN_HOST_PROPERTY)
        finally:
            for seg in held:
                seg.release()

    def _hold(self, low: int, high: int) -> tuple[list[MappedFile], list[tuple[int, int, int, mmap.mmap]]]:
        """The segments holding log offsets ``low`` to ``high``, each acquired (the caller releases
        them), and their ``(start, end, readable limit, mapping)`` for a kernel; reading ahead asked."""
        starts = self._starts
        first = max(bisect.bisect_right(starts, low) - 1, 0)
        held = [seg for seg in self._segments[first:bisect.bisect_right(starts, high)] if seg.acquire()]
        wrote = self.wrote
        if held:
            self._ask_ahead(held[-1], high - held[-1].start, wrote - held[-1].start)
        return held, [(seg.start, seg.end, min(seg.size - END_FILE_MIN_BLANK, wrote - seg.start), seg.mm)
                      for seg in held]

    def _ask_ahead(self, seg: MappedFile, rel: int, written: int) -> None:
        """Ask the kernel to read the next stretch after a run (``MADV_WILLNEED``, asynchronous)
        while this one is decoded: a reader behind the writer reads pages that left the cache,
        and a page fault alone reads 128 KiB at a time, synchronously. Asked again when the reader
        is past half the stretch; pages in the cache cost the call a lookup each."""
        asked = self._asked_ahead.get(seg.start, 0)
        if asked - _READ_AHEAD <= rel < asked - _READ_AHEAD // 2:
            return  # well inside what was asked for
        begin = asked if asked - _READ_AHEAD // 2 <= rel <= asked else rel
        begin -= begin % mmap.PAGESIZE
        end = min(rel + _READ_AHEAD, written, seg.size)
        if end <= begin:
            return
        if len(self._asked_ahead) > 64:
            self._asked_ahead.clear()  # segments retention removed
        self._asked_ahead[seg.start] = end
        try:
            seg.mm.madvise(mmap.MADV_WILLNEED, begin, end - begin)
        except (OSError, ValueError):
            pass  # advice only (a mapping closed meanwhile, a platform without it)

    def store_timestamp(self, offset: int) -> int | None:
        """The store timestamp of the record at ``offset`` (checked), for time searches."""
        rec = self.read(offset)
        return None if rec is None else rec.store_ts

    def walk(self, begin: int, visit: Callable[[Decoded], None] | None = None, limit: int | None = None) -> int:
        """Validate records from ``begin`` (a record boundary) on, calling ``visit`` for each valid
        one; return the offset of the first invalid or missing record (the end of the log), or
        the first boundary at or past ``limit``."""
        seg = self.segment_for(begin)
        if seg is None:
            return begin
        pos = begin - seg.start
        # Never read past the segment's last stretch of data: a hole holds no record, and on tmpfs
        # reading one through the mapping allocates a page - SIGBUS on a full file system.
        readable = min(seg.data_end(), seg.size - END_FILE_MIN_BLANK)
        while True:
            if limit is not None and seg.start + pos >= limit:
                return seg.start + pos
            if pos + BLANK.size <= min(seg.size, readable + END_FILE_MIN_BLANK):
                total, magic = BLANK.unpack_from(seg.mm, pos)
                if magic == BLANK_MAGIC and total == seg.size - pos:
                    nxt = self.segment_for(seg.end)
                    if nxt is None:
                        return seg.end
                    seg, pos = nxt, 0
                    readable = min(seg.data_end(), seg.size - END_FILE_MIN_BLANK)
                    continue
            rec = decode(seg.mm, pos, readable - pos, seg.start + pos)
            if rec is None:
                return seg.start + pos
            if visit is not None:
                visit(rec)
            pos += rec.total

    def truncate(self, end: int) -> int:
        """Cut the log at ``end``: zero the rest of its segment, delete later segments.
        Returns how many bytes held data past ``end`` (0 for a clean tail)."""
        keep: list[MappedFile] = []
        removed = False
        cut = 0
        for seg in self._segments:
            if seg.start > end:
                if not seg.is_zero(0):
                    cut += seg.size
                seg.destroy()
                removed = True
                continue
            if seg.start <= end < seg.end:
                zeroed = seg.zero(end - seg.start)
                if zeroed:
                    cut += zeroed
                    seg.flush()
            keep.append(seg)
        self._set_segments(keep)
        if removed:
            fsync_dir(self.dir)
        if cut:
            log.warning("commit log tail cut", at=end, bytes_with_data=cut)
        return cut

    def detach_first(self, seg: MappedFile) -> None:
        """Retention: take the oldest segment out of the log; the caller destroys it (readers
        holding a reference keep their mapping until they release it)."""
        segments = list(self._segments)
        if not segments or segments[0] is not seg or seg is self.cur:
            raise StoreError(f"only the oldest, inactive commit-log segment can be removed, not {seg.path.name}")
        self._set_segments(segments[1:])

    # -- flushing -----------------------------------------------------------------------------

    def flush(self, deadline: float | None = None) -> bool:
        """Make everything below ``wrote`` durable. With a ``deadline`` (time.monotonic), give up
        (False) if another flush holds the lock past it."""
        if deadline is None:
            self.flush_lock.acquire()
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.flush_lock.acquire(timeout=remaining):
                return False
        try:
            target = self.wrote
            if target > self.flushed:
                started = time.perf_counter()
                for seg in self._segments:
                    if seg.end <= self.flushed or seg.start >= target:
                        continue
                    if seg.acquire():
                        try:
                            seg.flush()
                        finally:
                            seg.release()
                self.flushed = target
                self.flush_count += 1
                self.flush_seconds += time.perf_counter() - started
            return True
        finally:
            self.flush_lock.release()

    def close(self) -> None:
        self.allocator.close()
        for seg in self._segments:
            seg.close()
        self._set_segments([])
        self.cur = None
