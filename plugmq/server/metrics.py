"""Prometheus metrics of ``plugmq serve`` (``[server] metrics_listen = "host:port"``, path ``/metrics``).

Collected when Prometheus scrapes, from what the broker keeps anyway: its traffic counters
(:mod:`plugmq.broker.traffic`), ``store.stats()``, ``delay.metrics()``, the transaction service's
figures, the pop state and the committed offsets (consumer lag through the same code as
``plugmq admin consumer-progress``), and dead letters and retries counted by an event-hook observer
(those hooks never make the broker read a message back). Sends pay nothing for metrics beyond the
broker's counters.

Names follow RocketMQ 5 (BrokerMetricsConstant, DefaultStoreMetricsConstant) where one exists:

=====================================  =============================================================
``rocketmq_messages_in_total``         messages sent, by topic and message_type (normal, fifo, delay)
``rocketmq_throughput_in_total``       their body bytes
``rocketmq_messages_out_total``        messages handed to consumers, by topic and consumer_group
``rocketmq_throughput_out_total``      their body bytes
``rocketmq_consumer_lag_messages``     messages not done, by consumer_group, topic, queue_id, consume_mode
``rocketmq_consumer_inflight_messages``  pop messages received and not acked
``rocketmq_consumer_ready_messages``   messages not handed out yet
``rocketmq_consumer_lag_latency``      ms since the oldest message not done was stored
``rocketmq_send_to_dlq_messages_total``  dead-lettered (since the server started)
``rocketmq_timing_messages``           delayed messages not delivered yet
``rocketmq_half_messages``             transactions without a decision
``rocketmq_storage_size``              bytes allocated under the data dir
=====================================  =============================================================

and plugmq's own: ``plugmq_store_append_latency_seconds`` (histogram of the broker's store
calls), ``plugmq_store_flush_latency_seconds`` (sum and count, for stores reporting
``flush_seconds_total``), ``plugmq_delay_lateness_milliseconds`` (the delay plugin's lateness
quantiles), ``plugmq_store_*`` / ``plugmq_delay_*`` / ``plugmq_transaction_*`` (every figure of
the plugin's ``stats()`` / ``metrics()``), ``plugmq_disk_*_bytes``, ``plugmq_pop_inflight_messages``,
``plugmq_retried_messages_total``, ``plugmq_broker_info`` (broker name and role: the place where a
cluster's role, epoch and replication lag join) and the process's CPU and memory (``process_*``).
With a replication plugin: ``plugmq_master_epoch`` and ``plugmq_replication_lag_bytes`` /
``plugmq_replication_lag_messages`` by slave_id (a master's slaves; a slave's own lag).
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from plugmq.admin import BrokerAdmin
from plugmq.broker.ports import Served
from plugmq.core import BrokerRole, hookimpl
from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.message import StoredMessage
from plugmq.kit.diskspace import allocated_bytes
from plugmq.server.tls import TlsOptions

__all__ = ["BrokerCollector", "EventCounter", "MetricsEndpoint"]

log = get_logger(__name__)

_LAG_LABELS = ["consumer_group", "topic", "queue_id", "consume_mode"]
_NOT_A_NAME = re.compile(r"[^a-zA-Z0-9_]")
# delay metrics() figures that are lateness quantiles (milliseconds), by the quantile they stand for
_LATENESS_QUANTILES = {"late_ms_p50": "0.5", "late_ms_p99": "0.99", "late_ms_max": "1"}


class EventCounter:
    """An event-hook observer counting dead letters and retries per (topic, group)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dead_lettered: dict[tuple[str, str], int] = {}
        self.retried: dict[tuple[str, str], int] = {}

    def _count(self, table: dict[tuple[str, str], int], topic: str, group: str) -> None:
        with self._lock:
            table[(topic, group)] = table.get((topic, group), 0) + 1

    @hookimpl
    def plugmq_message_dead_lettered(self, broker_name: str, consumer_group: str, message: StoredMessage) -> None:
        self._count(self.dead_lettered, message.topic, consumer_group)

    @hookimpl
    def plugmq_message_retried(self, broker_name: str, consumer_group: str, message: StoredMessage,
                               reconsume_times: int) -> None:
        self._count(self.retried, message.topic, consumer_group)

    def snapshot(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self.dead_lettered), dict(self.retried)


def _gauges(prefix: str, what: str, figures: Mapping[str, float]) -> Iterator[Metric]:
    for key, value in sorted(figures.items()):
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield GaugeMetricFamily(f"{prefix}_{_NOT_A_NAME.sub('_', key)}", f"{what} figure {key!r}", value=value)


