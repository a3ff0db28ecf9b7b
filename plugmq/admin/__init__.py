"""Operating a broker: the verbs of ``plugmq admin``.

RocketMQ's mqadmin ``topicList``, ``topicStatus``, ``updateTopic``, ``consumerProgress``,
``queryMsgById`` / ``queryMsgByKey``, ``resetOffsetByTime``, and a resend of dead letters, over the
broker's public interface. One implementation for every way in: the admin endpoint of ``plugmq
serve`` runs these on its broker, ``plugmq admin --config`` on a stopped data dir, tests on an
in-process broker. Results are frozen values; :func:`to_json` makes JSON-ready dicts of them (what
the endpoint sends and ``--json`` prints). Every refusal is a :class:`PlugmqError` saying what to do.

Consumer groups keep their progress in two ways, and every verb covers both: *offset* groups
(push and pull consumers) commit one offset per queue; *pop* groups (simple consumers, the gRPC
clients) keep a cursor per queue plus the messages in flight (received, not acked).
"""

from __future__ import annotations

from plugmq.admin.operations import BrokerAdmin
from plugmq.admin.values import (
    BrokerStatus,
    GroupProgress,
    GroupSummary,
    MessageView,
    QueueProgress,
    QueueReset,
    QueueStatus,
    ResendResult,
    ResentMessage,
    ResetResult,
    TopicStatus,
    TopicSummary,
    TopicUpdate,
    to_json,
)
from plugmq.admin.verbs import VERBS, execute, parse_time

__all__ = [
    "VERBS",
    "BrokerAdmin",
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
    "execute",
    "parse_time",
    "to_json",
]
