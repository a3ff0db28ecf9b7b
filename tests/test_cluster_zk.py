"""cluster_zk against a real ZooKeeper: registrations, views, topics, lost sessions, elections, config.

Sessions are made to expire for real: a second client attaches to the same session and closes
it, which is what ZooKeeper does to a session whose owner went silent.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")

from kazoo.client import KazooClient

from plugmq.admin.cluster_session import open_cluster_service
from plugmq.broker.broker import Broker
from plugmq.chaos.forwarder import Forwarder
from plugmq.core import BrokerRegistration, ClusterView, ConfigError
from plugmq.core.contracts.cluster import ClusterTopic, Mastership, TopicPermission, TopicRegistration
from plugmq.core.errors import ClusterError, PluginError
from plugmq.plugins.cluster_zk.options import ZkOptions
from plugmq.plugins.cluster_zk.service import ZkClusterService
from plugmq.testing import ZooKeeperServer, wait_for

WAIT_S = 20.0


def expire(service: ZkClusterService, hosts: str) -> None:
    """End ``service``'s session from outside, as ZooKeeper does when its owner goes silent."""
    session_id, password = service.client.client_id
    intruder = KazooClient(hosts=hosts, client_id=(session_id, password))
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


class Services:
    """Cluster services of one test's own cluster, all closed at the end."""

    def __init__(self, hosts: str) -> None:
        self.hosts = hosts
        self.cluster = f"c{uuid.uuid4().hex[:8]}"
        self.opened: list[ZkClusterService] = []

    def open(self, broker: str, session_timeout_s: float = 2.0) -> ZkClusterService:
        service = ZkClusterService(ZkOptions(hosts=self.hosts, session_timeout_s=session_timeout_s),
                                   self.cluster, broker)
        self.opened.append(service)
        return service

    def registration(self, broker: str, port: int, **fields: Any) -> BrokerRegistration:
        return BrokerRegistration(self.cluster, broker, f"127.0.0.1:{port}", **fields)


@pytest.fixture
def services(zookeeper: ZooKeeperServer) -> Iterator[Services]:
    made = Services(zookeeper.hosts)
    try:
        yield made
    finally:
        for service in made.opened:
            service.close()


def keys(view: ClusterView) -> list[str]:
    return [b.key for b in view.brokers]


# ------------------------------------------------------------------------------------- registrations
def test_registrations_reach_every_view_and_leave_with_the_session(services: Services) -> None:
    a, b = services.open("broker-a"), services.open("broker-b")
    seen: list[ClusterView] = []
    b.subscribe(seen.append)
    a.register(services.registration("broker-a", 1001, room="east", topics={"T": TopicRegistration(4)}))
    b.register(services.registration("broker-b", 1002))
    wait_for(lambda: keys(b.view()) == ["broker-a.0", "broker-b.0"], WAIT_S, "both brokers in b's view")
    assert b.view().broker("broker-a") == services.registration("broker-a", 1001, room="east",
                                                                 topics={"T": TopicRegistration(4)})

    a.update_topics({"T": TopicRegistration(8), "%DLQ%g": TopicRegistration(1, TopicPermission.READ)})
    wait_for(lambda: b.view().broker("broker-a"), WAIT_S, "a's grown topic in b's view",
             until=lambda reg: reg is not None and reg.topics["T"].queue_count == 8)
    assert b.view().broker("broker-a").topics["%DLQ%g"].permission is TopicPermission.READ  # type: ignore[union-attr]

    a.declare_topic("U", ClusterTopic(4, auto_created=True))
    a.declare_topic("U", ClusterTopic(2, auto_created=True))  # never shrinks
    wait_for(lambda: "U" in b.view().topics, WAIT_S, "the declaration in b's view")
    assert b.view().topics["U"] == ClusterTopic(4, auto_created=True)
    a.declare_topic("U", ClusterTopic(6))  # an explicit declaration outranks an automatic one
    wait_for(lambda: b.view().topics["U"] == ClusterTopic(6), WAIT_S, "the explicit declaration")

    a.close()
    wait_for(lambda: keys(b.view()) == ["broker-b.0"], WAIT_S, "a gone from b's view")
    assert all(isinstance(v, ClusterView) for v in seen) and seen[0].brokers == ()


