"""``plugmq bench backlog --smoke``: every figure is measured and the backlog is read back whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugmq.cli import main


def test_bench_backlog_smoke_reports_every_figure_and_cleans_up(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A relative --dir: the bench's children run in a directory of their own, not this one.
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["bench", "backlog", "--smoke", "--dir", "work", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    settings, figures = report["settings"], report["rates"]["this"]
    assert settings["messages"] * settings["body_size"] >= 4 << 20 and settings["rounds"] == 1
    assert set(figures) == {"put_empty", "put_backlog", "pull_mb_s", "pull_msg_s", "read_mb_s"}
    assert all(value > 0 for value in figures.values())
    assert list((tmp_path / "work").iterdir()) == [], "the backlog must be deleted"
