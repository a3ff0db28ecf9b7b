"""cluster_zk with the cluster secret against a real ZooKeeper: digest authentication, ACLs that
shut strangers out, signed registrations, and forged nodes that are never routed.

The stranger is a plain kazoo client on the same ZooKeeper, as an attacker on the network is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")
pytest.importorskip("cryptography", reason="the cluster secret's key derivation needs the serve extra")

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from plugmq.core import BrokerRegistration, ClusterView
from plugmq.core.errors import ClusterError
from plugmq.plugins.cluster_zk.options import ZkOptions
from plugmq.plugins.cluster_zk.security import ZkSecurity
from plugmq.plugins.cluster_zk.service import ZkClusterService
from plugmq.testing import ZooKeeperServer, wait_for

WAIT_S = 20.0


class Cluster:
    """Services of one test's own cluster (with or without the secret), and a stranger's client."""

    def __init__(self, hosts: str, directory: Path) -> None:
        self.hosts = hosts
        self.name = f"c{uuid.uuid4().hex[:8]}"
        self.secret = directory / "cluster.secret"
        self.secret.write_text("correct horse battery staple " * 2)
        self.secret.chmod(0o600)
        self.opened: list[ZkClusterService] = []
        self.stranger = KazooClient(hosts=hosts)
        self.stranger.start(timeout=10)

    def open(self, broker: str, *, secret: bool = True) -> ZkClusterService:
        options = ZkOptions(hosts=self.hosts, session_timeout_s=2.0, secret_file=str(self.secret) if secret else "")
        service = ZkClusterService(options, self.name, broker)
        self.opened.append(service)
        return service

    def register(self, service: ZkClusterService, broker: str, port: int) -> None:
        service.register(BrokerRegistration(self.name, broker, f"127.0.0.1:{port}"))

    def forged(self, broker: str, port: int) -> bytes:
        return json.dumps(BrokerRegistration(self.name, broker, f"127.0.0.1:{port}").as_dict()).encode()

    def close(self) -> None:
        for service in self.opened:
            service.close()
        self.stranger.stop()
        self.stranger.close()


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(zookeeper.hosts, tmp_path)
    yield made
    made.close()


def endpoints(view: ClusterView) -> dict[str, str]:
    return {b.key: b.endpoint for b in view.brokers}


def test_strangers_can_neither_read_nor_write_the_clusters_nodes(cluster: Cluster) -> None:
    member = cluster.open("broker-a")
    cluster.register(member, "broker-a", 1111)
    base = member.paths.base
    for attempt in (lambda: cluster.stranger.get_children(f"{base}/brokers"),
                    lambda: cluster.stranger.get(f"{base}/epochs"),
                    lambda: cluster.stranger.create(f"{base}/brokers/evil.0", b"{}", ephemeral=True),
                    lambda: cluster.stranger.set(f"{base}/changes", b"x"),
                    lambda: cluster.stranger.delete(f"{base}/brokers/broker-a.0")):
        with pytest.raises(NoAuthError):
            attempt()
    # A second member with the secret sees the first and is seen.
    other = cluster.open("broker-b")
    cluster.register(other, "broker-b", 2222)
    wait_for(lambda: endpoints(member.view()), WAIT_S, "both members in the view",
             until=lambda seen: set(seen) == {"broker-a.0", "broker-b.0"})
    # A broker without the secret is told why it cannot join.
    with pytest.raises(ClusterError, match="NoAuth.*secret_file"):
        cluster.open("broker-c", secret=False)


def test_a_forged_registration_is_never_routed_even_in_a_zookeeper_left_open(cluster: Cluster) -> None:
    member = cluster.open("broker-a")
    cluster.register(member, "broker-a", 1111)
    brokers = member.paths.brokers
    member.client.set_acls(brokers, OPEN_ACL_UNSAFE)  # the misconfiguration: an operator opened it
    with capture_logs() as logs:
        cluster.stranger.create(f"{brokers}/broker-a.1", cluster.forged("broker-a", 6666), ephemeral=True)
        wrong_key = ZkSecurity(b"another cluster's secret, 32 bytes long", cluster.name)
        body = BrokerRegistration(cluster.name, "broker-z", "127.0.0.1:7777").as_dict()
        cluster.stranger.create(f"{brokers}/broker-z.0", wrong_key.seal(body), ephemeral=True)
        member.client.set(member.paths.changes, b"")  # whatever fires the watch: the view is read again
        wait_for(lambda: [e for e in logs if e["event"] == "broker registration ignored (never routed)"], WAIT_S,
                 "both forgeries to be refused", until=lambda seen: {e["node"].rsplit("/", 1)[1] for e in seen}
                 >= {"broker-a.1", "broker-z.0"})
    assert endpoints(member.view()) == {"broker-a.0": "127.0.0.1:1111"}


def test_a_persistent_fake_node_does_not_take_over_a_restarted_brokers_routes(cluster: Cluster) -> None:
    watcher = cluster.open("watcher", secret=False)  # an open cluster: the fake can be written at all
    first = cluster.open("broker-a", secret=False)
    cluster.register(first, "broker-a", 1111)
    wait_for(lambda: endpoints(watcher.view()), WAIT_S, "the broker in the view", until=lambda e: "broker-a.0" in e)
    first.close()
    node = f"{watcher.paths.brokers}/broker-a.0"
    wait_for(lambda: cluster.stranger.exists(node), WAIT_S, "the stopped broker's node to go", until=lambda s: s is None)
    cluster.stranger.create(node, cluster.forged("broker-a", 6666))  # persistent: outlives any session
    watcher.client.set(watcher.paths.changes, b"")
    wait_for(lambda: endpoints(watcher.view()), WAIT_S, "the view to be read again", until=lambda e: not e)
    again = cluster.open("broker-a", secret=False)
    cluster.register(again, "broker-a", 1111)
    wait_for(lambda: endpoints(watcher.view()), WAIT_S, "the restarted broker to own its routes",
             until=lambda e: e == {"broker-a.0": "127.0.0.1:1111"})
    stat = cluster.stranger.exists(node)
    assert stat is not None and stat.ephemeralOwner == again.client.client_id[0]


def test_a_cluster_made_without_a_secret_is_closed_once_its_brokers_have_one(cluster: Cluster) -> None:
    old = cluster.open("broker-a", secret=False)
    cluster.register(old, "broker-a", 1111)
    base = old.paths.base
    assert cluster.stranger.get_children(f"{base}/brokers") == ["broker-a.0"]
    old.close()
    with capture_logs() as logs:
        cluster.open("broker-a")
    assert any(e["event"].startswith("ZooKeeper node had another ACL") for e in logs)
    with pytest.raises(NoAuthError):
        cluster.stranger.get_children(f"{base}/topics")
