"""The order RocketMQ's rebalance puts queues and consumer ids in before it calls a strategy.

Every consumer of a group must hand its allocation strategy the same lists, or the members
disagree about who owns what. RocketMQ's ``RebalanceImpl.rebalanceByTopic`` copies the topic's
queue *set* into a list and runs ``Collections.sort`` on it and on the consumer id list the broker
returned; strategies themselves never sort. plugmq's rebalance, the ``plugmq allocate`` CLI and
anyone reproducing a RocketMQ assignment go through :func:`rocketmq_sorted`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from plugmq.core.message import MessageQueue

__all__ = ["java_string_key", "rocketmq_sorted"]


def _beyond_bmp(text: str) -> bool:
    return not text.isascii() and any(ord(ch) > 0xFFFF for ch in text)


def java_string_key(texts: Iterable[str]) -> Callable[[str], Any]:
    """A sort key giving Java's ``String.compareTo`` order over all of ``texts``.

    Java compares UTF-16 code units; Python compares code points. They differ only when a string
    holds a character above U+FFFF (its surrogates sort below U+E000..U+FFFF in Java), so plain
    ``str`` is used unless such a character occurs, then the UTF-16-BE bytes (whose bytewise order
    is the code-unit order). One key for the whole sort, so keys always compare with each other.
    """
    if any(_beyond_bmp(t) for t in texts):
        return lambda t: t.encode("utf-16-be", "surrogatepass")
    return str


def rocketmq_sorted(
    queues: Iterable[MessageQueue], consumer_ids: Iterable[str]
) -> tuple[list[MessageQueue], list[str]]:
    """Queues and consumer ids sorted exactly as RocketMQ's rebalance sorts them.

    Queues by (topic, broker name, queue id), names in Java string order (so "broker-10" sorts
    before "broker-9"); a queue given twice appears once, because RocketMQ builds the list from
    the topic's queue set. Consumer ids in Java string order ("192.168.0.10@x" before
    "192.168.0.2@x"); a duplicate id is kept, as RocketMQ keeps it: the list comes from the
    broker's channel table and is sorted, not deduplicated. Strategies then use the first
    occurrence's position for such an id. Pure: the inputs are not modified.
    """
    unique_queues = list(dict.fromkeys(queues))
    ids = list(consumer_ids)
    names = [q.topic for q in unique_queues] + [q.broker_name for q in unique_queues]
    name_key = java_string_key(names)
    sorted_queues = sorted(
        unique_queues, key=lambda q: (name_key(q.topic), name_key(q.broker_name), q.queue_id)
    )
    return sorted_queues, sorted(ids, key=java_string_key(ids))
