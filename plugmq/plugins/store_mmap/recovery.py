"""Opening a store: find the true end of the commit log and bring consume queues and index in line.

1. Load the segments. One shorter than its successor's name says (truncated) is grown back to
   its size, zero-filled, and checked from its start: what it lost is cut (newest segment) or
   skipped (an older one); an empty newest file is dropped.
2. Choose where to start checking records. After a clean shutdown (no abort file) the checkpoint
   is trusted: only the last ``recover_check_segments`` segments are re-read. After a crash, or
   without a readable checkpoint, checking starts at the oldest offset any checkpointed part
   (commit log, consume queues, index) vouches for - or at the start of the log.
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

import struct
from collections.abc import Callable

import attrs

from plugmq.core import Prop, StoreFullError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.checkpoint import CheckpointData
from plugmq.plugins.store_mmap.commitlog import CommitLog
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueue, ConsumeQueues
from plugmq.plugins.store_mmap.indexfile import IndexService
from plugmq.plugins.store_mmap.queuecheck import bad_entries, rebuild_entries
from plugmq.plugins.store_mmap.record import END_FILE_MIN_BLANK, MESSAGE_MAGIC, Decoded, decode

__all__ = ["Damage", "Recovered", "RecoveryReport", "recover", "repair_queue", "scan_log"]

log = get_logger(__name__)

_INDEX_BATCH = 4096
_MAGIC_BYTES = struct.pack(">I", MESSAGE_MAGIC)
_MAGIC_AT = 4  # the magic's position inside a record


@attrs.frozen
class Damage:
    """Bytes ``[start, end)`` of the log hold no sound record but sound ones follow them."""

    start: int
    end: int


def _next_sound(cl: CommitLog, bad: int) -> int | None:
    """The first sound record boundary after the unsound one at ``bad``: a later record in the same
    segment (found by its magic, then checked whole: offset field, sizes and both CRCs), or the
    first record of a later segment. None when nothing sound follows (``bad`` is the log's end)."""
    seg = cl.segment_for(bad)
    if seg is None:
        return None
    rel = bad - seg.start + 1
    while seg is not None:
        mm = seg.mm
        # Only stretches holding data are searched (and read): holes hold no record, and reading
        # one through a tmpfs mapping on a full file system is a SIGBUS.
        for first, last in seg.data_ranges(rel, seg.size):
            last = min(last, seg.size - END_FILE_MIN_BLANK)
            at = mm.find(_MAGIC_BYTES, max(first, rel) + _MAGIC_AT, last)
            while at >= 0:
                pos = at - _MAGIC_AT
                if pos >= first and decode(mm, pos, last - pos, seg.start + pos) is not None:
                    return seg.start + pos
                at = mm.find(_MAGIC_BYTES, at + 1, last)
        seg = cl.segment_for(seg.end)
        rel = 0
        if seg is not None:
            readable = min(seg.data_end(), seg.size - END_FILE_MIN_BLANK)
            if decode(seg.mm, 0, readable, seg.start) is not None:
                return seg.start
    return None


def scan_log(cl: CommitLog, begin: int, visit: Callable[[Decoded], None] | None = None,
             limit: int | None = None) -> tuple[int, list[Damage]]:
    """Like ``CommitLog.walk`` from ``begin``, but an unsound record followed by sound ones is
    damage to skip, not the end of the log. Returns the end (the first unsound record nothing
    sound follows, or the first boundary at or past ``limit``) and the damaged ranges skipped."""
    damage: list[Damage] = []
    pos = begin
    while True:
        end = cl.walk(pos, visit, limit=limit)
        if limit is not None and end >= limit:
            return end, damage
        resume = _next_sound(cl, end)
        if resume is None or (limit is not None and resume >= limit):
            return end, damage
        damage.append(Damage(end, resume))
        pos = resume


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
    unindexed: list[tuple[str, str | None, str | None, int, int]]  # keys the index had no room for
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
    dispatch_cq: Callable[[Decoded], None],
) -> Recovered:
    cl.load()
    cq_complete = cqs.load()
    index_complete = index.load()
    segments = cl.segments
    first = segments[0].start if segments else 0
    last_end = segments[-1].end if segments else 0

    def clamp(offset: int) -> int:
        return max(first, min(offset, last_end))

    trusted = checkpoint is not None and not crashed and not cl.regrown
    if trusted:
        assert checkpoint is not None
        tail = clamp(checkpoint.commit_log_offset - 1)
        i = max(0, next((k for k, s in enumerate(segments) if s.start <= tail < s.end), len(segments) - 1))
        check_from = segments[max(0, i - (check_segments - 1))].start if segments else first
    elif checkpoint is not None:
        check_from = clamp(checkpoint.min_offset)
        if cl.regrown:  # a truncated segment: check from its start at least
            check_from = min(check_from, min(cl.regrown))
    else:
        check_from = first

    last_ts = [checkpoint.commit_log_ts if checkpoint else 0]

    def note_ts(rec: Decoded) -> None:
        last_ts[0] = rec.store_ts

    end, damage = scan_log(cl, check_from, note_ts)
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

    tops = {(cq.topic, cq.queue_id): cq.written_top() for cq in cqs}
    for cq in cqs:
        cq.cut(cq_from)
    index.cut(index_from)

    redispatched = 0
    pending: list[tuple[str, str | None, str | None, int, int]] = []
    index_full = False

    def add_to_index() -> None:
        nonlocal index_full
        if index_full:
            return
        try:
            index.add(pending)
        except StoreFullError as exc:  # the store keeps the rest queued; the checkpoint the old offset
            log.warning("key index not rebuilt: disk full; its keys stay queued", error=str(exc))
            index_full = True
            return
        pending.clear()

    if min(cq_from, index_from) < end:

        def visit(rec: Decoded) -> None:
            nonlocal redispatched
            redispatched += 1
            last_ts[0] = rec.store_ts
            if rec.phys >= cq_from:
                dispatch_cq(rec)
            if rec.phys >= index_from:
                props = rec.properties()
                keys = props.get(Prop.KEYS)
                uniq = props.get(Prop.UNIQ_KEY) if index_unique_id else None
                if keys or uniq:
                    pending.append((rec.topic, keys, uniq, rec.phys, rec.store_ts))
                    if len(pending) >= _INDEX_BATCH:
                        add_to_index()

        start = min(cq_from, index_from)
        reached, _ = scan_log(cl, start, visit, limit=end)
        if reached != end:  # cannot happen: the same records were valid a moment ago
            log.error("re-dispatch stopped early", start=start, reached=reached, end=end)
        add_to_index()
    index.indexed_upto = index_from if index_full else end
    records_cut = 0
    for cq in cqs:
        cq.fix_min_offset(first)
        lost_here = tops.get((cq.topic, cq.queue_id), 0) - cq.max_offset
        if lost_here > 0:  # the queue had entries for records the cut tail held
            records_cut += lost_here
            log.warning("messages lost with the cut tail", topic=cq.topic, queue=cq.queue_id, count=lost_here,
                        first_queue_offset=cq.max_offset)

    checked = repaired = 0
    lost: dict[tuple[str, int], set[int]] = {}
    if crashed or not cq_complete or cl.regrown or damage:
        # Entries written before the checkpoint were not re-dispatched: check them against the log.
        for cq in cqs:
            checked += max(0, cq.max_offset - cq.min_offset)
            fixed, gone = repair_queue(cl, cq, cq.min_offset, cq.max_offset, end)
            repaired += fixed
            if gone:
                lost[(cq.topic, cq.queue_id)] = set(gone)
    for cq in cqs:
        cq.flush(everything=True)
    index.flush(everything=True)
    report = RecoveryReport(
        crashed=crashed,
        checkpoint_valid=checkpoint is not None,
        checked_from=check_from,
        end=end,
        cut_bytes=cut,
        consume_queue_from=cq_from,
        index_from=index_from,
        redispatched=redispatched,
        last_store_ts=last_ts[0],
        regrown_segments=len(cl.regrown),
        records_cut=records_cut,
        damaged_ranges=len(damage),
        damaged_bytes=sum(d.end - d.start for d in damage),
        queue_entries_checked=checked,
        queue_entries_repaired=repaired,
        queue_entries_lost=sum(len(v) for v in lost.values()),
    )
    log.info("store_mmap recovered", **attrs.asdict(report))
    return Recovered(report, pending if index_full else [], lost)


def repair_queue(cl: CommitLog, cq: ConsumeQueue, lo: int, hi: int, log_end: int,
                 write: Callable[[Callable[[], None]], None] | None = None) -> tuple[int, list[int]]:
    """Check entries ``[lo, hi)`` of ``cq`` against the log and rebuild the unsound ones from it.
    Returns how many were rewritten and the queue offsets whose record is gone (logged)."""
    bad = bad_entries(cl, cq, lo, hi, log_end)
    if not bad:
        return 0, []

    def scan(begin: int, end: int, visit: Callable[[Decoded], None]) -> None:
        scan_log(cl, begin, visit, limit=end)

    repaired, gone = rebuild_entries(cl, cq, bad, log_end, scan, write or (lambda fn: fn()))
    log.error("damaged consume-queue entries rebuilt from the commit log", topic=cq.topic, queue=cq.queue_id,
              damaged=len(bad), rebuilt=repaired, record_gone=len(gone), first=bad[0], last=bad[-1])
    return repaired, gone
