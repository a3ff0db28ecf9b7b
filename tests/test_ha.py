"""The ha replication plugin with embedded brokers: roles, refusals, sync double-write statuses,
catching up after a restart, reading from a slave. Real stores, real TCP on loopback.

Waits here poll real state (a slave's end offset) with a deadline; nothing sleeps for a delay.
"""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from plugmq.broker.broker import Broker
from plugmq.core import BrokerRole, ConfigError, Message, MessageQueue, ReplicableStore, SendStatus
from plugmq.core.errors import NotEnoughReplicasError, PluginError, ReadOnlyBrokerError, ReplicationError
from plugmq.testing import WAIT_S, wait_for
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.replication import end_of

PLUGINS = ["filter_tag", "alloc", "ha"]


class Brokers:
    """Masters and slaves of broker name broker-a, each in its own directory under tmp_path, opened
    by ``make_broker`` (so all are closed at teardown)."""

    def __init__(self, make: BrokerFactory, root: Path) -> None:
        self.make = make
        self.root = root
        self.count = 0

    def open(self, data: str, plugins: list[str], **settings: Any) -> Broker:
        self.count += 1
        return self.make(plugins, data_dir=self.root / data, **settings)

    def master(self, store: str = "store_mmap", *, role: str = "async_master", **ha: Any) -> Broker:
        return self.open(f"master-{self.count}", [store, *PLUGINS], role=role,
                         options={"ha": {"heartbeat_ms": 100, "peer_timeout_ms": 3000, **ha}})

    def slave(self, master: Broker | str, store: str = "store_mmap", *, broker_id: int = 1, name: str = "broker-a",
              data: str | None = None, **ha: Any) -> Broker:
        address = master if isinstance(master, str) else master.replication.status().address  # type: ignore[union-attr]
        return self.open(data or f"slave-{self.count}", [store, *PLUGINS], role="slave", broker_id=broker_id,
                         name=name, store_host="127.0.0.9:10911",
                         options={"ha": {"master": address, "heartbeat_ms": 100, "peer_timeout_ms": 3000,
                                         "reconnect_ms": 20, "reconnect_max_ms": 200, **ha}})


@pytest.fixture
def brokers(make_broker: BrokerFactory, tmp_path: Path) -> Brokers:
    return Brokers(make_broker, tmp_path)


def caught_up(slave: Broker, master: Broker) -> None:
    wait_for(lambda: end_of(slave), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))


def send(broker: Broker, count: int, *, topic: str = "Orders", first: int = 0) -> list[Any]:
    return [broker.put(Message(topic, f"m{i}".encode(), keys=(f"k{i}",)), i % 4) for i in range(first, first + count)]


def same_messages(master: Broker, slave: Broker, results: list[Any], topic: str = "Orders") -> None:
    for result in results:
        want = master.query_by_id(result.msg_id)
        assert want is not None and slave.query_by_id(result.msg_id) == want
    for queue_id in range(4):
        queue = MessageQueue(topic, master.name, queue_id)
        assert slave.max_offset(queue) == master.max_offset(queue)
        # The master serves up to its commit point, which passes a message once the in-sync slave's
        # ACK for it arrived (under load, after the slave's store caught up): wait for all of it.
        whole = master.max_offset(queue)
        wanted = wait_for(functools.partial(_served, master, queue), WAIT_S, f"the master to serve queue {queue_id}",
                          until=lambda got: len(got) == whole)  # noqa: B023 - called before the loop moves on
        # A slave serves up to the commit point its master last told it, which comes with the next
        # frame (data or heartbeat) after the slave's ACK: its reads may trail its store briefly.
        wait_for(functools.partial(_served, slave, queue), WAIT_S, f"the slave to serve queue {queue_id}",
                 until=lambda got: got == wanted)  # noqa: B023 - wait_for calls it before the loop moves on


def _served(broker: Broker, queue: MessageQueue) -> Any:
    return broker.pull(queue, 0, 1000).messages


@pytest.mark.parametrize("store", ["store_mmap", "store_lmdb", "store_rocks"])
def test_async_master_ships_everything_to_a_slave(brokers: Brokers, store: str) -> None:
    master = brokers.master(store)
    slave = brokers.slave(master, store)
    results = send(master, 200)
    caught_up(slave, master)
    same_messages(master, slave, results)
    # The slave's last ACK may still be on its way when its store has caught up.
    wait_for(lambda: [s.lag_bytes for s in master.replication.status().slaves],  # type: ignore[union-attr]
             WAIT_S, "the master to hear the slave's last ACK", until=lambda lags: lags == [0])
    status = master.replication.status()  # type: ignore[union-attr]
    assert status.role is BrokerRole.ASYNC_MASTER and [s.broker_id for s in status.slaves] == [1]
    assert status.slaves[0].lag_bytes == 0 and status.slaves[0].lag_messages == 0
    mirror = slave.replication.status()  # type: ignore[union-attr]
    assert mirror.connected and mirror.role is BrokerRole.SLAVE and mirror.lag_bytes == 0
    assert mirror.as_dict()["end_offset"] == end_of(master)


