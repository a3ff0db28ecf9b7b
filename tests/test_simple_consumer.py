"""``broker.simple_consumer``: pop consumption from Python on a ManualClock, real files, a real child killed -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import plugmq
from plugmq import (
    Broker,
    ConsumeFrom,
    FilterExpression,
    ManualClock,
    Message,
    ReceiptHandleError,
    ReceivedMessage,
    SimpleConsumer,
)
from plugmq.core import Prop, hookimpl
from plugmq.core.errors import ClientError, FilterSyntaxError, TopicError, ValidationError
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.legacy_state import write_legacy_pop

TOPIC = "Jobs"
PLUGINS = ["store_mmap", "filter_tag", "filter_sql"]
GROUPS: dict[str, Any] = {
    "max_delivery_attempts": 3,
    "backoff_s": [10, 30],
    "fifo-g": {"fifo": True},
}


class Rig:
    def __init__(self, directory: Path, *, queues: int = 1, start: float = 1_700_000_000.0,
                 objects: dict[str, object] | None = None) -> None:
        self.clock = ManualClock(start=start)
        self.directory = directory
        self.objects = objects
        self.broker = self.open()
        self.broker.create_topic(TOPIC, queues)

    def open(self) -> Broker:
        names = PLUGINS + list(self.objects or {})
        return Broker.open(self.directory, plugins=names, clock=self.clock, groups=GROUPS,
                           plugin_objects=self.objects)

    def restart(self) -> None:
        self.broker.close()
        self.broker = self.open()

    def send(self, *bodies: str, tags: str | None = None, message_group: str | None = None, queue: int = 0,
             **properties: str) -> None:
        extra = {Prop.SHARDING_KEY: message_group} if message_group else None
        for body in bodies:
            self.broker.put(Message(TOPIC, body.encode(), tags=tags, properties=properties), queue,
                            extra_properties=extra)

    def consumer(self, group: str = "g", expression: str | FilterExpression = "*", **options: Any) -> SimpleConsumer:
        return self.broker.simple_consumer(group, {TOPIC: expression}, **options)

    def dead_letters(self, group: str = "g") -> list[bytes]:
        topic = plugmq.RedeliveryPolicy().dead_letter_topic_for(group)
        if self.broker.topics.get(topic) is None:
            return []
        return [m.body for m in self.broker.pull(self.broker.topic_queues(topic)[0], 0, 64).messages]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path / "data")
    yield r
    r.broker.close()


def bodies(messages: list[ReceivedMessage]) -> list[str]:
    return [m.body.decode() for m in messages]


def test_receive_then_ack(rig: Rig) -> None:
    rig.send("a", "b", "c", tags="x")
    consumer = rig.consumer()
    got = consumer.receive(2, 30)
    assert bodies(got) == ["a", "b"]
    first = got[0]
    assert isinstance(first, ReceivedMessage) and isinstance(first, plugmq.StoredMessage)
    assert (first.delivery_attempt, first.consumer_group, first.topic, first.tags) == (1, "g", TOPIC, "x")
    assert first.receipt_handle and first.invisible_duration_ms == 30_000
    assert bodies(consumer.receive(16, 30)) == ["c"]
    for message in got:
        consumer.ack(message)
    with pytest.raises(ReceiptHandleError, match="acknowledged already"):
        consumer.ack(first)
    rig.clock.advance(31)
    assert bodies(consumer.receive(16, 30)) == ["c"]  # only the unacked one comes back


def test_invisible_time_running_out_delivers_attempt_2_and_makes_the_old_handle_stale(rig: Rig) -> None:
    rig.send("job")
    consumer = rig.consumer()
    (first,) = consumer.receive(16, 5)
    rig.clock.advance(4.9)
    assert consumer.receive(16, 5) == []
    rig.clock.advance(0.2)
    (second,) = consumer.receive(16, 5)
    assert (second.body, second.delivery_attempt, second.msg_id) == (b"job", 2, first.msg_id)
    with pytest.raises(ReceiptHandleError, match="stale"):
        consumer.ack(first)
    consumer.ack(second)
    rig.clock.advance(600)
    assert consumer.receive(16, 5) == []


def test_change_invisible_duration_extends_or_shortens(rig: Rig) -> None:
    rig.send("slow", "quick")
    consumer = rig.consumer()
    slow, quick = consumer.receive(16, 5)
    slow = consumer.change_invisible_duration(slow, 60)
    consumer.change_invisible_duration(quick, 0)  # honoured as asked: visible again right away
    (quick,) = consumer.receive(16, 5)
    assert (quick.body, quick.delivery_attempt) == (b"quick", 2)
    consumer.ack(quick)
    rig.clock.advance(30)
    assert consumer.receive(16, 5) == []  # "slow" is invisible for 60 s
    rig.clock.advance(31)
    assert [(m.body, m.delivery_attempt) for m in consumer.receive(16, 5)] == [(b"slow", 2)]
    with pytest.raises(ReceiptHandleError, match="stale"):
        consumer.ack(slow)  # the handle of before the time ran out


def test_several_topics_and_filters(rig: Rig) -> None:
    rig.broker.create_topic("Other", 1)
    rig.send("small", size="1")
    rig.send("big", size="9")
    rig.broker.put(Message("Other", b"other", tags="keep"), 0)
    rig.broker.put(Message("Other", b"skipped", tags="drop"), 0)
    consumer = rig.broker.simple_consumer("g", {TOPIC: FilterExpression("size > 5", "SQL92"), "Other": "keep"})
    assert sorted(bodies(consumer.receive(16, 30))) == ["big", "other"]
    assert set(consumer.subscriptions) == {TOPIC, "Other"}
    consumer.unsubscribe("Other")
    assert set(consumer.subscriptions) == {TOPIC}


def test_mistakes_are_clear_errors(rig: Rig) -> None:
    rig.send("m")
    with pytest.raises(FilterSyntaxError):
        rig.consumer(expression=FilterExpression("a >>> 3", "SQL92"))
    with pytest.raises(ValidationError, match="'TAG' or 'SQL92'"):
        FilterExpression("x", "REGEX")
    with Broker.open(rig.directory.parent / "strict", plugins=PLUGINS, clock=rig.clock,
                     auto_create_topic=False) as strict, pytest.raises(TopicError, match="does not exist"):
        strict.simple_consumer("g", {"Nope": "*"})
    consumer = rig.consumer()
    with pytest.raises(ValidationError, match="invisible_duration_s"):
        consumer.receive(16, 0)
    with pytest.raises(ValidationError, match="max_messages"):
        consumer.receive(0, 30)
    (message,) = consumer.receive(16, 30)
    with pytest.raises(ReceiptHandleError, match="received by group 'g'"):
        rig.consumer("h").ack(message)
    with pytest.raises(ReceiptHandleError, match="no receipt handle"):
        consumer.ack(rig.broker.pull(rig.broker.topic_queues(TOPIC)[0], 0).messages[0])  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="no subscription"):
        rig.broker.simple_consumer("g").receive()
    consumer.close()
    with pytest.raises(ClientError, match="closed"):
        consumer.receive()


def test_groups_are_independent_and_can_start_at_the_end(rig: Rig) -> None:
    rig.send("old")
    assert bodies(rig.consumer("g").receive()) == ["old"]
    assert bodies(rig.consumer("h").receive()) == ["old"]
    late = rig.consumer("late", consume_from=ConsumeFrom.LAST_OFFSET)
    assert late.receive() == []
    rig.send("new")
    assert bodies(late.receive()) == ["new"]


def test_fifo_group_gets_a_message_groups_next_only_after_the_ack(tmp_path: Path) -> None:
    r = Rig(tmp_path / "data")
    try:
        for body, group in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B")]:
            r.send(body, message_group=group)
        consumer = r.consumer("fifo-g")
        first = consumer.receive(16, 10)
        assert bodies(first) == ["a1", "b1"] and first[0].message_group == "A"
        consumer.ack(first[0])
        assert consumer.receive(16, 10) == []  # b1 in flight: the queue waits
        r.clock.advance(11)
        (again,) = consumer.receive(16, 10)
        assert (again.body, again.delivery_attempt) == (b"b1", 2)
        consumer.ack(again)
        assert bodies(consumer.receive(16, 10)) == ["a2", "b2"]
    finally:
        r.broker.close()


def test_dead_letter_after_max_attempts_without_any_receive(rig: Rig) -> None:
    rig.send("poison")
    consumer = rig.consumer()
    for attempt in (1, 2, 3):
        (message,) = consumer.receive(16, 5)
        assert message.delivery_attempt == attempt
        rig.clock.advance(6)
    assert rig.dead_letters() == [b"poison"]  # moved by the clock's timer at the last deadline
    assert consumer.receive(16, 5) == []
    dlq = rig.broker.topic_queues("%DLQ%g")[0]
    (dead,) = rig.broker.pull(dlq, 0).messages
    assert dead.reconsume_times == 2 and dead.properties[Prop.RETRY_TOPIC] == TOPIC


def test_nack_waits_for_the_policys_back_off_and_then_dead_letters(rig: Rig) -> None:
    """A consumer giving up never gets the message back sooner than the policy's back-off."""
    rig.send("flaky")
    consumer = rig.consumer()
    (message,) = consumer.receive(16, 30)
    consumer.nack(message)  # attempt 1 failed: back after backoff_s[0] = 10 s
    rig.clock.advance(9.9)
    assert consumer.receive(16, 30) == []
    rig.clock.advance(0.1)
    (message,) = consumer.receive(16, 30)
    assert message.delivery_attempt == 2
    # The core path the gRPC server takes for a push consumer's nack: the asked 0 s is raised to 30 s.
    rig.broker.pop.change_invisible_duration("g", TOPIC, message.receipt_handle, 0, gave_up=True)
    rig.clock.advance(29.9)
    assert consumer.receive(16, 30) == []
    rig.clock.advance(0.1)
    (message,) = consumer.receive(16, 30)
    assert message.delivery_attempt == 3
    consumer.nack(message)  # the last attempt: to the DLQ, but only after its back-off (30 s, the last entry)
    rig.clock.advance(29.9)
    assert rig.dead_letters() == []
    rig.clock.advance(0.1)
    assert rig.dead_letters() == [b"flaky"]


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes, int]] = []

    @hookimpl
    def plugmq_declare(self) -> plugmq.core.PluginDeclaration:
        return plugmq.core.PluginDeclaration(name="events", families={plugmq.core.Family.EVENTS})

    @hookimpl
    def plugmq_message_stored(self, broker_name: str, message: Any) -> None:
        pass  # the broker's observer check looks for this hook (until every hook is checked on its own)

    @hookimpl
    def plugmq_message_delivered(self, broker_name: str, consumer_group: str, message: Any) -> None:
        self.seen.append(("delivered", consumer_group, message.body, 0))

    @hookimpl
    def plugmq_message_retried(self, broker_name: str, consumer_group: str, message: Any, reconsume_times: int) -> None:
        self.seen.append(("retried", consumer_group, message.body, reconsume_times))

    @hookimpl
    def plugmq_message_dead_lettered(self, broker_name: str, consumer_group: str, message: Any) -> None:
        self.seen.append(("dead-lettered", consumer_group, message.body, message.reconsume_times))


