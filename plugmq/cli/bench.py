"""``plugmq bench <family>``: benchmarks in plugmq.bench, each reporting ratios against a baseline."""

from __future__ import annotations

import click

from plugmq.cli import _LazyGroup

_BENCHMARKS = {name: f"plugmq.bench.{name}:command" for name in ("store", "alloc", "filter", "delay", "e2e", "txn", "grpc", "replication", "cluster", "failover", "trace",
                                                             "queues", "features", "put", "serve", "backlog")}


@click.group("bench", cls=_LazyGroup, lazy=_BENCHMARKS)
def bench() -> None:
    """Run a benchmark; every speed is reported as a ratio to a baseline measured in the same run."""
