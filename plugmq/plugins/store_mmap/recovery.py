"""Opening a store: find the true end of the commit log and bring consume queues and index in line.

1. Load the segments. One shorter than its successor's name says (truncated) is grown back to
   its size, zero-filled, and checked from its start: what it lost is cut (newest segment) or
   skipped (an older one); an empty newest file is dropped.
2. Choose where to start checking records: at the oldest offset any checkpointed part (commit
   log, consume queues, index) vouches for - RocketMQ's checkpoint - or at the start of the log
   without a readable checkpoint. After a clean shutdown (no abort file: RocketMQ's abort file)
   that is the end of the log, so nothing is re-read however large the log: every record was
   checked when it was written and is checked again by every read, and a read that finds damage
   repairs its queue (``repair_queue``). ``recover_check_segments`` > 0 re-reads that many newest
   segments after a clean shutdown too (RocketMQ re-checks its last three files).
3. Walk the records from there (magic, sizes, offset, both CRCs). An unsound record followed by
   sound ones (found by their magic, then checked whole) is damage: skipped, logged and counted.
   The first unsound record nothing sound follows is the end: everything after it is zeroed and
   later segments are deleted - a torn tail is cut.
4. Consume queues and index drop entries at or past the offset they were durable to (or past the
   end), and the records from that offset to the end are dispatched to them again. A missing
   ``consumequeue`` or ``index`` directory makes that offset the start of the log: a full rebuild.
5. After an unclean stop (or any damage found) every consume-queue entry is checked against the
   record it points at; damaged entries are rebuilt from the log (``queuecheck``). The same repair
   runs later on any read miss (``MmapMessageStore.repair_queue``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.appender import IndexEntries
from plugmq.plugins.store_mmap.checkpoint import CheckpointData
from plugmq.plugins.store_mmap.commitlog import CommitLog
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueue, ConsumeQueues
from plugmq.plugins.store_mmap.indexfile import IndexService
from plugmq.plugins.store_mmap.queuecheck import bad_entries, rebuild_entries
from plugmq.plugins.store_mmap.scan import (
    PHYS,
    QUEUE_ID,
    QUEUE_OFFSET,
    TAGS,
    TOPIC,
    TOTAL,
    Damage,
    LogScan,
    ScanKernel,
    scan_log,
)

__all__ = ["Damage", "Recovered", "RecoveryReport", "recover", "repair_queue"]

log = get_logger(__name__)


@attrs.frozen
class RecoveryReport:
    """What opening the store found and did (logged, and kept as ``store.recovery``)."""

    crashed: bool
    checkpoint_valid: bool
    checked_from: int
    end: int
    cut_bytes: int
    consume_queue_from: int
    index_from: int
    redispatched: int
    last_store_ts: int
    regrown_segments: int = 0  # truncated segments grown back to their size (their lost tail cut)
    records_cut: int = 0  # messages whose consume-queue entries pointed into the cut tail
    damaged_ranges: int = 0  # unsound stretches skipped because sound records follow them
    damaged_bytes: int = 0
    queue_entries_checked: int = 0  # consume-queue entries checked against the log (unclean stop)
    queue_entries_repaired: int = 0
    queue_entries_lost: int = 0  # entries whose record is gone from the log too


@attrs.define
class Recovered:
    report: RecoveryReport
    unindexed: IndexEntries | None  # index entries the index had no room for (a full disk)
    lost_entries: dict[tuple[str, int], set[int]]  # queue -> offsets whose record is gone


def recover(
    cl: CommitLog,
    cqs: ConsumeQueues,
    index: IndexService,
    checkpoint: CheckpointData | None,
    *,
    crashed: bool,
    check_segments: int,
    index_unique_id: bool,
    kernel: ScanKernel,
) -> Recovered:
    cl.load()
    cq_complete = cqs.load()
    index_complete = index.load()
    segments = cl.segments
    first = segments[0].start if segments else 0
    last_end = segments[-1].end if segments else 0

    def clamp(offset: int) -> int:
        return max(first, min(offset, last_end))

    written = {(cq.topic, cq.queue_id): cq.newest_written() for cq in cqs}  # before anything is cut
    check_from = _check_from(cl, checkpoint, written, crashed=crashed, check_segments=check_segments, clamp=clamp)

    checked = scan_log(cl, kernel, check_from)
    end, damage = checked.end, checked.damage
    last_ts = checked.last_ts if checked.count else (checkpoint.commit_log_ts if checkpoint else 0)
    for bad in damage:
        log.error("damaged commit-log records skipped; later records are intact", start=bad.start, end=bad.end,
                  bytes=bad.end - bad.start)
    cut = cl.truncate(end)

    if checkpoint is not None:
        cq_from = min(end, clamp(checkpoint.consume_queue_offset))
        index_from = min(end, clamp(checkpoint.index_offset))
    else:
        cq_from = index_from = first
    if not cq_complete:
        cq_from = first
    if not index_complete:
        index_from = first

    for cq in cqs:
        cq.cut(cq_from)
    index.cut(index_from)

    redispatched, unindexed, dispatched_ts = _redispatch(cl, cqs, index, kernel, cq_from, index_from, end,
                                                         index_unique_id=index_unique_id)
    if dispatched_ts is not None:
        last_ts = dispatched_ts
    records_cut = _count_cut_records(cqs, written, first)

    entries_checked = 0
    lost: dict[tuple[str, int], set[int]] = {}
    repaired = 0
    if crashed or not cq_complete or cl.regrown or damage:
        entries_checked, repaired, lost = _check_queue_entries(cl, cqs, end, kernel)
    # What recovery wrote into queues and index is not flushed here: the store's checkpoint keeps
    # saying they are durable only up to consume_queue_from / index_from until the flush thread's
    # first round has flushed them (start-up does not wait for that I/O).
    report = RecoveryReport(
        crashed=crashed,
        checkpoint_valid=checkpoint is not None,
        checked_from=check_from,
        end=end,
        cut_bytes=cut,
        consume_queue_from=cq_from,
        index_from=index_from,
        redispatched=redispatched,
        last_store_ts=last_ts,
        regrown_segments=len(cl.regrown),
        records_cut=records_cut,
        damaged_ranges=len(damage),
        damaged_bytes=sum(d.end - d.start for d in damage),
        queue_entries_checked=entries_checked,
        queue_entries_repaired=repaired,
        queue_entries_lost=sum(len(v) for v in lost.values()),
    )
    log.info("store_mmap recovered", **attrs.asdict(report))
    return Recovered(report, unindexed, lost)


def _check_from(cl: CommitLog, checkpoint: CheckpointData | None,
                written: dict[tuple[str, int], tuple[int, tuple[int, int] | None]], *, crashed: bool,
                check_segments: int, clamp: Callable[[int], int]) -> int:
    """Where the scan of the log starts: the checkpoint's durable point, or earlier when in doubt."""
    segments = cl.segments
    first = segments[0].start if segments else 0
    if checkpoint is None:
        return first
    check_from = clamp(checkpoint.min_offset)
    if cl.regrown:  # a truncated segment: check from its start at least
        return min(check_from, min(cl.regrown))
    if crashed:
        return check_from
    newest = _newest_record(written, checkpoint.commit_log_offset)
    if newest is not None and first <= newest:  # re-checked: a damaged one is cut, as after a crash
        check_from = min(check_from, newest)
    if check_segments and segments:
        tail = clamp(checkpoint.commit_log_offset - 1)
        i = max(0, next((k for k, s in enumerate(segments) if s.start <= tail < s.end), len(segments) - 1))
        check_from = min(check_from, segments[max(0, i - (check_segments - 1))].start)
    return check_from


