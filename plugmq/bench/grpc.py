"""``plugmq bench grpc``: ``plugmq serve`` driven by the official Python client, against Redis Streams.

One run measures, on one machine, with 128 B bodies by default:

* the in-process send rate (``broker.producer(...).send``, one thread) on an identical broker;
* a ``plugmq serve`` child (its own interpreter, an ephemeral loopback port): the official
  ``rocketmq-python-client``'s ``Producer.send`` (synchronous, one message per SendMessage) from
  1 and from 8 threads sharing one producer; the same 8-thread load through the generated stub
  without the client library; receive + ack with ``SimpleConsumer`` threads (receive batches,
  one AckMessage per message, as the client acks);
* Redis Streams driven the same way with redis-py when ``redis-server`` and the ``redis``
  package are present: XADD one request per message (1 and 8 threads), XREADGROUP batches +
  one XACK per message; persistence off (no AOF, no RDB), as the broker's store flushes
  asynchronously;
* the server's CPU time per message: the child's own user + system time (``/proc/<pid>/stat``)
  before and after each phase, divided by the messages of the phase;
* a steady run: 8 sending threads in this process and ``--steady-consumers`` receiving threads
  in a child process (producers and consumers are separate applications, each with its own
  interpreter lock) for ``--steady-s`` seconds, the backlog (sent - acked) sampled every few
  seconds. A busy server answers its callers in turn, and a consumer spends one call per message
  (its ack) as a producer does, so consumers keep up only with as many threads as producers;
  with 4 they get about half the calls and the backlog grows;
* start-up: seconds from spawning ``plugmq serve`` to its first answered request, on an empty
  data dir, after SIGTERM on the data dir with everything sent so far, and after ``kill -9``
  during a send load, where every send the client saw acknowledged must be received afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.core import Message as PlugmqMessage
from plugmq.measure.children import BrokerChild
from plugmq.measure.clients import client_message, producer, simple_consumers
from plugmq.measure.consumers import ConsumerProcess
from plugmq.measure.probes import CpuMeter, LoadWindow, own_cpu_s
from plugmq.measure.threads import Background, run_threads

__all__ = ["ServeChild", "command", "measure"]

TOPIC = "BenchGrpc"
GROUP = "bench-grpc"
STREAM = "bench-grpc"
_SEND_THREADS = 8
_RECEIVE_THREADS = 4


@attrs.define
class Row:
    scenario: str
    threads: int
    rate: float
    server_cpu_ms: float | None = None  # per message, the server process's own CPU time
    client_cpu_ms: float | None = None  # per message, this (benchmark) process's CPU time
    peer: str | None = None  # the Redis row this one is compared with


@attrs.define
class StartUp:
    situation: str
    stored: int  # messages in the data dir when it started
    listening_s: float  # spawn -> "listening" line
    serving_s: float  # spawn -> first answered request
    phases: dict[str, float] = attrs.field(factory=dict)  # as the server logged them


@attrs.define
class Report:
    settings: dict[str, Any]
    rows: list[Row] = attrs.field(factory=list)
    startups: list[StartUp] = attrs.field(factory=list)
    steady: dict[str, Any] = attrs.field(factory=dict)
    crash: dict[str, Any] = attrs.field(factory=dict)
    redis: str = "measured"

    def rate(self, scenario: str, threads: int) -> float | None:
        return next((r.rate for r in self.rows if r.scenario == scenario and r.threads == threads), None)


# ------------------------------------------------------------------------------ the server child
def _row(meter: CpuMeter, scenario: str, threads: int, rate: float, count: int, peer: str | None = None) -> Row:
    """The phase ``meter`` measured as a row: CPU per message of the server (when it has a pid) and of this process."""
    server = meter.child_s()
    return Row(scenario, threads, rate, server * 1000 / count if server is not None else None,
               meter.own_s() * 1000 / count, peer)


class ServeChild(BrokerChild):
    """``plugmq serve`` as the command line runs it, with its start-up figures: ``started_s``
    (spawn -> listening line), ``serving_s`` (spawn -> first answered request) and ``phases``
    (imports, broker open, server start as it logged them; ``cpu_s``: its CPU until it answered)."""

    def __init__(self, config: Path, log: Path, listen: str = "127.0.0.1:0", python: str = sys.executable,
                 tls_ca: bytes | None = None) -> None:
        """``tls_ca``: the server has [server.tls]; its probe trusts this CA."""
        super().__init__(config, log=log, listen=listen, python=python, cli=True)
        self.serving_s = self.await_answer(tls_ca=tls_ca)
        self.phases = self.startup_phases()
        self.phases["cpu_s"] = self.cpu_s()  # what start-up cost, whatever the machine's load

    def stop(self, grace_s: float = 60.0) -> int:
        status = super().stop(grace_s)
        if status != 0:
            raise click.ClickException(f"plugmq serve exited with {status} on SIGTERM; see {self.log_path}")
        return status


def _config(directory: Path, store: str, flush: str) -> Path:
    path = directory / "broker.toml"
    path.write_text(
        f'[broker]\ndata_dir = "data"\nplugins = ["{store}", "filter_tag"]\n'
        f'[plugins.{store}]\nflush = "{flush}"\n[server]\nlong_polling_s = 2\n', encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ load helpers
class _Progress:
    """Messages handled so far by several threads, and when the last of ``total`` was handled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.finished = time.perf_counter()
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        if count:
            with self._lock:
                self.count += count
                self.finished = time.perf_counter()

    def done(self) -> bool:
        return self.count >= self.total


