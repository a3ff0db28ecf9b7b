"""Broker-level conformance: the messaging contract for any combination of plugins.

Subclass :class:`BrokerConformance` and provide one fixture, ``broker_plugins``: a
:class:`BrokerUnderTest` naming the plugin list (store x delay x filter x alloc) and options.
Every clause runs on a ManualClock; clauses that need a family the combination lacks are skipped
with the reason.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugmq.broker.broker import Broker
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus, MessageModel, OrderlyStatus
from plugmq.core.clock import ManualClock
from plugmq.core.contracts import Family
from plugmq.core.message import Message, PullStatus, StoredMessage
from plugmq.core.names import dlq_topic

__all__ = ["BrokerConformance", "BrokerUnderTest"]


def _names(plugins: Iterable[str]) -> tuple[str, ...]:
    return tuple(plugins)


@attrs.frozen
class BrokerUnderTest:
    plugins: tuple[str, ...] = attrs.field(converter=_names)
    options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)


class BrokerConformance:
    """The messaging contract. Needs fixture ``broker_plugins`` -> BrokerUnderTest."""

    TOPIC = "ConformanceTopic"

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def open_broker(self, broker_plugins: BrokerUnderTest, tmp_path: Path, clock: ManualClock):
        opened: list[Broker] = []

        def open_() -> Broker:
            broker = Broker.open(tmp_path / "broker", plugins=list(broker_plugins.plugins),
                                 options=broker_plugins.options, clock=clock)
            opened.append(broker)
            return broker

        yield open_
        for broker in opened:
            broker.close()

    @staticmethod
    def require(broker: Broker, family: Family, what: str) -> None:
        if not broker.plugins.with_family(family):
            pytest.skip(f"the plugin combination has no {family.value} plugin, needed for {what}")

    @staticmethod
    def consumer(broker: Broker, group: str, sink: list[StoredMessage], **options: Any):
        def listener(messages: list[StoredMessage]) -> ConsumeStatus:
            sink.extend(messages)
            return ConsumeStatus.CONSUME_SUCCESS

        options.setdefault("consume_from", ConsumeFrom.FIRST_OFFSET)
        if broker.delay is None:  # retries need a delay plugin; without one failures go to the DLQ
            options.setdefault("max_reconsume_times", 0)
        return broker.push_consumer(group, listener, background=False, **options)

    # ---------------------------------------------------------------------------------- clauses
    def test_send_pull_round_trip(self, open_broker) -> None:
        broker = open_broker()
        queues = broker.create_topic(self.TOPIC, 2)
        with broker.producer("pg") as producer:
            sent = [producer.send(Message(self.TOPIC, f"body-{i}".encode() * (i % 3), tags=f"t{i % 2}",
                                          keys=f"key-{i}", properties={"i": str(i)})) for i in range(20)]
        bodies = {}
        for queue in queues:
            result = broker.pull(queue, 0, 64)
            assert result.status is PullStatus.FOUND
            assert [m.queue_offset for m in result.messages] == list(range(len(result.messages)))
            for message in result.messages:
                bodies[message.properties["i"]] = message
        assert len(bodies) == 20
        for i, result in enumerate(sent):
            message = bodies[str(i)]
            assert message.body == f"body-{i}".encode() * (i % 3)
            assert message.tags == f"t{i % 2}" and message.keys == (f"key-{i}",)
            assert broker.query_by_id(result.msg_id) == message
            assert [m.body for m in broker.query_by_key(self.TOPIC, f"key-{i}")] == [message.body]
        assert broker.pull(queues[0], broker.max_offset(queues[0]), 8).status is PullStatus.NO_NEW_MSG
        assert broker.pull(queues[0], broker.max_offset(queues[0]) + 5, 8).status is PullStatus.OFFSET_ILLEGAL

    def test_filters_in_pull(self, open_broker) -> None:
        broker = open_broker()
        self.require(broker, Family.FILTER, "filtered pulls")
        queue = broker.create_topic(self.TOPIC, 1)[0]
        for i in range(30):
            broker.put(Message(self.TOPIC, b"x", tags=["Aa", "BB", "C"][i % 3], properties={"n": str(i)}), 0)
        if "TAG" in broker.filters:
            result = broker.pull(queue, 0, 64, broker.compile_subscription("TAG", "Aa"))
            assert [m.tags for m in result.messages] == ["Aa"] * 10  # "BB" shares Aa's hash: exact check drops it
        if "SQL92" in broker.filters:
            result = broker.pull(queue, 0, 64, broker.compile_subscription("SQL92", "n >= 25"))
            assert [m.properties["n"] for m in result.messages] == ["25", "26", "27", "28", "29"]

    def test_clustering_delivers_each_message_once(self, open_broker) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 8)
        sinks: list[list[StoredMessage]] = [[], [], []]
        consumers = [self.consumer(broker, "cg", sink, client_id=f"c{i}").subscribe(self.TOPIC).start()
                     for i, sink in enumerate(sinks)]
        with broker.producer("pg") as producer:
            for i in range(120):
                producer.send(Message(self.TOPIC, str(i).encode()))
        for consumer in consumers:
            consumer.consume_available()
        seen = Counter(m.body for sink in sinks for m in sink)
        assert len(seen) == 120 and set(seen.values()) == {1}
        assert all(sinks), "every member got a share"
        owned = [{q for q in c.owned_queues() if q.topic == self.TOPIC} for c in consumers]
        assert sum(len(o) for o in owned) == 8 and len(set().union(*owned)) == 8

    def test_broadcasting_delivers_all_to_all(self, open_broker) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 4)
        sinks: list[list[StoredMessage]] = [[], []]
        consumers = [self.consumer(broker, "bg", sink, client_id=f"b{i}", model=MessageModel.BROADCASTING)
                     .subscribe(self.TOPIC).start() for i, sink in enumerate(sinks)]
        with broker.producer("pg") as producer:
            for i in range(40):
                producer.send(Message(self.TOPIC, str(i).encode()))
        for consumer in consumers:
            consumer.consume_available()
        for sink in sinks:
            assert sorted(int(m.body) for m in sink) == list(range(40))

    def test_orderly_keeps_per_queue_order_and_retries_in_place(self, open_broker, clock: ManualClock) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 4)
        seen: dict[str, list[int]] = defaultdict(list)
        suspended: list[float] = []

        def listener(messages: list[StoredMessage]) -> OrderlyStatus:
            message = messages[0]
            order, step = message.properties["order"], int(message.properties["step"])
            if order == "o1" and step == 2 and not suspended:
                suspended.append(clock.now())
                return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            seen[order].append(step)
            return OrderlyStatus.SUCCESS

        consumer = broker.push_consumer("og", listener, orderly=True, background=False, suspend_ms=1000,
                                        consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(self.TOPIC).start()
        with broker.producer("pg") as producer:
            for step in range(5):
                for order in range(6):
                    producer.send(Message(self.TOPIC, b"", properties={"order": f"o{order}", "step": str(step)}),
                                  selector=lambda qs, m, arg: qs[arg % len(qs)], arg=order)
        consumer.consume_available()
        assert seen["o1"] == [0, 1], "the suspended message blocks the rest of its queue"
        clock.advance(1.0)
        consumer.consume_available()
        assert all(steps == [0, 1, 2, 3, 4] for steps in seen.values()) and len(seen) == 6

    def test_rebalance_on_join_leave_and_heartbeat_loss(self, open_broker, clock: ManualClock) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 6)
        sinks: dict[str, list[StoredMessage]] = defaultdict(list)
        a = self.consumer(broker, "rg", sinks["a"], client_id="a").subscribe(self.TOPIC).start()
        mine = lambda consumer: {q for q in consumer.owned_queues() if q.topic == self.TOPIC}  # noqa: E731
        assert len(mine(a)) == 6
        b = self.consumer(broker, "rg", sinks["b"], client_id="b").subscribe(self.TOPIC).start()
        assert len(mine(a)) == 3 and len(mine(b)) == 3
        assert not a.owned_queues() & b.owned_queues()
        c = self.consumer(broker, "rg", sinks["c"], client_id="c").subscribe(self.TOPIC).start()
        assert [len(mine(x)) for x in (a, b, c)] == [2, 2, 2]
        c.crash()  # no goodbye: only missing heartbeats reveal it
        clock.advance(broker.config.heartbeat_timeout_s + 60)
        assert broker.groups.members("rg") == ["a", "b"]
        assert len(mine(a) | mine(b)) == 6
        with broker.producer("pg") as producer:
            for i in range(30):
                producer.send(Message(self.TOPIC, str(i).encode()))
        a.consume_available()
        b.consume_available()
        b.shutdown()
        assert len(mine(a)) == 6
        got = Counter(m.body for m in sinks["a"] + sinks["b"])
        assert len(got) == 30 and set(got.values()) == {1}

    def test_retry_timeline_then_dead_letter(self, open_broker, clock: ManualClock) -> None:
        broker = open_broker()
        self.require(broker, Family.DELAY, "retries")
        broker.create_topic(self.TOPIC, 1)
        attempts: list[tuple[float, int]] = []
        start = clock.now()

        def listener(messages: list[StoredMessage]) -> ConsumeStatus:
            attempts.extend((clock.now() - start, m.reconsume_times) for m in messages)
            raise RuntimeError("always fails")

        consumer = broker.push_consumer("fg", listener, background=False, max_reconsume_times=3,
                                        consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(self.TOPIC).start()
        broker.put(Message(self.TOPIC, b"poison", keys="poison-1"), 0)
        consumer.consume_available()
        for _ in range(400):  # 10 s, 30 s, 60 s back-off: step one second at a time
            clock.advance(1)
            consumer.consume_available()
        assert [r for _, r in attempts] == [0, 1, 2, 3]
        resolution = (broker.delay.capabilities.resolution_ms / 1000) if broker.delay else 1
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(attempts)]
        for gap, wanted in zip(gaps, (10, 30, 60)):
            assert wanted <= gap <= wanted + resolution + 1, (gaps, "back-off follows delay levels 3, 4, 5")
        dlq = broker.topic_queues(dlq_topic("fg"))[0]
        dead = broker.pull(dlq, 0, 8)
        assert [m.body for m in dead.messages] == [b"poison"]
        assert dead.messages[0].reconsume_times == 3

    def test_consume_from_timestamp(self, open_broker, clock: ManualClock) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 2)
        with broker.producer("pg") as producer:
            for i in range(10):
                producer.send(Message(self.TOPIC, f"old-{i}".encode()))
            clock.advance(60)
            boundary = clock.now_ms()
            for i in range(10):
                producer.send(Message(self.TOPIC, f"new-{i}".encode()))
        sink: list[StoredMessage] = []
        consumer = self.consumer(broker, "tg", sink, consume_from=ConsumeFrom.TIMESTAMP,
                                 consume_timestamp_ms=boundary).subscribe(self.TOPIC).start()
        consumer.consume_available()
        assert sorted(m.body.decode() for m in sink) == sorted(f"new-{i}" for i in range(10))

    def test_offsets_survive_restart(self, open_broker) -> None:
        broker = open_broker()
        broker.create_topic(self.TOPIC, 2)
        with broker.producer("pg") as producer:
            for i in range(10):
                producer.send(Message(self.TOPIC, f"first-{i}".encode()))
        first: list[StoredMessage] = []
        self.consumer(broker, "sg", first, client_id="x").subscribe(self.TOPIC).start().consume_available()
        broker.close()
        broker = open_broker()
        with broker.producer("pg") as producer:
            for i in range(10):
                producer.send(Message(self.TOPIC, f"second-{i}".encode()))
        second: list[StoredMessage] = []
        self.consumer(broker, "sg", second, client_id="x").subscribe(self.TOPIC).start().consume_available()
        assert len(first) == 10
        assert sorted(m.body.decode() for m in second) == sorted(f"second-{i}" for i in range(10))