def _redispatch(cl: CommitLog, cqs: ConsumeQueues, index: IndexService, kernel: ScanKernel, cq_from: int,
                index_from: int, end: int, *, index_unique_id: bool) -> tuple[int, IndexEntries | None, int | None]:
    """Queue and index entries of the records from ``cq_from`` / ``index_from`` to ``end``, written again.

    Returns (records re-dispatched, index entries the index had no room for, the last record's store
    time, None when no record was re-dispatched)."""
    unindexed: IndexEntries | None = None
    count = 0
    last_ts: int | None = None
    if min(cq_from, index_from) < end:
        start = min(cq_from, index_from)
        found = scan_log(cl, kernel, start, limit=end, rows=cq_from < end,
                         keys=(2 if index_unique_id else 1) if index_from < end else 0)
        if found.end != end:  # cannot happen: the same records were sound a moment ago
            log.error("re-dispatch stopped early", start=start, reached=found.end, end=end)
        count = found.count
        if found.count:
            last_ts = found.last_ts
        _dispatch_to_queues(cqs, found, cq_from)
        unindexed = _dispatch_to_index(index, found, index_from)
    index.indexed_upto = index_from if unindexed is not None else end
    return count, unindexed, last_ts


def _count_cut_records(cqs: ConsumeQueues, written: dict[tuple[str, int], tuple[int, tuple[int, int] | None]],
                       first: int) -> int:
    """Messages whose queue entries pointed into the cut tail (each queue's top before and after)."""
    records_cut = 0
    for cq in cqs:
        cq.fix_min_offset(first)
        top = written.get((cq.topic, cq.queue_id), (0, None))[0]
        lost_here = top - cq.max_offset
        if lost_here > 0:  # the queue had entries for records the cut tail held
            records_cut += lost_here
            log.warning("messages lost with the cut tail", topic=cq.topic, queue=cq.queue_id, count=lost_here,
                        first_queue_offset=cq.max_offset)
    return records_cut


