"""TLS on the ha channel: master and slave replicate over it (with the cluster secret on top),
no message body crosses the wire in clear, a broker whose certificate another CA signed is
refused both ways, and a plain-TCP peer gets nothing. Real brokers, real TCP on loopback,
certificates made by trustme (tests/security_helpers.py)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from plugmq.broker.broker import Broker
from plugmq.core import ConfigError, Message
from plugmq.testing import WAIT_S, ZooKeeperServer, wait_for
from tests import test_ha_auth
from tests.helpers.replication import end_of
from tests.test_ha_auth import PLUGINS, Rig, TamperingRelay, address_of, everything_answered, hello

pytest.importorskip("trustme", reason="needs the test extra (trustme)")

from tests.security_helpers import Certs, make_certs  # after the skip: it imports grpc

BODY = b"confidential-payload-7f3a"


rig, secret = test_ha_auth.rig, test_ha_auth.secret  # the ha tests' fixtures, shared


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


def tls(certs: Certs, *, stranger: bool = False) -> dict[str, str]:
    """``[plugins.ha]`` TLS options: the cluster's pair, or one a stranger's CA signed."""
    cert, key = (certs.stranger_cert, certs.stranger_key) if stranger else (certs.server_cert, certs.server_key)
    return {"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(certs.ca)}


def master_of(rig: Rig, **ha: Any) -> Broker:
    role = ha.pop("role", "async_master")
    return rig.open(f"master-{len(rig.opened)}", role=role, ha=ha)


def slave_of(rig: Rig, master: Broker | str, **ha: Any) -> Broker:
    address = master if isinstance(master, str) else master.replication.status().address  # type: ignore[union-attr]
    return rig.open(f"slave-{len(rig.opened)}", role="slave", broker_id=1,
                    ha={"master": address, "reconnect_ms": 20, "reconnect_max_ms": 200, **ha})


def put(broker: Broker, count: int) -> None:
    for i in range(count):
        broker.put(Message("Orders", BODY + f"-{i}".encode()), i % 4)


class RecordingRelay(TamperingRelay):
    """A slave follows the relay's address; every byte both ways passes through unchanged and is kept."""

    def __init__(self, master: tuple[str, int]) -> None:
        self.seen = bytearray()
        self._lock = threading.Lock()
        super().__init__(master, b"")

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:  # type: ignore[override]
        with source, sink:
            try:
                while data := source.recv(65536):
                    with self._lock:
                        self.seen += data
                    sink.sendall(data)
            except OSError:
                pass

    def _down(self, master: socket.socket, slave: socket.socket) -> None:
        self._pipe(master, slave)


@pytest.mark.parametrize("with_tls", [False, True], ids=["plain", "tls"])
def test_the_wire_carries_bodies_in_clear_only_without_tls(rig: Rig, certs: Certs, secret: str,
                                                            with_tls: bool) -> None:
    options = {"secret_file": secret, **(tls(certs) if with_tls else {})}
    master = master_of(rig, role="sync_master", **options)
    relay = RecordingRelay(address_of(master))
    try:
        slave = slave_of(rig, relay.address, **options)
        wait_for(lambda: master.replication.in_sync_members, WAIT_S, "the slave to join the in-sync set",  # type: ignore[union-attr]
                 until=lambda members: members == {0, 1})
        put(master, 20)  # sync_master: each put returns once the slave holds it
        assert end_of(slave) == end_of(master)
        seen = bytes(relay.seen)
    finally:
        relay.close()
    assert len(seen) > 20 * len(BODY)
    assert (BODY in seen) is not with_tls


def test_failover_over_tls_elects_the_slave_and_the_old_master_rejoins(zookeeper: ZooKeeperServer, tmp_path: Path,
                                                                       certs: Certs, secret: str) -> None:
    """Two ``plugmq serve`` failover brokers on a real ZooKeeper, ha over TLS with the secret:
    kill -9 of the master elects the slave; the old master, restarted, follows it over TLS."""
    from tests.fault_harness import running_pair

    with running_pair(tmp_path / "pair", zookeeper, mode="sync_master", secret=Path(secret),
                      ha_tls=tls(certs)) as pair:
        first = pair.master()  # its slave is in sync: the TLS channel carries the stream
        pair.kill(first)
        other = 1 - first
        wait_for(lambda: (pair.status(other) or {}).get("role"), WAIT_S * 2, "the slave to be elected",
                 until=lambda role: role not in (None, "slave"))
        pair.restart(first)
        assert pair.master(wait_s=WAIT_S * 2) == other  # the old master rejoined, in sync, over TLS
        assert "TLS handshake failed" not in pair.log_of(first) + pair.log_of(other)