def test_pop_consumption_emits_the_event_hooks(tmp_path: Path) -> None:
    events = _Events()
    r = Rig(tmp_path / "data", objects={"events": events})
    try:
        r.send("m")
        consumer = r.consumer()
        (message,) = consumer.receive(16, 5)
        consumer.nack(message)
        r.clock.advance(10)
        (message,) = consumer.receive(16, 5)
        r.clock.advance(5)
        (message,) = consumer.receive(16, 5)
        r.clock.advance(5)
        assert events.seen == [("delivered", "g", b"m", 0), ("retried", "g", b"m", 1), ("delivered", "g", b"m", 0),
                               ("delivered", "g", b"m", 0), ("dead-lettered", "g", b"m", 2)]
    finally:
        r.broker.close()


def test_restart_keeps_acks_in_flight_messages_and_attempts(rig: Rig) -> None:
    rig.send("m0", "m1", "m2", "m3")
    consumer = rig.consumer()
    got = consumer.receive(3, 5)
    consumer.ack(got[0])
    rig.restart()
    consumer = rig.consumer()
    assert bodies(consumer.receive(16, 5)) == ["m3"]
    rig.clock.advance(6)
    again = consumer.receive(16, 5)
    assert [(m.body, m.delivery_attempt) for m in again] == [(b"m1", 2), (b"m2", 2), (b"m3", 2)]


