"""The Spark side: the session, the tasks that run the experiments, gathering, aggregation, Parquet.

``spark.range(0, n, 1, n)`` makes n partitions holding one id each, and ``mapInPandas`` runs task
``id`` of the plan in that partition (no shuffle, no hash repartitioning that could move work
between tasks). A virtual-clock experiment is a task of its own; the real-clock experiments
share one task, the serial lane (:func:`plan_tasks`), so they never overlap each other and never
hold up a task slot that a virtual-clock experiment could use.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from plugmq.kit.histogram import quantile_from_counts
from plugmq.spark.execute import ExecOptions, execute
from plugmq.spark.experiments import Experiment
from plugmq.spark.progress import ProgressSender
from plugmq.spark.results import LONG_COLUMNS, LONG_SCHEMA, QUANTILES

__all__ = ["aggregate", "collect_matrix", "estimated_cost_s", "experiment_task", "make_session", "plan_tasks",
           "split_tables", "write_tables"]


def make_session(master: str = "local[*]", *, app_name: str = "plugmq-compare", local_dir: str | None = None,
                 conf: dict[str, str] | None = None) -> Any:
    """A SparkSession whose Python workers run this interpreter (the driver's venv).

    On a cluster the workers cannot use the driver's path: a PYSPARK_PYTHON already set (e.g. to
    the unpacked venv-pack archive, ``./environment/bin/python``) is kept there.

    In local mode nothing of Spark's listens beyond loopback and its web UI (which has no
    authentication) is off; ``conf`` may turn either back on.
    """
    local = master.startswith("local")
    if local:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the block manager and RPC bind here
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               # An experiment is a long task with side effects on the host: never run a copy
               # speculatively next to it.
               .config("spark.speculation", "false")
               # The tables aggregated are small (gathered on the driver): Spark's default of 200
               # shuffle partitions costs minutes of task start-up on a small cluster.
               .config("spark.sql.shuffle.partitions", "4"))
    if local:
        builder = (builder.config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1"))
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir).config("spark.sql.warehouse.dir",
                                                                      str(Path(local_dir) / "warehouse"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(list(rows), columns=list(LONG_COLUMNS))
    return frame.astype({"value": "float64", "window_start_s": "float64", "bucket": "Int32",
                         "deterministic": "boolean"})


def estimated_cost_s(exp: Experiment) -> float:
    """A rough guess of an experiment's wall time, only to start the longest ones first."""
    w = exp.workload
    if w.clock == "real":
        return w.warmup_s + w.duration_s + (w.drain_s if w.delay is not None else 0.0) + 1.0
    span = w.warmup_s + w.duration_s
    messages = w.topics * w.producers_per_topic * w.producer_rate * span + w.topics * w.backlog_messages
    drain = w.drain_s or ((w.delay.max_delay_s or 60.0) if w.delay is not None else 0.0)
    steps = (span + drain) / (w.step_ms / 1000)
    consumers = w.topics * w.subscriptions_per_topic * w.consumers_per_subscription
    # Measured on speedup24: ~0.6 ms per message sent and consumed, ~4 ms per consumer step.
    return messages * 6e-4 + steps * consumers * 4e-3


def plan_tasks(experiments: Sequence[Experiment], perf_isolation: str) -> list[list[list[int]]]:
    """Stages of tasks of experiment indices: ``plan[stage][task]`` runs those experiments in order.

    "lane": one stage; task 0 is the real-clock lane (its experiments in the seeded order, one after
    another), then one task per virtual-clock experiment, the longest first (the order of
    deterministic experiments does not matter, the makespan does). "exclusive": the virtual-clock
    tasks first, then the lane alone in a second stage. "none": one task per experiment.
    """
    indices = range(len(experiments))
    by_cost = sorted(indices, key=lambda i: (-estimated_cost_s(experiments[i]), i))
    if perf_isolation == "none":
        return [[[i] for i in by_cost]] if experiments else []
    lane = [i for i in indices if experiments[i].workload.clock == "real"]
    parallel = [[i] for i in by_cost if experiments[i].workload.clock != "real"]
    if perf_isolation == "exclusive":
        return [stage for stage in (parallel, [lane] if lane else []) if stage]
    tasks = ([lane] if lane else []) + parallel
    return [tasks] if tasks else []