def _in_process(directory: Path, store: str, flush: str, messages: int, body: bytes) -> float:
    with Broker.open(directory, plugins=[store, "filter_tag"], options={store: {"flush": flush}}) as broker:
        broker.create_topic(TOPIC, 8)
        with broker.producer("bench-grpc") as producer:
            producer.send(PlugmqMessage(TOPIC, body))  # warm-up
            start = time.perf_counter()
            for _ in range(messages):
                producer.send(PlugmqMessage(TOPIC, body))
            return messages / (time.perf_counter() - start)


def _client_message(body: bytes) -> Any:
    return client_message(TOPIC, body)


def _producer(address: str, timeout: int = 10, *, tls: bool = False) -> Any:
    return producer(address, (TOPIC,), timeout, tls=tls)


def _client_send(producer: Any, messages: int, threads: int, body: bytes) -> float:
    per_thread = messages // threads

    def work(_index: int) -> None:
        for _ in range(per_thread):
            producer.send(_client_message(body))

    return per_thread * threads / run_threads(threads, work)


def _stub_send(address: str, messages: int, threads: int, body: bytes, per_request: int = 1,
               tls_ca: bytes | None = None, prefix: str = "stub") -> float:
    """SendMessage through the generated stub (no client library), ``per_request`` messages each
    (over TLS trusting ``tls_ca`` when given); message ids start with ``prefix`` (a broker answers
    a retried id from RecentSends instead of storing it: every phase needs ids of its own)."""
    import grpc
    from rocketmq.grpc_protocol import Code, MessageType, MessagingServiceStub, service_pb2

    requests = messages // threads // per_request
    # Each channel its own connection: gRPC shares one subchannel (TCP connection) between the
    # channels of a process to the same target, which put all the load on one front-end worker.
    own = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(address, options=own) if tls_ca is None else
                grpc.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=own) for _ in range(threads)]

    def work(index: int) -> None:
        stub = MessagingServiceStub(channels[index])
        for i in range(requests):
            request = service_pb2.SendMessageRequest()
            for k in range(per_request):
                message = request.messages.add(body=body)
                message.topic.name = TOPIC
                message.system_properties.message_id = f"{prefix}-{per_request}-{threads}-{index}-{i}-{k}"
                message.system_properties.message_type = MessageType.NORMAL
            response = stub.SendMessage(request, timeout=10)
            if response.status.code != Code.OK:
                raise click.ClickException(f"a stub send failed: {response.status.message}")

    try:
        return requests * per_request * threads / run_threads(threads, work)
    finally:
        for channel in channels:
            channel.close()


