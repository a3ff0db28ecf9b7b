"""A cluster on one machine for tests and benchmarks: ``plugmq serve`` children and a route probe.

Each broker is a real child process (``plugmq serve --listen 127.0.0.1:0``) with a config written
by :func:`write_broker_config`; :func:`query_route` asks any broker for a topic's route over gRPC,
as the official clients do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["CLUSTER_PLUGINS", "ServeProcess", "await_listening", "broker_status", "query_route", "serving",
           "status_or_none", "write_broker_config"]


# The real ``plugmq`` command group (logging set up as on the command line) with the serve verb.
_SERVE = ("from plugmq.cli import main; from plugmq.cli.serve import command; "
          "main.add_command(command); main()")
CLUSTER_PLUGINS = ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "alloc", "txn", "cluster_zk"]


def write_broker_config(directory: Path, name: str, *, zookeeper: str, cluster: str, room: str = "",
                        session_timeout_s: float = 2.0, extra: str = "",
                        plugins: Sequence[str] = tuple(CLUSTER_PLUGINS)) -> Path:
    """A broker TOML for ``plugmq serve`` in ``cluster`` (data under ``directory/<name>``); ``extra``
    follows the ``[server]`` table's first line."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{name}.toml"
    room_line = f'room = "{room}"\n' if room else ""
    config.write_text(
        f'[broker]\nname = "{name}"\ndata_dir = "{name}"\n{room_line}plugins = {list(plugins)!r}\n'
        f'[cluster]\nname = "{cluster}"\n'
        f'[plugins.cluster_zk]\nhosts = "{zookeeper}"\nsession_timeout_s = {session_timeout_s}\n'
        f"[server]\nlong_polling_s = 1\n{extra}", encoding="utf-8")
    return config


def await_listening(process: subprocess.Popen[bytes], wait_s: float) -> str | None:
    """Read a ``plugmq serve`` child's stdout up to its ``listening on HOST:PORT`` line; returns
    the address, or None when the child exited (or ``wait_s`` passed) before saying it."""
    assert process.stdout is not None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode()
        if not line:
            return None  # the child exited
        if line.startswith("plugmq serve: listening on "):
            return line.split()[4]
    return None


class ServeProcess:
    """``plugmq serve`` as a child process; ``address`` once it listens. Always stopped by the caller.

    ``fd_limit``: the child's RLIMIT_NOFILE (``ulimit -n``), set before it starts: one number for
    the soft and hard limits, or (soft, hard); ``env``: extra environment variables; ``listen``: its
    client port (a fixed one lets a restarted broker come back where clients look). Its log
    (stderr) is appended to ``log_path`` (default: the config's name with ``.log``), so a restarted
    child continues the same file; ``log_json`` logs JSON lines (``--log-json``).
    """

    def __init__(self, config: Path, wait_s: float = 60.0, *, fd_limit: int | tuple[int, int] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None, log_json: bool = False,
                 listen: str = "127.0.0.1:0") -> None:
        # The child runs in the config's directory: its path must not depend on this process's.
        config = Path(os.path.abspath(config))
        self.config = config
        self.log_path = config.with_suffix(".log") if log_path is None else log_path
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        soft, hard = fd_limit if isinstance(fd_limit, tuple) else (fd_limit, fd_limit)
        limit = (f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
                 if fd_limit is not None else "")
        self.process = subprocess.Popen(
            [sys.executable, "-c", limit + _SERVE, *(["--log-json"] if log_json else []), "--log-level", "info",
             "serve", "--config", str(config), "--listen", listen],
            stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, cwd=config.parent,
            env={**os.environ, **(env or {})})
        self._wait_s = wait_s
        self.address: str | None = None

    def await_address(self) -> str:
        """Wait for the child's ``listening on`` line; its address. A child that exits (or stays
        silent for ``wait_s``) is killed and the wait fails naming the log."""
        self.address = await_listening(self.process, self._wait_s)
        if self.address is not None:
            return self.address
        self.stop(signal.SIGKILL)
        raise AssertionError(f"plugmq serve did not come up (exit code {self.process.returncode}); "
                             f"see {self.log_path}")

    @property
    def endpoint(self) -> str:
        """The address it listens on (an error before :meth:`await_address` returned it)."""
        if self.address is None:
            raise AssertionError(f"plugmq serve ({self.config}) is not listening yet: await_address() first")
        return self.address

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` (SIGSTOP, SIGCONT, ...) to the child if it still runs."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Send ``signum`` and wait; SIGKILL after ``timeout_s``. Idempotent; a stopped child is continued
        first (it cannot act on SIGTERM while stopped)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            os.kill(self.process.pid, signum)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self._log.closed:
            self._log.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


@contextmanager
def serving(config: Path, wait_s: float = 60.0, *, log_path: Path | None = None,
            log_json: bool = False) -> Iterator[ServeProcess]:
    """A :class:`ServeProcess` listening (its ``address`` set), stopped with SIGTERM on exit."""
    child = ServeProcess(config, wait_s, log_path=log_path, log_json=log_json)
    try:
        child.await_address()
        yield child
    finally:
        child.stop()


def broker_status(address: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """``plugmq admin broker-status`` of the served broker at ``address`` (JSON form)."""
    from plugmq.server.admin import AdminClient

    with AdminClient(address, timeout_s=timeout_s) as client:
        return dict(client.call("broker-status", {}))


def status_or_none(address: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """:func:`broker_status`, or None when the broker does not answer (starting, killed, frozen)."""
    try:
        return broker_status(address, timeout_s)
    except Exception:  # noqa: BLE001 - a broker starting or just killed: not answering is the answer
        return None


def query_route(address: str, topic: str, timeout_s: float = 3.0) -> list[tuple[str, int, str]]:
    """``(broker name, queue id, endpoint)`` of each queue in ``topic``'s route, as ``address`` answers."""
    import grpc

    from plugmq.server.protocol import Code, service_pb2, service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = service_pb2.QueryRouteRequest()
        request.topic.name = topic
        response = stub.QueryRoute(request, timeout=timeout_s)
    if response.status.code != Code.OK:
        raise RuntimeError(f"QueryRoute {topic!r} at {address}: {response.status.message}")
    return [(q.broker.name, q.id, f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}")
            for q in response.message_queues]