def test_slave_is_read_only_and_runs_no_delay_service(brokers: Brokers) -> None:
    master = brokers.master()
    slave = brokers.open("slave-delay", ["store_mmap", "delay_level", *PLUGINS], role="slave", broker_id=1,
                         options={"ha": {"master": master.replication.status().address}})  # type: ignore[union-attr]
    for write in (lambda: slave.put(Message("Orders", b"x"), 0),
                  lambda: slave.put_batch([Message("Orders", b"x")], 0),
                  lambda: slave.producer("g").send(Message("Orders", b"x"))):
        with pytest.raises(ReadOnlyBrokerError, match="slave"):
            write()
    results = send(master, 5)
    caught_up(slave, master)
    assert slave.topics.get("Orders") == 4, "the slave learns the replicated topic"
    consumer = slave.pull_consumer("readers")
    got = [m for q in range(4) for m in consumer.pull(MessageQueue("Orders", "broker-a", q), 0, 10).messages]
    assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)


def test_sync_master_statuses(brokers: Brokers) -> None:
    # The statuses, not the time bounds (the next test checks the lag): a slave the machine's load
    # stalls for a second must neither time a send out nor leave the set between two sends.
    master = brokers.master(role="sync_master", sync_timeout_ms=10_000, in_sync_lag_ms=10_000)
    with pytest.raises(NotEnoughReplicasError, match="not stored"):
        master.put(Message("Orders", b"alone"), 0)  # min_in_sync_replicas = 2: refused, not stored
    assert end_of(master) == 0
    slave = brokers.slave(master)
    wait_for(lambda: master.replication.in_sync_members, WAIT_S, "the slave to join the in-sync set",  # type: ignore[union-attr]
             until=lambda members: members == {0, 1})
    results = send(master, 50)
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert end_of(slave) >= results[-1].queue_offset  # confirmed means the slave holds it
    assert slave.query_by_id(results[-1].msg_id) == master.query_by_id(results[-1].msg_id)
    batch = master.put_batch([Message("Orders", b"b1"), Message("Orders", b"b2")], 1)
    assert {r.status for r in batch} == {SendStatus.SEND_OK}
    slave.close()
    wait_for(lambda: not master.replication.status().slaves, WAIT_S, "the master to notice the slave left")  # type: ignore[union-attr]
    wait_for(lambda: len(master.replication.in_sync_members) == 1, WAIT_S, "the slave to leave the in-sync set")  # type: ignore[union-attr]
    with pytest.raises(NotEnoughReplicasError):
        master.put(Message("Orders", b"gone"), 0)


def test_a_stalled_slave_leaves_the_in_sync_set_and_a_min_one_master_acks_alone_after(brokers: Brokers) -> None:
    """A slave that stops confirming (frozen, cut off) holds sends only until in_sync_lag_ms: then
    it leaves the set and a master with min_in_sync_replicas = 1 acks alone; back, it joins again."""
    master = brokers.master(role="sync_master", sync_timeout_ms=3000, in_sync_lag_ms=400, min_in_sync_replicas=1)
    host, port = master.replication.status().address.split(":")  # type: ignore[union-attr]
    from plugmq.plugins.ha import frames

    connecting = time.monotonic()  # the mute slave's lag is counted from its handshake, after this
    with socket.create_connection((host, int(port))) as mute:
        mute.sendall(frames.json_frame(frames.FrameType.HELLO, {
            "version": frames.PROTOCOL_VERSION, "broker_name": "broker-a", "broker_id": 1,
            "format": master.store.log_format, "end": 0, "min": 0, "epoch": 0}))  # type: ignore[attr-defined]
        wait_for(lambda: master.replication.in_sync_members == {0, 1}, WAIT_S, "the mute slave to join")  # type: ignore[union-attr]
        result = master.put(Message("Orders", b"waits for the laggard to leave"), 0)
        acked_after = time.monotonic() - connecting
        assert result.status is SendStatus.SEND_OK
        assert 0.4 <= acked_after < 3.0, f"acked {acked_after:.2f} s after the slave came: once it left, not before"
        assert master.replication.in_sync_members == {0}  # type: ignore[union-attr]
    slave = brokers.slave(master)
    caught_up(slave, master)
    wait_for(lambda: master.replication.in_sync_members == {0, 1}, WAIT_S, "the real slave to join")  # type: ignore[union-attr]
    results = send(master, 20)
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert all(slave.query_by_id(r.msg_id) is not None for r in results), "every acked send is on the member"


