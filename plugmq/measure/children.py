"""Brokers in child processes: ``plugmq serve`` on a free loopback port, for benchmarks and Spark.

A :class:`BrokerChild` is its own interpreter serving the broker of a ``broker.toml``. It prints
its address once clients can connect; its stderr goes to a log file whose tail goes into the
error of a child that did not start. Two programs:

* the reporting child (default): ``plugmq.server.run`` plus, every ``status_interval_s``, the
  broker's replication status as a ``status {json}`` line (collected in ``samples``); it stops by
  itself (SIGTERM to itself, a clean shutdown) when its stdin closes, so no broker outlives the
  run that started it, even one killed with SIGKILL;
* ``cli=True``: ``plugmq serve`` as the command line runs it (logging configured, JSON lines),
  for start-up measurements: :meth:`BrokerChild.await_answer` times the first answered request
  and :meth:`BrokerChild.startup_phases` reads the phases the server logged.

Every child is stopped by its owner in every case (:meth:`BrokerChild.stop`: SIGTERM, then SIGKILL
after a grace period; :meth:`BrokerChild.kill`: SIGKILL, a crash).
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

from plugmq.measure import MeasureError
from plugmq.measure.probes import process_cpu_s, process_rss_mb

__all__ = ["BrokerChild", "ChildError", "broker_toml", "interpreter_path", "serve_reporting", "write_config"]

_LISTENING = "plugmq serve: listening on "
# The real ``plugmq`` command group (logging set up as on the command line) with the serve verb.
_SERVE_CLI = ("from plugmq.cli import main; from plugmq.cli.serve import command; "
              "main.add_command(command); main()")
# Stops (SIGTERM to itself: a clean shutdown) when its stdin closes, which happens when the parent
# dies, even by SIGKILL after an --experiment-timeout.
_REPORTING = ("import os, signal, sys, threading\n"
              "def _orphaned():\n"
              "    while os.read(0, 4096):\n"  # the raw fd: a buffered read would block the interpreter's exit
              "        pass\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "threading.Thread(target=_orphaned, daemon=True, name='plugmq-parent-watch').start()\n"
              "from plugmq.measure.children import serve_reporting\n"
              "serve_reporting(sys.argv[1], sys.argv[2], float(sys.argv[3]))\n")


class ChildError(MeasureError):
    """A broker child did not start or did not stop cleanly."""


def serve_reporting(config_path: str, listen: str, interval_s: float) -> None:
    """Run ``plugmq serve`` for ``config_path`` and print the broker's replication status as one
    ``status {json}`` line every ``interval_s`` (the reporting child's program)."""
    from plugmq.server import run

    def ready(address: str, broker: Any) -> None:
        print(f"{_LISTENING}{address}", flush=True)

        def report() -> None:
            while True:
                replication = broker.replication
                if replication is not None:
                    try:
                        body = replication.status().as_dict()
                    except Exception as exc:  # noqa: BLE001 - the broker is closing; stop reporting
                        print(f"status-error {exc}", flush=True)
                        return
                    print("status " + json.dumps(body), flush=True)
                time.sleep(interval_s)  # the reporting cadence

        threading.Thread(target=report, daemon=True, name="plugmq-status").start()

    run(config_path, listen, ready)


# ------------------------------------------------------------------------------ config


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


def write_config(directory: Path, tables: Mapping[str, Mapping[str, Any]]) -> Path:
    """``directory/broker.toml`` holding ``tables`` (``broker.data_dir`` is relative to it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "broker.toml"
    path.write_text(broker_toml(tables), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ the child


def interpreter_path(python: str) -> str:
    """``python`` as a child started in another working directory finds it: a path made absolute
    (not resolved: a venv's python is a symlink that must stay the venv's), a bare name as it is
    (looked up on PATH)."""
    return os.path.abspath(python) if os.sep in python else python


class BrokerChild:
    """``plugmq serve`` for ``config`` in a child process (see the module docstring).

    ``listen``: the address to bind (a port of 0 picks a free one; a restart passes the address
    the previous child had). ``python``: the interpreter (another checkout's, to compare two).
    ``started_s``: seconds from spawn to the address line. ``samples``: (``time.monotonic()``,
    status) of the status lines.
    """

    def __init__(self, config: Path, *, log: Path | None = None, listen: str = "127.0.0.1:0",
                 python: str = sys.executable, status_interval_s: float = 3600.0, cli: bool = False,
                 start_timeout_s: float = 120.0) -> None:
        # The child runs in the config's directory (its relative data_dir is read from there), so
        # every path it is given must not depend on this process's working directory.
        config = Path(os.path.abspath(config))
        self.config_path = config
        self.log_path = Path(os.path.abspath(log or config.with_name("serve.log")))
        self.python = python = interpreter_path(python)
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop() / kill()
        if cli:
            import grpc  # noqa: F401 - the probe's imports cost this process, not the server: before the clock
            from rocketmq.grpc_protocol import MessagingServiceStub  # noqa: F401

            argv = [python, "-c", _SERVE_CLI, "--log-json", "--log-level", "info", "serve", "--config", str(config),
                    "--listen", listen]
        else:
            argv = [python, "-c", _REPORTING, str(config), listen, str(status_interval_s)]
        self.began = time.perf_counter()
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL if cli else subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._log, cwd=config.parent)
        self.pid = self.process.pid
        try:
            self.address = self._await_address(start_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.started_s = time.perf_counter() - self.began
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"plugmq-child-{self.pid}")
        self._reader.start()

    @classmethod
    def from_tables(cls, directory: Path, tables: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> BrokerChild:
        """A child for the config ``tables``, written to ``directory/broker.toml``."""
        return cls(write_config(directory, tables), **kwargs)

    def _await_address(self, timeout_s: float) -> str:
        found: list[str] = []

        def read() -> None:
            assert self.process.stdout is not None
            for raw in self.process.stdout:
                line = raw.decode("utf-8", "replace")
                if line.startswith(_LISTENING):
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

    def await_answer(self, timeout_s: float = 60.0, *, tls_ca: bytes | None = None) -> float:
        """Seconds from spawn to the first answered request (Heartbeat over gRPC, retried every 5 ms;
        over TLS trusting ``tls_ca`` when the server has [server.tls])."""
        import grpc
        from rocketmq.grpc_protocol import Code, MessagingServiceStub, service_pb2

        with (grpc.insecure_channel(self.address) if tls_ca is None else
              grpc.secure_channel(self.address, grpc.ssl_channel_credentials(tls_ca))) as channel:
            stub = MessagingServiceStub(channel)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    response = stub.Heartbeat(service_pb2.HeartbeatRequest(), timeout=5,
                                              metadata=(("x-mq-client-id", "plugmq-probe"),))
                    if response.status.code == Code.OK:
                        return time.perf_counter() - self.began
                except grpc.RpcError:
                    time.sleep(0.005)  # the port is bound but the server not yet answering
        raise ChildError(f"plugmq serve printed its address but answered no request within {timeout_s:g} s")

    def startup_phases(self) -> dict[str, float]:
        """The newest "start-up" line the server logged (``cli=True``): seconds spent on imports,
        broker open and server start."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        for line in reversed(text.splitlines()):
            if '"start-up"' in line:
                try:
                    event = json.loads(line)
                except ValueError:
                    break
                return {k: v for k, v in event.items() if k.endswith("_s") and isinstance(v, (int, float))}
        return {}

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
