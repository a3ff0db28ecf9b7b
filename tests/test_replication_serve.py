"""Master and slave as real ``plugmq serve`` children, the official Python client sending and
receiving: every acked message is on the slave at the same offsets with the same ids (all three
stores); a sync_master answers HA_NOT_AVAILABLE without a slave and SLAVE_PERSISTENCE_TIMEOUT
while its slave is stopped (SIGSTOP); an async master keeps accepting with its slave killed
(SIGKILL), and the restarted slave catches up; consumers read from the slave, producers are
refused there."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SendReceipt, SimpleConsumer
from rocketmq.grpc_protocol import Code
from rocketmq.v5.exception import ClientException

from plugmq.broker.components import open_store
from plugmq.core import ManualClock, MessageStore, ReplicableStore
from plugmq.testing import ServeProcess, wait_for
from tests.helpers.clients import started

WAIT_S = 30.0
TOPIC = "Replicated"
MASTER_HOST = "127.0.0.1:10911"
SLAVE_HOST = "127.0.0.2:10911"
_STORE_OPTIONS = {"store_mmap": "commit_log_segment_size = 16777216\n", "store_lmdb": "", "store_rocks": ""}


class Cluster:
    def __init__(self, root: Path, store: str) -> None:
        self.root = root
        self.store = store
        self.children: list[ServeProcess] = []

    def _config(self, name: str, role: str, broker_id: int, host: str, ha: str) -> Path:
        directory = self.root / name
        directory.mkdir(exist_ok=True)
        config = directory / "broker.toml"
        config.write_text(
            f'[broker]\nname = "broker-r"\ndata_dir = "data"\nrole = "{role}"\nbroker_id = {broker_id}\n'
            f'store_host = "{host}"\nplugins = ["{self.store}", "filter_tag", "alloc", "ha"]\n'
            f"[plugins.{self.store}]\n{_STORE_OPTIONS[self.store]}"
            f"[plugins.ha]\nheartbeat_ms = 200\npeer_timeout_ms = 10000\nreconnect_ms = 50\nreconnect_max_ms = 500\n{ha}"
            "[server]\nlong_polling_s = 1\n", encoding="utf-8")
        return config

    def _start(self, config: Path) -> ServeProcess:
        child = ServeProcess(config, WAIT_S)
        self.children.append(child)
        child.await_address()
        return child

    def master(self, role: str = "sync_master") -> ServeProcess:
        # A slave that stalls stays in the in-sync set for 5 s: past the sync timeout, sends wait for it.
        return self._start(self._config("master", role, 0, MASTER_HOST, "sync_timeout_ms = 800\nin_sync_lag_ms = 5000\n"))

    def replication_address(self) -> str:
        return (self.root / "master" / "data" / "ha" / "listen.addr").read_text().strip()

    def slave(self) -> ServeProcess:
        return self._start(self._config("slave", "slave", 1, SLAVE_HOST, f'master = "{self.replication_address()}"\n'))

    def store_of(self, name: str, host: str) -> MessageStore:
        options = {"commit_log_segment_size": 16777216} if self.store == "store_mmap" else {}
        return open_store(self.store, self.root / name / "data", clock=ManualClock(), options=options, store_host=host)

    def stop_all(self) -> None:
        for child in self.children:
            child.stop()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    made = Cluster(tmp_path, getattr(request, "param", "store_mmap"))
    yield made
    made.stop_all()


def _client(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=5)


def _message(i: int) -> Message:
    message = Message()
    message.topic = TOPIC
    message.body = f"replicated-{i}".encode()
    message.keys = f"key-{i}"
    message.tag = "even" if i % 2 == 0 else "odd"
    return message


def receive_all(address: str, want: set[str]) -> dict[str, bytes]:
    """Receive (and ack) from ``address`` until every message id in ``want`` arrived."""
    got: dict[str, bytes] = {}
    with started(SimpleConsumer(_client(address), "slave-readers", {TOPIC: FilterExpression()},
                                await_duration=1)) as consumer:
        deadline = time.monotonic() + WAIT_S
        while not want <= set(got) and time.monotonic() < deadline:
            for message in consumer.receive(32, 20):
                got[message.message_id] = message.body
                consumer.ack(message)
    assert want <= set(got), f"{len(want - set(got))} messages never arrived from the slave"
    return got


def send_once_the_slave_confirms(producer: Producer, message: Message) -> SendReceipt:
    """Send ``message`` until the sync master stops answering HA_NOT_AVAILABLE (its slave connects
    by itself, moments after it started); any other refusal fails the test."""

    def attempt() -> SendReceipt | None:
        try:
            return producer.send(message)
        except ClientException as exc:
            assert exc.code == Code.HA_NOT_AVAILABLE, exc
            return None

    return wait_for(attempt, WAIT_S, "a send the slave confirms")


def assert_identical_stores(cluster: Cluster, receipts: list[Any]) -> None:
    """The stopped master's and slave's stores hold the same log, queues and index entries."""
    master, slave = cluster.store_of("master", MASTER_HOST), cluster.store_of("slave", SLAVE_HOST)
    try:
        _assert_identical(master, slave, receipts)
    finally:
        master.close()
        slave.close()


def _assert_identical(master: MessageStore, slave: MessageStore, receipts: list[Any]) -> None:
    assert isinstance(master, ReplicableStore) and isinstance(slave, ReplicableStore)
    assert slave.log_end_offset() == master.log_end_offset()
    for receipt in receipts:
        # The server picks the queue, so the receipt's offset is read against the stored queue.
        found = master.query_by_key(TOPIC, receipt.message_id)
        assert len(found) == 1, f"acked message {receipt.message_id} is stored {len(found)} times on the master"
        stored = found[0]
        assert stored.queue_offset == receipt.offset and stored.store_host == MASTER_HOST
        entries = master.read_queue(TOPIC, stored.queue_id, stored.queue_offset, 1)
        assert slave.read_queue(TOPIC, stored.queue_id, stored.queue_offset, 1) == entries
        assert slave.read(stored.commit_log_offset) == stored, "the slave's copy differs"
        assert slave.query_by_id(stored.msg_id) == stored
        assert slave.query_by_key(TOPIC, receipt.message_id) == [stored]
    for topic, count in master.queues().items():
        for queue_id in range(count):
            assert slave.read_queue(topic, queue_id, 0, 100_000) == master.read_queue(topic, queue_id, 0, 100_000)


@pytest.mark.parametrize("cluster", ["store_mmap", "store_lmdb", "store_rocks"], indirect=True)
def test_sync_master_acks_only_what_the_slave_holds(cluster: Cluster) -> None:
    master = cluster.master("sync_master")
    slave = cluster.slave()
    with started(Producer(_client(master.endpoint), (TOPIC,))) as producer:
        receipts = [send_once_the_slave_confirms(producer, _message(0))]
        receipts += [producer.send(_message(i)) for i in range(1, 40)]
    slave.process.kill()  # at once: every acked message must already be in the slave's store
    slave.process.wait()
    slave_store = cluster.store_of("slave", SLAVE_HOST)
    try:
        for receipt in receipts:
            assert [m.queue_offset for m in slave_store.query_by_key(TOPIC, receipt.message_id)] == [receipt.offset]
    finally:
        slave_store.close()
    restarted = cluster.slave()  # consumers read from a slave; producers are refused there
    got = receive_all(restarted.endpoint, {r.message_id for r in receipts})
    assert all(body.startswith(b"replicated-") for body in got.values())
    with started(Producer(_client(restarted.endpoint), (TOPIC,))) as refused:
        with pytest.raises(ClientException) as excinfo:
            refused.send(_message(99))
        assert excinfo.value.code == Code.FORBIDDEN and "slave" in str(excinfo.value)
    assert restarted.stop() == 0 and master.stop() == 0
    assert_identical_stores(cluster, receipts)


def test_sync_master_without_or_with_a_stalled_slave(cluster: Cluster) -> None:
    master = cluster.master("sync_master")
    with started(Producer(_client(master.endpoint), (TOPIC,))) as producer:
        with pytest.raises(ClientException) as excinfo:
            producer.send(_message(0))
        assert excinfo.value.code == Code.HA_NOT_AVAILABLE, excinfo.value
        slave = cluster.slave()
        send_once_the_slave_confirms(producer, _message(1))
        slave.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(ClientException) as excinfo:
                producer.send(_message(2))
            assert excinfo.value.code == Code.SLAVE_PERSISTENCE_TIMEOUT, excinfo.value
        finally:
            slave.send_signal(signal.SIGCONT)
        receipt = producer.send(_message(3))  # the slave catches up and confirms again
    got = receive_all(slave.endpoint, {receipt.message_id})
    assert got[receipt.message_id] == b"replicated-3"


@pytest.mark.slow
def test_async_master_outlives_its_slave_and_the_slave_catches_up(cluster: Cluster) -> None:
    master = cluster.master("async_master")
    slave = cluster.slave()
    with started(Producer(_client(master.endpoint), (TOPIC,))) as producer:
        receipts = [producer.send(_message(i)) for i in range(20)]
        slave.process.kill()
        slave.process.wait()
        receipts += [producer.send(_message(i)) for i in range(20, 80)]  # a dead slave blocks nothing
    restarted = cluster.slave()
    receive_all(restarted.endpoint, {r.message_id for r in receipts})
    assert restarted.stop() == 0
    assert master.stop() == 0
    assert_identical_stores(cluster, receipts)
