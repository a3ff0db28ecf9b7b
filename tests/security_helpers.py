"""What the security tests share: certificates made with trustme, a ``plugmq serve`` config with
TLS and accounts, and calls through the generated gRPC stub signed as one account or another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import ClientType, Code, MessageType, MessagingServiceStub, service_pb2

from plugmq.server.admin import signature_metadata

ACCOUNTS: dict[str, dict[str, Any]] = {
    "victim": {"secret": "victim-secret", "publish": ["*"], "subscribe": ["*"], "groups": ["victim-g"]},
    "attacker": {"secret": "attacker-secret", "publish": ["*"], "subscribe": ["*"], "groups": ["attacker-g"]},
    "ops": {"secret": "ops-secret", "admin": True},
}
CLIENT_CHILD = Path(__file__).with_name("security_client.py")


@attrs.frozen
class Certs:
    """PEM files: a CA, the server's certificate (127.0.0.1, localhost) and key, a client
    certificate the CA signed, and one another CA signed (a stranger's)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def make_certs(directory: Path) -> Certs:
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca, stranger_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    with open(directory / "server.pem", "wb") as chain:
        for blob in server.cert_chain_pems:
            chain.write(blob.bytes())
    client, stranger = ca.issue_cert("client@plugmq"), stranger_ca.issue_cert("client@plugmq")
    for name, issued in (("client", client), ("stranger", stranger)):
        issued.private_key_pem.write_to_path(str(directory / f"{name}.key"))
        issued.cert_chain_pems[0].write_to_path(str(directory / f"{name}.pem"))
    return Certs(directory / "ca.pem", directory / "server.pem", directory / "server.key", directory / "client.pem",
                 directory / "client.key", directory / "stranger.pem", directory / "stranger.key")


def toml_accounts(accounts: dict[str, dict[str, Any]], prefix: str = "server.acl.accounts") -> str:
    lines = []
    for key, account in accounts.items():
        lines.append(f"[{prefix}.{key}]")
        lines.extend(f"{field} = {json.dumps(value)}" for field, value in account.items())
    return "\n".join(lines) + "\n"


def write_config(directory: Path, *, certs: Certs | None, mutual: bool = False, acl: bool = True,
                 broker: str = "", server: str = "", extra: str = "") -> Path:
    """A broker TOML for ``plugmq serve`` (store_mmap, tags, SQL92) with TLS and accounts as asked;
    ``broker`` and ``server``: more lines of those tables, ``extra``: more tables."""
    config = directory / "broker.toml"
    text = (f'[broker]\ndata_dir = "data"\nplugins = ["store_mmap", "filter_tag", "filter_sql"]\n{broker}'
            f"[server]\nlong_polling_s = 1\n{server}")
    if certs is not None:
        text += f'[server.tls]\ncert = "{certs.server_cert.name}"\nkey = "{certs.server_key.name}"\n'
        if mutual:
            text += f'client_ca = "{certs.ca.name}"\n'
    if acl:
        text += "[server.acl]\nenabled = true\n" + toml_accounts(ACCOUNTS)
    config.write_text(text + extra, encoding="utf-8")
    return config


def channel(address: str, certs: Certs | None, *, client_cert: bool = False) -> grpc.Channel:
    if certs is None:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        certs.ca.read_bytes(), certs.client_key.read_bytes() if client_cert else None,
        certs.client_cert.read_bytes() if client_cert else None)
    return grpc.secure_channel(address, credentials)


def signed(account: str | None, date: str | None = None) -> list[tuple[str, str]]:
    if account is None:
        return [("x-mq-client-id", "anonymous")]
    return [*signature_metadata(account, ACCOUNTS[account]["secret"], date), ("x-mq-client-id", f"{account}-client")]


def send(stub: MessagingServiceStub, account: str | None, topic: str, bodies: Iterable[bytes],
         **props: str) -> list[str]:
    request = service_pb2.SendMessageRequest()
    for i, body in enumerate(bodies):
        message = request.messages.add(body=body)
        message.topic.name = topic
        message.system_properties.message_id = f"{account}-{topic}-{i}-{os.urandom(4).hex()}"
        message.system_properties.message_type = MessageType.NORMAL
        message.user_properties.update(props)
    response = stub.SendMessage(request, metadata=signed(account), timeout=10)
    assert response.status.code == Code.OK, response.status.message
    return [entry.message_id for entry in response.entries]


@attrs.frozen
class Received:
    status: int
    message: str
    deliveries: tuple[tuple[str, str, bytes], ...]  # (message id, receipt handle, body)


def receive(stub: MessagingServiceStub, account: str | None, group: str, topic: str, batch: int = 32,
            *, date: str | None = None, sql: str | None = None, poll_s: int = 1) -> Received:
    request = service_pb2.ReceiveMessageRequest(batch_size=batch, auto_renew=False)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.message_queue.id = -1
    request.invisible_duration.CopyFrom(Duration(seconds=60))
    request.long_polling_timeout.CopyFrom(Duration(seconds=poll_s))
    if sql is not None:
        request.filter_expression.type = 2  # SQL
        request.filter_expression.expression = sql
    deliveries = []
    status, text = Code.OK, ""
    for response in stub.ReceiveMessage(request, metadata=signed(account, date), timeout=10):
        kind = response.WhichOneof("content")
        if kind == "status":
            status, text = response.status.code, response.status.message
        elif kind == "message":
            props = response.message.system_properties
            deliveries.append((props.message_id, props.receipt_handle, response.message.body))
    return Received(status, text, tuple(deliveries))


def ack(stub: MessagingServiceStub, account: str | None, group: str, topic: str,
        entries: Iterable[tuple[str, str]]) -> list[tuple[int, str]]:
    request = service_pb2.AckMessageRequest()
    request.group.name = group
    request.topic.name = topic
    for message_id, handle in entries:
        request.entries.add(message_id=message_id, receipt_handle=handle)
    response = stub.AckMessage(request, metadata=signed(account), timeout=10)
    if not response.entries:
        return [(response.status.code, response.status.message)]
    return [(entry.status.code, entry.status.message) for entry in response.entries]


def heartbeat(stub: MessagingServiceStub, account: str | None, group: str, client_id: str) -> tuple[int, str]:
    request = service_pb2.HeartbeatRequest(client_type=ClientType.SIMPLE_CONSUMER)
    request.group.name = group
    metadata = [m for m in signed(account) if m[0] != "x-mq-client-id"] + [("x-mq-client-id", client_id)]
    response = stub.Heartbeat(request, metadata=metadata, timeout=10)
    return response.status.code, response.status.message


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def official_client(address: str, ca: Path, account: str, *, topic: str, group: str, count: int,
                    node_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The official Python client over TLS in a child process (its TLS channel trusts gRPC's default
    roots, so the test CA goes in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH): sends ``count`` messages, then
    receives and acks them as ``group``. Returns what it sent and received."""
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca), **(node_env or {})}
    done = subprocess.run([sys.executable, str(CLIENT_CHILD), address, account, ACCOUNTS[account]["secret"], topic,
                           group, str(count)], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, f"the official client failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
