"""The library is silent until the application configures logging; the CLI configures it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner
from structlog.testing import capture_logs

from plugmq.cli import main
from plugmq.core import get_logger

OPEN_AND_CLOSE = """
from plugmq import Broker, Message
with Broker.open({data_dir!r}, plugins=["store_lmdb", "alloc"]) as broker:
    broker.create_topic("T", 1)
    message = broker.put(Message("T", b"x"), 0)
    stored = broker.pull(broker.topic_queues("T")[0], 0, 1).messages[0]
    broker.dead_letter(stored, "G")  # logs a warning
"""


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_unconfigured_library_prints_nothing(tmp_path: Path) -> None:
    done = run_python(OPEN_AND_CLOSE.format(data_dir=str(tmp_path / "data")), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


def test_basic_config_at_warning_shows_warnings_only(tmp_path: Path) -> None:
    setup = "import logging\nlogging.basicConfig(level=logging.WARNING)\n"
    done = run_python(setup + OPEN_AND_CLOSE.format(data_dir=str(tmp_path / "data")), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines, "the dead-letter warning must be shown"
    assert all(line.startswith(("WARNING:plugmq.", "ERROR:plugmq.")) for line in lines), lines
    assert any("message dead-lettered" in line and "group='G'" in line for line in lines), lines
    assert not any("broker started" in line or "broker closed" in line for line in lines)


def test_basic_config_at_info_shows_the_info_lines(tmp_path: Path) -> None:
    setup = "import logging\nlogging.basicConfig(level=logging.INFO)\n"
    done = run_python(setup + OPEN_AND_CLOSE.format(data_dir=str(tmp_path / "data")), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "INFO:plugmq.broker.broker:broker started broker='broker-a'" in done.stderr
    assert done.stdout == ""


def test_capture_logs_sees_loggers_bound_before_it_started() -> None:
    bound = get_logger("plugmq.test").bind(topic="T")
    with capture_logs() as logs:
        bound.info("hello", offset=3)
        get_logger("plugmq.test").debug("fine-grained")
    assert logs == [{"event": "hello", "topic": "T", "offset": 3, "log_level": "info"},
                    {"event": "fine-grained", "log_level": "debug"}]


def test_exception_carries_the_traceback_to_logging(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="plugmq.test")
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("plugmq.test").exception("it failed", where="here")
    record = caplog.records[-1]
    assert record.getMessage() == "it failed where='here'"
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_cli_json_lines_and_level(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nname = "b"\ndata_dir = "data"\nplugins = ["store_lmdb"]\n')
    result = CliRunner().invoke(main, ["--log-json", "--log-level", "info", "query", "offset", "--config",
                                       str(config), "T", "0", "0"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines() if line.startswith('{"')]
    started = [e for e in events if e.get("event") == "broker started"]
    assert started and started[0]["level"] == "info" and started[0]["broker"] == "b"
    result = CliRunner().invoke(main, ["query", "offset", "--config", str(config), "T", "0", "0"])
    assert result.exit_code == 0 and "broker started" not in result.output, "default level is warning"
