"""``[server] workers = N``: front-end processes check sends and hand them to the store's process.

The hand-off keeps every field of a checked message; with two front-ends every message sent
(generated stubs on several connections, one and eight messages per request, and the official
producer) is received exactly once through the relayed receive and ack calls, with its tag, keys
and properties, as one process serves them; a retried send is stored once; the front-ends
refuse unsigned and unpermitted sends and read the accounts again on the owner's SIGHUP; a
failover broker's front-ends relay sends to its service (which forwards them); a front-end
killed with SIGKILL is started again and the port keeps serving."""

from __future__ import annotations

import marshal
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

import attrs
import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from plugmq.server.acl import Account
from plugmq.server.auth import Authenticator
from plugmq.server.convert import Outgoing
from plugmq.server.frontend import _Relay
from plugmq.server.handoff import decode_call, encode_call
from plugmq.server.options import AclOptions
from plugmq.server.protocol import Code, MessageType, MessagingServiceStub, service_pb2
from plugmq.server.send import SendRequest, check_send
from plugmq.testing import ZooKeeperServer, await_listening, wait_for

_SERVE = ("from plugmq.cli import main; from plugmq.cli.serve import command; "
          "main.add_command(command); main()")
WAIT_S = 30.0
TOPIC = "Workers"


def _request(specs: list[dict[str, Any]]) -> service_pb2.SendMessageRequest:
    request = service_pb2.SendMessageRequest()
    for spec in specs:
        message = request.messages.add(body=spec.get("body", b"b"))
        message.topic.name = spec.get("topic", TOPIC)
        props = message.system_properties
        props.message_id = spec["id"]
        props.message_type = spec.get("type", MessageType.NORMAL)
        if "tag" in spec:
            props.tag = spec["tag"]
        props.keys.extend(spec.get("keys", ()))
        if "group" in spec:
            props.message_group = spec["group"]
        if "at" in spec:
            props.delivery_timestamp.FromMilliseconds(spec["at"])
        if "trace" in spec:
            props.trace_context = spec["trace"]
        if "priority" in spec:
            props.priority = spec["priority"]
        message.user_properties.update(spec.get("props", {}))
    return request


def test_the_hand_off_keeps_every_field_and_every_failure() -> None:
    request = _request([
        {"id": "plain"},
        {"id": "full", "tag": "TagA", "keys": ["k1", "k2"], "props": {"a": "1", "b": "x y"}, "trace": "00-ab-cd-01",
         "body": bytes(range(256))},
        {"id": "fifo", "type": MessageType.FIFO, "group": "order-7"},
        {"id": "later", "type": MessageType.DELAY, "at": 4_000_000_000_000},
        {"id": "urgent", "type": MessageType.PRIORITY, "priority": 7},
        {"id": "bad", "topic": "no such topic!"},
        {"id": "system", "topic": "SCHEDULE_TOPIC_XXXX"},
    ])
    account = attrs.evolve(Account(secret="s3cret"), access_key="producer-1")
    checked = check_send(SendRequest(request.messages, account, "client-1"), Authenticator(AclOptions()), 1 << 20)
    back = decode_call(marshal.loads(marshal.dumps(encode_call(checked))))  # a frame's own encoding
    assert back.client_id == "client-1"
    assert back.account == "producer-1"  # the rate limit the owner applies is the sender's
    assert back.items == checked.items  # Outgoing and Message compare every field; entries as protobuf
    outs = [item for item in back.items if isinstance(item, Outgoing)]
    assert [o.message_id for o in outs] == ["plain", "full", "fifo", "later", "urgent"]
    assert outs[1].message.keys == ("k1", "k2") and outs[1].message.properties == {"a": "1", "b": "x y"}
    assert outs[2].message_group == "order-7" and outs[2].message.message_group == "order-7"
    assert outs[3].message.deliver_at_ms == 4_000_000_000_000 and outs[4].message.priority == 7
    failed = [item for item in back.items if not isinstance(item, Outgoing)]
    assert [f.message_id for f in failed] == ["bad", "system"]
    assert {f.status.code for f in failed} == {Code.ILLEGAL_TOPIC}


