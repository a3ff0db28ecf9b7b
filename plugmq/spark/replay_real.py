"""The workload on the real clock: throughput and latency (OpenMessaging Benchmark style).

Producer threads (``producers_per_topic`` per topic) send at ``producer_rate`` msg/s each (0: as
fast as they can) for warm-up plus duration; push consumers run on their own threads. Publish
latency is the time a send (or a batch send, counted once per message in it) takes; end-to-end
latency is consume time minus the send timestamp carried in the first 8 bytes of the body.
Figures exclude the warm-up. After producing stops, consumers get up to ``drain_s`` (default:
the duration, at least 10 s) to catch up.
"""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

from plugmq.core.errors import DelayUnsupportedError, PlugmqError
from plugmq.core.message import SendResult, SendStatus, StoredMessage
from plugmq.kit.histogram import Histogram
from plugmq.measure.pacing import Pacer
from plugmq.spark.experiments import Experiment
from plugmq.spark.replay import Replay, run_producers
from plugmq.spark.results import ExperimentResult
from plugmq.spark.workload import DUE, WARM, MessageFactory

__all__ = ["RealReplay"]

_HEADER = struct.Struct(">q")
_SAMPLE_S = 0.2


class _ProducerStats:
    def __init__(self) -> None:
        self.latency = Histogram()
        self.published = 0  # measured (after warm-up)
        self.published_all = 0
        self.errors = 0
        self.not_ok = 0  # stored, but answered other than SEND_OK (a sync master's slave timeout, ...)
        self.scheduled = 0
        self.first_error: BaseException | None = None


