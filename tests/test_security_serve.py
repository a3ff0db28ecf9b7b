"""Attacks on ``plugmq serve`` with TLS and access control on, each from a real client against a
real server child: the official Python and Node.js clients over TLS, a plain client against a TLS
port, mutual TLS on the admin endpoint, another account reading a victim's group, forged and
foreign receipt handles, signatures outside the date window, accounts changed while serving."""

from __future__ import annotations

import datetime
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
pytest.importorskip("trustme", reason="needs the test extra (trustme)")

from rocketmq.grpc_protocol import Code, MessagingServiceStub, service_pb2

from plugmq.core.errors import ClientError
from plugmq.server.admin import AdminClient
from plugmq.server.tls import ClientTls
from plugmq.testing import ServeProcess
from tests.security_helpers import (
    ACCOUNTS,
    Certs,
    ack,
    channel,
    heartbeat,
    make_certs,
    official_client,
    receive,
    send,
    signed,
    toml_accounts,
    write_config,
)
from tests.test_server_nodejs import NodeClient, node_modules  # noqa: F401 - the fixture

WAIT_S = 20.0


class Secure:
    def __init__(self, server: ServeProcess, certs: Certs) -> None:
        self.server = server
        self.certs = certs
        self.address = server.address or server.await_address()
        self.channel = channel(self.address, certs)
        self.stub = MessagingServiceStub(self.channel)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    directory = tmp_path_factory.mktemp("secure")
    certs = make_certs(directory)
    server = ServeProcess(write_config(directory, certs=certs))
    try:
        served = Secure(server, certs)
        yield served
        served.channel.close()
    finally:
        server.stop()


def _date(shift: datetime.timedelta) -> str:
    return (datetime.datetime.now(datetime.UTC) + shift).strftime("%Y%m%dT%H%M%SZ")


def test_official_python_client_over_tls(secure: Secure) -> None:
    result = official_client(secure.address, secure.certs.ca, "victim", topic="TlsPython", group="victim-g", count=6)
    assert result["received"] == sorted(result["sent"])


def test_a_plaintext_client_gets_nothing_from_a_tls_port(secure: Secure) -> None:
    with grpc.insecure_channel(secure.address) as plain, pytest.raises(grpc.RpcError) as caught:
        MessagingServiceStub(plain).Heartbeat(service_pb2.HeartbeatRequest(), metadata=signed("victim"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_nodejs_client_over_tls(secure: Secure, node_modules: Path, tmp_path: Path) -> None:  # noqa: F811
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secure.certs.ca)}
    credentials = {"accessKey": "victim", "accessSecret": ACCOUNTS["victim"]["secret"]}
    client = NodeClient(node_modules, tmp_path / "node.log", env)
    try:
        client.call("producer", endpoints=secure.address, topics=["TlsNode"], ssl=True, credentials=credentials)
        for i in range(3):
            client.call("send", topic="TlsNode", body=f"node-tls-{i}")
        client.call("simple", endpoints=secure.address, group="victim-g", topic="TlsNode", awaitMs=1000, ssl=True,
                    credentials=credentials)
        got: list[dict[str, object]] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 3 and time.monotonic() < deadline:
            got.extend(client.call("receive", max=8, invisibleMs=30_000)["messages"])
        for message in got:
            client.call("ack", messageId=message["messageId"])
    finally:
        client.close()
    assert sorted(str(m["body"]) for m in got) == [f"node-tls-{i}" for i in range(3)]


def test_another_account_cannot_consume_or_join_a_victims_group(secure: Secure) -> None:
    stub = secure.stub
    send(stub, "victim", "Orders", [f"order-{i}".encode() for i in range(28)])
    stolen = receive(stub, "attacker", "victim-g", "Orders")
    assert stolen.status == Code.FORBIDDEN and "may not consume as group 'victim-g'" in stolen.message
    assert stolen.deliveries == ()
    code, text = heartbeat(stub, "attacker", "victim-g", "attacker-as-victim")
    assert code == Code.FORBIDDEN and "groups" in text
    own = receive(stub, "victim", "victim-g", "Orders")
    assert sorted(body for _, _, body in own.deliveries) == sorted(f"order-{i}".encode() for i in range(28))
    assert all(code == Code.OK for code, _ in ack(stub, "victim", "victim-g", "Orders",
                                                   [(m, h) for m, h, _ in own.deliveries]))


