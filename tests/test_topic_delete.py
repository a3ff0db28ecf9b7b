"""Deleting a topic (issue 27): offsets, pop progress and in-flight messages go, the data stays
in the store but is never served again, also not by a topic created again under the name; the
deletion is journaled (restart, replication, failover)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from plugmq.admin import BrokerAdmin, execute
from plugmq.broker.broker import Broker
from plugmq.core import ManualClock, Message, MessageQueue
from plugmq.core.contracts import ClusterTopic, TopicUndeclaring
from plugmq.core.errors import ReadOnlyBrokerError, TopicError
from plugmq.core.modes import ConsumeFrom
from plugmq.server.admin import AdminClient
from plugmq.testing import WAIT_S, ZooKeeperServer, serving, wait_for
from tests.helpers.clients import started
from tests.helpers.replication import end_of, following_pair

TOPIC = "Doomed"
PLUGINS = ["store_mmap", "filter_tag"]
START = 1_700_000_000


def _open(path: Path, **settings: object) -> Broker:
    return Broker.open(path, plugins=PLUGINS, clock=ManualClock(START), **settings)  # type: ignore[arg-type]


def _send(broker: Broker, queue_id: int, *bodies: str) -> None:
    for body in bodies:
        broker.put(Message(TOPIC, body.encode()), queue_id)


def _from_start(broker: Broker, queue_id: int) -> list[bytes]:
    """What a new pull consumer reads of the queue: from where a group with no position starts."""
    queue = MessageQueue(TOPIC, broker.name, queue_id)
    return [m.body for m in broker.pull(queue, broker.start_offset(queue, ConsumeFrom.FIRST_OFFSET), 100).messages]


def _popped(broker: Broker, group: str) -> list[bytes]:
    return sorted(m.body for m in broker.simple_consumer(group, {TOPIC: "*"}).receive(32, 30))


def _offsets_on(broker: Broker, group: str) -> dict[tuple[str, int], int]:
    return {k: v for k, v in broker.offsets(group).entries(broker.name).items() if k[0] == TOPIC}


def test_delete_forgets_progress_and_a_recreated_topic_serves_no_old_message(tmp_path: Path) -> None:
    broker = _open(tmp_path / "data")
    try:
        broker.create_topic(TOPIC, 2)
        _send(broker, 0, "old-0a", "old-0b")
        _send(broker, 1, "old-1a")
        broker.offsets("pulled").update(MessageQueue(TOPIC, broker.name, 0), 1)
        popper = broker.simple_consumer("popped", {TOPIC: "*"})
        received = popper.receive(2, 30)
        popper.ack(received[0])
        assert broker.pop.inflight_count("popped") == 1

        deletion = broker.delete_topic(TOPIC)
        assert (deletion.queues, deletion.floors, deletion.groups, deletion.inflight_dropped) == (
            2, {0: 2, 1: 1}, ("popped", "pulled"), 1)
        assert broker.topics.get(TOPIC) is None and _offsets_on(broker, "pulled") == {}
        assert not [lane for lane in broker.pop.state.by_id.values() if lane.topic == TOPIC]
        with pytest.raises(TopicError, match="does not exist"):
            broker.topic_queues(TOPIC, create=False)
        assert _from_start(broker, 0) == [], "a deleted topic still serves its messages"
        with pytest.raises(TopicError, match="does not exist on this broker"):
            broker.delete_topic(TOPIC)

        broker.create_topic(TOPIC, 3)  # again, with a queue more: that one starts at 0
        _send(broker, 0, "new-0")
        _send(broker, 2, "new-2")
        assert _from_start(broker, 0) == [b"new-0"] and _from_start(broker, 2) == [b"new-2"]
        assert _popped(broker, "popped") == [b"new-0", b"new-2"]
        stale = broker.pull(MessageQueue(TOPIC, broker.name, 0), 0, 10)  # an old consumer's offset
        assert stale.messages == () and stale.next_begin_offset == 2
        broker.close()
        broker = _open(tmp_path / "data")  # the floors are journaled
        assert broker.topics.get(TOPIC) == 3 and _from_start(broker, 0) == [b"new-0"]
        assert _popped(broker, "fresh") == [b"new-0", b"new-2"]
        assert [(q.min_offset, q.max_offset) for q in BrokerAdmin(broker).topic_status(TOPIC).queues] == [
            (2, 3), (1, 1), (0, 1)]
    finally:
        broker.close()


def test_a_deleted_topic_stays_deleted_at_restart_until_it_is_created_again(tmp_path: Path) -> None:
    with _open(tmp_path / "data", auto_create_topic=True) as broker:
        broker.create_topic(TOPIC, 1)
        _send(broker, 0, "old")
        assert execute(BrokerAdmin(broker), "topic-delete", {"topic": TOPIC})["groups"] == []
    with _open(tmp_path / "data", auto_create_topic=True) as broker:
        assert broker.topics.get(TOPIC) is None, "the store's queues brought the deleted topic back"
        _send(broker, 0, "new")  # auto-created again on send
        assert broker.topics.get(TOPIC) == broker.config.default_queue_count
        assert _from_start(broker, 0) == [b"new"]
    with _open(tmp_path / "data") as broker:
        assert broker.topics.get(TOPIC) is not None and _from_start(broker, 0) == [b"new"]


def test_system_and_group_topics_are_refused_unless_asked_for(tmp_path: Path) -> None:
    with _open(tmp_path / "data") as broker:
        for topic in ("rmq_sys_state_offsets", "SCHEDULE_TOPIC_XXXX"):
            with pytest.raises(TopicError, match="system topic"):
                broker.delete_topic(topic)
        broker.create_topic("%DLQ%g", 1)
        admin = BrokerAdmin(broker)
        with pytest.raises(TopicError, match="dead-letter topic.*group_topic=True"):
            execute(admin, "topic-delete", {"topic": "%DLQ%g"})
        assert execute(admin, "topic-delete", {"topic": "%DLQ%g", "group_topic": True})["queues"] == 1
        assert broker.topics.get("%DLQ%g") is None


def test_the_slave_follows_the_deletion_and_promoted_does_not_serve_the_topic(tmp_path: Path) -> None:
    clock = ManualClock(START)
    # min_in_sync_replicas = 1: the promoted slave takes writes before its old master caught up.
    with following_pair(tmp_path, clock, ha={"min_in_sync_replicas": 1}) as (a, b):
        a.create_topic(TOPIC, 1)
        _send(a, 0, "old-a", "old-b")
        a.offsets("g").update(MessageQueue(TOPIC, a.name, 0), 1)
        wait_for(lambda: b.topics.get(TOPIC) == 1 and _offsets_on(b, "g"), WAIT_S, "the slave to learn the topic")
        with pytest.raises(ReadOnlyBrokerError):
            b.delete_topic(TOPIC)
        a.delete_topic(TOPIC)
        wait_for(lambda: end_of(b) == end_of(a), WAIT_S, "the slave to catch up")
        wait_for(lambda: b.topics.get(TOPIC) is None, WAIT_S, "the slave to drop the deleted topic")
        assert _offsets_on(b, "g") == {} and _from_start(b, 0) == []
        a.demote(None)
        b.promote(2)
        assert b.topics.get(TOPIC) is None
        with pytest.raises(TopicError, match="does not exist"):
            b.topic_queues(TOPIC, create=False)
        a.follow(b.replication.master_address)  # type: ignore[union-attr]
        wait_for(lambda: b.replication.status().slaves, WAIT_S, "the old master to follow")  # type: ignore[union-attr]
        b.create_topic(TOPIC, 1)
        _send(b, 0, "new")
        assert _from_start(b, 0) == [b"new"]
        wait_for(lambda: end_of(a) == end_of(b), WAIT_S, "the old master to catch up")
        wait_for(lambda: a.topics.get(TOPIC) == 1, WAIT_S, "the old master to learn the topic was created again")
        wait_for(lambda: _from_start(a, 0) == [b"new"], WAIT_S, "the new message, and no old one, on the old master")


def test_a_topic_declared_for_the_cluster_loses_its_declaration(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    config = {"broker": {"name": "broker-a", "data_dir": str(tmp_path / "data"), "plugins": [*PLUGINS, "cluster_zk"]},
              "cluster": {"name": f"c{uuid.uuid4().hex[:8]}"},
              "plugins": {"cluster_zk": {"hosts": zookeeper.hosts, "session_timeout_s": 2}}}
    with Broker.from_config(config) as broker:
        assert broker.cluster is not None
        broker.create_topic(TOPIC, 1)
        broker.cluster.declare_topic(TOPIC, ClusterTopic(1))
        broker.cluster.declare_topic("Elsewhere", ClusterTopic(1))  # declared, never created on this broker
        wait_for(lambda: {TOPIC, "Elsewhere"} <= set(broker.cluster.view().topics), WAIT_S,  # type: ignore[union-attr]
                 "the declarations in the view")
        assert broker.delete_topic(TOPIC).queues == 1
        assert broker.topics.get(TOPIC) is None
        assert broker.delete_topic("Elsewhere").queues == 0
        wait_for(lambda: not {TOPIC, "Elsewhere"} & set(broker.cluster.view().topics), WAIT_S,  # type: ignore[union-attr]
                 "the declarations to leave the view")
        assert isinstance(broker.cluster, TopicUndeclaring)
        assert broker.cluster.undeclare_topic(TOPIC) is False, "nothing left to withdraw"


def test_an_unreadable_declaration_is_not_taken_for_a_withdrawn_one(zookeeper: ZooKeeperServer,
                                                                     tmp_path: Path) -> None:
    """Members delete a topic whose declaration leaves the view: a damaged node must not look so."""
    config = {"broker": {"name": "broker-a", "data_dir": str(tmp_path / "data"), "plugins": [*PLUGINS, "cluster_zk"]},
              "cluster": {"name": f"c{uuid.uuid4().hex[:8]}"},
              "plugins": {"cluster_zk": {"hosts": zookeeper.hosts, "session_timeout_s": 2}}}
    with Broker.from_config(config) as broker:
        service: Any = broker.cluster
        service.declare_topic(TOPIC, ClusterTopic(2))
        wait_for(lambda: TOPIC in service.view().topics, WAIT_S, "the declaration in the view")
        service.client.set(service.paths.topic(TOPIC), b"not a declaration")
        service.declare_topic("Other", ClusterTopic(1))  # a change: the view is read again
        wait_for(lambda: "Other" in service.view().topics, WAIT_S, "the view to be read again")
        assert service.view().topics[TOPIC].queue_count == 2, "the last readable declaration stands"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``plugmq admin ARGS`` as a process."""
    return subprocess.run([sys.executable, "-c", "from plugmq.cli import main; main()", "admin", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_deletes_a_topic_of_a_running_plugmq_serve(tmp_path: Path) -> None:
    rocketmq = pytest.importorskip("rocketmq", reason="needs the serve extra (rocketmq-python-client)")
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nauto_create_topic = false\n\n[server]\nlong_polling_s = 1\n')
    with serving(config, 30.0, log_path=tmp_path / "serve.log") as child, AdminClient(child.endpoint) as client:
        server = ("--server", child.endpoint)
        client.call("update-topic", {"topic": TOPIC, "queue_count": 1})
        client.call("send-message", {"topic": TOPIC, "body": "old"})
        assert [m["body"] for m in client.call("consume-message", {"topic": TOPIC, "group": "console"})] == ["old"]
        consumer = rocketmq.SimpleConsumer(rocketmq.ClientConfiguration(child.endpoint, rocketmq.Credentials(),
                                                                        request_timeout=3),
                                           "billing", {TOPIC: rocketmq.FilterExpression()}, await_duration=1)
        with started(consumer):
            assert [m.body for m in consumer.receive(1, 30)] == [b"old"]  # in flight when the topic goes
            done = _cli("topic-delete", TOPIC, *server)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [f"topic {TOPIC} deleted on broker-a (1 queues; 1 messages in flight "
                                            "dropped)", "progress forgotten for groups: billing, console"]
        assert done.stderr.strip() == "warning: consumers of billing are still connected"
        assert TOPIC not in [t["topic"] for t in client.call("topic-list", {})]
        again = _cli("topic-delete", TOPIC, *server)
        assert again.returncode != 0 and "does not exist on this broker" in again.stderr
        refused = _cli("topic-delete", "%DLQ%billing", *server, "--json")
        assert refused.returncode != 0 and "--group-topic" in refused.stderr

        client.call("update-topic", {"topic": TOPIC, "queue_count": 1})
        client.call("send-message", {"topic": TOPIC, "body": "new"})
        assert [m["body"] for m in client.call("consume-message", {"topic": TOPIC, "group": "console"})] == ["new"]
        assert json.loads(_cli("topic-delete", TOPIC, *server, "--json").stdout)["floors"] == {"0": 2}
        assert child.stop() == 0


def test_a_delayed_message_pending_for_a_deleted_topic_comes_into_it_again(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "delay_wheel"], clock=clock) as broker:
        broker.create_topic(TOPIC, 1)
        _send(broker, 0, "old")
        broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 10_000), 0)
        broker.delete_topic(TOPIC)
        clock.advance(11)
        wait_for(lambda: broker.topics.get(TOPIC) == 1 and _from_start(broker, 0) == [b"later"], WAIT_S,
                 "the delayed message, alone, in the topic created again")
