"""What a matrix compares (its ``kind``): the measures in its table, the headline measures and who wins
them, what competes and what is held fixed, its charts.

This registry is the one place a new comparison dimension is declared. Adding one (as
"replication" was: no slave vs async vs sync double-write) takes:

1. the metrics, emitted by the replay (``result.metric("failover_s", ...)``) - from a probe in
   :meth:`plugmq.spark.replay.Replay.finish` or a replay of its own;
2. if the workload needs new knobs, a sub-table schema in :mod:`plugmq.spark.workload_tables`
   (like ``delay``/``filter``/``churn``/``chaos``);
3. a :class:`Kind` here: its columns, its headline :class:`Measure` s (which direction is better,
   and below what difference it is noise), and the bar charts to draw. The report, the headline
   table and the ``kind = "..."`` accepted by experiments files all follow from this entry.
"""

from __future__ import annotations

import attrs

from plugmq.kit.histogram import BUCKETS_PER_DECADE

__all__ = ["KINDS", "PERCENTILE", "TIMED", "Kind", "Measure"]

# A percentile read from the merged histogram is the upper edge of its bucket: up to this fraction
# above the true value, so two percentiles closer than this may be the same.
PERCENTILE = 10 ** (1 / BUCKETS_PER_DECADE) - 1
# A rate or a CPU cost timed on a shared host moves by more than this between two runs of the same
# thing (the load average changes under it): closer than this is noise, measured spread or not.
TIMED = 0.05
# Floors (smallest figures that mean something), in the measure's unit:
MS = 2.0  # lateness: two whole-millisecond times (deliver-at, delivered) each off by up to 1 ms
CALL_MS = 0.01  # one in-process call timed with perf_counter: the interpreter's own jitter is ~10 µs
WAKE_MS = 1.0  # end to end: a consumer thread woken on a busy host
POLL_MS = 5.0  # replication catch-up: the probe polls the master's status every 5 ms
ROLE_S = 0.25  # failover: plugmq chaos samples every broker's role every 0.25 s


@attrs.frozen
class Measure:
    """A headline measure: ``better`` is "lower" or "higher"; ``unit`` labels differences.

    The noise floor: ``floor`` (in ``unit``) is the smallest figure the measurement resolves - two
    values below it are both "about zero" and no ratio of them means anything, and a difference
    below it is not a finding; ``resolution`` is the relative difference below which two values are
    the same (:data:`PERCENTILE` for histogram percentiles, :data:`TIMED` for timed rates and costs).
    """

    metric: str
    label: str
    better: str = attrs.field(validator=attrs.validators.in_(("lower", "higher")))
    unit: str = ""
    floor: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    resolution: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    # A count metric: when above 0, the value is only a lower bound (a recovery never seen counts
    # as the time it was watched), and the report flags it like a value at a cap.
    bound_by: str = ""


