"""Event hooks fire for a plugin that implements only that one hook, in a real broker.

Each observer below implements ``plugmq_declare`` (every plugin must) and exactly one event hook,
so a hook that fires only when some other hook has an implementation shows up as a failure here.
"""

from __future__ import annotations

from typing import Any

from plugmq import Broker, ConsumeFrom, ConsumeStatus, ManualClock, Message
from plugmq.broker.events import HandedOut
from plugmq.core import Family, PluginDeclaration, StoredMessage, hookimpl
from plugmq.core.names import dlq_topic, retry_topic
from tests.fixtures.brokers import BrokerFactory

PLUGINS = ["store_lmdb", "delay_wheel", "alloc"]


class Recorder:
    """A plugin object: declares itself; records every call of the one hook it is given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families={Family.EVENTS})


class OnStarted(Recorder):
    @hookimpl
    def plugmq_broker_started(self, broker_name: str) -> None:
        self.calls.append({"broker_name": broker_name})


class OnStopping(Recorder):
    @hookimpl
    def plugmq_broker_stopping(self, broker_name: str) -> None:
        self.calls.append({"broker_name": broker_name})


class OnStored(Recorder):
    @hookimpl
    def plugmq_message_stored(self, broker_name: str, message: StoredMessage) -> None:
        self.calls.append({"broker_name": broker_name, "message": message})


class OnDelivered(Recorder):
    @hookimpl
    def plugmq_message_delivered(self, broker_name: str, consumer_group: str, message: StoredMessage) -> None:
        self.calls.append({"broker_name": broker_name, "group": consumer_group, "message": message})


class OnRetried(Recorder):
    @hookimpl
    def plugmq_message_retried(self, broker_name: str, consumer_group: str, message: StoredMessage,
                               reconsume_times: int) -> None:
        self.calls.append({"broker_name": broker_name, "group": consumer_group, "message": message,
                           "reconsume_times": reconsume_times})


class OnDeadLettered(Recorder):
    @hookimpl
    def plugmq_message_dead_lettered(self, broker_name: str, consumer_group: str, message: StoredMessage) -> None:
        self.calls.append({"broker_name": broker_name, "group": consumer_group, "message": message})


class OnAcked(Recorder):
    @hookimpl
    def plugmq_message_acked(self, broker_name: str, consumer_group: str, message: StoredMessage,
                             client_id: str) -> None:
        self.calls.append({"group": consumer_group, "message": message, "client": client_id})


def open_with(make_broker: BrokerFactory, observer: Recorder) -> Broker:
    return make_broker([*PLUGINS, observer.name], plugin_objects={observer.name: observer}, name="broker-e")


def test_broker_started_once_at_the_end_of_assembly(make_broker: BrokerFactory) -> None:
    observer = OnStarted("observer")
    broker = open_with(make_broker, observer)
    assert observer.calls == [{"broker_name": "broker-e"}]
    broker.create_topic("T", 1)
    broker.put(Message("T", b"x"), 0)
    broker.close()
    assert observer.calls == [{"broker_name": "broker-e"}], "called once per broker, not per operation"


def test_broker_stopping_once_at_the_first_close_with_the_store_open(make_broker: BrokerFactory) -> None:
    seen_while_stopping: list[int] = []

    class ReadsAtStop(OnStopping):
        @hookimpl
        def plugmq_broker_stopping(self, broker_name: str) -> None:
            super().plugmq_broker_stopping(broker_name)
            seen_while_stopping.append(broker.max_offset(broker.topic_queues("T")[0]))  # the store is still open

    observer = ReadsAtStop("observer")
    broker = open_with(make_broker, observer)
    broker.create_topic("T", 1)
    broker.put(Message("T", b"x"), 0)
    assert observer.calls == []
    broker.close()
    broker.close()
    assert observer.calls == [{"broker_name": "broker-e"}]
    assert seen_while_stopping == [1]


def test_message_stored_for_sends_and_batches(make_broker: BrokerFactory) -> None:
    observer = OnStored("observer")
    broker = open_with(make_broker, observer)
    broker.create_topic("T", 1)
    with broker.producer("pg") as producer:
        sent = producer.send(Message("T", b"one", tags="A"))
        producer.send_batch([Message("T", b"two"), Message("T", b"three")])
    assert [c["message"].body for c in observer.calls] == [b"one", b"two", b"three"]
    first = observer.calls[0]["message"]
    assert (first.topic, first.queue_offset, first.msg_id, first.tags) == ("T", 0, sent.msg_id, "A")
    assert {c["broker_name"] for c in observer.calls} == {"broker-e"}


def test_message_stored_when_a_delayed_message_comes_due(make_broker: BrokerFactory, clock: ManualClock) -> None:
    observer = OnStored("observer")
    broker = open_with(make_broker, observer)
    broker.create_topic("T", 1)
    broker.put(Message("T", b"later", delay_level=1), 0)  # 1 s
    assert observer.calls == [], "a delayed message is not on its topic yet"
    clock.advance(2)
    assert [(c["message"].topic, c["message"].body) for c in observer.calls] == [("T", b"later")]


def test_message_delivered_for_each_message_a_group_pulls(make_broker: BrokerFactory) -> None:
    observer = OnDelivered("observer")
    broker = open_with(make_broker, observer)
    broker.create_topic("T", 1)
    for body in (b"a", b"b"):
        broker.put(Message("T", body), 0)
    queue = broker.topic_queues("T")[0]
    broker.pull(queue, 0, 32)  # no consumer group: nobody was handed anything
    assert observer.calls == []
    result = broker.pull(queue, 0, 32, consumer_group="G")
    assert len(result.messages) == 2
    assert [(c["group"], c["message"].body) for c in observer.calls] == [("G", b"a"), ("G", b"b")]
    consumer = broker.push_consumer("P", lambda ms: ConsumeStatus.CONSUME_SUCCESS, background=False,
                                    consume_from=ConsumeFrom.FIRST_OFFSET).subscribe("T").start()
    assert consumer.consume_available() == 2
    assert [(c["group"], c["message"].body) for c in observer.calls[2:]] == [("P", b"a"), ("P", b"b")]


def fail_once(broker: Broker, body: bytes, **consumer_settings: Any) -> None:
    """``body`` sent to topic T; group G's listener fails it once (one consume round)."""
    broker.create_topic("T", 1)
    broker.put(Message("T", body), 0)
    consumer = broker.push_consumer("G", lambda ms: ConsumeStatus.RECONSUME_LATER, background=False,
                                    consume_from=ConsumeFrom.FIRST_OFFSET, **consumer_settings).subscribe("T").start()
    consumer.consume_available()


