from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from plugmq import Broker, ManualClock, Message
from plugmq.cli import main


def write_config(tmp_path: Path, plugins: list[str], extra: str = "") -> Path:
    path = tmp_path / "broker.toml"
    listed = ", ".join(f'"{p}"' for p in plugins)
    path.write_text(f'[broker]\nname = "broker-t"\ndata_dir = "data"\nplugins = [{listed}]\n{extra}')
    return path


def test_plugins_lists_built_ins_through_entry_points() -> None:
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["alloc"]["families"] == ["allocation"] and rows["alloc"]["distribution"] == "plugmq"
    assert rows["audit"]["distribution"] == "plugmq-audit"  # the third-party example, same entry-point group


def test_check_config_ok_and_every_error(tmp_path: Path) -> None:
    good = write_config(tmp_path, ["store_lmdb", "alloc"], '[plugins.store_lmdb]\nflush = "sync"\n')
    result = CliRunner().invoke(main, ["check-config", str(good)])
    assert result.exit_code == 0, result.output
    assert "config OK" in result.output and "store_lmdb" in result.output
    bad = write_config(tmp_path, ["store_lmdb", "alocc"])
    result = CliRunner().invoke(main, ["check-config", str(bad)])
    assert result.exit_code == 1
    assert "unknown plugin 'alocc'. Did you mean 'alloc'?" in result.output
    bad_option = write_config(tmp_path, ["store_lmdb"], "[plugins.store_lmdb]\nflsh = 1\n")
    result = CliRunner().invoke(main, ["check-config", str(bad_option)])
    assert result.exit_code == 1 and "unknown option 'flsh' for plugin 'store_lmdb'" in result.output


def test_check_config_checks_the_server_table_as_serve_reads_it(tmp_path: Path) -> None:
    pytest.importorskip("grpc", reason="needs the serve extra")
    served = write_config(tmp_path, ["store_lmdb"], '[server]\nlisten = "127.0.0.1:9876"\n')
    result = CliRunner().invoke(main, ["check-config", str(served)])
    assert result.exit_code == 0 and "listen=127.0.0.1:9876" in result.output, result.output
    typo = write_config(tmp_path, ["store_lmdb"], '[server]\nlistn = "127.0.0.1:9876"\n')
    result = CliRunner().invoke(main, ["check-config", str(typo)])
    assert result.exit_code == 1 and "listn" in result.output and "config OK" not in result.output, result.output


def test_example_plugin_loads_by_name_from_a_config_file(tmp_path: Path) -> None:
    import plugmq_audit

    path = write_config(tmp_path, ["store_lmdb", "audit"], "[plugins.audit]\nlog_every = 1\n")
    with capture_logs() as logs, Broker.from_config(path, clock=ManualClock()) as broker:
        queue = broker.create_topic("Audited", 1)[0]
        for i in range(3):
            broker.put(Message("Audited", str(i).encode()), 0)
        broker.pull(queue, 0, 8, consumer_group="readers")
        counts = plugmq_audit.COUNTS["broker-t"]
    assert counts[("stored", "Audited")] == 3 and counts[("delivered", "Audited")] == 3
    audit_lines = [e for e in logs if e["event"] == "audit"]
    assert len(audit_lines) == 6 and audit_lines[0]["topic"] == "Audited" and audit_lines[0]["kind"] == "stored"


def test_query_verbs(tmp_path: Path) -> None:
    path = write_config(tmp_path, ["store_lmdb"])
    with Broker.from_config(path) as broker:
        sent = broker.put(Message("Q", b"hello", keys="order-9"), 0)
    runner = CliRunner()
    result = runner.invoke(main, ["query", "id", "--config", str(path), sent.msg_id, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["body"] == "hello"
    result = runner.invoke(main, ["query", "key", "--config", str(path), "Q", "order-9", "--json"])
    assert [r["msg_id"] for r in json.loads(result.output)] == [sent.msg_id]
    result = runner.invoke(main, ["query", "offset", "--config", str(path), "Q", "0", "0"])
    assert json.loads(result.output)["offset"] == 0
    result = runner.invoke(main, ["query", "id", "--config", str(path), "zz"])
    assert result.exit_code == 1 and "not hexadecimal" in result.output


def test_cli_logging_json_and_console(capsys) -> None:
    import structlog

    from plugmq.cli import configure_logging

    try:
        configure_logging(True, "info")
        structlog.stdlib.get_logger("plugmq.test").info("hello", topic="T")
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert json.loads(line) == {"event": "hello", "topic": "T", "level": "info", "timestamp": json.loads(line)["timestamp"]}
        configure_logging(False, "warning")
        structlog.stdlib.get_logger("plugmq.test").info("hidden")
        assert "hidden" not in capsys.readouterr().err
    finally:
        structlog.reset_defaults()
