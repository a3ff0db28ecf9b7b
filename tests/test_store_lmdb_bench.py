"""Smoke test of ``plugmq bench store`` on the two key-value stores (tiny sizes; no speed asserts)."""

from __future__ import annotations

import json
import logging

import pytest
import structlog
from click.testing import CliRunner

from plugmq.bench.store import command


@pytest.fixture
def quiet_logs():
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.configure(**saved)


def test_bench_reports_every_case_and_skips_unknown_stores(quiet_logs: None, tmp_path) -> None:
    result = CliRunner().invoke(command, [
        "--messages", "120", "--stores", "store_lmdb,store_rocks,store_nonexistent", "--sizes", "128",
        "--batch", "40", "--dir", str(tmp_path), "--json",
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
