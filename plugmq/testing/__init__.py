"""Helpers for tests and benchmarks that start real components (never mocks): a standalone
ZooKeeper server, ``plugmq serve`` children of a cluster, a route probe."""

from plugmq.testing.cluster import CLUSTER_PLUGINS, ServeProcess, await_listening, query_route, write_broker_config
from plugmq.testing.zookeeper import ZooKeeperServer, zookeeper_missing

__all__ = [
           "CLUSTER_PLUGINS",
           "ServeProcess",
           "ZooKeeperServer",
           "await_listening",
           "query_route",
           "write_broker_config",
           "zookeeper_missing",
]
