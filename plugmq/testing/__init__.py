"""Helpers for tests and benchmarks that start real components (never mocks): a standalone
ZooKeeper server, ``plugmq serve`` children of a cluster, a route probe, and :func:`wait_for`,
the one way to wait for another real thread or process."""

from plugmq.testing.cluster import (
    CLUSTER_PLUGINS,
    ServeProcess,
    await_listening,
    query_route,
    serving,
    write_broker_config,
)
from plugmq.testing.wait import WAIT_S, WaitTimeout, seconds_until, wait_for
from plugmq.testing.zookeeper import ZooKeeperServer, zookeeper_missing

__all__ = [
    "CLUSTER_PLUGINS",
    "WAIT_S",
    "ServeProcess",
    "WaitTimeout",
    "ZooKeeperServer",
    "await_listening",
    "query_route",
    "seconds_until",
    "serving",
    "wait_for",
    "write_broker_config",
    "zookeeper_missing",
]