def experiment_task(experiments: Sequence[Experiment], tasks: Sequence[Sequence[int]],
                    options: ExecOptions) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The mapInPandas body: the id in the partition names the task; it runs that task's experiments."""

    def task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        sender = ProgressSender(options.progress)
        try:
            for batch in batches:
                for task_index in batch["id"].tolist():
                    members = tasks[int(task_index)]
                    for position, index in enumerate(members):
                        exp = experiments[index]
                        result = execute(exp, options, sender)
                        lane = "real-clock lane" if len(members) > 1 or (
                            exp.workload.clock == "real" and options.perf_isolation != "none") else "parallel"
                        result.info.update(partition_id=ctx.partitionId() if ctx else None,
                                           task_attempt_id=ctx.taskAttemptId() if ctx else None,
                                           task_attempt=ctx.attemptNumber() if ctx else None,
                                           python_worker_pid=os.getpid(), lane=lane, task_index=int(task_index),
                                           position_in_task=position)
                        yield rows_frame(result.rows())
        finally:
            sender.close()

    return task


def collect_matrix(spark: Any, experiments: Sequence[Experiment], options: ExecOptions) -> pd.DataFrame:
    """Run every experiment (the lanes of :func:`plan_tasks`) and return their long rows.

    Each stage is a single action whose rows are collected once, so no experiment is ever
    recomputed by a second action.
    """
    experiments = list(experiments)
    frames = []
    for tasks in plan_tasks(experiments, options.perf_isolation):
        n = len(tasks)
        frame = spark.range(0, n, 1, n).mapInPandas(experiment_task(experiments, tasks, options), LONG_SCHEMA)
        spark.sparkContext.setJobDescription(f"plugmq compare: {sum(map(len, tasks))} experiments in {n} tasks")
        try:
            frames.append(frame.toPandas())
        finally:
            spark.sparkContext.setJobDescription(None)
    return pd.concat(frames, ignore_index=True) if frames else rows_frame([])


# ------------------------------------------------------------------------------------------ tables
_INFO_COLUMNS = ("order", "matrix", "kind", "workload", "plugin_set", "repetition", "seed", "clock", "store", "flush",
                 "flush_source", "delay_plugin", "allocation_strategy", "filter_type", "filter_expression",
                 "filter_selectivity_target", "delay_mix", "served", "role", "replication_plugin", "batch_size", "message_size", "partition_id",
                 "task_attempt_id", "task_attempt", "python_worker_pid", "lane", "task_index", "position_in_task",
                 "wall_s", "started_at", "start_delay_s", "lock_wait_s", "perf_isolation", "real_clock_lock", "isolated",
                 "progress", "plugins", "options", "durability", "workload_json")


