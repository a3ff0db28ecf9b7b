"""``plugmq bench trace``: the send rate with the trace plugin on, as a ratio to the same broker without it.

Each round opens two brokers in fresh temp dirs (store_mmap, the given flush mode, 4 queues): one
with plugins ``store_mmap, filter_tag`` (the baseline), one with ``trace`` added. On each, one
producer thread sends ``--messages`` messages of ``--size`` bytes (one per ``producer.send``) while
a simple consumer thread receives and acks them as they come, so the trace plugin records a
delivered and an acked step per message and its writer thread runs beside the sends, as on a
live broker. Runs alternate their order round by round; each figure is the best of ``--rounds``
(a shared machine's noise only slows a round down). The recorder must have written every event by
the time its broker closed (dropped events are reported: a fast recorder that drops is no win).
Beside the wall-clock rates, messages per CPU-second of the whole process (producer, consumer and
the trace writer share one interpreter) says what the plugin costs when the machine is busy with
other work, as a shared 2-core machine often is.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.core.message import Message
from plugmq.measure.probes import LoadWindow

__all__ = ["command", "send_rate"]

_BASE = ["store_mmap", "filter_tag"]


def send_rate(traced: bool, messages: int, size: int, flush: str, consume: bool = True
              ) -> tuple[float, float, float, int, int]:
    """(sent/s, consumed/s, messages per CPU-second, trace events written, dropped) of one run.

    Messages per CPU-second: every message sent and consumed, over the process's CPU time from the
    first send until the last ack and the recorder's last batch (every thread: producer, consumer,
    the trace writer). On a shared machine it moves far less than wall-clock rates."""
    from plugmq.plugins.trace import recorder

    plugins = [*_BASE, "trace"] if traced else _BASE
    body = b"x" * size
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-trace-") as tmp:
        broker = Broker.open(Path(tmp), plugins=plugins, options={"store_mmap": {"flush": flush}})
        written = dropped = 0
        consumed: list[float] = []
        try:
            broker.create_topic("Bench", 4)
            producer = broker.producer("bench")
            consumer = broker.simple_consumer("bench-consumer", {"Bench": "*"}, client_id="bench-1")
            batch = [Message("Bench", body, keys=(f"k{i}",)) for i in range(messages)]

            def receive_and_ack() -> None:
                acked = 0
                deadline = time.monotonic() + 600
                while acked < messages and time.monotonic() < deadline:
                    for message in consumer.receive(32, invisible_duration_s=60, await_duration_s=0.2):
                        consumer.ack(message)
                        acked += 1
                consumed.append(acked / (time.perf_counter() - started))

            started = time.perf_counter()
            cpu_started = time.process_time()
            thread = threading.Thread(target=receive_and_ack, name="bench-trace-consumer")
            if consume:
                thread.start()
            for message in batch:
                producer.send(message)
            elapsed = time.perf_counter() - started
            if consume:
                thread.join()
            found = recorder(broker.name) if traced else None
            if found is not None:
                found.flush()
            cpu = time.process_time() - cpu_started
        finally:
            broker.close()  # flushes the recorder's last batch
        if found is not None:
            written, dropped = found.written, found.dropped
        return messages / elapsed, consumed[0] if consumed else 0.0, messages / cpu, written, dropped


@click.command("trace")
@click.option("--messages", type=int, default=20_000, show_default=True, help="Messages per run.")
@click.option("--size", type=int, default=1024, show_default=True, help="Body size in bytes.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Rounds; each figure is the best.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="store_mmap's flush mode.")
@click.option("--consume/--no-consume", default=True, show_default=True,
              help="A simple consumer receives and acks beside the sends (--no-consume: the send path alone).")
def command(messages: int, size: int, rounds: int, flush: str, consume: bool) -> None:
    """Send rate with the trace plugin on, as a ratio to off (same run, best of --rounds)."""
    runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    written = dropped = 0
    load = LoadWindow()
    for round_number in range(rounds):
        order = (False, True) if round_number % 2 == 0 else (True, False)
        for traced in order:
            sent, consumed, per_cpu, w, d = send_rate(traced, messages, size, flush, consume)
            runs[traced].append((sent, consumed, per_cpu))
            if traced:
                written, dropped = w, d
    best = {traced: tuple(max(r[i] for r in rows) for i in range(3)) for traced, rows in runs.items()}
    load.finish()
    beside = " and 1 simple consumer thread (receive 32, ack each)" if consume else " thread, no consumer"
    table = Table(title=f"trace plugin on vs off: {messages} x {size} B, store_mmap flush={flush}, 1 producer"
                        f"{beside}, best of {rounds}", title_justify="left")
    for column in ("run", "sent msg/s", "send ratio", "consumed msg/s", "consume ratio", "msg per CPU-s", "CPU ratio",
                   "sent/s, all rounds"):
        table.add_column(column, no_wrap=True)
    for traced, label in ((False, "trace off (baseline)"), (True, "trace on")):
        sent, consumed, per_cpu = best[traced]
        base = best[False]
        consume_ratio = f"{consumed / base[1]:.2f}x" if base[1] else "-"
        table.add_row(label, f"{sent:,.0f}", f"{sent / base[0]:.2f}x", f"{consumed:,.0f}", consume_ratio,
                      f"{per_cpu:,.0f}", f"{per_cpu / base[2]:.2f}x", " ".join(f"{r[0]:,.0f}" for r in runs[traced]))
    console = Console(highlight=False, soft_wrap=True, width=200)  # a row never wraps, whatever the terminal
    console.print(table)
    console.print(f"trace events of the last traced run: {written:,} written, {dropped:,} dropped; "
                  f"{load.text()} on {os.cpu_count()} cores")