class BrokerCollector:
    """A prometheus_client collector over one broker: everything is read at scrape time."""

    def __init__(self, broker: Served, events: EventCounter) -> None:
        self.broker = broker
        self.admin = BrokerAdmin(broker)
        self.events = events

    def describe(self) -> list[Metric]:
        return []  # names depend on the plugins; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        for section in (self._info, self._traffic, self._consumers, self._events, self._store, self._delay,
                        self._transactions):
            try:
                yield from section()
            except Exception:  # one failing source must not blank the whole scrape
                log.exception("a metrics source failed; left out of this scrape", source=section.__name__)

    def _info(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("plugmq_broker_info", "The broker (value 1): its name and role in a cluster",
                                 labels=["broker", "role"])
        replication = self.broker.replication
        info.add_metric([self.broker.name, self.broker.role.value if replication is not None else "standalone"], 1)
        yield info
        if replication is None:
            return
        status = replication.status()
        epoch = GaugeMetricFamily("plugmq_master_epoch", "The newest master epoch the broker's log knows (failover)",
                                  labels=["broker"])
        epoch.add_metric([self.broker.name], status.epoch)
        yield epoch
        lag_bytes = GaugeMetricFamily("plugmq_replication_lag_bytes",
                                      "Commit-log bytes a slave lacks: per slave on a master, its own on a slave",
                                      labels=["broker", "slave_id"])
        lag_messages = GaugeMetricFamily("plugmq_replication_lag_messages",
                                         "Records a slave lacks (on a master, per slave; left out when not counted)",
                                         labels=["broker", "slave_id"])
        if status.role is BrokerRole.SLAVE:
            lag_bytes.add_metric([self.broker.name, str(status.broker_id)], status.lag_bytes)
        for slave in status.slaves:
            lag_bytes.add_metric([self.broker.name, str(slave.broker_id)], slave.lag_bytes)
            if slave.lag_messages is not None:
                lag_messages.add_metric([self.broker.name, str(slave.broker_id)], slave.lag_messages)
        yield lag_bytes
        yield lag_messages

    def _traffic(self) -> Iterator[Metric]:
        snapshot = self.broker.traffic.snapshot()
        for name, doc, table, labels in (
            ("rocketmq_messages_in", "Messages sent to the broker", snapshot.messages_in, ["topic", "message_type"]),
            ("rocketmq_throughput_in", "Body bytes of messages sent to the broker", snapshot.bytes_in,
             ["topic", "message_type"]),
            ("rocketmq_messages_out", "Messages handed to consumers", snapshot.messages_out,
             ["topic", "consumer_group"]),
            ("rocketmq_throughput_out", "Body bytes of messages handed to consumers", snapshot.bytes_out,
             ["topic", "consumer_group"]),
        ):
            family = CounterMetricFamily(name, doc, labels=labels)
            for key, value in sorted(table.items()):
                family.add_metric(list(key), value)
            yield family
        latency = snapshot.append_latency
        histogram = HistogramMetricFamily("plugmq_store_append_latency_seconds",
                                          "Duration of the broker's store appends (one per send or batch)")
        histogram.add_metric([], [(_edge(edge), count) for edge, count in latency.cumulative()], latency.sum_s)
        yield histogram

    def _consumers(self) -> Iterator[Metric]:
        now = self.broker.clock.now_ms()
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Messages the group has not done yet",
                                labels=_LAG_LABELS)
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages",
                                     "Messages received by the group and not acked yet", labels=_LAG_LABELS)
        ready = GaugeMetricFamily("rocketmq_consumer_ready_messages", "Messages not handed to the group yet",
                                  labels=_LAG_LABELS)
        latency = GaugeMetricFamily("rocketmq_consumer_lag_latency",
                                    "Milliseconds since the oldest message the group has not done was stored",
                                    labels=_LAG_LABELS)
        for group in self.admin.group_names():
            for row in self.admin.consumer_progress(group).queues:
                labels = [group, row.topic, str(row.queue_id), row.mode]
                lag.add_metric(labels, row.lag)
                inflight.add_metric(labels, row.inflight)
                ready.add_metric(labels, row.lag - row.inflight)
                latency.add_metric(labels, max(0, now - row.oldest_pending_ms) if row.oldest_pending_ms else 0)
        yield from (lag, inflight, ready, latency)
        yield GaugeMetricFamily("plugmq_pop_inflight_messages", "Pop messages in flight, every group",
                                value=self.broker.pop.inflight_count())

    def _events(self) -> Iterator[Metric]:
        dead, retried = self.events.snapshot()
        for name, doc, table in (
            ("rocketmq_send_to_dlq_messages", "Messages moved to a dead-letter topic since the server started", dead),
            ("plugmq_retried_messages", "Messages a consumer gave up on for now, since the server started", retried),
        ):
            family = CounterMetricFamily(name, doc, labels=["topic", "consumer_group"])
            for key, value in sorted(table.items()):
                family.add_metric(list(key), value)
            yield family

    def _store(self) -> Iterator[Metric]:
        stats = dict(self.broker.store.stats())
        if "flush_seconds_total" in stats and "flushes" in stats:
            flush = SummaryMetricFamily("plugmq_store_flush_latency_seconds", "Time the store spent flushing")
            flush.add_metric([], count_value=int(stats["flushes"]), sum_value=stats["flush_seconds_total"])
            yield flush
        yield from _gauges("plugmq_store", "store", stats)
        data_dir = self.broker.data_dir
        yield GaugeMetricFamily("rocketmq_storage_size", "Bytes allocated to files under the data dir",
                                value=allocated_bytes(data_dir))
        usage = shutil.disk_usage(data_dir)
        yield GaugeMetricFamily("plugmq_disk_total_bytes", "Size of the data dir's file system", value=usage.total)
        yield GaugeMetricFamily("plugmq_disk_free_bytes", "Free bytes on the data dir's file system",
                                value=usage.free)

    def _delay(self) -> Iterator[Metric]:
        delay = self.broker.delay
        if delay is None:
            return
        yield GaugeMetricFamily("rocketmq_timing_messages", "Delayed messages not delivered yet",
                                value=delay.pending())
        figures = dict(delay.metrics())
        quantiles = {q: figures[key] for key, q in _LATENESS_QUANTILES.items() if key in figures}
        if quantiles:
            lateness = Metric("plugmq_delay_lateness_milliseconds",
                              "How late delayed messages were delivered (the delay plugin's quantiles)", "summary")
            for quantile, value in quantiles.items():
                lateness.add_sample("plugmq_delay_lateness_milliseconds", {"quantile": quantile}, value)
            if "delivered" in figures:
                lateness.add_sample("plugmq_delay_lateness_milliseconds_count", {}, figures["delivered"])
                if "late_ms_mean" in figures:
                    lateness.add_sample("plugmq_delay_lateness_milliseconds_sum", {},
                                        figures["late_ms_mean"] * figures["delivered"])
            yield lateness
        yield from _gauges("plugmq_delay", "delay plugin", figures)

    def _transactions(self) -> Iterator[Metric]:
        service = self.broker.transactions
        if service is None:
            return
        yield GaugeMetricFamily("rocketmq_half_messages", "Transactions without a decision", value=service.pending())
        yield from _gauges("plugmq_transaction", "transaction service", service.metrics())


