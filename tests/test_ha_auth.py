"""The ha channel with a cluster secret: master and slave authenticate each other, and the four
attacks of issue 26 on the replication port fail. Real brokers and real TCP on loopback; the
attacker speaks the wire format with plugmq's own frame functions, as a reader of the docs would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from plugmq.broker.broker import Broker
from plugmq.core import ConfigError, Message, MessageQueue
from plugmq.core.errors import NotEnoughReplicasError
from plugmq.plugins.ha import frames
from plugmq.plugins.ha.frames import FrameType
from plugmq.server.receipts import ReceiptSealer
from plugmq.testing import WAIT_S, wait_for
from tests.helpers.replication import end_of

pytest.importorskip("cryptography", reason="the cluster secret's key derivation needs the serve extra")

PLUGINS = ["store_mmap", "filter_tag", "alloc", "ha"]
FAST = {"heartbeat_ms": 100, "peer_timeout_ms": 3000}


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "cluster.secret"
    path.write_text("s3cr3t-" * 8 + "\n")
    path.chmod(0o600)
    return str(path)


class Rig:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.opened: list[Broker] = []

    def open(self, name: str, **settings: Any) -> Broker:
        ha = settings.pop("ha", {})
        broker = Broker.open(self.root / name, plugins=PLUGINS, options={"ha": {**FAST, **ha}}, **settings)
        self.opened.append(broker)
        return broker

    def master(self, secret: str = "", *, ha: dict[str, Any] | None = None, **settings: Any) -> Broker:
        return self.open(f"master-{len(self.opened)}", ha={"secret_file": secret, **(ha or {})}, **settings)

    def slave(self, master: Broker | str, secret: str = "", *, data: str | None = None) -> Broker:
        address = master if isinstance(master, str) else master.replication.status().address  # type: ignore[union-attr]
        ha = {"master": address, "reconnect_ms": 20, "reconnect_max_ms": 200, "secret_file": secret}
        return self.open(data or f"slave-{len(self.opened)}", role="slave", broker_id=1, ha=ha)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    for broker in reversed(made.opened):
        broker.close()


def address_of(broker: Broker) -> tuple[str, int]:
    host, _, port = broker.replication.status().address.rpartition(":")  # type: ignore[union-attr]
    return host, int(port)


def send(broker: Broker, count: int) -> None:
    for i in range(count):
        broker.put(Message("Orders", f"m{i}".encode()), i % 4)


def hello(broker: Broker, **extra: Any) -> bytes:
    """The HELLO a slave of ``broker`` would send, as a stranger copies it from the docs."""
    return frames.json_frame(FrameType.HELLO, {"version": frames.PROTOCOL_VERSION, "broker_name": "broker-a",
                                               "broker_id": 1, "format": broker.store.log_format,  # type: ignore[attr-defined]
                                               "end": 0, "min": 0, "epoch": 0, "epochs": [], **extra})


def everything_answered(sock: socket.socket) -> list[tuple[FrameType, bytes]]:
    """Every frame the master sends until it closes the connection."""
    reader = frames.Reader(sock, "master")
    got: list[tuple[FrameType, bytes]] = []
    try:
        while True:
            got.append(reader.read())
    except (ConnectionError, OSError):
        return got


def test_slave_and_master_with_the_same_secret_replicate(rig: Rig, secret: str) -> None:
    master = rig.master(secret)
    slave = rig.slave(master, secret)
    send(master, 20)
    wait_for(lambda: end_of(slave), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))
    assert slave.replication.status().connected  # type: ignore[union-attr]


def test_a_slave_without_or_with_another_secret_is_refused_and_told_nothing(rig: Rig, secret: str,
                                                                              tmp_path: Path) -> None:
    master = rig.master(secret)
    send(master, 5)
    other = tmp_path / "other.secret"
    other.write_text("another-" * 8)
    with capture_logs() as logs:
        wrong = rig.slave(master, str(other))
        plain = rig.slave(master)
        wait_for(lambda: [e for e in logs if e["event"] == "replication slave refused"], WAIT_S, "two refusals",
                 until=lambda seen: len({e["reason"][:20] for e in seen}) >= 2)
        errors = [e.get("reason", "") for e in logs if e["event"] == "replication from master interrupted; reconnecting"]
    assert end_of(wrong) == end_of(plain) == 0
    assert not master.replication.status().slaves  # type: ignore[union-attr]
    told = " ".join(errors)
    assert "refused" in told and "broker-a" not in told and "store_mmap" not in told and "mmap" not in told, told


def test_a_plain_client_saying_hello_pulls_nothing(rig: Rig, secret: str) -> None:
    master = rig.master(secret)
    send(master, 10)
    with socket.create_connection(address_of(master), timeout=5) as sock:
        sock.sendall(hello(master))
        answers = everything_answered(sock)
    assert [kind for kind, _ in answers] == [FrameType.REFUSE]
    refusal = answers[0][1].decode()
    assert "broker-a" not in refusal and "mmap" not in refusal and "format" not in refusal, refusal
    # A bogus handshake frame is refused the same way; a huge announced length allocates nothing.
    with socket.create_connection(address_of(master), timeout=5) as sock:
        sock.sendall(frames.json_frame(FrameType.AUTH, {"nonce": "00" * 32}))
        sock.sendall(frames.json_frame(FrameType.PROVE, {"epoch": 0, "proof": "11" * 32}))
        answers = everything_answered(sock)
    assert [kind for kind, _ in answers] == [FrameType.CHALLENGE, FrameType.REFUSE]
    with socket.create_connection(address_of(master), timeout=5) as sock:
        sock.sendall(bytes([FrameType.AUTH]) + (60 * 1024 * 1024).to_bytes(4, "big") + b"\0" * 4)
        assert everything_answered(sock) == []


def test_a_rogue_slaves_huge_ack_does_not_make_a_lone_sync_master_ack(rig: Rig, secret: str) -> None:
    master = rig.master(secret, role="sync_master", ha={"sync_timeout_ms": 300})
    with socket.create_connection(address_of(master), timeout=5) as sock:
        sock.sendall(hello(master) + frames.ack_frame(1 << 40))
        assert [kind for kind, _ in everything_answered(sock)] == [FrameType.REFUSE]
    assert master.replication.in_sync_members == {0}  # type: ignore[union-attr]
    with pytest.raises(NotEnoughReplicasError):
        master.put(Message("Orders", b"only on one machine"), 0)
    assert end_of(master) == 0


def test_a_rogue_hello_with_consumer_progress_moves_no_consumer(rig: Rig, secret: str) -> None:
    master = rig.master(secret)
    send(master, 40)
    before = master.pop.progress("victims")
    rows = [["victims", "Orders", q, 10] for q in range(4)]
    with socket.create_connection(address_of(master), timeout=5) as sock:
        sock.sendall(hello(master, end=end_of(master), consumer_progress=rows))
        assert [kind for kind, _ in everything_answered(sock)] == [FrameType.REFUSE]
    assert master.pop.progress("victims") == before
    received = 0
    for _ in range(10):
        received += len(master.pop.receive("victims", "Orders", None, 32, 30_000))
    assert received == 40, "every message of the victims' backlog is still delivered"


class FakeMaster:
    """Owns the address a slave follows: answers HELLO with WELCOME truncate=0 and forged records."""

    def __init__(self, address: tuple[str, int], forged: bytes) -> None:
        self.listener = socket.create_server(address)
        self.forged = forged
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with sock:
                try:
                    frames.Reader(sock, "slave").read()  # whatever the slave says first
                    sock.sendall(frames.json_frame(FrameType.WELCOME, {"start": 0, "end": len(self.forged), "min": 0,
                                                                       "epoch": 99, "epochs": [[99, 0]], "truncate": 0}))
                    sock.sendall(frames.data_frame(0, len(self.forged), len(self.forged), 4, self.forged))
                    sock.recv(1)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_process_owning_the_masters_address_cannot_cut_or_forge_the_slaves_log(rig: Rig, secret: str) -> None:
    forger = rig.master()  # four "forged" records, in the real log format
    send(forger, 4)
    forged = forger.store.read_log(0, 1 << 20).data  # type: ignore[attr-defined]
    master = rig.master(secret)
    address = address_of(master)
    send(master, 64)
    slave = rig.slave(master, secret)
    wait_for(lambda: end_of(slave), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))
    held = end_of(slave)
    queue = MessageQueue("Orders", "broker-a", 0)
    messages = slave.pull(queue, 0, 100).messages
    master.close()
    rig.opened.remove(master)
    fake = FakeMaster(address, forged)
    try:
        with capture_logs() as logs:
            wait_for(lambda: fake.connections, WAIT_S, "the slave to call the fake master", until=lambda n: n >= 2)
        reasons = " ".join(e.get("reason", "") for e in logs)
    finally:
        fake.close()
    assert end_of(slave) == held and slave.pull(queue, 0, 100).messages == messages
    assert "not following it" in reasons, reasons


def test_the_receipt_key_comes_from_the_secret_and_is_shared_by_a_broker_name(rig: Rig, secret: str) -> None:
    master = rig.master(secret)
    slave = rig.slave(master, secret)
    alone = rig.master()
    sealer = ReceiptSealer.for_broker(master.data_dir, master.replication)
    handle = sealer.seal("g", "Orders", "0:5:1")
    assert ReceiptSealer.for_broker(slave.data_dir, slave.replication).open("g", "Orders", handle) == "0:5:1"
    with pytest.raises(Exception, match="not issued by this broker"):
        ReceiptSealer.for_broker(alone.data_dir, alone.replication).open("g", "Orders", handle)


def test_bad_secret_files_are_config_errors(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("too short")
    for path, message in ((tmp_path / "missing", "does not exist"), (short, "at least 32"),
                          (tmp_path, "directory")):
        with pytest.raises(ConfigError, match=message):
            Broker.open(tmp_path / "b", plugins=PLUGINS, options={"ha": {"secret_file": str(path)}})


class TamperingRelay:
    """Sits between a slave and its master (the slave follows the relay's address), passes the
    handshake through untouched, then swaps the records of every DATA frame for forged ones with a
    correct CRC, keeping the frame's tag: only the tag can tell."""

    def __init__(self, master: tuple[str, int], forged: bytes) -> None:
        self.master = master
        self.forged = forged
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.tampered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                slave, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.master)
            threading.Thread(target=self._pipe, args=(slave, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, slave), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with source, sink:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass

    @staticmethod
    def _exactly(sock: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            more = sock.recv(size - len(data))
            if not more:
                raise ConnectionError("closed")
            data += more
        return data

    def _down(self, master: socket.socket, slave: socket.socket) -> None:
        sealed = False
        with master, slave:
            try:
                while True:
                    head = self._exactly(master, 9)
                    kind, length = head[0], int.from_bytes(head[1:5], "big")
                    payload = self._exactly(master, length)
                    tag = self._exactly(master, 16) if sealed else b""
                    if kind == FrameType.PROVE:
                        sealed = True  # the master proved itself: its next frames carry tags
                    if kind == FrameType.DATA and len(payload) > 28:
                        start = frames.parse_data(payload)[0]
                        forged = frames.data_frame(start, start + len(self.forged), start + len(self.forged), 4,
                                                   self.forged)
                        head, payload = forged[:9], forged[9:]
                        self.tampered += 1
                    slave.sendall(head + payload + tag)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def test_a_relay_in_the_middle_cannot_alter_what_the_master_streams(rig: Rig, secret: str) -> None:
    forger = rig.master()
    send(forger, 4)
    forged = forger.store.read_log(0, 1 << 20).data  # type: ignore[attr-defined]
    master = rig.master(secret)
    send(master, 64)
    relay = TamperingRelay(address_of(master), forged)
    try:
        with capture_logs() as logs:
            slave = rig.slave(relay.address, secret)
            wait_for(lambda: relay.tampered, WAIT_S, "the relay to alter DATA frames", until=lambda n: n >= 2)
        reasons = " ".join(e.get("reason", "") for e in logs)
    finally:
        relay.close()
    assert end_of(slave) == 0, "nothing forged was appended"
    assert "authentication tag" in reasons, reasons
