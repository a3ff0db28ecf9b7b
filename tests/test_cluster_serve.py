"""Three ``plugmq serve`` children in one cluster on a real ZooKeeper, driven by the official client.

Brokers a and b are in machine room r1, c in r2; sessions time out after 2 s. The tests run in
file order and share the cluster; the last one kills and restarts broker c.
"""

from __future__ import annotations

import collections
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

import functools

import grpc
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
)
from rocketmq.grpc_protocol import ClientType, Code, definition_pb2, service_pb2, service_pb2_grpc

from plugmq.admin.cluster_session import open_cluster_service
from plugmq.broker.allocation_api import allocate_with
from plugmq.core import MessageQueue
from plugmq.core.contracts.cluster import ClusterTopic
from plugmq.core.rebalance_order import rocketmq_sorted
from plugmq.plugins.alloc.registry import STRATEGIES
from plugmq.testing import ServeProcess, ZooKeeperServer, query_route, wait_for, write_broker_config

pytestmark = pytest.mark.slow  # three serve children and a ZooKeeper: about a minute

SESSION_TIMEOUT_S = 2.0
WAIT_S = 30.0
ROOMS = {"broker-a": "r1", "broker-b": "r1", "broker-c": "r2"}
GROUPS = """
[groups.room-raw]
allocation = "MACHINE_ROOM"
allocation_params = { rooms = ["r1"] }
[groups.room-live]
allocation = "MACHINE_ROOM"
allocation_params = { rooms = ["r1"] }
[groups.near-raw]
allocation = "MACHINE_ROOM_NEARBY"
allocation_params = { inner = "AVG", consumer_rooms = { r1 = ["10.1.0.0/16"], r2 = ["10.2.0.0/16"] } }
"""


@attrs.define
class Cluster:
    directory: Path
    zookeeper: ZooKeeperServer
    name: str
    brokers: dict[str, ServeProcess]

    def address(self, broker: str) -> str:
        address = self.brokers[broker].address
        assert address is not None
        return address

    def config(self, broker: str = "broker-a") -> ClientConfiguration:
        return ClientConfiguration(self.address(broker), Credentials(), request_timeout=3)

    def start(self, broker: str) -> ServeProcess:
        config = write_broker_config(self.directory, broker, zookeeper=self.zookeeper.hosts, cluster=self.name,
                                     room=ROOMS[broker], session_timeout_s=SESSION_TIMEOUT_S, extra=GROUPS)
        self.brokers[broker] = ServeProcess(config)
        return self.brokers[broker]


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), zookeeper, f"c{uuid.uuid4().hex[:8]}", {})
    try:
        for broker in ROOMS:
            cluster.start(broker)  # all three start at once
        for process in cluster.brokers.values():
            process.await_address()
        for broker in ROOMS:  # every broker sees the others before any client asks for a route
            wait_for(functools.partial(route_brokers, cluster, broker, "Warmup"), WAIT_S, f"{broker} to see every broker",
                     until=lambda routed: routed == set(ROOMS))
        yield cluster
    finally:
        for process in cluster.brokers.values():
            process.stop(signal.SIGTERM)


@pytest.fixture
def topic(cluster: Cluster) -> str:
    """A new topic, routed over all three brokers (asked of broker a, which creates it)."""
    name = f"T{uuid.uuid4().hex[:10]}"
    wait_for(lambda: route_brokers(cluster, "broker-a", name), WAIT_S, f"{name} routed over every broker",
             until=lambda routed: routed == set(ROOMS))
    return name


def route_brokers(cluster: Cluster, asked: str, topic: str) -> set[str]:
    return {broker for broker, _queue, _endpoint in query_route(cluster.address(asked), topic)}


def started(client: Any) -> Any:
    client.startup()
    return client


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def broker_of(receipt: Any) -> str:
    return receipt.message_queue.message_queue0().broker.name


