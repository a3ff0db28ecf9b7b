"""Run one experiment: assemble the broker in a fresh directory, replay the workload, measure.

:func:`run_experiment` never raises: a strategy that cannot express the workload's delays gives
status "unsupported" (with the plugin's own error text), anything else that goes wrong gives
"failed" with the traceback; either way the caller gets a row.

Two replays share the broker wiring here (:class:`Replay`): on the virtual clock
(:mod:`plugmq.spark.replay_virtual`, for logic metrics: lateness, balance, churn) and on the real
clock (:mod:`plugmq.spark.replay_real`, for throughput and latency). A workload with ``serve``
has a replay of its own (:mod:`plugmq.spark.replay_served`: the broker behind ``plugmq serve`` in
a child process, the official client), and so has a workload with ``chaos``
(:mod:`plugmq.spark.replay_chaos`: a plugmq chaos schedule on a failover cluster). A replicating
plugin set gets its slave in a child process (:mod:`plugmq.spark.replication`).
"""

from __future__ import annotations

import abc
import json
import re
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from plugmq.broker.broker import Broker
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus, PushConsumer
from plugmq.core.clock import Clock
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.errors import DelayUnsupportedError
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue, StoredMessage
from plugmq.core.pluginmanager import build_options
from plugmq.kit.histogram import Histogram
from plugmq.measure.children import BrokerChild
from plugmq.measure.probes import disk_bytes, environment, own_memory_mb
from plugmq.spark.experiments import Experiment
from plugmq.spark.replication import ReplicationProbe, start_slave
from plugmq.spark.results import ExperimentResult, WindowSeries
from plugmq.spark.workload import SEQ, topic_names

__all__ = ["GroupState", "Replay", "run_experiment"]

log = get_logger(__name__)

_DURABILITY_KEY = re.compile(r"flush|fsync|sync|wal", re.IGNORECASE)


def run_experiment(exp: Experiment, *, work_dir: str | Path | None = None, window_s: float = 10.0,
                   keep_data: bool = False) -> ExperimentResult:
    """Run ``exp`` in a new temporary directory under ``work_dir``; always returns a result."""
    result = ExperimentResult(exp.experiment_id)
    result.info.update(describe(exp))
    result.info["env"] = environment()
    started = time.perf_counter()
    result.info["started_at"] = time.time()
    data_dir = Path(tempfile.mkdtemp(prefix="plugmq-exp-", dir=work_dir))
    result.info["data_dir"] = str(data_dir)
    try:
        if exp.workload.chaos is not None:
            from plugmq.spark.replay_chaos import ChaosReplay as replay_type
        elif exp.workload.serve is not None:
            from plugmq.spark.replay_served import ServedReplay as replay_type  # type: ignore[assignment]
        elif exp.workload.clock == "virtual":
            from plugmq.spark.replay_virtual import VirtualReplay as replay_type  # type: ignore[assignment]
        else:
            from plugmq.spark.replay_real import RealReplay as replay_type  # type: ignore[assignment]
        replay_type(exp, data_dir, result, window_s).run()
    except DelayUnsupportedError as exc:
        result.status, result.error = "unsupported", str(exc)
    except Exception as exc:  # noqa: BLE001 - the row must come back whatever the plugins did
        result.status, result.error = "failed", "".join(traceback.format_exception(exc))
        log.warning("experiment failed", experiment=exp.experiment_id, error=repr(exc))
    finally:
        if not keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    result.info["wall_s"] = time.perf_counter() - started
    if result.status != "ok":
        # Partial figures of an experiment that did not finish would read like results.
        result.metrics.clear()
        result.series.clear()
        result.histograms.clear()
    return result