def test_delete_group_and_lanes_of_unknown_topics_are_collected(rig: Rig) -> None:
    rig.send("m")
    rig.broker.create_topic("Ghost", 1)
    rig.consumer("g").receive()
    rig.broker.simple_consumer("g", {"Ghost": "*"}).receive()
    rig.consumer("h").receive()
    assert rig.broker.pop.inflight_count("g") == 1 and len(rig.broker.pop.state.by_id) == 3
    rig.broker.delete_group("g")
    assert rig.broker.pop.inflight_count("g") == 0 and len(rig.broker.pop.state.by_id) == 1
    assert bodies(rig.consumer("g").receive()) == ["m"]  # a new group: from the first message again
    rig.broker.simple_consumer("g", {"Ghost": "*"}).receive()
    rig.broker.close()
    topics = rig.directory / "broker" / "topics.json"
    table = json.loads(topics.read_text())
    del table["Ghost"]  # a topic the broker no longer knows (it holds no message)
    topics.write_text(json.dumps(table))
    rig.broker = rig.open()
    assert {lane.topic for lane in rig.broker.pop.state.by_id.values()} == {TOPIC}
    rig.restart()  # the drop is durable
    assert {lane.topic for lane in rig.broker.pop.state.by_id.values()} == {TOPIC}