# --------------------------------------------------------------------------------------- messaging
def test_a_producer_spreads_over_every_broker_and_a_simple_consumer_group_gets_each_message_once(
        cluster: Cluster, topic: str) -> None:
    routed = query_route(cluster.address("broker-b"), topic)
    assert collections.Counter(broker for broker, _, _ in routed) == {"broker-a": 4, "broker-b": 4, "broker-c": 4}
    assert {endpoint for _, _, endpoint in routed} == {cluster.address(b) for b in ROOMS}
    # Queue ids first, then brokers: a failed send's retry (the next queue) lands on another broker.
    assert [broker for broker, _, _ in routed[:3]] == ["broker-a", "broker-b", "broker-c"]

    producer = started(Producer(cluster.config("broker-a"), (topic,)))
    try:
        receipts = [producer.send(message(topic, f"m{i}".encode())) for i in range(300)]
    finally:
        producer.shutdown()
    per_broker = collections.Counter(broker_of(r) for r in receipts)
    assert set(per_broker) == set(ROOMS) and min(per_broker.values()) >= 50, per_broker
    sent = {r.message_id for r in receipts}

    consumer = started(SimpleConsumer(cluster.config("broker-c"), "spread-g", {topic: FilterExpression()},
                                      await_duration=1))
    try:
        deliveries: collections.Counter[str] = collections.Counter()
        from_brokers: set[str] = set()
        deadline = time.monotonic() + 3 * WAIT_S  # a loaded machine: every empty receive waits 1 s
        while len(deliveries) < len(sent) and time.monotonic() < deadline:
            for received in consumer.receive(32, 60):
                deliveries[received.message_id] += 1
                from_brokers.add(str(received.endpoints))
                consumer.ack(received)
        assert set(deliveries) == sent, f"{len(set(deliveries) & sent)} of {len(sent)} received, from {from_brokers}"
        assert max(deliveries.values()) == 1, [m for m, n in deliveries.items() if n > 1]
        assert from_brokers == {cluster.address(b) for b in ROOMS}
        assert consumer.receive(32, 30) == []  # all acked: nothing comes back on any broker
    finally:
        consumer.shutdown()


def test_a_topic_declared_for_the_cluster_is_created_on_every_master(cluster: Cluster) -> None:
    """What ``plugmq admin update-topic --cluster`` does: one declaration, every master creates it."""
    config = {"broker": {"name": "admin", "data_dir": str(cluster.directory / "admin"),
                         "plugins": ["store_mmap", "cluster_zk"]},
              "cluster": {"name": cluster.name}, "plugins": {"cluster_zk": {"hosts": cluster.zookeeper.hosts}}}
    admin = open_cluster_service(config)
    try:
        admin.declare_topic("Declared", ClusterTopic(2))
        wait_for(lambda: all(("Declared" in b.topics and b.topics["Declared"].queue_count == 2)
                             for b in admin.view().brokers) and len(admin.view().brokers) == 3,
                 WAIT_S, "every broker registered the declared topic")
    finally:
        admin.close()
    assert collections.Counter(b for b, _, _ in query_route(cluster.address("broker-c"), "Declared")) == {
        "broker-a": 2, "broker-b": 2, "broker-c": 2}