def test_unregister_removes_the_broker_at_once_and_the_session_stays(services: Services) -> None:
    a, b = services.open("broker-a"), services.open("broker-b")
    a.register(services.registration("broker-a", 1001))
    wait_for(lambda: keys(b.view()) == ["broker-a.0"], WAIT_S, "a registered")
    a.unregister()
    wait_for(lambda: keys(b.view()) == [], WAIT_S, "a unregistered")
    assert a.connected


def test_an_expired_session_is_logged_and_the_broker_registers_again(services: Services) -> None:
    a, b = services.open("broker-a"), services.open("broker-b")
    a.register(services.registration("broker-a", 1001))
    wait_for(lambda: keys(b.view()) == ["broker-a.0"], WAIT_S, "a registered")
    old_session = a.client.client_id[0]
    left = threading.Event()
    b.subscribe(lambda view: left.set() if not view.brokers else None)
    with capture_logs() as logs:
        expire(a, services.hosts)
        wait_for(left.is_set, WAIT_S, "a out of b's view when its session ended")
        wait_for(lambda: keys(b.view()) == ["broker-a.0"], WAIT_S, "a registered again")
    assert a.client.client_id[0] != old_session
    events = [entry["event"] for entry in logs]
    assert any(e.startswith("ZooKeeper session expired") for e in events), events
    assert "ZooKeeper session renewed; registering again" in events


def test_a_name_still_held_by_an_earlier_session_is_taken_once_that_session_ends(services: Services) -> None:
    earlier, later, watcher = services.open("broker-x"), services.open("broker-x"), services.open("watcher")
    earlier.register(services.registration("broker-x", 1001))
    with capture_logs() as logs:
        later.register(services.registration("broker-x", 2002))
    assert any("still registered by another ZooKeeper session" in e["event"] for e in logs)
    wait_for(lambda: keys(watcher.view()) == ["broker-x.0"], WAIT_S, "broker-x registered")
    assert watcher.view().brokers[0].endpoint == "127.0.0.1:1001"
    earlier.close()  # as a crashed run's session timing out
    wait_for(lambda: [b.endpoint for b in watcher.view().brokers], WAIT_S, "the later run registered",
             until=lambda endpoints: endpoints == ["127.0.0.1:2002"])


def test_a_registration_for_another_cluster_is_refused(services: Services) -> None:
    service = services.open("broker-a")
    with pytest.raises(ClusterError, match="cluster 'other'"):
        service.register(BrokerRegistration("other", "broker-a", "127.0.0.1:1"))
    with pytest.raises(ClusterError, match="register the broker first"):
        service.campaign(lambda _m: None)


# ------------------------------------------------------------------------------------- elections
def test_elections_grant_growing_epochs_and_a_master_whose_session_expired_is_fenced(services: Services) -> None:
    master, standby, watcher = services.open("broker-e"), services.open("broker-e"), services.open("watcher")
    master.register(services.registration("broker-e", 1001))
    standby.register(services.registration("broker-e", 1002, broker_id=1, role="slave"))
    told: dict[str, list[Mastership | None]] = {"master": [], "standby": []}
    master.campaign(told["master"].append)
    wait_for(lambda: told["master"] != [], WAIT_S, "the first election")
    first = told["master"][0]
    assert first is not None and first.broker_id == 0 and first.epoch == watcher.current_epoch("broker-e") >= 1
    standby.campaign(told["standby"].append)
    wait_for(lambda: watcher.view().broker("broker-e"), WAIT_S, "the master's epoch in its registration",
             until=lambda reg: reg is not None and reg.epoch == first.epoch)
    assert told["standby"] == []  # one master per broker name

    expire(master, services.hosts)
    wait_for(lambda: told["standby"] != [], WAIT_S, "the standby elected")
    second = told["standby"][0]
    assert second is not None and second.broker_id == 1 and second.epoch == first.epoch + 1
    assert watcher.current_epoch("broker-e") == second.epoch
    wait_for(lambda: None in told["master"], WAIT_S, "the old master told it lost mastership")
    wait_for(lambda: watcher.view().broker("broker-e"), WAIT_S, "the old master's registration without an epoch",
             until=lambda reg: reg is not None and reg.epoch == 0)

    standby.withdraw()
    wait_for(lambda: len(told["master"]) >= 3, WAIT_S, "the old master elected again after the withdrawal")
    third = told["master"][-1]
    assert third is not None and third.epoch == second.epoch + 1
    assert told["standby"][-1] is None


