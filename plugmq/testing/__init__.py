"""Helpers for tests that start real components (never mocks): a standalone ZooKeeper server."""

from plugmq.testing.zookeeper import ZooKeeperServer, zookeeper_missing

__all__ = ["ZooKeeperServer", "zookeeper_missing"]