def test_admin_cluster_list_and_update_topic_cluster(cluster: Cluster) -> None:
    """``plugmq admin cluster-list`` and ``update-topic --cluster`` by a broker's config (only the
    name service is contacted, beside the running brokers) and through a running broker."""
    import json

    from click.testing import CliRunner

    from plugmq.cli import main

    def admin(*args: str) -> Any:
        done = CliRunner().invoke(main, ["admin", *args], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return done.stdout

    config = str(cluster.brokers["broker-a"].config)
    listed = json.loads(admin("cluster-list", "--config", config, "--json"))
    assert listed["cluster"] == cluster.name and listed["connected"] is True
    assert {(b["broker_name"], b["room"], b["role"], b["endpoint"]) for b in listed["brokers"]} == {
        (name, room, "async_master", cluster.address(name)) for name, room in ROOMS.items()}
    table = admin("cluster-list", "--server", cluster.address("broker-c"))
    assert f"cluster {cluster.name}" in table and all(cluster.address(b) in table for b in ROOMS)

    update = json.loads(admin("update-topic", "AdminWide", "-q", "3", "--cluster", cluster.name,
                              "--server", cluster.address("broker-b"), "--json"))
    assert update["previous"] is None and sorted(update["applied"]) == sorted(ROOMS) and update["pending"] == []
    assert collections.Counter(b for b, _, _ in query_route(cluster.address("broker-a"), "AdminWide")) == {
        "broker-a": 3, "broker-b": 3, "broker-c": 3}
    grown = admin("update-topic", "AdminWide", "-q", "5", "--cluster", cluster.name, "--config", config)
    assert "grown from 3 to 5 queues" in grown and "created on: broker-a, broker-b, broker-c" in grown

    for args, fragment in [
        (("update-topic", "AdminWide", "-q", "2", "--cluster", cluster.name, "--config", config), "never shrinks"),
        (("update-topic", "AdminWide", "-q", "5", "--cluster", "other", "--config", config), "not 'other'"),
        (("update-topic", "bad name", "-q", "1", "--cluster", cluster.name, "--config", config), "contains ' '"),
    ]:
        done = CliRunner().invoke(main, ["admin", *args])
        assert done.exit_code != 0 and fragment in done.output, done.output


def test_a_topic_deleted_through_one_broker_is_deleted_on_every_master(cluster: Cluster) -> None:
    """``plugmq admin topic-delete`` of a topic declared for the cluster withdraws the declaration;
    every master then deletes its copy (RocketMQ's ``deleteTopic -c``)."""
    import json

    from click.testing import CliRunner

    from plugmq.cli import main

    def admin(*args: str) -> Any:
        done = CliRunner().invoke(main, ["admin", *args, "--json"], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)

    def holders() -> set[str]:
        return {b for b in ROOMS if any(t["topic"] == name for t in admin("topic-list", "--server", cluster.address(b)))}

    name = f"Gone{uuid.uuid4().hex[:8]}"
    admin("update-topic", name, "-q", "2", "--cluster", cluster.name, "--server", cluster.address("broker-b"))
    wait_for(holders, WAIT_S, "every master to create the declared topic", until=lambda held: held == set(ROOMS))
    deleted = admin("topic-delete", name, "--server", cluster.address("broker-a"))
    assert deleted["topic"] == name and deleted["queues"] == 2
    wait_for(holders, WAIT_S, "every master to delete the topic", until=lambda held: held == set())
    listed = admin("cluster-list", "--server", cluster.address("broker-c"))
    assert name not in listed["topics"], "the declaration is gone from the name service"


def test_the_readme_cluster_example_runs_against_this_cluster(cluster: Cluster,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python cluster\n(.*?)```", readme, re.DOTALL)
    ports = {"127.0.0.1:8081": "broker-a", "127.0.0.1:8082": "broker-b", "127.0.0.1:8083": "broker-c"}
    for readme_address, broker in ports.items():
        assert readme_address in code
        code = code.replace(readme_address, cluster.address(broker))
    exec(compile(code, "README.md cluster client block", "exec"), {})
    brokers, received = capsys.readouterr().out.splitlines()[-2:]
    assert all(f"'{b}'" in brokers for b in ROOMS) and received.strip() == "300"


# --------------------------------------------------------------------------------------- rooms
def _stub_call(address: str, method: str, request: Any, client_id: str) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return getattr(stub, method)(request, metadata=(("x-mq-client-id", client_id),), timeout=5)


def _join(address: str, group: str, client_id: str, access_point: str, host: str = "") -> None:
    """What a push consumer tells a broker: its settings (with its access point and the host it runs
    on), then a heartbeat."""
    command = service_pb2.TelemetryCommand()
    settings = command.settings
    settings.client_type = ClientType.PUSH_CONSUMER
    settings.user_agent.hostname = host
    settings.access_point.scheme = definition_pb2.AddressScheme.IPv4
    host, _, port = access_point.rpartition(":")
    settings.access_point.addresses.add(host=host, port=int(port))
    settings.subscription.group.name = group
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        replies = stub.Telemetry(iter([command]), metadata=(("x-mq-client-id", client_id),), timeout=5)
        assert next(replies).status.code == Code.OK
    heartbeat = service_pb2.HeartbeatRequest(client_type=ClientType.PUSH_CONSUMER)
    heartbeat.group.name = group
    assert _stub_call(address, "Heartbeat", heartbeat, client_id).status.code == Code.OK


def _assignment(address: str, topic: str, group: str, client_id: str) -> list[tuple[str, int]]:
    request = service_pb2.QueryAssignmentRequest()
    request.topic.name = topic
    request.group.name = group
    response = _stub_call(address, "QueryAssignment", request, client_id)
    assert response.status.code == Code.OK, response.status.message
    return sorted((a.message_queue.broker.name, a.message_queue.id) for a in response.assignments)


def _rocketmq(strategy: str, topic: str, consumers: dict[str, str], room_name: Callable[[str], str],
              **params: Any) -> dict[str, list[tuple[str, int]]]:
    """RocketMQ's own answer: its strategies read rooms from the names ("<room>@<broker>" for
    MACHINE_ROOM, "<room>-..." for MACHINE_ROOM_NEARBY), so the brokers and consumers are renamed
    that way (the renaming keeps the sort order) and mapped back."""
    renamed = {room_name(b): b for b in ROOMS}
    queues, ids = rocketmq_sorted([MessageQueue(topic, name, i) for name in renamed for i in range(4)],
                                  list(consumers.values()))
    back = {v: k for k, v in consumers.items()}
    return {back[cid]: sorted((renamed[q.broker_name], q.queue_id)
                              for q in allocate_with(STRATEGIES, strategy, cid, queues, ids, **params))
            for cid in ids}


def test_machine_room_groups_across_brokers_get_rocketmqs_assignment(cluster: Cluster, topic: str) -> None:
    # MACHINE_ROOM, rooms = [r1]: two consumers split the 8 queues of a and b; c's stay unassigned.
    ids = {"first": "cid-1", "second": "cid-2"}
    for broker in ROOMS:
        for cid in ids.values():
            _join(cluster.address(broker), "room-raw", cid, cluster.address("broker-a"))
    expected = _rocketmq("MACHINE_ROOM", topic, ids, lambda b: f"{ROOMS[b]}@{b}", rooms=["r1"])
    assert expected["first"] == [("broker-a", i) for i in range(4)]
    for broker in ROOMS:  # every broker gives the same answer
        assert {k: _assignment(cluster.address(broker), topic, "room-raw", cid) for k, cid in ids.items()} == expected

    # MACHINE_ROOM_NEARBY: a consumer is in the room of the host it runs on (consumer_rooms). As the
    # official clients do, each reports the broker it talks to as its access point: that is not its room.
    ids = {"east": "r1-consumer", "west": "r2-consumer"}
    for broker in ROOMS:
        _join(cluster.address(broker), "near-raw", ids["east"], cluster.address(broker), host="10.1.3.4")
        _join(cluster.address(broker), "near-raw", ids["west"], cluster.address(broker), host="10.2.5.6")
    expected = _rocketmq("MACHINE_ROOM_NEARBY", topic, ids, lambda b: f"{ROOMS[b]}-{b}")
    assert expected == {"east": [(b, i) for b in ("broker-a", "broker-b") for i in range(4)],
                        "west": [("broker-c", i) for i in range(4)]}
    for broker in ROOMS:
        assert {k: _assignment(cluster.address(broker), topic, "near-raw", cid) for k, cid in ids.items()} == expected


class _Collect(MessageListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.endpoints: collections.Counter[str] = collections.Counter()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.endpoints[str(message.endpoints)] += 1
        return ConsumeResult.SUCCESS


def test_a_live_machine_room_push_consumer_reads_only_its_rooms_brokers(cluster: Cluster, topic: str) -> None:
    producer = started(Producer(cluster.config("broker-a"), (topic,)))
    try:
        receipts = [producer.send(message(topic, f"m{i}".encode())) for i in range(60)]
    finally:
        producer.shutdown()
    in_r1 = sum(1 for r in receipts if ROOMS[broker_of(r)] == "r1")
    listener = _Collect()
    consumer = started(PushConsumer(cluster.config("broker-c"), "room-live", listener, {topic: FilterExpression()}))
    try:
        wait_for(lambda: sum(listener.endpoints.values()), WAIT_S, f"the {in_r1} messages on brokers of room r1",
                 until=lambda received: received >= in_r1)
        time.sleep(2 * 1.0)  # two long-polling rounds: nothing from room r2 may follow
        assert set(listener.endpoints) == {cluster.address("broker-a"), cluster.address("broker-b")}
        assert sum(listener.endpoints.values()) == in_r1
    finally:
        consumer.shutdown()


# --------------------------------------------------------------------------------------- failures
def test_a_killed_broker_leaves_the_routes_sends_go_on_and_it_rejoins_after_a_restart(
        cluster: Cluster, topic: str) -> None:
    producer = started(Producer(cluster.config("broker-a"), (topic,)))
    outcomes: collections.Counter[str] = collections.Counter()
    stop = threading.Event()

    def send_steadily() -> None:
        i = 0
        while not stop.is_set():
            try:
                outcomes[broker_of(producer.send(message(topic, f"k{i}".encode())))] += 1
            except Exception as exc:  # noqa: BLE001 - counted; the assertion below shows it
                outcomes[f"failed: {exc!r:.100}"] += 1
            i += 1
            time.sleep(0.01)

    sender = threading.Thread(target=send_steadily)
    sender.start()
    try:
        wait_for(lambda: outcomes["broker-c"] > 0, WAIT_S, "a send to broker-c")
        assert cluster.brokers["broker-c"].stop(signal.SIGKILL) == -signal.SIGKILL
        for asked in ("broker-a", "broker-b"):
            wait_for(functools.partial(route_brokers, cluster, asked, topic), SESSION_TIMEOUT_S * 5,
                     f"broker-c out of {asked}'s route", until=lambda routed: "broker-c" not in routed)
        sent_before = sum(outcomes.values())
        wait_for(lambda: sum(outcomes.values()) >= sent_before + 50, WAIT_S, "50 more sends")
    finally:
        stop.set()
        sender.join()
        producer.shutdown()
    assert not [o for o in outcomes if o.startswith("failed")], outcomes

    cluster.start("broker-c").await_address()
    for asked in ROOMS:
        wait_for(functools.partial(route_brokers, cluster, asked, topic), WAIT_S, f"broker-c back in {asked}'s route",
                 until=lambda routed: routed == set(ROOMS))
    producer = started(Producer(cluster.config("broker-b"), (topic,)))
    try:
        again = collections.Counter(broker_of(producer.send(message(topic, b"x"))) for _ in range(30))
    finally:
        producer.shutdown()
    assert set(again) == set(ROOMS)