# ------------------------------------------------------------------------------------- failures
def test_the_broker_survives_zookeeper_going_away_and_comes_back_registered(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    services = Services(server.hosts)
    try:
        a = services.open("broker-a", session_timeout_s=20)
        a.register(services.registration("broker-a", 1001))
        server.stop()
        wait_for(lambda: not a.connected and not a.view().connected, WAIT_S, "the lost connection noticed")
        started = time.monotonic()
        a.update_topics({"Late": TopicRegistration(2)})  # recorded, published when ZooKeeper is back
        with pytest.raises(ClusterError, match="cannot declare topic"):
            a.declare_topic("Late", ClusterTopic(2))
        assert time.monotonic() - started < 15  # the broker's threads are never held for long
        server.start()
        wait_for(lambda: a.connected and a.view().connected, WAIT_S, "reconnected")
        b = services.open("broker-b")
        wait_for(lambda: b.view().broker("broker-a"), WAIT_S,
                 "a's registration with the topic recorded while ZooKeeper was away",
                 until=lambda reg: reg is not None and "Late" in reg.topics)
    finally:
        for service in services.opened:
            service.close()
        server.stop()


def test_a_stopping_broker_gives_up_a_call_zookeeper_does_not_answer(zookeeper: ZooKeeperServer) -> None:
    assert zookeeper.port is not None
    link = Forwarder("zk", ("127.0.0.1", zookeeper.port))
    services = Services(link.address)
    try:
        member = services.open("broker-a", session_timeout_s=20)  # each call may wait 10 s
        member.register(services.registration("broker-a", 1001))
        link.freeze()  # connected, never answered: a ZooKeeper cut off behind a live socket
        member._watched()  # what a kazoo watch does: a view read queued, waiting on the frozen link
        closing = threading.Thread(target=member.close)
        closing.start()
        # The service's worker gives its call up at once; kazoo itself then waits for its close
        # request's answer until its ping timeout (a bound of its own, outside this service).
        member._worker.join(timeout=5)
        assert not member._worker.is_alive()
        link.heal()
        closing.join()
    finally:
        for service in services.opened:
            service.close()
        link.stop()


def test_an_unreachable_zookeeper_is_a_clear_error() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ClusterError, match=rf"cannot reach ZooKeeper at 127.0.0.1:{port} within 1 s.*start ZooKeeper"):
        ZkClusterService(ZkOptions(hosts=f"127.0.0.1:{port}", connect_timeout_s=1), "c", "broker-a")


# ------------------------------------------------------------------------------------- admin
def test_an_admin_session_from_a_broker_config_sees_the_cluster_at_once(services: Services, tmp_path: Path) -> None:
    member = services.open("broker-a")
    member.register(services.registration("broker-a", 1001, room="east", topics={"T": TopicRegistration(4)}))
    config = _config(tmp_path, broker={"name": "admin"}, cluster={"name": services.cluster},
                     plugins={"cluster_zk": {"hosts": services.hosts}})
    admin = open_cluster_service(config)
    try:
        listed = admin.view().as_dict()  # no waiting: the view is read before the service is returned
        assert [(b["broker_name"], b["room"], b["role"], b["endpoint"], b["topics"]) for b in listed["brokers"]] == [
            ("broker-a", "east", "async_master", "127.0.0.1:1001", {"T": {"queues": 4, "perm": 6}})]
        admin.declare_topic("Orders", ClusterTopic(8))
        wait_for(lambda: member.view().topics.get("Orders") == ClusterTopic(8), WAIT_S, "the declaration at the member")
        assert not (tmp_path / "data").exists()  # the broker itself was not opened
    finally:
        admin.close()
    with pytest.raises(ConfigError, match="names no cluster"):
        open_cluster_service(_config(tmp_path))
    with pytest.raises(PluginError, match="lists no cluster plugin; add one of: cluster_zk"):
        open_cluster_service(_config(tmp_path, broker={"plugins": ["store_mmap"]}, cluster={"name": "x"}))