def test_a_slave_whose_certificate_another_ca_signed_is_refused(rig: Rig, certs: Certs, secret: str) -> None:
    master = master_of(rig, secret_file=secret, **tls(certs))
    put(master, 5)
    with capture_logs() as logs:
        stranger = slave_of(rig, master, secret_file=secret, **tls(certs, stranger=True))
        wait_for(lambda: [e for e in logs if e["event"].startswith("replication from master interrupted")], WAIT_S,
                 "the stranger to be refused")
        refused = [e for e in logs if e["event"].startswith("replication peer refused: TLS handshake failed")]
    assert end_of(stranger) == 0 and not master.replication.status().slaves  # type: ignore[union-attr]
    assert refused and "CERTIFICATE_VERIFY_FAILED" in refused[0]["reason"], refused
    errors = [e["reason"] for e in logs if e["event"].startswith("replication from master interrupted")]
    assert "refused this slave's TLS certificate" in errors[0], errors


def test_a_master_whose_certificate_another_ca_signed_is_not_followed(rig: Rig, certs: Certs, secret: str) -> None:
    master = master_of(rig, secret_file=secret, **tls(certs, stranger=True))
    put(master, 5)
    with capture_logs() as logs:
        slave = slave_of(rig, master, secret_file=secret, **tls(certs))
        wait_for(lambda: [e for e in logs if e["event"].startswith("replication from master interrupted")], WAIT_S,
                 "the slave to refuse the master")
    errors = [e["reason"] for e in logs if e["event"].startswith("replication from master interrupted")]
    assert "tls_ca does not vouch" in errors[0] and "not following it" in errors[0], errors
    assert end_of(slave) == 0


def test_the_server_name_is_checked_when_set(rig: Rig, certs: Certs, secret: str) -> None:
    master = master_of(rig, secret_file=secret, **tls(certs))
    put(master, 3)
    with capture_logs() as logs:
        wrong = slave_of(rig, master, secret_file=secret, tls_server_name="broker-z.example", **tls(certs))
        wait_for(lambda: [e for e in logs if e["event"].startswith("replication from master interrupted")], WAIT_S,
                 "the name check to fail")
    assert end_of(wrong) == 0
    right = slave_of(rig, master, secret_file=secret, tls_server_name="localhost", **tls(certs))
    wait_for(lambda: end_of(right), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))


def test_a_plain_tcp_peer_gets_nothing_and_is_logged_once(rig: Rig, certs: Certs) -> None:
    master = master_of(rig, **tls(certs))  # TLS without the secret: the channel is still closed to strangers
    put(master, 10)
    with capture_logs() as logs:
        for _ in range(3):
            with socket.create_connection(address_of(master), timeout=5) as sock:
                sock.sendall(hello(master))
                assert everything_answered(sock) == []
        refused = [e for e in logs if e["event"].startswith("replication peer refused: TLS handshake failed")]
    assert len(refused) == 1, refused  # rate-limited: three tries, one line
    slave = slave_of(rig, master, **tls(certs))  # the master lives on and serves a real slave
    wait_for(lambda: end_of(slave), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))


def test_a_tls_slave_against_a_plain_master_says_so(rig: Rig, certs: Certs) -> None:
    master = master_of(rig)
    with capture_logs() as logs:
        slave = slave_of(rig, master, **tls(certs))
        wait_for(lambda: [e for e in logs if e["event"].startswith("replication from master interrupted")], WAIT_S,
                 "the handshake to fail")
    errors = [e["reason"] for e in logs if e["event"].startswith("replication from master interrupted")]
    assert "TLS handshake with the master" in errors[0], errors
    assert end_of(slave) == 0


def test_bad_tls_files_are_config_errors_naming_the_option(tmp_path: Path, certs: Certs) -> None:
    good = tls(certs)
    cases: list[tuple[dict[str, str], str]] = [
        ({**good, "tls_cert": str(tmp_path / "missing.pem")}, r"plugins\.ha\.tls_cert: certificate file .* does not exist"),
        ({**good, "tls_ca": str(certs.server_key)}, r"plugins\.ha\.tls_ca: .* holds no PEM certificate"),
        ({"tls_cert": good["tls_cert"]}, r"plugins\.ha\.tls_key missing"),
        ({**good, "tls_key": str(certs.client_key)}, r"does not belong to the certificate"),
        ({"tls_ca": good["tls_ca"]}, r"tls_ca is set without tls_cert"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            Broker.open(tmp_path / "b", plugins=PLUGINS, options={"ha": options})



def test_the_ha_port_beyond_loopback_warns_unless_tls_and_the_secret_are_on() -> None:
    from plugmq.kit.addresses import exposed_warning

    def warned(**have: bool) -> bool:
        return exposed_warning("ha replication port", "0.0.0.0:10912", fix="set [plugins.ha] ...", **have)

    assert not warned(tls=True, authenticated=True)
    assert warned(tls=False, authenticated=True) and warned(tls=True, authenticated=False)
    assert not exposed_warning("ha replication port", "127.0.0.1:10912", tls=False, authenticated=False, fix="")
