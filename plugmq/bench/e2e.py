"""``plugmq bench e2e``: produce -> consume throughput and end-to-end latency through the broker.

Per store: 1 producer thread sends 1 KiB messages to 4 queues while a push consumer with 2 consume
threads (background pulling on the system clock) receives them. End-to-end latency is receive time
minus the born timestamp. The producer sends one message at a time (``Producer.send``, a round
trip per message as an application waiting for each answer does) and, in a second run, in batches
of ``--batch`` (``Producer.send_batch``, one queue per batch, round robin): the second shows what
the broker takes when the producer is not the bound. In the same run, the raw store append rate (store.append in a loop, same
message size, same flush mode, requests built beforehand with a unique key as the broker's carry)
is the baseline the broker's rate is divided by. On a shared
machine each figure is the best of ``--rounds`` rounds, baseline and end-to-end run alternately.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.broker.components import open_store
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus
from plugmq.core.errors import PluginError
from plugmq.core.message import AppendRequest, Message, StoredMessage, new_unique_id
from plugmq.core.names import Prop
from plugmq.kit.histogram import Histogram
from plugmq.measure.probes import LoadWindow

__all__ = ["command", "run_e2e"]


def _raw_append_rate(store_plugin: str, flush: str, messages: int, size: int) -> float:
    """store.append of requests built beforehand, each with a unique key like the broker's."""
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-raw-") as tmp:
        store = open_store(store_plugin, Path(tmp), options={"flush": flush})
        body = b"x" * size
        requests = [AppendRequest(topic="Bench", queue_id=i % 4, body=body,
                                  properties={Prop.UNIQ_KEY: new_unique_id()}) for i in range(messages)]
        try:
            append = store.append
            start = time.perf_counter()
            for request in requests:
                append(request)
            return messages / (time.perf_counter() - start)
        finally:
            store.close()


def run_e2e(store_plugin: str, flush: str, messages: int, size: int, batch: int = 1) -> dict[str, float]:
    """One end-to-end run, the producer sending ``batch`` messages per call (1: ``send``); returns
    rates (msg/s) and latency percentiles (ms, plugmq.kit.histogram)."""
    received = threading.Event()
    # Kept as they come and binned once at the end: the listener runs per message (RocketMQ's
    # default consume batch of 1), and binning each one cost the consume threads more than the
    # broker's part of consuming it.
    latencies: list[float] = []
    lock = threading.Lock()

    def listener(batch: list[StoredMessage]) -> ConsumeStatus:
        now_ms = time.time() * 1000
        with lock:
            latencies.extend([now_ms - m.born_timestamp_ms for m in batch])
            if len(latencies) >= messages:
                received.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with (tempfile.TemporaryDirectory(prefix="plugmq-bench-e2e-") as tmp,
          Broker.open(tmp, plugins=[store_plugin, "alloc"], options={store_plugin: {"flush": flush}}) as broker):
        broker.create_topic("Bench", 4)
        consumer = broker.push_consumer("bench-consumers", listener, consume_threads=2, max_reconsume_times=0,
                                        consume_from=ConsumeFrom.FIRST_OFFSET, pull_batch_size=32)
        consumer.subscribe("Bench").start()
        body = b"x" * size
        start = time.perf_counter()
        with broker.producer("bench-producer") as producer:
            if batch == 1:
                for _ in range(messages):
                    producer.send(Message("Bench", body))
            else:
                for first in range(0, messages, batch):
                    producer.send_batch([Message("Bench", body) for _ in range(min(batch, messages - first))])
        produced = time.perf_counter()
        if not received.wait(timeout=max(60.0, messages / 500)):
            raise click.ClickException(f"{store_plugin}: only {len(latencies)} of {messages} messages consumed")
        consumed = time.perf_counter()
        consumer.shutdown()
    histogram = Histogram()
    with lock:
        histogram.record_many(latencies)
    return {
        "produce_rate": messages / (produced - start),
        "e2e_rate": messages / (consumed - start),
        "p50_ms": histogram.quantile(0.5) or 0.0,
        "p99_ms": histogram.quantile(0.99) or 0.0,
    }


@click.command("e2e")
@click.option("--stores", default="store_mmap,store_lmdb,store_rocks", show_default=True)
@click.option("--messages", default=20_000, show_default=True)
@click.option("--size", default=1024, show_default=True, help="Body size in bytes.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds of baseline and end-to-end run, alternating; the best of each is kept.")
@click.option("--batch", default=32, show_default=True, type=click.IntRange(2),
              help="Messages per send_batch call in the batched producer's run.")
def command(stores: str, messages: int, size: int, flush: str, rounds: int, batch: int) -> None:
    """Produce -> consume throughput and end-to-end latency, as a ratio to the raw store append rate."""
    console = Console(width=200)
    load = LoadWindow()
    table = Table(title=f"e2e: {messages} x {size} B, 4 queues, 1 producer, 2 consume threads, flush={flush}, "
                        f"best of {rounds}; producer one at a time (send), then in batches of {batch} (send_batch)")
    table.add_column("store", no_wrap=True)
    for column in ("raw append msg/s", "produce msg/s", "e2e msg/s", "e2e / raw", "p50 ms", "p99 ms",
                   "batched produce msg/s", "batched e2e msg/s", "batched e2e / raw", "batched p50 ms"):
        table.add_column(column, justify="right")
    for store in [s.strip() for s in stores.split(",") if s.strip()]:
        raw = 0.0
        best: dict[int, dict[str, float]] = {}
        try:
            for _ in range(rounds):
                raw = max(raw, _raw_append_rate(store, flush, messages, size))
                for per_call in (1, batch):
                    result = run_e2e(store, flush, messages, size, per_call)
                    if per_call not in best or result["e2e_rate"] > best[per_call]["e2e_rate"]:
                        best[per_call] = result
        except PluginError as exc:
            console.print(f"[yellow]{store}: skipped ({exc})[/yellow]")
            continue
        one, many = best[1], best[batch]
        table.add_row(store, f"{raw:,.0f}", f"{one['produce_rate']:,.0f}", f"{one['e2e_rate']:,.0f}",
                      f"{one['e2e_rate'] / raw:.2f}x", f"{one['p50_ms']:.1f}", f"{one['p99_ms']:.1f}",
                      f"{many['produce_rate']:,.0f}", f"{many['e2e_rate']:,.0f}", f"{many['e2e_rate'] / raw:.2f}x",
                      f"{many['p50_ms']:.1f}")
    console.print(table)
    console.print(f"{load.finish().text()}; goal: e2e >= 0.3x the raw append rate")
