"""Brokers in child processes for an experiment: ``plugmq serve`` on a free loopback port.

A served workload talks to its broker through ``plugmq serve`` (:mod:`plugmq.spark.replay_served`),
and a replicating plugin set needs a slave (:mod:`plugmq.spark.replication`): both are a
:class:`BrokerChild`, its own interpreter running the broker of a generated ``broker.toml``. The
child prints its address once clients can connect and, when it replicates, its replication status
as a ``status {json}`` line every ``status_interval_s``. Every child is stopped by the experiment
in every case (SIGTERM, then SIGKILL after a grace period), and stops by itself when its stdin
closes (the experiment process died); its stderr stays in a log file whose tail goes into the
error of a child that did not start.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from plugmq.bench.grpc import process_cpu_s

__all__ = ["BrokerChild", "ChildError", "broker_toml", "process_cpu_s", "process_rss_mb"]

# The child stops (SIGTERM to itself: a clean shutdown) when its stdin closes, which happens when
# the experiment process dies, even by SIGKILL after an --experiment-timeout: no broker outlives
# the experiment that started it.
_CHILD = ("import os, signal, sys, threading\n"
          "def _orphaned():\n"
          "    while os.read(0, 4096):\n"  # the raw fd: a buffered read would block the interpreter's exit
          "        pass\n"
          "    os.kill(os.getpid(), signal.SIGTERM)\n"
          "threading.Thread(target=_orphaned, daemon=True, name='plugmq-parent-watch').start()\n"
          "from plugmq.bench.replication import serve_reporting\n"
          "serve_reporting(sys.argv[1], float(sys.argv[2]))\n")


class ChildError(RuntimeError):
    """A broker child did not start or did not stop cleanly."""


def _toml_value(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value!r} cannot be written to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, f"{path}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v, f'{path}.{k}')}" for k, v in value.items()) + "}"
    raise ValueError(f"{path}: {type(value).__name__} values cannot be written to TOML")


def broker_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """``{"broker": {...}, "plugins.store_mmap": {...}, "server": {...}}`` as TOML (nested values inline)."""
    lines: list[str] = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{json.dumps(str(k))} = {_toml_value(v, f'{table}.{k}')}" for k, v in values.items())
    return "\n".join(lines) + "\n"


def process_rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (None when /proc has no answer)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class BrokerChild:
    """``plugmq serve`` for ``config`` in a child process, listening on a free loopback port.

    ``config``: the TOML tables (``broker``, ``plugins.<name>``, ``server``); ``broker.data_dir``
    is put under ``directory``. ``started_s``: seconds from spawn to the address line.
    ``samples``: (``time.monotonic()``, status) of the replication status lines.
    """

    def __init__(self, directory: Path, config: Mapping[str, Mapping[str, Any]], *, status_interval_s: float = 3600.0,
                 start_timeout_s: float = 120.0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.config_path = directory / "broker.toml"
        self.config_path.write_text(broker_toml(config), encoding="utf-8")
        self.log_path = directory / "serve.log"
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        began = time.perf_counter()
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD, str(self.config_path), str(status_interval_s)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                        cwd=directory)
        self.pid = self.process.pid
        try:
            self.address = self._await_address(start_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.started_s = time.perf_counter() - began
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"plugmq-child-{self.pid}")
        self._reader.start()

    def _await_address(self, timeout_s: float) -> str:
        assert self.process.stdout is not None
        found: list[str] = []

        def read() -> None:
            assert self.process.stdout is not None
            for raw in self.process.stdout:
                line = raw.decode("utf-8", "replace")
                if line.startswith("plugmq serve: listening on "):
                    found.append(line.split()[4])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if found:
            return found[0]
        why = (f"exited with status {self.process.poll()}" if self.process.poll() is not None
               else f"printed no address within {timeout_s:g} s")
        raise ChildError(f"plugmq serve for {self.config_path} {why}; its log ends with:\n{self.log_tail()}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace")
            if line.startswith("status "):
                try:
                    self.samples.append((time.monotonic(), json.loads(line[7:])))
                except ValueError:
                    continue

    def latest(self) -> dict[str, Any] | None:
        """The newest replication status the child printed (None before the first)."""
        return self.samples[-1][1] if self.samples else None

    def cpu_s(self) -> float:
        return process_cpu_s(self.pid)

    def rss_mb(self) -> float | None:
        return process_rss_mb(self.pid)

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-size:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash); idempotent."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._close_files()

    def _close_files(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self._log.close()

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM, SIGKILL after ``grace_s``; the exit status (0 after a clean stop). Idempotent."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_files()
        return self.process.returncode
