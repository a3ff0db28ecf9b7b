"""Smoke run of ``plugmq bench delay`` at tiny sizes: every section runs and counts add up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plugmq.bench.delay import command


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(command, [*args, "--no-redis", "--json", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.mark.slow
def test_bench_delay_smoke_every_section_delivers_everything(tmp_path: Path) -> None:
    data = _run(tmp_path, "--messages", "300", "--burst", "300", "--sections", "throughput,burst", "--lead-ms", "300")
    assert data["settings"]["redis"] == "turned off (--no-redis)" and data["settings"]["batched_write_back"]
    names = {"heapq", "delay_level", "delay_wheel", "delay_schedule"}
    assert set(data["throughput"]) == names and set(data["burst"]) == names and "lateness" not in data
    for row in data["throughput"].values():
        assert row["delivered"] == 300 and row["insert_per_s"] > 0 and row["dispatch_per_s"] > 0
    for name, row in data["burst"].items():
        assert row["delivered"] == 300, f"burst {name}: {row}"
        assert row["early"] == 0, f"burst {name}: delivered before the deliver time on the wall clock"
    memory = _run(tmp_path, "--pending", "400", "--sections", "memory", "--strategies", "delay_schedule")["memory"]
    assert set(memory) == {"heapq", "delay_schedule"}
    for name, row in memory.items():
        assert "error" not in row, f"{name}: {row}"
        assert row["insert_per_s"] > 0
    assert set(data["load"]) == {"throughput", "burst"}
