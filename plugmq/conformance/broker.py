"""Broker-level conformance: the messaging contract for any combination of plugins.

Subclass :class:`BrokerConformance` and provide one fixture, ``broker_plugins``: a
:class:`BrokerUnderTest` naming the plugin list (store x delay x filter x alloc), their options and
the allocation strategy the clauses' consumers use. Every clause runs on a ManualClock; clauses
that need a family the combination lacks are skipped with the reason. The clauses check what any
strategy owes (each member takes exactly the queues the strategy computes for it), never one
strategy's particular shares; the filter clause pulls with every declared filter example.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugmq.broker.broker import Broker
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus, MessageModel, OrderlyStatus, PushConsumer
from plugmq.core.clock import ManualClock
from plugmq.core.contracts import Family, FilterExample
from plugmq.core.message import Message, MessageQueue, PullStatus, StoredMessage
from plugmq.core.names import Prop, dlq_topic
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["BrokerConformance", "BrokerUnderTest"]


def _names(plugins: Iterable[str]) -> tuple[str, ...]:
    return tuple(plugins)


@attrs.frozen
class BrokerUnderTest:
    """A plugin combination for the broker clauses.

    ``strategy`` / ``strategy_params``: the allocation strategy of the clauses' clustering
    consumers (None: the combination offers none, so clustering clauses are skipped).
    ``strategy_covers_every_queue``: False when the strategy declares it may leave queues
    unassigned (clauses that need every message consumed are skipped, saying so).
    """

    plugins: tuple[str, ...] = attrs.field(converter=_names)
    options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    strategy: str | None = "AVG"
    strategy_params: Mapping[str, Any] = attrs.field(factory=dict)
    strategy_covers_every_queue: bool = True


OpenBroker = Callable[[], Broker]
NewConsumer = Callable[..., PushConsumer]


def expected_shares(broker: Broker, under_test: BrokerUnderTest, topic: str, group: str,
                    members: list[str]) -> dict[str, set[MessageQueue]]:
    """Each member's queues of ``topic`` as the strategy computes them over the sorted lists."""
    assert under_test.strategy is not None
    strategy = broker.allocation_strategy(under_test.strategy, under_test.strategy_params)
    queues, ids = rocketmq_sorted(broker.topic_queues(topic), members)
    return {cid: set(strategy.allocate(group, cid, queues, ids)) for cid in ids}


