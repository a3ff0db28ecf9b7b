"""The results of the admin verbs: frozen values, and their JSON form (:func:`to_json`)."""

from __future__ import annotations

import base64
import enum
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.core.message import StoredMessage

__all__ = [
    "OFFSET_MODE",
    "POP_MODE",
    "BrokerStatus",
    "GroupProgress",
    "GroupSummary",
    "MessageView",
    "QueueProgress",
    "QueueReset",
    "QueueStatus",
    "ResendResult",
    "ResentMessage",
    "ResetResult",
    "TopicStatus",
    "TopicSummary",
    "TopicUpdate",
    "to_json",
]

OFFSET_MODE = "offset"  # push and pull consumers: one committed offset per queue
POP_MODE = "pop"  # simple consumers and plugmq serve's clients: a cursor per queue plus messages in flight


@attrs.frozen
class TopicSummary:
    """One topic: its kind (``normal``, ``retry``, ``dlq``, ``system``), queue count and how many
    messages its queues still hold (max - min offset, summed)."""

    topic: str
    kind: str
    queues: int
    messages: int


@attrs.frozen
class QueueStatus:
    """One queue: readable offsets [min, max) and the store time of its newest message (None: empty)."""

    queue_id: int
    min_offset: int
    max_offset: int
    last_store_ms: int | None


@attrs.frozen
class TopicStatus:
    topic: str
    broker: str
    queues: tuple[QueueStatus, ...]


@attrs.frozen
class TopicUpdate:
    """``previous`` is None when the topic was created."""

    topic: str
    queue_count: int
    previous: int | None


@attrs.frozen
class QueueProgress:
    """A group's progress on one queue.

    ``broker_offset``: the queue's max offset. ``consumer_offset``: everything below it is done
    (committed for an offset group; acked or dead-lettered for a pop group). ``inflight``: pop
    messages received and not acked yet. ``lag``: messages not done yet: those not handed out
    (from the cursor to the broker offset) plus the in-flight ones; messages retention removed
    are not counted. ``oldest_pending_ms``: store time of the oldest message not done (None: no lag).
    """

    topic: str
    queue_id: int
    mode: str
    broker_offset: int
    consumer_offset: int
    inflight: int
    lag: int
    oldest_pending_ms: int | None


@attrs.frozen
class GroupProgress:
    """``members``: in-process push consumers of the group now (gRPC clients are the server's)."""

    group: str
    broker: str
    queues: tuple[QueueProgress, ...]
    lag: int
    inflight: int
    members: tuple[str, ...]


@attrs.frozen
class GroupSummary:
    group: str
    modes: tuple[str, ...]
    queues: int
    lag: int
    inflight: int


@attrs.frozen
class MessageView:
    """A stored message for people and scripts. ``msg_id`` is the offset message id (one read finds
    it); ``unique_id`` the id producers and RocketMQ clients see. ``body`` is text when it is UTF-8,
    else base64 (``body_encoding`` says which)."""

    msg_id: str
    unique_id: str | None
    topic: str
    queue_id: int
    queue_offset: int
    tags: str | None
    keys: tuple[str, ...]
    born_ms: int
    stored_ms: int
    reconsume_times: int
    size: int
    born_host: str
    store_host: str
    properties: Mapping[str, str]
    body: str
    body_encoding: str

    @classmethod
    def of(cls, message: StoredMessage) -> MessageView:
        try:
            body, encoding = message.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(message.body).decode("ascii"), "base64"
        return cls(message.msg_id, message.unique_id, message.topic, message.queue_id, message.queue_offset,
                   message.tags, message.keys, message.born_timestamp_ms, message.store_timestamp_ms,
                   message.reconsume_times, message.size, message.born_host, message.store_host,
                   dict(message.properties), body, encoding)


@attrs.frozen
class QueueReset:
    """``previous``: the position before (None: the group had none on this queue)."""

    queue_id: int
    mode: str
    previous: int | None
    offset: int


@attrs.frozen
class ResetResult:
    """``timestamp_ms`` None means "now": every queue's end."""

    group: str
    topic: str
    timestamp_ms: int | None
    force: bool
    queues: tuple[QueueReset, ...]
    moved_members: tuple[str, ...]


@attrs.frozen
class ResentMessage:
    dlq_queue_id: int
    dlq_offset: int
    unique_id: str | None
    original_topic: str
    topic: str
    queue_id: int
    msg_id: str


@attrs.frozen
class ResendResult:
    """``remaining``: dead letters after the last one resent (the ``limit`` stopped the run)."""

    group: str
    dead_letter_topic: str
    target: str
    resent: tuple[ResentMessage, ...]
    skipped: tuple[str, ...]
    remaining: int


@attrs.frozen
class BrokerStatus:
    """The broker at a glance. ``role`` is ``standalone`` for a broker with no replication plugin,
    else its role now (``async_master``, ``sync_master``, ``slave``); ``epoch`` the master epoch
    its log knows (0 without failover); ``replication`` what its replication plugin reports
    (``ReplicationStatus.as_dict``: address, ends, each slave's lag in bytes and messages; {}
    without one); ``acked_by_epoch``: sends this broker answered OK itself (not forwarded), by the
    master epoch it held then (str keys: JSON), so a checker can tell whether a deposed master acked."""

    broker: str
    role: str
    data_dir: str
    plugins: tuple[str, ...]
    topics: int
    groups: int
    pop_inflight: int
    delay_pending: int | None
    transactions_pending: int | None
    messages_in: int
    messages_out: int
    store: Mapping[str, float]
    delay: Mapping[str, float]
    epoch: int = 0
    replication: Mapping[str, Any] = attrs.field(factory=dict)
    acked_by_epoch: Mapping[str, int] = attrs.field(factory=dict)


def to_json(value: Any) -> Any:
    """JSON-ready form of an admin value (or a list of them): dicts, lists and scalars."""
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if attrs.has(type(value)):
        return attrs.asdict(value, value_serializer=_plain)
    return value


def _plain(_instance: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value
