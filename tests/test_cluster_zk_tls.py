"""cluster_zk over TLS to a TLS-only ZooKeeper (Debian's jar with its Netty factory, client
certificates required): a broker opens its session and registers over TLS, another broker sees
it; a plain client, a client whose certificate another CA signed and a client that does not
trust the server's CA are all kept out. Certificates made by trustme."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")
pytest.importorskip("trustme", reason="needs the test extra (trustme)")

from plugmq.broker.broker import Broker
from plugmq.core import BrokerRegistration, ConfigError
from plugmq.core.errors import ClusterError
from plugmq.plugins.cluster_zk.options import ZkOptions
from plugmq.plugins.cluster_zk.service import ZkClusterService
from plugmq.testing import ZooKeeperServer, wait_for
from plugmq.testing.zookeeper import ZooKeeperTls, zookeeper_missing
from tests.security_helpers import Certs, make_certs

WAIT_S = 20.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(Path(tmp_path_factory.mktemp("zk-certs")))


@pytest.fixture(scope="module")
def tls_zookeeper(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[ZooKeeperServer]:
    missing = zookeeper_missing(tls=True)
    if missing:
        pytest.skip(missing)
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper-tls")),
                             tls=ZooKeeperTls(certs.server_cert, certs.server_key, certs.ca))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def tls_options(certs: Certs, *, stranger: bool = False) -> dict[str, Any]:
    cert, key = (certs.stranger_cert, certs.stranger_key) if stranger else (certs.client_cert, certs.client_key)
    return {"tls_ca": str(certs.ca), "tls_cert": str(cert), "tls_key": str(key)}


def test_brokers_register_and_see_each_other_over_tls(tls_zookeeper: ZooKeeperServer, certs: Certs,
                                                      tmp_path: Path) -> None:
    cluster = f"c{uuid.uuid4().hex[:8]}"
    zk = {"hosts": tls_zookeeper.hosts, "session_timeout_s": 2, **tls_options(certs)}
    config = {"broker": {"name": "broker-a", "data_dir": str(tmp_path / "a"),
                         "plugins": ["store_mmap", "alloc", "cluster_zk"]},
              "cluster": {"name": cluster}, "plugins": {"cluster_zk": zk}}
    broker = Broker.from_config(config)  # a broker opens its session over TLS
    try:
        assert broker.cluster is not None and broker.cluster.connected
    finally:
        broker.close()
    a, b = (ZkClusterService(ZkOptions(**zk), cluster, name) for name in ("broker-a", "broker-b"))
    try:
        a.register(BrokerRegistration(cluster, "broker-a", "127.0.0.1:1001"))
        b.register(BrokerRegistration(cluster, "broker-b", "127.0.0.1:1002"))
        wait_for(lambda: sorted(r.key for r in b.view().brokers), WAIT_S, "both brokers in b's view",
                 until=lambda seen: seen == ["broker-a.0", "broker-b.0"])
        a.close()
        wait_for(lambda: [r.key for r in b.view().brokers], WAIT_S, "a gone from b's view",
                 until=lambda seen: seen == ["broker-b.0"])
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("client", ["plain", "stranger certificate", "no client certificate", "other CA trusted"])
def test_clients_without_the_clusters_tls_are_kept_out(tls_zookeeper: ZooKeeperServer, certs: Certs,
                                                       client: str) -> None:
    options: dict[str, Any] = {
        "plain": {},
        "stranger certificate": tls_options(certs, stranger=True),
        "no client certificate": {"tls_ca": str(certs.ca)},
        # it trusts only a CA that did not sign the server's certificate (the stranger's chain)
        "other CA trusted": {**tls_options(certs), "tls_ca": str(certs.stranger_cert)},
    }[client]
    with pytest.raises(ClusterError, match="cannot reach ZooKeeper"):
        ZkClusterService(ZkOptions(hosts=tls_zookeeper.hosts, connect_timeout_s=2, **options), "c", "broker-x")


def test_tls_options_are_checked_when_the_config_is_loaded(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_ca is not"):
        ZkOptions(tls_cert=str(certs.client_cert), tls_key=str(certs.client_key))
    with pytest.raises(ConfigError, match=r"plugins\.cluster_zk\.tls_key missing"):
        ZkOptions(tls_ca=str(certs.ca), tls_cert=str(certs.client_cert))
    with pytest.raises(ConfigError, match="does not belong to the certificate"):
        ZkOptions(tls_ca=str(certs.ca), tls_cert=str(certs.client_cert), tls_key=str(certs.server_key))
    config = {"broker": {"name": "b", "data_dir": str(tmp_path / "d"), "plugins": ["store_mmap", "cluster_zk"]},
              "cluster": {"name": "c"}, "plugins": {"cluster_zk": {"tls_ca": str(tmp_path / "nope.pem")}}}
    with pytest.raises(ConfigError, match=r"plugins\.cluster_zk\.tls_ca: CA certificate file .* does not exist"):
        Broker.from_config(config)
