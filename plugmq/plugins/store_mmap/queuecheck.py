"""Consume-queue entries checked against the commit log, and damaged ones rebuilt from it.

An entry is sound when the record it points at has the record magic, the entry's size as its
total size, this queue's id and the entry's queue offset, its own position as physical offset,
and the entry's tag code. A flipped bit in an entry fails one of these; the entry is then
rewritten from the record the log holds for that queue offset, found by scanning the log between
the nearest sound entries around it - the commit log is the source of truth, so damage in a
consume-queue file never hides a message whose record is intact. An entry whose record is gone
too (damage in the log itself) stays unreadable, is logged and counted as lost.

Both steps run on the scan kernel (``scan.py``): the check looks at a whole file of entries per
call, the rebuild scans the log between the sound neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.consumequeue import ENTRY_SIZE, ConsumeQueue
from plugmq.plugins.store_mmap.scan import PHYS, QUEUE_ID, QUEUE_OFFSET, TAGS, TOPIC, TOTAL, LogScan, ScanKernel

if TYPE_CHECKING:
    from plugmq.plugins.store_mmap.commitlog import CommitLog

__all__ = ["bad_entries", "rebuild_entries"]

log = get_logger(__name__)


def bad_entries(cl: CommitLog, cq: ConsumeQueue, lo: int, hi: int, log_end: int, kernel: ScanKernel) -> list[int]:
    """Queue offsets in ``[lo, hi)`` whose entry does not match the record it points at (records
    end before ``log_end``)."""
    lo = max(lo, cq.min_offset)
    hi = min(hi, cq.max_offset)
    bad: list[int] = []
    if lo >= hi:
        return bad
    held = [s for s in cl.segments if s.acquire()]  # retention may drop a segment meanwhile
    try:
        segments: list[tuple[int, int, Any]] = [(s.start, s.size, s.mm) for s in held]
        while lo < hi:
            f = cq._file_for(lo)
            if f is None or not f.acquire():
                bad.extend(range(lo, hi))
                break
            try:
                base = lo - lo % cq.per_file
                count = min(hi, base + cq.per_file) - lo
                at = (lo - base) * ENTRY_SIZE
                entries = f.mm[at : at + count * ENTRY_SIZE]
            finally:
                f.release()
            ok = kernel.check_entries(entries, lo, cq.queue_id, log_end, segments)
            at = ok.find(0)
            while at >= 0:  # damage is rare: jump from one unsound entry to the next
                bad.append(lo + at)
                at = ok.find(0, at + 1)
            lo += count
    finally:
        for s in held:
            s.release()
    return bad


def _groups(offsets: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive queue offsets as [first, last] pairs."""
    runs: list[tuple[int, int]] = []
    for q in sorted(set(offsets)):
        if runs and runs[-1][1] == q - 1:
            runs[-1] = (runs[-1][0], q)
        else:
            runs.append((q, q))
    return runs


def rebuild_entries(
    cl: CommitLog,
    cq: ConsumeQueue,
    bad: list[int],
    log_end: int,
    scan: Callable[[int, int], LogScan],
    write: Callable[[Callable[[], None]], None],
) -> tuple[int, list[int]]:
    """Rewrite the ``bad`` entries of ``cq`` from the records the log holds for them.

    ``scan(begin, end)`` returns the sound records in ``[begin, end)`` of the log as rows
    (skipping damage); ``write(fn)`` runs ``fn`` where entries may be written (under the store's
    put lock). Returns how many entries were rewritten and the queue offsets whose record was
    not found.
    """
    repaired = 0
    lost: list[int] = []
    bad_set = set(bad)
    for first, last in _groups(bad):
        below = first - 1
        while below >= cq.min_offset and below in bad_set:
            below -= 1
        above = last + 1
        begin = cl.min_offset
        if below >= cq.min_offset:
            entry = cq.entry(below)
            if entry is not None:
                begin = entry[0] + entry[1]
        end = log_end
        if above < cq.max_offset:
            entry = cq.entry(above)
            if entry is not None and entry[0] > begin:
                end = entry[0]
        found_scan = scan(begin, end)
        rows = found_scan.rows
        if cq.topic in found_scan.topics:
            number = found_scan.topics.index(cq.topic)
            rows = rows[(rows[:, TOPIC] == number) & (rows[:, QUEUE_ID] == cq.queue_id)
                        & (rows[:, QUEUE_OFFSET] >= first) & (rows[:, QUEUE_OFFSET] <= last)]
        else:
            rows = rows[:0]
        found = {int(r[QUEUE_OFFSET]): (int(r[PHYS]), int(r[TOTAL]), int(r[TAGS])) for r in rows}

        def put(found: dict[int, tuple[int, int, int]] = found) -> None:
            for qoff, (phys, total, tags) in found.items():
                cq.put(qoff, phys, total, tags)

        write(put)
        repaired += len(found)
        lost.extend(q for q in range(first, last + 1) if q not in found)
    return repaired, lost
