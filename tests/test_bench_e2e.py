"""`plugmq bench e2e`: every message produced is consumed, one at a time and in batches."""

from __future__ import annotations

import re

from click.testing import CliRunner

from plugmq.bench.e2e import run_e2e
from plugmq.cli import main


def test_a_run_consumes_every_message_it_produced_and_times_them() -> None:
    for per_call in (1, 7):  # 7 does not divide 300: the last batch is short
        result = run_e2e("store_mmap", "async", 300, 64, per_call)
        assert result["produce_rate"] > 0 and result["e2e_rate"] > 0, result
        assert result["e2e_rate"] <= result["produce_rate"] * 1.0001, "nothing is consumed before it is produced"
        assert 0 <= result["p50_ms"] <= result["p99_ms"], result


def test_the_command_prints_a_row_per_store_with_its_ratios() -> None:
    result = CliRunner().invoke(main, ["bench", "e2e", "--stores", "store_mmap", "--messages", "200", "--size", "64",
                                       "--rounds", "1", "--batch", "8"], prog_name="plugmq")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "store_mmap" in line)
    assert len(re.findall(r"\d+\.\d\dx", row)) == 2, row  # e2e / raw, one at a time and batched
    assert "goal: e2e >= 0.3x" in result.output