_SPECS = st.sampled_from([
    {}, {"tag": "TagA"}, {"tag": "TagB", "body": bytes(range(256))}, {"trace": "00-ab-cd-01"}, {"keys": ["k1"]},
    {"props": {"a": "1"}}, {"type": MessageType.FIFO, "group": "g-1"}, {"type": MessageType.PRIORITY, "priority": 3},
    {"type": MessageType.DELAY, "at": 4_000_000_000_000}, {"topic": "Other"}, {"topic": "bad topic!"},
    {"type": MessageType.FIFO}, {"tag": "", "body": b""},
])


@settings(max_examples=60, deadline=None)
@given(st.lists(_SPECS, min_size=1, max_size=12))
def test_a_call_in_columns_comes_back_as_it_was_checked(specs: list[dict[str, Any]]) -> None:
    """Common messages travel as columns, the others as tuples, failures as entry bytes: whatever
    the mix, the owner gets back what the front-end checked, in order."""
    request = _request([{**spec, "id": f"m-{i}"} for i, spec in enumerate(specs)])
    checked = check_send(SendRequest(request.messages, None, "client-2"), Authenticator(AclOptions()), 1 << 20)
    back = decode_call(marshal.loads(marshal.dumps(encode_call(checked))))
    assert back.items == checked.items and back.client_id == "client-2" and back.account is None
    assert (back.on_loop, back.transactional) == (checked.on_loop, checked.transactional)


