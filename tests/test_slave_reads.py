"""Consumers keep reading from a slave while no master of its broker name is up (failover off).

A real ZooKeeper, a master and its slave as ``plugmq serve`` children (ha + cluster_zk), the
official Python client. The master is killed with SIGKILL: its queues come back in the route
read-only at the slave (broker id 0, permission READ), a SimpleConsumer receives (changes an
invisible duration) and acks every message there, a producer finds no queue to send to. The master
restarts: the route is its again, sends succeed, the slave refuses receives (its consumers read
from the master), and the master, told what the slave's readers acked, delivers none of it again.
"""

from __future__ import annotations

import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from plugmq.server.protocol import Code, Permission, service_pb2, service_pb2_grpc
from plugmq.testing import ServeProcess, ZooKeeperServer, seconds_until, wait_for
from plugmq.testing.cluster import broker_status

pytestmark = pytest.mark.slow  # ZooKeeper, two serve children, a kill and a restart: about 30 s

BROKER = "broker-s"
TOPIC = "SlaveReads"
GROUP = "slave-readers"
N = 40
WAIT_S = 30.0
PLUGINS = ["store_mmap", "filter_tag", "alloc", "cluster_zk", "ha"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(directory: Path, name: str, *, role: str, broker_id: int, ha: str, hosts: str,
                 cluster: str) -> Path:
    config = directory / f"{name}.toml"
    config.write_text(
        f'[broker]\nname = "{BROKER}"\ndata_dir = "{name}"\nrole = "{role}"\nbroker_id = {broker_id}\n'
        f"plugins = {PLUGINS!r}\n"
        f'[cluster]\nname = "{cluster}"\n'
        f'[plugins.cluster_zk]\nhosts = "{hosts}"\nsession_timeout_s = 2.0\n'
        f"[plugins.ha]\nheartbeat_ms = 100\npeer_timeout_ms = 2000\nreconnect_ms = 50\nreconnect_max_ms = 300\n{ha}"
        "[server]\nlong_polling_s = 1\n", encoding="utf-8")
    return config


def route(address: str) -> list[tuple[int, int, str]]:
    """``(broker id, permission, endpoint)`` of each queue of TOPIC's route as ``address`` answers."""
    with grpc.insecure_channel(address) as channel:
        request = service_pb2.QueryRouteRequest()
        request.topic.name = TOPIC
        response = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(request, timeout=3)
    assert response.status.code == Code.OK, response.status.message
    return [(q.broker.id, q.permission, f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}")
            for q in response.message_queues if q.broker.name == BROKER]


def routed_to(address: str, endpoint: str, permission: int) -> bool:
    """Whether ``address`` routes the clients' broker id 0 of TOPIC to ``endpoint`` alone, with ``permission``."""
    try:
        mine = [(p, e) for broker_id, p, e in route(address) if broker_id == 0]
    except grpc.RpcError:
        return False
    return bool(mine) and all(e == endpoint and p == permission for p, e in mine)


def assignment(address: str) -> list[tuple[int, int, str]]:
    """``(broker id, permission, endpoint)`` of each QueryAssignment entry (what push consumers read)."""
    request = service_pb2.QueryAssignmentRequest()
    request.topic.name = TOPIC
    request.group.name = GROUP
    with grpc.insecure_channel(address) as channel:
        response = service_pb2_grpc.MessagingServiceStub(channel).QueryAssignment(request, timeout=3)
    assert response.status.code == Code.OK, response.status.message
    return [(a.message_queue.broker.id, a.message_queue.permission,
             f"{a.message_queue.broker.endpoints.addresses[0].host}:{a.message_queue.broker.endpoints.addresses[0].port}")
            for a in response.assignments]


def receive_raw(address: str) -> Any:
    """One ReceiveMessage straight to ``address``: its final status."""
    request = service_pb2.ReceiveMessageRequest(batch_size=1, auto_renew=False)
    request.group.name = GROUP
    request.message_queue.topic.name = TOPIC
    request.message_queue.id = -1
    request.invisible_duration.FromSeconds(30)
    request.long_polling_timeout.FromSeconds(1)
    with grpc.insecure_channel(address) as channel:
        responses = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(request, timeout=5))
    return responses[-1].status


def message(body: bytes) -> Message:
    m = Message()
    m.topic = TOPIC
    m.body = body
    return m


def client(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=3)