def test_sync_master_times_out_on_a_slave_that_stops_answering(brokers: Brokers) -> None:
    """A peer that accepts the stream but never ACKs (a stalled process) gives FLUSH_SLAVE_TIMEOUT
    (while it is still in the in-sync set: it leaves it only after in_sync_lag_ms)."""
    master = brokers.master(role="sync_master", sync_timeout_ms=200, in_sync_lag_ms=5000)
    host, port = master.replication.status().address.split(":")  # type: ignore[union-attr]
    from plugmq.plugins.ha import frames

    with socket.create_connection((host, int(port))) as mute:
        mute.sendall(frames.json_frame(frames.FrameType.HELLO, {
            "version": frames.PROTOCOL_VERSION, "broker_name": "broker-a", "broker_id": 1, "format": master.store.log_format,  # type: ignore[attr-defined]
            "end": 0, "min": 0, "epoch": 0}))
        wait_for(lambda: master.replication.status().slaves, WAIT_S, "the mute slave to be admitted")  # type: ignore[union-attr]
        started = time.monotonic()
        result = master.put(Message("Orders", b"never confirmed"), 0)
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - started >= 0.2
        assert master.query_by_id(result.msg_id) is not None, "the message stays stored on the master"


def test_async_master_never_waits_for_a_mute_slave(brokers: Brokers) -> None:
    master = brokers.master(transfer_batch_bytes=1024)
    host, port = master.replication.status().address.split(":")  # type: ignore[union-attr]
    from plugmq.plugins.ha import frames

    with socket.create_connection((host, int(port))) as mute:
        mute.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        mute.sendall(frames.json_frame(frames.FrameType.HELLO, {
            "version": frames.PROTOCOL_VERSION, "broker_name": "broker-a", "broker_id": 1, "format": master.store.log_format,  # type: ignore[attr-defined]
            "end": 0, "min": 0, "epoch": 0}))
        wait_for(lambda: master.replication.status().slaves, WAIT_S, "the mute slave to be admitted")  # type: ignore[union-attr]
        results = send(master, 3000)  # far more than the socket buffers hold: the stream blocks, sends do not
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        status = master.replication.status()  # type: ignore[union-attr]
        assert status.slaves[0].lag_bytes > 0


def test_killed_slave_catches_up_after_restart(brokers: Brokers) -> None:
    master = brokers.master("store_lmdb")
    slave = brokers.slave(master, "store_lmdb", data="the-slave")
    first = send(master, 50)
    caught_up(slave, master)
    slave.close()
    later = send(master, 70, first=50)
    again = brokers.slave(master, "store_lmdb", data="the-slave")
    caught_up(again, master)
    same_messages(master, again, first + later)


def test_slave_reconnects_to_a_restarted_master(brokers: Brokers, tmp_path: Path) -> None:
    master = brokers.master(listen="127.0.0.1:0")
    address = master.replication.status().address  # type: ignore[union-attr]
    slave = brokers.slave(address)
    results = send(master, 10)
    caught_up(slave, master)
    data_dir = master.data_dir
    master.close()
    wait_for(lambda: not slave.replication.status().connected, WAIT_S, "the slave to notice")  # type: ignore[union-attr]
    reopened = brokers.make(["store_mmap", *PLUGINS], data_dir=data_dir, options={"ha": {"listen": address}})
    results += send(reopened, 10, first=10)
    caught_up(slave, reopened)
    same_messages(reopened, slave, results)


def test_refusals_name_the_problem(brokers: Brokers) -> None:
    master = brokers.master("store_mmap")
    with capture_logs() as logs:
        other_format = brokers.slave(master, "store_lmdb")
        other_name = brokers.slave(master, name="broker-b", broker_id=2)

        def reasons() -> str:
            return " ".join(e["reason"] for e in logs if e["event"] == "replication slave refused")

        wait_for(lambda: "kvstore-record" in reasons() and "broker-b" in reasons(), WAIT_S, "both refusals")
        reasons_seen = reasons()
    assert "store_mmap" in reasons_seen and "broker-a" in reasons_seen, reasons_seen
    assert not other_format.replication.status().connected  # type: ignore[union-attr]
    assert not other_name.replication.status().connected  # type: ignore[union-attr]
    assert not master.replication.status().slaves  # type: ignore[union-attr]
    # A slave holding more than the master (it was a master itself) is refused too.
    ahead = brokers.master("store_mmap")
    send(ahead, 5)
    ahead_dir = ahead.data_dir
    ahead.close()
    with capture_logs() as logs:
        brokers.slave(master, data=str(ahead_dir.relative_to(brokers.root)))
        wait_for(lambda: any("past this master's end" in e.get("reason", "") for e in logs), WAIT_S, "the refusal")


