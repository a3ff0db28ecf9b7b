"""``plugmq bench features``: what the dedup window costs, and how exactly a rate limit holds.

``dedup``: each round opens two brokers in fresh temp dirs (store_mmap at the given flush mode, 4
queues, default plugins otherwise): one whose topic has ``[topics.Bench] dedup = true``, one
without. One producer thread sends ``--messages`` messages of ``--size`` bytes on each, one per
``producer.send`` (each with its own message id, as the official clients send them). Runs alternate
their order round by round; each rate is the best of ``--rounds``. Then every message is sent
again with its id, as a client's retry would: the figure is how many of those were stored (0).

``ratelimit``: a ``plugmq serve`` child whose ``[limits.groups.limited]`` allows ``--rate``
messages/s; a backlog stored before it starts. First a baseline: one unlimited group ("free-alone")
drains ``--free-messages`` messages alone. Then 4 consumers of the limited group in 2 processes
(official RocketMQ Python client, SimpleConsumer, receive + ack) and another unlimited group
("free") in a third process run together: the limited group's rate over ``--seconds`` (after a
warm-up that spends the bucket's initial burst) against ``--rate``, and the free group's drain
rate against the baseline's.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.core.message import Message
from plugmq.core.names import Prop

__all__ = ["command", "consume_timed"]

TOPIC = "Bench"


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True, width=200)


def _load() -> str:
    load = os.getloadavg()
    return f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"


@click.group("features")
def command() -> None:
    """Dedup window cost and rate-limit accuracy (each as a ratio to a same-run baseline)."""


# ------------------------------------------------------------------------------------------- dedup
def _dedup_run(dedup: bool, messages: int, size: int, flush: str) -> tuple[float, float, int]:
    """(sent/s, sent per CPU-second, messages stored after every message was sent a second time) of
    one broker. Per CPU-second (the whole process's) moves far less than wall-clock rates on a busy
    shared machine."""
    body = b"x" * size
    topics = {TOPIC: {"dedup": True}} if dedup else {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-dedup-") as tmp, \
            Broker.open(Path(tmp), topics=topics, options={"store_mmap": {"flush": flush}}) as broker:
        broker.create_topic(TOPIC, 4)
        ids = [f"bench-{i:08d}" for i in range(messages)]
        counter = itertools.count()
        started, cpu_started = time.perf_counter(), time.process_time()
        for unique_id in ids:
            broker.put(Message(TOPIC, body), next(counter) % 4, extra_properties={Prop.UNIQ_KEY: unique_id})
        rate, per_cpu = messages / (time.perf_counter() - started), messages / (time.process_time() - cpu_started)
        if dedup:
            for unique_id in ids:  # every send retried
                broker.put(Message(TOPIC, body), next(counter) % 4, extra_properties={Prop.UNIQ_KEY: unique_id})
        stored = sum(broker.max_offset(queue) for queue in broker.topic_queues(TOPIC))
        return rate, per_cpu, stored


@command.command("dedup")
@click.option("--messages", type=int, default=20_000, show_default=True, help="Messages per run.")
@click.option("--size", type=int, default=1024, show_default=True, help="Body size in bytes.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Rounds; each rate is the best.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="store_mmap's flush mode.")
def dedup(messages: int, size: int, rounds: int, flush: str) -> None:
    """Send rate with a dedup window on the topic, as a ratio to without (same run)."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    per_cpu: dict[bool, list[float]] = {False: [], True: []}
    stored = 0
    for round_number in range(rounds):
        for on in ((False, True) if round_number % 2 == 0 else (True, False)):
            rate, cpu_rate, count = _dedup_run(on, messages, size, flush)
            rates[on].append(rate)
            per_cpu[on].append(cpu_rate)
            if on:
                stored = count
    best = {on: max(r) for on, r in rates.items()}
    best_cpu = {on: max(r) for on, r in per_cpu.items()}
    table = Table(title=f"dedup window on vs off: {messages} x {size} B, store_mmap flush={flush}, 1 producer "
                        f"thread (Broker.put, one message each), best of {rounds}", title_justify="left")
    for column in ("run", "sent msg/s", "ratio", "msg per CPU-s", "CPU ratio", "sent/s, all rounds"):
        table.add_column(column, no_wrap=True)
    for on, label in ((False, "dedup off (baseline)"), (True, "dedup on (window 600 s)")):
        table.add_row(label, f"{best[on]:,.0f}", f"{best[on] / best[False]:.2f}x", f"{best_cpu[on]:,.0f}",
                      f"{best_cpu[on] / best_cpu[False]:.2f}x", " ".join(f"{r:,.0f}" for r in rates[on]))
    console = _console()
    console.print(table)
    console.print(f"every message sent twice with dedup on: {stored:,} stored of {messages:,} ids "
                  f"({stored - messages:,} duplicates); {_load()}")


# --------------------------------------------------------------------------------------- ratelimit
def consume_timed(address: str, group: str, threads: int, batch: int) -> None:
    """A consumer process: receive + ack for ``group`` on ``threads`` threads until stdin closes,
    printing JSON lines: {"ready": true}, the running count of acks every 0.2 s, and at the end the
    wall-clock time of every ack."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    stop = threading.Event()
    times: list[list[float]] = [[] for _ in range(threads)]
    consumers = [SimpleConsumer(ClientConfiguration(address, Credentials(), request_timeout=10), group,
                                {TOPIC: FilterExpression()}, await_duration=2) for _ in range(threads)]
    for consumer in consumers:
        consumer.startup()

    def receive(index: int) -> None:
        consumer = consumers[index]
        while not stop.is_set():
            try:
                received = consumer.receive(batch, 30)
            except Exception:  # noqa: BLE001 - a limited group is answered TOO_MANY_REQUESTS: ask again
                continue
            for message in received:
                consumer.ack(message)
                times[index].append(time.time())

    workers = [threading.Thread(target=receive, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    print(json.dumps({"ready": True}), flush=True)
    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    while not stop.wait(0.2):
        print(json.dumps({"acked": sum(len(t) for t in times)}), flush=True)
    for worker in workers:
        worker.join(timeout=10)
    for consumer in consumers:
        consumer.shutdown()
    print(json.dumps({"acks": sorted(t for per_thread in times for t in per_thread)}), flush=True)


class _Consumers:
    """``consume_timed`` in a child process."""

    def __init__(self, address: str, group: str, threads: int, batch: int) -> None:
        code = f"from plugmq.bench.features import consume_timed; consume_timed({address!r}, {group!r}, " \
               f"{threads}, {batch})"
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout is not None
        if '"ready"' not in self.process.stdout.readline():
            self.process.kill()
            raise click.ClickException(f"a consumer process did not start (exit {self.process.wait()})")
        self.acked = 0
        self._acks: list[float] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            update = json.loads(line)
            if "acks" in update:
                self._acks = list(update["acks"])
            else:
                self.acked = update["acked"]

    def stop(self) -> list[float]:
        """Stop it; the times of its acks."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        if self._acks is None:
            raise click.ClickException(f"a consumer process failed (exit {self.process.returncode})")
        return self._acks


def _drain_rate(acks: list[float], expected: int) -> float:
    """Messages/s of a group from its first to its last ack (it must have had all ``expected``)."""
    if len(acks) < expected:
        raise click.ClickException(f"an unlimited group received {len(acks)} of {expected} messages")
    return (len(acks) - 1) / (acks[-1] - acks[0])


def _await_acks(consumers: _Consumers, count: int, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while consumers.acked < count:
        if time.monotonic() > deadline or consumers.process.poll() is not None:
            raise click.ClickException(f"an unlimited group received {consumers.acked} of {count} messages")
        time.sleep(0.2)


@command.command("ratelimit")
@click.option("--rate", type=float, default=100.0, show_default=True, help="The limited group's messages/s.")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="The measured window.")
@click.option("--warmup", type=float, default=5.0, show_default=True,
              help="Seconds before the window (the bucket starts full: one second's worth).")
@click.option("--free-messages", type=int, default=10_000, show_default=True,
              help="The backlog each unlimited group drains.")
def ratelimit(rate: float, seconds: float, warmup: float, free_messages: int) -> None:
    """A group limited to --rate msg/s, 4 consumers in 2 processes: its rate over --seconds, and an
    unlimited group's beside it against the same group alone."""
    from plugmq.bench.grpc import ServeChild

    backlog = max(free_messages, int(rate * (seconds + warmup) * 1.5) + 1000)
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-ratelimit-") as tmp:
        config = Path(tmp) / "broker.toml"
        config.write_text(f'[broker]\ndata_dir = "data"\n[limits.groups.limited]\nmessages_per_s = {rate}\n'
                          "[server]\nlong_polling_s = 2\n")
        with Broker.from_config(config) as broker:  # the backlog, stored before the server starts
            broker.create_topic(TOPIC, 8)
            producer = broker.producer("bench")
            for _ in range(backlog):
                producer.send(Message(TOPIC, b"x" * 256))
        child = ServeChild(config, Path(tmp) / "serve.log")
        try:
            alone = _Consumers(child.address, "free-alone", 2, 32)
            _await_acks(alone, free_messages)
            baseline = _drain_rate(alone.stop()[:free_messages], free_messages)
            limited = [_Consumers(child.address, "limited", 2, 16) for _ in range(2)]
            free = _Consumers(child.address, "free", 2, 32)
            start = time.time() + warmup
            _await_acks(free, free_messages, warmup + seconds + 300)
            time.sleep(max(0.0, start + seconds + 1 - time.time()))  # the measured window is wall-clock time
            acks = sorted(t for c in limited for t in c.stop())
            free_rate = _drain_rate(free.stop()[:free_messages], free_messages)
        finally:
            child.stop()
    in_window = sum(1 for t in acks if start <= t < start + seconds)
    measured = in_window / seconds
    table = Table(title=f"rate limit {rate:g} msg/s on group 'limited': 4 SimpleConsumers (official Python client) "
                        f"in 2 processes over {seconds:g} s after {warmup:g} s; plugmq serve, backlog {backlog:,}",
                  title_justify="left")
    for column in ("group", "received msg/s", "ratio", "what the ratio is to"):
        table.add_column(column, no_wrap=True)
    table.add_row("limited", f"{measured:,.1f}", f"{measured / rate:.3f}x", f"its limit ({rate:g} msg/s)")
    table.add_row("free-alone (baseline)", f"{baseline:,.0f}", "1.00x", "itself: unlimited, alone")
    table.add_row("free, beside 'limited'", f"{free_rate:,.0f}", f"{free_rate / baseline:.2f}x", "free-alone")
    console = _console()
    console.print(table)
    console.print(f"limited group: {in_window:,} acks in the window, {len(acks):,} in all; {_load()}")
