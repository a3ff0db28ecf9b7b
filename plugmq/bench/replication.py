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

``--secret`` adds, per mode, a pair whose ha channel is authenticated with a cluster secret
(HMAC handshake and a tag on every frame); ``--tls`` one with the secret and TLS (a CA and a
certificate made for the run). Each is reported against the plain pair of its mode, same run.

Reported: msg/s per mode, sync / async (the goal is >= 0.9x), and the async slave's lag while
the sends run (bytes and messages; mean and max of the master's own status sampled every
``--sample-ms``), with the load average before and after. Failover time comes with automatic
failover (not part of this half).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.measure.children import BrokerChild, write_config
from plugmq.measure.clients import client_config, client_message
from plugmq.measure.probes import LoadWindow
from plugmq.measure.threads import run_threads
from plugmq.testing.wait import wait_for

__all__ = ["command", "measure"]

TOPIC = "BenchReplication"


def _config(directory: Path, *, store: str, flush: str, role: str, broker_id: int, master: str | None,
            security: dict[str, str]) -> Path:
    plugins = [store, "filter_tag"] + (["ha"] if role != "none" else [])
    tables: dict[str, dict[str, Any]] = {
        "broker": {"name": "bench-r", "data_dir": "data", "plugins": plugins,
                   "role": "async_master" if role == "none" else role, "broker_id": broker_id},
        f"plugins.{store}": {"flush": flush}}
    if role != "none":
        tables["plugins.ha"] = {"listen": "127.0.0.1:0", "heartbeat_ms": 200, **({"master": master} if master else {}),
                                **security}
    tables["server"] = {"long_polling_s": 2}
    return write_config(directory, tables)


def _threads(send_one: Callable[[], None], messages: int, threads: int) -> float:
    """Messages per second of ``threads`` threads each calling ``send_one`` ``messages // threads`` times."""
    per_thread = messages // threads

    def work(_index: int) -> None:
        for _ in range(per_thread):
            send_one()

    return per_thread * threads / run_threads(threads, work)


#: Bound on waits for a child broker (starting, a slave connecting or catching up).
_WAIT_S = 60.0


class _Target:
    """One master (role ``none``: without replication) and, for the other roles, its slave."""

    samples: list[tuple[float, dict[str, Any]]]
    children: list[BrokerChild]

    def send(self, messages: int, threads: int, body: bytes) -> float:
        raise NotImplementedError

    def latest(self) -> dict[str, Any]:
        return self.samples[-1][1] if self.samples else {}

    def close(self) -> None:
        raise NotImplementedError


class _GrpcTarget(_Target):
    """The master is a serve child too; one official-client Producer shared by the sender threads."""

    def __init__(self, root: Path, role: str, store: str, flush: str, slave_flush: str, interval: float,
                 security: dict[str, str]) -> None:
        from rocketmq import Producer

        self.children = []
        self.master = BrokerChild(_config(root / "master", store=store, flush=flush, role=role, broker_id=0, master=None,
                                          security=security), status_interval_s=interval)
        self.children.append(self.master)
        self.samples = self.master.samples
        if role != "none":
            wait_for(self.latest, _WAIT_S, f"the {role}'s status", interval=0.05)
            self.children.append(BrokerChild(_config(root / "slave", store=store, flush=slave_flush, role="slave",
                                                     broker_id=1, master=self.latest()["address"], security=security),
                                             status_interval_s=interval))
            wait_for(lambda: self.latest().get("slaves"), _WAIT_S, f"the {role}'s slave to connect", interval=0.05)
        self.producer = Producer(client_config(self.master.address, 30), (TOPIC,))
        self.producer.startup()

    def send(self, messages: int, threads: int, body: bytes) -> float:
        return _threads(lambda: self.producer.send(client_message(TOPIC, body)), messages, threads)

    def close(self) -> None:
        self.producer.shutdown()
        for child in reversed(self.children):
            child.stop()


class _EmbeddedTarget(_Target):
    """The master is a Broker in this process (sends are ``broker.put``); the slave a serve child."""

    def __init__(self, root: Path, role: str, store: str, flush: str, slave_flush: str, interval: float,
                 security: dict[str, str]) -> None:
        from plugmq.broker.broker import Broker

        plugins = [store, "filter_tag"] + (["ha"] if role != "none" else [])
        options: dict[str, Any] = {store: {"flush": flush}}
        if role != "none":
            options["ha"] = {"heartbeat_ms": 200, **security}
        self.broker = Broker.open(root / "master", plugins=plugins, options=options, name="bench-r",
                                  role="async_master" if role == "none" else role)
        self.broker.create_topic(TOPIC, 4)
        self.samples = []
        self.children = []
        self._stop = threading.Event()
        replication = self.broker.replication
        if replication is not None:
            self.children.append(BrokerChild(_config(root / "slave", store=store, flush=slave_flush, role="slave",
                                                     broker_id=1, master=replication.status().address,
                                                     security=security), status_interval_s=interval))
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
LEVELS = ("plain", "secret", "secret+tls")


def variants(secret: bool, tls: bool) -> list[tuple[str, str]]:
    """(role, security level) pairs measured: every mode plain, then with the secret and with TLS
    when asked, and the master without replication."""
    levels = [level for level, wanted in zip(LEVELS, (True, secret, tls), strict=True) if wanted]
    return [(role, level) for role in ROLES[:2] for level in levels] + [("none", "plain")]


def variant_key(role: str, level: str) -> str:
    return role if level == "plain" else f"{role} {level}"