def test_role_configuration_errors(tmp_path: Path, make_broker: BrokerFactory) -> None:
    with pytest.raises(PluginError, match="needs a replication plugin.*ha"):
        Broker.open(tmp_path / "a", plugins=["store_mmap"], role="sync_master")
    with pytest.raises(PluginError, match="needs a replication plugin"):
        Broker.open(tmp_path / "b", plugins=["store_mmap"], role="slave", broker_id=1)
    with pytest.raises(ReplicationError, match="names no master"):
        Broker.open(tmp_path / "c", plugins=["store_mmap", "ha"], role="slave", broker_id=1)
    with pytest.raises(ConfigError, match="broker_id"):
        Broker.open(tmp_path / "d", plugins=["store_mmap", "ha"], role="slave")
    with pytest.raises(ConfigError, match="master"):
        Broker.open(tmp_path / "e", plugins=["store_mmap", "ha"], role="slave", broker_id=1,
                    options={"ha": {"master": "nowhere"}})
    with pytest.raises(ConfigError, match="peer_timeout_ms"):
        Broker.open(tmp_path / "f", plugins=["store_mmap", "ha"], options={"ha": {"heartbeat_ms": 20_000}})
    # A plain broker needs no replication plugin, and one with it but no slaves just listens.
    plain = make_broker(["store_mmap"], data_dir=tmp_path / "g")
    assert plain.replication is None and plain.put(Message("T", b"x"), 0).status is SendStatus.SEND_OK
    lonely = make_broker(["store_mmap", "ha"], data_dir=tmp_path / "h")
    assert lonely.put(Message("T", b"x"), 0).status is SendStatus.SEND_OK
    address = (tmp_path / "h" / "ha" / "listen.addr").read_text().strip()
    assert address == lonely.replication.status().address  # type: ignore[union-attr]


def test_a_torn_transfer_leaves_nothing_torn(brokers: Brokers, tmp_path: Path) -> None:
    """A master that dies mid-frame: the slave keeps nothing of that frame, reconnects, and takes
    the whole chunk on the next connection."""
    from plugmq.broker.components import open_store
    from plugmq.core import ManualClock
    from plugmq.plugins.ha import frames

    source = open_store("store_mmap", tmp_path / "source", clock=ManualClock(), store_host="127.0.0.1:10911")
    try:
        for i in range(20):
            source.append(_request("Orders", i))
        assert isinstance(source, ReplicableStore)
        chunk = source.read_log(0, 1 << 20)
        log_format = source.log_format
    finally:
        source.close()
    whole = frames.data_frame(chunk.start, chunk.end, chunk.end, chunk.records, chunk.data)
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    slave = brokers.slave(address)
    try:
        for attempt in range(2):
            server.settimeout(WAIT_S)
            peer, _ = server.accept()
            if attempt == 1:  # the slave came back after the torn frame, holding nothing of it
                assert end_of(slave) == 0 and not slave.store.queues(), "a torn frame left something behind"
            with peer:
                reader = frames.Reader(peer, "slave")
                kind, payload = reader.read()
                assert kind is frames.FrameType.HELLO and frames.parse_json(payload)["end"] == 0
                peer.sendall(frames.json_frame(frames.FrameType.WELCOME, {"start": 0, "end": chunk.end, "min": 0,
                                                                          "format": log_format, "epoch": 0}))
                if attempt == 0:
                    peer.sendall(whole[: len(whole) // 2])  # torn: the connection ends mid-frame
                    continue
                peer.sendall(whole)
                kind, payload = reader.read()
                assert kind is frames.FrameType.ACK and frames.parse_ack(payload) == chunk.end
        assert end_of(slave) == chunk.end
        assert [m.body for m in slave.pull(MessageQueue("Orders", "broker-a", 0), 0, 100).messages] == [
            f"m{i}".encode() for i in range(20)]
    finally:
        server.close()


def _request(topic: str, i: int) -> Any:
    from plugmq.core import AppendRequest, Prop

    return AppendRequest(topic=topic, queue_id=0, body=f"m{i}".encode(), properties={Prop.UNIQ_KEY: f"U{i}"})
