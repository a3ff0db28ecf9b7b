"""Pulls through a store's bulk read answer as pulls reading one record at a time.

The broker's pull reads the entries the subscription's pre-check passes in runs (``read_entries``),
a pull that takes every message (no filter, or ``*``) entries and records at once
(QueueRunReading), cut at the commit horizon; a store without either is read entry by entry. Both must hand out the same messages, stop at
the same offset (filters, the scan budget, the commit horizon) and report the same status.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.broker import Broker
from plugmq.broker.reads import Reads
from plugmq.core import ConsumeQueueEntry, ManualClock, Message, MessageQueue, StoredMessage
from plugmq.core.contracts import BulkReading, Filter, MessageStore, QueueRunReading

TOPIC = "BulkPull"


class OneByOne:
    """The reads a pull makes of a store, without ``read_many``."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store

    def read(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        return self._store.read(commit_log_offset, size)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_entries: int) -> list[ConsumeQueueEntry]:
        return self._store.read_queue(topic, queue_id, offset, max_entries)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._store.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._store.max_offset(topic, queue_id)

    def queues(self) -> Mapping[str, int]:
        return self._store.queues()


def scan_one_by_one(store: MessageStore, queue: MessageQueue, offset: int, max_nums: int,
                    subscription: Filter | None, visible: int | None) -> tuple[list[StoredMessage], int]:
    """The pull's scan as it read before bulk reads (no damaged entries here): the reference."""
    found: list[StoredMessage] = []
    budget = max_nums * (16 if subscription is not None else 1)
    next_offset, high = offset, store.max_offset(queue.topic, queue.queue_id)
    while len(found) < max_nums and budget > 0 and next_offset < high:
        entries = store.read_queue(queue.topic, queue.queue_id, next_offset, min(budget, 256))
        if not entries:
            break
        for entry in entries:
            if visible is not None and entry.commit_log_offset + entry.size > visible:
                return found, next_offset
            next_offset = entry.queue_offset + 1
            budget -= 1
            if subscription is not None and not subscription.precheck(entry):
                continue
            message = store.read(entry.commit_log_offset, entry.size)
            assert message is not None
            if subscription is None or subscription.matches(message.properties, message.tags):
                found.append(message)
                if len(found) >= max_nums:
                    break
    return found, next_offset


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker.open(tmp_path_factory.mktemp("bulk") / "b", plugins=["store_mmap", "filter_tag"],
                     options={"store_mmap": {"flush": "async"}}) as b:
        b.create_topic(TOPIC, 1)
        for i in range(300):
            b.put(Message(TOPIC, f"m{i}".encode() * (i % 7 + 1), tags="TagA" if i % 5 == 0 else f"Tag{i % 3}"), 0)
        yield b


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(0, 305), max_nums=st.integers(1, 70),
       expression=st.sampled_from([None, "*", "TagA", "TagA || Tag2", "Nothing"]),
       horizon=st.one_of(st.none(), st.integers(0, 300)))
def test_bulk_pull_equals_one_by_one(broker: Broker, offset: int, max_nums: int, expression: str | None,
                                     horizon: int | None) -> None:
    reads: Reads = broker._parts.reads
    assert isinstance(broker.store, BulkReading) and isinstance(broker.store, QueueRunReading)
    visible = None
    if horizon is not None:  # consumers see the first ``horizon`` messages only
        entries = broker.store.read_queue(TOPIC, 0, 0, 300)
        visible = entries[horizon - 1].commit_log_offset + entries[horizon - 1].size if horizon else 0
    bulk = attrs.evolve(reads, visible_end=lambda: visible)
    single = attrs.evolve(bulk, store=cast(MessageStore, OneByOne(broker.store)))  # the calls a pull makes
    subscription = None if expression is None else reads.compile_subscription("TAG", expression)
    queue = MessageQueue(TOPIC, broker.name, 0)
    got = bulk.pull(queue, offset, max_nums, subscription)
    assert got == single.pull(queue, offset, max_nums, subscription)
    if offset < 300:
        assert bulk._scan(queue, offset, 300, max_nums, subscription, visible) == scan_one_by_one(
            broker.store, queue, offset, max_nums, subscription, visible)
    if expression in (None, "*") and horizon is None and offset < 300:
        assert [m.queue_offset for m in got.messages] == list(range(offset, min(offset + max_nums, 300)))


def test_pop_redelivery_reads_in_bulk(tmp_path: Path) -> None:
    """Messages whose invisible time ran out come back (read in one call) with their bodies."""
    clock = ManualClock()
    with Broker.open(tmp_path / "b", clock=clock, plugins=["store_mmap"], options={"store_mmap": {"flush": "async"}}) as b:
        b.create_topic(TOPIC, 1)
        for i in range(10):
            b.put(Message(TOPIC, f"p{i}".encode()), 0)
        first = b.pop.receive("G", TOPIC, None, 10, 1000)
        assert [m.body for m in first] == [f"p{i}".encode() for i in range(10)]
        clock.advance(2)
        again = b.pop.receive("G", TOPIC, None, 10, 1000)
        assert [(m.body, m.delivery_attempt) for m in again] == [(f"p{i}".encode(), 2) for i in range(10)]
