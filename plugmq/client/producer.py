"""Producers: ``broker.producer(group)`` — sync, async, one-way and batch sends, queue selection."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from plugmq.client.consumer import default_client_id
from plugmq.client.ports import Requesting
from plugmq.core.errors import ClientError, RequestTimeoutError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import Message, MessageQueue, SendResult, StoredMessage, message_group_queue
from plugmq.core.names import REPLY_MESSAGE, REQUEST_MESSAGE, Prop, reply_topic, validate_group

__all__ = ["Producer", "QueueSelector", "select_queue"]

log = get_logger(__name__)

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]
"""RocketMQ's MessageQueueSelector: (topic's queues, message, arg) -> the queue to use."""


def select_queue(queues: Sequence[MessageQueue], message: Message, selector: QueueSelector | None, arg: Any,
                 counter: Iterator[int]) -> MessageQueue:
    """The ``selector``'s choice, which must be one of the topic's queues; without one, the queue
    of the message's ``message_group`` (one group, one queue) or round robin over ``queues``
    (``counter`` is the producer's)."""
    if selector is None:
        if message.message_group is not None:
            return queues[message_group_queue(message.message_group, len(queues))]
        return queues[next(counter) % len(queues)]
    chosen = selector(queues, message, arg)
    if chosen not in queues:
        raise ValidationError(f"queue selector returned {chosen}, which is not a queue of topic {message.topic!r}")
    return chosen


class Producer:
    """Sends messages for one producer group. Thread-safe; ``close()`` waits for async sends."""

    def __init__(self, broker: Requesting, group: str, *, async_threads: int = 2) -> None:
        self.broker = broker
        self.group = validate_group(group)
        self.client_id = default_client_id()
        self._counter = itertools.count()
        self._executor = ThreadPoolExecutor(max_workers=async_threads, thread_name_prefix=f"plugmq-send-{group}")
        self._closed = False
        self._lock = threading.Lock()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError(f"producer of group {self.group!r} is closed")

    def _choose(self, message: Message, selector: QueueSelector | None, arg: Any) -> MessageQueue:
        return select_queue(self.broker.topic_queues(message.topic), message, selector, arg, self._counter)

    def send(self, message: Message, *, selector: QueueSelector | None = None, arg: Any = None) -> SendResult:
        """Store ``message`` and return where it went. Round robin over the topic's queues unless
        a ``selector`` picks the queue (ordered messages: e.g. ``order_id % len(queues)``)."""
        if self._closed:
            self._check_open()
        broker = self.broker
        if selector is None and message.message_group is None:  # select_queue's round robin, in line: per send
            queues = broker.topic_queues(message.topic)
            return broker.put(message, queues[next(self._counter) % len(queues)].queue_id)
        return broker.put(message, self._choose(message, selector, arg).queue_id)

    def send_async(self, message: Message, callback: Callable[[SendResult | None, BaseException | None], None]
                   | None = None, *, selector: QueueSelector | None = None, arg: Any = None) -> Future[SendResult]:
        """Send on the producer's thread pool; the future holds the SendResult or the error.

        ``callback(result, error)`` runs when the send finished (exactly one of them is None).
        """
        self._check_open()
        future = self._executor.submit(self.send, message, selector=selector, arg=arg)
        if callback is not None:
            def done(f: Future[SendResult]) -> None:
                error = f.exception()
                callback(None if error else f.result(), error)

            future.add_done_callback(done)
        return future

    def send_oneway(self, message: Message, *, selector: QueueSelector | None = None, arg: Any = None) -> None:
        """Fire and forget: errors are logged, never raised (RocketMQ's sendOneway)."""
        self._check_open()

        def send() -> None:
            try:
                self.send(message, selector=selector, arg=arg)
            except Exception as exc:  # noqa: BLE001 - reported, not swallowed
                log.warning("one-way send failed", topic=message.topic, group=self.group, error=str(exc))

        self._executor.submit(send)

    def send_batch(self, messages: Sequence[Message], *, selector: QueueSelector | None = None,
                   arg: Any = None) -> Sequence[SendResult]:
        """Send messages of one topic together to one queue (total body <= the broker's limit,
        no delayed messages); each rule broken is a ValidationError before anything is stored."""
        self._check_open()
        if not messages:
            raise ValidationError("send_batch needs at least one message")
        queue = self._choose(messages[0], selector, arg)
        return self.broker.put_batch(list(messages), queue.queue_id)

    # -------------------------------------------------------------------------- request-reply
    def request(self, message: Message, timeout_s: float = 3.0, *, selector: QueueSelector | None = None,
                arg: Any = None) -> StoredMessage:
        """Send ``message`` as a request and wait up to ``timeout_s`` (on the broker's clock) for the
        reply a consumer sends with :meth:`reply` (RocketMQ 4.6's ``request``); RequestTimeoutError
        when none comes in time."""
        self._check_open()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValidationError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        correlation_id = uuid.uuid4().hex
        queue = self._choose(message, selector, arg)
        clock = self.broker.clock
        deadline = clock.now() + timeout_s  # from the request on, however long the send takes
        pending = self.broker.expect_reply(correlation_id)
        try:
            self.broker.put(message, queue.queue_id, extra_properties={
                Prop.CORRELATION_ID: correlation_id, Prop.REPLY_TO_CLIENT: self.client_id,
                Prop.MESSAGE_TTL: str(round(timeout_s * 1000)), Prop.MESSAGE_TYPE: REQUEST_MESSAGE,
                Prop.CLUSTER: self.broker.reply_cluster})
            if not clock.wait(pending.done, max(0.0, deadline - clock.now())) or pending.reply is None:
                raise RequestTimeoutError(f"no reply to the request to {message.topic!r} within {timeout_s:g} s "
                                          f"(correlation id {correlation_id}); is a consumer of the topic answering "
                                          "with Producer.reply?")
            return pending.reply
        finally:
            self.broker.forget_reply(correlation_id)

    def reply(self, request: StoredMessage, body: bytes, *, tags: str | None = None,
              properties: Mapping[str, str] | None = None) -> SendResult:
        """Answer ``request`` (a message sent with :meth:`request`) with ``body``: the reply goes to the
        reply topic and on to the waiting requester. ValidationError for a message that is no request."""
        self._check_open()
        correlation_id = request.properties.get(Prop.CORRELATION_ID)
        if correlation_id is None or request.properties.get(Prop.MESSAGE_TYPE) != REQUEST_MESSAGE:
            raise ValidationError(f"message {request.unique_id or request.msg_id} is not a request "
                                  "(Producer.request sends those); there is nobody to reply to")
        reply = Message(reply_topic(request.properties.get(Prop.CLUSTER) or self.broker.reply_cluster), body,
                        tags=tags, properties=properties or {})
        queue = self._choose(reply, None, None)
        return self.broker.put(reply, queue.queue_id, extra_properties={
            Prop.CORRELATION_ID: correlation_id, Prop.MESSAGE_TYPE: REPLY_MESSAGE,
            Prop.REPLY_TO_CLIENT: request.properties.get(Prop.REPLY_TO_CLIENT, "")})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
