"""Consumers: push consumers (concurrent or orderly listeners) and a pull consumer.

A push consumer's work is one deterministic step, :meth:`PushConsumer.consume_available`: pull
every owned queue, hand the messages to the listener on the consumer's thread pool, send failed
ones back for retry (or to the DLQ, as the group's RedeliveryPolicy says) and commit offsets. With
``background=True`` (the default on the system clock) a thread repeats that step whenever
messages arrive; on a ManualClock, tests and simulations call it themselves, so nothing races.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from plugmq.client.ports import GroupConsuming, Reading
from plugmq.config.policy import RedeliveryPolicy
from plugmq.core.clock import SystemClock, Timer
from plugmq.core.contracts import Filter
from plugmq.core.errors import ClientError, DelayUnsupportedError, RateLimitedError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue, PullResult, PullStatus, StoredMessage
from plugmq.core.modes import ConsumeFrom, ConsumeStatus, MessageModel, OrderlyStatus
from plugmq.core.names import RETRY_PREFIX, Prop, retry_topic, validate_group, validate_room, validate_topic

__all__ = [
    "ConsumeFrom",
    "ConsumeStatus",
    "MessageModel",
    "OrderlyStatus",
    "PullConsumer",
    "PushConsumer",
    "Subscription",
]

log = get_logger(__name__)

#: Pulls one consume task makes of its queue while they come back full (see PushConsumer._consume_queue).
PULLS_PER_TASK = 4
_client_counter = itertools.count(1)


@attrs.frozen
class Subscription:
    topic: str
    expression_type: str
    expression: str
    filter: Filter | None


Listener = Callable[[list[StoredMessage]], Any]


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}#{next(_client_counter)}"


class PushConsumer:
    """A consumer group member that receives messages through a listener.

    ``listener(messages) -> ConsumeStatus`` (concurrent) or ``-> OrderlyStatus`` (``orderly=True``);
    an exception counts as RECONSUME_LATER / SUSPEND. Build it with ``broker.push_consumer``.
    Failed messages are retried and dead-lettered as ``policy`` says (default: the group's, from
    the broker's ``[groups]``); ``max_reconsume_times`` (RocketMQ's name) overrides its attempts.
    ``room``: the machine room this consumer runs in, for room strategies (``MACHINE_ROOM_NEARBY``
    gives it its room's queues first; the brokers' rooms are their ``[broker] room``).
    """

    # With nothing to consume, the loop waits for the broker's wake-up at most this long; a latency
    # figure stuck at this value measured the wait, not the store (the Spark report flags it).
    idle_wait_s = 0.5

    def __init__(
        self,
        broker: GroupConsuming,
        group: str,
        listener: Listener,
        *,
        orderly: bool = False,
        model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        strategy: str = "AVG",
        strategy_params: dict[str, Any] | None = None,
        client_id: str | None = None,
        consume_threads: int = 4,
        batch_size: int = 1,
        pull_batch_size: int = 32,
        suspend_ms: int = 1000,
        policy: RedeliveryPolicy | None = None,
        max_reconsume_times: int | None = None,
        heartbeat_interval_s: float = 30.0,
        background: bool | None = None,
        room: str | None = None,
    ) -> None:
        self.broker = broker
        self.group = validate_group(group)
        self.listener = listener
        self.orderly = orderly
        self.model = model
        self.consume_from = consume_from
        if consume_from is ConsumeFrom.TIMESTAMP and consume_timestamp_ms is None:
            raise ValidationError("consume_from=TIMESTAMP needs consume_timestamp_ms")
        self.consume_timestamp_ms = consume_timestamp_ms
        if batch_size < 1 or pull_batch_size < 1:
            raise ValidationError(f"batch_size and pull_batch_size must be >= 1, got {batch_size}, {pull_batch_size}")
        self.batch_size = batch_size
        self.pull_batch_size = pull_batch_size
        self.suspend_ms = suspend_ms
        self.policy = policy if policy is not None else broker.group_policy(self.group).redelivery
        if max_reconsume_times is not None:
            self.policy = self.policy.with_max_reconsume_times(max_reconsume_times)
        self.client_id = client_id or default_client_id()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.background = isinstance(broker.clock, SystemClock) if background is None else background
        clustering = model is MessageModel.CLUSTERING
        self.room = validate_room(room) if room is not None else None
        self._strategy = broker.allocation_strategy(strategy, strategy_params, group=self.group) if clustering else None
        self._subscriptions: dict[str, Subscription] = {}
        self._owned: dict[MessageQueue, int] = {}  # queue -> next offset to pull
        self._suspended_until: dict[MessageQueue, float] = {}
        self._orderly_attempts: dict[tuple[MessageQueue, int], int] = {}
        self._lock = threading.RLock()
        self._queue_locks: dict[MessageQueue, threading.Lock] = {}
        self._executor = ThreadPoolExecutor(max_workers=consume_threads, thread_name_prefix=f"plugmq-consume-{group}")
        self._offsets = broker.offsets(group, None if clustering else self.client_id)
        self._started = False
        self._stopped = threading.Event()
        self._heartbeat: Timer | None = None
        self._thread: threading.Thread | None = None
        self._limited_for_s = 0.0  # the group's rate limit refused a pull: wait this long before the next
        self.consumed = 0

    @property
    def max_reconsume_times(self) -> int:
        """RocketMQ's name for the policy's limit: redeliveries before the DLQ."""
        return self.policy.max_reconsume_times

    # -------------------------------------------------------------------------- subscription
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> PushConsumer:
        """Subscribe to ``topic`` with a filter expression (compiled now: errors surface here)."""
        validate_topic(topic)
        if self._started:
            raise ClientError("subscribe before start()")
        compiled = None
        if not (expression_type.upper() == "TAG" and expression.strip() in ("", "*")):
            compiled = self.broker.compile_subscription(expression_type, expression)
        self._subscriptions[topic] = Subscription(topic, expression_type.upper(), expression, compiled)
        return self

    # -------------------------------------------------------------------------- lifecycle
    def start(self) -> PushConsumer:
        if not self._subscriptions:
            raise ClientError(f"consumer {self.client_id!r} of group {self.group!r} has no subscription")
        retries_need_delay = self.model is MessageModel.CLUSTERING and not self.orderly
        if retries_need_delay and self.max_reconsume_times > 0 and not self.broker.delay_available:
            raise DelayUnsupportedError(
                f"consumer group {self.group!r} retries failed messages (max_reconsume_times="
                f"{self.max_reconsume_times}) but broker {self.broker.name!r} has no delay plugin; add one "
                "(delay_level, delay_wheel or delay_schedule) or set max_reconsume_times=0 (failures go straight to the DLQ)"
            )
        if self.model is MessageModel.CLUSTERING and not self.orderly and self.max_reconsume_times > 0:
            retry = retry_topic(self.group)
            self.broker.create_topic(retry, 1)
            self._subscriptions.setdefault(retry, Subscription(retry, "TAG", "*", None))
        for topic in self._subscriptions:
            self.broker.topic_queues(topic)
        self._started = True
        if self.model is MessageModel.CLUSTERING:
            self.broker.join_group(self)
            self._schedule_heartbeat()
        else:
            self.take_queues({q for t in self._subscriptions for q in self.broker.topic_queues(t)})
        self.broker.register_consumer(self)
        if self.background:
            self._thread = threading.Thread(target=self._run, name=f"plugmq-pull-{self.client_id}", daemon=True)
            self._thread.start()
        return self

    def shutdown(self) -> None:
        """Finish in-flight work, commit offsets and leave the group."""
        if not self._started or self._stopped.is_set():
            return
        self._stopped.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.broker.wake_consumers()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            if self.model is MessageModel.CLUSTERING:
                self.broker.leave_group(self)
            self._offsets.persist()
        finally:  # offsets that could not be written must not leave the listener threads running
            self._executor.shutdown(wait=True)
            self.broker.unregister_consumer(self)

    def crash(self) -> None:
        """Stop without leaving the group or committing (simulates a dead process for tests)."""
        self._stopped.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._executor.shutdown(wait=False)
        self.broker.unregister_consumer(self)

    def _schedule_heartbeat(self) -> None:
        def beat() -> None:
            if self._stopped.is_set():
                return
            if not self.broker.heartbeat(self.group, self.client_id):
                self.broker.join_group(self)
            self._schedule_heartbeat()

        self._heartbeat = self.broker.clock.call_later(self.heartbeat_interval_s, beat)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._limited_for_s = 0.0
                if self.consume_available() == 0:
                    if self._limited_for_s:  # arrivals would wake the wait at once: wait out the limit instead
                        self._stopped.wait(self._limited_for_s)
                    else:
                        self.broker.wait_for_messages(self.idle_wait_s)
            except Exception:
                log.exception("consume loop failed; retrying", group=self.group, client=self.client_id)
                self.broker.wait_for_messages(self.idle_wait_s)

    # -------------------------------------------------------------------------- GroupMember
    def topics_to_balance(self) -> list[str]:
        return list(self._subscriptions)

    def target_queues(self, topic: str, queues: list[MessageQueue], members: list[str]) -> list[MessageQueue]:
        assert self._strategy is not None
        return self._strategy.allocate(self.group, self.client_id, queues, members)

    def owned_queues(self) -> set[MessageQueue]:
        with self._lock:
            return set(self._owned)

    def release_queues(self, queues: set[MessageQueue]) -> None:
        for queue in queues:
            with self._queue_lock(queue):  # wait for in-flight consumption of that queue
                with self._lock:
                    offset = self._owned.pop(queue, None)
                    self._suspended_until.pop(queue, None)
                if offset is not None:
                    self._offsets.update(queue, offset)

    def take_queues(self, queues: set[MessageQueue]) -> None:
        for queue in queues:
            offset = self._initial_offset(queue)
            with self._lock:
                self._owned[queue] = offset
        self.broker.wake_consumers()

    def _queue_lock(self, queue: MessageQueue) -> threading.Lock:
        with self._lock:
            return self._queue_locks.setdefault(queue, threading.Lock())

    def _initial_offset(self, queue: MessageQueue) -> int:
        stored = self._offsets.read(queue)
        if stored is not None:
            return stored
        if queue.topic.startswith(RETRY_PREFIX):  # retries are consumed whole, whatever consume_from says
            return self.broker.start_offset(queue, ConsumeFrom.FIRST_OFFSET)
        return self.broker.start_offset(queue, self.consume_from, self.consume_timestamp_ms)

    # -------------------------------------------------------------------------- consuming
    def consume_available(self, max_rounds: int = 1_000_000) -> int:
        """Consume what is available on owned queues now; returns how many messages were consumed."""
        if not self._started:
            raise ClientError(f"consumer {self.client_id!r} is not started")
        total = 0
        for _ in range(max_rounds):
            with self._lock:
                queues = sorted(self._owned)
            futures = [self._executor.submit(self._consume_queue, q) for q in queues if not self._suspended(q)]
            got = sum(f.result() for f in futures)
            total += got
            if got == 0 or self._stopped.is_set():
                break
        if total:
            self._offsets.persist()  # a crash after this step re-delivers nothing it consumed
        return total

    def _suspended(self, queue: MessageQueue) -> bool:
        until = self._suspended_until.get(queue)
        return until is not None and self.broker.clock.now() < until

    def _consume_queue(self, queue: MessageQueue) -> int:
        """Consume pulled batches of ``queue`` under its lock (one thread per queue at a time): up
        to PULLS_PER_TASK while each pull comes back full. A queue with a backlog is drained a few
        batches per hand-off to a consume thread, so the round's thread switches serve more messages."""
        total = 0
        with self._queue_lock(queue):
            for _ in range(PULLS_PER_TASK):
                got = self._consume_pulled(queue)
                total += got
                if got < self.pull_batch_size:
                    break
        return total

    def _consume_pulled(self, queue: MessageQueue) -> int:
        """Pull one batch of ``queue`` and consume it (the caller holds the queue's lock)."""
        with self._lock:
            offset = self._owned.get(queue)
        if offset is None or self._stopped.is_set():
            return 0
        subscription = self._subscriptions[queue.topic]
        try:
            result = self.broker.pull(queue, offset, self.pull_batch_size, subscription.filter,
                                      consumer_group=self.group, client_id=self.client_id)
        except RateLimitedError as exc:
            self._limited_for_s = exc.retry_after_ms / 1000
            return 0  # the group's rate limit: nothing more this round (the loop waits it out)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning("offset illegal; corrected", group=self.group, queue=str(queue),
                        offset=offset, corrected=result.next_begin_offset)
            self._advance(queue, result.next_begin_offset)
            return 0
        if result.status is not PullStatus.FOUND:
            if result.next_begin_offset != offset:
                self._advance(queue, result.next_begin_offset)
            return 0
        messages: list[StoredMessage] | tuple[StoredMessage, ...] = result.messages
        if queue.topic.startswith(RETRY_PREFIX):  # only a retry queue holds messages of other topics
            messages = [self._restore_topic(m) for m in messages]
        if self.orderly:
            done, next_offset = self._consume_orderly(queue, messages, result.next_begin_offset)
        else:
            done, next_offset = self._consume_concurrently(messages, result.next_begin_offset)
        self._advance(queue, next_offset)
        self.consumed += done
        return done

    def _advance(self, queue: MessageQueue, offset: int) -> None:
        with self._lock:
            if queue in self._owned:
                self._owned[queue] = offset
        self._offsets.update(queue, offset, persist=False)

    def _restore_topic(self, message: StoredMessage) -> StoredMessage:
        real = message.properties.get(Prop.RETRY_TOPIC)
        if real and message.topic.startswith(RETRY_PREFIX):
            return attrs.evolve(message, topic=real)
        return message

    def _call_listener(self, batch: list[StoredMessage]) -> Any:
        try:
            return self.listener(batch)
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            log.warning("listener raised; treated as a failure", group=self.group, error=repr(exc))
            return None

    def _consume_concurrently(self, messages: Sequence[StoredMessage], next_offset: int) -> tuple[int, int]:
        size = self.batch_size
        consumed: list[StoredMessage] = []  # reported in one call: the offset moves past them together
        for start in range(0, len(messages), size):
            batch = [messages[start]] if size == 1 else list(messages[start:start + size])
            status = self._call_listener(batch)
            if status is ConsumeStatus.CONSUME_SUCCESS:
                consumed += batch
            else:
                if status not in (ConsumeStatus.RECONSUME_LATER, None):
                    log.warning("listener returned an unknown status; reconsuming later",
                                group=self.group, status=repr(status))
                for message in batch:
                    if self.model is MessageModel.BROADCASTING:
                        # RocketMQ does not retry in broadcasting mode: each member owns its copy.
                        log.warning("broadcast message failed; not retried", group=self.group,
                                    client=self.client_id, topic=message.topic, msg_id=message.msg_id)
                        continue
                    self.broker.send_back(message, self.group, self.policy)
        if consumed:
            self.broker.report_acked(self.group, consumed, self.client_id)
        return len(messages), next_offset

    def _consume_orderly(self, queue: MessageQueue, messages: Sequence[StoredMessage],
                         next_offset: int) -> tuple[int, int]:
        done = 0
        for start in range(0, len(messages), self.batch_size):
            batch = list(messages[start:start + self.batch_size])
            status = self._call_listener(batch)
            if status is OrderlyStatus.SUCCESS:
                self.broker.report_acked(self.group, batch, self.client_id)
                done += len(batch)
                for m in batch:
                    self._orderly_attempts.pop((queue, m.queue_offset), None)
                continue
            key = (queue, batch[0].queue_offset)
            attempts = self._orderly_attempts.get(key, 0) + 1
            self._orderly_attempts[key] = attempts
            if self.policy.exhausted(attempts):
                for m in batch:
                    self.broker.dead_letter(m, self.group, self.policy)
                    self._orderly_attempts.pop((queue, m.queue_offset), None)
                done += len(batch)
                continue
            self._suspended_until[queue] = self.broker.clock.now() + self.suspend_ms / 1000
            return done, batch[0].queue_offset
        return done, next_offset


class PullConsumer:
    """Pulls explicitly: the caller picks queue and offset; offsets are committed to the broker."""

    def __init__(self, broker: Reading, group: str) -> None:
        self.broker = broker
        self.group = validate_group(group)
        self._offsets = broker.offsets(group)
        self._filters: dict[tuple[str, str], Filter | None] = {}

    def queues(self, topic: str) -> list[MessageQueue]:
        return self.broker.topic_queues(topic)

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, subscription: str | Filter = "*",
             expression_type: str = "TAG") -> PullResult:
        """Pull up to ``max_nums`` messages matching ``subscription`` from ``offset`` of ``queue``."""
        if isinstance(subscription, str):
            key = (expression_type.upper(), subscription)
            if key not in self._filters:
                trivial = key[0] == "TAG" and subscription.strip() in ("", "*")
                self._filters[key] = None if trivial else self.broker.compile_subscription(*key)
            compiled = self._filters[key]
        else:
            compiled = subscription
        return self.broker.pull(queue, offset, max_nums, compiled, consumer_group=self.group)

    def committed_offset(self, queue: MessageQueue) -> int | None:
        return self._offsets.read(queue)

    def commit(self, queue: MessageQueue, offset: int) -> None:
        self._offsets.update(queue, offset)