def _security(directory: Path, secret: bool, tls: bool) -> dict[str, dict[str, str]]:
    """The ha options of each security level (files made for the run in ``directory``)."""
    levels: dict[str, dict[str, str]] = {"plain": {}}
    if not (secret or tls):
        return levels
    directory.mkdir(parents=True, exist_ok=True)
    secret_file = directory / "cluster.secret"
    secret_file.write_bytes(os.urandom(48).hex().encode())
    secret_file.chmod(0o600)
    levels["secret"] = {"secret_file": str(secret_file)}
    if tls:
        from plugmq.bench.grpc_tls import write_certificates

        write_certificates(directory)
        levels["secret+tls"] = {**levels["secret"], "tls_cert": str(directory / "server.pem"),
                                "tls_key": str(directory / "server.key"), "tls_ca": str(directory / "ca.pem")}
    return levels


def measure(messages: int, threads: int, body_size: int, store: str, flush: str, slave_flush: str, rounds: int,
            sample_ms: int, via: str, *, secret: bool = False, tls: bool = False) -> dict[str, Any]:
    """Rates per variant (every round), lag samples of the plain async slave, load averages."""
    body = os.urandom(body_size)
    interval = sample_ms / 1000
    load = LoadWindow()
    measured = variants(secret, tls)
    result: dict[str, Any] = {"rates": {variant_key(*v): [] for v in measured}, "lag_bytes": [], "lag_messages": [],
                              "load": load}
    make = _GrpcTarget if via == "grpc" else _EmbeddedTarget
    targets: dict[str, _Target] = {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-repl-") as tmp:
        security = _security(Path(tmp) / "security", secret, tls)
        try:
            for role, level in measured:
                key = variant_key(role, level)
                targets[key] = make(Path(tmp) / key.replace(" ", "-"), role, store, flush, slave_flush, interval,
                                    security[level])
                targets[key].send(threads * 20, threads, body)  # warm-up: routes, channels, topic, stream
            for _ in range(rounds):
                for key, target in targets.items():
                    begin = time.monotonic()
                    result["rates"][key].append(target.send(messages, threads, body))
                    if key == "async_master":
                        time.sleep(interval * 2)  # the sample taken as the last send returned
                        lag_bytes, lag_messages = _slave_lag(target.samples, begin, time.monotonic())
                        result["lag_bytes"] += lag_bytes
                        result["lag_messages"] += lag_messages
            for key, target in targets.items():
                if not key.startswith("none"):
                    wait_for(target.latest, _WAIT_S, f"the {key}'s slave to catch up",
                             until=lambda status: status.get("lag_bytes", 1) == 0, interval=0.05)
            load.finish()
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
@click.option("--secret", is_flag=True, help="also measure each mode with the ha channel authenticated by a cluster secret")
@click.option("--tls", is_flag=True, help="also measure each mode with the secret and TLS on the ha channel")
def command(messages: int, threads: int, body_size: int, store: str, flush: str, slave_flush: str | None,
            rounds: int, sample_ms: int, via: str, secret: bool, tls: bool) -> None:
    """Sync double-write vs async replication send rate (goal >= 0.9x) and replication lag."""
    try:
        import rocketmq  # noqa: F401
    except ModuleNotFoundError as exc:
        raise click.ClickException("plugmq bench replication needs the 'serve' extra (rocketmq-python-client)") from exc
    console = Console()
    if not console.is_terminal:
        console = Console(width=130)
    slave_flush = slave_flush or flush
    result = measure(messages, threads, body_size, store, flush, slave_flush, rounds, sample_ms, via, secret=secret,
                     tls=tls)
    rates = {role: statistics.median(values) for role, values in result["rates"].items()}
    how = ("masters served by plugmq serve, 1 message per SendMessage from the official Python client"
           if via == "grpc" else "masters embedded in this process, sends are broker.put")
    table = Table(title=f"replication over loopback: {threads} sender threads x {messages:,} x {body_size} B per round, "
                        f"{rounds} alternating rounds, {store} flush={flush} on masters, flush={slave_flush} on slaves; {how}")
    for column in ("mode", "ha channel", "msg/s (median)", "rounds", "vs plain, same mode", "vs async_master",
                   "vs no replication"):
        table.add_column(column, justify="left" if column in ("mode", "ha channel") else "right")
    names = {"none": "master without replication", "async_master": "async_master + slave (异步复制)",
             "sync_master": "sync_master + slave (同步双写)"}
    for role, level in variants(secret, tls):
        key = variant_key(role, level)
        table.add_row(names[role], "-" if role == "none" else level, f"{rates[key]:,.0f}",
                      " ".join(f"{r:,.0f}" for r in result["rates"][key]), f"{rates[key] / rates[role]:.3f}x",
                      f"{rates[key] / rates['async_master']:.3f}x", f"{rates[key] / rates['none']:.3f}x")
    console.print(table)
    lag_bytes, lag_messages = result["lag_bytes"], result["lag_messages"]
    if lag_bytes:
        console.print(f"async slave lag while sending ({len(lag_bytes)} samples every {sample_ms} ms): "
                      f"bytes mean {statistics.fmean(lag_bytes):,.0f} max {max(lag_bytes):,}; "
                      + (f"messages mean {statistics.fmean(lag_messages):,.1f} max {max(lag_messages):,}"
                         if lag_messages else "messages not counted"))
    else:
        console.print("async slave lag: no sample fell inside the send windows; raise --messages")
    console.print(f"sync / async = {rates['sync_master'] / rates['async_master']:.3f}x (goal >= 0.9x); "
                  f"{result['load'].text()}")