@pytest.fixture
def brokers(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    cluster = f"s{uuid.uuid4().hex[:8]}"
    replication = f"127.0.0.1:{free_port()}"  # fixed: the restarted master listens where the slave reconnects
    made: dict[str, Any] = {
        "master_config": write_config(tmp_path, "master", role="async_master", broker_id=0, hosts=zookeeper.hosts,
                                      cluster=cluster, ha=f'listen = "{replication}"\n'),
        "slave_config": write_config(tmp_path, "slave", role="slave", broker_id=1, hosts=zookeeper.hosts,
                                     cluster=cluster, ha=f'master = "{replication}"\n'),
        "processes": [],
    }
    try:
        yield made
    finally:
        for process in made["processes"]:
            process.stop(signal.SIGKILL)


def start(brokers: dict[str, Any], which: str) -> str:
    process = ServeProcess(brokers[f"{which}_config"])
    brokers["processes"].append(process)
    brokers[which] = process
    return process.await_address()


def test_consumers_read_from_the_slave_while_the_master_is_down_and_from_the_master_once_it_is_back(
        brokers: dict[str, Any]) -> None:
    master, slave = start(brokers, "master"), start(brokers, "slave")
    producer = Producer(client(master), (TOPIC,))  # the master creates the topic (auto-create)
    producer.startup()
    try:
        sent = {producer.send(message(f"m{i}".encode())).message_id for i in range(N)}
    finally:
        producer.shutdown()
    wait_for(lambda: routed_to(slave, master, Permission.READ_WRITE), WAIT_S,
             "the slave to route the topic to its master")
    end = broker_status(master)["replication"]["end_offset"]
    wait_for(lambda: broker_status(slave)["replication"]["end_offset"], WAIT_S, "the slave to hold every message",
             until=lambda held: held >= end)

    brokers["master"].stop(signal.SIGKILL)
    killed = time.monotonic()
    rerouted_s = seconds_until(lambda: routed_to(slave, slave, Permission.READ), WAIT_S,
                               "the master's queues to come back read-only at the slave")
    assert assignment(slave) == [(0, Permission.READ, slave)], "push consumers are assigned the slave's queues"
    deliveries: Counter[str] = Counter()
    first_s = None
    consumer = SimpleConsumer(client(slave), GROUP, {TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        deadline = time.monotonic() + WAIT_S
        while not sent <= set(deliveries) and time.monotonic() < deadline:
            for received in consumer.receive(16, 30):
                if first_s is None:
                    first_s = time.monotonic() - killed
                    consumer.change_invisible_duration(received, 20)  # the new receipt handle is the slave's too
                deliveries[received.message_id] += 1
                consumer.ack(received)
        assert sent <= set(deliveries), f"{len(sent - set(deliveries))} of {N} messages never came from the slave"
        assert max(deliveries.values()) == 1, "the slave delivered an acked message again"
        assert consumer.receive(16, 30) == [], "acked on the slave, nothing comes back there"
    finally:
        consumer.shutdown()

    refused = Producer(client(slave), (TOPIC,))  # no queue is writable: nothing may reach the slave
    refused.startup()
    try:
        with pytest.raises(Exception, match="no available message queues"):
            refused.send(message(b"to-the-slave"))
    finally:
        refused.shutdown()

    restarted = start(brokers, "master")
    back_s = seconds_until(lambda: routed_to(slave, restarted, Permission.READ_WRITE), WAIT_S,
                           "the route to go back to the master")
    # The slave hands its readers' acks over as it reconnects: the master does not deliver them again.
    wait_for(lambda: broker_status(slave)["replication"]["connected"], WAIT_S, "the slave to follow the master again")
    producer = Producer(client(slave), (TOPIC,))  # routed by the slave, sent to the master
    producer.startup()
    try:
        receipt = producer.send(message(b"after"))
    finally:
        producer.shutdown()
    assert assignment(slave) == [(0, Permission.READ_WRITE, restarted)]
    status = receive_raw(slave)
    assert status.code == Code.FORBIDDEN and "master is up" in status.message, status
    again: Counter[str] = Counter()
    consumer = SimpleConsumer(client(restarted), GROUP, {TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            batch = consumer.receive(16, 30)
            for received in batch:
                again[received.message_id] += 1
                consumer.ack(received)
            if not batch and receipt.message_id in again:
                break
    finally:
        consumer.shutdown()
    assert receipt.message_id in again, "the message sent after the master came back never arrived"
    assert not set(again) & sent, f"{len(set(again) & sent)} messages acked on the slave came again from the master"
    print(f"slave reads: rerouted {rerouted_s:.2f} s after the kill, first receive {first_s:.2f} s, {N} received "
          f"once each; route back to the master {back_s:.2f} s after its restart; "
          f"{len(set(again) & sent)} of {N} delivered again by the master")
