"""Request-reply over the broker (RocketMQ 4.6): ``Producer.request`` waits for ``Producer.reply``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugmq.broker.broker import Broker
from plugmq.core import ManualClock, Message, Prop, ValidationError
from plugmq.core.errors import RequestTimeoutError
from plugmq.testing import WAIT_S, wait_for


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker.open(tmp_path / "data", plugins=["store_mmap"], clock=ManualClock(1_700_000_000)) as b:
        b.create_topic("Ask", 2)
        yield b


def test_a_request_gets_the_reply_a_consumer_sends(broker: Broker) -> None:
    stop = threading.Event()

    def answer() -> None:
        consumer = broker.simple_consumer("answerers", {"Ask": "*"}, await_duration_s=0.2)
        producer = broker.producer("answerers")
        while not stop.is_set():
            for request in consumer.receive(8, 30):
                producer.reply(request, request.body.upper(), properties={"by": "answerer"})
                consumer.ack(request)

    replier = threading.Thread(target=answer)
    replier.start()
    try:
        requester = broker.producer("askers")
        for word in (b"ping", b"pong"):
            reply = requester.request(Message("Ask", word), timeout_s=WAIT_S)
            assert reply.body == word.upper() and reply.user_properties == {"by": "answerer"}
            assert reply.topic == "broker-a_REPLY_TOPIC" and reply.properties[Prop.MESSAGE_TYPE] == "reply"
    finally:
        stop.set()
        replier.join()


def test_a_request_nobody_answers_times_out_on_the_brokers_clock(broker: Broker) -> None:
    clock = broker.clock
    assert isinstance(clock, ManualClock)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            broker.producer("askers").request(Message("Ask", b"anyone?"), timeout_s=2)
        except RequestTimeoutError as exc:
            outcome.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    wait_for(lambda: broker._parts.replies.waiting, WAIT_S, "the request to wait")
    clock.advance(1.5)
    assert asker.is_alive(), "the request gave up before its timeout"
    clock.advance(1)
    asker.join(WAIT_S)
    assert outcome and "no reply to the request to 'Ask' within 2 s" in str(outcome[0])
    assert not broker._parts.replies.waiting


def test_only_a_request_can_be_replied_to(broker: Broker) -> None:
    broker.producer("p").send(Message("Ask", b"plain"))
    plain = broker.simple_consumer("g", {"Ask": "*"}).receive(1, 30)[0]
    with pytest.raises(ValidationError, match="is not a request"):
        broker.producer("p").reply(plain, b"?")