def test_forged_and_foreign_receipt_handles_are_refused_and_the_victims_acks_work(secure: Secure) -> None:
    stub = secure.stub
    send(stub, "victim", "Acks", [f"ack-{i}".encode() for i in range(40)])
    victims = receive(stub, "victim", "victim-g", "Acks", batch=32).deliveries
    victims += receive(stub, "victim", "victim-g", "Acks", batch=32).deliveries
    assert len(victims) == 40
    attackers = receive(stub, "attacker", "attacker-g", "Acks", batch=32).deliveries
    # Guessed handles (the old queue:offset:seq form, and the sealed form with a made-up MAC), acked in
    # the attacker's own group; the attacker's genuine handles presented in the victim's group.
    guesses = [(m, f"{h.split('~')[0].rsplit(':', 1)[0]}:{seq}") for (m, h, _), seq in zip(victims, range(40))]
    forged = [(m, h.split("~")[0] + "~AAAAAAAAAAAAAAAAAAAAAA") for m, h, _ in victims]
    for entries in (guesses, forged):
        results = ack(stub, "attacker", "attacker-g", "Acks", entries)
        assert {code for code, _ in results} == {Code.INVALID_RECEIPT_HANDLE}
        assert "was not issued by this broker to group 'attacker-g'" in results[0][1]
    foreign = ack(stub, "victim", "victim-g", "Acks", [(m, h) for m, h, _ in attackers])
    assert {code for code, _ in foreign} == {Code.INVALID_RECEIPT_HANDLE}
    assert ack(stub, "attacker", "victim-g", "Acks", [(m, h) for m, h, _ in victims[:1]])[0][0] == Code.FORBIDDEN
    results = ack(stub, "victim", "victim-g", "Acks", [(m, h) for m, h, _ in victims])
    assert [code for code, _ in results] == [Code.OK] * 40


@pytest.mark.parametrize(("shift", "text"), [
    # The date has whole seconds and the server's clock goes on: a day is 86399 to 86401 s.
    (datetime.timedelta(days=-1), r"\b8640[01] s behind the server's clock"),
    (datetime.timedelta(days=-30), r"\d s behind the server's clock"),
    (datetime.timedelta(days=1), r"\b86(399|400) s ahead of the server's clock"),
    (None, "is not a UTC time"),
])
def test_signatures_outside_the_date_window_are_refused(secure: Secure, shift: datetime.timedelta | None,
                                                        text: str) -> None:
    request = service_pb2.QueryRouteRequest()
    request.topic.name = "Orders"
    date = _date(shift) if shift is not None else "not-a-date"
    response = secure.stub.QueryRoute(request, metadata=signed("victim", date), timeout=5)
    assert response.status.code == Code.UNAUTHORIZED
    assert re.search(text, response.status.message), response.status.message
    if shift is not None:
        assert "allowed clock skew is 900 s" in response.status.message
    fresh = secure.stub.QueryRoute(request, metadata=signed("victim", _date(datetime.timedelta(minutes=-10))),
                                   timeout=5)
    assert fresh.status.code == Code.OK


def _route_status(stub: MessagingServiceStub, account: str, secret: str) -> int:
    from plugmq.server.admin import signature_metadata

    request = service_pb2.QueryRouteRequest()
    request.topic.name = "Orders"
    return int(stub.QueryRoute(request, metadata=signature_metadata(account, secret), timeout=5).status.code)


