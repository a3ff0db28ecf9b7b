"""``plugmq serve`` with the official rocketmq-python-client on loopback.

The server runs in this process on a ManualClock started at the wall-clock time, so invisible
times, delays and transaction check-backs pass when the test advances the clock; the client's own
timeouts and long polling are real. The server answers a long poll after 0.2 s: nothing on the
ManualClock moves while a receive waits, so an empty answer says as much as one after a second.
Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code, FilterType
from rocketmq.v5.exception import BadRequestException, ClientException

from plugmq.broker.broker import Broker
from plugmq.core import ManualClock
from plugmq.core.names import dlq_topic
from plugmq.server import PlugmqServer, ServerOptions, ServerThread
from plugmq.testing import wait_for
from tests.helpers.clients import started

WAIT_S = 15.0  # upper bound of any wait for the client's threads


@attrs.define
class Served:
    broker: Broker
    clock: ManualClock
    address: str
    server: PlugmqServer

    @property
    def config(self) -> ClientConfiguration:
        return ClientConfiguration(self.address, Credentials(), request_timeout=3)


GROUPS = {  # the broker's [groups] table
    "fifo-g": {"fifo": True},
    "push-dlq": {"max_delivery_attempts": 3, "backoff_s": [1]},
    "short": {"max_delivery_attempts": 2},
}


def _options(**overrides: Any) -> ServerOptions:
    return ServerOptions(**{"long_polling_s": 0.2, "default_invisible_s": 30.0, **overrides})


@contextmanager
def serving(data_dir: Path, *, options: ServerOptions | None = None, **broker_settings: Any) -> Iterator[Served]:
    clock = ManualClock(start=time.time())
    plugins = broker_settings.get("plugins", ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "txn"])
    broker_settings["plugins"] = plugins
    txn = {"txn": {"transaction_timeout_s": 5, "check_interval_s": 5}} if "txn" in plugins else {}
    groups = broker_settings.pop("groups", GROUPS)
    broker = Broker.open(data_dir, clock=clock, options=txn, groups=groups, **broker_settings)
    thread = ServerThread(broker, options or _options())
    try:
        address = thread.start()
        yield Served(broker, clock, address, thread.server)
    finally:
        thread.stop()
        broker.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path / "data") as s:
        yield s


def _message(topic: str, body: bytes, *, tag: str | None = None, keys: str | None = None,
             properties: dict[str, str] | None = None, group: str | None = None,
             deliver_at_s: int | None = None) -> Message:
    message = Message()
    message.topic = topic
    message.body = body
    if tag is not None:
        message.tag = tag
    if keys is not None:
        message.keys = keys
    for key, value in (properties or {}).items():
        message.add_property(key, value)
    if group is not None:
        message.message_group = group
    if deliver_at_s is not None:
        message.delivery_timestamp = deliver_at_s
    return message


def receive_until(consumer: SimpleConsumer, want: int, *, invisible_s: int = 30, batch: int = 16,
                  accept: Callable[[Any], bool] = lambda _m: True) -> list[Any]:
    """Receive until ``want`` messages arrived or WAIT_S passed (each empty receive long-polls 0.2 s)."""
    got: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        got.extend(m for m in consumer.receive(batch, invisible_s) if accept(m))
    return got


# ------------------------------------------------------------------------------------- messaging
def test_normal_tagged_keyed_messages_reach_a_tag_filtered_consumer(served: Served) -> None:
    with started(Producer(served.config, ("Orders",))) as producer:
        sent = {
            "a": producer.send(_message("Orders", b"a", tag="TagA", keys="order-1", properties={"region": "eu"})),
            "b": producer.send(_message("Orders", b"b", tag="TagB")),
            "c": producer.send(_message("Orders", b"c", tag="TagC")),
            "plain": producer.send(_message("Orders", b"plain")),
        }
    assert len({r.message_id for r in sent.values()}) == 4
    consumer = SimpleConsumer(served.config, "tags", {"Orders": FilterExpression("TagA||TagB")}, await_duration=1)
    with started(consumer):
        got = receive_until(consumer, 2)
        assert sorted(m.body for m in got) == [b"a", b"b"]
        first = next(m for m in got if m.body == b"a")
        assert first.message_id == sent["a"].message_id
        assert first.tag == "TagA" and first.keys == {"order-1"} and first.properties == {"region": "eu"}
        assert first.delivery_attempt == 1 and first.topic == "Orders"
        for message in got:
            consumer.ack(message)
        assert consumer.receive(16, 30) == []  # acked, and C / untagged never match
    everything = SimpleConsumer(served.config, "all", {"Orders": FilterExpression()}, await_duration=1)
    with started(everything):
        assert sorted(m.body for m in receive_until(everything, 4)) == [b"a", b"b", b"c", b"plain"]


def test_sql92_filter(served: Served) -> None:
    with started(Producer(served.config, ("Metrics",))) as producer:
        for i in range(6):
            producer.send(_message("Metrics", f"m{i}".encode(), properties={"level": str(i), "kind": "cpu"}))
    expression = FilterExpression("kind = 'cpu' AND level >= 4", FilterType.SQL)
    consumer = SimpleConsumer(served.config, "sql", {"Metrics": expression}, await_duration=1)
    with started(consumer):
        got = receive_until(consumer, 2)
        assert sorted(m.body for m in got) == [b"m4", b"m5"]


def test_bad_sql_expression_is_illegal_filter_expression(served: Served) -> None:
    with started(Producer(served.config, ("Metrics2",))) as producer:
        producer.send(_message("Metrics2", b"x"))
    consumer = SimpleConsumer(served.config, "badsql", {"Metrics2": FilterExpression("level >>> 3", FilterType.SQL)},
                              await_duration=1)
    with started(consumer), pytest.raises(BadRequestException) as caught:
        consumer.receive(4, 30)
    assert caught.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def test_unacked_message_comes_back_as_attempt_2_after_its_invisible_time(served: Served) -> None:
    with started(Producer(served.config, ("Jobs",))) as producer:
        receipt = producer.send(_message("Jobs", b"job"))
    consumer = SimpleConsumer(served.config, "workers", {"Jobs": FilterExpression()}, await_duration=1)
    with started(consumer):
        (first,) = receive_until(consumer, 1, invisible_s=10)
        assert first.message_id == receipt.message_id and first.delivery_attempt == 1
        assert consumer.receive(16, 10) == []  # invisible for 10 s of the broker's clock
        served.clock.advance(11)
        (again,) = receive_until(consumer, 1, invisible_s=10)
        assert again.message_id == receipt.message_id and again.delivery_attempt == 2
        with pytest.raises(BadRequestException) as stale:
            consumer.ack(first)  # that delivery's handle was superseded
        assert stale.value.code == Code.INVALID_RECEIPT_HANDLE
        consumer.ack(again)
        served.clock.advance(60)
        assert consumer.receive(16, 10) == []


def test_change_invisible_duration_extends_the_deadline(served: Served) -> None:
    with started(Producer(served.config, ("Slow",))) as producer:
        producer.send(_message("Slow", b"slow"))
    consumer = SimpleConsumer(served.config, "slow", {"Slow": FilterExpression()}, await_duration=1)
    with started(consumer):
        (message,) = receive_until(consumer, 1, invisible_s=5)
        consumer.change_invisible_duration(message, 60)
        served.clock.advance(30)
        assert consumer.receive(16, 5) == []  # still invisible: the new deadline is 60 s out
        consumer.ack(message)  # the renewed handle acks


def test_fifo_group_gets_a_message_groups_next_message_only_after_the_ack(served: Served) -> None:
    with started(Producer(served.config, ("Fifo",))) as producer:
        for group in ("order-1", "order-2"):
            for step in range(3):
                producer.send(_message("Fifo", f"{group}/{step}".encode(), group=group))
    consumer = SimpleConsumer(served.config, "fifo-g", {"Fifo": FilterExpression()}, await_duration=1)
    seen: dict[str, list[int]] = {"order-1": [], "order-2": []}
    with started(consumer):
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, seen.values())) < 6 and time.monotonic() < deadline:
            batch = consumer.receive(16, 30)
            groups = [m.message_group for m in batch]
            assert len(groups) == len(set(groups)), f"two messages of one group in flight: {groups}"
            for message in batch:
                group, step = message.body.decode().split("/")
                seen[group].append(int(step))
                consumer.ack(message)
    assert seen == {"order-1": [0, 1, 2], "order-2": [0, 1, 2]}


def test_fifo_redelivery_keeps_the_group_blocked(served: Served) -> None:
    with started(Producer(served.config, ("Fifo2",))) as producer:
        producer.send(_message("Fifo2", b"first", group="g"))
        producer.send(_message("Fifo2", b"second", group="g"))
    consumer = SimpleConsumer(served.config, "fifo-g", {"Fifo2": FilterExpression()}, await_duration=1)
    with started(consumer):
        (first,) = receive_until(consumer, 1, invisible_s=5)
        assert first.body == b"first"
        assert consumer.receive(16, 5) == []  # "second" waits for "first"
        served.clock.advance(6)
        (again,) = receive_until(consumer, 1, invisible_s=5)
        assert (again.body, again.delivery_attempt) == (b"first", 2)
        consumer.ack(again)
        (second,) = receive_until(consumer, 1, invisible_s=5)
        assert second.body == b"second"


# ------------------------------------------------------------------------------------- delay
def test_delayed_message_is_delivered_at_its_time_and_a_recalled_one_never(served: Served) -> None:
    at = int(served.clock.now()) + 60
    producer = Producer(served.config, ("Later",))
    consumer = SimpleConsumer(served.config, "later", {"Later": FilterExpression()}, await_duration=1)
    with started(producer), started(consumer):
        kept = producer.send(_message("Later", b"kept", deliver_at_s=at))
        recalled = producer.send(_message("Later", b"recalled", deliver_at_s=at))
        assert kept.recall_handle and recalled.recall_handle
        assert producer.recall_message("Later", recalled.recall_handle) == recalled.message_id
        assert consumer.receive(16, 30) == []  # not due yet
        served.clock.advance(61)
        got = receive_until(consumer, 1)
        assert [(m.body, m.message_id) for m in got] == [(b"kept", kept.message_id)]
        consumer.ack(got[0])
        with pytest.raises(ClientException) as late:
            producer.recall_message("Later", kept.recall_handle)  # delivered already
        assert late.value.code == Code.NOT_FOUND
        served.clock.advance(600)
        assert consumer.receive(16, 30) == []  # the recalled message never comes


def test_level_only_delays_answer_unsupported_for_timestamps_and_recall(tmp_path: Path) -> None:
    with serving(tmp_path / "data", plugins=["store_mmap", "delay_level", "filter_tag"]) as s:
        producer = Producer(s.config, ("Lvl",))
        with started(producer), pytest.raises(ClientException) as send:
            producer.send(_message("Lvl", b"x", deliver_at_s=int(s.clock.now()) + 5))
        producer = Producer(s.config, ("Lvl",))
        with started(producer), pytest.raises(ClientException) as recall:
            producer.recall_message("Lvl", "00000000000000000000000000000000:any")
    assert send.value.code == recall.value.code == Code.UNSUPPORTED
    assert "delay_wheel or delay_schedule" in str(send.value) and "cannot cancel" in str(recall.value)


# ------------------------------------------------------------------------------------- transactions
class _Checker(TransactionChecker):
    def __init__(self, answer: int) -> None:
        self.answer = answer
        self.asked = threading.Event()

    def check(self, message: Message) -> int:
        self.asked.set()
        return self.answer


def test_transactions_commit_roll_back_and_resolve_through_the_checker(served: Served) -> None:
    checker = _Checker(TransactionResolution.COMMIT)
    consumer = SimpleConsumer(served.config, "txn", {"Pay": FilterExpression()}, await_duration=1)
    with started(Producer(served.config, ("Pay",), checker=checker)) as producer, started(consumer):
        committed = producer.begin_transaction()
        producer.send(_message("Pay", b"committed"), committed)
        rolled_back = producer.begin_transaction()
        producer.send(_message("Pay", b"rolled back"), rolled_back)
        orphan = producer.begin_transaction()
        orphan_receipt = producer.send(_message("Pay", b"checked"), orphan)
        assert orphan_receipt.transaction_id
        assert consumer.receive(16, 30) == []  # half messages are invisible
        committed.commit()
        rolled_back.rollback()
        got = receive_until(consumer, 1)
        assert [m.body for m in got] == [b"committed"]
        consumer.ack(got[0])
        assert not checker.asked.is_set()
        served.clock.advance(6)  # past the transaction timeout: the broker asks the producer
        assert checker.asked.wait(WAIT_S), "the check-back never reached the client's TransactionChecker"
        got = receive_until(consumer, 1)
        assert [(m.body, m.message_id) for m in got] == [(b"checked", orphan_receipt.message_id)]
        consumer.ack(got[0])
        served.clock.advance(60)
        assert consumer.receive(16, 30) == []  # the rolled-back one never comes
    assert served.broker.transactions is not None and served.broker.transactions.pending() == 0


# ------------------------------------------------------------------------------------- push + DLQ
class _Failing(MessageListener):
    def __init__(self) -> None:
        self.attempts: list[int] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.attempts.append(message.delivery_attempt)
        return ConsumeResult.FAILURE


def nacked(served: Served) -> bool:
    deadline = served.broker.pop.next_deadline()
    return deadline is not None and deadline <= served.clock.now_ms() + 1000


def test_push_consumer_whose_listener_fails_sees_retries_then_the_dlq(served: Served) -> None:
    with started(Producer(served.config, ("Fragile",))) as producer:
        receipt = producer.send(_message("Fragile", b"poison"))
    listener = _Failing()
    push = PushConsumer(served.config, "push-dlq", listener, {"Fragile": FilterExpression()})
    with started(push):
        for attempt in (1, 2, 3):
            wait_for(lambda: len(listener.attempts), WAIT_S, f"delivery attempt {attempt}",
                     until=lambda attempts: attempts >= attempt)  # noqa: B023 - called before the loop moves on
            # The client's nack moves the 30 s invisible time to the group's 1 s back-off.
            wait_for(lambda: nacked(served), WAIT_S, f"the nack of attempt {attempt}")
            served.clock.advance(2)
    assert listener.attempts == [1, 2, 3]
    dlq = dlq_topic("push-dlq")
    reader = SimpleConsumer(served.config, "dlq-reader", {dlq: FilterExpression()}, await_duration=1)
    with started(reader):
        (dead,) = receive_until(reader, 1)
        assert (dead.body, dead.message_id, dead.topic) == (b"poison", receipt.message_id, dlq)


def test_check_back_asks_the_producer_that_sent_transactions_not_a_plain_one(served: Served) -> None:
    checker = _Checker(TransactionResolution.ROLLBACK)
    transactional = Producer(served.config, ("Pay2",), checker=checker)
    plain = Producer(served.config, ("Pay2",))  # publishes the topic too, but has no checker
    with started(transactional) as producer, started(plain):
        def registered(client: Producer) -> bool:
            session = served.server.sessions.get(client.client_id)
            return session is not None and session.client_type is not None

        wait_for(lambda: registered(transactional) and registered(plain), WAIT_S, "both producers' settings")
        orphan = producer.begin_transaction()
        producer.send(_message("Pay2", b"orphan"), orphan)
        served.clock.advance(6)
        assert checker.asked.wait(WAIT_S), "the check-back went to the producer without a checker"
        wait_for(lambda: served.broker.transactions is not None and served.broker.transactions.pending() == 0,
                 WAIT_S, "the rollback from the check-back")
