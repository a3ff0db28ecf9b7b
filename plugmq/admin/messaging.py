"""The admin verbs that put one message in and read messages out: a console producer and consumer
(RocketMQ's ``mqadmin sendMessage`` / ``consumeMessage``, ``kafka-console-producer/consumer``).

Both run where every admin verb runs: in a running ``plugmq serve`` (its admin endpoint) or on a
stopped broker's data dir. Reading consumes: it receives for a consumer group by pop, as a
SimpleConsumer does, and acknowledges what it shows, so the next read shows the next messages.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Mapping

import attrs

from plugmq.admin.values import MessageView
from plugmq.broker.ports import Administered
from plugmq.client.producer import select_queue
from plugmq.core.errors import ValidationError
from plugmq.core.message import Message
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import validate_group, validate_topic

__all__ = ["CONSOLE_GROUP", "MAX_WAIT_S", "SentMessage", "consume_messages", "send_message"]

#: The consumer group ``plugmq consume`` reads as unless told another.
CONSOLE_GROUP = "plugmq-console"
_INVISIBLE_MS = 30_000  # only until the ack right after the receive
#: The longest ``plugmq consume --wait`` (below the admin client's 60 s call timeout).
MAX_WAIT_S = 50.0
_WAIT_SLICE_S = 0.5


@attrs.frozen
class SentMessage:
    """Where a console send was stored (``unique_id``: the id RocketMQ clients see)."""

    msg_id: str
    unique_id: str | None
    topic: str
    queue_id: int
    queue_offset: int
    deliver_at_ms: int | None


def _body(body: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return body.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValidationError(f"send-message: body is not valid base64 ({exc})") from None
    raise ValidationError(f"send-message: body_encoding must be 'utf-8' or 'base64', got {encoding!r}")


def send_message(broker: Administered, topic: str, body: str, *, body_encoding: str = "utf-8",
                 tags: str | None = None, keys: tuple[str, ...] = (), properties: Mapping[str, str] | None = None,
                 deliver_at_ms: int | None = None, message_group: str | None = None,
                 priority: int | None = None) -> SentMessage:
    """Store one message on ``topic`` (its queue: the message group's, else the first) and say where."""
    message = Message(validate_topic(topic), _body(body, body_encoding), tags=tags, keys=keys,
                      properties=dict(properties or {}), deliver_at_ms=deliver_at_ms, message_group=message_group,
                      priority=priority)
    queue = select_queue(broker.topic_queues(topic), message, None, None, itertools.count())
    result = broker.put(message, queue.queue_id)
    return SentMessage(result.msg_id, result.unique_id, topic, result.queue.queue_id, result.queue_offset,
                       deliver_at_ms)


def consume_messages(broker: Administered, topic: str, group: str = CONSOLE_GROUP, count: int = 1,
                     *, from_first: bool = True, wait_s: float = 0.0) -> list[MessageView]:
    """Up to ``count`` of ``topic``'s messages ``group`` has not consumed yet, acknowledged once read.

    A group that never read the topic starts at its first message (``from_first``) or at the
    messages sent from now on. When nothing is there, waits up to ``wait_s`` seconds (of the
    broker's clock) for a first message, then returns what came: an empty list when nothing did."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024:
        raise ValidationError(f"consume-message: count must be an integer 1..1024, got {count!r}")
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s <= MAX_WAIT_S:
        raise ValidationError(f"consume-message: wait_s must be a number of seconds 0..{MAX_WAIT_S:g}, "
                              f"got {wait_s!r} (an admin call holds a server thread while it waits)")
    validate_topic(topic)
    validate_group(group)
    consume_from = ConsumeFrom.FIRST_OFFSET if from_first else ConsumeFrom.LAST_OFFSET
    deadline = broker.clock.monotonic() + wait_s
    while True:
        received = broker.pop.receive(group, topic, None, count, _INVISIBLE_MS, consume_from=consume_from,
                                      client_id="plugmq-console")
        remaining = deadline - broker.clock.monotonic()
        if received or remaining <= 0:
            break
        # Woken by an arrival anywhere; a short slice bounds a wake-up lost between receive and wait.
        broker.wait_for_messages(min(remaining, _WAIT_SLICE_S))
    for message in received:
        broker.pop.ack(group, topic, message.receipt_handle, client_id="plugmq-console")
    return [MessageView.of(message) for message in received]
