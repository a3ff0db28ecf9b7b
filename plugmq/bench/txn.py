"""``plugmq bench txn``: the cost of transactional sends and the speed of check-back.

Sends (one thread, ``--body-size`` bytes, 4 queues, the store in ``--flush`` mode): plain
``producer.send`` is the baseline; ``send_in_transaction`` with a local COMMIT (half message +
fsynced COMMIT record + delivery + DONE record) is measured with the op log's fsync on and off,
plus a local ROLLBACK (half + fsynced ROLLBACK record). Ratios are rate / plain rate.

Check-back (ManualClock, ``--half`` UNKNOWN half messages, default 100,000): one pass in which
every message is checked with a listener answering UNKNOWN (each counted in the op log, one fsync
per ``check_batch``), then one pass answering COMMIT (each committed: record, deliver, done),
then a reopen that rebuilds the open set from the half queue and op log. The baseline is the raw
store reading the same half messages (consume-queue entry + message read), the least any check
has to do. Ratios are rate / raw-read rate.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.core import ManualClock, Message, StoredMessage, TransactionDecision
from plugmq.core.names import TRANS_HALF_TOPIC

__all__ = ["command", "measure_checks", "measure_sends"]

TOPIC = "BenchTxn"
GROUP = "bench-txn"


def _open(directory: Path, store: str, flush: str, fsync: bool, clock: ManualClock) -> Broker:
    broker = Broker.open(directory, plugins=[store, "txn"], clock=clock,
                         options={store: {"flush": flush}, "txn": {"fsync": fsync}})
    broker.create_topic(TOPIC, 4)
    return broker


def _rate(count: int, fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def _producer(broker: Broker, checker: Callable[[StoredMessage], TransactionDecision]) -> TransactionProducer:
    return broker.transaction_producer(GROUP, lambda _m, arg: arg, checker)


def _send_all(producer: TransactionProducer, count: int, body: bytes, decision: TransactionDecision) -> None:
    for _ in range(count):
        producer.send_in_transaction(Message(TOPIC, body), decision)


def measure_sends(store: str, flush: str, sends: int, body_size: int) -> dict[str, float]:
    """msg/s of plain sends and of transactional sends (COMMIT with/without op-log fsync, ROLLBACK)."""
    body = b"x" * body_size
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-txn-") as tmp:
        for label, fsync in (("fsync", True), ("no-fsync", False)):
            with _open(Path(tmp) / label, store, flush, fsync, ManualClock()) as broker:
                if fsync:
                    with broker.producer("bench-plain") as plain:
                        rates["plain send"] = _rate(sends, lambda: [plain.send(Message(TOPIC, body))
                                                                    for _ in range(sends)])
                txn = _producer(broker, lambda _m: TransactionDecision.UNKNOWN)
                rates[f"txn COMMIT, op log {label}"] = _rate(
                    sends, functools.partial(_send_all, txn, sends, body, TransactionDecision.COMMIT))
                if fsync:
                    rates["txn ROLLBACK, op log fsync"] = _rate(
                        sends, functools.partial(_send_all, txn, sends, body, TransactionDecision.ROLLBACK))
    return rates


def measure_checks(store: str, flush: str, halves: int, body_size: int) -> dict[str, float]:
    """Rates (per s) of preparing ``halves`` UNKNOWN messages, checking them all (UNKNOWN, then
    COMMIT), reopening with them all open, and the raw-read baseline."""
    body = b"x" * body_size
    clock = ManualClock()
    answer = {"decision": TransactionDecision.UNKNOWN}
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-txn-check-") as tmp:
        broker = _open(Path(tmp), store, flush, True, clock)
        try:
            producer = _producer(broker, lambda _m: answer["decision"])
            rates["prepare (UNKNOWN)"] = _rate(halves, lambda: [
                producer.send_in_transaction(Message(TOPIC, body), TransactionDecision.UNKNOWN)
                for _ in range(halves)])
            rates["raw read of the halves (baseline)"] = _rate(halves, lambda: _read_all(broker))
            caps = broker.transactions.capabilities  # type: ignore[union-attr]
            rates["check pass, answer UNKNOWN"] = _rate(halves, lambda: clock.advance(
                caps.transaction_timeout_ms / 1000))
            assert broker.transactions.metrics()["checks"] == halves  # type: ignore[union-attr]
            producer.close()
            broker.close()
            start = time.perf_counter()
            broker = _open(Path(tmp), store, flush, True, clock)
            rates["reopen with all open"] = halves / (time.perf_counter() - start)
            assert broker.transactions.pending() == halves  # type: ignore[union-attr]
            answer["decision"] = TransactionDecision.COMMIT
            _producer(broker, lambda _m: answer["decision"])
            rates["check pass, answer COMMIT"] = _rate(halves, lambda: clock.advance(
                caps.check_interval_ms / 1000))
            assert broker.transactions.pending() == 0  # type: ignore[union-attr]
        finally:
            broker.close()
    return rates


def _read_all(broker: Broker) -> None:
    store = broker.store
    offset, high = 0, store.max_offset(TRANS_HALF_TOPIC, 0)
    while offset < high:
        entries = store.read_queue(TRANS_HALF_TOPIC, 0, offset, 1024)
        for entry in entries:
            store.read(entry.commit_log_offset, entry.size)
        offset = entries[-1].queue_offset + 1


@click.command("txn")
@click.option("--store", default="store_lmdb", show_default=True, help="storage plugin")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="the store's flush mode")
@click.option("--sends", default=2_000, show_default=True, help="messages per send measurement")
@click.option("--half", "halves", default=100_000, show_default=True, help="UNKNOWN half messages to check back")
@click.option("--body-size", default=128, show_default=True, help="message body bytes")
def command(store: str, flush: str, sends: int, halves: int, body_size: int) -> None:
    """Transactional sends vs plain sends, and check-back throughput on a ManualClock."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    console.print(_ratio_table(
        f"transactional sends: {store} flush={flush}, {sends:,} x {body_size} B, 1 thread, batch size 1",
        ("send", "msg/s", "vs plain send"), measure_sends(store, flush, sends, body_size), "plain send"))
    console.print(_ratio_table(
        f"check-back: {halves:,} UNKNOWN half messages, {store} flush={flush}, op log fsync on, ManualClock",
        ("step", "messages/s", "vs raw read"), measure_checks(store, flush, halves, body_size),
        "raw read of the halves (baseline)"))


def _ratio_table(title: str, columns: tuple[str, str, str], rates: dict[str, float], baseline: str) -> Table:
    """One row per measurement: its rate, and the ratio to ``rates[baseline]`` of the same run."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column == columns[0] else "right")
    base = rates[baseline]
    for label, rate in rates.items():
        table.add_row(label, f"{rate:,.0f}", f"{rate / base:.3f}")
    return table