def test_message_retried_when_a_listener_asks_for_it(make_broker: BrokerFactory) -> None:
    observer = OnRetried("observer")
    broker = open_with(make_broker, observer)
    fail_once(broker, b"flaky")
    assert [(c["group"], c["message"].body, c["reconsume_times"]) for c in observer.calls] == [
        ("G", b"flaky", 1)]
    assert observer.calls[0]["message"].topic == "T", "the message as it was consumed"
    assert retry_topic("G") in broker.topics.all(), "the retry copy was stored before the event"


def test_message_dead_lettered_after_the_last_retry(make_broker: BrokerFactory) -> None:
    observer = OnDeadLettered("observer")
    broker = open_with(make_broker, observer)
    fail_once(broker, b"poison", max_reconsume_times=0)
    assert [(c["group"], c["message"].body) for c in observer.calls] == [("G", b"poison")]
    dead = broker.pull(broker.topic_queues(dlq_topic("G"))[0], 0, 8)
    assert [m.body for m in dead.messages] == [b"poison"], "the DLQ copy was stored before the event"


def test_an_observer_registered_later_is_seen(make_broker: BrokerFactory) -> None:
    """The gRPC server registers its observer on a running broker: the per-hook flags follow."""
    broker = make_broker(PLUGINS)
    broker.create_topic("T", 1)
    assert not broker.plugins.hooks.observers.message_stored
    late = OnStored("late")
    broker.plugins.pm.register(late, name="late")
    assert broker.plugins.hooks.observers.message_stored
    assert not broker.plugins.hooks.observers.message_delivered
    broker.put(Message("T", b"seen"), 0)
    broker.plugins.pm.unregister(name="late")
    assert not broker.plugins.hooks.observers.message_stored
    broker.put(Message("T", b"unseen"), 0)
    broker.close()
    assert [c["message"].body for c in late.calls] == [b"seen"]


def test_assembly_hooks_run_once_per_assembly(make_broker: BrokerFactory) -> None:
    """declare, configure and the keyed offers are asked once while a broker is assembled."""
    counts: dict[str, int] = {}

    class Counting:
        def _count(self, hook: str) -> None:
            counts[hook] = counts.get(hook, 0) + 1

        @hookimpl
        def plugmq_declare(self) -> PluginDeclaration:
            self._count("declare")
            return PluginDeclaration(name="counting", families={Family.EVENTS})

        @hookimpl
        def plugmq_configure(self, context: object) -> None:
            self._count("configure")

        @hookimpl
        def plugmq_filter_compilers(self) -> dict[str, object]:
            self._count("filter_compilers")
            return {}

        @hookimpl
        def plugmq_allocate_strategies(self) -> dict[str, object]:
            self._count("allocate_strategies")
            return {}

    make_broker([*PLUGINS, "counting"], plugin_objects={"counting": Counting()}).close()
    assert counts == {"declare": 1, "configure": 1, "filter_compilers": 1, "allocate_strategies": 1}


def test_message_acked_for_each_pop_ack_with_the_stored_message(make_broker: BrokerFactory) -> None:
    observer = OnAcked("observer")
    broker = open_with(make_broker, observer)
    broker.create_topic("T", 1)
    sent = [broker.put(Message("T", body, keys=body.decode()), 0) for body in (b"a", b"b", b"c")]
    consumer = broker.simple_consumer("G", {"T": "*"}, client_id="c-1")
    received = consumer.receive(16, invisible_duration_s=30)
    for message in received[:2]:
        consumer.ack(message)
    acked = [(c["group"], c["client"], c["message"].body, c["message"].queue_offset) for c in observer.calls]
    assert acked == [("G", "c-1", b"a", sent[0].queue_offset), ("G", "c-1", b"b", sent[1].queue_offset)]


def test_handed_out_messages_are_kept_within_their_byte_budget() -> None:
    kept = HandedOut(budget_bytes=10)
    messages = [StoredMessage(topic="T", queue_id=0, body=b"x" * 4, properties={}, queue_offset=i,
                              commit_log_offset=100 * i, size=100, tags_code=0, born_timestamp_ms=0,
                              store_timestamp_ms=0, born_host="127.0.0.1:1", store_host="127.0.0.1:2")
                for i in range(4)]
    kept.keep(messages[:2])
    assert kept.get(0) is messages[0] and kept.get(100) is messages[1]
    kept.keep(messages[2:])  # 16 bytes > 10: the oldest go first
    assert kept.get(0) is None and kept.get(100) is None
    assert kept.get(200) is messages[2] and kept.get(300) is messages[3]
    kept.keep(messages[3:])  # kept already: counted once
    assert kept.get(300) is messages[3] and kept.get(200) is messages[2]
