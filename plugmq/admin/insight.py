"""The admin verbs that look inside a group and a message: trace, in flight, clients, dead letters.

``trace`` reads the trace plugin's records (``RMQ_SYS_TRACE_TOPIC``, :mod:`plugmq.core.trace`) by a
message's unique id, with the copies the store holds as the stored steps; ``group-inflight`` lists a pop group's messages received and not acked;
``group-clients`` the consumers of a group connected to this broker (the server's gRPC clients,
through a :class:`ClientDirectory`, and in-process push consumers); ``dlq-browse`` a page of the
group's dead-letter topic, each message marked when ``resend-dlq`` sent it back already.
"""

from __future__ import annotations

import re
from typing import Protocol

import attrs

from plugmq.admin.values import MessageView
from plugmq.broker.offsets import DLQ_RESEND
from plugmq.broker.ports import Administered
from plugmq.core.errors import ValidationError
from plugmq.core.message import MessageQueue, StoredMessage
from plugmq.core.names import TRACE_TOPIC, Prop, retry_topic, validate_group
from plugmq.core.trace import TraceEvent, TraceKind, decode_trace_batch

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


def _unique_id_of(broker: Administered, message_id: str) -> str:
    text = message_id.strip()
    if not text:
        raise ValidationError("message id is empty; give a client message id or an offset message id")
    if _ID.fullmatch(text):
        found = broker.query_by_id(text.upper())
        if found is not None and found.unique_id:
            return found.unique_id
    return text


def message_trace(broker: Administered, message_id: str) -> MessageTrace:
    """The path of ``message_id`` (a client id, or an offset id resolved to it) on this broker.

    The consume-side steps come from the trace topic; the *stored* steps from the store itself:
    every copy with the unique id (the send, retry and dead-letter copies, re-driven copies) with
    its store time. A dead-letter copy goes right before the dead-lettered step that made it, a
    re-driven copy right before its re-driven step, other copies at their store time (before the
    recorded steps of the same millisecond: a step about a copy follows its storing).
    """
    unique_id = _unique_id_of(broker, message_id)
    if broker.topics.get(TRACE_TOPIC) is None:
        raise ValidationError(f"broker {broker.name!r} has no trace records ({TRACE_TOPIC} does not exist): add "
                              "'trace' to broker.plugins to record each message's path")
    recorded: dict[tuple[str, int], TraceEvent] = {}
    for batch in broker.query_by_key(TRACE_TOPIC, unique_id, max_results=_TRACE_BATCHES):
        for event in decode_trace_batch(batch.body, unique_id):
            recorded[(event.broker, event.seq)] = event
    events = sorted(recorded.values(), key=lambda e: (e.at_ms, e.seq))
    keyed: list[tuple[tuple[int, int, int], TraceEvent]] = [((e.at_ms, e.seq, 1), e) for e in events]
    copies = _stored_copies(broker, unique_id, events)
    anchors = _anchors(broker, events, copies)
    for copy in copies:
        anchor = anchors.get(copy.msg_id)
        key = (anchor.at_ms, anchor.seq, 0) if anchor is not None else (copy.store_timestamp_ms, -1,
                                                                        copy.commit_log_offset)
        keyed.append((key, _stored_event(broker.name, unique_id, copy)))
    keyed.sort(key=lambda item: item[0])
    return MessageTrace(unique_id, broker.name, tuple(event for _, event in keyed))


def _stored_copies(broker: Administered, unique_id: str, events: list[TraceEvent]) -> list[StoredMessage]:
    """Every copy of the message in the topics its steps name (with the groups' retry and DLQ topics),
    or, with no step recorded, in every topic."""
    known = broker.topics.all()
    if events:
        topics = {e.topic for e in events}
        for group in {e.group for e in events if e.group}:
            policy = broker.group_policy(group).redelivery
            topics |= {retry_topic(group), policy.dead_letter_topic_for(group)}
        topics |= {e.detail.get("to_topic", "") for e in events}
    else:
        topics = {t for t in known if t != TRACE_TOPIC}
    copies: dict[int, StoredMessage] = {}
    for topic in sorted(t for t in topics if t in known):
        for message in broker.query_by_key(topic, unique_id, max_results=_TRACE_BATCHES):
            if message.unique_id == unique_id:
                copies[message.commit_log_offset] = message
    return [copies[offset] for offset in sorted(copies)]


def _anchors(broker: Administered, events: list[TraceEvent], copies: list[StoredMessage]) -> dict[str, TraceEvent]:
    """Copy msg id -> the recorded step that stored it: a re-drive names its copy; the k-th
    dead-lettering of a group made the k-th copy on the group's dead-letter topic."""
    anchors = {str(e.detail["copy_msg_id"]): e for e in events
               if e.kind is TraceKind.REDRIVEN and "copy_msg_id" in e.detail}
    for group in {e.group for e in events if e.kind is TraceKind.DEAD_LETTERED}:
        dlq = broker.group_policy(group).redelivery.dead_letter_topic_for(group)
        steps = [e for e in events if e.kind is TraceKind.DEAD_LETTERED and e.group == group]
        for step, copy in zip(steps, [c for c in copies if c.topic == dlq], strict=False):
            anchors[copy.msg_id] = step
    return anchors


def _stored_event(broker_name: str, unique_id: str, copy: StoredMessage) -> TraceEvent:
    detail: dict[str, str | int] = {"born_host": copy.born_host, "born_ms": copy.born_timestamp_ms}
    producer = copy.properties.get(Prop.PRODUCER_GROUP)
    if producer:
        detail["producer"] = producer
    return TraceEvent(0, copy.store_timestamp_ms, TraceKind.STORED, broker_name, unique_id, copy.msg_id, copy.topic,
                      copy.queue_id, copy.queue_offset, attempt=copy.reconsume_times + 1, detail=detail)


def group_inflight(broker: Administered, group: str, limit: int = 1000) -> list[InflightMessage]:
    """The pop group's messages received and not acked yet, oldest queue offsets first."""
    validate_group(group)
    out = []
    for topic, queue_id, entry in broker.pop.inflight(group, limit):
        message = broker.read_message(entry.commit_log_offset, entry.size)
        out.append(InflightMessage(topic, queue_id, entry.offset, entry.attempt, entry.until_ms,
                                   message.msg_id if message else None, message.unique_id if message else None))
    return out


def group_clients(broker: Administered, directory: ClientDirectory | None, group: str) -> GroupClients:
    """The group's consumers connected to this broker now."""
    validate_group(group)
    clients = [ClientView(c, "grpc", directory.access_point_of(c)) for c in sorted(directory.members(group))
               ] if directory is not None else []
    clients += [ClientView(c, "push", None) for c in sorted(broker.groups.members(group))]
    return GroupClients(group, broker.name, tuple(clients))


def dlq_browse(broker: Administered, group: str, offset: int | None = None, limit: int = 50) -> DeadLetterPage:
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
