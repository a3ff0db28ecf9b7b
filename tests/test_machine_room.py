"""MACHINE_ROOM and MACHINE_ROOM_NEARBY with rooms from configuration: the brokers' ``[broker] room``,
an in-process consumer's ``room``, an official client's host (``consumer_rooms``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from plugmq.broker.broker import Broker
from plugmq.broker.routes import RoutedQueue
from plugmq.config.policy import GroupPolicies, GroupPolicy
from plugmq.core import ManualClock, Message, MessageQueue
from plugmq.core.contracts import BrokerRegistration, ClusterView, TopicPermission
from plugmq.core.errors import AllocationError
from plugmq.core.modes import ConsumeFrom, ConsumeStatus
from plugmq.server.assignment import Assigner, ConsumerMembers, ConsumerRooms

TOPIC = "Rooms"


def _consume(broker: Broker, group: str, rooms: dict[str, str | None], strategy: str,
             params: dict[str, Any] | None = None) -> dict[str, int]:
    """Start one push consumer per entry (client id -> its room), consume what is there; counts per consumer."""
    counts = dict.fromkeys(rooms, 0)
    consumers = []
    for client_id, room in rooms.items():
        def listener(batch: list[Any], who: str = client_id) -> ConsumeStatus:
            counts[who] += len(batch)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = broker.push_consumer(group, listener, strategy=strategy, strategy_params=params, room=room,
                                        client_id=client_id, background=False, max_reconsume_times=0,
                                        consume_from=ConsumeFrom.FIRST_OFFSET)
        consumers.append(consumer.subscribe(TOPIC).start())
    try:
        for consumer in consumers:
            consumer.consume_available()
    finally:
        for consumer in consumers:
            consumer.shutdown()
    return counts


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "alloc"], clock=ManualClock(1_700_000_000),
                     room="east") as b:
        b.create_topic(TOPIC, 8)
        producer = b.producer("p")
        for i in range(80):
            producer.send(Message(TOPIC, f"m{i}".encode()))
        yield b


def test_machine_room_reads_the_brokers_configured_room(broker: Broker) -> None:
    counts = _consume(broker, "g", {"c1": None, "c2": None}, "MACHINE_ROOM", {"rooms": ["east"]})
    assert sum(counts.values()) == 80 and all(counts.values()), counts


def test_a_room_strategy_that_starves_the_group_says_so(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="plugmq"):
        counts = _consume(broker, "g", {"c1": None}, "MACHINE_ROOM", {"rooms": ["west"]})
    assert counts == {"c1": 0}
    assert any("no consumer of the group was given any queue" in r.getMessage() for r in caplog.records)


def test_machine_room_nearby_takes_each_consumers_own_room(broker: Broker) -> None:
    counts = _consume(broker, "g", {"east-1": "east", "west-1": "west"}, "MACHINE_ROOM_NEARBY")
    assert counts == {"east-1": 80, "west-1": 0}, "the broker's room has a consumer: its queues stay there"
    counts = _consume(broker, "h", {"west-1": "west", "west-2": "west"}, "MACHINE_ROOM_NEARBY")
    assert sum(counts.values()) == 80 and all(counts.values()), "a room without consumers is shared out"


def test_consumer_rooms_by_network_and_glob() -> None:
    rooms = ConsumerRooms.parse({"east": ["10.1.0.0/16", "web-e*"], "west": ["10.2.0.0/16", "*@west*"]}, "g")
    assert rooms is not None
    assert rooms.room_of("host@1@0@x", "10.1.200.3") == "east"
    assert rooms.room_of("host@1@0@x", "web-e7") == "east"
    assert rooms.room_of("worker@west-9", "fe80::1") == "west"
    assert rooms.room_of("worker@1", "10.3.0.1") is None
    with pytest.raises(AllocationError, match="map each room to a list"):
        ConsumerRooms.parse({"east": "10.1.0.0/16"}, "g")


def test_a_served_group_whose_room_strategy_starves_it_is_warned_about_once(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    east = BrokerRegistration("c1", "broker-a", "127.0.0.1:1", room="east")
    route = [RoutedQueue(MessageQueue(TOPIC, "broker-a", i), east, TopicPermission.READ_WRITE) for i in range(4)]
    view = ClusterView("c1", (east,))
    groups = {"west-only": GroupPolicy(allocation="MACHINE_ROOM", allocation_params={"rooms": ["west"]}),
              "east-only": GroupPolicy(allocation="MACHINE_ROOM", allocation_params={"rooms": ["east"]})}
    assigner = Assigner(broker.strategies, GroupPolicies(groups=groups), ConsumerMembers(broker.clock, 30))
    with caplog.at_level(logging.WARNING, logger="plugmq"):
        for _ in range(3):  # every receive asks; one warning says it
            assert assigner.assign("west-only", "c1@1", route, view) == []
        assert len(assigner.assign("east-only", "c1@1", route, view)) == 4
    starved = [r for r in caplog.records if "gives its consumers no queue" in r.getMessage()]
    assert len(starved) == 1 and "west-only" in str(starved[0].msg)
