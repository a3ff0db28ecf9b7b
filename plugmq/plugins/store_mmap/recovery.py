"""Opening a store: find the true end of the commit log and bring consume queues and index in line.

1. Choose where to start checking records. After a clean shutdown (no abort file) the checkpoint
   is trusted: only the last ``recover_check_segments`` segments are re-read. After a crash, or
   without a readable checkpoint, checking starts at the oldest offset any checkpointed part
   (commit log, consume queues, index) vouches for - or at the start of the log.
2. Walk the records from there (magic, sizes, offset, both CRCs); the first record that fails is
   the end. Everything after it is zeroed, later segments are deleted: a torn tail is cut.
3. Consume queues and index drop entries at or past the offset they were durable to (or past the
   end), and the records from that offset to the end are dispatched to them again. A missing
   ``consumequeue`` or ``index`` directory makes that offset the start of the log: a full rebuild.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from plugmq.core import Prop
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.checkpoint import CheckpointData
from plugmq.plugins.store_mmap.commitlog import CommitLog
from plugmq.plugins.store_mmap.consumequeue import ConsumeQueues
from plugmq.plugins.store_mmap.indexfile import IndexService
from plugmq.plugins.store_mmap.record import Decoded

__all__ = ["RecoveryReport", "recover"]

log = get_logger(__name__)

_INDEX_BATCH = 4096


@attrs.frozen
class RecoveryReport:
    crashed: bool
    checkpoint_valid: bool
    checked_from: int
    end: int
    cut_bytes: int
    consume_queue_from: int
    index_from: int
    redispatched: int
    last_store_ts: int


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
) -> RecoveryReport:
    cl.load()
    cq_complete = cqs.load()
    index_complete = index.load()
    segments = cl.segments
    first = segments[0].start if segments else 0
    last_end = segments[-1].end if segments else 0

    def clamp(offset: int) -> int:
        return max(first, min(offset, last_end))

    trusted = checkpoint is not None and not crashed
    if trusted:
        assert checkpoint is not None
        tail = clamp(checkpoint.commit_log_offset - 1)
        i = max(0, next((k for k, s in enumerate(segments) if s.start <= tail < s.end), len(segments) - 1))
        check_from = segments[max(0, i - (check_segments - 1))].start if segments else first
    elif checkpoint is not None:
        check_from = clamp(checkpoint.min_offset)
    else:
        check_from = first

    last_ts = [checkpoint.commit_log_ts if checkpoint else 0]

    def note_ts(rec: Decoded) -> None:
        last_ts[0] = rec.store_ts

    end = cl.walk(check_from, note_ts)
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

    redispatched = 0
    pending: list[tuple[str, str | None, str | None, int, int]] = []
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
                        index.add(pending)
                        pending.clear()

        start = min(cq_from, index_from)
        reached = cl.walk(start, visit)
        if reached != end:  # cannot happen: the same records were valid a moment ago
            log.error("re-dispatch stopped early", start=start, reached=reached, end=end)
        index.add(pending)
    index.indexed_upto = end
    for cq in cqs:
        cq.fix_min_offset(first)
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
    )
    log.info("store_mmap recovered", **attrs.asdict(report))
    return report
