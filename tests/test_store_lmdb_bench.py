"""Smoke test of ``plugmq bench store`` on the two key-value stores (tiny sizes; no speed asserts)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import structlog
from click.testing import CliRunner

from plugmq.bench.store import command


@pytest.fixture
def quiet_logs():
    saved = structlog.get_config()
    # Warnings to stderr: a kill -9 that lands mid-write makes the restart log "commit log tail
    # cut", which must not end up in the JSON on stdout.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    yield
    structlog.configure(**saved)


def test_bench_reports_every_case_and_skips_unknown_stores(quiet_logs: None, tmp_path) -> None:
    result = CliRunner().invoke(command, [
        "--messages", "120", "--stores", "store_lmdb,store_rocks,store_nonexistent", "--sizes", "128",
        "--batch", "40", "--rounds", "1", "--no-redis", "--dir", str(tmp_path), "--json",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["skipped"]) == {"store_nonexistent"}
    cases = {(r["store"], r["case"]) for r in report["rows"]}
    expected = {"single async", "batch async", "cq read", "single sync x1", "single sync x8", "batch sync"}
    assert cases == {(s, c) for s in ("store_lmdb", "store_rocks") for c in expected}
    for row in report["rows"]:
        assert row["messages"] == 120 and row["rate"] > 0
        assert row["ratio"] > 0 and row["batch"] in (1, 40, 32)
        assert row["durability"].startswith(("sync:", "async:"))
    assert {r["baseline"] for r in report["raw"]} == {"mmap single", "mmap batched", "write+fsync", "cq scan"}


def test_bench_measures_restart_after_kill_and_redis(quiet_logs: None, tmp_path) -> None:
    """store_mmap's rows, the Redis baseline when redis-server is there, and the restarts after
    kill -9 (a real child killed with SIGKILL) and after a clean stop, here with a 1 MiB commit log."""
    from plugmq.bench.redis_peer import redis_missing

    result = CliRunner().invoke(command, [
        "--messages", "200", "--stores", "store_mmap", "--sizes", "128", "--batch", "50", "--rounds", "2",
        "--restart-log-mib", "1", "--dir", str(tmp_path), "--json",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    restart = report["restart"]
    assert restart["read_ok"] and restart["messages"] > 0 and restart["seconds"] > 0
    assert restart["log_bytes"] == 1 << 20 and restart["end"] >= 1 << 20 and restart["stop"] == "kill -9"
    clean = report["restart_clean"]
    assert clean["stop"] == "clean stop" and clean["read_ok"] and clean["end"] >= 1 << 20
    assert clean["checked_from"] < clean["end"], "the newest record is re-checked"
    assert clean["redispatched"] == 0 and clean["cut_bytes"] == 0, "a clean stop leaves nothing to redo"
    baselines = {r["baseline"] for r in report["raw"]}
    assert {"mmap single", "mmap batched", "write+fsync", "cq scan"} <= baselines
    assert ("redis lpush" in baselines) == (redis_missing() is None)
    targets = {(r["case"], r["baseline"]): r["target"] for r in report["rows"]}
    assert targets[("single async", "mmap single")] == 0.30 and targets[("batch async", "mmap batched")] == 0.40
    assert "before" in report["load_average"]
