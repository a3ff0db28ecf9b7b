"""Consume-queue entries checked against the commit log, and damaged ones rebuilt from it.

An entry is sound when the record it points at has the record magic, the entry's size as its
total size, this queue's id and the entry's queue offset, its own position as physical offset,
and the entry's tag code. A flipped bit in an entry fails one of these; the entry is then
rewritten from the record the log holds for that queue offset, found by scanning the log between
the nearest sound entries around it - the commit log is the source of truth, so damage in a
consume-queue file never hides a message whose record is intact. An entry whose record is gone
too (damage in the log itself) stays unreadable, is logged and counted as lost.

The check is vectorised with numpy (the header fields of a whole file of entries are gathered at
once); rebuilding decodes records one by one, but only between the sound neighbours.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueue
from plugmq.plugins.store_mmap.record import HEAD, HEADER_SIZE, MESSAGE_MAGIC, Decoded

if TYPE_CHECKING:
    from plugmq.plugins.store_mmap.commitlog import CommitLog

__all__ = ["bad_entries", "rebuild_entries"]

log = get_logger(__name__)

_CHUNK = 16_384  # entries gathered per numpy step (bounds the temporary index arrays)
_ENTRY = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])


def _field_offsets() -> dict[str, int]:
    """Byte offsets of the header fields the check reads, derived from the record layout."""
    codes = HEAD.format.lstrip("<>!=@")
    wanted = {0: "total", 1: "magic", 4: "queue_id", 6: "queue_offset", 7: "phys", 15: "tags"}
    offsets: dict[str, int] = {}
    index = 0
    pos = 0
    i = 0
    while i < len(codes):
        count = ""
        while codes[i].isdigit():
            count += codes[i]
            i += 1
        code = codes[i]
        i += 1
        size = struct.calcsize(f">{count}{code}")
        if index in wanted:
            offsets[wanted[index]] = pos
        pos += size
        index += 1
    return offsets


_AT = _field_offsets()
_HEADER = np.dtype({
    "names": ["total", "magic", "queue_id", "queue_offset", "phys", "tags"],
    "formats": [">i4", ">u4", ">i4", ">i8", ">i8", ">i8"],
    "offsets": [_AT["total"], _AT["magic"], _AT["queue_id"], _AT["queue_offset"], _AT["phys"], _AT["tags"]],
    "itemsize": HEADER_SIZE,
})
_SPAN = np.arange(HEADER_SIZE, dtype=np.int64)


def bad_entries(cl: CommitLog, cq: ConsumeQueue, lo: int, hi: int, log_end: int) -> list[int]:
    """Queue offsets in ``[lo, hi)`` whose entry does not match the record it points at (records
    end before ``log_end``)."""
    lo = max(lo, cq.min_offset)
    hi = min(hi, cq.max_offset)
    bad: list[int] = []
    while lo < hi:
        f = cq._file_for(lo)
        if f is None or not f.acquire():
            bad.extend(range(lo, hi))
            break
        try:
            base = lo - lo % cq.per_file
            count = min(hi, base + cq.per_file) - lo
            raw = np.frombuffer(f.mm, dtype=_ENTRY, count=count, offset=(lo - base) * _ENTRY.itemsize)
            entries = raw.copy()
            del raw
        finally:
            f.release()
        for first in range(0, count, _CHUNK):
            part = entries[first : first + _CHUNK]
            ok = _check(cl, part, cq.queue_id, lo + first, log_end)
            bad.extend(int(q) for q in np.flatnonzero(~ok) + lo + first)
        lo += count
    return bad


def _check(cl: CommitLog, entries: np.ndarray, queue_id: int, first_qoff: int, log_end: int) -> np.ndarray:
    phys = entries["phys"].astype(np.int64)
    size = entries["size"].astype(np.int64)
    qoffs = np.arange(first_qoff, first_qoff + len(entries), dtype=np.int64)
    ok = np.zeros(len(entries), dtype=bool)
    segments = cl.segments
    if not segments:
        return ok
    starts = np.array([s.start for s in segments], dtype=np.int64)
    which = np.searchsorted(starts, phys, side="right") - 1
    readable = (which >= 0) & (size >= HEADER_SIZE) & (phys + size <= log_end)
    for i in np.unique(which[readable]):
        seg = segments[int(i)]
        pick = np.flatnonzero(readable & (which == i))
        rel = phys[pick] - seg.start
        inside = rel + np.maximum(size[pick], HEADER_SIZE) <= seg.size
        pick, rel = pick[inside], rel[inside]
        if not pick.size or not seg.acquire():
            continue
        try:
            buf = np.frombuffer(seg.mm, dtype=np.uint8)
            head = buf[rel[:, None] + _SPAN].view(_HEADER).reshape(-1)
            del buf
        finally:
            seg.release()
        ok[pick] = ((head["magic"] == MESSAGE_MAGIC) & (head["total"] == size[pick])
                    & (head["queue_id"] == queue_id) & (head["queue_offset"] == qoffs[pick])
                    & (head["phys"] == phys[pick]) & (head["tags"] == entries["tags"][pick]))
    return ok


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
    scan: Callable[[int, int, Callable[[Decoded], None]], None],
    write: Callable[[Callable[[], None]], None],
) -> tuple[int, list[int]]:
    """Rewrite the ``bad`` entries of ``cq`` from the records the log holds for them.

    ``scan(begin, end, visit)`` visits the sound records in ``[begin, end)`` of the log (skipping
    damage); ``write(fn)`` runs ``fn`` where entries may be written (under the store's put lock).
    Returns how many entries were rewritten and the queue offsets whose record was not found.
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
        found: dict[int, tuple[int, int, int]] = {}

        def visit(rec: Decoded, first: int = first, last: int = last, found: dict[int, tuple[int, int, int]] = found) -> None:
            if rec.topic == cq.topic and rec.queue_id == cq.queue_id and first <= rec.queue_offset <= last:
                found[rec.queue_offset] = (rec.phys, rec.total, rec.tags_code)

        scan(begin, end, visit)

        def put(found: dict[int, tuple[int, int, int]] = found) -> None:
            for qoff, (phys, total, tags) in found.items():
                cq.put(qoff, phys, total, tags)

        write(put)
        repaired += len(found)
        lost.extend(q for q in range(first, last + 1) if q not in found)
    return repaired, lost
