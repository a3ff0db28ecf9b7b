"""``plugmq bench cluster``: how long a killed broker stays in the routes, and what senders notice.

A real ZooKeeper (from its jar) and ``--brokers`` ``plugmq serve`` children on loopback, sessions
timing out after ``--session-timeout`` s. ``--threads`` threads of the official Python client's
producer (access point: the first broker) send ``--body-size`` B messages one at a time, without
pause. Each round: ``--steady`` s of sends with every broker up (the baseline), then kill -9 of
the last broker; the route-change time is from the kill until the first broker's QueryRoute no
longer names the dead broker (polled every 10 ms); the kill window runs from the kill to
``--window`` s after it, and its sends are counted (a send succeeds when the client's own retries
found a live broker: its cached route still names the dead one until it refreshes, every 30 s).
Then the broker is restarted and the time until it is routed again is measured. Rates in the
window are reported as a ratio to the steady rate of the same round.
"""

from __future__ import annotations

import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
import click
from rich.console import Console
from rich.table import Table

from plugmq.kit.histogram import Histogram
from plugmq.measure.clients import client_config, client_message
from plugmq.measure.probes import LoadWindow
from plugmq.testing import (
    ServeProcess,
    ZooKeeperServer,
    query_route,
    seconds_until,
    wait_for,
    write_broker_config,
    zookeeper_missing,
)

__all__ = ["Round", "command", "measure"]

TOPIC = "BenchCluster"


@attrs.frozen
class Round:
    route_change_s: float
    rejoin_s: float
    steady_ok: int
    steady_failed: int
    steady_s: float
    window_ok: int
    window_failed: int
    window_s: float
    steady_p99_ms: float
    window_p99_ms: float
    errors: tuple[str, ...] = ()

    @property
    def steady_rate(self) -> float:
        return self.steady_ok / self.steady_s

    @property
    def window_rate(self) -> float:
        return self.window_ok / self.window_s

    @property
    def window_success(self) -> float:
        total = self.window_ok + self.window_failed
        return self.window_ok / total if total else 1.0


class _Senders:
    """Producer threads counting outcomes and latencies into the current phase."""

    def __init__(self, address: str, threads: int, body: bytes) -> None:
        from rocketmq import Producer

        self._body = body
        self.producer = Producer(client_config(address, 3), (TOPIC,))
        self.producer.startup()
        self._lock = threading.Lock()
        self._phase: dict[str, Any] = self._new_phase()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _new_phase() -> dict[str, Any]:
        return {"ok": 0, "failed": 0, "latencies": [], "errors": [], "started": time.monotonic()}

    def _send(self) -> None:
        while not self._stop.is_set():
            message = client_message(TOPIC, self._body)
            started = time.monotonic()
            error = None
            try:
                self.producer.send(message)
                outcome = "ok"
            except Exception as exc:  # noqa: BLE001 - a failed send is what is counted here
                outcome, error = "failed", f"{type(exc).__name__}: {exc}"[:160]
            with self._lock:
                self._phase[outcome] += 1
                if error is not None:
                    self._phase["errors"].append(error)
                self._phase["latencies"].append(time.monotonic() - started)

    def next_phase(self) -> dict[str, Any]:
        """End the current phase (returning its counts and duration) and start a new one."""
        with self._lock:
            ended, self._phase = self._phase, self._new_phase()
        ended["seconds"] = time.monotonic() - ended["started"]
        return ended

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.producer.shutdown()


def _p99_ms(latencies: list[float]) -> float:
    """p99 of send latencies given in seconds (plugmq.kit.histogram; 0 without sends)."""
    hist = Histogram()
    hist.record_many(seconds * 1000 for seconds in latencies)
    return hist.quantile(0.99) or 0.0


def _routed(address: str) -> set[str]:
    return {broker for broker, _queue, _endpoint in query_route(address, TOPIC)}


