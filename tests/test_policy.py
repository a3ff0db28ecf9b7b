"""One redelivery policy for every way of consuming, configured in ``[groups]`` (older spellings still read)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from plugmq import (
    Broker,
    ConsumeFrom,
    ConsumeStatus,
    GroupPolicy,
    ManualClock,
    Message,
    OrderlyStatus,
    RedeliveryPolicy,
    StoredMessage,
)
from plugmq.config.broker import load_config
from plugmq.config.policy import DEFAULT_BACKOFF_S
from plugmq.core.errors import ConfigError, ValidationError
from tests.fixtures.brokers import BrokerFactory

TOPIC = "Work"


def test_the_default_is_rocketmqs_16_reconsumes_on_delay_levels_3_and_up() -> None:
    policy = RedeliveryPolicy()
    assert (policy.max_attempts, policy.max_reconsume_times) == (17, 16)
    assert [policy.backoff_ms(a) for a in (1, 2, 3, 16, 40)] == [10_000, 30_000, 60_000, 7_200_000, 7_200_000]
    assert not policy.exhausted(16) and policy.exhausted(17)
    assert policy.dead_letter_topic_for("billing") == "%DLQ%billing"
    assert len(DEFAULT_BACKOFF_S) == 16


def test_policy_values_are_checked() -> None:
    assert RedeliveryPolicy().with_max_reconsume_times(0).max_attempts == 1
    assert RedeliveryPolicy(dead_letter_topic="DEAD_{group}").dead_letter_topic_for("g") == "DEAD_g"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_attempts": 0}, ">= 1"), ({"backoff_s": []}, "empty"), ({"backoff_s": [1, -2]}, r"backoff_s\[1\]"),
        ({"backoff_s": "10"}, "a list"), ({"dead_letter_topic": "bad topic {group}"}, "legal topic")]
    for bad, message in cases:
        with pytest.raises(ValidationError, match=message):
            RedeliveryPolicy(**bad)
    with pytest.raises(ValidationError, match=">= 0"):
        RedeliveryPolicy().with_max_reconsume_times(-1)


def test_groups_table_defaults_and_groups() -> None:
    config = load_config({"groups": {"max_delivery_attempts": 5, "backoff_s": [1, 2],
                                     "orders": {"fifo": True, "backoff_s": [7]},
                                     "given": GroupPolicy(fifo=True)}})
    assert config.groups.policy("any") == GroupPolicy(RedeliveryPolicy(5, (1.0, 2.0)))
    assert config.groups.policy("orders") == GroupPolicy(RedeliveryPolicy(5, (7.0,)), fifo=True)
    assert config.groups.policy("given") == GroupPolicy(fifo=True)


@pytest.mark.parametrize(("raw", "message"), [
    ({"groups": {"max_delivery_atempts": 3}}, "groups.max_delivery_atempts: unknown key. Did you mean "
                                              "'max_delivery_attempts'?"),
    ({"groups": {"g": {"fifo": "yes"}}}, "groups.g.fifo must be true or false"),
    ({"groups": {"bad name": {}}}, "groups.bad name: group name"),
    ({"groups": {"g": {"backoff_s": [0]}}}, "groups.g.backoff_s[0] must be a number of seconds > 0"),
    ({"groups": {"g": {"max_delivery_attempts": 0}}}, "groups.g.max_delivery_attempts must be >= 1"),
    ({"groups": {"max_delivery_attempts": 3}, "broker": {"max_reconsume_times": 2}},
     "groups.max_delivery_attempts is also set by broker.max_reconsume_times, its older spelling"),
    ({"groups": {"g": {}}, "server": {"groups": {"g": {"fifo": True}}}},
     "[groups.g] is also set by server.groups.g"),
    ({"broker": {"max_reconsume_times": -1}}, "broker.max_reconsume_times must be >= 0"),
    ({"broker": {"pop_fsync": True}, "server": {"pop_fsync": False}}, "keep broker.pop_fsync"),
    ({"groups": 3}, "[groups] must be a table"),
])
def test_groups_config_errors_name_the_key_and_the_fix(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert message in str(caught.value)


def test_older_spellings_still_work() -> None:
    config = load_config({"broker": {"max_reconsume_times": 2},
                          "server": {"groups": {"orders": {"fifo": True}}, "pop_compact_bytes": 1000}})
    assert config.groups.policy("x").redelivery.max_attempts == 3
    assert config.groups.policy("orders") == GroupPolicy(RedeliveryPolicy(3), fifo=True)
    assert config.pop_compact_bytes == 1000


def test_a_toml_file_with_groups(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\ndata_dir = "d"\n[groups]\nbackoff_s = [5]\n[groups.orders]\n'
                    'max_delivery_attempts = 2\ndead_letter_topic = "%DLQ%{group}-dead"\n', encoding="utf-8")
    policy = load_config(path).groups.policy("orders").redelivery
    assert (policy.max_attempts, policy.backoff_s, policy.dead_letter_topic_for("orders")) == \
        (2, (5.0,), "%DLQ%orders-dead")


# ------------------------------------------------------------------------------ push consumers
def _failing_push(broker: Broker, group: str, seen: list[tuple[float, int]], clock: ManualClock,
                  **options: Any) -> Any:
    start = clock.now()

    def listener(messages: list[StoredMessage]) -> ConsumeStatus:
        seen.extend((clock.now() - start, m.reconsume_times) for m in messages)
        return ConsumeStatus.RECONSUME_LATER

    return broker.push_consumer(group, listener, background=False, consume_from=ConsumeFrom.FIRST_OFFSET,
                                **options).subscribe(TOPIC).start()


def _dead(broker: Broker, topic: str) -> list[StoredMessage]:
    return list(broker.pull(broker.topic_queues(topic)[0], 0, 8).messages)


def test_push_consumers_retry_on_the_groups_back_off_and_dead_letter_where_it_says(make_broker: BrokerFactory,
                                                                                   clock: ManualClock) -> None:
    groups = {"custom": {"max_delivery_attempts": 3, "backoff_s": [4, 7], "dead_letter_topic": "DEAD_{group}"}}
    broker = make_broker(["store_mmap", "delay_wheel", "alloc"], groups=groups)
    broker.create_topic(TOPIC, 1)
    seen: list[tuple[float, int]] = []
    consumer = _failing_push(broker, "custom", seen, clock)
    broker.put(Message(TOPIC, b"poison"), 0)
    for _ in range(30):
        consumer.consume_available()
        clock.advance(1)
    assert [r for _, r in seen] == [0, 1, 2]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
    assert 4 <= gaps[0] <= 6 and 7 <= gaps[1] <= 9, gaps  # arbitrary back-off: deliver times on the wheel
    assert [(m.body, m.reconsume_times) for m in _dead(broker, "DEAD_custom")] == [(b"poison", 2)]


def test_a_consumers_own_policy_or_max_reconsume_times_overrides_the_groups(make_broker: BrokerFactory,
                                                                            clock: ManualClock) -> None:
    broker = make_broker(["store_mmap", "delay_level", "alloc"])
    broker.create_topic(TOPIC, 1)
    seen: list[tuple[float, int]] = []
    own = RedeliveryPolicy(max_attempts=2, backoff_s=(5,))  # 5 s is delay level 2: levels can express it
    consumer = _failing_push(broker, "own", seen, clock, policy=own)
    assert consumer.max_reconsume_times == 1
    broker.put(Message(TOPIC, b"m"), 0)
    for _ in range(10):
        consumer.consume_available()
        clock.advance(1)
    assert [r for _, r in seen] == [0, 1] and 5 <= seen[1][0] <= 6
    assert [m.body for m in _dead(broker, "%DLQ%own")] == [b"m"]
    none = broker.push_consumer("none", lambda _m: ConsumeStatus.RECONSUME_LATER, background=False,
                                max_reconsume_times=0, consume_from=ConsumeFrom.FIRST_OFFSET)
    none.subscribe(TOPIC).start().consume_available()
    assert [m.body for m in _dead(broker, "%DLQ%none")] == [b"m"]


def test_orderly_consumers_dead_letter_after_the_policys_attempts(make_broker: BrokerFactory,
                                                                 clock: ManualClock) -> None:
    broker = make_broker(["store_mmap", "alloc"], groups={"ordered": {"max_delivery_attempts": 2}})
    broker.create_topic(TOPIC, 1)
    broker.put(Message(TOPIC, b"stuck"), 0)
    broker.put(Message(TOPIC, b"next"), 0)
    done: list[bytes] = []

    def listener(messages: list[StoredMessage]) -> OrderlyStatus:
        if messages[0].body == b"stuck":
            return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        done.extend(m.body for m in messages)
        return OrderlyStatus.SUCCESS

    consumer = broker.push_consumer("ordered", listener, orderly=True, background=False,
                                    consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(TOPIC).start()
    consumer.consume_available()
    assert done == []
    clock.advance(1)
    consumer.consume_available()  # the second failure is the last attempt: DLQ, then "next"
    assert done == [b"next"]
    assert [m.body for m in _dead(broker, "%DLQ%ordered")] == [b"stuck"]