def _stub_heartbeats(address: str, calls: int, threads: int) -> float:
    """Heartbeat requests (no broker work): what one request costs the server's gRPC stack alone."""
    import grpc
    from rocketmq.grpc_protocol import Code, MessagingServiceStub, service_pb2

    per_thread = calls // threads
    channels = [grpc.insecure_channel(address) for _ in range(threads)]

    def work(index: int) -> None:
        stub = MessagingServiceStub(channels[index])
        metadata = (("x-mq-client-id", f"bench-heartbeat-{index}"),)
        for _ in range(per_thread):
            if stub.Heartbeat(service_pb2.HeartbeatRequest(), timeout=10, metadata=metadata).status.code != Code.OK:
                raise click.ClickException("a heartbeat failed")

    try:
        return per_thread * threads / run_threads(threads, work)
    finally:
        for channel in channels:
            channel.close()


def _client_receive(consumers: list[Any], total: int, batch: int) -> tuple[float, int]:
    """Receive + ack until ``total`` messages came or three long polls in a row came back empty."""
    progress = _Progress(total)

    def work(index: int) -> None:
        consumer = consumers[index]
        empty = 0
        while empty < 3 and not progress.done():
            got = consumer.receive(batch, 30)
            empty = 0 if got else empty + 1
            for message in got:
                consumer.ack(message)
            progress.add(len(got))

    start = time.perf_counter()
    run_threads(len(consumers), work)
    if progress.count < total:
        raise click.ClickException(f"received {progress.count} of {total} messages")
    return progress.count / (progress.finished - start), progress.count


# ------------------------------------------------------------------------------ Redis Streams
def _redis_rows(workdir: Path, messages: int, body: bytes, batch: int) -> list[Row]:
    import redis

    from plugmq.bench.redis_peer import RedisServer

    server = RedisServer(workdir)
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        pid = server.proc.pid
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        client.xadd(STREAM, {"b": body})  # warm-up
        rows = []
        for threads in (1, _SEND_THREADS):
            per_thread = messages // threads

            def add(_index: int, per_thread: int = per_thread) -> None:
                for _ in range(per_thread):
                    client.xadd(STREAM, {"b": body})

            meter = CpuMeter(pid)
            rate = per_thread * threads / run_threads(threads, add)
            rows.append(_row(meter, "Redis XADD", threads, rate, per_thread * threads))
        progress = _Progress(int(client.xlen(STREAM)))

        def read(index: int) -> None:
            empty = 0
            while empty < 3 and not progress.done():
                answer: Any = client.xreadgroup(GROUP, f"c{index}", {STREAM: ">"}, count=batch, block=2000)
                entries = answer[0][1] if answer else []
                empty = 0 if entries else empty + 1
                for entry_id, _fields in entries:
                    client.xack(STREAM, GROUP, entry_id)  # one request per ack, as the client acks
                progress.add(len(entries))

        meter = CpuMeter(pid)
        start = time.perf_counter()
        run_threads(_RECEIVE_THREADS, read)
        rows.append(_row(meter, f"Redis XREADGROUP (batch {batch}) + XACK", _RECEIVE_THREADS,
                              progress.count / (progress.finished - start), progress.count))
        client.close()
        return rows
    finally:
        server.stop()


def _redis_missing() -> str | None:
    from plugmq.bench.redis_peer import redis_missing

    return redis_missing()


