"""The one SparkSession of a test run (import ``spark`` into a test module to use it).

local[2], UI off, two shuffle partitions, every Spark directory under pytest's temp dir. Session
scoped: the JVM starts once however many Spark test modules run.
"""

from __future__ import annotations

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