# ------------------------------------------------------------------------------------- configuration
def _config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    broker = {"name": "broker-a", "data_dir": str(tmp_path / "data"),
              "plugins": ["store_mmap", "alloc", "cluster_zk"], **sections.pop("broker", {})}
    return {"broker": broker, **sections}


def test_a_broker_in_a_cluster_opens_its_session_and_closes_it(zookeeper: ZooKeeperServer,
                                                               tmp_path: Path) -> None:
    cluster = f"c{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, broker={"room": "east"}, cluster={"name": cluster},
                     plugins={"cluster_zk": {"hosts": zookeeper.hosts, "session_timeout_s": 2}})
    broker = Broker.from_config(config)
    try:
        assert broker.cluster is not None and broker.cluster.connected
        assert broker.config.room == "east" and broker.config.cluster_name == cluster
    finally:
        broker.close()
    assert broker.cluster is not None and not broker.cluster.connected


@pytest.mark.parametrize(("sections", "error", "message"), [
    ({"cluster": {"name": "prod"}, "broker": {"plugins": ["store_mmap"]}}, PluginError,
     r"\[cluster\] name = 'prod' needs a cluster plugin in broker.plugins; add one of: cluster_zk"),
    ({}, PluginError, r"plugin 'cluster_zk' joins a cluster but the config names none; add \[cluster\]"),
    ({"cluster": {}}, ConfigError, r"\[cluster\] has no name"),
    ({"cluster": {"name": "prod", "hosts": "x"}}, ConfigError, r"cluster.hosts: unknown key"),
    ({"cluster": {"name": "a/b"}}, ConfigError, r"cluster.name: cluster name 'a/b' contains '/'"),
    ({"broker": {"name": "east@broker-a"}}, ConfigError, r"broker.name: broker name 'east@broker-a' contains '@'"),
    ({"broker": {"room": "east room"}}, ConfigError, r"broker.room: machine room name 'east room' contains ' '"),
    ({"broker": {"role": "slave"}}, ConfigError, r"a master has broker_id 0 and a slave a broker_id above 0"),
    ({"broker": {"broker_id": 1}}, ConfigError, r"a master has broker_id 0 and a slave a broker_id above 0"),
    ({"broker": {"role": "leader"}}, ConfigError, r"broker.role must be one of async_master, sync_master, slave"),
    ({"cluster": {"name": "prod"}, "plugins": {"cluster_zk": {"hosts": "zk1"}}}, ConfigError,
     r"hosts entry 'zk1' is not \"host:port\""),
    ({"cluster": {"name": "prod"}, "plugins": {"cluster_zk": {"hosts": "zk1:2181/plugmq"}}}, ConfigError,
     r"put the path in the chroot option"),
    ({"cluster": {"name": "prod"}, "plugins": {"cluster_zk": {"chroot": "plugmq"}}}, ConfigError,
     r"chroot must be an absolute ZooKeeper path"),
    ({"cluster": {"name": "prod"}, "plugins": {"cluster_zk": {"chroot": "/zookeeper/x"}}}, ConfigError,
     r"which ZooKeeper reserves"),
    ({"cluster": {"name": "prod"}, "plugins": {"cluster_zk": {"session_timeout_s": 0}}}, ConfigError,
     r"session_timeout_s must be a number of seconds from 1 to 600, got 0"),
])
def test_cluster_configuration_errors_name_the_key_and_the_fix(tmp_path: Path, sections: dict[str, Any],
                                                              error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Broker.from_config(_config(tmp_path, **sections))
