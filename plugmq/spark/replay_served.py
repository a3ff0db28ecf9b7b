"""A served workload: the broker behind ``plugmq serve``, driven by the official Python client.

The plugin set's broker runs as ``plugmq serve`` in a child process on a free loopback port
(:class:`~plugmq.measure.children.BrokerChild`; with a replication plugin its slave is a second
child). Producer threads in this process (``producers_per_topic`` per topic, each with its own
client ``Producer``) send one message per SendMessage at ``producer_rate`` msg/s each (0: as fast
as they can) for warm-up plus duration. The consumers run in a process of their own
(:mod:`plugmq.measure.consumers`): ``consumers_per_subscription`` SimpleConsumer threads per
subscription receive ``receive_batch`` messages at a time and ack each one.

Figures (warm-up excluded): ``publish_rate_msg_s`` / ``publish_rate_mb_s`` and
``publish_latency_*`` (one client ``send``), ``consume_rate_msg_s`` (messages received and acked
per second of the measured period), ``end_to_end_latency_*`` (receive time minus the send
timestamp in the body), ``backlog_max``, ``consume_missing`` / ``consume_duplicates``,
``server_cpu_ms_per_msg`` (the serve process's CPU time over the measured run per message sent,
which covers its send, receive and ack), ``server_resident_memory_mb``, ``server_start_s`` (spawn
to listening), ``bytes_on_disk``. The children are stopped in every case.
"""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path
from typing import Any

from plugmq.core.message import Message
from plugmq.kit.histogram import Histogram
from plugmq.measure import clients as measure_clients
from plugmq.measure.children import BrokerChild
from plugmq.measure.consumers import ConsumerProcess
from plugmq.measure.pacing import Pacer
from plugmq.measure.probes import disk_bytes
from plugmq.spark.experiments import Experiment
from plugmq.spark.replay import run_producers
from plugmq.spark.replication import ReplicationProbe, start_slave
from plugmq.spark.results import ExperimentResult, WindowSeries
from plugmq.spark.workload import SEQ, WARM, MessageFactory, topic_names

__all__ = ["ServedReplay", "client_message"]

_HEADER = struct.Struct(">q")
_SAMPLE_S = 0.2
_BROKER_NAME = "exp"


def client_message(message: Message) -> Any:
    """The official client's Message for a plugmq Message (topic, body, tag, user properties)."""
    return measure_clients.client_message(message.topic, message.body, tag=message.tags,
                                          properties=message.properties)


class _Stats:
    def __init__(self) -> None:
        self.latency = Histogram()
        self.published = 0  # measured (after warm-up)
        self.published_all = 0
        self.errors = 0
        self.first_error: BaseException | None = None


