"""Priority topics (RocketMQ RIP-80) from Python: a backlog goes out highest priority first."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from plugmq.broker.broker import Broker
from plugmq.core import ManualClock, Message, Prop, ValidationError

TOPIC = "Tasks"


def test_a_backlog_is_received_highest_priority_first(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", plugins=["store_mmap"], clock=ManualClock(1_700_000_000),
                     topics={TOPIC: {"priority": True}}) as broker:
        broker.create_topic(TOPIC, 4)  # priorities 0, 1, 2 and 3 (3 and above share the top queue)
        producer = broker.producer("p")
        rng = random.Random(7)
        sent = [rng.choice([None, 0, 1, 2, 3, 9]) for _ in range(300)]
        for i, priority in enumerate(sent):
            result = producer.send(Message(TOPIC, f"{i}".encode(), priority=priority))
            assert result.queue.queue_id == min(priority or 0, 3), "a priority message went to another queue"
        consumer = broker.simple_consumer("workers", {TOPIC: "*"})
        order: list[int] = []
        while len(order) < len(sent):
            got = consumer.receive(16, 60)
            assert got, "messages are missing"
            for message in got:
                order.append(min(int(message.properties.get(Prop.PRIORITY, "0")), 3))
                consumer.ack(message)
        assert order == sorted(order, reverse=True), "a lower priority came before a higher one in the backlog"
        assert sorted(order) == sorted(min(p or 0, 3) for p in sent)


def test_a_high_priority_sent_later_overtakes_the_backlog(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", plugins=["store_mmap"], clock=ManualClock(1_700_000_000),
                     topics={TOPIC: {"priority": True}}) as broker:
        broker.create_topic(TOPIC, 2)
        producer = broker.producer("p")
        for i in range(50):
            producer.send(Message(TOPIC, f"low-{i}".encode(), priority=0))
        consumer = broker.simple_consumer("workers", {TOPIC: "*"})
        assert [m.body for m in consumer.receive(2, 60)] == [b"low-0", b"low-1"]
        producer.send(Message(TOPIC, b"urgent", priority=1))
        assert [m.body for m in consumer.receive(2, 60)] == [b"urgent", b"low-2"]


def test_priority_needs_a_priority_topic(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", plugins=["store_mmap"], clock=ManualClock(1_700_000_000)) as broker:
        with pytest.raises(ValidationError, match=r"not a priority topic; set \[topics.Plain\] priority = true"):
            broker.producer("p").send(Message("Plain", b"x", priority=1))
        with pytest.raises(ValidationError, match="not a priority topic"):
            broker.producer("p").send_batch([Message("Plain", b"x"), Message("Plain", b"y", priority=2)])