class _Server:
    """``plugmq serve`` with ``workers`` front-ends, as a child process."""

    def __init__(self, tmp: Path, workers: int) -> None:
        config = tmp / "broker.toml"
        config.write_text(f'[broker]\ndata_dir = "data"\nplugins = ["store_mmap", "filter_tag"]\n'
                          f'[server]\nlong_polling_s = 1\nworkers = {workers}\n', encoding="utf-8")
        self.log = tmp / "serve.log"
        self._log = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, "--log-level", "info", "serve", "--config", str(config),
             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=self._log, cwd=tmp)
        address = await_listening(self.process, WAIT_S)
        if address is None:
            self.process.kill()
            raise AssertionError(f"plugmq serve did not come up; exit code {self.process.wait()}; see {self.log}")
        self.address = address

    def frontends(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children
                if b"plugmq.server.frontend" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()  # never leave a server behind
            self.process.wait()
            raise
        finally:
            self._log.close()


@contextmanager
def _serving(tmp: Path, workers: int) -> Iterator[_Server]:
    server = _Server(tmp, workers)
    try:
        yield server
    finally:
        assert server.stop() == 0, f"unclean shutdown; see {server.log}"


def _stub_sends(address: str, prefix: str, requests: int, per_request: int) -> list[str]:
    ids: list[str] = []
    # A connection of its own: gRPC shares one between a process's channels to the same address,
    # which would put every thread's calls on one front-end.
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = MessagingServiceStub(channel)
        for i in range(requests):
            specs: list[dict[str, Any]] = [{"id": f"{prefix}-{i}-{k}", "tag": "TagW", "keys": [f"key{i}"], "props": {"n": str(k)},
                      "body": f"{prefix}-{i}-{k}".encode()} for k in range(per_request)]
            response = stub.SendMessage(_request(specs), timeout=10)
            assert response.status.code == Code.OK, response.status.message
            assert [e.message_id for e in response.entries] == [s["id"] for s in specs]
            ids.extend(s["id"] for s in specs)
    return ids


def _retried_send(address: str) -> str:
    """A send and the client's retry of it (same message id) on new connections: the owner's
    RecentSends answers the retry with the stored copy, whichever front-end took it."""
    offsets = []
    for _try in range(2):
        with grpc.insecure_channel(address) as channel:
            response = MessagingServiceStub(channel).SendMessage(
                _request([{"id": "retried", "tag": "TagW", "keys": ["key-r"], "props": {"n": "0"}, "body": b"retried"}]),
                timeout=10)
        assert response.status.code == Code.OK, response.status.message
        offsets.append(response.entries[0].offset)
    assert offsets[0] == offsets[1]
    return "retried"


@attrs.frozen
class _CallDetails(grpc.HandlerCallDetails):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


def test_a_failover_brokers_front_ends_relay_sends_to_its_service() -> None:
    """A failover broker forwards sends while it is not surely the master, which only its own gRPC
    service does: its front-ends relay SendMessage instead of handing the checked call over."""
    owner = grpc.insecure_channel("unix:/nonexistent/grpc.sock")  # never called: handlers only
    try:
        details = _CallDetails(f"/{service_pb2.DESCRIPTOR.services_by_name['MessagingService'].full_name}/SendMessage")
        auth = Authenticator(AclOptions())
        handing = _Relay(owner, None, auth, 1 << 20, relay_sends=False).service(details)  # type: ignore[arg-type]
        relaying = _Relay(owner, None, auth, 1 << 20, relay_sends=True).service(details)  # type: ignore[arg-type]
    finally:
        owner.close()
    raw = _request([{"id": "m"}]).SerializeToString()
    assert handing is not None and handing.request_deserializer is not None
    assert isinstance(handing.request_deserializer(raw), service_pb2.SendMessageRequest)  # checked here
    assert relaying is not None and relaying.request_deserializer is not None
    assert relaying.request_deserializer(raw) == raw  # passed on as bytes


def _config(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=5)


def _receive_all(address: str, expected: int) -> list[Any]:
    consumer = SimpleConsumer(_config(address), "workers-g", {TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    got: list[Any] = []
    try:
        deadline = time.monotonic() + WAIT_S * 2
        while len(got) < expected and time.monotonic() < deadline:
            for message in consumer.receive(32, 30):
                got.append(message)
                consumer.ack(message)
        got.extend(consumer.receive(32, 30))  # nothing more may come
    finally:
        consumer.shutdown()
    return got


def test_two_front_ends_deliver_every_message_once(tmp_path: Path) -> None:
    with _serving(tmp_path, workers=2) as server:
        assert len(server.frontends()) == 2
        sent: list[str] = []
        lock = threading.Lock()

        def send(index: int) -> None:  # one channel (one connection) per thread: spread over the front-ends
            ids = _stub_sends(server.address, f"t{index}", 12, 1 if index % 2 else 8)
            with lock:
                sent.extend(ids)

        with ThreadPoolExecutor(4) as pool:  # a failed thread's error is raised here
            list(pool.map(send, range(4)))
        sent.append(_retried_send(server.address))
        producer = Producer(_config(server.address), (TOPIC,))
        producer.startup()
        try:
            for i in range(5):
                message = Message()
                message.topic, message.body, message.tag = TOPIC, f"official-{i}".encode(), "TagW"
                message.keys = f"key{i}"
                message.add_property("n", "0")
                sent.append(producer.send(message).message_id)
        finally:
            producer.shutdown()
        got = _receive_all(server.address, len(sent))
    ids = [m.message_id for m in got]
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    assert set(ids) == set(sent)
    for message in got:
        assert message.tag == "TagW" and message.properties.get("n") is not None and message.keys
        if not message.body.startswith(b"official-"):
            assert message.body.decode() == message.message_id  # the stubs' bodies are their ids


def test_a_failover_slave_with_front_ends_forwards_sends_to_its_master(tmp_path: Path,
                                                                       zookeeper: ZooKeeperServer) -> None:
    """End to end: two failover brokers with two front-ends each; a send to the slave's port is
    relayed to the slave's service, which forwards it to the master: stored there, answered OK
    (a hand-off would have put it on the slave, which refuses writes)."""
    from tests.fault_harness import running_pair

    with running_pair(tmp_path, zookeeper, mode="sync_master", server="workers = 2\n") as pair:
        master = pair.master()
        slave = 1 - master
        acked_before = sum(_acked(pair.status(master)).values())
        with grpc.insecure_channel(pair.addresses[slave]) as channel:
            response = MessagingServiceStub(channel).SendMessage(
                _request([{"id": f"via-slave-{k}", "topic": "FaultTopic"} for k in range(3)]), timeout=10)
        assert response.status.code == Code.OK, response.status.message
        assert sum(_acked(pair.status(master)).values()) == acked_before + 3  # the master answered them
        assert sum(_acked(pair.status(slave)).values()) == 0


def _acked(status: dict[str, Any] | None) -> dict[str, int]:
    assert status is not None
    acked: dict[str, int] = status["acked_by_epoch"]
    return acked


def _send_status(address: str, metadata: list[tuple[str, str]]) -> int:
    """One send on a new connection (the kernel spreads connections over the front-ends)."""
    with grpc.insecure_channel(address) as channel:
        response = MessagingServiceStub(channel).SendMessage(
            _request([{"id": f"acl-{time.monotonic_ns()}"}]), metadata=metadata, timeout=10)
    return int(response.status.code)


def test_front_ends_check_sends_against_the_accounts_and_reload_them_on_sighup(tmp_path: Path) -> None:
    from plugmq.server.admin import signature_metadata
    from plugmq.testing import ServeProcess
    from tests.security_helpers import toml_accounts, write_config

    accounts = tmp_path / "accounts.toml"
    writer = {"secret": "writer-secret", "publish": ["*"], "subscribe": ["*"]}
    reader = {"secret": "reader-secret", "publish": ["Other"], "subscribe": ["*"]}
    accounts.write_text(toml_accounts({"writer": writer, "reader": reader}, prefix="accounts"), encoding="utf-8")
    # The file is checked once an hour: only SIGHUP can make the front-ends read it again in time.
    config = write_config(tmp_path, certs=None, acl=False, server="workers = 2\n",
                          extra='[server.acl]\nenabled = true\naccounts_file = "accounts.toml"\nreload_check_s = 3600\n')
    server = ServeProcess(config)
    try:
        address = server.await_address()
        writing = signature_metadata("writer", "writer-secret")
        for _connection in range(6):
            assert _send_status(address, [("x-mq-client-id", "anonymous")]) == Code.UNAUTHORIZED
            assert _send_status(address, signature_metadata("reader", "reader-secret")) == Code.FORBIDDEN
            assert _send_status(address, writing) == Code.OK
        accounts.write_text(toml_accounts({"reader": reader}, prefix="accounts"), encoding="utf-8")
        server.process.send_signal(signal.SIGHUP)
        wait_for(lambda: all(_send_status(address, writing) == Code.UNAUTHORIZED for _ in range(6)), WAIT_S,
                 "every front-end to refuse the removed account", interval=0.1)
    finally:
        server.stop()


def test_a_killed_front_end_is_started_again(tmp_path: Path) -> None:
    with _serving(tmp_path, workers=2) as server:
        victim = server.frontends()[0]
        os.kill(victim, signal.SIGKILL)  # delivered asynchronously: the victim may still run a moment

        def replaced() -> bool:  # one snapshot: two reads could see the victim alive, then gone
            pids = server.frontends()
            return len(pids) == 2 and victim not in pids

        wait_for(replaced, WAIT_S, "a new front-end in place of the killed one", interval=0.1)
        ids = _stub_sends(server.address, "after", 4, 2)  # the port serves on
        got = _receive_all(server.address, len(ids))
        assert sorted(m.message_id for m in got) == sorted(ids)
    assert "front-end worker exited; starting it again" in server.log.read_text()
