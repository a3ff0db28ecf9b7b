"""``plugmq serve`` with the official Node.js client (npm ``rocketmq-client-nodejs``) on loopback.

The package is installed with npm into a per-session temporary directory (skipped, with npm's
answer, when Node.js, npm or the registry is not reachable). ``tests/nodejs/driver.js`` runs the
client and answers JSON commands. The server runs in this process on a ManualClock started at the
wall-clock time, so invisible times and delays pass when the test advances the clock.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")

from plugmq.broker.broker import Broker
from plugmq.core import Family, ManualClock, PluginDeclaration, StoredMessage, hookimpl
from plugmq.core.names import dlq_topic
from plugmq.server import ServerOptions, ServerThread
from plugmq.testing import wait_for

NODE_PACKAGE = "rocketmq-client-nodejs@1.0.8"
DRIVER = Path(__file__).parent / "nodejs" / "driver.js"
WAIT_S = 30.0  # upper bound of any one answer from the Node.js client


@pytest.fixture(scope="session")
def node_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The npm package, installed once per test session."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed (apt-get install nodejs npm); the Node.js client tests "
                    "need them")
    root = tmp_path_factory.mktemp("npm")
    try:
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(root), NODE_PACKAGE],
                       check=True, capture_output=True, text=True, timeout=300)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"npm could not install {NODE_PACKAGE} (registry unreachable?): {exc.stderr.strip()[-500:]}")
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm did not install {NODE_PACKAGE} within 300 s (registry unreachable?)")
    return root / "node_modules"


class NodeClient:
    """One ``node driver.js`` process: ``call`` sends a command and returns its answer."""

    def __init__(self, node_modules: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self._log = open(log, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(["node", str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, text=True,
                                        env={**os.environ, "NODE_PATH": str(node_modules), **(env or {})})
        self._ids = itertools.count()
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            reply = json.loads(line)
            if "event" in reply:
                self.events.put(reply)
                continue
            with self._answered:
                self._answers[reply["id"]] = reply
                self._answered.notify_all()

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        command_id = next(self._ids)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"id": command_id, "op": op, **args}) + "\n")
        self.process.stdin.flush()
        with self._answered:
            if not self._answered.wait_for(lambda: command_id in self._answers or self.process.poll() is not None,
                                           timeout=WAIT_S):
                raise AssertionError(f"the Node.js client did not answer {op} within {WAIT_S} s")
            reply = self._answers.pop(command_id, None)
        if reply is None:
            raise AssertionError(f"the Node.js client exited ({self.process.returncode}) during {op}")
        if not reply["ok"]:
            raise AssertionError(f"the Node.js client failed {op}: {reply['error']}")
        return reply

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.call("shutdown")
        except (AssertionError, OSError):
            pass
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self._log.close()


class NackLog:
    """A plugin object: the back-offs of the nacks (gave-up invisible changes) the broker applied."""

    name = "nack_log"

    def __init__(self) -> None:
        self.backoffs_ms: list[int] = []

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families={Family.EVENTS})

    @hookimpl
    def plugmq_message_invisible_changed(self, broker_name: str, consumer_group: str, message: StoredMessage,
                                         client_id: str, invisible_ms: int, gave_up: bool) -> None:
        if gave_up:
            self.backoffs_ms.append(invisible_ms)


@attrs.define
class Served:
    broker: Broker
    clock: ManualClock
    address: str
    node_modules: Path
    log: Path
    nacks: NackLog

    @contextmanager
    def client(self) -> Iterator[NodeClient]:
        client = NodeClient(self.node_modules, self.log)
        try:
            yield client
        finally:
            client.close()

    def receive_until(self, client: NodeClient, want: int, *, invisible_ms: int = 30_000) -> list[dict[str, Any]]:
        """Receive until ``want`` messages arrived or WAIT_S passed (each empty receive long-polls 1 s)."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < want and time.monotonic() < deadline:
            got.extend(client.call("receive", max=16, invisibleMs=invisible_ms)["messages"])
        return got


@pytest.fixture
def served(tmp_path: Path, node_modules: Path) -> Iterator[Served]:
    clock = ManualClock(start=time.time())
    groups = {"node-fifo": {"fifo": True},  # the broker's [groups] table
              "node-push": {"max_delivery_attempts": 3, "backoff_s": [5, 20]}}
    nacks = NackLog()
    broker = Broker.open(tmp_path / "data", clock=clock, groups=groups, plugin_objects={nacks.name: nacks},
                         plugins=["store_mmap", "delay_wheel", "filter_tag", "filter_sql", nacks.name])
    thread = ServerThread(broker, ServerOptions(long_polling_s=1.0, default_invisible_s=30.0))
    try:
        address = thread.start()
        yield Served(broker, clock, address, node_modules, tmp_path / "node.log", nacks)
    finally:
        thread.stop()
        broker.close()


