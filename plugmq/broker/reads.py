"""Reads: pulls (filtered on the consume queue first), reads by offset, id, key and time.

A pull runs the subscription's pre-check on consume-queue entries, so an entry it rejects never
costs a commit-log read; the exact check then runs on the message. Every way of consuming reads
through here (pull consumers, push consumers, pop), which is where a reader's view of the log is
decided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from plugmq.broker.events import Events
from plugmq.broker.ratelimit import RateLimiter
from plugmq.core.contracts import (
    Filter,
    FilterCompiler,
    MatchAll,
    MessageStore,
    QueueRepairing,
    QueueRunReading,
    has_capability,
    read_entries,
)
from plugmq.core.errors import FilterSyntaxError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import ConsumeQueueEntry, MessageQueue, PullResult, PullStatus, StoredMessage
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import validate_topic

__all__ = ["Reads"]

log = get_logger(__name__)

_PULL_SCAN_FACTOR = 16  # entries scanned per wanted message before a filtered pull gives up
_READ_AHEAD = 256  # consume-queue entries read at once


@attrs.frozen
class Reads:
    """What consumers and operators read of the broker's store."""

    _name: str
    _store: MessageStore
    _filters: dict[str, FilterCompiler]
    _events: Events
    _check_open: Callable[[], None]
    _limits: RateLimiter
    #: The log offset consumers see up to (None: everything); raises FencedError while the
    #: broker may hand out nothing (plugmq.broker.commit).
    _visible_end: Callable[[], int | None] = attrs.field(default=lambda: None)
    #: Where reads of a queue start (topic, queue id -> queue offset): a deleted topic's queues
    #: start where they ended (plugmq.broker.deletedtopics), so a topic created again under its
    #: name never serves an old message.
    _floor: Callable[[str, int], int] = attrs.field(default=lambda _topic, _queue: 0)

    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        """Compile a subscription with this broker's filter plugins."""
        compiler = self._filters.get(expression_type.upper())
        if compiler is None:
            raise FilterSyntaxError(
                f"no filter plugin for expression type {expression_type!r} in broker {self._name!r}; "
                f"available: {', '.join(sorted(self._filters)) or 'none (add filter_tag / filter_sql)'}",
                expression=expression,
            )
        return compiler.compile(expression)

    # ------------------------------------------------------------------------------ pull
    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32,
             subscription: Filter | None = None, *, consumer_group: str = "", client_id: str = "",
             account: str | None = None, limited: bool = True) -> PullResult:
        """Read up to ``max_nums`` matching messages from ``offset`` of ``queue`` (for ``consumer_group``'s
        client ``client_id``: the delivered events name them; no group, no event).

        A group (or ``account``) with a rate limit gets at most as many messages as it may have
        now, and RateLimitedError when none (``limited=False``: the caller took them already)."""
        self._check_open()
        if max_nums < 1:
            raise ValidationError(f"max_nums must be >= 1, got {max_nums}")
        low, high = self.min_offset(queue), self.max_offset(queue)
        if offset < low or offset > high:
            nxt = low if offset < low else high
            return PullResult(PullStatus.OFFSET_ILLEGAL, (), nxt, low, high)
        visible = self._visible_end()  # consumers see committed messages only
        if offset == high:
            return PullResult(PullStatus.NO_NEW_MSG, (), offset, low, high)
        limits = self._limits if limited and consumer_group and self._limits.active else None
        granted = limits.grant(consumer_group, account, max_nums) if limits is not None else max_nums
        found: list[StoredMessage] = []
        try:
            found, next_offset = self._scan(queue, offset, high, granted, subscription, visible)
        finally:
            if limits is not None:  # what was not handed out goes back; the bytes handed out are charged
                limits.settle(consumer_group, account, granted, len(found), sum(len(m.body) for m in found))
        self._events.delivered(consumer_group, found, client_id)
        status = PullStatus.FOUND if found else (PullStatus.NO_MATCHED_MSG if next_offset > offset
                                                 else PullStatus.NO_NEW_MSG)
        return PullResult(status, tuple(found), next_offset, low, high)

    def _scan(self, queue: MessageQueue, offset: int, high: int, max_nums: int,
              subscription: Filter | None, visible: int | None = None) -> tuple[list[StoredMessage], int]:
        """The matching messages from ``offset`` (at most ``max_nums``, within the scan budget,
        below the log offset ``visible``) and the offset the next pull starts at.

        The entries the pre-check passes are read in runs (``read_entries``: one call to a store
        that reads in bulk), each run no longer than the messages still wanted. A pull that takes
        every message (no subscription, or one that matches everything: MatchAll) from a
        QueueRunReading store reads entries and records in one call per run, cut at ``visible``;
        a run the store cannot vouch for goes entry by entry."""
        found: list[StoredMessage] = []
        everything = subscription is None or (isinstance(subscription, MatchAll) and subscription.matches_everything)
        budget = max_nums * (1 if everything else _PULL_SCAN_FACTOR)
        next_offset = offset
        store = self._store
        runs = store if everything and has_capability(store, QueueRunReading) else None
        while len(found) < max_nums and budget > 0 and next_offset < high:
            if runs is not None:
                run = runs.read_queue_run(queue.topic, queue.queue_id, next_offset, min(budget, _READ_AHEAD))
                if run:
                    taken = run if visible is None else _committed(run, visible)
                    found += taken
                    budget -= len(taken)
                    if taken:
                        next_offset = taken[-1].queue_offset + 1
                    if len(taken) < len(run):
                        return found, next_offset  # not committed yet: the rest of the queue waits too
                    continue
                runs = None  # none there, or not exact: the entry-by-entry path decides (and repairs)
            entries = self._store.read_queue(queue.topic, queue.queue_id, next_offset, min(budget, _READ_AHEAD))
            if not entries:
                break
            start = 0
            while start < len(entries) and len(found) < max_nums:
                picked, end, waiting = _pick(entries, start, max_nums - len(found), subscription, visible)
                reread = self._take(queue, picked, subscription, found)
                if reread is not None:
                    budget -= max(reread - entries[start].queue_offset + 1, 1)
                    next_offset = reread  # rebuilt from the commit log: read it again
                    break
                if end > start:
                    next_offset = entries[end - 1].queue_offset + 1
                    budget -= end - start
                if waiting:
                    return found, next_offset  # not committed yet: the rest of the queue waits too
                start = end
        return found, next_offset

    def _take(self, queue: MessageQueue, picked: list[ConsumeQueueEntry], subscription: Filter | None,
              found: list[StoredMessage]) -> int | None:
        """Read ``picked`` (entries the pre-check passed) and add the matching messages to
        ``found``; the queue offset to read again when a damaged entry was rebuilt."""
        messages = read_entries(self._store, picked)
        for entry, message in zip(picked, messages):
            if message is None or message.queue_offset != entry.queue_offset:
                if self._repair_entry(queue, entry.queue_offset):
                    return entry.queue_offset
                continue
            if subscription is None or subscription.matches(message.properties, message.tags):
                found.append(message)
        return None

    def _repair_entry(self, queue: MessageQueue, offset: int) -> bool:
        """A consume-queue entry led to no message: let the store rebuild damaged entries from
        its log (``repair_queue``, optional for a store); True when the entry should be read again.
        An entry that stays unreadable is skipped - the store logged and counted its loss."""
        if offset < self._store.min_offset(queue.topic, queue.queue_id):
            return False  # retention removed it meanwhile: nothing is damaged
        if isinstance(self._store, QueueRepairing) and self._store.repair_queue(queue.topic, queue.queue_id, offset):
            return True
        log.warning("consume-queue entry unreadable; message skipped", topic=queue.topic, queue=queue.queue_id,
                    queue_offset=offset)
        return False

    # ------------------------------------------------------------------------------ by offset, id, key, time
    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message stored at ``commit_log_offset`` (None if retention removed it)."""
        return self._store.read(commit_log_offset, size)

    def read_messages(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        """The message of each entry (None where retention removed it), read in one call when the
        store reads in bulk."""
        return read_entries(self._store, entries)

    def query_by_id(self, msg_id: str) -> StoredMessage | None:
        return self._store.query_by_id(msg_id)

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        validate_topic(topic)
        return self._store.query_by_key(topic, key, max_results=max_results, begin_ms=begin_ms, end_ms=end_ms)

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None) -> int:
        """Where a group with no position on ``queue`` starts: its first message, its end (only
        messages sent from now on), or the first message stored at or after ``timestamp_ms``."""
        if consume_from is ConsumeFrom.FIRST_OFFSET:
            return self.min_offset(queue)
        if consume_from is ConsumeFrom.TIMESTAMP:
            if timestamp_ms is None:
                raise ValidationError("consume_from=TIMESTAMP needs a timestamp (consume_timestamp_ms)")
            return self.offset_for_timestamp(queue, timestamp_ms)
        return self.max_offset(queue)

    def offset_for_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> int:
        found = self._store.offset_for_timestamp(queue.topic, queue.queue_id, timestamp_ms)
        return max(found, self.min_offset(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        """The first readable offset: what retention left, and never below the queue's floor
        (never above its end either: a store that lost its tail still serves what comes next)."""
        low = self._store.min_offset(queue.topic, queue.queue_id)
        floor = self._floor(queue.topic, queue.queue_id)
        return low if floor <= low else min(floor, self._store.max_offset(queue.topic, queue.queue_id))

    def max_offset(self, queue: MessageQueue) -> int:
        return self._store.max_offset(queue.topic, queue.queue_id)


def _committed(run: list[StoredMessage], visible: int) -> list[StoredMessage]:
    """The messages of ``run`` (in log order) that end at or below the log offset ``visible``."""
    if run[-1].commit_log_offset + run[-1].size <= visible:
        return run
    end = 0
    while end < len(run) and run[end].commit_log_offset + run[end].size <= visible:
        end += 1
    return run[:end]


def _pick(entries: list[ConsumeQueueEntry], start: int, want: int, subscription: Filter | None,
          visible: int | None) -> tuple[list[ConsumeQueueEntry], int, bool]:
    """The entries from ``start`` the pre-check passes, up to ``want`` of them; the index after
    the last entry looked at; True when it stopped at one not committed yet (``visible``)."""
    if subscription is None and visible is None:
        picked = entries[start:start + want]
        return picked, start + len(picked), False
    picked = []
    for end in range(start, len(entries)):
        entry = entries[end]
        if visible is not None and entry.commit_log_offset + entry.size > visible:
            return picked, end, True
        if subscription is None or subscription.precheck(entry):
            picked.append(entry)
            if len(picked) >= want:
                return picked, end + 1, False
    return picked, len(entries), False
