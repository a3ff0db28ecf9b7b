"""Pop consumption (RocketMQ 5): receive makes messages invisible, ack finishes them.

A received message stays invisible to its group for the requested time and carries a receipt
handle. Ack ends it; a change of its invisible duration moves the deadline (and issues a new
handle). When the deadline passes unacked, the message is visible again and its next delivery is
attempt + 1; a message whose attempt was the group's last (:class:`RedeliveryPolicy`) goes to the
group's dead-letter topic instead, when its deadline passes, whether or not anyone receives.

A consumer that *gives up* on a message (a push consumer's nack, :meth:`SimpleConsumer.nack`)
gets it back no sooner than the policy's back-off for that attempt, whatever duration it asked
for: a client that ignores or misreports the back-off cannot spin a message into the DLQ. A plain
change of the invisible duration (a simple consumer extending or shortening its own processing
time) is honoured as asked.

FIFO groups: a queue hands out nothing new while any message of it is in flight (message groups
are hashed to queues on send), and one receive never carries two messages of one message group,
so a group's next message comes only after the previous is acked.

Used by ``broker.simple_consumer`` (plugmq.client.simple) and by the gRPC server, which only
translates the protocol.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

from plugmq.broker.popstate import Inflight, Lane, PopState
from plugmq.broker.ratelimit import RateLimiter
from plugmq.client.values import ReceivedMessage
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.config.topics import TopicSettingsTable
from plugmq.core.clock import Clock, Timer
from plugmq.core.contracts import ConsumerHandover, Filter
from plugmq.core.errors import InvalidNameError, ReceiptHandleError, TopicError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import ConsumeQueueEntry, MessageQueue, PullResult, PullStatus, SendResult, StoredMessage
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import Prop, validate_group

__all__ = ["LaneProgress", "PopBackend", "PopService", "ReceiptHandle", "ReceivedMessage"]

log = get_logger(__name__)


@attrs.frozen
class ReceiptHandle:
    """What a receipt handle encodes: the queue offset and which delivery of it (``seq``)."""

    queue_id: int
    offset: int
    seq: int

    def __str__(self) -> str:
        return f"{self.queue_id}:{self.offset}:{self.seq}"

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        try:
            queue_id, offset, seq = map(int, text.split(":"))
        except (ValueError, AttributeError):
            raise ReceiptHandleError(f"receipt handle {text!r} was not issued by this broker; pass the "
                                     "receipt_handle of a received message") from None
        return cls(queue_id, offset, seq)


@attrs.frozen
class LaneProgress:
    """A pop group's position on one queue: offsets below ``done_below`` are done (acked or
    dead-lettered); from there to ``next_offset`` only the ``inflight`` ones are not."""

    group: str
    topic: str
    queue_id: int
    next_offset: int
    inflight: int
    done_below: int


class PopBackend(Protocol):
    """What pop consumption needs of the broker (the Broker implements it)."""

    clock: Clock

    def topic_queues(self, topic: str, *, create: bool | None = None) -> list[MessageQueue]: ...

    def check_serving(self) -> None:
        """Raise (FencedError) while the broker may hand out no messages."""

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, subscription: Filter | None = None, *,
             consumer_group: str = "", client_id: str = "") -> PullResult: ...

    def read_message(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None: ...

    def read_messages(self, entries: Sequence[ConsumeQueueEntry]) -> list[StoredMessage | None]:
        """The message of each entry, in one call when the store reads in bulk (None: gone)."""

    def start_offset(self, queue: MessageQueue, consume_from: ConsumeFrom, timestamp_ms: int | None = None
                     ) -> int: ...

    def group_policy(self, group: str) -> GroupPolicy: ...

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None
                    ) -> SendResult: ...

    def report_delivered(self, group: str, messages: list[StoredMessage], client_id: str = "") -> None: ...

    def report_pop_acked(self, group: str, commit_log_offset: int, size: int, client_id: str = "") -> None: ...

    def report_invisible_changed(self, group: str, commit_log_offset: int, size: int, client_id: str,
                                 invisible_ms: int, gave_up: bool) -> None: ...

    def report_retried(self, group: str, message: StoredMessage, reconsume_times: int) -> None: ...


class PopService:
    """Receive / ack / change / dead-letter over a broker and a durable PopState. Thread-safe.

    One timer on the broker's clock at the earliest invisible deadline dead-letters messages whose
    last attempt timed out and tells ``deadline_listeners`` that messages became visible again.
    """

    def __init__(self, backend: PopBackend, state: PopState, limits: RateLimiter | None = None,
                 topic_settings: TopicSettingsTable | None = None) -> None:
        self.backend = backend
        self.state = state
        self._limits = limits
        self._topic_settings = topic_settings or TopicSettingsTable()
        self._clock = backend.clock
        self._rotation: dict[tuple[str, str], itertools.count[int]] = {}
        self._timer_lock = threading.Lock()
        self._timer: Timer | None = None
        self._armed_ms: int | None = None
        self._closed = False
        self.deadline_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------------------ receive
    def receive(self, group: str, topic: str, subscription: Filter | None, max_messages: int, invisible_ms: int,
                *, consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET,
                consume_timestamp_ms: int | None = None, only_queue: int | None = None,
                client_id: str = "", account: str | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` of ``topic`` for ``group``: redeliveries first, then new ones.

        ``consume_from`` places a queue the group has never received from: its first message
        (FIRST_OFFSET), messages sent from now on (LAST_OFFSET) or from ``consume_timestamp_ms``.
        ``only_queue``: read that queue alone (a consumer allocated queues rather than brokers).
        ``client_id``: the receiving client, for the delivered events (observers, message trace).
        A priority topic's queues are read highest first (RIP-80: a backlog goes out by priority).
        A group (or ``account``) with a rate limit gets at most what it may have now, and
        RateLimitedError when that is nothing.
        """
        if max_messages < 1:
            raise ValidationError(f"max_messages must be >= 1, got {max_messages}")
        limits = self._limits if self._limits is not None and self._limits.active else None
        if limits is None:
            return self._receive(group, topic, subscription, max_messages, invisible_ms, consume_from,
                                 consume_timestamp_ms, only_queue, client_id)
        granted = limits.grant(group, account, max_messages)
        out: list[ReceivedMessage] = []
        try:
            out = self._receive(group, topic, subscription, granted, invisible_ms, consume_from, consume_timestamp_ms,
                                only_queue, client_id)
        finally:
            limits.settle(group, account, granted, len(out), sum(len(m.body) for m in out))
        return out

    def _receive(self, group: str, topic: str, subscription: Filter | None, max_messages: int, invisible_ms: int,
                 consume_from: ConsumeFrom, consume_timestamp_ms: int | None, only_queue: int | None,
                 client_id: str) -> list[ReceivedMessage]:
        if invisible_ms <= 0:
            raise ValidationError(f"the invisible duration must be > 0, got {invisible_ms / 1000:g} s")
        if consume_from is ConsumeFrom.TIMESTAMP and consume_timestamp_ms is None:
            raise ValidationError("consume_from=TIMESTAMP needs consume_timestamp_ms")
        self.backend.check_serving()  # a master not sure it leads hands out nothing, not even redeliveries
        queues = self.backend.topic_queues(topic, create=False)
        if only_queue is not None:
            queues = [q for q in queues if q.queue_id == only_queue]
        policy = self.backend.group_policy(group)
        start = functools.partial(self.backend.start_offset, consume_from=consume_from,
                                  timestamp_ms=consume_timestamp_ms)

        if self._topic_settings.settings(topic).priority:
            order = sorted(queues, key=lambda q: -q.queue_id)  # the highest priority's queue first
        else:
            first = next(self._rotation.setdefault((group, topic), itertools.count()))
            order = [queues[(first + i) % len(queues)] for i in range(len(queues))]
        out: list[ReceivedMessage] = []
        with self.state.lock:
            now = self._clock.now_ms()
            for queue in order:
                lane = self.state.lane(group, topic, queue.queue_id, functools.partial(start, queue))
                out.extend(self._take(lane, queue, subscription, max_messages - len(out), invisible_ms, now, policy,
                                      client_id))
                if len(out) >= max_messages:
                    break
        if out:
            self._arm(now + invisible_ms)
        return out

    def _take(self, lane: Lane, queue: MessageQueue, subscription: Filter | None, want: int, invisible_ms: int,
              now: int, policy: GroupPolicy, client_id: str) -> list[ReceivedMessage]:
        until = now + invisible_ms
        rows: list[list[Any]] = []
        out: list[ReceivedMessage] = []
        redelivered: list[StoredMessage] = []
        gone: list[int] = []

        def hand_out(message: StoredMessage, attempt: int, message_group: str | None) -> None:
            seq = self.state.next_seq()
            rows.append([message.queue_offset, attempt, until, seq, message.commit_log_offset, message.size,
                         message_group])
            out.append(ReceivedMessage.of(message, receipt_handle=str(ReceiptHandle(queue.queue_id,
                                                                                    message.queue_offset, seq)),
                                          delivery_attempt=attempt, invisible_duration_ms=invisible_ms,
                                          consumer_group=lane.group))

        expired = self._timed_out(lane, now, want, policy)
        again = self.backend.read_messages([ConsumeQueueEntry(e.offset, e.commit_log_offset, e.size, 0)
                                            for e in expired])
        for entry, stored in zip(expired, again):
            if stored is None:
                log.warning("in-flight message no longer in the store (retention); dropped", group=lane.group,
                            topic=lane.topic, queue=lane.queue_id, offset=entry.offset)
                gone.append(entry.offset)
                continue
            hand_out(stored, entry.attempt + 1, entry.message_group)
            redelivered.append(out[-1])
        next_offset = lane.next_offset
        blocked = policy.fifo and len(lane.inflight) > len(gone)
        if len(out) < want and not blocked:
            next_offset = self._take_new(lane, queue, subscription, want - len(out), policy, hand_out, client_id)
        ops: list[list[Any]] = []
        if gone:
            ops.append(["A", lane.id, gone])
        if rows or next_offset != lane.next_offset:
            ops.append(["P", lane.id, next_offset, rows])
        self.state.commit(ops)
        if redelivered:
            self.backend.report_delivered(lane.group, redelivered, client_id)
        return out

    def _take_new(self, lane: Lane, queue: MessageQueue, subscription: Filter | None, want: int,
                  policy: GroupPolicy, hand_out: Callable[[StoredMessage, int, str | None], None],
                  client_id: str) -> int:
        result = self.backend.pull(queue, lane.next_offset, want, subscription, consumer_group=lane.group,
                                   client_id=client_id)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning("group's position is outside the queue (retention or a store reset); moved", group=lane.group,
                        topic=lane.topic, queue=lane.queue_id, was=lane.next_offset, now=result.next_begin_offset)
            result = self.backend.pull(queue, result.next_begin_offset, want, subscription, consumer_group=lane.group,
                                       client_id=client_id)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                return result.next_begin_offset
        next_offset = result.next_begin_offset
        seen: set[str] = set()
        for message in result.messages:
            message_group = message.properties.get(Prop.SHARDING_KEY)
            if policy.fifo and message_group is not None:
                if message_group in seen:
                    return message.queue_offset  # the group's next message waits for this one's ack
                seen.add(message_group)
            hand_out(message, 1, message_group)
        return next_offset

    # ------------------------------------------------------------------------------ expiry
    def _timed_out(self, lane: Lane, now: int, want: int, policy: GroupPolicy) -> list[Inflight]:
        """The first ``want`` timed-out messages of the lane to deliver again (in queue order);
        those met on the way that used their last attempt are dead-lettered instead (a slave,
        which cannot write dead letters, delivers them again, as it always has)."""
        exhausted = policy.redelivery.exhausted if self.state.writable else _never
        again, spent = lane.first_timed_out(now, want, lambda entry: exhausted(entry.attempt))
        if spent:
            self._dead_letter_spent(lane, spent, policy)
        return again

    def _expire(self, lane: Lane, now: int, policy: GroupPolicy) -> None:
        """Dead-letter this lane's timed-out messages that used their last attempt."""
        exhausted = policy.redelivery.exhausted
        spent = [entry for entry in lane.timed_out(now) if exhausted(entry.attempt)]
        if spent:
            self._dead_letter_spent(lane, spent, policy)

    def _dead_letter_spent(self, lane: Lane, spent: list[Inflight], policy: GroupPolicy) -> None:
        if not self.state.writable:
            return  # a slave cannot write dead letters: its master (or its promotion) will
        for entry in spent:
            self._dead_letter(lane, entry, policy, reason="max delivery attempts reached")
            self.state.commit([["A", lane.id, [entry.offset]]])  # one by one: a failure repeats none

    def _dead_letter(self, lane: Lane, entry: Inflight, policy: GroupPolicy, *, reason: str) -> None:
        stored = self.backend.read_message(entry.commit_log_offset, entry.size)
        if stored is None:
            log.warning("message to dead-letter is no longer in the store", group=lane.group, topic=lane.topic,
                        offset=entry.offset)
            return
        # The DLQ copy records how often the group tried: RocketMQ's reconsume times = attempt - 1.
        self.backend.dead_letter(attrs.evolve(stored, reconsume_times=entry.attempt - 1), lane.group,
                                 policy.redelivery)
        log.info("message moved to the group's dead-letter topic", group=lane.group, topic=lane.topic,
                 queue=lane.queue_id, offset=entry.offset, attempts=entry.attempt, reason=reason)

    def revive(self, at_ms: int | None = None) -> int | None:
        """Dead-letter every message whose last attempt timed out by now (or by ``at_ms``, a
        deadline the clock reports passing); returns the next deadline after that (or None)."""
        with self.state.lock:
            now = max(self._clock.now_ms(), at_ms or 0)
            for lane in list(self.state.by_id.values()):
                self._expire(lane, now, self.backend.group_policy(lane.group))
            return self._deadline_after(now)

    def next_deadline(self) -> int | None:
        """The earliest invisible deadline still ahead (ms on the broker's clock), or None."""
        with self.state.lock:
            return self._deadline_after(self._clock.now_ms())

    def _deadline_after(self, now: int) -> int | None:
        return min((until for lane in self.state.by_id.values() if (until := lane.next_deadline(now)) is not None),
                   default=None)

    def _arm(self, deadline_ms: int | None) -> None:
        """Keep one clock timer at the earliest deadline; later ones are found when it fires."""
        if deadline_ms is None:
            return
        with self._timer_lock:
            if self._closed or (self._armed_ms is not None and self._armed_ms <= deadline_ms):
                return
            if self._timer is not None:
                self._timer.cancel()
            self._armed_ms = deadline_ms
            self._timer = self._clock.call_at(deadline_ms / 1000, lambda: self._deadline_passed(deadline_ms))

    def _deadline_passed(self, deadline_ms: int) -> None:
        with self._timer_lock:
            if self._closed or self._armed_ms != deadline_ms:
                return
            self._armed_ms = None
            self._timer = None
        try:
            # At ``deadline_ms`` at least: a clock's float seconds may read a millisecond early.
            following = self.revive(deadline_ms)
        except Exception:
            if self._closed:
                return  # the broker closed while the timer ran
            log.exception("dead-lettering timed-out messages failed; retried at the next deadline")
            with self.state.lock:
                following = self._deadline_after(deadline_ms)
        for listener in list(self.deadline_listeners):
            listener()
        self._arm(following)

    def start(self) -> None:
        """Dead-letter what timed out while the broker was down; arm the timer for the rest.

        A failure here (a full disk refusing the DLQ copies) does not stop the broker: the
        messages stay in flight and the timer tries again a second later.
        """
        try:
            following = self.revive()
        except Exception:
            log.exception("dead-lettering messages that timed out while the broker was down failed; retrying")
            following = self._clock.now_ms() + 1000
        self._arm(following)

    # ------------------------------------------------------------------------------ ack & co
    def _find(self, group: str, topic: str, text: str) -> tuple[Lane, Inflight, ReceiptHandle]:
        handle = ReceiptHandle.parse(text)
        lane = self.state.lanes.get((group, topic, handle.queue_id))
        entry = lane.inflight.get(handle.offset) if lane is not None else None
        if lane is None or entry is None:
            raise ReceiptHandleError(
                f"no message of group {group!r} on topic {topic!r} is in flight for receipt handle {text!r}: "
                "it was acknowledged already, moved to the dead-letter topic, or the group/topic differ")
        if entry.seq != handle.seq:
            raise ReceiptHandleError(
                f"receipt handle {text!r} is stale: the message's invisible time ran out and it was delivered "
                f"again (attempt {entry.attempt}), or its invisible duration was changed; use the newest "
                "receipt handle")
        return lane, entry, handle

    def ack(self, group: str, topic: str, receipt_handle: str, *, client_id: str = "") -> None:
        """The group is done with the message: it never comes back. ``client_id``: who acked."""
        self.backend.check_serving()  # a failover slave or a fenced master could not keep that promise
        with self.state.lock:
            lane, entry, _ = self._find(group, topic, receipt_handle)
            end = self.state.commit([["A", lane.id, [entry.offset]]])
        self.state.settle(end)  # a sync_master's slave holds the ack before the client hears of it
        self.backend.report_pop_acked(group, entry.commit_log_offset, entry.size, client_id)

    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str, invisible_ms: int,
                                  *, gave_up: bool = False, client_id: str = "") -> str:
        """Make the message invisible until now + ``invisible_ms``; returns its new receipt handle.

        ``gave_up``: the consumer failed on the message and wants it again later (a push
        consumer's nack); the new deadline is then at least the policy's back-off for this attempt.
        """
        if invisible_ms < 0:
            raise ValidationError(f"the invisible duration must be >= 0, got {invisible_ms / 1000:g} s")
        self.backend.check_serving()
        retried: StoredMessage | None = None
        with self.state.lock:
            lane, entry, handle = self._find(group, topic, receipt_handle)
            now = self._clock.now_ms()
            wait = invisible_ms
            if gave_up:
                redelivery = self.backend.group_policy(group).redelivery
                wait = max(invisible_ms, redelivery.backoff_ms(entry.attempt))
                if not redelivery.exhausted(entry.attempt):
                    retried = self.backend.read_message(entry.commit_log_offset, entry.size)
            until = now + wait
            seq = self.state.next_seq()
            self.state.commit([["C", lane.id, entry.offset, until, seq]])
            attempt = entry.attempt
        self.backend.report_invisible_changed(group, entry.commit_log_offset, entry.size, client_id, wait, gave_up)
        if retried is not None:
            self.backend.report_retried(group, retried, attempt)
        self._arm(until)
        return str(ReceiptHandle(handle.queue_id, handle.offset, seq))

    def forward_to_dead_letter_queue(self, group: str, topic: str, receipt_handle: str) -> None:
        """Move the message to the group's dead-letter topic now (a client that gives up for good)."""
        self.backend.check_serving()
        with self.state.lock:
            lane, entry, _ = self._find(group, topic, receipt_handle)
            self._dead_letter(lane, entry, self.backend.group_policy(group), reason="the consumer forwarded it")
            end = self.state.commit([["A", lane.id, [entry.offset]]])
        self.state.settle(end)

    # ------------------------------------------------------------------------------ housekeeping
    def inflight_count(self, group: str | None = None) -> int:
        with self.state.lock:
            return sum(len(lane.inflight) for lane in self.state.by_id.values()
                       if group is None or lane.group == group)

    def inflight(self, group: str, limit: int = 1000) -> list[tuple[str, int, Inflight]]:
        """The group's messages in flight, ``(topic, queue id, entry)`` in that order, at most ``limit``."""
        with self.state.lock:
            found = [(lane.topic, lane.queue_id, entry) for lane in self.state.by_id.values() if lane.group == group
                     for entry in lane.inflight.values()]
        found.sort(key=lambda row: (row[0], row[1], row[2].offset))
        return found[:limit]

    def groups(self) -> list[str]:
        """Groups with pop progress on any queue (sorted)."""
        with self.state.lock:
            return sorted({lane.group for lane in self.state.by_id.values()})

    def progress(self, group: str) -> list[LaneProgress]:
        """The group's position on every queue it has received from, ordered by topic and queue."""
        with self.state.lock:
            lanes = [lane for lane in self.state.by_id.values() if lane.group == group]
            out = [LaneProgress(lane.group, lane.topic, lane.queue_id, lane.next_offset, len(lane.inflight),
                                min(lane.inflight, default=lane.next_offset)) for lane in lanes]
        return sorted(out, key=lambda p: (p.topic, p.queue_id))

    def reset(self, group: str, topic: str, offsets: dict[int, int]) -> dict[int, int | None]:
        """Move the group's cursor on each queue of ``topic`` in ``offsets`` (queue id -> offset) and
        forget its in-flight messages there, whose receipt handles stop working: messages from the
        offset on are delivered again as new ones. Returns each queue's previous cursor (None where
        the group had none)."""
        previous: dict[int, int | None] = {}
        with self.state.lock:
            for queue_id, offset in sorted(offsets.items()):
                lane = self.state.lanes.get((group, topic, queue_id))
                if lane is None:
                    previous[queue_id] = None
                    self.state.lane(group, topic, queue_id, functools.partial(int, offset))
                    continue
                previous[queue_id] = lane.next_offset
                self.state.commit([["R", lane.id, offset]])
        log.info("pop group position reset", group=group, topic=topic, offsets=offsets)
        for listener in list(self.deadline_listeners):
            listener()  # messages may be available again: long polls look now
        return previous

    def adopt(self, lanes: ConsumerHandover, shared_end: int) -> int:
        """Take the progress a slave's own readers made while no master was up (``(group, topic,
        queue id, done below)``, see ``PopState.handover``): a lane of this broker whose lowest
        offset not done is below ``done below`` moves its cursor there (its in-flight messages
        are forgotten; those at or above the cursor come again as new ones), so what the slave's
        readers acknowledged is not delivered again.

        ``shared_end``: the commit-log offset up to which the slave's log and this broker's agree
        (where the slave was cut back to, else its end). The slave's readers can only have acked
        messages below it; past it this broker's queue offsets name other messages (a slave that
        was ahead of the one elected), so the cursor never moves beyond the last message within.
        Never moves a lane back; topics this broker does not have are skipped. Returns how many
        lanes moved."""
        moved = 0
        with self.state.lock:
            for progress in lanes:
                (group, topic, queue_id), done = progress.key, progress.done_below
                try:
                    validate_group(group)
                    queues = {q.queue_id: q for q in self.backend.topic_queues(topic, create=False)}
                except (InvalidNameError, TopicError):
                    continue
                queue = queues.get(queue_id)
                if queue is None or done <= 0:
                    continue
                lane = self.state.lanes.get((group, topic, queue_id))
                mine = 0 if lane is None else min(lane.inflight, default=lane.next_offset)
                target = self._shared_below(queue, mine, done, shared_end)
                if target <= mine and (lane is not None or target == 0):
                    continue
                self.reset(group, topic, {queue_id: target})
                moved += 1
        if moved:
            log.info("consumer progress taken over from a slave that served reads while no master was up",
                     lanes=moved)
        return moved

    def _shared_below(self, queue: MessageQueue, low: int, high: int, shared_end: int) -> int:
        """The highest cursor in [low, high] whose messages below all lie before ``shared_end``
        in the log (queue order is log order: a binary search over the queue)."""
        def within(cursor: int) -> bool:
            if cursor <= 0:
                return True
            messages = self.backend.pull(queue, cursor - 1, 1).messages
            if not messages or messages[0].queue_offset != cursor - 1:
                return False  # gone (retention) or never stored here: not known to be shared
            return messages[0].commit_log_offset + messages[0].size <= shared_end

        if within(high):
            return high
        good, bad = low, high  # within(bad) is false; low is the answer when nothing above it is within
        while bad - good > 1:
            middle = (good + bad) // 2
            if within(middle):
                good = middle
            else:
                bad = middle
        return good

    def delete_group(self, group: str) -> int:
        """Forget the group's progress and in-flight messages on every topic; returns lanes dropped."""
        with self.state.lock:
            return self.state.drop_lanes([lane for lane in list(self.state.by_id.values()) if lane.group == group])

    def delete_topic(self, topic: str) -> tuple[list[str], int]:
        """Forget every group's progress and in-flight messages on ``topic`` (it was deleted);
        returns the groups that had some (sorted) and how many messages were in flight."""
        with self.state.lock:
            doomed = [lane for lane in list(self.state.by_id.values()) if lane.topic == topic]
            inflight = sum(len(lane.inflight) for lane in doomed)
            self.state.drop_lanes(doomed)
            for key in [k for k in self._rotation if k[1] == topic]:
                del self._rotation[key]
        return sorted({lane.group for lane in doomed}), inflight

    def collect(self, known_topics: Iterable[str]) -> int:
        """Drop the lanes of topics the broker no longer has; returns how many were dropped."""
        known = set(known_topics)
        with self.state.lock:
            doomed = [lane for lane in list(self.state.by_id.values()) if lane.topic not in known]
            dropped = self.state.drop_lanes(doomed)
        if dropped:
            log.info("pop lanes of unknown topics dropped", lanes=dropped,
                     topics=sorted({lane.topic for lane in doomed}))
        return dropped

    def close(self) -> None:
        with self._timer_lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
        self.state.close()


def _never(_attempt: int) -> bool:
    return False