def _edge(edge: float) -> str:
    return "+Inf" if edge == float("inf") else repr(edge)


class MetricsEndpoint:
    """The HTTP endpoint serving ``/metrics`` for one broker, on its own thread."""

    def __init__(self, broker: Served, listen: str, tls: TlsOptions | None = None) -> None:
        """Serve on ``listen``; with ``tls``, HTTPS with its certificate (and client check when mutual)."""
        host, _, port = listen.rpartition(":")
        if tls is not None and (tls.cert_path is None or tls.key_path is None):
            raise ConfigError("HTTPS metrics need the certificate and key as files ([server.tls] cert and key)")
        self.events = EventCounter()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, self.events))
        ProcessCollector(registry=self.registry)
        self._broker = broker
        self._observer_name = f"plugmq-metrics-{id(self)}"
        try:
            self._server, self._thread = start_http_server(
                int(port), host, self.registry, certfile=str(tls.cert_path) if tls else None,
                keyfile=str(tls.key_path) if tls else None,
                client_cafile=str(tls.client_ca_path) if tls and tls.mutual else None,
                client_auth_required=tls is not None and tls.mutual)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {listen!r} ({exc.strerror or exc}); pick another "
                              "server.metrics_listen host:port") from exc
        broker.add_observer(self.events, self._observer_name)
        self.address = f"{host}:{self._server.server_port}"
        scheme = "http" if tls is None else "https"
        log.info("metrics served", address=self.address, url=f"{scheme}://{self.address}/metrics")

    def close(self) -> None:
        self._broker.remove_observer(self._observer_name)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