def measure(directory: Path, *, brokers: int, session_timeout_s: float, threads: int, rounds: int,
            steady_s: float, window_s: float, body_size: int) -> list[Round]:
    names = [f"broker-{chr(ord('a') + i)}" for i in range(brokers)]
    zookeeper = ZooKeeperServer(directory / "zookeeper")
    zookeeper.start()
    cluster = f"bench{uuid.uuid4().hex[:6]}"
    configs = {name: write_broker_config(directory, name, zookeeper=zookeeper.hosts, cluster=cluster,
                                         session_timeout_s=session_timeout_s) for name in names}
    processes: dict[str, ServeProcess] = {}
    senders: _Senders | None = None
    results = []
    try:
        processes = {name: ServeProcess(config) for name, config in configs.items()}
        for process in processes.values():
            process.await_address()
        first, victim = processes[names[0]].address, names[-1]
        assert first is not None
        wait_for(lambda: _routed(first), 30, "every broker in the route", until=lambda routed: routed == set(names))
        senders = _Senders(first, threads, b"x" * body_size)
        for _round in range(rounds):
            senders.next_phase()
            time.sleep(steady_s)
            steady = senders.next_phase()
            processes[victim].stop(signal.SIGKILL)
            killed = time.monotonic()
            route_change = seconds_until(lambda: victim not in _routed(first), session_timeout_s * 10,
                                         f"{victim} to leave the route")
            time.sleep(max(0.0, window_s - (time.monotonic() - killed)))
            window = senders.next_phase()
            processes[victim] = ServeProcess(configs[victim])
            processes[victim].await_address()
            rejoin = seconds_until(lambda: victim in _routed(first), 30, f"{victim} to rejoin the route")
            results.append(Round(route_change, rejoin, steady["ok"], steady["failed"], steady["seconds"],
                                 window["ok"], window["failed"], window["seconds"], _p99_ms(steady["latencies"]),
                                 _p99_ms(window["latencies"]), tuple(steady["errors"] + window["errors"])))
            # A new producer after each round: the old one's cached route would hide the rejoined broker.
            senders.stop()
            senders = _Senders(first, threads, b"x" * body_size)
    finally:
        if senders is not None:
            senders.stop()
        for process in processes.values():
            process.stop(signal.SIGTERM)
        zookeeper.stop()
    return results


@click.command("cluster")
@click.option("--brokers", default=3, show_default=True, help="plugmq serve children in the cluster")
@click.option("--session-timeout", "session_timeout_s", default=4.0, show_default=True,
              help="cluster_zk session_timeout_s (seconds)")
@click.option("--threads", default=2, show_default=True, help="producer threads (one send at a time each)")
@click.option("--rounds", default=3, show_default=True, help="kill -9 / restart rounds")
@click.option("--steady", "steady_s", default=5.0, show_default=True, help="seconds of sends before each kill")
@click.option("--window", "window_s", default=8.0, show_default=True, help="seconds of sends counted after each kill")
@click.option("--body-size", default=128, show_default=True, help="message body bytes")
def command(brokers: int, session_timeout_s: float, threads: int, rounds: int, steady_s: float, window_s: float,
            body_size: int) -> None:
    """Route-change time after kill -9 of a broker, and the send success rate while it happens."""
    missing = zookeeper_missing()
    if missing:
        raise click.ClickException(f"plugmq bench cluster needs a ZooKeeper server: {missing}")
    if brokers < 2:
        raise click.ClickException("--brokers must be at least 2: one is killed, another keeps serving")
    load = LoadWindow()
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-cluster-") as directory:
        results = measure(Path(directory), brokers=brokers, session_timeout_s=session_timeout_s, threads=threads,
                          rounds=rounds, steady_s=steady_s, window_s=window_s, body_size=body_size)
    load.finish()
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    table = Table(title=f"kill -9 of 1 of {brokers} brokers: session timeout {session_timeout_s:g} s, {threads} "
                        f"producer threads x {body_size} B, sync sends, batch size 1, window {window_s:g} s")
    for column in ("round", "route change s", "rejoin s", "steady msg/s", "steady failed", "window msg/s",
                   "window vs steady", "window sends ok", "window failed", "success", "p99 ms steady/window"):
        table.add_column(column, justify="right")
    for i, r in enumerate(results, 1):
        table.add_row(str(i), f"{r.route_change_s:.2f}", f"{r.rejoin_s:.2f}", f"{r.steady_rate:,.0f}",
                      str(r.steady_failed), f"{r.window_rate:,.0f}", f"{r.window_rate / r.steady_rate:.2f}",
                      f"{r.window_ok:,}", str(r.window_failed), f"{r.window_success:.2%}",
                      f"{r.steady_p99_ms:.0f} / {r.window_p99_ms:.0f}")
    console.print(table)
    for i, r in enumerate(results, 1):
        for error in sorted(set(r.errors)):
            console.print(f"round {i}: {r.errors.count(error)} failed send(s): {error}")
    console.print(load.text())