def describe(exp: Experiment) -> dict[str, Any]:
    """The experiment's identity and configuration, including every durability flag in force."""
    options = exp.store_options()
    durability: dict[str, Any] = {}
    try:
        from plugmq.core.pluginmanager import load_plugins

        loaded = load_plugins(exp.plugin_set.plugins)
        for name, decl in loaded.declarations.items():
            built = build_options(decl, options.get(name), config_path=f"plugin_sets.{exp.plugin_set.name}.{name}")
            if built is not None:
                for key, value in attrs.asdict(built).items():
                    if _DURABILITY_KEY.search(key):
                        durability[f"{name}.{key}"] = value
    except Exception as exc:  # noqa: BLE001 - described anyway; the run itself reports the error
        durability["error"] = repr(exc)
    w = exp.workload
    return {
        "matrix": exp.matrix, "kind": exp.kind, "workload": w.name, "plugin_set": exp.plugin_set.name,
        "repetition": exp.repetition, "order": exp.order, "seed": exp.seed, "clock": w.clock,
        "plugins": list(exp.plugin_set.plugins), "store": exp.plugin_set.store, "flush": exp.effective_flush,
        "flush_source": "workload" if w.flush else "plugin_set", "delay_plugin": exp.plugin_set.delay,
        "allocation_strategy": exp.plugin_set.allocation_strategy, "batch_size": w.batch_size,
        "message_size": w.message_size, "filter_type": w.filter.type if w.filter else None,
        "filter_expression": w.filter.expression if w.filter else None,
        "filter_selectivity_target": w.filter.selectivity if w.filter else None,
        "delay_mix": ("levels" if w.delay and w.delay.levels else w.delay.distribution if w.delay else None),
        "served": w.serve is not None, "role": exp.plugin_set.role if exp.plugin_set.replication else None,
        "replication_plugin": exp.plugin_set.replication,
        "options": json.dumps(options, sort_keys=True, default=str),
        "durability": json.dumps(durability, sort_keys=True, default=str),
        "workload_json": json.dumps(attrs.asdict(w), sort_keys=True, default=str),
    }


@attrs.define
class GroupState:
    """One subscription's consumer group: live members and what they consumed."""

    name: str
    topic: str
    queues: list[MessageQueue]
    consumers: list[PushConsumer] = attrs.field(factory=list)
    seen: set[str] = attrs.field(factory=set)
    consumed: int = 0
    duplicates: int = 0
    next_id: int = 0


