"""Pop-style consumption (RocketMQ 5): receive makes messages invisible, ack finishes them.

A received message stays invisible to its group for the requested time and carries a receipt
handle. Ack ends it; ChangeInvisibleDuration moves its deadline (and issues a new handle). When
the deadline passes unacked, the message is visible again and its next delivery is attempt + 1;
once a message whose attempt reached the group's ``max_delivery_attempts`` times out, it goes to
``%DLQ%<group>`` instead. FIFO groups: a queue hands out nothing new while any message of it is
in flight (message groups are hashed to queues on send), and one receive never carries two
messages of one message group, so a group's next message comes only after the previous is acked.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import structlog
from rocketmq.grpc_protocol import Code

from plugmq.core.contracts import Filter
from plugmq.core.message import MessageQueue, PullStatus, StoredMessage
from plugmq.core.names import Prop
from plugmq.server.options import GroupPolicy, ServerOptions
from plugmq.server.popstate import Inflight, Lane, PopState
from plugmq.server.status import RpcFailure

if TYPE_CHECKING:
    from plugmq.core.broker import Broker

__all__ = ["Delivery", "Handle", "PopService"]

log = structlog.stdlib.get_logger(__name__)


@attrs.frozen
class Handle:
    """A receipt handle: which queue offset, and which delivery of it (``seq``)."""

    queue_id: int
    offset: int
    seq: int

    def __str__(self) -> str:
        return f"{self.queue_id}:{self.offset}:{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Handle:
        try:
            queue_id, offset, seq = (int(part) for part in text.split(":"))
        except ValueError:
            raise RpcFailure(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {text!r} was not issued by this server; "
                                                          "pass the receipt_handle of a received message") from None
        return cls(queue_id, offset, seq)


@attrs.frozen
class Delivery:
    message: StoredMessage
    attempt: int
    receipt_handle: str
    invisible_ms: int


class PopService:
    """Receive / ack / change / dead-letter over a broker and a durable PopState. Thread-safe."""

    def __init__(self, broker: Broker, options: ServerOptions, state: PopState,
                 on_deadline: Callable[[int], None] | None = None) -> None:
        self.broker = broker
        self.options = options
        self.state = state
        self._clock = broker.clock
        self._rotation: dict[tuple[str, str], itertools.count[int]] = {}
        self._on_deadline = on_deadline or (lambda _ms: None)

    # ------------------------------------------------------------------------------ receive
    def receive(self, group: str, topic: str, subscription: Filter | None, batch: int,
                invisible_ms: int) -> list[Delivery]:
        """Up to ``batch`` messages of ``topic`` for ``group``: redeliveries first, then new ones."""
        queues = self.broker.topic_queues(topic, create=False)
        policy = self.options.policy(group)
        out: list[Delivery] = []
        with self.state.lock:
            now = self._clock.now_ms()
            first = next(self._rotation.setdefault((group, topic), itertools.count()))
            for i in range(len(queues)):
                queue = queues[(first + i) % len(queues)]
                lane = self.state.lane(group, topic, queue.queue_id, lambda q=queue: self._start(q))
                self._expire(lane, now, policy)
                out.extend(self._take(lane, queue, subscription, batch - len(out), invisible_ms, now, policy))
                if len(out) >= batch:
                    break
        if out:
            self._on_deadline(now + invisible_ms)
        return out

    def _start(self, queue: MessageQueue) -> int:
        if self.options.new_group_from == "last":
            return self.broker.max_offset(queue)
        return self.broker.min_offset(queue)

    def _take(self, lane: Lane, queue: MessageQueue, subscription: Filter | None, want: int, invisible_ms: int,
              now: int, policy: GroupPolicy) -> list[Delivery]:
        until = now + invisible_ms
        rows: list[list[Any]] = []
        out: list[Delivery] = []
        done: list[int] = []

        def hand_out(message: StoredMessage, attempt: int, group: str | None) -> None:
            seq = self.state.next_seq()
            rows.append([message.queue_offset, attempt, until, seq, message.commit_log_offset, message.size, group])
            out.append(Delivery(message, attempt, str(Handle(queue.queue_id, message.queue_offset, seq)), invisible_ms))

        expired = sorted((e for e in lane.inflight.values() if e.until_ms <= now), key=lambda e: e.offset)
        for entry in expired[:want]:
            stored = self.broker.store.read(entry.commit_log_offset, entry.size)
            if stored is None:
                log.warning("in-flight message no longer in the store (retention); dropped", group=lane.group,
                            topic=lane.topic, queue=lane.queue_id, offset=entry.offset)
                done.append(entry.offset)
                continue
            hand_out(stored, entry.attempt + 1, entry.message_group)
        next_offset = lane.next_offset
        blocked = policy.fifo and len(lane.inflight) > len(done)
        if len(out) < want and not blocked:
            next_offset = self._take_new(lane, queue, subscription, want - len(out), policy, hand_out)
        ops: list[list[Any]] = []
        if done:
            ops.append(["A", lane.id, done])
        if rows or next_offset != lane.next_offset:
            ops.append(["P", lane.id, next_offset, rows])
        self.state.commit(ops)
        return out

    def _take_new(self, lane: Lane, queue: MessageQueue, subscription: Filter | None, want: int,
                  policy: GroupPolicy, hand_out: Callable[[StoredMessage, int, str | None], None]) -> int:
        result = self.broker.pull(queue, lane.next_offset, want, subscription, consumer_group=lane.group)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning("group's position is outside the queue (retention or a store reset); moved", group=lane.group,
                        topic=lane.topic, queue=lane.queue_id, was=lane.next_offset, now=result.next_begin_offset)
            result = self.broker.pull(queue, result.next_begin_offset, want, subscription, consumer_group=lane.group)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                return result.next_begin_offset
        next_offset = result.next_begin_offset
        seen: set[str] = set()
        for message in result.messages:
            group = message.properties.get(Prop.SHARDING_KEY)
            if policy.fifo and group is not None:
                if group in seen:
                    return message.queue_offset  # the group's next message waits for this one's ack
                seen.add(group)
            hand_out(message, 1, group)
        return next_offset

    # ------------------------------------------------------------------------------ expiry
    def _expire(self, lane: Lane, now: int, policy: GroupPolicy) -> None:
        """Dead-letter this lane's timed-out messages that used their last attempt."""
        spent = [e for e in lane.inflight.values() if e.until_ms <= now and e.attempt >= policy.max_delivery_attempts]
        if not spent:
            return
        for entry in sorted(spent, key=lambda e: e.offset):
            self._dead_letter(lane, entry, reason="max delivery attempts reached")
        self.state.commit([["A", lane.id, [e.offset for e in spent]]])

    def _dead_letter(self, lane: Lane, entry: Inflight, *, reason: str) -> None:
        stored = self.broker.store.read(entry.commit_log_offset, entry.size)
        if stored is None:
            log.warning("message to dead-letter is no longer in the store", group=lane.group, topic=lane.topic,
                        offset=entry.offset)
            return
        # The DLQ copy records how often the group tried: RocketMQ's reconsume times = attempt - 1.
        self.broker.dead_letter(attrs.evolve(stored, reconsume_times=entry.attempt - 1), lane.group)
        log.info("message moved to the group's DLQ", group=lane.group, topic=lane.topic, queue=lane.queue_id,
                 offset=entry.offset, attempts=entry.attempt, reason=reason)

    def revive(self) -> int | None:
        """Dead-letter every timed-out message at its last attempt; the next deadline (or None)."""
        with self.state.lock:
            now = self._clock.now_ms()
            for lane in list(self.state.by_id.values()):
                self._expire(lane, now, self.options.policy(lane.group))
            return self.next_deadline()

    def next_deadline(self) -> int | None:
        with self.state.lock:
            return min((e.until_ms for lane in self.state.by_id.values() for e in lane.inflight.values()),
                       default=None)

    # ------------------------------------------------------------------------------ ack & co
    def _find(self, group: str, topic: str, text: str) -> tuple[Lane, Inflight, Handle]:
        handle = Handle.parse(text)
        lane = self.state.lanes.get((group, topic, handle.queue_id))
        entry = lane.inflight.get(handle.offset) if lane is not None else None
        if lane is None or entry is None:
            raise RpcFailure(Code.INVALID_RECEIPT_HANDLE,
                             f"no message of group {group!r} on topic {topic!r} is in flight for receipt handle "
                             f"{text!r}: it was acknowledged already, moved to the DLQ, or the group/topic differ")
        if entry.seq != handle.seq:
            raise RpcFailure(Code.INVALID_RECEIPT_HANDLE,
                             f"receipt handle {text!r} is stale: the message's invisible time ran out and it was "
                             f"delivered again (attempt {entry.attempt}); use the newest delivery's receipt handle")
        return lane, entry, handle

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        with self.state.lock:
            lane, entry, _ = self._find(group, topic, receipt_handle)
            self.state.commit([["A", lane.id, [entry.offset]]])

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Move the message's deadline to now + ``invisible_ms``; returns the new receipt handle."""
        with self.state.lock:
            lane, entry, handle = self._find(group, topic, receipt_handle)
            until = self._clock.now_ms() + invisible_ms
            seq = self.state.next_seq()
            self.state.commit([["C", lane.id, entry.offset, until, seq]])
        self._on_deadline(until)
        return str(Handle(handle.queue_id, handle.offset, seq))

    def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        with self.state.lock:
            lane, entry, _ = self._find(group, topic, receipt_handle)
            self._dead_letter(lane, entry, reason="client forwarded it")
            self.state.commit([["A", lane.id, [entry.offset]]])
