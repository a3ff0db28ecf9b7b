"""Simple consumers: ``broker.simple_consumer(group, {topic: filter_expression})`` (RocketMQ 5's pop API).

::

    consumer = broker.simple_consumer("billing", {"Orders": "paid || refunded"})
    for message in consumer.receive(16, invisible_duration_s=30):
        handle(message)
        consumer.ack(message)

A received message stays invisible to the group for ``invisible_duration_s``; not acked by then,
it comes back with ``delivery_attempt`` + 1, and after the group's last attempt it goes to the
group's dead-letter topic (the group's :class:`~plugmq.config.policy.RedeliveryPolicy`). The state
is the broker's (``<data_dir>/broker/pop``): consumers are cheap, several may share a group, and
a restarted process continues where the group was, acks and in-flight messages included.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping

import attrs

from plugmq.client.consumer import default_client_id
from plugmq.client.ports import PopConsuming, Subscribing
from plugmq.client.values import ReceivedMessage
from plugmq.core.contracts import Filter
from plugmq.core.errors import ClientError, RateLimitedError, ReceiptHandleError, ValidationError
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import validate_group, validate_topic

__all__ = ["FilterExpression", "SimpleConsumer"]

_FILTER_TYPES = ("TAG", "SQL92")


def _filter_type(value: str) -> str:
    kind = str(value).upper()
    if kind == "SQL":
        kind = "SQL92"
    if kind not in _FILTER_TYPES:
        raise ValidationError(f"filter type {value!r} is unknown; use 'TAG' or 'SQL92'")
    return kind


@attrs.frozen
class FilterExpression:
    """A subscription's filter (RocketMQ 5's FilterExpression): a TAG expression by default
    (``"*"``, ``"paid || refunded"``), or SQL92 over message properties (``filter_type="SQL92"``)."""

    expression: str = attrs.field(default="*", validator=attrs.validators.instance_of(str))
    filter_type: str = attrs.field(default="TAG", converter=_filter_type)

    @classmethod
    def of(cls, value: str | FilterExpression) -> FilterExpression:
        """A FilterExpression as given, or a TAG expression from a string."""
        if isinstance(value, FilterExpression):
            return value
        if isinstance(value, str):
            return cls(value)
        raise ValidationError(f"a subscription's filter must be a string (TAG expression) or a "
                              f"FilterExpression, got {value!r}")

    @property
    def matches_everything(self) -> bool:
        return self.filter_type == "TAG" and self.expression.strip() in ("", "*")


def _seconds_to_ms(what: str, seconds: float, *, minimum_ms: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValidationError(f"{what} must be a number of seconds, got {seconds!r}")
    millis = round(seconds * 1000)
    if millis < minimum_ms:
        raise ValidationError(f"{what} must be {'> 0' if minimum_ms else '>= 0'} seconds, got {seconds!r}")
    return millis


class SimpleConsumer:
    """Receives messages of its group's subscriptions and acknowledges them one by one. Thread-safe.

    Build it with ``broker.simple_consumer``. ``consume_from`` places the group on a queue it
    never consumed (first message, or only messages sent from now on, or from a timestamp);
    ``await_duration_s``: how long an empty ``receive`` waits for messages to arrive (0: return
    at once, the only sensible value on a ManualClock).
    """

    def __init__(self, broker: Subscribing, pop: PopConsuming, group: str,
                 subscriptions: Mapping[str, str | FilterExpression] | None = None, *,
                 consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET, consume_timestamp_ms: int | None = None,
                 await_duration_s: float = 0.0, client_id: str | None = None) -> None:
        self._broker = broker
        self.client_id = client_id or default_client_id()
        self._pop = pop
        self.group = validate_group(group)
        if consume_from is ConsumeFrom.TIMESTAMP and consume_timestamp_ms is None:
            raise ValidationError("consume_from=TIMESTAMP needs consume_timestamp_ms")
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self.await_duration_s = _seconds_to_ms("await_duration_s", await_duration_s, minimum_ms=0) / 1000
        self._lock = threading.Lock()
        self._subscriptions: dict[str, tuple[FilterExpression, Filter | None]] = {}
        self._rotation = itertools.count()
        self._closed = False
        self._limited = threading.Event()  # waits out a rate limit; set when closed
        for topic, expression in (subscriptions or {}).items():
            self.subscribe(topic, expression)

    # -------------------------------------------------------------------------- subscriptions
    @property
    def subscriptions(self) -> dict[str, FilterExpression]:
        with self._lock:
            return {topic: expression for topic, (expression, _) in self._subscriptions.items()}

    def subscribe(self, topic: str, expression: str | FilterExpression = "*") -> SimpleConsumer:
        """Receive ``topic``'s messages matching ``expression`` (compiled now: errors surface here)."""
        validate_topic(topic)
        filter_expression = FilterExpression.of(expression)
        compiled = None if filter_expression.matches_everything else self._broker.compile_subscription(
            filter_expression.filter_type, filter_expression.expression)
        self._broker.topic_queues(topic)  # an unknown topic is an error now, not at the first receive
        with self._lock:
            self._subscriptions[topic] = (filter_expression, compiled)
        return self

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._subscriptions.pop(topic, None)

    # -------------------------------------------------------------------------- consuming
    def receive(self, max_messages: int = 16, invisible_duration_s: float = 30.0, *,
                await_duration_s: float | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, each invisible to the group for ``invisible_duration_s``.

        Messages whose invisible time ran out unacked come first (``delivery_attempt`` > 1). An
        empty answer waits up to ``await_duration_s`` (default: the consumer's) for arrivals. A
        group over its rate limit (``[limits.groups.<g>]``) gets fewer messages, and when it may
        have none within the wait, RateLimitedError saying when it may.
        """
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValidationError(f"max_messages must be a whole number >= 1, got {max_messages!r}")
        invisible_ms = _seconds_to_ms("invisible_duration_s", invisible_duration_s, minimum_ms=1)
        wait = self.await_duration_s if await_duration_s is None else await_duration_s
        deadline = time.monotonic() + wait
        while True:
            try:
                got = self._receive_once(max_messages, invisible_ms)
            except RateLimitedError as exc:
                left = deadline - time.monotonic()
                if left * 1000 < exc.retry_after_ms:
                    raise
                self._limited.wait(exc.retry_after_ms / 1000)  # set by close(): a closing consumer stops waiting
                continue
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            self._broker.wait_for_messages(min(left, 1.0))

    def _receive_once(self, max_messages: int, invisible_ms: int) -> list[ReceivedMessage]:
        with self._lock:
            if self._closed:
                raise ClientError(f"simple consumer of group {self.group!r} is closed")
            if not self._subscriptions:
                raise ClientError(f"simple consumer of group {self.group!r} has no subscription; "
                                  "call subscribe(topic, expression) first")
            topics = list(self._subscriptions.items())
            first = next(self._rotation)
        out: list[ReceivedMessage] = []
        for i in range(len(topics)):
            topic, (_, compiled) = topics[(first + i) % len(topics)]
            try:
                out.extend(self._pop.receive(self.group, topic, compiled, max_messages - len(out),
                                             invisible_ms, consume_from=self.consume_from,
                                             consume_timestamp_ms=self.consume_timestamp_ms,
                                             client_id=self.client_id))
            except RateLimitedError:
                if out:
                    return out  # the group's limit ran out after some: those go now
                raise
            if len(out) >= max_messages:
                break
        return out

    def _check(self, message: ReceivedMessage) -> None:
        if not isinstance(message, ReceivedMessage):
            raise ReceiptHandleError(f"{type(message).__name__} has no receipt handle; pass a message this "
                                     "consumer's receive() returned")
        if message.consumer_group != self.group:
            raise ReceiptHandleError(f"message {message.msg_id} was received by group {message.consumer_group!r}, "
                                     f"not {self.group!r}; settle it with a consumer of that group")

    def ack(self, message: ReceivedMessage) -> None:
        """The group is done with ``message``: it never comes back.

        Raises ReceiptHandleError when this delivery is no longer the message's newest (its
        invisible time ran out and it was received again, or its invisible duration changed).
        """
        self._check(message)
        self._pop.ack(self.group, message.topic, message.receipt_handle, client_id=self.client_id)

    def change_invisible_duration(self, message: ReceivedMessage, invisible_duration_s: float) -> ReceivedMessage:
        """Keep ``message`` invisible for ``invisible_duration_s`` from now (longer work, or sooner back).

        Returns the message with its new receipt handle; the old one is stale from now on.
        """
        self._check(message)
        millis = _seconds_to_ms("invisible_duration_s", invisible_duration_s, minimum_ms=0)
        handle = self._pop.change_invisible_duration(self.group, message.topic, message.receipt_handle, millis,
                                                     client_id=self.client_id)
        return attrs.evolve(message, receipt_handle=handle, invisible_duration_ms=millis)

    def nack(self, message: ReceivedMessage) -> ReceivedMessage:
        """Give up on ``message`` for now: it comes back after the group's back-off for this attempt
        (or goes to the dead-letter topic then, if this was the last attempt). Returns it with its
        new receipt handle."""
        self._check(message)
        handle = self._pop.change_invisible_duration(self.group, message.topic, message.receipt_handle, 0,
                                                     gave_up=True, client_id=self.client_id)
        return attrs.evolve(message, receipt_handle=handle)

    def close(self) -> None:
        """Stop receiving. Messages in flight stay the group's: unacked, they come back after their
        invisible time, to any consumer of the group."""
        with self._lock:
            self._closed = True
        self._limited.set()

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
