"""``plugmq bench replication``: send rate with async replication vs sync double-write, and lag.

Three masters run side by side for the whole run: an ``async_master`` with its slave, a
``sync_master`` with its slave (``ha`` plugin, same store and flush mode on every broker), and a
master without replication as the reference for what replication costs at all. ``--threads``
sender threads send ``--messages`` messages of ``--body-size`` bytes to one master, then the next,
``--rounds`` times in turn, so every mode sees the same machine load; the median round counts.

``--via grpc`` (default): every broker is a ``plugmq serve`` child on loopback and the senders
share one official Python client Producer (one message per SendMessage) - the path applications
use. ``--via embedded``: the masters are brokers in the bench process and a send is
``broker.put``, far cheaper, so the slave's round trip is laid bare (slaves are serve children).

Reported: msg/s per mode, sync / async (the goal is >= 0.9x), and the async slave's lag while
the sends run (bytes and messages; mean and max of the master's own status sampled every
``--sample-ms``), with the load average before and after. Failover time comes with automatic
failover (not part of this half).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.testing.cluster import await_listening
from plugmq.testing.wait import wait_for

__all__ = ["command", "measure", "serve_reporting"]

TOPIC = "BenchReplication"
_CHILD = "from plugmq.bench.replication import serve_reporting; import sys; serve_reporting(sys.argv[1], float(sys.argv[2]))"


def serve_reporting(config_path: str, interval_s: float) -> None:
    """Run ``plugmq serve`` for ``config_path`` and print the broker's replication status as one
    ``status {json}`` line every ``interval_s`` (the bench's child process)."""
    from plugmq.server import run

    def ready(address: str, broker: Any) -> None:
        print(f"plugmq serve: listening on {address}", flush=True)

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
                time.sleep(interval_s)

        threading.Thread(target=report, daemon=True, name="bench-status").start()

    run(config_path, "127.0.0.1:0", ready)


class _Child:
    """A serve child whose status lines are collected as (time, status) samples."""

    def __init__(self, config: Path, interval_s: float) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD, str(config), str(interval_s)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=config.parent)
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self.address = self._await_address()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _await_address(self) -> str:
        address = await_listening(self.process, 90)
        if address is not None:
            return address
        self.process.kill()
        raise click.ClickException(f"a plugmq serve child did not start (exit code {self.process.wait()})")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode()
            if line.startswith("status "):
                self.samples.append((time.monotonic(), json.loads(line[7:])))

    def latest(self) -> dict[str, Any] | None:
        return self.samples[-1][1] if self.samples else None

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _config(directory: Path, *, store: str, flush: str, role: str, broker_id: int, master: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    plugins = [store, "filter_tag"] + (["ha"] if role != "none" else [])
    lines = ['[broker]', 'name = "bench-r"', 'data_dir = "data"', f"plugins = {json.dumps(plugins)}",
             f'role = "{"async_master" if role == "none" else role}"', f"broker_id = {broker_id}",
             f"[plugins.{store}]", f'flush = "{flush}"']
    if role != "none":
        lines += ["[plugins.ha]", 'listen = "127.0.0.1:0"', "heartbeat_ms = 200"]
        if master:
            lines.append(f'master = "{master}"')
    lines += ["[server]", "long_polling_s = 2"]
    path = directory / "broker.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _message(body: bytes) -> Any:
    from rocketmq import Message

    message = Message()
    message.topic = TOPIC
    message.body = body
    return message


def _threads(send_one: Callable[[], None], messages: int, threads: int) -> float:
    per_thread = messages // threads
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(per_thread):
                send_one()
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise click.ClickException(f"a send failed: {errors[0]}")
    return per_thread * threads / elapsed


#: Bound on waits for a child broker (starting, a slave connecting or catching up).
_WAIT_S = 60.0


class _Target:
    """One master (role ``none``: without replication) and, for the other roles, its slave."""

    samples: list[tuple[float, dict[str, Any]]]

    def send(self, messages: int, threads: int, body: bytes) -> float:
        raise NotImplementedError

    def latest(self) -> dict[str, Any]:
        return self.samples[-1][1] if self.samples else {}

    def close(self) -> None:
        raise NotImplementedError


class _GrpcTarget(_Target):
    """The master is a serve child too; one official-client Producer shared by the sender threads."""

    def __init__(self, root: Path, role: str, store: str, flush: str, slave_flush: str, interval: float) -> None:
        from rocketmq import ClientConfiguration, Credentials, Producer

        self.children: list[_Child] = []
        self.master = _Child(_config(root / "master", store=store, flush=flush, role=role, broker_id=0, master=None),
                             interval)
        self.children.append(self.master)
        self.samples = self.master.samples
        if role != "none":
            wait_for(self.latest, _WAIT_S, f"the {role}'s status", interval=0.05)
            self.children.append(_Child(_config(root / "slave", store=store, flush=slave_flush, role="slave", broker_id=1,
                                                master=self.latest()["address"]), interval))
            wait_for(lambda: self.latest().get("slaves"), _WAIT_S, f"the {role}'s slave to connect", interval=0.05)
        self.producer = Producer(ClientConfiguration(self.master.address, Credentials(), request_timeout=30), (TOPIC,))
        self.producer.startup()

    def send(self, messages: int, threads: int, body: bytes) -> float:
        return _threads(lambda: self.producer.send(_message(body)), messages, threads)

    def close(self) -> None:
        self.producer.shutdown()
        for child in reversed(self.children):
            child.stop()


class _EmbeddedTarget(_Target):
    """The master is a Broker in this process (sends are ``broker.put``); the slave a serve child."""

    def __init__(self, root: Path, role: str, store: str, flush: str, slave_flush: str, interval: float) -> None:
        from plugmq.broker.broker import Broker

        plugins = [store, "filter_tag"] + (["ha"] if role != "none" else [])
        options: dict[str, Any] = {store: {"flush": flush}}
        if role != "none":
            options["ha"] = {"heartbeat_ms": 200}
        self.broker = Broker.open(root / "master", plugins=plugins, options=options, name="bench-r",
                                  role="async_master" if role == "none" else role)
        self.broker.create_topic(TOPIC, 4)
        self.samples = []
        self.children: list[_Child] = []
        self._stop = threading.Event()
        replication = self.broker.replication
        if replication is not None:
            self.children.append(_Child(_config(root / "slave", store=store, flush=slave_flush, role="slave", broker_id=1,
                                                master=replication.status().address), interval))
            wait_for(lambda: replication.status().slaves, _WAIT_S, f"the {role}'s slave to connect", interval=0.05)

            def sample() -> None:
                while not self._stop.wait(interval):
                    self.samples.append((time.monotonic(), replication.status().as_dict()))

            self._sampler = threading.Thread(target=sample, daemon=True)
            self._sampler.start()

    def send(self, messages: int, threads: int, body: bytes) -> float:
        from plugmq.core import Message, SendStatus

        counter = iter(range(1 << 62))

        def put() -> None:
            result = self.broker.put(Message(TOPIC, body), next(counter) % 4)
            if result.status is not SendStatus.SEND_OK:
                raise click.ClickException(f"send answered {result.status.value}")

        return _threads(put, messages, threads)

    def latest(self) -> dict[str, Any]:
        replication = self.broker.replication
        return replication.status().as_dict() if replication is not None else {}

    def close(self) -> None:
        self._stop.set()
        for child in reversed(self.children):
            child.stop()
        self.broker.close()


def _slave_lag(samples: list[tuple[float, dict[str, Any]]], begin: float, end: float) -> tuple[list[int], list[int]]:
    lag_bytes: list[int] = []
    lag_messages: list[int] = []
    for at, status in list(samples):
        if begin <= at <= end and status.get("slaves"):
            slave = status["slaves"][0]
            lag_bytes.append(int(slave["lag_bytes"]))
            if slave.get("lag_messages") is not None:
                lag_messages.append(int(slave["lag_messages"]))
    return lag_bytes, lag_messages


ROLES = ("async_master", "sync_master", "none")


def measure(messages: int, threads: int, body_size: int, store: str, flush: str, slave_flush: str, rounds: int,
            sample_ms: int, via: str) -> dict[str, Any]:
    """Rates per mode (every round), lag samples of the async slave, load averages."""
    body = os.urandom(body_size)
    interval = sample_ms / 1000
    result: dict[str, Any] = {"rates": {role: [] for role in ROLES}, "lag_bytes": [], "lag_messages": [],
                              "load_before": os.getloadavg()}
    make = _GrpcTarget if via == "grpc" else _EmbeddedTarget
    targets: dict[str, _Target] = {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-repl-") as tmp:
        try:
            for role in ROLES:
                targets[role] = make(Path(tmp) / role, role, store, flush, slave_flush, interval)
                targets[role].send(threads * 20, threads, body)  # warm-up: routes, channels, topic, stream
            for _ in range(rounds):
                for role in ROLES:
                    begin = time.monotonic()
                    result["rates"][role].append(targets[role].send(messages, threads, body))
                    if role == "async_master":
                        time.sleep(interval * 2)  # the sample taken as the last send returned
                        lag_bytes, lag_messages = _slave_lag(targets[role].samples, begin, time.monotonic())
                        result["lag_bytes"] += lag_bytes
                        result["lag_messages"] += lag_messages
            for role in ("async_master", "sync_master"):
                wait_for(targets[role].latest, _WAIT_S, f"the {role}'s slave to catch up",
                         until=lambda status: status.get("lag_bytes", 1) == 0, interval=0.05)
            result["load_after"] = os.getloadavg()
        finally:
            for target in targets.values():
                target.close()
    return result


@click.command("replication")
@click.option("--messages", default=3_000, show_default=True, help="messages per round and mode")
@click.option("--threads", default=8, show_default=True, help="sender threads sharing one Producer")
@click.option("--body-size", default=128, show_default=True, help="message body bytes")
@click.option("--store", default="store_mmap", show_default=True, help="storage plugin of every broker")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="store flush mode of the masters")
@click.option("--slave-flush", type=click.Choice(["async", "sync"]), default=None,
              help="store flush mode of the slaves (default: --flush); a sync-flush slave confirms after its fsync")
@click.option("--rounds", default=3, show_default=True, help="alternating rounds per mode (the median is shown)")
@click.option("--sample-ms", default=50, show_default=True, help="how often the async master samples its lag")
@click.option("--via", type=click.Choice(["grpc", "embedded"]), default="grpc", show_default=True,
              help="grpc: masters are plugmq serve children, the official client sends; embedded: masters are "
                   "brokers in this process, sends are broker.put (slaves are serve children either way)")
def command(messages: int, threads: int, body_size: int, store: str, flush: str, slave_flush: str | None,
            rounds: int, sample_ms: int, via: str) -> None:
    """Sync double-write vs async replication send rate (goal >= 0.9x) and replication lag."""
    try:
        import rocketmq  # noqa: F401
    except ModuleNotFoundError as exc:
        raise click.ClickException("plugmq bench replication needs the 'serve' extra (rocketmq-python-client)") from exc
    console = Console()
    if not console.is_terminal:
        console = Console(width=130)
    slave_flush = slave_flush or flush
    result = measure(messages, threads, body_size, store, flush, slave_flush, rounds, sample_ms, via)
    rates = {role: statistics.median(values) for role, values in result["rates"].items()}
    how = ("masters served by plugmq serve, 1 message per SendMessage from the official Python client"
           if via == "grpc" else "masters embedded in this process, sends are broker.put")
    table = Table(title=f"replication over loopback: {threads} sender threads x {messages:,} x {body_size} B per round, "
                        f"{rounds} alternating rounds, {store} flush={flush} on masters, flush={slave_flush} on slaves; {how}")
    for column in ("mode", "msg/s (median)", "rounds", "vs async_master", "vs no replication"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    names = {"none": "master without replication", "async_master": "async_master + slave (异步复制)",
             "sync_master": "sync_master + slave (同步双写)"}
    for role in ("async_master", "sync_master", "none"):
        table.add_row(names[role], f"{rates[role]:,.0f}", " ".join(f"{r:,.0f}" for r in result["rates"][role]),
                      f"{rates[role] / rates['async_master']:.3f}x", f"{rates[role] / rates['none']:.3f}x")
    console.print(table)
    lag_bytes, lag_messages = result["lag_bytes"], result["lag_messages"]
    if lag_bytes:
        console.print(f"async slave lag while sending ({len(lag_bytes)} samples every {sample_ms} ms): "
                      f"bytes mean {statistics.fmean(lag_bytes):,.0f} max {max(lag_bytes):,}; "
                      + (f"messages mean {statistics.fmean(lag_messages):,.1f} max {max(lag_messages):,}"
                         if lag_messages else "messages not counted"))
    else:
        console.print("async slave lag: no sample fell inside the send windows; raise --messages")
    before, after = result["load_before"], result["load_after"]
    console.print(f"sync / async = {rates['sync_master'] / rates['async_master']:.3f}x (goal >= 0.9x); "
                  f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
                  f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
