"""Topic and group names, system topics and message property keys (RocketMQ vocabulary).

Names become file names, so they are checked here before anything touches the file system.
"""

from __future__ import annotations

import re

from plugmq.core.errors import InvalidNameError

__all__ = [
    "DLQ_PREFIX",
    "MAX_NAME_LENGTH",
    "RETRY_PREFIX",
    "SCHEDULE_TOPIC",
    "SYSTEM_PROPERTY_KEYS",
    "TRACE_TOPIC",
    "TRANS_DISCARD_TOPIC",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_TOPIC",
    "Prop",
    "dlq_topic",
    "is_system_topic",
    "retry_topic",
    "validate_broker_name",
    "validate_cluster_name",
    "validate_group",
    "validate_room",
    "validate_topic",
]

MAX_NAME_LENGTH = 127
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
# Message trace records (the trace plugin writes them, ``plugmq admin trace`` reads them): RocketMQ 4's
# RMQ_SYS_TRACE_TOPIC.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_TOPIC, TRANS_DISCARD_TOPIC, TRACE_TOPIC})


class Prop:
    """System property keys (the names RocketMQ's ``MessageConst`` uses)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
    DELAY_LEVEL = "DELAY"
    DELIVER_AT_MS = "TIMER_DELIVER_MS"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    SHARDING_KEY = "__SHARDINGKEY"
    # RIP-80 priority messages: the priority (an int >= 0, higher first) a producer gave the message.
    PRIORITY = "__PRIORITY"
    # RocketMQ 4.6 request-reply: the request's correlation id, the client to answer, the request's
    # time to live (ms) and the message type ("request" or "reply").
    CORRELATION_ID = "CORRELATION_ID"
    CLUSTER = "CLUSTER"  # the requester's cluster (or broker): its reply topic is <CLUSTER>_REPLY_TOPIC
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    MESSAGE_TTL = "TTL"
    MESSAGE_TYPE = "MSG_TYPE"
    # The RocketMQ 5 protocol's trace_context (a W3C traceparent): kept with the message, handed to consumers.
    TRACE_CONTEXT = "TRACE_CONTEXT"


REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"  # request-reply: replies go to <cluster>_REPLY_TOPIC (RocketMQ 4.6)
REQUEST_MESSAGE, REPLY_MESSAGE = "request", "reply"  # the values of Prop.MESSAGE_TYPE


def reply_topic(cluster: str) -> str:
    """The topic replies to a request of ``cluster`` (or a broker outside a cluster) go to."""
    return validate_topic(cluster + REPLY_TOPIC_SUFFIX)


SYSTEM_PROPERTY_KEYS = frozenset(
    v for k, v in vars(Prop).items() if not k.startswith("_") and isinstance(v, str)
)


def _validate(kind: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{kind} name is empty; use 1 to {MAX_NAME_LENGTH} of [%|a-zA-Z0-9_-]")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{kind} name {name[:40]!r}... is {len(name)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    if not _NAME.fullmatch(name):
        bad = next(c for c in name if not _NAME.fullmatch(c))
        raise InvalidNameError(
            f"{kind} name {name!r} contains {bad!r}; only letters, digits and % | _ - are allowed"
        )
    return name


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise InvalidNameError saying why."""
    return _validate("topic", name)


def validate_group(name: object) -> str:
    """Return ``name`` if it is a legal group name, else raise InvalidNameError saying why."""
    return _validate("group", name)


def validate_broker_name(name: object) -> str:
    """Return ``name`` if it is a legal broker name (the topic rule: it names files and znodes)."""
    return _validate("broker", name)


def validate_cluster_name(name: object) -> str:
    """Return ``name`` if it is a legal cluster name (it becomes a ZooKeeper path segment)."""
    return _validate("cluster", name)


def validate_room(name: object) -> str:
    """Return ``name`` if it is a legal machine-room name (same rule as broker names)."""
    return _validate("machine room", name)


def is_system_topic(topic: str) -> bool:
    """Retry, dead-letter, schedule and transaction topics: the broker's own, not producers'."""
    return (
        topic in _SYSTEM_TOPICS or topic.startswith((RETRY_PREFIX, DLQ_PREFIX, "rmq_sys_"))
    )


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + validate_group(group)


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + validate_group(group)
