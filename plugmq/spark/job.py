"""The Spark side: the session, one task per experiment, gathering, aggregation, Parquet.

One task per experiment: ``spark.range(0, n, 1, n)`` makes n partitions holding one id each, and
``mapInPandas`` runs experiment ``experiments[id]`` in that partition's task (no shuffle, no hash
repartitioning that could put two experiments in one task). The matrix runs as a single action
whose rows are collected once, so no experiment is ever recomputed by a second action.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from plugmq.spark.execute import ExecOptions, execute
from plugmq.spark.experiments import Experiment
from plugmq.spark.histogram import quantile_from_counts
from plugmq.spark.results import LONG_COLUMNS, LONG_SCHEMA, QUANTILES

__all__ = ["aggregate", "collect_matrix", "experiment_task", "make_session", "split_tables", "write_tables"]

Progress = Callable[[int, int, int], None]  # (completed tasks, running tasks, total)


def make_session(master: str = "local[*]", *, app_name: str = "plugmq-compare", local_dir: str | None = None,
                 conf: dict[str, str] | None = None) -> Any:
    """A SparkSession whose Python workers run this interpreter (the driver's venv).

    On a cluster the workers cannot use the driver's path: a PYSPARK_PYTHON already set (e.g. to
    the unpacked venv-pack archive, ``./environment/bin/python``) is kept there.
    """
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               # An experiment is a long task with side effects on the host: never run a copy
               # speculatively next to it.
               .config("spark.speculation", "false"))
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


def experiment_task(experiments: Sequence[Experiment], options: ExecOptions) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The mapInPandas body: each id in the partition names one experiment to run."""

    def task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for batch in batches:
            for index in batch["id"].tolist():
                result = execute(experiments[int(index)], options)
                result.info.update(partition_id=ctx.partitionId() if ctx else None,
                                   task_attempt_id=ctx.taskAttemptId() if ctx else None,
                                   task_attempt=ctx.attemptNumber() if ctx else None,
                                   python_worker_pid=os.getpid())
                yield rows_frame(result.rows())

    return task


def collect_matrix(spark: Any, experiments: Sequence[Experiment], options: ExecOptions,
                   progress: Progress | None = None) -> pd.DataFrame:
    """Run every experiment (one Spark task each) and return their long rows."""
    n = len(experiments)
    if n == 0:
        return rows_frame([])
    frame = spark.range(0, n, 1, n).mapInPandas(experiment_task(list(experiments), options), LONG_SCHEMA)
    sc = spark.sparkContext
    group = f"plugmq-compare-{os.getpid()}-{id(frame)}"
    sc.setJobGroup(group, f"plugmq compare: {n} experiments")
    stop = threading.Event()
    watcher = None
    if progress is not None:
        watcher = threading.Thread(target=_watch, args=(sc, group, n, progress, stop), daemon=True)
        watcher.start()
    try:
        collected = frame.toPandas()
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
        sc.setLocalProperty("spark.jobGroup.id", None)
    if progress is not None:
        progress(n, 0, n)
    return collected


def _watch(sc: Any, group: str, total: int, progress: Progress, stop: threading.Event) -> None:
    tracker = sc.statusTracker()
    while not stop.wait(0.5):
        done = running = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job else ()):
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    running += stage.numActiveTasks
        progress(min(done, total), running, total)


# ------------------------------------------------------------------------------------------ tables
_INFO_COLUMNS = ("order", "matrix", "kind", "workload", "plugin_set", "repetition", "seed", "clock", "store", "flush",
                 "flush_source", "delay_plugin", "allocation_strategy", "filter_type", "filter_expression",
                 "filter_selectivity_target", "delay_mix", "batch_size", "message_size", "partition_id",
                 "task_attempt_id", "task_attempt", "python_worker_pid", "wall_s", "started_at", "lock_wait_s",
                 "perf_isolation", "exclusive", "isolated", "plugins", "options", "durability", "workload_json")


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