class Replay(abc.ABC):
    """Broker wiring shared by both replays: topics, groups, listeners, backlog, final figures."""

    clock_kind = "real"

    def __init__(self, exp: Experiment, data_dir: Path, result: ExperimentResult, window_s: float) -> None:
        self.exp = exp
        self.w = exp.workload
        self.data_dir = data_dir
        self.result = result
        self.series = WindowSeries(window_s)
        self.lock = threading.Lock()
        self.groups: list[GroupState] = []
        self.e2e = Histogram()
        self.broker: Broker | None = None
        self.slave: BrokerChild | None = None
        self.replication_probe: ReplicationProbe | None = None

    # ------------------------------------------------------------------------------ assembly
    def open(self, clock: Clock | None) -> Broker:
        ps = self.exp.plugin_set
        self.broker = Broker.open(self.data_dir / "broker", plugins=list(ps.plugins), options=self.exp.store_options(),
                                  clock=clock, **dict(ps.broker))
        self.topics = topic_names(self.w)
        self.queues = {t: self.broker.create_topic(t, self.w.queues_per_topic) for t in self.topics}
        delay = self.broker.delay
        self.levels_ms = (delay.capabilities.levels_ms if delay is not None else None) or DEFAULT_DELAY_LEVELS_MS
        for topic in self.topics:
            for s in range(self.w.subscriptions_per_topic):
                self.groups.append(GroupState(f"{topic}_s{s}", topic, self.queues[topic]))
        if ps.replication is not None:
            self._start_slave(self.broker)
        return self.broker

    def _start_slave(self, broker: Broker) -> None:
        """The master's slave in a child process; returns once the master sees it."""
        replication = broker.replication
        if replication is None:
            raise RuntimeError(f"plugin set {self.exp.plugin_set.name!r} names {self.exp.plugin_set.replication!r} "
                               "but the broker assembled no replication service")
        self.slave = start_slave(self.data_dir / "slave", self.exp, broker_name=broker.name,
                                 master_address=replication.status().address)
        self.replication_probe = ReplicationProbe(lambda: (time.monotonic(), replication.status().as_dict()),
                                                  self.elapsed)
        self.replication_probe.wait_for_slave()

    @abc.abstractmethod
    def elapsed(self) -> float:
        """Seconds since the replay's start on the replay's clock (window placement)."""

    def add_consumer(self, group: GroupState, *, background: bool) -> PushConsumer:
        assert self.broker is not None
        ps = self.exp.plugin_set
        flt = self.w.filter
        client_id = f"c{group.next_id:03d}"
        group.next_id += 1
        consumer = self.broker.push_consumer(
            group.name, self._listener(group), background=background, consume_from=ConsumeFrom.FIRST_OFFSET,
            strategy=ps.allocation_strategy, strategy_params=dict(ps.allocation_params), client_id=client_id,
            max_reconsume_times=0 if self.broker.delay is None else None,
        )
        consumer.subscribe(group.topic, flt.expression if flt else "*", flt.type if flt else "TAG")
        consumer.start()
        group.consumers.append(consumer)
        return consumer

    def _listener(self, group: GroupState) -> Callable[[list[StoredMessage]], ConsumeStatus]:
        def listener(messages: list[StoredMessage]) -> ConsumeStatus:
            now_ns = time.time_ns()
            at = self.elapsed()
            with self.lock:
                for message in messages:
                    seq = message.properties.get(SEQ, "")
                    if seq in group.seen:
                        group.duplicates += 1
                    else:
                        group.seen.add(seq)
                    group.consumed += 1
                    self.on_consumed(message, now_ns)
                self.series.add(at, "consumed", len(messages))
            return ConsumeStatus.CONSUME_SUCCESS

        return listener

    def on_consumed(self, message: StoredMessage, now_ns: int) -> None:  # noqa: B027 - optional hook
        """Per-message hook (under the lock), e.g. end-to-end latency on the real clock."""

    def backlog(self) -> int:
        """RocketMQ's consumer lag summed over groups: queue end minus the group's offset."""
        assert self.broker is not None
        total = 0
        for group in self.groups:
            offsets = self.broker.offsets(group.name)
            for queue in group.queues:
                end = self.broker.max_offset(queue)
                committed = offsets.read(queue)
                total += end - (self.broker.min_offset(queue) if committed is None else committed)
        return total

    # ------------------------------------------------------------------------------ finishing
    def finish(self) -> None:
        """Stop consumers, run the post-run scans, read store figures, close the broker."""
        from plugmq.spark.scans import delay_lateness, filter_costs

        broker = self.broker
        assert broker is not None
        for group in self.groups:
            for consumer in group.consumers:
                consumer.shutdown()
        r = self.result
        matched_per_topic: dict[str, int] = {}
        if self.w.filter is not None:
            matched_per_topic = filter_costs(broker, self.queues, self.w.filter, r)
        if self.w.delay is not None and self.w.delay.fraction > 0:
            delay_lateness(broker, self.queues, r)
        self.consumption_figures(matched_per_topic)
        rss, peak = own_memory_mb()
        r.metric("resident_memory_mb", rss, "MiB")
        r.metric("resident_memory_peak_mb", peak, "MiB")
        if broker.delay is not None:
            # The strategy's own counters, as it reports them (names differ between strategies).
            for key, value in broker.delay.metrics().items():
                r.metric(f"delay_plugin_{key}", value)
        stats = broker.store.stats()
        written = stats.get("bytes_appended", stats.get("bytes"))
        r.metric("bytes_written", written, "B")
        if "flushes" in stats:
            r.metric("store_flushes", stats["flushes"], "")
        broker.close()
        self.broker = None
        r.metric("bytes_on_disk", disk_bytes(self.data_dir / "broker"), "B")
        if self.slave is not None:
            r.metric("slave_resident_memory_mb", self.slave.rss_mb(), "MiB")
            r.metric("slave_bytes_on_disk", disk_bytes(self.data_dir / "slave"), "B")

    def consumption_figures(self, matched_per_topic: dict[str, int]) -> None:
        """Duplicates and missing messages per group, against what each subscription matches."""
        assert self.broker is not None
        r = self.result
        deterministic = self.clock_kind == "virtual"
        if not self.groups:
            return
        r.metric("messages_consumed", sum(g.consumed for g in self.groups), "msg", deterministic=deterministic)
        r.metric("consume_duplicates", sum(g.duplicates for g in self.groups), "msg", deterministic=deterministic)
        missing = 0
        for group in self.groups:
            on_topic = sum(self.broker.max_offset(q) - self.broker.min_offset(q) for q in group.queues)
            expected = matched_per_topic.get(group.topic, on_topic)
            missing += max(0, expected - len(group.seen))
        r.metric("consume_missing", missing, "msg", deterministic=deterministic)

    def close(self) -> None:
        if self.replication_probe is not None:
            self.replication_probe.stop()
        try:
            if self.broker is not None:
                try:
                    self.broker.close()
                finally:
                    self.broker = None
        finally:
            if self.slave is not None:
                self.slave.stop()


def run_producers(count: tuple[int, int], produce: Callable[[int, int], None], sample: Callable[[], None],
                  probe: ReplicationProbe | None, name: str) -> threading.Thread:
    """One thread per (topic, producer) of ``count`` running ``produce(topic, producer)``, with the
    sampler thread and the replication probe started first; returns, once every producer is done,
    the sampler thread (it runs on until its stop event: join it after setting that)."""
    topics, producers = count
    threads = [threading.Thread(target=produce, args=(t, p), name=f"{name}-producer-{t}-{p}", daemon=True)
               for t in range(topics) for p in range(producers)]
    sampler = threading.Thread(target=sample, name=f"{name}-sampler", daemon=True)
    sampler.start()
    if probe is not None:
        probe.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sampler