def test_tagged_sends_received_through_a_tag_filter_uncorrupted(served: Served) -> None:
    bodies = {f"tagged-{i}-{os.urandom(8).hex()}": ("TagA" if i % 3 else "TagB") for i in range(24)}
    with served.client() as producer:
        producer.call("producer", endpoints=served.address, topics=["NodeTags"])
        for body, tag in bodies.items():
            producer.call("send", topic="NodeTags", body=body, tag=tag, keys=[f"k-{body[:9]}"],
                          properties={"origin": "node"})
    wanted = {body for body, tag in bodies.items() if tag == "TagA"}
    with served.client() as consumer:
        consumer.call("simple", endpoints=served.address, group="node-tags", topic="NodeTags", filter="TagA",
                      awaitMs=1000)
        got = served.receive_until(consumer, len(wanted))
        for message in got:
            consumer.call("ack", messageId=message["messageId"])
        assert consumer.call("receive", max=16, invisibleMs=30_000)["messages"] == []  # one 1 s long poll
    assert [m for m in got if m["corrupted"]] == [], "the Node.js client flagged messages as corrupted"
    assert {m["body"] for m in got} == wanted
    assert {m["tag"] for m in got} == {"TagA"}
    assert all(m["properties"] == {"origin": "node"} and m["keys"] == [f"k-{m['body'][:9]}"] for m in got)


def test_a_delayed_message_arrives_when_due(served: Served) -> None:
    due_ms = (int(served.clock.now()) + 60) * 1000  # a whole second, as clients send it
    with served.client() as producer:
        producer.call("producer", endpoints=served.address, topics=["NodeDelay"])
        producer.call("send", topic="NodeDelay", body="later", deliveryTimestampMs=due_ms)
    with served.client() as consumer:
        consumer.call("simple", endpoints=served.address, group="node-delay", topic="NodeDelay", awaitMs=1000)
        assert consumer.call("receive", max=4, invisibleMs=30_000)["messages"] == []
        served.clock.advance(59.0)
        assert consumer.call("receive", max=4, invisibleMs=30_000)["messages"] == []
        served.clock.advance(2.0)  # past the due time and the delay plugin's tick
        got = served.receive_until(consumer, 1)
        assert [m["body"] for m in got] == ["later"]
        assert not got[0]["corrupted"]
        consumer.call("ack", messageId=got[0]["messageId"])


def test_fifo_groups_arrive_in_send_order(served: Served) -> None:
    with served.client() as producer:
        producer.call("producer", endpoints=served.address, topics=["NodeFifo"])
        for i in range(8):
            for group in ("order-1", "order-2"):
                producer.call("send", topic="NodeFifo", body=f"{group}:{i}", messageGroup=group)
    seen: dict[str, list[int]] = {"order-1": [], "order-2": []}
    with served.client() as consumer:
        consumer.call("simple", endpoints=served.address, group="node-fifo", topic="NodeFifo", awaitMs=1000)
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, seen.values())) < 16 and time.monotonic() < deadline:
            for message in consumer.call("receive", max=16, invisibleMs=30_000)["messages"]:
                group, index = message["body"].split(":")
                assert message["messageGroup"] == group and not message["corrupted"]
                seen[group].append(int(index))
                consumer.call("ack", messageId=message["messageId"])
    assert seen == {"order-1": list(range(8)), "order-2": list(range(8))}


@pytest.mark.slow
def test_push_consumer_failures_retried_on_the_groups_schedule_then_dead_lettered(served: Served) -> None:
    """Group node-push: 3 attempts, back-off 5 s then 20 s, whatever delay the Node.js client asks for."""
    with served.client() as producer:
        producer.call("producer", endpoints=served.address, topics=["NodePush"])
        message_id = producer.call("send", topic="NodePush", body="fails")["messageId"]
    with served.client() as consumer:
        consumer.call("push", endpoints=served.address, group="node-push", topic="NodePush", awaitMs=1000,
                      fail=True)

        def next_attempt(timeout: float) -> dict[str, Any] | None:
            try:
                return consumer.events.get(timeout=timeout)
            except queue.Empty:
                return None

        def wait_for_attempt(backoff_s: float, failed: int) -> tuple[dict[str, Any], float]:
            """Once the client's nack of attempt ``failed`` reached the broker (the back-off counts from
            there), advance the broker clock in steps until the next attempt; it may not come before
            ``backoff_s``."""
            wait_for(lambda: len(served.nacks.backoffs_ms) >= failed, WAIT_S, "the client's nack", interval=0.05)
            assert served.nacks.backoffs_ms[failed - 1] >= backoff_s * 1000, served.nacks.backoffs_ms
            waited = 0.0
            while waited < backoff_s + 120:
                step = backoff_s - 1 if waited == 0 else 2.0
                served.clock.advance(step)
                waited += step
                attempt = next_attempt(2.0)
                if attempt is not None:
                    assert waited >= backoff_s, f"redelivered {waited:g} s after a failure; the back-off is {backoff_s:g} s"
                    return attempt, waited
            raise AssertionError(f"no redelivery within {waited:g} s of broker time")

        first = next_attempt(WAIT_S)
        assert first is not None and first["messageId"] == message_id and first["deliveryAttempt"] == 1
        assert next_attempt(2.0) is None, "redelivered at once; the group's first back-off is 5 s"
        second, _ = wait_for_attempt(5.0, failed=1)
        assert second["messageId"] == message_id and second["deliveryAttempt"] == 2
        third, _ = wait_for_attempt(20.0, failed=2)
        assert third["messageId"] == message_id and third["deliveryAttempt"] == 3
        dlq = dlq_topic("node-push")

        def dead_letters() -> int:
            served.clock.advance(30.0)  # past any invisible time the client asked for
            queues = served.broker.topic_queues(dlq, create=False) if served.broker.topics.get(dlq) else []
            return sum(served.broker.max_offset(q) for q in queues)

        # the client's nack and the server's dead-lettering run on their own threads
        wait_for(dead_letters, WAIT_S, "the message in the group's dead-letter queue", until=lambda n: n == 1,
                 interval=0.2)
        assert next_attempt(2.0) is None, "delivered again after its last attempt"
