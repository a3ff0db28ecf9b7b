"""Rate limits on a ManualClock: sends per topic and account, consumption per group (pop, pull,
push), bytes, changes at run time through admin, and other groups left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugmq.admin import BrokerAdmin, execute
from plugmq.broker.broker import Broker
from plugmq.broker.ratelimit import TokenBucket
from plugmq.core import ConfigError, ManualClock, Message, MessageQueue, StoredMessage
from plugmq.core.errors import RateLimitedError
from plugmq.core.modes import ConsumeFrom, ConsumeStatus

TOPIC = "Work"
START = 1_700_000_000
LIMITS: dict[str, Any] = {
    "groups": {"slow": {"messages_per_s": 10}, "thin": {"bytes_per_s": 1000}},
    "topics": {"Capped": {"messages_per_s": 5}},
    "accounts": {"alice": {"messages_per_s": 2, "burst_s": 2}},
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Any:
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "alloc"], clock=clock, limits=LIMITS) as b:
        b.create_topic(TOPIC, 4)
        yield b


def _backlog(broker: Broker, count: int, body: bytes = b"x" * 10) -> None:
    producer = broker.producer("p")
    for _ in range(count):
        producer.send(Message(TOPIC, body))


def test_a_token_bucket_refills_at_its_rate_up_to_its_burst(clock: ManualClock) -> None:
    bucket = TokenBucket(clock, rate=4, capacity=8)
    assert bucket.available() == 8
    bucket.take(10)
    assert bucket.available() == -2 and bucket.wait_s(1) == pytest.approx(0.75)
    clock.advance(0.5)
    assert bucket.available() == 0
    clock.advance(100)
    assert bucket.available() == 8, "more than the burst was saved up"


def test_a_limited_group_receives_its_rate_and_another_group_everything(broker: Broker, clock: ManualClock) -> None:
    _backlog(broker, 400)
    slow = broker.simple_consumer("slow", {TOPIC: "*"})
    free = broker.simple_consumer("free", {TOPIC: "*"})
    assert len(free.receive(400, 60)) + len(free.receive(400, 60)) == 400, "an unlimited group was held back"
    received = 0
    for _ in range(100):  # 10 virtual seconds in 0.1 s steps, receiving as fast as allowed
        try:
            received += len(slow.receive(32, 60))
        except RateLimitedError as exc:
            assert "group 'slow' is limited to 10 messages/s" in str(exc) and 0 < exc.retry_after_ms <= 100
        clock.advance(0.1)
    assert 100 <= received <= 110, f"10 s at 10 messages/s (plus a 1 s burst) gave {received}"


def test_pull_and_push_consumers_of_a_limited_group(broker: Broker, clock: ManualClock) -> None:
    _backlog(broker, 200)
    queue = MessageQueue(TOPIC, broker.name, 0)
    assert len(broker.pull(queue, 0, 32, consumer_group="slow").messages) == 10
    with pytest.raises(RateLimitedError, match="retry in"):
        broker.pull(queue, 0, 32, consumer_group="slow")
    assert len(broker.pull(queue, 0, 32).messages) == 32, "a pull without a group has no group limit"
    consumed: list[int] = []

    def listener(batch: list[StoredMessage]) -> ConsumeStatus:
        consumed.extend(len(m.body) for m in batch)
        return ConsumeStatus.CONSUME_SUCCESS

    push = broker.push_consumer("slow", listener, background=False, consume_from=ConsumeFrom.FIRST_OFFSET,
                                max_reconsume_times=0)
    push.subscribe(TOPIC).start()
    try:
        for _ in range(30):
            clock.advance(0.1)
            push.consume_available()
        assert 25 <= len(consumed) <= 40, f"3 s at 10 messages/s gave the push consumer {len(consumed)}"
    finally:
        push.shutdown()


def test_a_byte_limit_charges_what_was_handed_out(broker: Broker, clock: ManualClock) -> None:
    _backlog(broker, 50, body=b"y" * 400)
    thin = broker.simple_consumer("thin", {TOPIC: "*"})
    got = 0
    with pytest.raises(RateLimitedError, match="1000 bytes/s"):
        for _ in range(5):  # 1000 bytes of burst: 400, 400, and one more while the bucket is not empty
            got += sum(len(m.body) for m in thin.receive(50, 60))
    assert got == 1200
    for _ in range(50):
        clock.advance(0.2)
        try:
            got += sum(len(m.body) for m in thin.receive(50, 60))
        except RateLimitedError:
            pass
    assert 10_000 <= got <= 11_400, f"10 s at 1000 bytes/s (plus a 1 s burst and one message of debt) gave {got}"


def test_send_limits_per_topic_and_account(broker: Broker, clock: ManualClock) -> None:
    for _ in range(5):
        broker.put(Message("Capped", b"x"), 0)
    with pytest.raises(RateLimitedError, match="topic 'Capped' is limited to 5 messages/s; retry in 200 ms") as refused:
        broker.put(Message("Capped", b"x"), 0)
    assert refused.value.retry_after_ms == 200
    broker.put(Message(TOPIC, b"x"), 0)  # another topic: no limit
    clock.advance(0.2)
    broker.put(Message("Capped", b"x"), 0)
    for _ in range(4):
        broker.put(Message(TOPIC, b"x"), 0, account="alice")
    with pytest.raises(RateLimitedError, match="account 'alice'"):
        broker.put_batch([Message(TOPIC, b"x")], 0, account="alice")
    broker.put(Message(TOPIC, b"x"), 0, account="bob")


def test_limits_change_at_run_time_through_admin(broker: Broker, clock: ManualClock) -> None:
    _backlog(broker, 100)
    admin = BrokerAdmin(broker)
    views = execute(admin, "rate-limit", {"kind": "group", "name": "free", "messages_per_s": 3})
    assert {"kind": "groups", "name": "free", "messages_per_s": 3, "bytes_per_s": None, "burst_s": 1.0} in views
    consumer = broker.simple_consumer("free", {TOPIC: "*"})
    assert len(consumer.receive(100, 60)) == 3
    execute(admin, "rate-limit", {"kind": "groups", "name": "free"})  # removed
    assert len(consumer.receive(100, 60)) == 97
    assert {v["name"] for v in execute(admin, "rate-limits", {})} == {"slow", "thin", "Capped", "alice"}
    with pytest.raises(ConfigError, match="messages_per_s must be a number > 0"):
        execute(admin, "rate-limit", {"kind": "group", "name": "g", "messages_per_s": -1})


@pytest.mark.parametrize(("table", "error"), [
    ({"group": {}}, "unknown table"),
    ({"groups": {"g": {"messages": 5}}}, "Did you mean 'messages_per_s'"),
    ({"groups": {"g": {}}}, "needs messages_per_s, bytes_per_s or both"),
    ({"topics": {"bad name": {"messages_per_s": 1}}}, "topic name"),
])
def test_bad_limits_are_config_errors(tmp_path: Path, table: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        Broker.open(tmp_path / "data", plugins=["store_mmap"], limits=table)
