"""The admin verbs that look inside a group and a message: trace, in flight, clients, dead letters.

``trace`` reads the trace plugin's records (``RMQ_SYS_TRACE_TOPIC``, :mod:`plugmq.core.trace`) by a
message's unique id; ``group-inflight`` lists a pop group's messages received and not acked;
``group-clients`` the consumers of a group connected to this broker (the server's gRPC clients,
through a :class:`ClientDirectory`, and in-process push consumers); ``dlq-browse`` a page of the
group's dead-letter topic, each message marked when ``resend-dlq`` sent it back already.
"""

from __future__ import annotations

import re
from typing import Protocol

import attrs

from plugmq.admin.values import MessageView
from plugmq.broker.broker import Broker
from plugmq.core.errors import ValidationError
from plugmq.core.message import MessageQueue, StoredMessage
from plugmq.core.names import TRACE_TOPIC, validate_group
from plugmq.broker.offsets import DLQ_RESEND
from plugmq.core.trace import TraceEvent, decode_trace_batch

__all__ = ["ClientDirectory", "ClientView", "DeadLetter", "DeadLetterPage", "GroupClients", "InflightMessage",
           "MessageTrace", "dlq_browse", "group_clients", "group_inflight", "message_trace"]

_ID = re.compile(r"[0-9A-Fa-f]{32}")
_TRACE_BATCHES = 512  # trace messages read for one id: every step of a long path, and then some


class ClientDirectory(Protocol):
    """The consumers a server knows (``plugmq serve``'s heartbeats and telemetry sessions)."""

    def members(self, group: str) -> list[str]: ...

    def access_point_of(self, client_id: str) -> str | None: ...


@attrs.frozen
class MessageTrace:
    """Every recorded step of the message with ``unique_id`` on this broker, in the order they happened."""

    unique_id: str
    broker: str
    events: tuple[TraceEvent, ...]


@attrs.frozen
class InflightMessage:
    topic: str
    queue_id: int
    queue_offset: int
    attempt: int
    invisible_until_ms: int
    msg_id: str | None
    unique_id: str | None


@attrs.frozen
class ClientView:
    """``kind``: ``grpc`` (a RocketMQ 5 client of plugmq serve) or ``push`` (an in-process push consumer)."""

    client_id: str
    kind: str
    access_point: str | None


@attrs.frozen
class GroupClients:
    group: str
    broker: str
    clients: tuple[ClientView, ...]


@attrs.frozen
class DeadLetter:
    """A message of the dead-letter topic; ``resent``: it lies below the group's resend cursor, so a
    resend-dlq without ids sent it back (a resend by id leaves the cursor where it is)."""

    message: MessageView
    resent: bool


@attrs.frozen
class DeadLetterPage:
    """``next_offset``: where the next page starts (equal to ``end_offset`` on the last page)."""

    group: str
    broker: str
    dead_letter_topic: str
    start_offset: int
    end_offset: int
    next_offset: int
    messages: tuple[DeadLetter, ...]


def _unique_id_of(broker: Broker, message_id: str) -> str:
    text = message_id.strip()
    if not text:
        raise ValidationError("message id is empty; give a client message id or an offset message id")
    if _ID.fullmatch(text):
        found = broker.query_by_id(text.upper())
        if found is not None and found.unique_id:
            return found.unique_id
    return text


def message_trace(broker: Broker, message_id: str) -> MessageTrace:
    """The steps recorded for ``message_id`` (a client id, or an offset id resolved to it)."""
    unique_id = _unique_id_of(broker, message_id)
    if broker.topics.get(TRACE_TOPIC) is None:
        raise ValidationError(f"broker {broker.name!r} has no trace records ({TRACE_TOPIC} does not exist): add "
                              "'trace' to broker.plugins to record each message's path")
    events: dict[tuple[str, int], TraceEvent] = {}
    for batch in broker.query_by_key(TRACE_TOPIC, unique_id, max_results=_TRACE_BATCHES):
        for event in decode_trace_batch(batch.body, unique_id):
            if event.unique_id == unique_id:
                events[(event.broker, event.seq)] = event
    ordered = sorted(events.values(), key=lambda e: (e.at_ms, e.seq))
    return MessageTrace(unique_id, broker.name, tuple(ordered))


def group_inflight(broker: Broker, group: str, limit: int = 1000) -> list[InflightMessage]:
    """The pop group's messages received and not acked yet, oldest queue offsets first."""
    validate_group(group)
    out = []
    for topic, queue_id, entry in broker.pop.inflight(group, limit):
        message = broker.read_message(entry.commit_log_offset, entry.size)
        out.append(InflightMessage(topic, queue_id, entry.offset, entry.attempt, entry.until_ms,
                                   message.msg_id if message else None, message.unique_id if message else None))
    return out


def group_clients(broker: Broker, directory: ClientDirectory | None, group: str) -> GroupClients:
    """The group's consumers connected to this broker now."""
    validate_group(group)
    clients = [ClientView(c, "grpc", directory.access_point_of(c)) for c in sorted(directory.members(group))
               ] if directory is not None else []
    clients += [ClientView(c, "push", None) for c in sorted(broker.groups.members(group))]
    return GroupClients(group, broker.name, tuple(clients))


def dlq_browse(broker: Broker, group: str, offset: int | None = None, limit: int = 50) -> DeadLetterPage:
    """Up to ``limit`` dead letters of ``group`` from queue offset ``offset`` (default: the oldest kept)."""
    validate_group(group)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValidationError(f"dlq-browse: limit must be 1..1000, got {limit!r}")
    dlq = broker.group_policy(group).redelivery.dead_letter_topic_for(group)
    if broker.topics.get(dlq) is None:
        raise ValidationError(f"consumer group {group!r} has no dead-letter topic {dlq!r} on broker "
                              f"{broker.name!r}: none of its messages was dead-lettered")
    store = broker.store
    low, high = store.min_offset(dlq, 0), store.max_offset(dlq, 0)
    start = low if offset is None else min(max(offset, low), high)
    resent_below = broker.consumer_offsets.view(group, kind=DLQ_RESEND).read(MessageQueue(dlq, broker.name, 0)) or 0
    found: list[StoredMessage] = []
    position = start
    while position < high and len(found) < limit:
        entries = store.read_queue(dlq, 0, position, min(256, high - position))
        if not entries:
            break
        for entry in entries[:limit - len(found)]:
            position = entry.queue_offset + 1
            message = store.read(entry.commit_log_offset, entry.size)
            if message is not None:
                found.append(message)
    letters = tuple(DeadLetter(MessageView.of(m), m.queue_offset < resent_below) for m in found)
    return DeadLetterPage(group, broker.name, dlq, low, high, position, letters)