# ------------------------------------------------------------------------------ steady run, crash
def _steady(address: str, seconds: float, body: bytes, batch: int, child: ServeChild, consumer_threads: int
            ) -> dict[str, Any]:
    stop = threading.Event()
    sent = [0] * _SEND_THREADS
    samples: list[tuple[float, int, int]] = []
    consumers = ConsumerProcess({"address": address, "groups": [{"group": GROUP, "topic": TOPIC}],
                                 "threads": consumer_threads, "batch": batch, "invisible_s": 30, "long_polling_s": 2,
                                 "request_timeout_s": 10}, child.log_path.with_name("consumers.log"))
    try:
        with _producer(address) as producer:
            def send(index: int) -> None:
                while not stop.is_set():
                    producer.send(_client_message(body))
                    sent[index] += 1

            cpu_before = child.cpu_s()
            producer_before, consumer_before = own_cpu_s(), consumers.cpu_s()
            acked_before = consumers.acked
            start = time.perf_counter()
            runner = Background(_SEND_THREADS, send)
            interval = max(seconds / 12, 1.0)
            while (now := time.perf_counter() - start) < seconds:
                time.sleep(min(interval, seconds - now))  # sampling cadence of the steady run
                samples.append((round(time.perf_counter() - start, 1), sum(sent), consumers.acked - acked_before))
            stop.set()
            runner.join()
            elapsed = time.perf_counter() - start
            acked = consumers.acked - acked_before
            cpu = child.cpu_s() - cpu_before
            producer_cpu, consumer_cpu = own_cpu_s() - producer_before, consumers.cpu_s() - consumer_before
    finally:
        consumers.stop()
    backlogs = [s - a for _t, s, a in samples]
    settled = backlogs[len(backlogs) // 3:]  # after the start-up third
    return {
        "seconds": round(elapsed, 1), "send_threads": _SEND_THREADS, "receive_threads": consumer_threads,
        "send_rate": sum(sent) / elapsed, "ack_rate": acked / elapsed,
        "backlog_samples": [{"t": t, "sent": s, "acked": a, "backlog": s - a} for t, s, a in samples],
        "backlog_growth_per_s": (settled[-1] - settled[0]) / max(samples[-1][0] - samples[len(samples) // 3][0], 1e-9)
        if len(settled) > 1 else 0.0,
        "server_cpu_ms_per_message": cpu * 1000 / max((sum(sent) + acked) / 2, 1),
        # Where the machine's CPU went: the two client processes run beside the server on the same
        # cores, so their cost per call bounds the rates as much as the server's does.
        "cpu_s": {"server": cpu, "producers": producer_cpu, "consumers": consumer_cpu, "elapsed": elapsed},
        "producer_cpu_ms_per_send": producer_cpu * 1000 / max(sum(sent), 1),
        "consumer_cpu_ms_per_ack": consumer_cpu * 1000 / max(acked, 1),
    }


def _crash_and_restart(child: ServeChild, config: Path, log: Path, body: bytes, run_s: float
                       ) -> tuple[ServeChild, set[str], int, float]:
    """8 threads send until the server is killed with SIGKILL after ``run_s``; it restarts on the same
    address. Returns the new server, the ids acknowledged before the kill, the failed sends, and
    seconds from the restarted server's first answer to the first send the same producer got
    through (the client reconnecting by itself)."""
    acked: set[str] = set()
    lock = threading.Lock()
    failures = [0]
    stop = threading.Event()
    with _producer(child.address, timeout=2) as producer:
        def work(_index: int) -> None:
            while not stop.is_set():
                try:
                    receipt = producer.send(_client_message(body))
                except Exception:  # noqa: BLE001 - the server is gone: the send is not acknowledged
                    with lock:
                        failures[0] += 1
                    continue
                with lock:
                    acked.add(receipt.message_id)

        runner = Background(_SEND_THREADS, work)
        time.sleep(run_s)  # the load runs this long before the kill
        child.kill()
        time.sleep(0.5)  # let in-flight sends fail against the dead server
        stop.set()
        runner.join()
        restarted = ServeChild(config, log, child.address, child.python)
        serving = time.perf_counter()
        deadline = serving + 60
        while time.perf_counter() < deadline:
            try:
                acked.add(producer.send(_client_message(body)).message_id)
                break
            except Exception:  # noqa: BLE001 - still reconnecting
                time.sleep(0.05)  # the client's channel backs off between connection attempts
        else:
            raise click.ClickException("the producer did not get a send through within 60 s of the restart")
        reconnect_s = time.perf_counter() - serving
    return restarted, acked, failures[0], reconnect_s


def _drain_ids(address: str, batch: int) -> list[str]:
    ids: list[str] = []
    with simple_consumers(address, GROUP, TOPIC, 1) as (consumer,):
        empty = 0
        while empty < 2:
            got = consumer.receive(batch, 30)
            empty = 0 if got else empty + 1
            for message in got:
                ids.append(message.message_id)
                consumer.ack(message)
    return ids


# ------------------------------------------------------------------------------ the run
def measure(messages: int, body_size: int, store: str, flush: str, batch: int, steady_s: float,
            use_redis: bool, steady_consumers: int = _SEND_THREADS, python: str = sys.executable) -> Report:
    """Every phase against one ``plugmq serve`` run by ``python`` (another checkout's interpreter
    for a baseline)."""
    body = os.urandom(body_size)
    load = LoadWindow()
    report = Report({"messages": messages, "body_size": body_size, "store": store, "flush": flush,
                     "batch": batch, "steady_s": steady_s, "cpus": os.cpu_count()})
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-grpc-") as tmp:
        root = Path(tmp)
        meter = CpuMeter(None)
        report.rows.append(_row(meter, "in-process send (baseline)", 1,
                                     _in_process(root / "inproc", store, flush, messages, body), messages))
        missing = _redis_missing() if use_redis else "turned off (--no-redis)"
        if missing is None:
            (root / "redis").mkdir()
            report.rows.extend(_redis_rows(root / "redis", messages, body, batch))
        else:
            report.redis = f"not measured: {missing}"
        (root / "served").mkdir()
        config = _config(root / "served", store, flush)
        log = root / "served" / "serve.log"
        child = ServeChild(config, log, python=python)
        report.startups.append(StartUp("first start, empty data dir", 0, child.started_s, child.serving_s, child.phases))
        stored = 0
        try:
            with _producer(child.address) as producer:
                producer.send(_client_message(body))  # warm-up: route, channel, topic creation
                stored += 1
                for threads in (1, _SEND_THREADS):
                    meter = CpuMeter(child.process.pid)
                    rate = _client_send(producer, messages, threads, body)
                    count = messages // threads * threads
                    stored += count
                    report.rows.append(_row(meter, "gRPC send (official client)", threads, rate, count, "Redis XADD"))
            for per_request in (1, 8):
                meter = CpuMeter(child.process.pid)
                rate = _stub_send(child.address, messages, _SEND_THREADS, body, per_request)
                count = messages // _SEND_THREADS // per_request * per_request * _SEND_THREADS
                stored += count
                report.rows.append(_row(meter, f"gRPC send, generated stub, {per_request} message(s) per request",
                                             _SEND_THREADS, rate, count, "Redis XADD"))
            meter = CpuMeter(child.process.pid)
            rate = _stub_heartbeats(child.address, messages, _SEND_THREADS)
            report.rows.append(_row(meter, "gRPC Heartbeat, generated stub (the transport's floor)", _SEND_THREADS,
                                         rate, messages // _SEND_THREADS * _SEND_THREADS))
            with simple_consumers(child.address, GROUP, TOPIC, _RECEIVE_THREADS) as consumers:
                meter = CpuMeter(child.process.pid)
                rate, received = _client_receive(consumers, stored, batch)
                report.rows.append(_row(meter, f"gRPC receive (batch {batch}) + ack (official client)",
                                             _RECEIVE_THREADS, rate, received,
                                             f"Redis XREADGROUP (batch {batch}) + XACK"))
            if steady_s > 0:
                report.steady = _steady(child.address, steady_s, body, batch, child, steady_consumers)
                stored += int(report.steady["send_rate"] * report.steady["seconds"])
        finally:
            child.stop()
        child = ServeChild(config, log, python=python)
        report.startups.append(StartUp("restart after SIGTERM", stored, child.started_s, child.serving_s, child.phases))
        child, acked, failures, reconnect_s = _crash_and_restart(child, config, log, body, 2.0)
        stored += len(acked)
        report.startups.append(StartUp("restart after kill -9 during sends", stored, child.started_s,
                                       child.serving_s, child.phases))
        try:
            after_restart = set(_drain_ids(child.address, batch))
        finally:
            child.stop()
        report.crash = {"acked_sends": len(acked), "failed_sends": failures,
                        "acked_lost": len(acked - after_restart), "producer_reconnect_s": round(reconnect_s, 2)}
    windows = load.finish().as_dict()
    report.settings.update(load_before=windows["before"], load_after=windows["after"])
    return report


def _goals(report: Report) -> list[tuple[str, bool | None, str]]:
    goals: list[tuple[str, bool | None, str]] = []
    send8 = report.rate("gRPC send (official client)", _SEND_THREADS)
    xadd8 = report.rate("Redis XADD", _SEND_THREADS)
    if send8 is not None and xadd8 is not None:
        goals.append(("send, 8 threads >= 0.5x Redis XADD", send8 >= 0.5 * xadd8, f"{send8 / xadd8:.2f}x"))
    else:
        goals.append(("send, 8 threads >= 0.5x Redis XADD", None, "Redis not measured"))
    if report.steady:
        steady = report.steady
        keeps_up = steady["ack_rate"] >= 0.98 * steady["send_rate"] and steady["backlog_growth_per_s"] <= \
            0.02 * steady["send_rate"]
        goals.append((f"receive+ack keeps up with sends for {steady['seconds']:g} s", keeps_up,
                      f"ack {steady['ack_rate']:,.0f}/s vs send {steady['send_rate']:,.0f}/s, backlog "
                      f"{steady['backlog_growth_per_s']:+,.0f}/s"))
    sends = [r for r in report.rows if r.scenario == "gRPC send (official client)" and r.server_cpu_ms is not None]
    if sends:
        worst = max(r.server_cpu_ms or 0.0 for r in sends)
        goals.append(("server CPU per sent message <= 0.25 ms", worst <= 0.25, f"{worst:.3f} ms (worst send row)"))
    slowest = max(s.serving_s for s in report.startups)
    goals.append(("serving within 1 s of start and after kill -9", slowest <= 1.0, f"slowest {slowest:.2f} s"))
    lost = report.crash.get("acked_lost")
    goals.append(("0 acknowledged sends lost across kill -9", lost == 0, f"{lost} of "
                                                                          f"{report.crash.get('acked_sends')}"))
    return goals


def _print_steady(st: dict[str, Any], cpus: int | None, console: Console) -> None:
    """The steady run's rates, backlog and where the machine's CPU went."""
    series = ", ".join(f"{p['t']:g}s:{p['backlog']}" for p in st["backlog_samples"])
    console.print(f"steady run {st['seconds']:g} s ({st['send_threads']} send threads, {st['receive_threads']} "
                  "receive threads in another process): "
                  f"send {st['send_rate']:,.0f}/s, receive+ack {st['ack_rate']:,.0f}/s, server CPU "
                  f"{st['server_cpu_ms_per_message']:.3f} ms per message sent or acked; backlog {series}")
    cores = st["cpu_s"]
    busy = (cores["server"] + cores["producers"] + cores["consumers"]) / max(cores["elapsed"], 1e-9)
    console.print(f"steady run CPU: producers {st['producer_cpu_ms_per_send']:.3f} ms per send, consumers "
                  f"{st['consumer_cpu_ms_per_ack']:.3f} ms per receive+ack; the three processes kept "
                  f"{busy:.2f} of {cpus} cores busy")


def _print(report: Report, console: Console) -> None:
    s = report.settings
    baseline = report.rows[0].rate
    table = Table(title=f"plugmq serve over loopback: {s['messages']:,} x {s['body_size']} B per send run, "
                        f"{s['store']} flush={s['flush']}, 1 message per SendMessage, acks one by one; "
                        f"{s['cpus']} CPUs, load {s['load_before']} -> {s['load_after']}")
    for column in ("scenario", "threads", "msg/s", "vs Redis", "vs in-process", "server CPU ms/msg",
                   "bench process CPU ms/msg"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for row in report.rows:
        peer = report.rate(row.peer, row.threads) if row.peer else None
        table.add_row(row.scenario, str(row.threads), f"{row.rate:,.0f}",
                      f"{row.rate / peer:.2f}x" if peer else "", f"{row.rate / baseline:.3f}x",
                      f"{row.server_cpu_ms:.3f}" if row.server_cpu_ms is not None else "",
                      f"{row.client_cpu_ms:.3f}" if row.client_cpu_ms is not None else "")
    console.print(table)
    console.print(f"Redis: {report.redis}")
    if report.steady:
        _print_steady(report.steady, report.settings.get("cpus"), console)
    starts = Table(title="start-up: spawn -> listening line / first answered request (wall seconds; the server's "
                         "CPU seconds until then)")
    for column in ("situation", "messages stored", "listening s", "serving s", "imports s", "broker open s",
                   "server start s", "server CPU s"):
        starts.add_column(column, justify="left" if column == "situation" else "right")
    for start in report.startups:
        phases = [start.phases.get(k) for k in ("imports_s", "broker_open_s", "server_start_s", "cpu_s")]
        starts.add_row(start.situation, f"{start.stored:,}", f"{start.listening_s:.2f}", f"{start.serving_s:.2f}",
                       *(f"{v:.2f}" if v is not None else "?" for v in phases))
    console.print(starts)
    crash = report.crash
    console.print(f"kill -9 during 8-thread sends: {crash['acked_sends']:,} sends acknowledged, "
                  f"{crash['failed_sends']} failed, {crash['acked_lost']} acknowledged sends missing after restart; "
                  f"the same producer's first send went through {crash['producer_reconnect_s']:.2f} s after the "
                  "restarted server answered")
    for goal, met, detail in _goals(report):
        mark = "met" if met else ("not measured" if met is None else "NOT met")
        console.print(f"goal: {goal}: {mark} ({detail})")


@click.command("grpc")
@click.option("--messages", default=3_000, show_default=True, help="messages per send measurement")
@click.option("--body-size", default=128, show_default=True, help="message body bytes")
@click.option("--store", default="store_mmap", show_default=True, help="storage plugin of both brokers")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="store flush mode of both brokers")
@click.option("--batch", default=32, show_default=True, help="messages per receive (and per XREADGROUP)")
@click.option("--steady-s", default=60.0, show_default=True, help="length of the steady send+receive run (0: skip)")
@click.option("--steady-consumers", default=_SEND_THREADS, show_default=True,
              help="receiving threads of the steady run (its sending threads: 8)")
@click.option("--redis/--no-redis", "use_redis", default=True, show_default=True,
              help="Measure Redis Streams when redis-server and the redis package exist.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--startup-only", is_flag=True,
              help="Measure only start-up (first start, restart after SIGTERM and after kill -9), several rounds.")
@click.option("--backlog-mb", default=256, show_default=True, help="--startup-only: MiB stored before the restarts")
@click.option("--rounds", default=3, show_default=True, help="--startup-only: rounds per interpreter (medians)")
@click.option("--baseline-python", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Also measure a plugmq serve run by this interpreter (e.g. another checkout's .venv/bin/python) "
                   "and print this/baseline ratios; with --startup-only, start-up alone, alternating")
@click.option("--tls", "tls_only", is_flag=True,
              help="Measure only what TLS costs: the same sends to a plain and a [server.tls] server, alternating "
                   "round by round (--rounds), and their ratio.")
def command(messages: int, body_size: int, store: str, flush: str, batch: int, steady_s: float,
            steady_consumers: int, use_redis: bool, as_json: bool, startup_only: bool, backlog_mb: int,
            rounds: int, baseline_python: str | None, tls_only: bool) -> None:
    """Official-client send and receive+ack rates through plugmq serve, vs Redis Streams and in-process."""
    try:
        import rocketmq  # noqa: F401
    except ModuleNotFoundError as exc:
        raise click.ClickException("plugmq bench grpc needs the 'serve' extra (rocketmq-python-client)") from exc
    if tls_only:
        from plugmq.bench.grpc_tls import run_tls

        run_tls(messages, body_size, store, flush, rounds, as_json)
        return
    if startup_only:
        from plugmq.bench.grpc_startup import run_startup

        run_startup(backlog_mb, body_size, store, flush, rounds, baseline_python, as_json)
        return
    if baseline_python is not None:
        _against_baseline(baseline_python, as_json, functools.partial(
            measure, messages, body_size, store, flush, batch, steady_s, use_redis, steady_consumers))
        return
    report = measure(messages, body_size, store, flush, batch, steady_s, use_redis, steady_consumers)
    if as_json:
        payload = attrs.asdict(report)
        payload["goals"] = [{"goal": g, "met": m, "detail": d} for g, m, d in _goals(report)]
        click.echo(json.dumps(payload, indent=2))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    _print(report, console)


def _against_baseline(python: str, as_json: bool, run: Callable[..., Report]) -> None:
    """``run`` (:func:`measure` with its settings) against the baseline interpreter's server, then
    this one's (one after the other on the same machine), and the served rates and steady figures
    as this/baseline ratios."""
    reports = {"baseline": run(python=python), "this": run()}
    ratios = _ratios(reports["this"], reports["baseline"])
    if as_json:
        click.echo(json.dumps({"baseline_python": python, "ratios": ratios,
                               **{name: attrs.asdict(report) for name, report in reports.items()}}, indent=2))
        return
    console = Console(width=160)
    for name, report in reports.items():
        console.print(f"[bold]{name}[/bold]")
        _print(report, console)
    table = Table(title=f"this / baseline ({python})")
    for column in ("figure", "this", "baseline", "ratio"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for figure, (this, base) in ratios.items():
        table.add_row(figure, f"{this:,.3f}", f"{base:,.3f}", f"{this / base:.2f}x" if base else "-")
    console.print(table)


def _ratios(this: Report, baseline: Report) -> dict[str, tuple[float, float]]:
    """Served rates, server CPU per message and the steady run's figures of both reports."""
    figures: dict[str, tuple[float, float]] = {}
    base_rows = {(row.scenario, row.threads): row for row in baseline.rows}
    for row in this.rows:
        base = base_rows.get((row.scenario, row.threads))
        if base is None or row.server_cpu_ms is None or base.server_cpu_ms is None:
            continue  # in-process and Redis rows: no served figure to compare
        figures[f"{row.scenario}, {row.threads} threads: msg/s"] = (row.rate, base.rate)
        figures[f"{row.scenario}, {row.threads} threads: server CPU ms/msg"] = (row.server_cpu_ms, base.server_cpu_ms)
    if this.steady and baseline.steady:
        for key in ("send_rate", "ack_rate", "server_cpu_ms_per_message"):
            figures[f"steady: {key}"] = (this.steady[key], baseline.steady[key])
        figures["steady: ack_rate / send_rate"] = (this.steady["ack_rate"] / max(this.steady["send_rate"], 1e-9),
                                                   baseline.steady["ack_rate"] / max(baseline.steady["send_rate"], 1e-9))
    return figures
