"""The admin verbs over one open broker (:class:`BrokerAdmin`), through its public interface."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Collection

import attrs

from plugmq.admin.insight import ClientDirectory
from plugmq.admin.values import (
    OFFSET_MODE,
    POP_MODE,
    BrokerStatus,
    GroupProgress,
    GroupSummary,
    MessageView,
    QueueProgress,
    QueueReset,
    QueueStatus,
    ResendResult,
    ResentMessage,
    ResetResult,
    TopicStatus,
    TopicSummary,
    TopicUpdate,
)
from plugmq.broker.offsets import DLQ_RESEND, OffsetStore
from plugmq.broker.ports import Administered
from plugmq.core.errors import TopicError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import Message, MessageQueue, StoredMessage
from plugmq.core.names import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    Prop,
    is_system_topic,
    retry_topic,
    validate_group,
    validate_topic,
)

__all__ = ["MAX_QUERY", "RESEND_TARGETS", "BrokerAdmin"]

log = get_logger(__name__)

RESEND_TARGETS = ("topic", "retry")
MAX_QUERY = 10_000


def _topic_kind(topic: str) -> str:
    if topic.startswith(RETRY_PREFIX):
        return "retry"
    if topic.startswith(DLQ_PREFIX):
        return "dlq"
    return "system" if is_system_topic(topic) else "normal"


@attrs.frozen
class _ResendScope:
    """What a DLQ resend takes: just ``wanted`` ids (empty: every letter after the group's
    ``cursor``), at most ``limit`` in all."""

    wanted: set[str]
    limit: int
    cursor: OffsetStore


class BrokerAdmin:
    """The admin verbs over one open broker. Thread-safe as far as the broker is."""

    def __init__(self, broker: Administered, clients: ClientDirectory | None = None) -> None:
        self.broker = broker
        self.clients = clients  # the server's consumers (plugmq serve); None on a stopped data dir

    # -------------------------------------------------------------------------------- topics
    def topic_list(self) -> list[TopicSummary]:
        store = self.broker.store
        out = []
        for topic, count in sorted(self.broker.topics.all().items()):
            held = sum(max(0, store.max_offset(topic, q) - self._low(topic, q)) for q in range(count))
            out.append(TopicSummary(topic, _topic_kind(topic), count, held))
        return out

    def _low(self, topic: str, queue_id: int) -> int:
        """The queue's first readable offset (what retention left, above a deleted topic's floor)."""
        return self.broker.min_offset(MessageQueue(topic, self.broker.name, queue_id))

    def _queue_count(self, topic: str) -> int:
        validate_topic(topic)
        count = self.broker.topics.get(topic)
        if count is None:
            raise TopicError(f"topic {topic!r} does not exist on broker {self.broker.name!r}; topic-list shows "
                             "the topics, update-topic creates one")
        return count

    def _last_store_ms(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store time of the message at ``offset`` of the queue (None if there is none)."""
        entries = self.broker.store.read_queue(topic, queue_id, offset, 1)
        if not entries:
            return None
        message = self.broker.store.read(entries[0].commit_log_offset, entries[0].size)
        return None if message is None else message.store_timestamp_ms

    def topic_status(self, topic: str) -> TopicStatus:
        count = self._queue_count(topic)
        store = self.broker.store
        queues = []
        for queue_id in range(count):
            low, high = self._low(topic, queue_id), store.max_offset(topic, queue_id)
            last = self._last_store_ms(topic, queue_id, high - 1) if high > low else None
            queues.append(QueueStatus(queue_id, low, high, last))
        return TopicStatus(topic, self.broker.name, tuple(queues))

    def update_topic(self, topic: str, queue_count: int) -> TopicUpdate:
        """Create ``topic`` with ``queue_count`` queues, or grow it to that many (queues hold data:
        a topic never shrinks)."""
        validate_topic(topic)
        if is_system_topic(topic):
            raise TopicError(f"topic {topic!r} is a system topic; the broker creates it when it needs it")
        if isinstance(queue_count, bool) or not isinstance(queue_count, int):
            raise ValidationError(f"queue count must be an integer, got {queue_count!r}")
        previous = self.broker.topics.get(topic)
        if previous is not None and queue_count < previous:
            raise ValidationError(f"topic {topic!r} has {previous} queues and queues hold data, so a topic never "
                                  f"shrinks; ask for {previous} or more, not {queue_count}")
        self.broker.create_topic(topic, queue_count)
        log.info("topic updated", topic=topic, queue_count=queue_count, previous=previous)
        return TopicUpdate(topic, queue_count, previous)

    # -------------------------------------------------------------------------------- groups
    def _offset_groups(self) -> list[str]:
        return self.broker.consumer_offsets.group_names()

    def _offset_entries(self, group: str) -> dict[tuple[str, int], int]:
        if group not in self._offset_groups():
            return {}
        return self.broker.offsets(group).entries(self.broker.name)

    def group_names(self) -> list[str]:
        """Every group with offsets or pop progress on this broker (sorted)."""
        return sorted(set(self._offset_groups()) | set(self.broker.pop.groups()))

    def consumer_groups(self) -> list[GroupSummary]:
        """Every group with progress on this broker and its totals (mqadmin consumerProgress without -g)."""
        out = []
        for name in self.group_names():
            progress = self.consumer_progress(name)
            modes = tuple(sorted({q.mode for q in progress.queues}))
            out.append(GroupSummary(name, modes, len(progress.queues), progress.lag, progress.inflight))
        return out

    def consumer_progress(self, group: str) -> GroupProgress:
        """The group's progress on every queue of every topic it consumes. A queue the group has not
        consumed from yet counts from the queue's first message (where a new group starts by
        default)."""
        validate_group(group)
        rows: list[QueueProgress] = []
        committed = self._offset_entries(group)
        for topic, queue_id in self._all_queues({t for t, _ in committed}):
            rows.append(self._progress(topic, queue_id, OFFSET_MODE, committed.get((topic, queue_id)), 0, None))
        lanes = {(lane.topic, lane.queue_id): lane for lane in self.broker.pop.progress(group)}
        for topic, queue_id in self._all_queues({t for t, _ in lanes}):
            lane = lanes.get((topic, queue_id))
            if lane is None:
                rows.append(self._progress(topic, queue_id, POP_MODE, None, 0, None))
            else:
                rows.append(self._progress(topic, queue_id, POP_MODE, lane.next_offset, lane.inflight,
                                           lane.done_below))
        if not rows:
            raise ValidationError(f"consumer group {group!r} has no offsets and no pop progress on broker "
                                  f"{self.broker.name!r}: it never consumed here; consumer-progress without a "
                                  "group lists the groups that did")
        return GroupProgress(group, self.broker.name, tuple(rows), sum(r.lag for r in rows),
                             sum(r.inflight for r in rows), tuple(self.broker.groups.members(group)))

    def _all_queues(self, topics: set[str]) -> list[tuple[str, int]]:
        return [(topic, q) for topic in sorted(topics) for q in range(self.broker.topics.get(topic) or 0)]

    def _progress(self, topic: str, queue_id: int, mode: str, cursor: int | None, inflight: int,
                  done_below: int | None) -> QueueProgress:
        """``cursor``: the next offset the group reads (None: it has not read this queue yet)."""
        store = self.broker.store
        low, high = self._low(topic, queue_id), store.max_offset(topic, queue_id)
        start = low if cursor is None else min(max(cursor, low), high)
        ready = high - start
        pending_from = done_below if inflight and done_below is not None else start
        oldest = self._last_store_ms(topic, queue_id, max(pending_from, low)) if ready or inflight else None
        consumer_offset = start if done_below is None else done_below
        return QueueProgress(topic, queue_id, mode, high, consumer_offset, inflight, ready + inflight, oldest)

    # -------------------------------------------------------------------------------- messages
    def query_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        """The message with offset message id ``message_id``, or else the messages whose unique id
        (the id clients see) is ``message_id``: the message and its retry and dead-letter copies,
        searched in ``topic`` or, without one, in every topic."""
        text = message_id.strip()
        if not text:
            raise ValidationError("message id is empty; give an offset message id or a client message id")
        if re.fullmatch(r"[0-9A-Fa-f]{32}", text):
            found = self.broker.query_by_id(text.upper())
            if found is not None:
                return [MessageView.of(found)]
        topics = [topic] if topic else sorted(self.broker.topics.all())
        if topic:
            self._queue_count(topic)
        hits: dict[str, StoredMessage] = {}
        for name in topics:
            for message in self.broker.query_by_key(name, text, max_results=64):
                if message.unique_id == text:
                    hits[message.msg_id] = message
        return [MessageView.of(m) for m in sorted(hits.values(), key=lambda m: m.commit_log_offset)]

    def query_by_key(self, topic: str, key: str, *, begin_ms: int = 0, end_ms: int | None = None,
                     max_results: int = 64) -> list[MessageView]:
        self._queue_count(topic)
        _check_max(max_results)
        found = self.broker.query_by_key(topic, key, max_results=max_results, begin_ms=begin_ms, end_ms=end_ms)
        return [MessageView.of(m) for m in found]

    def query_by_time(self, topic: str, begin_ms: int, end_ms: int | None = None,
                      max_results: int = 64) -> list[MessageView]:
        """Messages of ``topic`` stored in [begin, end), oldest first, at most ``max_results``."""
        count = self._queue_count(topic)
        _check_max(max_results)
        store = self.broker.store
        found: list[StoredMessage] = []
        for queue_id in range(count):
            queue = MessageQueue(topic, self.broker.name, queue_id)
            offset = max(self.broker.offset_for_timestamp(queue, begin_ms), self._low(topic, queue_id))
            stop = store.max_offset(topic, queue_id) if end_ms is None else self.broker.offset_for_timestamp(
                queue, end_ms)
            taken = 0
            while offset < stop and taken < max_results:
                entries = store.read_queue(topic, queue_id, offset, min(256, stop - offset))
                if not entries:
                    break
                for entry in entries:
                    offset = entry.queue_offset + 1
                    message = store.read(entry.commit_log_offset, entry.size)
                    if message is not None:
                        found.append(message)
                        taken += 1
                    if taken >= max_results or offset >= stop:
                        break
        found.sort(key=lambda m: (m.store_timestamp_ms, m.commit_log_offset))
        return [MessageView.of(m) for m in found[:max_results]]

    # -------------------------------------------------------------------------------- reset
    def reset_offset(self, group: str, topic: str, timestamp_ms: int | None, *, force: bool = True) -> ResetResult:
        """RocketMQ's resetOffsetByTime: move ``group`` on every queue of ``topic`` to the first
        message stored at or after ``timestamp_ms`` (None: "now", the end of each queue). Without
        ``force`` a queue only moves back (a group ahead of the time keeps its position).

        Offset groups: the committed offsets change; running push consumers of the group release
        the queues, commit, and take them back from the new offsets. Pop groups: the cursor moves
        and the in-flight messages are forgotten (their receipt handles stop working), so every
        message from the new position on is delivered again.
        """
        validate_group(group)
        count = self._queue_count(topic)
        queues = [MessageQueue(topic, self.broker.name, q) for q in range(count)]
        targets = {q.queue_id: (self.broker.max_offset(q) if timestamp_ms is None
                                else self.broker.offset_for_timestamp(q, timestamp_ms)) for q in queues}

        def keep(current: int | None, target: int) -> bool:
            return not force and current is not None and target >= current

        rows, moved = self._reset_committed(group, topic, queues, targets, keep)
        rows += self._reset_pop(group, topic, targets, keep)
        if not rows:
            raise ValidationError(f"consumer group {group!r} has never consumed topic {topic!r} on broker "
                                  f"{self.broker.name!r}, so it has no position to reset; consumer-progress "
                                  f"{group} shows what it consumes")
        log.info("consumer offsets reset", group=group, topic=topic, timestamp_ms=timestamp_ms, force=force,
                 members=moved)
        return ResetResult(group, topic, timestamp_ms, force, tuple(rows), tuple(moved))

    def _reset_committed(self, group: str, topic: str, queues: list[MessageQueue], targets: dict[int, int],
                         keep: Callable[[int | None, int], bool]) -> tuple[list[QueueReset], list[str]]:
        """Move the group's committed offsets (its push consumers release and retake the queues)."""
        committed = {q: o for (t, q), o in self._offset_entries(group).items() if t == topic}
        if not committed:
            return [], []
        offsets = self.broker.offsets(group)
        changes = {q: t for q, t in targets.items() if not keep(committed.get(q), t)}

        def move() -> None:
            for queue_id, target in changes.items():
                offsets.update(queues[queue_id], target)

        moved = self.broker.groups.reposition(group, [queues[q] for q in changes], move)
        rows = [QueueReset(q, OFFSET_MODE, committed.get(q), changes.get(q, committed.get(q, t)))
                for q, t in targets.items()]
        return rows, moved

    def _reset_pop(self, group: str, topic: str, targets: dict[int, int],
                   keep: Callable[[int | None, int], bool]) -> list[QueueReset]:
        """Move the group's pop cursors (its in-flight messages are forgotten)."""
        lanes = {lane.queue_id: lane for lane in self.broker.pop.progress(group) if lane.topic == topic}
        if not lanes:
            return []
        changes = {q: t for q, t in targets.items() if not keep(lanes[q].done_below if q in lanes else None, t)}
        previous = self.broker.pop.reset(group, topic, changes)
        rows = []
        for q, t in targets.items():
            before = previous.get(q, lanes[q].next_offset if q in lanes else None)
            rows.append(QueueReset(q, POP_MODE, before, changes.get(q, lanes[q].next_offset if q in lanes else t)))
        return rows

    # -------------------------------------------------------------------------------- dead letters
    def _resend_cursor(self, group: str) -> OffsetStore:
        return self.broker.consumer_offsets.view(group, kind=DLQ_RESEND)

    def resend_dlq(self, group: str, *, ids: Collection[str] = (), limit: int = 1000,
                   target: str = "topic") -> ResendResult:
        """Send the group's dead letters back so the group consumes them again.

        ``target="topic"``: to the original topic (the DLQ copy's ``RETRY_TOPIC``), where every
        consumer kind of the group receives it, and so does every other group subscribed to that
        topic. ``target="retry"``: to ``%RETRY%<group>`` as a retry, which only the group's push
        consumers read (those that retry: ``max_delivery_attempts`` > 1); they see the original topic. Lineage is kept (``RETRY_TOPIC``,
        ``ORIGIN_MESSAGE_ID``, the unique id clients see); the delivery attempts start afresh.

        Without ``ids``, the dead letters not resent before, at most ``limit`` (a cursor per group
        remembers how far resends went). With ``ids`` (offset or client message ids), just those,
        wherever the cursor is.
        """
        validate_group(group)
        if target not in RESEND_TARGETS:
            raise ValidationError(f"resend target {target!r} is unknown; use 'topic' (the original topic) or "
                                  f"'retry' (%RETRY%{group}, read by the group's push consumers only)")
        _check_max(limit)
        dlq = self.broker.group_policy(group).redelivery.dead_letter_topic_for(group)
        count = self.broker.topics.get(dlq)
        if count is None:
            raise ValidationError(f"consumer group {group!r} has no dead-letter topic {dlq!r} on broker "
                                  f"{self.broker.name!r}: none of its messages was dead-lettered")
        wanted = {i.strip().upper() if re.fullmatch(r"[0-9A-Fa-f]{32}", i.strip()) else i.strip() for i in ids}
        cursor = self._resend_cursor(group)
        resent: list[ResentMessage] = []
        skipped: list[str] = []
        remaining = 0
        try:
            for queue_id in range(count):
                remaining += self._resend_queue(MessageQueue(dlq, self.broker.name, queue_id), group, target,
                                                _ResendScope(wanted, limit, cursor), resent, skipped)
        finally:
            cursor.persist()
        found = {r.unique_id for r in resent} | {r.msg_id for r in resent}
        skipped += [f"{i}: not in {dlq}" for i in sorted(wanted) if i not in found and not any(
            s.startswith(f"{i}:") for s in skipped)]
        log.info("dead letters resent", group=group, dead_letter_topic=dlq, target=target, resent=len(resent),
                 remaining=remaining)
        return ResendResult(group, dlq, target, tuple(resent), tuple(skipped), remaining)

    def _resend_queue(self, queue: MessageQueue, group: str, target: str, scope: _ResendScope,
                      resent: list[ResentMessage], skipped: list[str]) -> int:
        """Resend one DLQ queue's dead letters in scope (appended to ``resent``); returns how many
        were left for a later call because ``scope.limit`` was reached."""
        store = self.broker.store
        low, high = store.min_offset(queue.topic, queue.queue_id), store.max_offset(queue.topic, queue.queue_id)
        offset = low if scope.wanted else min(max(scope.cursor.read(queue) or 0, low), high)
        while offset < high:
            entries = store.read_queue(queue.topic, queue.queue_id, offset, min(256, high - offset))
            if not entries:
                break
            for entry in entries:
                if len(resent) >= scope.limit:
                    return high - entry.queue_offset
                offset = entry.queue_offset + 1
                message = store.read(entry.commit_log_offset, entry.size)
                if message is None or (scope.wanted and not ({message.msg_id, message.unique_id} & scope.wanted)):
                    continue
                sent = self._resend_one(group, message, target, skipped)
                if sent is not None:
                    resent.append(sent)
                if not scope.wanted:
                    scope.cursor.update(queue, offset, persist=False)
        return 0

    def _resend_one(self, group: str, message: StoredMessage, target: str, skipped: list[str]) -> ResentMessage | None:
        original = message.properties.get(Prop.RETRY_TOPIC)
        if not original or is_system_topic(original):
            skipped.append(f"{message.msg_id}: no original topic recorded (RETRY_TOPIC); not a dead letter of a "
                           "consumer group")
            return None
        lineage = {Prop.RETRY_TOPIC: original,
                   Prop.ORIGIN_MESSAGE_ID: message.properties.get(Prop.ORIGIN_MESSAGE_ID, message.msg_id)}
        if message.unique_id:
            lineage[Prop.UNIQ_KEY] = message.unique_id
        trace_context = message.properties.get(Prop.TRACE_CONTEXT)
        if trace_context:
            lineage[Prop.TRACE_CONTEXT] = trace_context
        destination = original if target == "topic" else retry_topic(group)
        if target == "retry":
            self.broker.topics.ensure(destination, 1)
        queues = self.broker.topic_queues(destination)
        queue_id = zlib.crc32((message.unique_id or message.msg_id).encode()) % len(queues)
        copy = Message(destination, message.body, tags=message.tags, keys=message.keys,
                       properties=message.user_properties)
        result = self.broker.put(copy, queue_id, allow_system_topic=target == "retry", extra_properties=lineage)
        self.broker.report_redriven(group, message, result.msg_id, destination)
        return ResentMessage(message.queue_id, message.queue_offset, message.unique_id, original, destination,
                             queue_id, result.msg_id)

    # -------------------------------------------------------------------------------- broker
    def broker_status(self) -> BrokerStatus:
        broker = self.broker
        traffic = broker.traffic.snapshot()
        replication = broker.replication.status().as_dict() if broker.replication is not None else {}
        return BrokerStatus(
            broker=broker.name, role=broker.role.value if broker.replication is not None else "standalone",
            epoch=broker.epoch, replication=replication, data_dir=str(broker.data_dir),
            acked_by_epoch={str(epoch): count for epoch, count in broker.acked_by_epoch().items()},
            plugins=tuple(broker.config.plugins), topics=len(broker.topics.all()), groups=len(self.group_names()),
            pop_inflight=broker.pop.inflight_count(),
            delay_pending=broker.delay.pending() if broker.delay is not None else None,
            transactions_pending=broker.transactions.pending() if broker.transactions is not None else None,
            messages_in=sum(traffic.messages_in.values()), messages_out=sum(traffic.messages_out.values()),
            store=dict(broker.store.stats()), delay=dict(broker.delay.metrics()) if broker.delay else {},
        )


def _check_max(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUERY:
        raise ValidationError(f"the maximum number of messages must be 1..{MAX_QUERY}, got {value!r}")
