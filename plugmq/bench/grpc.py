"""``plugmq bench grpc``: messages per second through ``plugmq serve`` with the official client.

The server runs as a child process (``plugmq serve`` on an ephemeral loopback port) so client and
server do not share one interpreter's GIL. Measured in the same run:

* baseline: in-process ``broker.producer(...).send`` on an identical broker (same store, flush
  mode, body size), one thread;
* gRPC send with rocketmq-python-client's ``Producer.send`` (synchronous, one message per
  request) from 1 and from 4 threads sharing one producer;
* the same sends through the generated stub (``MessagingServiceStub.SendMessage``, one channel per
  thread, no client library): what the server takes when the client's own overhead is left out;
* gRPC receive + ack with a ``SimpleConsumer``: receive batches of ``--batch`` messages, one
  AckMessage per message (the client acks singly), one consumer thread.

Ratios are rate / in-process send rate. The pop-state log is not fsynced (``pop_fsync`` off, the
default); the store's flush mode is ``--flush``.
"""

from __future__ import annotations

import os
import signal
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

from plugmq.core import Message as PlugmqMessage
from plugmq.core.broker import Broker

__all__ = ["command", "measure"]

TOPIC = "BenchGrpc"
_SERVE = ("from plugmq.cli import main; from plugmq.cli.serve import command; "
          "main.add_command(command); main()")


def _config(directory: Path, store: str, flush: str) -> Path:
    path = directory / "broker.toml"
    path.write_text(
        f'[broker]\ndata_dir = "data"\nplugins = ["{store}", "filter_tag"]\n'
        f'[plugins.{store}]\nflush = "{flush}"\n[server]\nlong_polling_s = 2\n', encoding="utf-8")
    return path


def _spawn(config: Path) -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen([sys.executable, "-c", _SERVE, "serve", "--config", str(config),
                                "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, cwd=config.parent)
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode()
        if not line:
            break
        if line.startswith("plugmq serve: listening on "):
            return process, line.split()[4]
    process.kill()
    raise click.ClickException(f"plugmq serve did not start (exit code {process.wait()})")


def _rate(count: int, fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def _in_process(directory: Path, store: str, flush: str, messages: int, body: bytes) -> float:
    with Broker.open(directory, plugins=[store, "filter_tag"], options={store: {"flush": flush}}) as broker:
        broker.create_topic(TOPIC, 4)
        with broker.producer("bench-grpc") as producer:
            producer.send(PlugmqMessage(TOPIC, body))  # warm-up
            return _rate(messages, lambda: [producer.send(PlugmqMessage(TOPIC, body)) for _ in range(messages)])


def _client_message(body: bytes) -> Any:
    from rocketmq import Message

    message = Message()
    message.topic = TOPIC
    message.body = body
    return message


def _grpc_send(producer: Any, messages: int, threads: int, body: bytes) -> float:
    per_thread = messages // threads
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(per_thread):
                producer.send(_client_message(body))
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


def _stub_send(address: str, messages: int, threads: int, body: bytes) -> float:
    import grpc
    from rocketmq.grpc_protocol import (
        Code,
        MessageType,
        MessagingServiceStub,
        definition_pb2,
        service_pb2,
    )

    per_thread = messages // threads
    channels = [grpc.insecure_channel(address) for _ in range(threads)]
    errors: list[str] = []

    def work(index: int) -> None:
        stub = MessagingServiceStub(channels[index])
        for i in range(per_thread):
            message = definition_pb2.Message(body=body)
            message.topic.name = TOPIC
            message.system_properties.message_id = f"stub-{threads}-{index}-{i}"
            message.system_properties.message_type = MessageType.NORMAL
            response = stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), timeout=10)
            if response.status.code != Code.OK:
                errors.append(response.status.message)
                return

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    try:
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
    finally:
        for channel in channels:
            channel.close()
    if errors:
        raise click.ClickException(f"a stub send failed: {errors[0]}")
    return per_thread * threads / elapsed


def _grpc_receive(consumer: Any, total: int, batch: int) -> float:
    received = 0
    empty = 0
    start = time.perf_counter()
    while received < total and empty < 3:  # three empty long polls: the rest is not coming
        got = consumer.receive(batch, 30)
        empty = 0 if got else empty + 1
        for message in got:
            consumer.ack(message)
        received += len(got)
    elapsed = time.perf_counter() - start
    if received < total:
        raise click.ClickException(f"received {received} of {total} messages")
    return received / elapsed


def measure(messages: int, body_size: int, store: str, flush: str, batch: int) -> list[tuple[str, int, float]]:
    """(scenario, threads, msg/s) rows; the first is the in-process baseline."""
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Producer,
        SimpleConsumer,
    )

    body = os.urandom(body_size)
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-grpc-") as tmp:
        root = Path(tmp)
        rows.append(("in-process send (baseline)", 1, _in_process(root / "inproc", store, flush, messages, body)))
        (root / "served").mkdir()
        process, address = _spawn(_config(root / "served", store, flush))
        try:
            config = ClientConfiguration(address, Credentials(), request_timeout=10)
            producer = Producer(config, (TOPIC,))
            producer.startup()
            try:
                producer.send(_client_message(body))  # warm-up: route, channel, topic creation
                for threads in (1, 4):
                    rows.append(("gRPC send", threads, _grpc_send(producer, messages, threads, body)))
            finally:
                producer.shutdown()
            for threads in (1, 4):
                rows.append(("gRPC send, generated stub (no client)", threads,
                             _stub_send(address, messages, threads, body)))
            consumer = SimpleConsumer(config, "bench-grpc", {TOPIC: FilterExpression()}, await_duration=2)
            consumer.startup()
            try:
                total = 1 + 2 * (messages + (messages // 4) * 4)  # warm-up, client and stub runs
                rows.append((f"gRPC receive (batch {batch}) + ack", 1, _grpc_receive(consumer, total, batch)))
            finally:
                consumer.shutdown()
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    return rows


@click.command("grpc")
@click.option("--messages", default=2_000, show_default=True, help="messages per send measurement")
@click.option("--body-size", default=128, show_default=True, help="message body bytes")
@click.option("--store", default="store_mmap", show_default=True, help="storage plugin of both brokers")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="store flush mode of both brokers")
@click.option("--batch", default=32, show_default=True, help="messages per receive")
def command(messages: int, body_size: int, store: str, flush: str, batch: int) -> None:
    """Send and receive+ack rates over loopback gRPC vs the in-process send rate."""
    try:
        import rocketmq  # noqa: F401
    except ModuleNotFoundError as exc:
        raise click.ClickException("plugmq bench grpc needs the 'serve' extra (rocketmq-python-client)") from exc
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    rows = measure(messages, body_size, store, flush, batch)
    baseline = rows[0][2]
    table = Table(title=f"plugmq serve over loopback: {messages:,} x {body_size} B per send run, "
                        f"{store} flush={flush}, "
                        "pop state fsync off, 1 message per SendMessage, acks one by one")
    for column in ("scenario", "threads", "msg/s", "vs in-process send"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for scenario, threads, rate in rows:
        table.add_row(scenario, str(threads), f"{rate:,.0f}", f"{rate / baseline:.3f}x")
    console.print(table)