def split_tables(long: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """experiments / metrics / timeseries / histograms from the long rows."""
    exp_rows = []
    for row in long[long["kind"] == "experiment"].itertuples():
        info = json.loads(row.text)
        flat: dict[str, Any] = {"experiment_id": row.experiment_id, "status": info.get("status"),
                                "error": info.get("error", "")}
        for key in _INFO_COLUMNS:
            value = info.get(key)
            flat[key] = json.dumps(value) if isinstance(value, (list, dict)) else value
        for key, value in (info.get("env") or {}).items():
            flat[f"env_{key}"] = value
        exp_rows.append(flat)
    experiments = pd.DataFrame(exp_rows).sort_values("order", kind="stable").reset_index(drop=True)
    metrics = long[long["kind"] == "metric"][["experiment_id", "name", "value", "unit", "deterministic"]]
    metrics = metrics.rename(columns={"name": "metric"}).reset_index(drop=True)
    series = long[long["kind"] == "series"][["experiment_id", "window_start_s", "name", "value"]]
    series = series.rename(columns={"name": "metric"}).reset_index(drop=True)
    hist = long[long["kind"] == "histogram"][["experiment_id", "name", "bucket", "value"]]
    hist = hist.rename(columns={"name": "histogram", "value": "count"}).astype({"count": "int64", "bucket": "int32"})
    return {"experiments": experiments, "metrics": metrics, "timeseries": series,
            "histograms": hist.reset_index(drop=True)}


def aggregate(spark: Any, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Medians over repetitions and merged histograms, in Spark SQL; percentiles of latency
    histograms come from the merged bucket counts, never from averaging percentiles."""
    experiments = tables["experiments"][["experiment_id", "matrix", "kind", "workload", "plugin_set", "status"]]
    spark.createDataFrame(experiments).createOrReplaceTempView("experiments")
    status = spark.sql("""
        SELECT matrix, workload, plugin_set, count(*) AS runs,
               sum(CASE WHEN status = 'ok' THEN 1 ELSE 0 END) AS ok,
               sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed,
               sum(CASE WHEN status = 'unsupported' THEN 1 ELSE 0 END) AS unsupported
        FROM experiments GROUP BY matrix, workload, plugin_set""").toPandas()
    medians = pd.DataFrame(columns=["matrix", "workload", "plugin_set", "metric", "value", "low", "high", "runs",
                                    "how"])
    merged = pd.DataFrame(columns=["matrix", "workload", "plugin_set", "histogram", "bucket", "count"])
    if len(tables["metrics"]):
        spark.createDataFrame(tables["metrics"][["experiment_id", "metric", "value"]]).createOrReplaceTempView("metrics")
        medians = spark.sql("""
            SELECT e.matrix, e.workload, e.plugin_set, m.metric, median(m.value) AS value,
                   min(m.value) AS low, max(m.value) AS high, count(*) AS runs, 'median' AS how
            FROM metrics m JOIN experiments e ON m.experiment_id = e.experiment_id
            WHERE e.status = 'ok'
            GROUP BY e.matrix, e.workload, e.plugin_set, m.metric""").toPandas()
    if len(tables["histograms"]):
        spark.createDataFrame(tables["histograms"]).createOrReplaceTempView("histograms")
        merged = spark.sql("""
            SELECT e.matrix, e.workload, e.plugin_set, h.histogram, h.bucket, sum(h.count) AS count
            FROM histograms h JOIN experiments e ON h.experiment_id = e.experiment_id
            WHERE e.status = 'ok'
            GROUP BY e.matrix, e.workload, e.plugin_set, h.histogram, h.bucket""").toPandas()
        medians = _merged_percentiles(medians, merged)
    return {"status": status, "summary": medians.sort_values(["matrix", "workload", "plugin_set", "metric"])
            .reset_index(drop=True), "merged_histograms": merged}


def _merged_percentiles(medians: pd.DataFrame, merged: pd.DataFrame) -> pd.DataFrame:
    replaced = []
    keys = ["matrix", "workload", "plugin_set"]
    maxima = medians[medians["metric"].str.endswith("_max_ms")].set_index([*keys, "metric"])["high"]
    for (matrix, workload, plugin_set, name), group in merged.groupby([*keys, "histogram"]):
        counts = dict(zip(group["bucket"].astype(int), group["count"].astype(int), strict=True))
        top = maxima.get((matrix, workload, plugin_set, f"{name}_max_ms"))
        for label, q in QUANTILES:
            value = quantile_from_counts(counts, q, max_value=top)
            replaced.append({"matrix": matrix, "workload": workload, "plugin_set": plugin_set,
                             "metric": f"{name}_{label}_ms", "value": value, "how": "merged histogram"})
        if top is not None:
            replaced.append({"matrix": matrix, "workload": workload, "plugin_set": plugin_set,
                             "metric": f"{name}_max_ms", "value": float(top), "how": "max over runs"})
    if not replaced:
        return medians
    new = pd.DataFrame(replaced)
    index = [*keys, "metric"]
    kept = medians.set_index(index)
    new = new.set_index(index)
    for column in ("low", "high", "runs"):
        new[column] = kept[column].reindex(new.index)
    return pd.concat([kept.drop(new.index, errors="ignore"), new]).reset_index()


def write_tables(out: Path, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """One Parquet file per table (small: gathered on the driver)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        path = out / f"{name}.parquet"
        frame.to_parquet(path, index=False)
        written.append(path)
    return written