def test_accounts_are_reloaded_from_their_file_and_on_sighup(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(toml_accounts({"ops": ACCOUNTS["ops"]}, prefix="accounts"), encoding="utf-8")
    config = write_config(tmp_path, certs=None, acl=False,
                          extra='[server.acl]\nenabled = true\naccounts_file = "accounts.toml"\nreload_check_s = 0.2\n')
    server = ServeProcess(config)
    try:
        with grpc.insecure_channel(server.await_address()) as plain:
            stub = MessagingServiceStub(plain)
            late = {"secret": "late-secret", "publish": ["*"], "subscribe": ["*"]}
            assert _route_status(stub, "late", "late-secret") == Code.UNAUTHORIZED
            accounts.write_text(toml_accounts({"ops": ACCOUNTS["ops"], "late": late}, prefix="accounts"),
                                encoding="utf-8")
            deadline = time.monotonic() + WAIT_S
            while _route_status(stub, "late", "late-secret") != Code.OK:
                assert time.monotonic() < deadline, "the changed accounts file was not reloaded"
                time.sleep(0.05)
            accounts.write_text("not toml [", encoding="utf-8")  # a broken file keeps the accounts in force
            server.process.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            assert _route_status(stub, "late", "late-secret") == Code.OK
            accounts.write_text(toml_accounts({"ops": ACCOUNTS["ops"]}, prefix="accounts"), encoding="utf-8")
            server.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + WAIT_S
            while _route_status(stub, "late", "late-secret") != Code.UNAUTHORIZED:
                assert time.monotonic() < deadline, "SIGHUP did not reload the accounts"
                time.sleep(0.05)
    finally:
        server.stop()
    assert "accounts not reloaded; the previous ones stay in force" in server.log_path.read_text()


def test_receipt_handles_survive_a_restart(tmp_path: Path) -> None:
    config = write_config(tmp_path, certs=None)
    server = ServeProcess(config)
    try:
        with grpc.insecure_channel(server.await_address()) as plain:
            stub = MessagingServiceStub(plain)
            send(stub, "victim", "Durable", [b"one", b"two"])
            held = receive(stub, "victim", "victim-g", "Durable").deliveries
    finally:
        assert server.stop() == 0
    server = ServeProcess(config)
    try:
        with grpc.insecure_channel(server.await_address()) as plain:
            results = ack(MessagingServiceStub(plain), "victim", "victim-g", "Durable", [(m, h) for m, h, _ in held])
    finally:
        server.stop()
    assert [code for code, _ in results] == [Code.OK, Code.OK]
    assert (tmp_path / "data" / "server" / "receipt.key").stat().st_mode & 0o777 == 0o600


def test_mutual_tls_admin_endpoint_takes_only_clients_the_ca_signed(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    config = write_config(tmp_path / "certs", certs=certs, mutual=True)
    server = ServeProcess(config)
    try:
        address = server.await_address()
        ops = {"access_key": "ops", "secret_key": ACCOUNTS["ops"]["secret"], "timeout_s": 5}
        for tls in (ClientTls.from_files(certs.ca), ClientTls.from_files(certs.ca, certs.stranger_cert,
                                                                         certs.stranger_key)):
            with AdminClient(address, tls=tls, **ops) as client, pytest.raises(ClientError) as caught:
                client.call("topic-list", {})
            assert "cannot reach plugmq serve" in str(caught.value)
        with AdminClient(address, tls=ClientTls.from_files(certs.ca, certs.client_cert, certs.client_key),
                         **ops) as client:
            assert client.call("topic-list", {}) == []
        from click.testing import CliRunner

        from plugmq.cli import main

        run = CliRunner().invoke(main, ["admin", "topic-list", "--server", address, "--access-key", "ops",
                                        "--secret-key", ACCOUNTS["ops"]["secret"], "--tls-ca", str(certs.ca),
                                        "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key),
                                        "--json"])
        assert run.exit_code == 0, run.output
        assert run.output.strip() == "[]"
    finally:
        server.stop()
