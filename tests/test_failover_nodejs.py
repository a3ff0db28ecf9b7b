"""The official Node.js client through a failover: kill -9 of the master, sends and receives back in seconds.

grpc-js cannot dial an Endpoints of several addresses the way the Node.js client joins them, so
its routes name a failover master's peer as a queue entry of its own (``x-mq-language: HTTP``):
a send that fails sets the dead master's endpoints aside and the next goes to the peer, and the
simple consumer reads the route's entries in turn; the peer forwards to the master until it is
elected itself. The client's access point is the peer (the Node.js client dials one address).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.testing import ZooKeeperServer
from tests.fault_harness import TOPIC, Pair, running_pair
from tests.test_server_nodejs import NodeClient, node_modules  # noqa: F401 - the npm package fixture

pytestmark = pytest.mark.slow  # ZooKeeper, two serve children, the Node.js client, a kill

SESSION_S = 2.0


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Pair]:
    with running_pair(tmp_path, zookeeper, mode="sync_master", session_timeout_s=SESSION_S) as made:
        yield made


def _first_success(attempt: object, deadline_s: float) -> float | None:
    """Seconds until ``attempt()`` (a Node.js client call) first succeeds; None past the deadline."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        try:
            if attempt():  # type: ignore[operator]
                return time.monotonic() - started
        except AssertionError:  # the client's call failed: the next one may not
            pass
    return None


def test_the_node_client_sends_and_receives_again_within_seconds_of_a_kill_9(
        pair: Pair, node_modules: Path, tmp_path: Path) -> None:  # noqa: F811
    master = pair.master()
    peer = pair.addresses[1 - master]
    node = NodeClient(node_modules, tmp_path / "node.log")
    try:
        node.call("producer", endpoints=peer, topics=[TOPIC])
        node.call("simple", endpoints=peer, group="node-readers", topic=TOPIC, awaitMs=1000)
        for i in range(10):
            node.call("send", topic=TOPIC, body=f"before-{i}")
        received = node.call("receive", max=16, invisibleMs=15000)["messages"]
        assert received, "the Node.js client reads through the route before the fault"
        pair.kill(master)
        sends_back = _first_success(lambda: node.call("send", topic=TOPIC, body="after") is not None, 30)
        receives_back = _first_success(lambda: bool(node.call("receive", max=16, invisibleMs=15000)["messages"]), 30)
    finally:
        node.close()
    print(f"Node.js client: sends back {sends_back} s after the kill, receives {receives_back} s after that")
    assert sends_back is not None and sends_back <= SESSION_S + 2.0
    assert receives_back is not None and receives_back <= SESSION_S + 2.0
