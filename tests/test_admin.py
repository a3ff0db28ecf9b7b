"""The admin verbs (plugmq.admin) on an in-process broker on a ManualClock, real files.

Offset groups (push consumers) and pop groups (simple consumers) alike: progress and lag, reset by
time (RocketMQ's resetOffsetByTime, force or only backwards, running push consumers restarted
from the new offsets), queries, DLQ resends (a cursor, chosen ids, the retry topic), bad input.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugmq import Broker, ConsumeFrom, ConsumeStatus, ManualClock, Message
from plugmq.admin import BrokerAdmin, execute, parse_time
from plugmq.core.errors import InvalidNameError, TopicError, ValidationError
from plugmq.core.names import Prop

START = 1_700_000_000.0
GROUPS: dict[str, Any] = {"pop-g": {"max_delivery_attempts": 2},
                          "push-g": {"max_delivery_attempts": 2, "backoff_s": [1]}}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    clock = ManualClock(start=START)
    with Broker.open(tmp_path / "data", clock=clock, groups=GROUPS,
                     plugins=["store_mmap", "delay_wheel", "filter_tag", "alloc"]) as opened:
        yield opened


def send(broker: Broker, topic: str, *bodies: str, queue: int = 0, keys: str | None = None) -> list[str]:
    ids = []
    for body in bodies:
        ids.append(broker.put(Message(topic, body.encode(), keys=keys), queue).msg_id)
        broker.clock.advance(1)  # type: ignore[attr-defined]
    return ids


def run(broker: Broker, verb: str, **args: Any) -> Any:
    return execute(BrokerAdmin(broker), verb, args)


def lag_of(broker: Broker, group: str) -> int:
    return int(run(broker, "consumer-progress", group=group)["lag"])


def test_topic_list_status_and_update(broker: Broker) -> None:
    assert run(broker, "update-topic", topic="Orders", queue_count=2) == {
        "topic": "Orders", "queue_count": 2, "previous": None}
    send(broker, "Orders", "a", "b", queue=1)
    status = run(broker, "topic-status", topic="Orders")
    assert [(q["queue_id"], q["min_offset"], q["max_offset"]) for q in status["queues"]] == [(0, 0, 0), (1, 0, 2)]
    assert status["queues"][0]["last_store_ms"] is None
    assert status["queues"][1]["last_store_ms"] == int(START * 1000) + 1000  # the second send, a second later
    assert run(broker, "update-topic", topic="Orders", queue_count=4)["previous"] == 2
    assert broker.topic_queues("Orders")[-1].queue_id == 3
    with pytest.raises(ValidationError, match="never shrinks; ask for 4 or more"):
        run(broker, "update-topic", topic="Orders", queue_count=3)
    with pytest.raises(TopicError, match="system topic"):
        run(broker, "update-topic", topic="%DLQ%x", queue_count=1)
    with pytest.raises(InvalidNameError):
        run(broker, "update-topic", topic="bad name", queue_count=1)
    with pytest.raises(TopicError, match="does not exist .* topic-list"):
        run(broker, "topic-status", topic="Nope")
    rows = {row["topic"]: row for row in run(broker, "topic-list")}
    assert rows["Orders"] == {"topic": "Orders", "kind": "normal", "queues": 4, "messages": 2}


def test_pop_group_lag_rises_with_sends_and_falls_with_acks(broker: Broker) -> None:
    broker.create_topic("Jobs", 1)
    consumer = broker.simple_consumer("pop-g", {"Jobs": "*"})
    assert consumer.receive(8, invisible_duration_s=30) == []  # the group's first look: a position, no lag
    assert lag_of(broker, "pop-g") == 0
    send(broker, "Jobs", "1", "2", "3")
    assert lag_of(broker, "pop-g") == 3
    received = consumer.receive(8, invisible_duration_s=30)
    (row,) = run(broker, "consumer-progress", group="pop-g")["queues"]
    assert (row["mode"], row["broker_offset"], row["consumer_offset"], row["inflight"], row["lag"]) == (
        "pop", 3, 0, 3, 3)  # received, not acked: still lag, now in flight
    consumer.ack(received[1])
    consumer.ack(received[0])
    (row,) = run(broker, "consumer-progress", group="pop-g")["queues"]
    assert (row["consumer_offset"], row["inflight"], row["lag"]) == (2, 1, 1)
    assert row["oldest_pending_ms"] == int(START * 1000) + 2000  # the third message
    consumer.ack(received[2])
    assert lag_of(broker, "pop-g") == 0
    assert run(broker, "consumer-progress") == [
        {"group": "pop-g", "modes": ["pop"], "queues": 1, "lag": 0, "inflight": 0}]


def test_offset_group_progress_and_reset_with_a_running_push_consumer(broker: Broker) -> None:
    broker.create_topic("Orders", 2)
    send(broker, "Orders", "a", "b", "c", queue=0)
    send(broker, "Orders", "d", queue=1)
    seen: list[bytes] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        seen.extend(m.body for m in messages)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = broker.push_consumer("offsets-g", listener, consume_from=ConsumeFrom.FIRST_OFFSET,
                                    background=False, max_reconsume_times=0).subscribe("Orders").start()
    try:
        assert consumer.consume_available() == 4
        progress = run(broker, "consumer-progress", group="offsets-g")
        assert [(q["topic"], q["queue_id"], q["mode"], q["consumer_offset"], q["lag"]) for q in progress["queues"]] == [
            ("Orders", 0, "offset", 3, 0), ("Orders", 1, "offset", 1, 0)]
        assert progress["members"] == [consumer.client_id]
        send(broker, "Orders", "e", queue=0)
        assert lag_of(broker, "offsets-g") == 1

        # Back to the second message's store time: queue 0 from b, queue 1 from d (stored later).
        back = run(broker, "reset-offset", group="offsets-g", topic="Orders",
                   timestamp_ms=int(START * 1000) + 1000, force=False)
        assert [(q["queue_id"], q["previous"], q["offset"]) for q in back["queues"]] == [(0, 3, 1), (1, 1, 0)]
        # Without force nothing moves forward: "now" leaves both queues where they are.
        kept = run(broker, "reset-offset", group="offsets-g", topic="Orders", timestamp_ms=None, force=False)
        assert [(q["queue_id"], q["previous"], q["offset"]) for q in kept["queues"]] == [(0, 1, 1), (1, 0, 0)]
        assert consumer.consume_available() == 4
        assert sorted(seen[-4:]) == [b"b", b"c", b"d", b"e"]

        # Forced to "now": the end of every queue, the running consumer skips ahead.
        send(broker, "Orders", "f", queue=1)
        result = run(broker, "reset-offset", group="offsets-g", topic="Orders", timestamp_ms=None)
        assert [(q["queue_id"], q["offset"]) for q in result["queues"]] == [(0, 4), (1, 2)]
        assert result["moved_members"] == [consumer.client_id]
        assert consumer.consume_available() == 0
        assert lag_of(broker, "offsets-g") == 0
    finally:
        consumer.shutdown()


def test_pop_reset_by_time_redelivers_and_old_handles_stop_working(broker: Broker) -> None:
    broker.create_topic("Jobs", 1)
    send(broker, "Jobs", "1", "2", "3")
    consumer = broker.simple_consumer("pop-g", {"Jobs": "*"})
    first = consumer.receive(8, invisible_duration_s=30)
    consumer.ack(first[0])
    result = run(broker, "reset-offset", group="pop-g", topic="Jobs", timestamp_ms=int(START * 1000) + 1000)
    assert [(q["mode"], q["previous"], q["offset"]) for q in result["queues"]] == [("pop", 3, 1)]
    with pytest.raises(Exception, match="no message of group 'pop-g'"):
        consumer.ack(first[1])  # forgotten by the reset
    again = consumer.receive(8, invisible_duration_s=30)
    assert [(m.body, m.delivery_attempt) for m in again] == [(b"2", 1), (b"3", 1)]
    with pytest.raises(ValidationError, match="never consumed topic 'Jobs'"):
        run(broker, "reset-offset", group="other", topic="Jobs", timestamp_ms=0)
    with pytest.raises(TopicError):
        run(broker, "reset-offset", group="pop-g", topic="Nope", timestamp_ms=0)


def test_query_by_offset_id_client_id_key_and_time(broker: Broker) -> None:
    broker.create_topic("Orders", 2)
    ids = send(broker, "Orders", "a", "b", "c", keys="order-7")
    unique = broker.query_by_id(ids[1]).unique_id  # type: ignore[union-attr]
    (by_id,) = run(broker, "query-msg", id=ids[1].lower())
    assert (by_id["body"], by_id["body_encoding"], by_id["keys"]) == ("b", "utf-8", ["order-7"])
    assert [m["msg_id"] for m in run(broker, "query-msg", id=unique)] == [ids[1]]  # searched in every topic
    assert run(broker, "query-msg", id="no-such-id", topic="Orders") == []
    assert [m["body"] for m in run(broker, "query-msg", key="order-7", topic="Orders")] == ["a", "b", "c"]
    assert len(run(broker, "query-msg", key="order-7", topic="Orders", max=2)) == 2
    begin = int(START * 1000) + 1000
    assert [m["body"] for m in run(broker, "query-msg", topic="Orders", begin_ms=begin)] == ["b", "c"]
    assert [m["body"] for m in run(broker, "query-msg", topic="Orders", begin_ms=0, end_ms=begin)] == ["a"]
    broker.put(Message("Orders", b"\xff\x00"), 1)
    (binary,) = run(broker, "query-msg", topic="Orders", begin_ms=begin + 2000)
    assert (binary["body"], binary["body_encoding"]) == ("/wA=", "base64")
    with pytest.raises(ValidationError, match="exactly one of"):
        run(broker, "query-msg", id=ids[0], key="order-7", topic="Orders")
    with pytest.raises(ValidationError, match="needs a topic"):
        run(broker, "query-msg", key="order-7")
    with pytest.raises(ValidationError, match="maximum number of messages"):
        run(broker, "query-msg", key="order-7", topic="Orders", max=0)


def test_resend_dlq_to_the_topic_and_to_the_retry_topic(broker: Broker) -> None:
    broker.create_topic("Jobs", 1)
    send(broker, "Jobs", "1", "2")
    consumer = broker.simple_consumer("pop-g", {"Jobs": "*"})
    for message in consumer.receive(8, invisible_duration_s=5):
        consumer.nack(message)
    broker.clock.advance(60)  # type: ignore[attr-defined]
    for message in consumer.receive(8, invisible_duration_s=5):
        assert message.delivery_attempt == 2  # the last attempt: not acked, so dead-lettered
    broker.clock.advance(10)  # type: ignore[attr-defined]
    broker.pop.revive()
    assert {r["topic"]: r["messages"] for r in run(broker, "topic-list")}["%DLQ%pop-g"] == 2
    assert consumer.receive(8, invisible_duration_s=5) == []

    result = run(broker, "resend-dlq", group="pop-g")
    assert [(r["dlq_offset"], r["original_topic"], r["topic"]) for r in result["resent"]] == [
        (0, "Jobs", "Jobs"), (1, "Jobs", "Jobs")]
    again = consumer.receive(8, invisible_duration_s=5)
    assert sorted(m.body for m in again) == [b"1", b"2"]
    assert all(m.delivery_attempt == 1 and m.properties[Prop.RETRY_TOPIC] == "Jobs" for m in again)
    assert {m.unique_id for m in again} == {r["unique_id"] for r in result["resent"]}  # the id clients know
    assert run(broker, "resend-dlq", group="pop-g")["resent"] == []  # the cursor: nothing resent twice

    chosen = run(broker, "resend-dlq", group="pop-g", ids=[result["resent"][1]["unique_id"], "nope"],
                 target="retry")
    assert [(r["dlq_offset"], r["topic"]) for r in chosen["resent"]] == [(1, "%RETRY%pop-g")]
    assert chosen["skipped"] == ["nope: not in %DLQ%pop-g"]
    with pytest.raises(ValidationError, match="no dead-letter topic"):
        run(broker, "resend-dlq", group="never-failed")
    with pytest.raises(ValidationError, match="resend target 'elsewhere'"):
        run(broker, "resend-dlq", group="pop-g", target="elsewhere")


def test_resend_to_the_retry_topic_reaches_the_groups_push_consumers_only(broker: Broker) -> None:
    broker.create_topic("Orders", 1)
    bodies: dict[str, list[bytes]] = {"push-g": [], "bystander": []}
    failing = {"on": True}

    def listener_of(group: str) -> Any:
        def listen(messages: list[Any]) -> ConsumeStatus:
            if group == "push-g" and failing["on"]:
                return ConsumeStatus.RECONSUME_LATER
            bodies[group].extend(m.body for m in messages)
            return ConsumeStatus.CONSUME_SUCCESS
        return listen

    consumers = [broker.push_consumer(g, listener_of(g), consume_from=ConsumeFrom.FIRST_OFFSET, background=False)
                 .subscribe("Orders").start() for g in bodies]
    try:
        send(broker, "Orders", "x")
        for consumer in consumers:
            consumer.consume_available()  # push-g fails: a retry in 1 s
        broker.clock.advance(2)  # type: ignore[attr-defined]
        consumers[0].consume_available()  # the retry fails too: the last attempt, dead-lettered
        assert run(broker, "topic-status", topic="%DLQ%push-g")["queues"][0]["max_offset"] == 1
        failing["on"] = False
        resent = run(broker, "resend-dlq", group="push-g", target="retry")["resent"]
        assert [r["topic"] for r in resent] == ["%RETRY%push-g"]
        for consumer in consumers:
            consumer.consume_available()
        assert bodies == {"push-g": [b"x"], "bystander": [b"x"]}  # the bystander got it once, from the send
    finally:
        for consumer in consumers:
            consumer.shutdown()


def test_broker_status_and_bad_arguments(broker: Broker) -> None:
    broker.create_topic("Orders", 1)
    send(broker, "Orders", "a")
    status = run(broker, "broker-status")
    assert (status["broker"], status["role"], status["topics"], status["messages_in"]) == (
        "broker-a", "standalone", 1, 1)
    assert status["store"]["messages_appended"] == 1 and status["delay_pending"] == 0
    with pytest.raises(ValidationError, match="unknown argument.*colour"):
        run(broker, "topic-list", colour="red")
    with pytest.raises(ValidationError, match="missing argument.*topic"):
        run(broker, "topic-status")
    with pytest.raises(ValidationError, match="admin verb 'drop-everything' is unknown"):
        execute(BrokerAdmin(broker), "drop-everything", {})
    with pytest.raises(ValidationError, match="timestamp_ms must be an integer"):
        run(broker, "reset-offset", group="g", topic="Orders", timestamp_ms="yesterday")
    with pytest.raises(ValidationError, match="never consumed here"):
        run(broker, "consumer-progress", group="ghost")


def test_parse_time() -> None:
    assert parse_time("now") is None
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20+00:00") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000
    local = parse_time("2023-11-14T22:13:20.5")
    assert parse_time("2023-11-14#22:13:20:500") == local
    with pytest.raises(ValidationError, match="not understood; use 'now', epoch milliseconds"):
        parse_time("yesterday")


def test_cli_on_a_stopped_data_dir_and_one_line_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plugmq.cli import main

    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nplugins = ["store_mmap", "filter_tag"]\n', encoding="utf-8")
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(main, ["admin", *args], catch_exceptions=False)

    assert cli("update-topic", "Orders", "-q", "3", "--config", str(config)).stdout == \
        "created topic Orders with 3 queues\n"
    assert cli("update-topic", "Orders", "-q", "3", "--config", str(config)).stdout == \
        "topic Orders already has 3 queues; nothing changed\n"
    table = cli("topic-status", "Orders", "--config", str(config)).stdout
    assert "Orders on broker broker-a" in table and table.count("│ 0 ") >= 3
    listed = cli("topic-list", "--config", str(config), "--json").stdout
    assert '"topic": "Orders"' in listed
    for args, fragments in [
        (("topic-list",), ("give --server HOST:PORT", "or --config FILE")),
        (("topic-status", "Nope", "--config", str(config)), ("topic 'Nope' does not exist",)),
        (("reset-offset", "g", "Orders", "--time", "yesterday", "--config", str(config)), ("not understood",)),
        (("reset-offset", "g", "Orders", "--time", "now", "--config", str(config)), ("never consumed topic",)),
        (("query-msg", "--config", str(config)), ("exactly one of --id, --key or --time",)),
        (("update-topic", "bad name", "-q", "1", "--config", str(config)), ("contains ' '",)),
        (("cluster-list", "--config", str(config)), ("names no cluster", '[cluster] name = "..."')),
        (("update-topic", "T", "-q", "1", "--cluster", "c1", "--config", str(config)), ("names no cluster",)),
    ]:
        result = runner.invoke(main, ["admin", *args])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("plugmq: error: "), result.stderr
        for fragment in fragments:
            assert fragment in lines[0], lines[0]
