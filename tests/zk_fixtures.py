"""A real ZooKeeper server for the cluster tests (and the replication tests after them).

Import the fixture into a test module: ``from tests.zk_fixtures import zookeeper  # noqa: F401``.
One server per module; each test uses its own chroot or cluster name, so tests never see each
other's znodes. Skipped, with the reason, where Java or ZooKeeper is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugmq.testing import ZooKeeperServer, zookeeper_missing


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper")))
    try:
        server.start()
        yield server
    finally:
        server.stop()

