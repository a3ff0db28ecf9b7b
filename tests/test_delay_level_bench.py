"""Smoke run of ``plugmq bench delay`` at tiny sizes: every section runs and counts add up."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plugmq.bench.delay import command


def test_bench_delay_smoke_every_section_delivers_everything(tmp_path: Path) -> None:
    result = CliRunner().invoke(command, [
        "--messages", "300", "--pending", "400", "--burst", "300", "--sections", "throughput,memory,burst",
        "--lead-ms", "300", "--no-redis", "--json", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["settings"]["redis"] == "turned off (--no-redis)"
    names = {"heapq", "delay_level", "delay_wheel", "delay_schedule"}
    assert set(data["throughput"]) == names and set(data["memory"]) == names
    for row in data["throughput"].values():
        assert row["delivered"] == 300 and row["insert_per_s"] > 0 and row["dispatch_per_s"] > 0
    for name, row in data["memory"].items():
        assert "error" not in row, f"{name}: {row}"
    assert set(data["burst"]) == names and "lateness" not in data
    for name, row in data["burst"].items():
        assert row["delivered"] == 300, f"burst {name}: {row}"
        assert row["early"] == 0, f"burst {name}: delivered before the deliver time on the wall clock"
