"""Producer and consumer rules beyond the broker conformance suite."""

from __future__ import annotations

import pytest

from plugmq import (
    Broker,
    DelayUnsupportedError,
    Message,
    MessageTooLargeError,
    SendStatus,
    TopicError,
    ValidationError,
)
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus
from plugmq.core.clock import SystemClock
from plugmq.core.names import dlq_topic
from tests.fixtures.brokers import BrokerFactory

STORE = ["store_lmdb", "alloc"]


@pytest.fixture
def broker(make_broker: BrokerFactory) -> Broker:
    return make_broker([*STORE, "delay_wheel"])


def test_async_oneway_and_callbacks(broker: Broker) -> None:
    broker.create_topic("T", 2)
    seen: list[tuple[SendStatus | None, BaseException | None]] = []
    with broker.producer("pg") as producer:
        future = producer.send_async(Message("T", b"a"),
                                     callback=lambda r, e: seen.append((r.status if r else None, e)))
        assert future.result(timeout=30).status is SendStatus.SEND_OK
        producer.send_oneway(Message("T", b"b"))
        failing = producer.send_async(Message("T", b"x" * (5 * 1024 * 1024)))
        with pytest.raises(MessageTooLargeError):
            failing.result(timeout=30)
    assert seen == [(SendStatus.SEND_OK, None)]
    assert sum(broker.max_offset(q) for q in broker.topic_queues("T")) == 2


def test_batch_rules(broker: Broker) -> None:
    broker.create_topic("T", 1)
    broker.create_topic("U", 1)
    with broker.producer("pg") as producer:
        results = producer.send_batch([Message("T", f"{i}".encode()) for i in range(5)])
        assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
        with pytest.raises(ValidationError, match="every message of a batch must have topic 'T'"):
            producer.send_batch([Message("T", b""), Message("U", b"")])
        with pytest.raises(ValidationError, match="delayed messages cannot be batched"):
            producer.send_batch([Message("T", b""), Message("T", b"", delay_level=2)])
        with pytest.raises(ValidationError, match="the limit is"):
            producer.send_batch([Message("T", b"x" * (3 * 1024 * 1024)), Message("T", b"y" * (2 * 1024 * 1024))])
    assert broker.max_offset(broker.topic_queues("T")[0]) == 5, "rejected batches wrote nothing"


def test_system_topics_refused_to_producers(broker: Broker) -> None:
    with broker.producer("pg") as producer:
        for topic in ("%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"):
            with pytest.raises(TopicError, match="is a system topic"):
                producer.send(Message(topic, b""))


def test_auto_create_off_names_the_topic(make_broker: BrokerFactory) -> None:
    broker = make_broker(STORE, auto_create_topic=False)
    with pytest.raises(TopicError, match="topic 'Nope' does not exist and auto_create_topic is off"):
        broker.producer("pg").send(Message("Nope", b""))
    broker.create_topic("Yes", 3)
    assert broker.producer("pg").send(Message("Yes", b"")).queue.queue_id in range(3)


def test_selector_keeps_an_order_in_one_queue(broker: Broker) -> None:
    broker.create_topic("Orders", 4)
    with broker.producer("pg") as producer:
        queues = {producer.send(Message("Orders", b""), selector=lambda qs, m, arg: qs[arg % len(qs)],
                                arg=7).queue.queue_id for _ in range(10)}
        assert queues == {3}
        with pytest.raises(ValidationError, match="not a queue of topic"):
            producer.send(Message("Orders", b""), selector=lambda qs, m, arg: qs[0].__class__("Other", "b", 0))


def test_delayed_send_without_delay_plugin_names_the_plugins(make_broker: BrokerFactory) -> None:
    broker = make_broker(STORE)
    with pytest.raises(DelayUnsupportedError, match="has no delay plugin; add one of .*delay_wheel"):
        broker.producer("pg").send(Message("T", b"", delay_level=3))
    assert broker.max_offset(broker.topic_queues("T")[0]) == 0