@attrs.frozen
class Kind:
    """``contender``/``scenario``: columns of the experiments table naming what competes and what
    is held fixed in a headline row (``plugin_set`` on one ``workload`` for most kinds; filter types
    at one selectivity for filters). ``bars``: (metric, axis label) bar charts with run-to-run
    error bars; ``charts``: special charts the report knows by name ("lateness_cdf", "filter_cost")."""

    name: str
    columns: tuple[str, ...]
    headline: tuple[Measure, ...]
    contender: str = "plugin_set"
    scenario: str = "workload"
    bars: tuple[tuple[str, str], ...] = ()
    bars_title: str = ""
    charts: tuple[str, ...] = ()


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(
        "delay",
        columns=("delay_lateness_p50_ms", "delay_lateness_p99_ms", "delay_lateness_p999_ms", "delay_lateness_max_ms",
                 "delay_early_deliveries", "delay_delivered", "delay_undelivered", "publish_cost_us_per_msg",
                 "consume_missing", "consume_duplicates"),
        headline=(Measure("delay_lateness_p99_ms", "p99 lateness of delayed messages", "lower", "ms", MS, PERCENTILE),
                  Measure("delay_lateness_max_ms", "worst lateness", "lower", "ms", MS),
                  Measure("publish_cost_us_per_msg", "send cost (CPU + I/O per message)", "lower", "µs", 0.0, TIMED)),
        charts=("lateness_cdf",),
    ),
    Kind(
        "delay_precision",
        columns=("delay_lateness_p50_ms", "delay_lateness_p99_ms", "delay_lateness_p999_ms", "delay_lateness_max_ms",
                 "delay_early_deliveries", "delay_scheduled", "delay_delivered", "delay_undelivered",
                 "publish_rate_msg_s", "publish_latency_p99_ms", "drain_s", "consume_missing", "bytes_on_disk"),
        headline=(Measure("delay_lateness_p50_ms", "median lateness on the real clock", "lower", "ms", MS, PERCENTILE),
                  Measure("delay_lateness_p99_ms", "p99 lateness on the real clock", "lower", "ms", MS, PERCENTILE),
                  Measure("delay_lateness_max_ms", "worst lateness on the real clock", "lower", "ms", MS),
                  Measure("publish_rate_msg_s", "send rate with delayed messages", "higher", "msg/s", 0.0, TIMED)),
        bars=(("delay_lateness_p50_ms", "lateness p50 (ms)"), ("delay_lateness_p99_ms", "lateness p99 (ms)"),
              ("publish_rate_msg_s", "send rate (msg/s)")),
        bars_title="delay precision on the real clock (millisecond delays, bursts due together)",
        charts=("lateness_cdf",),
    ),
    Kind(
        "storage",
        columns=("publish_rate_msg_s", "publish_rate_mb_s", "publish_latency_p50_ms", "publish_latency_p99_ms",
                 "publish_latency_p999_ms", "publish_latency_max_ms", "end_to_end_latency_p50_ms",
                 "end_to_end_latency_p99_ms", "consume_rate_msg_s", "backlog_max", "publish_errors", "bytes_written",
                 "bytes_on_disk", "resident_memory_mb"),
        headline=(Measure("publish_rate_msg_s", "publish rate", "higher", "msg/s", 0.0, TIMED),
                  Measure("publish_latency_p99_ms", "publish latency p99", "lower", "ms", CALL_MS, PERCENTILE),
                  Measure("end_to_end_latency_p99_ms", "end-to-end latency p99", "lower", "ms", WAKE_MS, PERCENTILE)),
        bars=(("publish_rate_msg_s", "publish rate (msg/s)"), ("publish_latency_p99_ms", "publish latency p99 (ms)"),
              ("end_to_end_latency_p99_ms", "end-to-end p99 (ms)")),
        bars_title="throughput and latency per store and flush mode",
    ),
    Kind(
        "allocation",
        columns=("allocation_imbalance_initial", "allocation_imbalance", "allocation_imbalance_max",
                 "allocation_overload", "allocation_overload_max", "allocation_queues_moved_per_change",
                 "allocation_queues_moved_max", "allocation_membership_changes",
                 "allocation_changes_moving_nothing", "allocation_idle_member_changes", "consume_duplicates",
                 "consume_missing", "backlog_max"),
        headline=(Measure("allocation_imbalance", "mean imbalance (max/min queues per member)", "lower", "x"),
                  Measure("allocation_overload", "busiest member / fair share", "lower", "x"),
                  Measure("allocation_queues_moved_per_change", "queues moved per membership change", "lower",
                          "queues")),
        bars=(("allocation_imbalance", "mean imbalance (max/min)"), ("allocation_overload", "busiest member / fair share"),
              ("allocation_queues_moved_per_change", "queues moved per change")),
        bars_title="allocation under consumer churn",
    ),
    Kind(
        "filter",
        columns=("filter_selectivity", "filter_precheck_pass_rate", "filter_false_positive_rate",
                 "filter_scan_us_per_entry", "unfiltered_scan_us_per_entry", "filter_scan_cost_ratio",
                 "publish_rate_msg_s", "consume_rate_msg_s"),
        headline=(Measure("filter_scan_us_per_entry", "CPU per consume-queue entry scanned", "lower", "µs", 0.0, TIMED),
                  Measure("filter_false_positive_rate", "pre-check false positives", "lower", "", 0.001)),
        contender="filter_type",
        scenario="filter_selectivity_target",
        charts=("filter_cost",),
    ),
    Kind(
        "served",
        columns=("publish_rate_msg_s", "publish_rate_mb_s", "publish_latency_p50_ms", "publish_latency_p99_ms",
                 "consume_rate_msg_s", "end_to_end_latency_p50_ms", "end_to_end_latency_p99_ms",
                 "end_to_end_latency_max_ms", "backlog_max", "publish_errors", "consume_missing", "consume_duplicates",
                 "server_cpu_ms_per_msg", "server_resident_memory_mb", "server_start_s", "bytes_on_disk"),
        headline=(Measure("publish_rate_msg_s", "send rate through plugmq serve (official client)", "higher", "msg/s", 0.0,
                          TIMED),
                  Measure("consume_rate_msg_s", "receive + ack rate (official client)", "higher", "msg/s", 0.0, TIMED),
                  Measure("end_to_end_latency_p50_ms", "end-to-end latency p50", "lower", "ms", WAKE_MS, PERCENTILE),
                  Measure("end_to_end_latency_p99_ms", "end-to-end latency p99", "lower", "ms", WAKE_MS, PERCENTILE)),
        bars=(("publish_rate_msg_s", "send rate (msg/s)"), ("consume_rate_msg_s", "receive + ack rate (msg/s)"),
              ("end_to_end_latency_p99_ms", "end-to-end p99 (ms)")),
        bars_title="served through plugmq serve, official Python client",
    ),
    Kind(
        "replication",
        columns=("publish_rate_msg_s", "publish_latency_p50_ms", "publish_latency_p99_ms", "publish_not_ok",
                 "replication_lag_messages_mean", "replication_lag_messages_max", "replication_lag_bytes_max",
                 "replication_catch_up_ms", "replication_unreplicated_bytes", "consume_rate_msg_s",
                 "end_to_end_latency_p99_ms", "bytes_on_disk", "slave_bytes_on_disk"),
        headline=(Measure("publish_rate_msg_s", "send rate", "higher", "msg/s", 0.0, TIMED),
                  Measure("publish_latency_p99_ms", "send latency p99", "lower", "ms", CALL_MS, PERCENTILE),
                  Measure("replication_lag_messages_max", "most messages the slave lagged while sending", "lower",
                          "msg", 1.0),
                  Measure("replication_catch_up_ms", "slave catch-up after the last send", "lower", "ms", POLL_MS)),
        bars=(("publish_rate_msg_s", "send rate (msg/s)"), ("publish_latency_p99_ms", "send latency p99 (ms)"),
              ("replication_lag_messages_max", "slave lag, max (messages)")),
        bars_title="replication: no slave vs async vs sync double-write",
    ),
    Kind(
        "chaos",
        columns=("chaos_lost_acked", "chaos_redelivered_after_ack", "chaos_send_recovery_s",
                 "chaos_send_recovery_max_s", "chaos_receive_recovery_s", "chaos_receive_recovery_max_s",
                 "chaos_send_never_recovered", "chaos_receive_never_recovered", "chaos_split_brain_s",
                 "chaos_acked_by_deposed_master", "chaos_acked", "chaos_send_failures", "chaos_rounds"),
        headline=(Measure("chaos_lost_acked", "acknowledged messages lost to the faults", "lower", "msg", 1.0),
                  Measure("chaos_send_recovery_s", "send recovery after a fault (median of rounds)", "lower", "s",
                          ROLE_S, TIMED, bound_by="chaos_send_never_recovered"),
                  Measure("chaos_receive_recovery_s", "receive recovery after a fault (median of rounds)", "lower",
                          "s", ROLE_S, TIMED, bound_by="chaos_receive_never_recovered"),
                  Measure("chaos_split_brain_s", "longest a deposed master went on acking", "lower", "s", ROLE_S)),
        bars=(("chaos_send_recovery_s", "send recovery (s, median of rounds)"),
              ("chaos_receive_recovery_s", "receive recovery (s, median of rounds)"),
              ("chaos_lost_acked", "acknowledged messages lost")),
        bars_title="failover: the workload's plugmq chaos schedule per plugin set (official client, ZooKeeper)",
    ),
    Kind(
        "general",
        columns=("publish_rate_msg_s", "publish_latency_p50_ms", "publish_latency_p99_ms", "end_to_end_latency_p99_ms",
                 "consume_rate_msg_s", "backlog_max", "delay_lateness_p99_ms", "resident_memory_mb"),
        headline=(Measure("publish_rate_msg_s", "publish rate", "higher", "msg/s", 0.0, TIMED),
                  Measure("publish_latency_p99_ms", "publish latency p99", "lower", "ms", CALL_MS, PERCENTILE)),
        bars=(("publish_rate_msg_s", "publish rate (msg/s)"), ("publish_latency_p99_ms", "publish latency p99 (ms)")),
        bars_title="throughput",
    ),
)}
