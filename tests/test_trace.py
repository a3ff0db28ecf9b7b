"""The trace plugin: every step of 1,000 messages recorded in order, read back by the admin's trace verb.

The consume-side steps come from the plugin's records, the stored steps from the store's copies.

A real broker (store_mmap on a temp dir) on a ManualClock; messages go through a send, a nack and a
retry, a second nack that exhausts their attempts, the dead-letter topic, a re-drive and an ack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugmq import Broker, ManualClock, Message
from plugmq.admin import BrokerAdmin, execute
from plugmq.core import Prop
from plugmq.core.errors import TopicError
from plugmq.core.names import TRACE_TOPIC
from plugmq.core.trace import TraceEvent, TraceKind, decode_trace_batch, encode_trace_batch
from plugmq.plugins.trace import recorder

TOPIC = "Orders"
GROUP = "billing"
COUNT = 1000
GROUPS = {"max_delivery_attempts": 2, "backoff_s": [5]}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    clock = ManualClock()
    opened = Broker.open(tmp_path / "data", plugins=["store_mmap", "filter_tag", "trace"], clock=clock, groups=GROUPS)
    opened.create_topic(TOPIC, 4)
    yield opened
    opened.close()


def _flush(broker: Broker) -> None:
    found = recorder(broker.name)
    assert found is not None
    found.flush()
    assert found.dropped == 0


def test_every_step_of_a_thousand_messages_is_recorded_in_order(broker: Broker) -> None:
    clock = broker.clock
    assert isinstance(clock, ManualClock)
    producer = broker.producer("shop")
    sent = [producer.send(Message(TOPIC, f"order {i}".encode(), keys=(f"k{i}",))) for i in range(COUNT)]
    by_id = {result.unique_id: result for result in sent}
    ids = set(by_id)
    consumer = broker.simple_consumer(GROUP, {TOPIC: "*"}, client_id="worker-1")

    def receive_all(expected: int) -> list:
        got: list = []
        while len(got) < expected:
            batch = consumer.receive(32, invisible_duration_s=30)
            assert batch, f"received {len(got)} of {expected}"
            got += batch
        return got

    for message in receive_all(COUNT):  # attempt 1 fails: back in 5 s
        consumer.nack(message)
    clock.advance(6)
    second = receive_all(COUNT)
    assert {m.delivery_attempt for m in second} == {2}
    for message in second:  # attempt 2 was the last: dead-lettered when its back-off ends
        consumer.nack(message)
    clock.advance(6)
    admin = BrokerAdmin(broker)
    resent = admin.resend_dlq(GROUP, limit=COUNT)
    assert len(resent.resent) == COUNT
    for message in receive_all(COUNT):
        consumer.ack(message)
    _flush(broker)

    expected = [
        (TraceKind.STORED, TOPIC), (TraceKind.DELIVERED, TOPIC), (TraceKind.NACKED, TOPIC),
        (TraceKind.RETRIED, TOPIC), (TraceKind.DELIVERED, TOPIC), (TraceKind.NACKED, TOPIC),
        (TraceKind.STORED, f"%DLQ%{GROUP}"), (TraceKind.DEAD_LETTERED, TOPIC), (TraceKind.STORED, TOPIC),
        (TraceKind.REDRIVEN, f"%DLQ%{GROUP}"), (TraceKind.DELIVERED, TOPIC), (TraceKind.ACKED, TOPIC),
    ]
    for unique_id in ids:
        trace = execute(admin, "trace", {"id": unique_id})
        steps = [(TraceKind(e["kind"]), e["topic"]) for e in trace["events"]]
        assert steps == expected, unique_id
        events = trace["events"]
        recorded = [e["seq"] for e in events if e["kind"] != "stored"]  # stored steps come from the store
        assert recorded == sorted(recorded)
        assert next(e["msg_id"] for e in events if e["kind"] == "stored") == by_id[unique_id].msg_id
        assert events[1]["client"] == "worker-1" and events[1]["group"] == GROUP
        assert [e["attempt"] for e in events if e["kind"] == "delivered"] == [1, 2, 1]
        assert events[9]["detail"]["to_topic"] == TOPIC
        assert events[8]["msg_id"] == events[9]["detail"]["copy_msg_id"]


def test_trace_by_offset_message_id_and_unknown_ids(broker: Broker) -> None:
    result = broker.producer("shop").send(Message(TOPIC, b"one"))
    _flush(broker)
    admin = BrokerAdmin(broker)
    by_offset_id = execute(admin, "trace", {"id": result.msg_id})
    assert by_offset_id["unique_id"] == result.unique_id
    assert [(e["kind"], e["msg_id"]) for e in by_offset_id["events"]] == [("stored", result.msg_id)]
    assert execute(admin, "trace", {"id": "no-such-message"})["events"] == []


def test_trace_topic_is_the_brokers_own(broker: Broker) -> None:
    with pytest.raises(TopicError, match="system topic"):
        broker.put(Message(TRACE_TOPIC, b"forged"), 0)


def test_a_broker_without_the_plugin_says_how_to_record(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "plain", plugins=["store_mmap"], clock=ManualClock()) as plain:
        plain.create_topic(TOPIC, 1)
        sent = plain.producer("p").send(Message(TOPIC, b"x"))
        with pytest.raises(Exception, match="add 'trace' to broker.plugins"):
            execute(BrokerAdmin(plain), "trace", {"id": sent.unique_id})


def test_records_round_trip_and_bad_lines_are_named() -> None:
    event = TraceEvent(7, 1000, "acked", "b", "U1", "M1", TOPIC, 0, 3, GROUP, "c", 1, {"invisible_ms": 5})
    assert decode_trace_batch(encode_trace_batch([event, event])) == [event, event]
    with pytest.raises(Exception, match="line 2"):
        decode_trace_batch(encode_trace_batch([event]) + b"\n[1,2]")


def test_trace_context_travels_with_dead_letter_and_redriven_copies(broker: Broker) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    broker.put(Message(TOPIC, b"traced"), 0, extra_properties={Prop.TRACE_CONTEXT: traceparent})
    consumer = broker.simple_consumer(GROUP, {TOPIC: "*"})
    clock = broker.clock
    assert isinstance(clock, ManualClock)
    for _ in range(2):
        (message,) = consumer.receive(1)
        consumer.nack(message)
        clock.advance(6)
    admin = BrokerAdmin(broker)
    admin.resend_dlq(GROUP)
    (again,) = consumer.receive(1)
    assert again.properties[Prop.TRACE_CONTEXT] == traceparent
    assert Prop.TRACE_CONTEXT not in again.user_properties


def test_plugmq_admin_trace_inflight_and_dlq_browse_on_a_stopped_data_dir(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from plugmq.cli import main

    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nplugins = ["store_mmap", "filter_tag", "trace"]\n'
                      f'[groups.{GROUP}]\nmax_delivery_attempts = 1\nbackoff_s = [1]\n', encoding="utf-8")
    clock = ManualClock(start=time.time())  # the CLI reopens on the system clock: deadlines stay ahead
    with Broker.from_config(config, clock=clock) as broker:
        broker.create_topic(TOPIC, 1)
        sent = [broker.producer("shop").send(Message(TOPIC, f"order {i}".encode())) for i in range(3)]
        consumer = broker.simple_consumer(GROUP, {TOPIC: "*"}, client_id="worker-9")
        first, second, third = consumer.receive(3, invisible_duration_s=3600)
        consumer.ack(first)
        consumer.nack(second)  # its only attempt: dead-lettered once the back-off ends
        clock.advance(2)
    runner = CliRunner()

    def cli(*args: str) -> Any:
        done = runner.invoke(main, ["admin", *args, "--config", str(config)], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return done.stdout

    steps = json.loads(cli("trace", "--id", sent[0].unique_id, "--json"))["events"]
    assert [e["kind"] for e in steps] == ["stored", "delivered", "acked"]
    assert "worker-9" in cli("trace", "--id", sent[0].unique_id)
    inflight = json.loads(cli("group-inflight", GROUP, "--json"))
    assert [m["unique_id"] for m in inflight] == [third.unique_id]
    page = json.loads(cli("dlq-browse", GROUP, "--json"))
    assert [d["message"]["unique_id"] for d in page["messages"]] == [second.unique_id]
    assert json.loads(cli("group-clients", GROUP, "--json"))["clients"] == []
    assert "no trace of message nope" in runner.invoke(main, ["admin", "trace", "--id", "nope", "--config",
                                                              str(config)]).output


def test_plugmq_bench_trace_runs_both_brokers_and_the_recorder_drops_nothing() -> None:
    from click.testing import CliRunner

    from plugmq.cli import main

    done = CliRunner().invoke(main, ["bench", "trace", "--messages", "300", "--rounds", "1"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "trace off (baseline)" in done.output and "trace on" in done.output
    assert "600 written, 0 dropped" in done.output  # a delivered and an acked step per message