def test_retrying_group_without_delay_plugin(make_broker: BrokerFactory) -> None:
    broker = make_broker(STORE)
    broker.create_topic("T", 1)
    failing = broker.push_consumer("g", lambda ms: ConsumeStatus.RECONSUME_LATER, background=False,
                                   consume_from=ConsumeFrom.FIRST_OFFSET).subscribe("T")
    with pytest.raises(DelayUnsupportedError, match="retries failed messages .* has no delay plugin"):
        failing.start()
    # max_reconsume_times=0: failures go straight to the DLQ, no delay plugin needed.
    straight = broker.push_consumer("g", lambda ms: ConsumeStatus.RECONSUME_LATER, background=False,
                                    max_reconsume_times=0, consume_from=ConsumeFrom.FIRST_OFFSET)
    straight.subscribe("T").start()
    broker.put(Message("T", b"bad"), 0)
    straight.consume_available()
    dead = broker.pull(broker.topic_queues(dlq_topic("g"))[0], 0, 8)
    assert [m.body for m in dead.messages] == [b"bad"]


def test_bad_subscription_fails_at_subscribe(broker: Broker) -> None:
    from plugmq import FilterSyntaxError

    consumer = broker.push_consumer("g", lambda ms: ConsumeStatus.CONSUME_SUCCESS, background=False)
    with pytest.raises(FilterSyntaxError, match="no filter plugin for expression type 'SQL92'"):
        consumer.subscribe("T", "a > 1", "SQL92")


def test_background_consumer_on_the_system_clock(make_broker: BrokerFactory) -> None:
    import threading

    done = threading.Event()
    got = []

    def listener(messages):
        got.extend(messages)
        if len(got) >= 20:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    broker = make_broker([*STORE, "delay_wheel"], clock=SystemClock())
    broker.create_topic("T", 4)
    consumer = broker.push_consumer("bg", listener, consume_from=ConsumeFrom.FIRST_OFFSET).subscribe("T").start()
    assert consumer.background
    with broker.producer("pg") as producer:
        for i in range(20):
            producer.send(Message("T", str(i).encode()))
    assert done.wait(timeout=60), "the pull thread consumes what arrives"
    broker.close()
    assert sorted(int(m.body) for m in got) == list(range(20))


def test_broadcasting_failures_are_not_retried(make_broker: BrokerFactory) -> None:
    from structlog.testing import capture_logs

    from plugmq.client.consumer import MessageModel

    broker = make_broker(STORE)  # no delay plugin needed
    broker.create_topic("T", 1)
    consumer = broker.push_consumer("bc", lambda ms: ConsumeStatus.RECONSUME_LATER, background=False,
                                    model=MessageModel.BROADCASTING, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe("T").start()
    broker.put(Message("T", b"once"), 0)
    with capture_logs() as logs:
        assert consumer.consume_available() == 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["broadcast message failed; not retried"]
    assert "%RETRY%bc" not in broker.topics.all()


def test_consumed_offsets_are_persisted_after_each_step(make_broker: BrokerFactory) -> None:
    """A process that dies after a consume step (no shutdown, no broker close) restarts after what it consumed."""
    from plugmq.broker.journal import Journal
    from plugmq.broker.offsets import ConsumerOffsets

    broker = make_broker(STORE)
    broker.create_topic("T", 1)
    for i in range(5):
        broker.put(Message("T", str(i).encode()), 0)
    consumer = broker.push_consumer("p", lambda ms: ConsumeStatus.CONSUME_SUCCESS, background=False,
                                    max_reconsume_times=0, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe("T").start()
    assert consumer.consume_available() == 5
    on_disk = ConsumerOffsets(Journal(broker.store, "offsets")).view("p")  # what a restarted process would read
    assert on_disk.read(broker.topic_queues("T")[0]) == 5
    broker.close()