class RealReplay(Replay):
    clock_kind = "real"

    def __init__(self, exp: Experiment, data_dir: Path, result: ExperimentResult, window_s: float) -> None:
        super().__init__(exp, data_dir, result, window_s)
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.unsupported: DelayUnsupportedError | None = None
        self.crashed: BaseException | None = None
        self.consumed_measured = 0
        self.measure_from = self.measure_to = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> None:
        try:
            self._run()
            self.finish()
        finally:
            self.stop.set()
            self.close()

    def on_consumed(self, message: StoredMessage, now_ns: int) -> None:
        props = message.properties
        if WARM in props or DUE in props:
            return
        if self.measure_from <= self.elapsed() < self.measure_to:
            self.consumed_measured += 1
        sent_ns = _HEADER.unpack_from(message.body)[0]
        self.e2e.record((now_ns - sent_ns) / 1e6)

    def _run(self) -> None:
        w = self.w
        broker = self.open(None)
        for t in range(w.topics):  # the backlog exists before any consumer starts
            backlog = MessageFactory(w, self.exp.seed, t, f"{t}.backlog", self.levels_ms)
            with broker.producer(f"bench_backlog{t}") as producer:
                for _ in range(w.backlog_messages):
                    producer.send(backlog.next(broker.clock.now_ms(), warmup=True,
                                               header=_HEADER.pack(time.time_ns())))
        backlog_start = time.perf_counter()
        for group in self.groups:
            for _ in range(w.consumers_per_subscription):
                self.add_consumer(group, background=True)
        if w.backlog_messages and self.groups:
            self._wait_drained(timeout=max(10.0, w.duration_s))
            self.result.metric("backlog_drain_s", time.perf_counter() - backlog_start, "s")
        self.t0 = time.perf_counter()
        self.measure_from, self.measure_to = w.warmup_s, w.warmup_s + w.duration_s
        stats = [_ProducerStats() for _ in range(w.topics * w.producers_per_topic)]
        sampler = run_producers((w.topics, w.producers_per_topic),
                                lambda t, p: self._produce(t, p, stats[t * w.producers_per_topic + p]),
                                self._sample, self.replication_probe, "bench")
        produced_until = self.elapsed()
        if self.unsupported is not None:
            raise self.unsupported
        if self.crashed is not None:
            raise RuntimeError(f"a producer thread died: {self.crashed!r}") from self.crashed
        if self.replication_probe is not None:
            self.replication_probe.finish(self.result, max(10.0, w.drain_s), self.measure_from, self.measure_to)
        drain_began = time.perf_counter()
        if self.groups or (w.delay is not None and w.delay.fraction > 0):  # consumers or timers still due
            self._wait_drained(timeout=w.drain_s if w.drain_s > 0 else max(10.0, w.duration_s))
        self.result.metric("drain_s", time.perf_counter() - drain_began, "s")
        self.stop.set()
        sampler.join()
        self._figures(stats, produced_until)

    def _produce(self, topic: int, producer_index: int, stats: _ProducerStats) -> None:
        try:
            self._produce_loop(topic, producer_index, stats)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread: a dead producer fails the run
            self.crashed = exc
            self.stop.set()

    def _produce_loop(self, topic: int, producer_index: int, stats: _ProducerStats) -> None:
        w = self.w
        assert self.broker is not None
        factory = MessageFactory(w, self.exp.seed, topic, f"{topic}.{producer_index}", self.levels_ms)
        producer = self.broker.producer(f"bench_p{topic}_{producer_index}")
        pacer = Pacer(w.producer_rate / w.batch_size, w.warmup_s + w.duration_s, self.elapsed, self.stop,
                      index=producer_index, producers=w.producers_per_topic)
        clock = self.broker.clock
        try:
            while pacer.next():
                warm = self.elapsed() < w.warmup_s
                now_ms = clock.now_ms()
                messages = [factory.next(now_ms, warmup=warm, header=_HEADER.pack(time.time_ns()))
                            for _ in range(w.batch_size)]
                began = time.perf_counter()
                try:
                    sent = producer.send(messages[0]) if len(messages) == 1 else producer.send_batch(messages)
                except DelayUnsupportedError as exc:
                    self.unsupported = exc
                    self.stop.set()
                    return
                except PlugmqError as exc:
                    stats.errors += len(messages)
                    stats.first_error = stats.first_error or exc
                    continue
                took_ms = (time.perf_counter() - began) * 1000
                stats.published_all += len(messages)
                for answer in (sent,) if isinstance(sent, SendResult) else sent:
                    if answer.status is not SendStatus.SEND_OK:
                        stats.not_ok += 1
                with self.lock:
                    self.series.add(self.elapsed(), "published", len(messages))
                if not warm:
                    stats.latency.record(took_ms, weight=len(messages))
                    stats.published += len(messages)
                    stats.scheduled += sum(1 for m in messages if m.is_delayed)
        finally:
            producer.close()

    def _sample(self) -> None:
        self.backlog_max = 0
        while not self.stop.wait(_SAMPLE_S):
            try:
                backlog = self.backlog()
            except PlugmqError:
                return  # broker closing
            self.backlog_max = max(self.backlog_max, backlog)
            with self.lock:
                self.series.peak(self.elapsed(), "backlog_max", backlog)

    def _wait_drained(self, timeout: float) -> None:
        broker = self.broker
        assert broker is not None
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            pending = broker.delay.pending() if broker.delay is not None else 0
            if pending == 0 and self.backlog() == 0:
                return
            time.sleep(0.02)

    def _figures(self, stats: list[_ProducerStats], produced_until: float) -> None:
        r = self.result
        latency = Histogram()
        for s in stats:
            latency.merge(s.latency)
        published = sum(s.published for s in stats)
        errors = sum(s.errors for s in stats)
        if sum(s.published_all for s in stats) == 0 and errors:
            first = next(s.first_error for s in stats if s.first_error is not None)
            raise RuntimeError(f"every send failed; the first error: {first!r}")
        period = max(1e-9, min(produced_until, self.measure_to) - self.measure_from)
        size = self.w.message_size
        r.metric("messages_published", published, "msg")
        r.metric("publish_rate_msg_s", published / period, "msg/s")
        r.metric("publish_rate_mb_s", published * size / period / 1e6, "MB/s")
        r.metric("publish_errors", errors, "msg")
        r.metric("publish_not_ok", sum(s.not_ok for s in stats), "msg")
        r.metric("delay_scheduled", sum(s.scheduled for s in stats), "msg")
        r.histogram("publish_latency", latency)
        if self.groups:
            r.metric("consume_rate_msg_s", self.consumed_measured / period, "msg/s")
            r.metric("consume_rate_mb_s", self.consumed_measured * size / period / 1e6, "MB/s")
            r.histogram("end_to_end_latency", self.e2e)
        r.metric("backlog_max", getattr(self, "backlog_max", 0), "msg")
        r.metric("backlog_final", self.backlog(), "msg")
        rows = self.series.rows({"published": "publish_rate_msg_s", "consumed": "consume_rate_msg_s"},
                                horizon_s=self.elapsed())
        r.series.extend(rows)