def _check_queue_entries(cl: CommitLog, cqs: ConsumeQueues, end: int, kernel: ScanKernel
                         ) -> tuple[int, int, dict[tuple[str, int], set[int]]]:
    """Entries written before the checkpoint were not re-dispatched: check them against the log.

    Returns (entries checked, entries repaired, queue -> offsets whose record is gone)."""
    checked = repaired = 0
    lost: dict[tuple[str, int], set[int]] = {}
    for cq in cqs:
        checked += max(0, cq.max_offset - cq.min_offset)
        fixed, gone = repair_queue(cl, cq, cq.min_offset, cq.max_offset, end, kernel)
        repaired += fixed
        if gone:
            lost[(cq.topic, cq.queue_id)] = set(gone)
    return checked, repaired, lost


def _newest_record(newest: dict[tuple[str, int], tuple[int, tuple[int, int] | None]], end: int) -> int | None:
    """Where the record that ends at ``end`` starts, as the newest entry of one of the queues says
    (None if no queue's newest entry ends there: e.g. the log ends with a segment's blank)."""
    for _top, entry in newest.values():
        if entry is not None and entry[1] > 0 and entry[0] + entry[1] == end:
            return entry[0]
    return None


def _dispatch_to_queues(cqs: ConsumeQueues, found: LogScan, cq_from: int) -> None:
    """Write the consume-queue entries of the scanned records at or past ``cq_from``, queue by queue."""
    rows = found.rows[found.rows[:, PHYS] >= cq_from]
    if not rows.size:
        return
    # One group per (topic, queue id), records in log order within each.
    group = (rows[:, TOPIC] << 32) | rows[:, QUEUE_ID]
    order = np.argsort(group, kind="stable")
    rows, group = rows[order], group[order]
    for part in np.split(rows, np.flatnonzero(np.diff(group)) + 1):
        topic, queue_id = found.topics[int(part[0, TOPIC])], int(part[0, QUEUE_ID])
        cq = cqs.get(topic, queue_id) or cqs.create(topic, queue_id)
        cq.put_many(part[:, QUEUE_OFFSET], part[:, PHYS], part[:, TOTAL], part[:, TAGS])


def _dispatch_to_index(index: IndexService, found: LogScan, index_from: int) -> IndexEntries | None:
    """Index the keys of the scanned records at or past ``index_from``; what a full disk keeps out
    is returned (the store keeps it queued and the checkpoint keeps the old index offset)."""
    keys = found.keys[found.keys[:, 1] >= index_from]
    entries = (keys[:, 0].copy(), keys[:, 1].copy(), keys[:, 2].copy())
    try:
        index.add_arrays(*entries)
    except StoreFullError as exc:
        log.warning("key index not rebuilt: disk full; its keys stay queued", error=str(exc))
        return entries
    return None


def repair_queue(cl: CommitLog, cq: ConsumeQueue, lo: int, hi: int, log_end: int, kernel: ScanKernel,
                 write: Callable[[Callable[[], None]], None] | None = None) -> tuple[int, list[int]]:
    """Check entries ``[lo, hi)`` of ``cq`` against the log and rebuild the unsound ones from it.
    Returns how many were rewritten and the queue offsets whose record is gone (logged)."""
    bad = bad_entries(cl, cq, lo, hi, log_end, kernel)
    if not bad:
        return 0, []

    def scan(begin: int, end: int) -> LogScan:
        return scan_log(cl, kernel, begin, limit=end, rows=True)

    repaired, gone = rebuild_entries(cl, cq, bad, log_end, scan, write or (lambda fn: fn()))
    log.error("damaged consume-queue entries rebuilt from the commit log", topic=cq.topic, queue=cq.queue_id,
              damaged=len(bad), rebuilt=repaired, record_gone=len(gone), first=bad[0], last=bad[-1])
    return repaired, gone
