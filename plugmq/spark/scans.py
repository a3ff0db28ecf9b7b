"""Post-run scans of the workload's topics: delay lateness and filter pre-check figures and cost.

Both read what the broker stored, so they do not depend on how consumers were scheduled: a
delivered delayed message's lateness is its store time on the real topic minus its intended
deliver time; a filter's figures come from pulling every entry through the compiled subscription.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from plugmq.broker.broker import Broker
from plugmq.core.contracts import Filter
from plugmq.core.message import (
    ConsumeQueueEntry,
    MessageQueue,
    PullStatus,
    StoredMessage,
)
from plugmq.kit.histogram import Histogram
from plugmq.spark.experiments import FilterSpec
from plugmq.spark.results import ExperimentResult
from plugmq.spark.workload import DUE, WARM

__all__ = ["CountingFilter", "delay_lateness", "filter_costs", "scan_topic"]

_SCAN_REPEATS = 3


def scan_topic(broker: Broker, queues: Sequence[MessageQueue], subscription: Filter | None = None,
               batch: int = 64) -> list[StoredMessage]:
    """Every message of ``queues`` that ``subscription`` lets through, via the broker's pull."""
    found: list[StoredMessage] = []
    for queue in queues:
        offset = broker.min_offset(queue)
        end = broker.max_offset(queue)
        while offset < end:
            result = broker.pull(queue, offset, batch, subscription)
            if result.status in (PullStatus.OFFSET_ILLEGAL, PullStatus.NO_NEW_MSG) or result.next_begin_offset <= offset:
                break
            found.extend(result.messages)
            offset = result.next_begin_offset
    return found


def delay_lateness(broker: Broker, queues: Mapping[str, Sequence[MessageQueue]], result: ExperimentResult) -> None:
    """Lateness of every delivered delayed (non-warm-up) message; early deliveries counted apart."""
    hist = Histogram()
    early = delivered = 0
    for topic_queues in queues.values():
        for message in scan_topic(broker, topic_queues):
            due = message.properties.get(DUE)
            if due is None or WARM in message.properties:
                continue
            delivered += 1
            lateness = message.store_timestamp_ms - int(due)
            if lateness < 0:
                early += 1
            hist.record(float(lateness))
    deterministic = result.info.get("clock") == "virtual"
    result.histogram("delay_lateness", hist, deterministic=deterministic)
    result.metric("delay_delivered", delivered, "msg", deterministic=deterministic)
    result.metric("delay_early_deliveries", early, "msg", deterministic=deterministic)
    scheduled = result.metric_map().get("delay_scheduled")
    if scheduled is not None:
        result.metric("delay_undelivered", scheduled - delivered, "msg", deterministic=deterministic)


class CountingFilter:
    """Delegates to a compiled subscription and counts pre-check passes and exact matches."""

    def __init__(self, inner: Filter) -> None:
        self.inner = inner
        self.expression_type = inner.expression_type
        self.expression = inner.expression
        self.prechecked = 0
        self.passed = 0
        self.exact_checked = 0
        self.matched = 0

    def precheck(self, entry: ConsumeQueueEntry) -> bool:
        self.prechecked += 1
        ok = self.inner.precheck(entry)
        self.passed += ok
        return ok

    def evaluate(self, properties: Mapping[str, str], tags: str | None = None) -> bool | None:
        return self.inner.evaluate(properties, tags)

    def matches(self, properties: Mapping[str, str], tags: str | None = None) -> bool:
        self.exact_checked += 1
        ok = self.inner.matches(properties, tags)
        self.matched += ok
        return ok


def _timed_scan(broker: Broker, queues: Sequence[MessageQueue], subscription: Filter | None) -> tuple[float, int]:
    # CPU time of this thread: other work on a shared machine does not inflate it.
    start = time.thread_time()
    found = len(scan_topic(broker, queues, subscription))
    return time.thread_time() - start, found


def filter_costs(broker: Broker, queues: Mapping[str, Sequence[MessageQueue]], spec: FilterSpec,
                 result: ExperimentResult) -> dict[str, int]:
    """Pre-check pass rate, false-positive rate, selectivity and scan cost against a no-filter
    scan of the same entries; returns the matching message count per topic."""
    entries = prechecked = passed = matched = 0
    filtered_s = baseline_s = 0.0
    matched_per_topic = {}
    for topic, topic_queues in queues.items():
        counting = CountingFilter(broker.compile_subscription(spec.type, spec.expression))
        scan_topic(broker, topic_queues, counting)  # counted once, before the timed repeats
        entries += sum(broker.max_offset(q) - broker.min_offset(q) for q in topic_queues)
        prechecked += counting.prechecked
        passed += counting.passed
        matched += counting.matched
        matched_per_topic[topic] = counting.matched
        plain = broker.compile_subscription(spec.type, spec.expression)
        filtered_s += min(_timed_scan(broker, topic_queues, plain)[0] for _ in range(_SCAN_REPEATS))
        baseline_s += min(_timed_scan(broker, topic_queues, None)[0] for _ in range(_SCAN_REPEATS))
    result.metric("filter_entries", entries, "msg", deterministic=True)
    if prechecked:
        result.metric("filter_precheck_pass_rate", passed / prechecked, "", deterministic=True)
    if passed:
        result.metric("filter_false_positive_rate", (passed - matched) / passed, "", deterministic=True)
    if entries:
        result.metric("filter_selectivity", matched / entries, "", deterministic=True)
        result.metric("filter_scan_us_per_entry", filtered_s * 1e6 / entries, "us")
        result.metric("unfiltered_scan_us_per_entry", baseline_s * 1e6 / entries, "us")
        if baseline_s > 0:
            result.metric("filter_scan_cost_ratio", filtered_s / baseline_s, "x")
    return matched_per_topic
