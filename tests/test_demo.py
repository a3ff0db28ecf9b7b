"""``plugmq demo``: the same story on a reused data dir, a dead-lettered message, foreign dirs refused."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from plugmq.cli.demo import DemoDirError, demo, run_demo


def _story(data_dir: Path) -> str:
    out = io.StringIO()
    run_demo(data_dir, Console(file=out, width=400, color_system=None))
    return out.getvalue()


def _normalised(text: str) -> list[str]:
    """The story without what differs between runs by design: names' run suffix, ids, consistent hashing."""
    text = re.sub(r"-r\d+\b", "", text)
    text = re.sub(r"[0-9A-F]{32}", "<id>", text)
    return [line for line in text.splitlines() if not line.startswith(("CONSISTENT_HASH", "run "))]


def test_a_reused_data_dir_tells_the_same_story(tmp_path: Path) -> None:
    first = _story(tmp_path / "demo")
    second = _story(tmp_path / "demo")
    assert "run 2 on" in second and "-r2" in second
    assert _normalised(first) == _normalised(second)
    for text in (first, second):
        assert "['reminder'] delivered" in text and "grew by 0" in text
        assert "flaky-order#2@+40s" in text
        assert "31 s later -> [('encode', 2)]" in text
        assert re.search(r"'%DLQ%demo-poison(-r2)?' now holds \[\('poison-pill', 2\)\]", text)
        assert "checked back ['pay-3'] -> visible: ['pay-1', 'pay-3']" in text


def test_a_directory_holding_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("not a broker")
    with pytest.raises(DemoDirError, match="not empty and holds no plugmq demo"):
        run_demo(tmp_path, Console(file=io.StringIO()))
    result = CliRunner().invoke(demo, ["--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "give an empty or new directory" in result.output
    assert (tmp_path / "mine.txt").read_text() == "not a broker"