class ServedReplay:
    """See the module docstring."""

    def __init__(self, exp: Experiment, data_dir: Path, result: ExperimentResult, window_s: float) -> None:
        assert exp.workload.serve is not None, "a served replay needs a workload with serve"
        self.exp = exp
        self.w = exp.workload
        self.spec = exp.workload.serve
        self.data_dir = data_dir
        self.result = result
        self.series = WindowSeries(window_s)
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()
        self.stop_sending = threading.Event()
        self.topics = topic_names(self.w)
        self.sent = dict.fromkeys(self.topics, 0)  # stored (acknowledged) sends per topic, warm-up included
        self.groups = [(f"{topic}_s{s}", topic) for topic in self.topics for s in range(self.w.subscriptions_per_topic)]
        self.server: BrokerChild | None = None
        self.slave: BrokerChild | None = None
        self.consumers: ConsumerProcess | None = None
        self.probe: ReplicationProbe | None = None
        self.producers: list[Any] = []
        self.crashed: BaseException | None = None
        self.backlog_max = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    # ------------------------------------------------------------------------------ assembly
    def _tables(self) -> dict[str, dict[str, Any]]:
        ps = self.exp.plugin_set
        broker = {**ps.broker, "name": _BROKER_NAME, "data_dir": "data", "plugins": list(ps.plugins),
                  "default_queue_count": self.w.queues_per_topic, "auto_create_topic": True}
        tables: dict[str, dict[str, Any]] = {"broker": broker}
        for plugin, options in self.exp.store_options().items():
            tables[f"plugins.{plugin}"] = dict(options)
        tables["server"] = {"long_polling_s": self.spec.long_polling_s, **ps.server}
        return tables

    def _start_servers(self) -> BrokerChild:
        replicating = self.exp.plugin_set.replication is not None
        server = self.server = BrokerChild.from_tables(self.data_dir / "master", self._tables(),
                                                       status_interval_s=0.02 if replicating else 3600.0)
        self.result.metric("server_start_s", server.started_s, "s")
        if replicating:
            deadline = time.monotonic() + 60
            while server.latest() is None:
                if time.monotonic() > deadline or not server.alive():
                    raise RuntimeError(f"the served master printed no replication status; its log ends with:\n"
                                       f"{server.log_tail()}")
                time.sleep(0.02)
            status = server.latest()
            assert status is not None
            self.slave = start_slave(self.data_dir / "slave", self.exp, broker_name=_BROKER_NAME,
                                     master_address=status["address"])
            self.probe = ReplicationProbe(lambda: server.samples[-1] if server.samples else None, self.elapsed)
            self.probe.wait_for_slave()
        return server

    def _producer(self, address: str) -> Any:
        from rocketmq import Producer

        producer = Producer(measure_clients.client_config(address, self.spec.request_timeout_s), tuple(self.topics))
        producer.startup()
        self.producers.append(producer)
        return producer

    # ------------------------------------------------------------------------------ the run
    def run(self) -> None:
        try:
            self._run()
        except BaseException:
            self.close(check=False)
            raise
        self.close(check=True)

    def _run(self) -> None:
        w = self.w
        server = self._start_servers()
        producers = [[self._producer(server.address) for _ in range(w.producers_per_topic)] for _ in self.topics]
        for t, topic in enumerate(self.topics):  # creates the topic; then the backlog, before any consumer
            factory = MessageFactory(w, self.exp.seed, t, f"{t}.backlog", None)
            for _ in range(1 + w.backlog_messages):
                producers[t][0].send(client_message(factory.next(0, warmup=True, header=_HEADER.pack(time.time_ns()))))
                self.sent[topic] += 1
        if self.groups:
            spec = {"address": server.address, "groups": [{"group": g, "topic": t} for g, t in self.groups],
                    "threads": w.consumers_per_subscription, "batch": self.spec.receive_batch,
                    "invisible_s": self.spec.invisible_s, "long_polling_s": self.spec.long_polling_s,
                    "request_timeout_s": self.spec.request_timeout_s, "seq_property": SEQ, "warm_property": WARM,
                    "timestamped": True}
            backlog_start = time.perf_counter()
            self.consumers = ConsumerProcess(spec, self.data_dir / "consumers.log")
            if w.backlog_messages:
                self._wait_drained(max(10.0, w.duration_s))
                self.result.metric("backlog_drain_s", time.perf_counter() - backlog_start, "s")
        cpu_before = server.cpu_s()
        self.t0 = time.perf_counter()
        t0_epoch = time.time()
        measure_from, measure_to = w.warmup_s, w.warmup_s + w.duration_s
        stats = [_Stats() for _ in range(w.topics * w.producers_per_topic)]
        sampler = run_producers((w.topics, w.producers_per_topic),
                                lambda t, p: self._produce(t, p, producers[t][p], stats[t * w.producers_per_topic + p]),
                                self._sample, self.probe, "served")
        produced_until = self.elapsed()
        if self.crashed is not None:
            raise RuntimeError(f"a producer thread died: {self.crashed!r}") from self.crashed
        if self.probe is not None:
            self.probe.finish(self.result, max(10.0, w.drain_s), measure_from, measure_to)
        drain_began = time.perf_counter()
        if self.consumers is not None:
            self._wait_drained(w.drain_s if w.drain_s > 0 else max(10.0, w.duration_s))
        self.result.metric("drain_s", time.perf_counter() - drain_began, "s")
        cpu = server.cpu_s() - cpu_before
        self.stop_sending.set()
        sampler.join()
        final = self.consumers.stop() if self.consumers is not None else None
        self._figures(stats, produced_until, measure_from, measure_to, t0_epoch, final, cpu)

    def _produce(self, topic: int, index: int, producer: Any, stats: _Stats) -> None:
        try:
            self._produce_loop(topic, index, producer, stats)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread: a dead producer fails the run
            self.crashed = exc
            self.stop_sending.set()

    def _produce_loop(self, topic: int, index: int, producer: Any, stats: _Stats) -> None:
        w = self.w
        name = self.topics[topic]
        factory = MessageFactory(w, self.exp.seed, topic, f"{topic}.{index}", None)
        pacer = Pacer(w.producer_rate, w.warmup_s + w.duration_s, self.elapsed, self.stop_sending, index=index,
                      producers=w.producers_per_topic)
        while pacer.next():
            warm = self.elapsed() < w.warmup_s
            message = client_message(factory.next(0, warmup=warm, header=_HEADER.pack(time.time_ns())))
            began = time.perf_counter()
            try:
                producer.send(message)
            except Exception as exc:  # noqa: BLE001 - the client's errors: counted, the run goes on
                stats.errors += 1
                stats.first_error = stats.first_error or exc
                continue
            took_ms = (time.perf_counter() - began) * 1000
            stats.published_all += 1
            with self.lock:
                self.sent[name] += 1
                self.series.add(self.elapsed(), "published", 1)
            if not warm:
                stats.latency.record(took_ms)
                stats.published += 1

    def backlog(self) -> int:
        """Sent minus received and acked, summed over the subscriptions (what the consumers still lack)."""
        if self.consumers is None:
            return 0
        with self.lock:
            sent = dict(self.sent)
        return sum(max(0, sent[topic] - self.consumers.unique(group)) for group, topic in self.groups)

    def _sample(self) -> None:
        while not self.stop_sending.wait(_SAMPLE_S):
            backlog = self.backlog()
            self.backlog_max = max(self.backlog_max, backlog)
            with self.lock:
                self.series.peak(self.elapsed(), "backlog_max", backlog)

    def _wait_drained(self, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline and self.backlog() > 0:
            if self.consumers is not None and self.consumers.process.poll() is not None:
                raise RuntimeError(f"the consumer process exited with status {self.consumers.process.returncode}")
            time.sleep(0.02)

    # ------------------------------------------------------------------------------ figures
    def _figures(self, stats: list[_Stats], produced_until: float, measure_from: float, measure_to: float,
                 t0_epoch: float, final: dict[str, Any] | None, server_cpu_s: float) -> None:
        r = self.result
        latency = Histogram()
        for s in stats:
            latency.merge(s.latency)
        published = sum(s.published for s in stats)
        errors = sum(s.errors for s in stats)
        if sum(s.published_all for s in stats) == 0 and errors:
            first = next(s.first_error for s in stats if s.first_error is not None)
            raise RuntimeError(f"every send failed; the first error: {first!r}")
        period = max(1e-9, min(produced_until, measure_to) - measure_from)
        size = self.w.message_size
        r.metric("messages_published", published, "msg")
        r.metric("publish_rate_msg_s", published / period, "msg/s")
        r.metric("publish_rate_mb_s", published * size / period / 1e6, "MB/s")
        r.metric("publish_errors", errors, "msg")
        r.histogram("publish_latency", latency)
        sent_measured = max(1, sum(s.published_all for s in stats))
        r.metric("server_cpu_ms_per_msg", server_cpu_s * 1000 / sent_measured, "ms")
        if final is not None and final["acked"] == 0 and final["errors"]:
            raise RuntimeError(f"every receive failed; the first error: {final['first_error']}")
        if final is not None:
            window_from, window_to = t0_epoch + measure_from, t0_epoch + min(produced_until, measure_to)
            acked_in_window = 0
            for slot, count in final["slots"].items():
                at = int(slot) / 10
                if window_from <= at < window_to:
                    acked_in_window += count
                self.series.add(at - t0_epoch, "consumed", count)
            r.metric("consume_rate_msg_s", acked_in_window / period, "msg/s")
            r.metric("consume_rate_mb_s", acked_in_window * size / period / 1e6, "MB/s")
            r.histogram("end_to_end_latency", Histogram.from_json(final["e2e"]))
            r.metric("messages_consumed", final["acked"], "msg")
            r.metric("consume_duplicates", final["duplicates"], "msg")
            r.metric("consume_missing", sum(max(0, self.sent[topic] - int(final["unique"].get(group, 0)))
                                            for group, topic in self.groups), "msg")
            r.metric("consume_errors", final["errors"] + final["ack_errors"], "")
            if final["first_error"]:
                r.info["consumer_first_error"] = final["first_error"]
        r.metric("backlog_max", self.backlog_max, "msg")
        r.metric("backlog_final", self.backlog(), "msg")
        if self.server is not None:
            r.metric("server_resident_memory_mb", self.server.rss_mb(), "MiB")
        if self.slave is not None:
            r.metric("slave_resident_memory_mb", self.slave.rss_mb(), "MiB")
        rows = self.series.rows({"published": "publish_rate_msg_s", "consumed": "consume_rate_msg_s"},
                                horizon_s=self.elapsed())
        r.series.extend(rows)

    # ------------------------------------------------------------------------------ stopping
    def close(self, *, check: bool) -> None:
        """Producers, consumers, then the brokers: every child stopped whatever happened. With
        ``check``, a server that did not stop cleanly fails the experiment."""
        self.stop_sending.set()
        if self.probe is not None:
            self.probe.stop()
        for producer in self.producers:
            try:
                producer.shutdown()
            except Exception:  # noqa: BLE001 - the server may be gone already; nothing to save
                pass
        self.producers.clear()
        if self.consumers is not None and self.consumers.process.poll() is None:
            self.consumers.kill()
        status = None
        if self.server is not None:
            status = self.server.stop()
        if self.slave is not None:
            self.slave.stop()
        if self.server is not None:
            self.result.metric("bytes_on_disk", disk_bytes(self.data_dir / "master" / "data"), "B")
            if self.slave is not None:
                self.result.metric("slave_bytes_on_disk", disk_bytes(self.data_dir / "slave" / "data"), "B")
            if check and status != 0:
                raise RuntimeError(f"plugmq serve exited with status {status} on SIGTERM; its log ends with:\n"
                                   f"{self.server.log_tail()}")