def test_delete_group_is_refused_while_push_consumers_run(make_broker: BrokerFactory) -> None:
    broker = make_broker([*PLUGINS, "alloc"])
    broker.create_topic(TOPIC, 1)
    broker.put(Message(TOPIC, b"m"), 0)
    consumer = broker.push_consumer("g", lambda _m: plugmq.ConsumeStatus.CONSUME_SUCCESS, background=False,
                                    max_reconsume_times=0, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe(TOPIC).start()
    consumer.consume_available()
    with pytest.raises(ClientError, match="still has running consumers"):
        broker.delete_group("g")
    consumer.shutdown()
    assert broker.consumer_offsets.group_names() == ["g"]
    broker.delete_group("g")
    assert broker.consumer_offsets.group_names() == []


# ------------------------------------------------------------------------------ state of older data dirs
def _legacy_rig_state(rig: Rig, directory: Path) -> list[Path]:
    """Pop state as an older plugmq left it: "acked" acked, "unacked" in flight (attempt 1, due
    5 s after the clock's start), "new" not handed out; the broker's journal holds no pop state."""
    rig.send("acked", "unacked", "new")
    now = rig.clock.now_ms()
    files = write_legacy_pop(directory, rig.broker.store, group="g", topic=TOPIC, next_offset=2,
                             inflight={0: (1, now + 5000, 1), 1: (1, now + 5000, 2)}, log_ops=[["A", 1, [0]]])
    rig.broker.close()
    return files


def test_pop_state_of_older_versions_is_imported_into_the_journal(rig: Rig) -> None:
    pop_dir = rig.directory / "broker" / "pop"
    _legacy_rig_state(rig, pop_dir)
    rig.broker = rig.open()
    assert not pop_dir.exists() and (pop_dir.with_name("pop.imported") / "pop-1.log").exists()
    rig.restart()  # imported once: the journal holds it now
    consumer = rig.consumer()
    rig.clock.advance(6)
    assert [(m.body, m.delivery_attempt) for m in consumer.receive(16, 5)] == [(b"unacked", 2), (b"new", 1)]


def test_pop_state_written_under_server_by_older_versions_is_adopted(rig: Rig) -> None:
    legacy = rig.directory / "server"
    _legacy_rig_state(rig, legacy)  # where plugmq serve kept it before pop moved into the core
    rig.broker = rig.open()
    assert not list(legacy.iterdir())
    consumer = rig.consumer()
    rig.clock.advance(6)
    assert [(m.body, m.delivery_attempt) for m in consumer.receive(16, 5)] == [(b"unacked", 2), (b"new", 1)]


def test_adoption_interrupted_by_a_crash_finishes_on_the_next_open(rig: Rig) -> None:
    pop_dir = rig.directory / "broker" / "pop"
    legacy = rig.directory / "server"
    legacy.mkdir(parents=True)
    staging = pop_dir.with_name("pop.adopting")
    files = _legacy_rig_state(rig, staging)
    assert len(files) == 2
    os.replace(files[1], legacy / files[1].name)  # the crash came after the first rename
    rig.broker = rig.open()
    assert not staging.exists() and len(list(pop_dir.with_name("pop.imported").iterdir())) == 2
    rig.clock.advance(60)
    assert [(m.body, m.delivery_attempt) for m in rig.consumer().receive(16, 5)] == [(b"unacked", 2), (b"new", 1)]


# ------------------------------------------------------------------------------ kill -9 of a real process
_CHILD = """
import json, sys, time
from plugmq import Broker, ManualClock, Message
clock = ManualClock(start=float(sys.argv[2]))
broker = Broker.open(sys.argv[1], plugins=["store_mmap", "filter_tag"], clock=clock)
broker.create_topic("Durable", 2)
for i in range(6):
    broker.put(Message("Durable", f"m{i}".encode()), i % 2)
consumer = broker.simple_consumer("crash-g", {"Durable": "*"})
got = consumer.receive(4, 30)
for message in got[:2]:
    consumer.ack(message)
print("REPORT", json.dumps({"acked": [m.body.decode() for m in got[:2]], "unacked": [m.body.decode() for m in got[2:]]}),
      flush=True)
time.sleep(3600)  # killed with SIGKILL before it gets further
"""


def test_kill_9_of_a_consumer_process_keeps_acks_and_unacked_messages(make_broker: BrokerFactory,
                                                                     tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    start = 1_700_000_000.0
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(data_dir), str(start)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert child.stdout is not None
        for line in child.stdout:  # the library may log to stdout before the report
            if line.startswith(b"REPORT "):
                break
        else:
            raise AssertionError(f"the child exited early with {child.wait()}")
        report = json.loads(line.removeprefix(b"REPORT "))
    finally:
        child.kill()  # SIGKILL: no close(), no flush, no snapshot
        child.wait()
    assert child.returncode == -signal.SIGKILL
    clock = ManualClock(start=start)
    broker = make_broker(["store_mmap", "filter_tag"], data_dir=data_dir, clock=clock)
    consumer = broker.simple_consumer("crash-g", {"Durable": "*"})
    never = consumer.receive(16, 30)
    assert len(never) == 2 and all(m.delivery_attempt == 1 for m in never)
    assert not {m.body.decode() for m in never} & set(report["acked"] + report["unacked"])
    assert consumer.receive(16, 30) == []  # the unacked ones are still invisible: their 30 s hold
    for message in never:
        consumer.ack(message)
    clock.advance(31)
    again = consumer.receive(16, 30)
    assert sorted(bodies(again)) == sorted(report["unacked"]) and {m.delivery_attempt for m in again} == {2}
    for message in again:
        consumer.ack(message)
    clock.advance(600)
    assert consumer.receive(16, 30) == []  # the acked ones never come back