class BrokerConformance:
    """The messaging contract. Needs fixture ``broker_plugins`` -> BrokerUnderTest."""

    TOPIC = "ConformanceTopic"

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def open_broker(self, broker_plugins: BrokerUnderTest, tmp_path: Path, clock: ManualClock) -> Iterator[OpenBroker]:
        opened: list[Broker] = []

        def open_() -> Broker:
            broker = Broker.open(tmp_path / "broker", plugins=list(broker_plugins.plugins),
                                 options=broker_plugins.options, clock=clock)
            opened.append(broker)
            return broker

        yield open_
        for broker in opened:
            broker.close()

    @pytest.fixture
    def consumer(self, broker_plugins: BrokerUnderTest) -> NewConsumer:
        """A push consumer on the combination's strategy, consuming on the caller's thread."""

        def new(broker: Broker, group: str, sink: list[StoredMessage], **options: Any) -> PushConsumer:
            def listener(messages: list[StoredMessage]) -> ConsumeStatus:
                sink.extend(messages)
                return ConsumeStatus.CONSUME_SUCCESS

            handler = options.pop("listener", listener)
            return broker.push_consumer(group, handler, **self.consumer_options(broker, broker_plugins, **options))

        return new

    @staticmethod
    def consumer_options(broker: Broker, under_test: BrokerUnderTest, **options: Any) -> dict[str, Any]:
        """Options of a clause's push consumer: the combination's strategy, no background thread,
        from the first offset; without a delay plugin a concurrent consumer's failures go straight
        to the DLQ (an orderly one retries in place)."""
        if options.get("model", MessageModel.CLUSTERING) is MessageModel.CLUSTERING:
            BrokerConformance.require_strategy(under_test, covering=True)
            options.setdefault("strategy", under_test.strategy)
            options.setdefault("strategy_params", dict(under_test.strategy_params))
        options.setdefault("background", False)
        options.setdefault("consume_from", ConsumeFrom.FIRST_OFFSET)
        if broker.delay is None and not options.get("orderly", False):
            options.setdefault("max_reconsume_times", 0)
        return options

    @staticmethod
    def require(broker: Broker, family: Family, what: str) -> None:
        if not broker.plugins.with_family(family):
            pytest.skip(f"the plugin combination has no {family.value} plugin, needed for {what}")

    @staticmethod
    def require_strategy(under_test: BrokerUnderTest, *, covering: bool) -> None:
        if under_test.strategy is None:
            pytest.skip("the plugin combination offers no allocation strategy, needed by clustering consumers")
        if covering and not under_test.strategy_covers_every_queue:
            pytest.skip(f"strategy {under_test.strategy} declares may_leave_queues_unassigned: a clause that "
                        "needs every message consumed cannot run on it")

    # ---------------------------------------------------------------------------------- clauses
    def test_send_pull_round_trip(self, open_broker: OpenBroker) -> None:
        """What a producer sends is pulled back unchanged, in dense queue order, and found by id
        and key; pulls at and past the end say NO_NEW_MSG and OFFSET_ILLEGAL."""
        broker = open_broker()
        queues = broker.create_topic(self.TOPIC, 2)
        with broker.producer("pg") as producer:
            sent = [producer.send(Message(self.TOPIC, f"body-{i}".encode() * (i % 3), tags=f"t{i % 2}",
                                          keys=f"key-{i}", properties={"i": str(i)})) for i in range(20)]
        bodies = {}
        for queue in queues:
            result = broker.pull(queue, 0, 64)
            assert result.status is PullStatus.FOUND, f"pull of {queue} answered {result.status.name}"
            offsets = [m.queue_offset for m in result.messages]
            assert offsets == list(range(len(result.messages))), f"queue offsets of {queue}: {offsets}"
            for message in result.messages:
                bodies[message.properties["i"]] = message
        assert len(bodies) == 20, f"pulled {len(bodies)} of 20 messages sent"
        for i, sent_result in enumerate(sent):
            message = bodies[str(i)]
            assert message.body == f"body-{i}".encode() * (i % 3), f"message {i} body {message.body!r}"
            assert message.tags == f"t{i % 2}" and message.keys == (f"key-{i}",), (message.tags, message.keys)
            assert broker.query_by_id(sent_result.msg_id) == message, f"query_by_id({sent_result.msg_id}) differs"
            found = [m.body for m in broker.query_by_key(self.TOPIC, f"key-{i}")]
            assert found == [message.body], f"query_by_key(key-{i}) found {found}"
        end = broker.max_offset(queues[0])
        assert broker.pull(queues[0], end, 8).status is PullStatus.NO_NEW_MSG
        assert broker.pull(queues[0], end + 5, 8).status is PullStatus.OFFSET_ILLEGAL

    def test_filters_in_pull(self, open_broker: OpenBroker) -> None:
        """A pull with a compiled subscription returns exactly the messages its filter matches:
        every declared example of every filter in the broker, and the tag hash collision."""
        broker = open_broker()
        self.require(broker, Family.FILTER, "filtered pulls")
        queue = broker.create_topic(self.TOPIC, 1)[0]
        for i in range(30):
            broker.put(Message(self.TOPIC, b"x", tags=["Aa", "BB", "C"][i % 3], properties={"n": str(i)}), 0)
        if "TAG" in broker.filters:
            result = broker.pull(queue, 0, 64, broker.compile_subscription("TAG", "Aa"))
            tags = [m.tags for m in result.messages]
            assert tags == ["Aa"] * 10, f"TAG 'Aa' pulled {tags} ('BB' shares Aa's hash: the exact check drops it)"
        for expression_type, compiler in sorted(broker.filters.items()):
            for index, example in enumerate(compiler.capabilities.examples):
                topic = re.sub(r"[^a-zA-Z0-9_-]", "_", f"{self.TOPIC}_{expression_type}_{index}")[:100]
                self._pull_example(broker, topic, expression_type, example)

    @staticmethod
    def _pull_example(broker: Broker, topic: str, expression_type: str, example: FilterExample) -> None:
        queue = broker.create_topic(topic, 1)[0]
        samples = example.samples
        for i, sample in enumerate(samples):
            properties = {**sample.properties, "conformance_sample": str(i)}
            tags = properties.pop(Prop.TAGS, None) if sample.tags is None else sample.tags  # a message's TAGS are its tags
            broker.put(Message(topic, b"x", tags=tags, properties=properties), 0)
        result = broker.pull(queue, 0, len(samples) + 1, broker.compile_subscription(expression_type, example.expression))
        got = sorted(int(m.properties["conformance_sample"]) for m in result.messages)
        wanted = list(range(len(example.matching)))
        assert got == wanted, (f"{expression_type} {example.expression!r}: the pull returned samples {got}, "
                               f"the example says {wanted} (its matching ones)")

    def test_clustering_delivers_each_message_once(self, open_broker: OpenBroker, consumer: NewConsumer,
                                                   broker_plugins: BrokerUnderTest) -> None:
        """Clustering consumers each take exactly the queues the strategy computes for them and
        together get every message once."""
        broker = open_broker()
        broker.create_topic(self.TOPIC, 8)
        sinks: list[list[StoredMessage]] = [[], [], []]
        consumers = [consumer(broker, "cg", sink, client_id=f"c{i}").subscribe(self.TOPIC).start()
                     for i, sink in enumerate(sinks)]
        with broker.producer("pg") as producer:
            for i in range(120):
                producer.send(Message(self.TOPIC, str(i).encode()))
        for member in consumers:
            member.consume_available()
        seen = Counter(m.body for sink in sinks for m in sink)
        twice = sorted(body for body, n in seen.items() if n > 1)
        assert len(seen) == 120 and not twice, f"{len(seen)} of 120 messages consumed; more than once: {twice[:5]}"
        self.assert_shares(broker, broker_plugins, "cg", consumers)

    def assert_shares(self, broker: Broker, under_test: BrokerUnderTest, group: str,
                      members: list[PushConsumer]) -> None:
        """Each member owns exactly the strategy's answer for the group's current members."""
        expected = expected_shares(broker, under_test, self.TOPIC, group, [m.client_id for m in members])
        owned = {m.client_id: {q for q in m.owned_queues() if q.topic == self.TOPIC} for m in members}
        assert owned == expected, (f"strategy {under_test.strategy}: members own {self._shares(owned)}, "
                                   f"the strategy computes {self._shares(expected)}")

    @staticmethod
    def _shares(shares: Mapping[str, set[MessageQueue]]) -> str:
        return "; ".join(f"{cid}: {sorted(q.queue_id for q in queues)}" for cid, queues in sorted(shares.items()))

    def test_broadcasting_delivers_all_to_all(self, open_broker: OpenBroker, consumer: NewConsumer) -> None:
        """Broadcasting consumers each get every message."""
        broker = open_broker()
        broker.create_topic(self.TOPIC, 4)
        sinks: list[list[StoredMessage]] = [[], []]
        consumers = [consumer(broker, "bg", sink, client_id=f"b{i}", model=MessageModel.BROADCASTING)
                     .subscribe(self.TOPIC).start() for i, sink in enumerate(sinks)]
        with broker.producer("pg") as producer:
            for i in range(40):
                producer.send(Message(self.TOPIC, str(i).encode()))
        for member in consumers:
            member.consume_available()
        for i, sink in enumerate(sinks):
            got = sorted(int(m.body) for m in sink)
            assert got == list(range(40)), f"broadcasting member b{i} got {len(got)} of 40 messages"

    def test_orderly_keeps_per_queue_order_and_retries_in_place(self, open_broker: OpenBroker, consumer: NewConsumer,
                                                                clock: ManualClock) -> None:
        """An orderly consumer sees each queue in order; a suspended message blocks its queue and
        comes again in place after the suspend time."""
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

        orderly = consumer(broker, "og", [], listener=listener, orderly=True, suspend_ms=1000)
        orderly.subscribe(self.TOPIC).start()
        with broker.producer("pg") as producer:
            for step in range(5):
                for order in range(6):
                    producer.send(Message(self.TOPIC, b"", properties={"order": f"o{order}", "step": str(step)}),
                                  selector=lambda qs, m, arg: qs[arg % len(qs)], arg=order)
        orderly.consume_available()
        assert seen["o1"] == [0, 1], f"the suspended message must block the rest of its queue; o1 saw {seen['o1']}"
        clock.advance(1.0)
        orderly.consume_available()
        assert len(seen) == 6 and all(steps == [0, 1, 2, 3, 4] for steps in seen.values()), dict(seen)

    def test_rebalance_on_join_leave_and_heartbeat_loss(self, open_broker: OpenBroker, consumer: NewConsumer,
                                                        broker_plugins: BrokerUnderTest, clock: ManualClock) -> None:
        """Joins, a leave and a member lost to missing heartbeats each rebalance the group to the
        strategy's answer; no message is lost or doubled across them."""
        broker = open_broker()
        broker.create_topic(self.TOPIC, 6)
        sinks: dict[str, list[StoredMessage]] = defaultdict(list)
        a = consumer(broker, "rg", sinks["a"], client_id="a").subscribe(self.TOPIC).start()
        self.assert_shares(broker, broker_plugins, "rg", [a])
        b = consumer(broker, "rg", sinks["b"], client_id="b").subscribe(self.TOPIC).start()
        self.assert_shares(broker, broker_plugins, "rg", [a, b])
        c = consumer(broker, "rg", sinks["c"], client_id="c").subscribe(self.TOPIC).start()
        self.assert_shares(broker, broker_plugins, "rg", [a, b, c])
        c.crash()  # no goodbye: only missing heartbeats reveal it
        clock.advance(broker.config.heartbeat_timeout_s + 60)
        assert broker.groups.members("rg") == ["a", "b"], f"members after c went silent: {broker.groups.members('rg')}"
        self.assert_shares(broker, broker_plugins, "rg", [a, b])
        with broker.producer("pg") as producer:
            for i in range(30):
                producer.send(Message(self.TOPIC, str(i).encode()))
        a.consume_available()
        b.consume_available()
        b.shutdown()
        self.assert_shares(broker, broker_plugins, "rg", [a])
        got = Counter(m.body for m in sinks["a"] + sinks["b"])
        assert len(got) == 30 and set(got.values()) == {1}, f"{len(got)} of 30 consumed, counts {set(got.values())}"

    def test_retry_timeline_then_dead_letter(self, open_broker: OpenBroker, consumer: NewConsumer,
                                             clock: ManualClock) -> None:
        """A failing message is retried after 10 s, 30 s and 60 s (delay levels 3 to 5), then
        dead-lettered with its reconsume count."""
        broker = open_broker()
        self.require(broker, Family.DELAY, "retries")
        broker.create_topic(self.TOPIC, 1)
        attempts: list[tuple[float, int]] = []
        start = clock.now()

        def listener(messages: list[StoredMessage]) -> ConsumeStatus:
            attempts.extend((clock.now() - start, m.reconsume_times) for m in messages)
            raise RuntimeError("always fails")

        failing = consumer(broker, "fg", [], listener=listener, max_reconsume_times=3).subscribe(self.TOPIC).start()
        broker.put(Message(self.TOPIC, b"poison", keys="poison-1"), 0)
        failing.consume_available()
        for _ in range(400):  # 10 s, 30 s, 60 s back-off: step one second at a time
            clock.advance(1)
            failing.consume_available()
        assert [r for _, r in attempts] == [0, 1, 2, 3], f"reconsume times of the attempts: {attempts}"
        resolution = (broker.delay.capabilities.resolution_ms / 1000) if broker.delay else 1
        gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(attempts)]
        for gap, wanted in zip(gaps, (10, 30, 60)):
            assert wanted <= gap <= wanted + resolution + 1, f"back-off gaps {gaps} s; delay levels 3, 4, 5 say 10, 30, 60"
        dlq = broker.topic_queues(dlq_topic("fg"))[0]
        dead = broker.pull(dlq, 0, 8)
        assert [m.body for m in dead.messages] == [b"poison"], f"DLQ holds {[m.body for m in dead.messages]}"
        assert dead.messages[0].reconsume_times == 3

    def test_consume_from_timestamp(self, open_broker: OpenBroker, consumer: NewConsumer, clock: ManualClock) -> None:
        """A new group consuming from a timestamp gets exactly the messages stored from then on."""
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
        late = consumer(broker, "tg", sink, consume_from=ConsumeFrom.TIMESTAMP, consume_timestamp_ms=boundary)
        late.subscribe(self.TOPIC).start().consume_available()
        got = sorted(m.body.decode() for m in sink)
        assert got == sorted(f"new-{i}" for i in range(10)), f"consumed from the timestamp: {got}"

    def test_offsets_survive_restart(self, open_broker: OpenBroker, consumer: NewConsumer) -> None:
        """A group's consumed offsets survive a broker restart: it resumes after what it consumed."""
        broker = open_broker()
        broker.create_topic(self.TOPIC, 2)
        with broker.producer("pg") as producer:
            for i in range(10):
                producer.send(Message(self.TOPIC, f"first-{i}".encode()))
        first: list[StoredMessage] = []
        consumer(broker, "sg", first, client_id="x").subscribe(self.TOPIC).start().consume_available()
        broker.close()
        broker = open_broker()
        with broker.producer("pg") as producer:
            for i in range(10):
                producer.send(Message(self.TOPIC, f"second-{i}".encode()))
        second: list[StoredMessage] = []
        consumer(broker, "sg", second, client_id="x").subscribe(self.TOPIC).start().consume_available()
        assert len(first) == 10, f"the first run consumed {len(first)} of 10"
        got = sorted(m.body.decode() for m in second)
        assert got == sorted(f"second-{i}" for i in range(10)), f"after the restart the group consumed {got}"
