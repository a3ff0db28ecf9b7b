"""The one SparkSession of a test run and a standalone cluster (import the fixtures into a test module).

``spark``: local[2], UI off, two shuffle partitions, every Spark directory under pytest's temp dir.
Session scoped: the JVM starts once however many Spark test modules run. ``standalone_cluster``:
master and workers as child processes; the cluster-mode tests drive it from a ``plugmq compare``
child process with a driver of its own, so the two sessions never share a JVM.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from plugmq.spark.job import make_session

    base = tmp_path_factory.mktemp("spark")
    session = make_session("local[2]", app_name="plugmq-tests", local_dir=str(base), conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "768m",
    })
    yield session
    session.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone master and one 2-core worker on loopback (ports picked by the daemons),
    every file under pytest's temp dir; stopped (workers, their executors, master) at the end."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Java is not installed (apt-get install openjdk-17-jre-headless)")
    from plugmq.spark.standalone import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=1, cores=2, memory="1g")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
