"""Every CLI error is one line, ``plugmq: error: ...``, with a non-zero exit status and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugmq.cli import ERROR_PREFIX, main


def fails_with_one_line(args: list[str], *, exit_code: int = 1) -> str:
    result = CliRunner().invoke(main, args, prog_name="plugmq")
    lines = result.output.strip().splitlines()
    assert result.exit_code == exit_code, result.output
    assert len(lines) == 1, f"expected one error line, got:\n{result.output}"
    assert lines[0].startswith(ERROR_PREFIX), lines[0]
    assert "Traceback" not in result.output
    return lines[0][len(ERROR_PREFIX):]


def config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(body)
    return path


GOOD = '[broker]\nname = "b"\ndata_dir = "data"\nplugins = ["store_lmdb"]\n'


def test_check_config_given_a_directory(tmp_path: Path) -> None:
    message = fails_with_one_line(["check-config", str(tmp_path)], exit_code=2)
    assert "is a directory" in message and "plugmq check-config --help" in message


def test_check_config_missing_file_and_bad_toml(tmp_path: Path) -> None:
    assert str(tmp_path / "nope.toml") in fails_with_one_line(["check-config", str(tmp_path / "nope.toml")])
    broken = config(tmp_path, "[broker\nname = 1\n")
    assert "TOML" in fails_with_one_line(["check-config", str(broken)])


def test_check_config_lists_each_error_on_its_own_prefixed_line(tmp_path: Path) -> None:
    path = config(tmp_path, GOOD.replace('["store_lmdb"]', '["store_lmdb", "audit"]')
                  + '[plugins.store_lmdb]\nflush = "fast"\n[plugins.audit]\nlog_every = "5"\n')
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(ERROR_PREFIX) for line in lines), result.output
    assert "plugin 'store_lmdb', option flush = 'fast' is refused" in lines[0]
    assert "plugin 'audit', option log_every = '5': expected an integer, got a string" in lines[1]


def test_check_config_reports_every_problem_of_every_table(tmp_path: Path) -> None:
    path = config(tmp_path, '[broker]\nnmae = "b"\ndata_dir = ""\nplugins = ["store_lmdb", "audit", 3]\n'
                  'default_queue_count = 0\nmax_reconsume_times = -1\n[cluster]\n[groups]\nmax_delivery_atempts = 3\n'
                  '[groups.orders]\nbackoff_s = [1, -2]\n[plugins.store_lmdb]\nflush = "fast"\n'
                  '[plugins.audit]\nlog_every = "5"\n[server]\npop_fsync = "no"\n')
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert all(line.startswith(ERROR_PREFIX + str(path) + ": ") for line in lines), result.output
    found = "\n".join(lines)
    for expected in ("broker.nmae: unknown key. Did you mean 'name'?", "broker.data_dir is empty",
                     "broker.plugins[2] must be a plugin name (string), got 3",
                     "broker.default_queue_count must be >= 1, got 0", "broker.max_reconsume_times must be >= 0",
                     "[cluster] has no name", "groups.max_delivery_atempts: unknown key",
                     "groups.orders.backoff_s[1] must be a number of seconds > 0, got -2",
                     "server.pop_fsync must be true or false, got 'no'",
                     "plugin 'store_lmdb', option flush = 'fast' is refused",
                     "plugin 'audit', option log_every = '5': expected an integer, got a string"):
        assert expected in found, f"{expected!r} not in:\n{found}"
    assert len(lines) == 11, found  # one line per problem, none twice


def test_check_config_reference_and_usage() -> None:
    assert "### [broker]: BrokerConfig" in CliRunner().invoke(main, ["check-config", "--reference"]).output
    assert "give the CONFIG_FILE to check" in fails_with_one_line(["check-config"], exit_code=2)


def test_usage_errors(tmp_path: Path) -> None:
    assert "No such command 'nonsense'" in fails_with_one_line(["nonsense"], exit_code=2)
    message = fails_with_one_line(["query", "id", "--config", str(tmp_path / "missing.toml"), "X"], exit_code=2)
    assert message.startswith("plugmq query id: ") and "does not exist" in message
    assert "Missing option '--strategy'" in fails_with_one_line(["allocate", "-q", "T:b:0-3", "-c", "c1"], exit_code=2)
    message = fails_with_one_line(["filter", "check", "--type", "NOPE", "a = 1"], exit_code=2)
    assert "no installed filter plugin handles 'NOPE'" in message


def test_plugmq_errors_of_verbs(tmp_path: Path) -> None:
    path = config(tmp_path, GOOD)
    assert "not hexadecimal" in fails_with_one_line(["query", "id", "--config", str(path), "zz"])
    message = fails_with_one_line(["allocate", "-s", "NO_SUCH", "-q", "T:b:0-3", "-c", "c1"])
    assert "NO_SUCH" in message
    bad_plugin = config(tmp_path, GOOD.replace("store_lmdb", "store_lmbd"))
    assert "Did you mean 'store_lmdb'?" in fails_with_one_line(["query", "id", "--config", str(bad_plugin), "00"])


def test_os_errors(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the data dir should be")
    message = fails_with_one_line(["query", "offset", "--config", str(config(tmp_path, GOOD)), "T", "0", "0"])
    assert "data" in message


def test_no_arguments_prints_help_not_an_error() -> None:
    result = CliRunner().invoke(main, [])
    assert ERROR_PREFIX not in result.output and "Usage:" in result.output


@pytest.mark.slow
def test_real_process_exit_status_and_stderr(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("plugmq")  # the console script installed with the package
    done = subprocess.run([str(script), "check-config", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(ERROR_PREFIX), done.stderr
