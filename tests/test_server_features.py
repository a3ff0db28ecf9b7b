"""What teams ask of a broker, through ``plugmq serve`` and the official rocketmq-python-client:
dedup of the client's own retries, priority messages, rate limits, and the rough edges the
client hit (milliseconds in delivery_timestamp.seconds, simple consumers of an allocating group)."""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code
from rocketmq.v5.exception import ClientException

from plugmq.chaos.forwarder import Forwarder
from plugmq.core import MessageQueue
from plugmq.testing import WAIT_S, wait_for
from tests.test_server_grpc import _message, receive_until, serving, started


def _stored(served: Any, topic: str) -> list[Any]:
    return [m for q in served.broker.topic_queues(topic) for m in served.broker.pull(q, 0, 1000).messages]


def test_a_send_the_client_retries_after_a_timeout_is_stored_once(tmp_path: Path) -> None:
    with serving(tmp_path / "data", topics={"Pay": {"dedup": True}}) as served:
        served.broker.create_topic("Pay", 4)
        host, port = served.address.rsplit(":", 1)
        with Forwarder("client", (host, int(port))) as link:
            config = ClientConfiguration(link.address, Credentials(), request_timeout=2)
            producer = Producer(config, ("Pay",))
            with started(producer):
                producer.send(_message("Pay", b"warm-up"))  # routes and telemetry settled before the delay
                link.delay(1.5)  # each way: the answer comes 3 s after the send, after the client gave up
                with ThreadPoolExecutor(1) as pool:
                    sending = time.monotonic()
                    receipt = pool.submit(producer.send, _message("Pay", b"payment 42"))
                    # Stored; its answer is held back 1.5 s, past the client's 2 s. Heal only once the
                    # client gave up (healing earlier lets an answer written after it through in time);
                    # a retry (the same message id) then finds the link healed, the third try if not the
                    # second.
                    wait_for(lambda: any(m.body == b"payment 42" for m in _stored(served, "Pay")), WAIT_S,
                             "the first attempt to be stored")
                    wait_for(lambda: time.monotonic() - sending > 2.05, WAIT_S,
                             "the client's request timeout to pass")
                    link.heal()
                    message_id = receipt.result(timeout=WAIT_S).message_id
                    assert time.monotonic() - sending >= 2, "the first attempt did not time out"
        payments = [m for m in _stored(served, "Pay") if m.body == b"payment 42"]
        assert [m.unique_id for m in payments] == [message_id], "the retried send was stored twice"
        assert served.broker.traffic.snapshot().messages_in[("Pay", "duplicate")] >= 1


def test_priority_messages_come_out_of_a_backlog_highest_first(tmp_path: Path) -> None:
    with serving(tmp_path / "data", topics={"Jobs": {"priority": True}}) as served:
        served.broker.create_topic("Jobs", 4)
        producer = Producer(served.config, ("Jobs",))
        consumer = SimpleConsumer(served.config, "workers", {"Jobs": FilterExpression()}, await_duration=1)
        rng = random.Random(3)
        with started(producer), started(consumer):
            for i in range(60):
                message = _message("Jobs", f"job-{i}".encode())
                message.priority = rng.randint(0, 5)
                producer.send(message)
            got = receive_until(consumer, 60, batch=8)
            for message in got:
                consumer.ack(message)
        priorities = [min(m.priority, 3) for m in got]
        assert len(got) == 60 and priorities == sorted(priorities, reverse=True), priorities


def test_rate_limits_answer_too_many_requests_with_a_retry_hint(tmp_path: Path) -> None:
    limits = {"topics": {"Capped": {"messages_per_s": 2}}, "groups": {"slow": {"messages_per_s": 5}}}
    with serving(tmp_path / "data", limits=limits) as served:
        producer = Producer(served.config, ("Capped", "Work"))
        consumer = SimpleConsumer(served.config, "slow", {"Work": FilterExpression()}, await_duration=1)
        with started(producer), started(consumer):
            producer.send(_message("Capped", b"1"))
            producer.send(_message("Capped", b"2"))
            with pytest.raises(ClientException) as refused:
                producer.send(_message("Capped", b"3"))
            assert refused.value.code == Code.TOO_MANY_REQUESTS
            assert "topic 'Capped' is limited to 2 messages/s; retry in 500 ms" in str(refused.value)
            for i in range(20):
                producer.send(_message("Work", f"w{i}".encode()))
            assert len(consumer.receive(16, 30)) == 5  # the group's bucket: one second's worth
            with pytest.raises(ClientException) as limited:  # the server waits within its long poll, then says why
                consumer.receive(16, 30)
            assert limited.value.code == Code.TOO_MANY_REQUESTS and "group 'slow'" in str(limited.value)
            served.clock.advance(1)
            assert len(consumer.receive(16, 30)) == 5


def test_milliseconds_in_the_delivery_seconds_field_are_a_bad_request(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with serving(tmp_path / "data") as served:
        producer = Producer(served.config, ("Later",))
        # As the client documents it: epoch milliseconds (which it writes into the seconds field).
        with started(producer), caplog.at_level(logging.WARNING), pytest.raises(ClientException) as refused:
            producer.send(_message("Later", b"x", deliver_at_s=served.clock.now_ms() + 5000))
    assert refused.value.code == Code.BAD_REQUEST
    assert "delivery_timestamp.seconds" in str(refused.value) and "milliseconds" in str(refused.value)
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("plugmq")]
    assert not tracebacks, f"the server logged a traceback for a bad request: {tracebacks[0].getMessage()}"


def test_simple_consumers_of_an_allocating_group_do_not_crawl(tmp_path: Path) -> None:
    with serving(tmp_path / "data", groups={"alloc-g": {"allocation": "AVG"}},
                 plugins=["store_mmap", "filter_tag", "alloc"]) as served:
        served.broker.create_topic("Spread", 8)
        producer = Producer(served.config, ("Spread",))
        consumer = SimpleConsumer(served.config, "alloc-g", {"Spread": FilterExpression()}, await_duration=1)
        with started(producer), started(consumer):
            for i in range(100):
                producer.send(_message("Spread", f"m{i}".encode()))
            wait_for(lambda: sum(served.broker.max_offset(MessageQueue("Spread", served.broker.name, q))
                                 for q in range(8)) == 100, WAIT_S, "the sends")
            receives = 0
            got: list[Any] = []
            while len(got) < 100 and receives < 20:
                got.extend(consumer.receive(32, 30))
                receives += 1
        assert len(got) == 100, f"{len(got)} of 100 messages after {receives} receives"
        assert receives <= 5, f"{receives} receives for 100 messages: each one read a single queue"
