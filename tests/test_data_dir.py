"""broker.data_dir problems are ConfigErrors naming the key, the value and the fix - at config
load, at broker open and in ``plugmq check-config`` (which creates nothing)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugmq.broker.broker import Broker
from plugmq.cli import main
from plugmq.config.broker import load_config
from plugmq.core import ConfigError, ManualClock
from tests.fixtures.brokers import BrokerFactory

PLUGINS = ["store_mmap", "filter_tag"]


def config_file(tmp_path: Path, data_dir: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(f'[broker]\ndata_dir = {data_dir!r}\nplugins = ["store_mmap", "filter_tag"]\n')
    return path


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write to: a read-only tmpfs as root (root ignores permission bits),
    mode 0o555 otherwise."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs as root: {done.stderr.strip()}")
        try:
            yield target
        finally:
            subprocess.run(["umount", str(target)], check=False)
    else:
        target.chmod(0o555)
        try:
            yield target
        finally:
            target.chmod(0o755)


def test_empty_and_nul_refused_when_the_config_is_read(tmp_path: Path) -> None:
    for value, words in (("", "is empty"), ("   ", "is empty"), ("data\0dir", "NUL")):
        with pytest.raises(ConfigError, match="broker.data_dir") as info:
            load_config({"broker": {"data_dir": value}})
        assert words in str(info.value)
    with pytest.raises(ConfigError, match=r"broker\.toml: broker\.data_dir is empty"):
        load_config(config_file(tmp_path, ""))
    with pytest.raises(ConfigError, match="broker.data_dir is empty"):
        Broker.open("", plugins=PLUGINS)


def test_a_regular_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file, not a directory") as info:
        Broker.open(target, plugins=PLUGINS, clock=ManualClock())
    assert "broker.data_dir" in str(info.value) and str(target) in str(info.value)
    assert target.read_text() == "not a directory", "nothing touched"


def test_a_path_below_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(ConfigError, match="lies below .*which is a file") as info:
        Broker.open(target / "data", plugins=PLUGINS, clock=ManualClock())
    assert "broker.data_dir" in str(info.value)


def test_an_unwritable_place_is_refused(read_only_dir: Path) -> None:
    for target in (read_only_dir, read_only_dir / "sub" / "data"):
        with pytest.raises(ConfigError, match="broker.data_dir") as info:
            Broker.open(target, plugins=PLUGINS, clock=ManualClock())
        assert str(target) in str(info.value) and "writable" in str(info.value)


def test_a_good_data_dir_is_created(make_broker: BrokerFactory, tmp_path: Path) -> None:
    broker = make_broker(PLUGINS, data_dir=tmp_path / "a" / "b")
    assert broker.data_dir.is_dir()


def test_check_config_checks_the_data_dir_and_creates_nothing(tmp_path: Path, read_only_dir: Path) -> None:
    runner = CliRunner()
    fresh = tmp_path / "fresh"
    ok = runner.invoke(main, ["check-config", str(config_file(tmp_path, str(fresh)))])
    assert ok.exit_code == 0 and "config OK" in ok.output
    assert not fresh.exists(), "check-config creates nothing"
    taken = tmp_path / "taken"
    taken.write_text("x")
    for value, words in ((str(taken), "is a file"), (str(taken / "d"), "which is a file"),
                         (str(read_only_dir), "writable")):
        result = runner.invoke(main, ["check-config", str(config_file(tmp_path, value))])
        assert result.exit_code == 1, result.output
        assert "config OK" not in result.output
        assert "broker.data_dir" in result.output and words in result.output
