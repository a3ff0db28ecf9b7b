"""``plugmq serve`` children started from relative paths: each runs in its config's directory,
so a path relative to the parent's working directory must still find the config and the log."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from plugmq.measure.children import BrokerChild, interpreter_path
from plugmq.testing import ServeProcess

_CONFIG = '[broker]\ndata_dir = "data"\nplugins = ["store_mmap"]\n'


def _relative_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run = tmp_path / "run" / "node"
    run.mkdir(parents=True)
    (run / "broker.toml").write_text(_CONFIG, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # the parent's working directory is not the child's
    return Path("run/node/broker.toml")


def test_a_measure_child_given_a_relative_config_serves_from_the_configs_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _relative_config(tmp_path, monkeypatch)
    # as `--baseline-python OTHER/.venv/bin/python` hands an interpreter over: relative to this directory
    child = BrokerChild(config, cli=True, python=os.path.relpath(sys.executable))
    try:
        assert child.address.startswith("127.0.0.1:")
        assert child.config_path.is_absolute() and child.log_path.is_absolute()
        assert child.python == os.path.abspath(sys.executable)
    finally:
        assert child.stop() == 0
    assert (tmp_path / "run" / "node" / "data").is_dir()  # data_dir relative to the config, as documented
    assert (tmp_path / "run" / "node" / "serve.log").is_file()


def test_a_serve_process_given_a_relative_config_serves_from_the_configs_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process = ServeProcess(_relative_config(tmp_path, monkeypatch))
    try:
        assert process.await_address().startswith("127.0.0.1:")
    finally:
        process.stop()
    assert (tmp_path / "run" / "node" / "data").is_dir()
    assert (tmp_path / "run" / "node" / "broker.log").is_file()


def test_an_interpreter_path_is_made_absolute_without_leaving_its_venv(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # a venv's interpreter is a symlink to the base one
    monkeypatch.chdir(tmp_path)
    assert interpreter_path("venv/bin/python") == str(venv_python)  # the link itself, not its target
    assert interpreter_path("python3") == "python3"  # a bare name is looked up on PATH, as before
