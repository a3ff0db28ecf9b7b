"""Dedup windows: a send whose key is on its topic within the window is answered, not stored again.

Through restarts, a ``kill -9`` of a child that was sending, and a failover (the window is rebuilt
from the log a promoted slave holds).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from plugmq.broker.broker import Broker
from plugmq.core import ManualClock, Message, MessageQueue, Prop, SendStatus
from plugmq.testing import WAIT_S, wait_for
from tests.helpers.children import ROOT, child_command
from tests.helpers.replication import end_of, following_pair

TOPIC = "Payments"
START = 1_700_000_000
TOPICS: dict[str, Any] = {"dedup_window_s": 60, TOPIC: {"dedup": True}, "ByKeys": {"dedup": True, "dedup_by": "keys"}}


def _open(path: Path, clock: ManualClock, **settings: Any) -> Broker:
    return Broker.open(path, plugins=["store_mmap", "delay_wheel"], clock=clock, topics=TOPICS, **settings)


def _stored(broker: Broker, topic: str = TOPIC) -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for queue in broker.topic_queues(topic):
        # A topic created again starts at its deletion's floors: a pull from 0 is moved there.
        offset = broker.pull(queue, 0, 1).min_offset
        for message in broker.pull(queue, offset, 10_000).messages:
            found[message.unique_id or "?"] += 1
    return found


def _send(broker: Broker, message_id: str, body: bytes = b"x", topic: str = TOPIC, queue: int = 0) -> Any:
    """A send as plugmq serve makes it for an official client: the client's message id is the unique id."""
    return broker.put(Message(topic, body), queue, extra_properties={Prop.UNIQ_KEY: message_id})


def test_a_resent_id_is_answered_with_the_first_copy_and_stored_once(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with _open(tmp_path / "data", clock) as broker:
        broker.create_topic(TOPIC, 2)
        first = _send(broker, "id-1", queue=0)
        again = _send(broker, "id-1", b"other body", queue=1)
        assert (again.msg_id, again.unique_id, again.queue, again.queue_offset) == (
            first.msg_id, first.unique_id, first.queue, first.queue_offset)
        assert again.status is SendStatus.SEND_OK
        _send(broker, "id-2")
        assert _stored(broker) == {"id-1": 1, "id-2": 1}
        snapshot = broker.traffic.snapshot()
        assert snapshot.messages_in[(TOPIC, "duplicate")] == 1
        clock.advance(61)  # past the window: the same id is a new message
        _send(broker, "id-1")
        assert _stored(broker) == {"id-1": 2, "id-2": 1}
        broker.put(Message("Elsewhere", b"x"), 0, extra_properties={Prop.UNIQ_KEY: "id-2"})
        assert _stored(broker, "Elsewhere") == {"id-2": 1}, "a topic without dedup stores what it is sent"


def test_dedup_by_keys_and_within_a_batch(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with _open(tmp_path / "data", clock) as broker:
        producer = broker.producer("p")
        first = producer.send(Message("ByKeys", b"order 7", keys="order-7"))
        assert producer.send(Message("ByKeys", b"order 7 again", keys="order-7")).msg_id == first.msg_id
        results = producer.send_batch([Message("ByKeys", b"a", keys="order-8"), Message("ByKeys", b"b", keys="order-8"),
                                       Message("ByKeys", b"c", keys="order-9"), Message("ByKeys", b"d")])
        assert results[0].msg_id == results[1].msg_id and results[2].msg_id != results[0].msg_id
        bodies = sorted(m.body for q in broker.topic_queues("ByKeys") for m in broker.pull(q, 0, 100).messages)
        assert bodies == [b"a", b"c", b"d", b"order 7"], "a message without keys is not deduplicated"


def test_concurrent_sends_of_one_id_store_it_once(tmp_path: Path) -> None:
    with _open(tmp_path / "data", ManualClock(START)) as broker:
        broker.create_topic(TOPIC, 4)
        results: list[Any] = []
        barrier = threading.Barrier(8)

        def send(queue: int) -> None:
            barrier.wait()
            for i in range(50):
                results.append(_send(broker, f"id-{i}", queue=queue % 4))

        threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _stored(broker) == {f"id-{i}": 1 for i in range(50)}
        by_id: dict[str, set[str]] = collections.defaultdict(set)
        for result in results:
            by_id[result.unique_id].add(result.msg_id)
        assert all(len(ids) == 1 for ids in by_id.values()), "two answers for one id named different copies"


def test_the_window_survives_a_restart_also_for_delayed_sends(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with _open(tmp_path / "data", clock) as broker:
        first = _send(broker, "now-1")
        delayed = broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                             extra_properties={Prop.UNIQ_KEY: "later-1"})
    clock.advance(10)
    with _open(tmp_path / "data", clock) as broker:
        assert len(broker.dedup) == 2
        assert _send(broker, "now-1").msg_id == first.msg_id
        again = broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                           extra_properties={Prop.UNIQ_KEY: "later-1"})
        assert again.msg_id == delayed.msg_id, "a resent delayed message was scheduled twice"
        clock.advance(25)
        wait_for(lambda: _stored(broker) == {"now-1": 1, "later-1": 1}, WAIT_S, "the delayed message, once")
        clock.advance(60)
        assert _stored(broker) == {"now-1": 1, "later-1": 1}


def test_a_deleted_topic_forgets_its_window_also_after_a_restart(tmp_path: Path) -> None:
    """A topic created again under the name of a deleted one stores what it is sent: answering a
    send with a copy the deletion put below the queue floors would ack a message nobody can read."""
    clock = ManualClock(START)
    with _open(tmp_path / "data", clock) as broker:
        broker.create_topic(TOPIC, 1)
        first = _send(broker, "id-1")
        _send(broker, "id-2")
        delayed = broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                             extra_properties={Prop.UNIQ_KEY: "later-1"})
        broker.delete_topic(TOPIC)
        again = _send(broker, "id-1")
        assert again.queue_offset != first.queue_offset or again.msg_id != first.msg_id
        assert _stored(broker) == {"id-1": 1}, "the send after the deletion was answered with a deleted copy"
        resent = broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                            extra_properties={Prop.UNIQ_KEY: "later-1"})
        assert resent.msg_id == delayed.msg_id, "a pending delayed message is still delivered: its key stays"
    clock.advance(5)
    with _open(tmp_path / "data", clock) as broker:
        assert _send(broker, "id-1").msg_id == again.msg_id, "the new copy is in the rebuilt window"
        _send(broker, "id-2")
        assert _stored(broker) == {"id-1": 1, "id-2": 1}, "the rebuilt window read records below the floors"
        clock.advance(30)
        wait_for(lambda: _stored(broker) == {"id-1": 1, "id-2": 1, "later-1": 1}, WAIT_S, "the delayed message, once")


