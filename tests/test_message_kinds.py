"""``Message(message_group=...)`` (FIFO) and ``Message(priority=...)`` from Python: fields, rules, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugmq import Broker, ManualClock, Message
from plugmq.core import Prop, ValidationError
from plugmq.core.message import message_group_queue

TOPIC = "Orders"


def test_a_message_group_goes_to_one_queue_and_a_fifo_group_gets_it_in_order(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000)
    with Broker.open(tmp_path / "data", plugins=["store_mmap"], clock=clock, groups={"fifo-g": {"fifo": True}}) as b:
        b.create_topic(TOPIC, 4)
        producer = b.producer("p")
        queues: dict[str, set[int]] = {"order-1": set(), "order-2": set()}
        for i in range(5):
            for group in queues:
                queues[group].add(producer.send(Message(TOPIC, f"{group}-{i}".encode(), message_group=group)).queue.queue_id)
        assert queues == {g: {message_group_queue(g, 4)} for g in queues}, "a message group was spread over queues"
        consumer = b.simple_consumer("fifo-g", {TOPIC: "*"})
        seen: dict[str, list[str]] = {"order-1": [], "order-2": []}
        while len(seen["order-1"]) + len(seen["order-2"]) < 10:
            got = consumer.receive(32, 30)
            assert got, "the FIFO group stopped receiving"
            assert len({m.message_group for m in got}) == len(got), "two messages of one group in flight at once"
            for message in got:
                assert message.message_group is not None
                seen[message.message_group].append(message.body.decode())
                consumer.ack(message)
        assert seen == {g: [f"{g}-{i}" for i in range(5)] for g in seen}


def test_system_properties_name_the_field_that_sets_them() -> None:
    with pytest.raises(ValidationError, match=r"set Message\(message_group=\.\.\.\) instead"):
        Message(TOPIC, b"x", properties={Prop.SHARDING_KEY: "g"})
    with pytest.raises(ValidationError, match=r"set Message\(priority=\.\.\.\) instead"):
        Message(TOPIC, b"x", properties={Prop.PRIORITY: "3"})
    with pytest.raises(ValidationError, match="the broker sets it"):
        Message(TOPIC, b"x", properties={Prop.REAL_TOPIC: "t"})


@pytest.mark.parametrize(("fields", "named"), [
    ({"message_group": "g", "priority": 1}, "message_group and priority"),
    ({"message_group": "g", "delay_level": 2}, "message_group and a delay"),
    ({"priority": 0, "deliver_at_ms": 5}, "priority and a delay"),
])
def test_a_message_is_one_kind(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Message(TOPIC, b"x", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "error"), [
    ({"message_group": ""}, "non-blank"),
    ({"message_group": "x" * 129}, "129 characters"),
    ({"message_group": "a\x01b"}, "reserved"),
    ({"priority": -1}, "int >= 0"),
    ({"priority": True}, "int >= 0"),
])
def test_bad_message_group_or_priority_is_refused(fields: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        Message(TOPIC, b"x", **fields)  # type: ignore[arg-type]
