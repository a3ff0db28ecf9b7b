"""``plugmq bench put`` and ``plugmq bench serve`` on tiny loads: each figure is measured, with its baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

pytest.importorskip("rocketmq", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.bench.serve import tree_cpu_s
from plugmq.cli import main
from plugmq.measure.probes import process_cpu_s


def test_bench_put_measures_both_interpreters_against_the_raw_loops() -> None:
    result = CliRunner().invoke(main, ["bench", "put", "--messages", "1000", "--batch", "50", "--rounds", "1",
                                       "--baseline-python", sys.executable, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["rates"]) == {"this", "baseline"}
    for rates in report["rates"].values():
        assert set(rates) == {"raw_single", "put", "raw_batch", "put_batch"} and min(rates.values()) > 0
    for micros in report["cpu_us"].values():
        assert set(micros) == {"raw_single", "put", "raw_batch", "put_batch"} and min(micros.values()) >= 0
    assert report["settings"]["load_after"] is not None


def test_bench_serve_measures_the_no_op_server_and_both_worker_counts() -> None:
    result = CliRunner().invoke(main, ["bench", "serve", "--messages", "64", "--rounds", "1", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    servers = json.loads(result.stdout)["servers"]
    assert set(servers) == {"no-op grpc.aio server (baseline)", "plugmq serve, workers = 1",
                            "plugmq serve, workers = 2"}
    for sizes in servers.values():
        assert set(sizes) == {"1", "8"}
        # CPU comes from /proc in clock ticks (10 ms): a few requests may cost none measurable.
        assert all(figures["messages_s"] > 0 and 0 <= figures["owner_cpu_ms"] <= figures["cpu_ms"] < 1e9
                   for figures in sizes.values())


def test_tree_cpu_counts_a_childs_cpu() -> None:
    # A child that burns CPU, then waits for its stdin to close.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sum(range(3 * 10**7)); print(1, flush=True); "
                                                    "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"1"
        used, own = process_cpu_s(child.pid), process_cpu_s(os.getpid())
        assert used > 0
        assert tree_cpu_s(os.getpid()) >= used + own  # the child's CPU is in the tree
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