# ------------------------------------------------------------------------------------------ kill -9
def _child(data_dir: str, count: str) -> None:
    """Send ids 0..count-1 (each once), printing each acknowledged id; the parent kills it."""
    with Broker.open(data_dir, plugins=["store_mmap"], topics=TOPICS) as broker:
        broker.create_topic(TOPIC, 4)
        for i in range(int(count)):
            result = broker.put(Message(TOPIC, b"x" * 64), i % 4, extra_properties={Prop.UNIQ_KEY: f"id-{i}"})
            os.write(1, (json.dumps([i, result.msg_id]) + "\n").encode())


def test_resends_after_a_kill_9_of_the_broker_store_nothing_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen(child_command(__file__, str(data), "100000"), cwd=ROOT, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    acked: dict[int, str] = {}
    try:
        while len(acked) < 3000:
            line = proc.stdout.readline()
            assert line, f"the child ended early (code {proc.wait()})"
            index, msg_id = json.loads(line)
            acked[index] = msg_id
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with Broker.open(data, plugins=["store_mmap"], topics=TOPICS) as broker:
        stored_before = _stored(broker)
        assert all(stored_before[f"id-{i}"] == 1 for i in acked), "an acknowledged message was lost"
        # The client did not hear about the sends in flight when the broker died: it sends them all again.
        # The child may have stored well past the last ack read here (its acks wait in the pipe), so the
        # resend covers every id it got to, and some it never sent.
        sent = max(int(unique_id.removeprefix("id-")) for unique_id in stored_before)
        resent = max(max(acked), sent) + 50
        for i in range(resent):
            result = broker.put(Message(TOPIC, b"x" * 64), i % 4, extra_properties={Prop.UNIQ_KEY: f"id-{i}"})
            if i in acked:
                assert result.msg_id == acked[i], f"id-{i} was answered with another copy"
        stored = _stored(broker)
        assert stored == {f"id-{i}": 1 for i in range(resent)}, "a resent message was stored twice"


# ------------------------------------------------------------------------------------------ failover
def test_a_resend_to_the_promoted_slave_is_a_duplicate(tmp_path: Path) -> None:
    clock = ManualClock(START)
    # min_in_sync_replicas = 1: the promoted slave, alone, takes the resends (2 would refuse them).
    with following_pair(tmp_path, clock, ha={"min_in_sync_replicas": 1}, topics=TOPICS) as (a, b):
        a.create_topic(TOPIC, 1)
        sent = {f"id-{i}": _send(a, f"id-{i}") for i in range(20)}
        later = a.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                      extra_properties={Prop.UNIQ_KEY: "later-1"})
        wait_for(lambda: end_of(b), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(a))
        a.demote(None)
        b.promote(2)
        for message_id, first in sent.items():
            assert _send(b, message_id).queue_offset == first.queue_offset
        assert b.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0,
                     extra_properties={Prop.UNIQ_KEY: "later-1"}).msg_id == later.msg_id
        clock.advance(31)
        wait_for(lambda: _stored(b)["later-1"] == 1, WAIT_S, "the delayed message from the new master")
        assert _stored(b) == {**dict.fromkeys(sent, 1), "later-1": 1}
        assert b.pull(MessageQueue(TOPIC, b.name, 0), 0, 100).next_begin_offset == 21


@pytest.mark.parametrize("table", [{"Bad": {"dedup_by": "body"}}, {"dedup_window_s": 0}, {"Bad": {"dedupe": True}}])
def test_bad_topic_settings_are_config_errors(tmp_path: Path, table: dict[str, Any]) -> None:
    from plugmq.core import ConfigError

    with pytest.raises(ConfigError, match="topics"):
        Broker.open(tmp_path / "data", plugins=["store_mmap"], topics=table)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
