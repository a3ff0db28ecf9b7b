"""plugmq compare on a real local SparkSession: tasks, failures, equality with local runs, outputs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from plugmq.spark.compare import CompareOutcome, run_compare
from plugmq.spark.execute import ExecOptions
from plugmq.spark.experiments import expand_matrix, parse_experiments
from plugmq.spark.progress import ProgressEvent
from plugmq.spark.replay import run_experiment
from plugmq.spark.sweep import sweep_partition

pytestmark = pytest.mark.spark

SPEC_TOML = """
[run]
seed = 3
window_s = 5

[workloads.levels]
producer_rate = 5
duration_s = 12
consumers_per_subscription = 2
delay = { fraction = 0.5, levels = [1, 2] }

[workloads.arbitrary]
producer_rate = 5
duration_s = 12
delay = { fraction = 0.5, distribution = "uniform", min_delay_s = 1, max_delay_s = 20 }

[workloads.churn]
queues_per_topic = 8
producer_rate = 2
duration_s = 60
consumers_per_subscription = 2
churn = { joins_per_minute = 2, leaves_per_minute = 1 }

[workloads.burst]          # real clock: the serial lane
producer_rate = 300
duration_s = 0.3
message_size = 200

[workloads.served]         # real clock: plugmq serve and its sync slave in child processes of the task
producer_rate = 40
duration_s = 0.5
consumers_per_subscription = 1
drain_s = 20
serve = { receive_batch = 8 }

[plugin_sets.lv]
plugins = ["store_mmap", "delay_level", "alloc"]
options.store_mmap = { flush = "async" }

[plugin_sets.wh]
plugins = ["store_mmap", "delay_wheel", "alloc"]
options.store_mmap = { flush = "async" }

[plugin_sets.tight]
plugins = ["store_mmap", "alloc"]
options.store_mmap = { flush = "async" }
broker = { max_message_size = 64 }

[plugin_sets.replicated]
plugins = ["store_mmap", "ha", "filter_tag", "alloc"]
options.store_mmap = { flush = "async" }
broker = { role = "sync_master" }

[[matrix]]
name = "served"
kind = "served"
workloads = ["served"]
plugin_sets = ["replicated"]

[[matrix]]
name = "delay"
kind = "delay"
workloads = ["levels", "arbitrary"]
plugin_sets = ["lv", "wh"]

[[matrix]]
name = "misc"
kind = "general"
workloads = ["churn", "burst"]
plugin_sets = ["wh", "tight"]
"""
SPEC: dict[str, Any] = tomllib.loads(SPEC_TOML)
EVENTS: list[ProgressEvent] = []


@pytest.fixture(scope="module")
def outcome(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> CompareOutcome:
    base = tmp_path_factory.mktemp("compare")
    options = ExecOptions(work_dir=str(base), window_s=5, isolate=True, timeout_s=300,
                          lock_path=str(base / "real-clock.lock"))
    return run_compare(spark, parse_experiments(SPEC, source="test"), base / "out", options=options, sweep_max=9,
                       master="local[2]", on_event=EVENTS.append)


def test_virtual_experiments_are_tasks_and_real_clock_ones_share_the_serial_lane(outcome: CompareOutcome) -> None:
    exp = outcome.tables["experiments"]
    assert len(exp) == len(outcome.experiments) == 9
    ids = [e.experiment_id for e in expand_matrix(parse_experiments(SPEC))]
    assert exp.sort_values("order")["experiment_id"].tolist() == ids
    virtual, real = exp[exp["clock"] == "virtual"], exp[exp["clock"] == "real"]
    assert len(virtual) == 6 and len(real) == 3
    assert virtual["task_attempt_id"].nunique() == 6 and set(virtual["lane"]) == {"parallel"}
    assert (real["partition_id"] == 0).all() and real["task_attempt_id"].nunique() == 1
    assert set(real["lane"]) == {"real-clock lane"} and bool(real["real_clock_lock"].all())
    assert not virtual["real_clock_lock"].any() and (virtual["lock_wait_s"] == 0).all()
    # The lane runs its experiments one after another, in the seeded order.
    lane = real.sort_values("position_in_task")
    assert lane["order"].is_monotonic_increasing
    first, second = lane.iloc[0], lane.iloc[1]
    assert second["started_at"] >= first["started_at"] + first["wall_s"]


def test_progress_reaches_the_driver_as_it_happens(outcome: CompareOutcome) -> None:
    finished = [e for e in EVENTS if e.kind == "finished"]
    assert sorted(e.experiment_id for e in finished) == sorted(e.experiment_id for e in outcome.experiments)
    for event in EVENTS:
        assert event.pid > 0 and event.host
    started = {e.experiment_id: i for i, e in enumerate(EVENTS) if e.kind == "started"}
    assert all(started[e.experiment_id] < EVENTS.index(e) for e in finished)
    statuses = outcome.tables["experiments"].set_index("experiment_id")["status"]
    assert {e.experiment_id: e.status for e in finished} == statuses.to_dict()
    assert set(outcome.tables["experiments"]["progress"]) == {"sent"}


def test_failures_are_rows_not_crashes(outcome: CompareOutcome) -> None:
    exp = outcome.tables["experiments"].set_index("experiment_id")
    assert exp.loc["delay/arbitrary/lv/r0", "status"] == "unsupported"
    assert "cannot be expressed by levels" in exp.loc["delay/arbitrary/lv/r0", "error"]
    for workload in ("churn", "burst"):
        row = exp.loc[f"misc/{workload}/tight/r0"]
        assert row["status"] == "failed" and "MessageTooLargeError" in row["error"], row.to_dict()
    assert (exp["status"] == "ok").sum() == 6
    failed_ids = set(exp.index[exp["status"] != "ok"])
    assert not failed_ids & set(outcome.tables["metrics"]["experiment_id"]), "no figures from runs that failed"


def test_metrics_equal_the_same_experiment_run_without_spark(outcome: CompareOutcome, tmp_path: Path) -> None:
    metrics = outcome.tables["metrics"]
    compared = 0
    for exp in outcome.experiments:
        if exp.workload.clock != "virtual" or exp.plugin_set.name == "tight":
            continue
        local = run_experiment(exp, work_dir=tmp_path)
        if local.status != "ok":
            continue
        expected = {n: v for n, v, _, det in local.metrics if det}
        rows = metrics[(metrics["experiment_id"] == exp.experiment_id) & metrics["deterministic"].astype(bool)]
        assert dict(zip(rows["metric"], rows["value"], strict=True)) == expected, exp.experiment_id
        compared += 1
    assert compared == 4


def test_parquet_tables_and_report_hold_the_runs_numbers(outcome: CompareOutcome) -> None:
    out = outcome.report.parent
    tables = {p.stem: pd.read_parquet(p) for p in out.glob("*.parquet")}
    assert {"experiments", "metrics", "timeseries", "histograms", "summary", "sweep_summary"} <= set(tables)
    assert len(tables["experiments"]) == 9
    assert json.loads(tables["experiments"].set_index("experiment_id").loc["delay/levels/wh/r0", "durability"])[
        "store_mmap.flush"] == "async"
    delivered = tables["metrics"].query("experiment_id == 'delay/levels/wh/r0' and metric == 'delay_delivered'")
    assert len(delivered) == 1 and delivered["value"].iloc[0] > 0
    summary = tables["summary"].set_index(["matrix", "workload", "plugin_set", "metric"])
    assert summary.loc[("delay", "levels", "wh", "delay_delivered"), "value"] == delivered["value"].iloc[0]
    rate = tables["timeseries"].query("experiment_id == 'delay/levels/wh/r0' and metric == 'publish_rate_msg_s'")
    assert len(rate) >= 2 and rate["value"].max() == pytest.approx(5.0)
    lateness = tables["histograms"].query("experiment_id == 'delay/levels/wh/r0' and histogram == 'delay_lateness'")
    assert lateness["count"].sum() == delivered["value"].iloc[0]
    page = outcome.report.read_text()
    for section in ("delay", "misc", "Allocation sweep", "unsupported"):
        assert section in page
    assert f"{int(delivered['value'].iloc[0])}</td>" in page, "the table shows the run's own number"
    for chart in ("delay_lateness_cdf.png", "misc_general.png", "sweep_by_consumers.png"):
        assert (out / chart).stat().st_size > 5_000
    assert any("p99 lateness" in f for f in outcome.findings)


def test_report_opens_with_the_findings_and_ends_with_environment_and_flags(outcome: CompareOutcome) -> None:
    page = outcome.report.read_text()
    order = [page.index(marker) for marker in ("<section id=findings>", "<table class=headline>",
                                                "<section id=charts>", "<img ", "<section id=environment>",
                                                "store_mmap.flush = async")]
    assert order == sorted(order), "findings, then charts, then environment and flags"
    assert page.index("<h2>") == page.index("<h2>Findings</h2>"), "the first section is the findings"
    assert "<h2>" not in page[:page.index("<section id=findings>")]
    # The headline row for the level mix: the level strategy delivers on time, the wheel late.
    headline = pd.read_parquet(outcome.report.parent / "headline.parquet")
    row = headline[(headline["comparison"] == "delay") & (headline["scenario"] == "levels")
                   & (headline["measure"] == "p99 lateness of delayed messages")].iloc[0]
    summary = outcome.aggregated["summary"].set_index(["matrix", "workload", "plugin_set", "metric"])["value"]
    assert row["winner"] == "lv" and row["value"] == summary[("delay", "levels", "lv", "delay_lateness_p99_ms")]
    assert row["runner_up_value"] == summary[("delay", "levels", "wh", "delay_lateness_p99_ms")]
    assert row["spread"] == "1 run: spread not measured"
    # Every table scrolls inside its own box instead of widening the page.
    assert page.count("<table") == page.count("<div class=scroll><table")


def test_a_served_replicated_experiment_runs_its_children_from_the_real_clock_lane(outcome: CompareOutcome) -> None:
    """plugmq serve, its slave and the client's consumer process start from an experiment forked
    inside a Spark task; their figures reach the tables, the headline and the report."""
    row = outcome.tables["experiments"].set_index("experiment_id").loc["served/served/replicated/r0"]
    assert row["status"] == "ok", row["error"]
    assert row["lane"] == "real-clock lane" and row["served"] and row["role"] == "sync_master"
    metrics = outcome.tables["metrics"].query("experiment_id == 'served/served/replicated/r0'")
    m = dict(zip(metrics["metric"], metrics["value"], strict=True))
    assert m["messages_published"] > 0 and m["consume_missing"] == 0 and m["replication_unreplicated_bytes"] == 0
    summary = outcome.aggregated["summary"].set_index(["matrix", "workload", "plugin_set", "metric"])["value"]
    assert summary[("served", "served", "replicated", "publish_rate_msg_s")] == m["publish_rate_msg_s"]
    assert summary[("served", "served", "replicated", "end_to_end_latency_p50_ms")] > 0, "from the merged histogram"
    assert (outcome.report.parent / "served_served.png").stat().st_size > 5_000
    assert "server_cpu_ms_per_msg" in outcome.report.read_text(), "the served kind's table"


def test_sweep_in_spark_sql_matches_the_pairs_computed_locally(outcome: CompareOutcome) -> None:
    assert outcome.sweep is not None
    summary = outcome.sweep["summary"].set_index("strategy")
    assert (summary["pairs"] == 81).all() and (summary["pairs_verified_against_plugin"] > 0).all()
    from plugmq.spark.compare import sweep_spec

    spec = sweep_spec(parse_experiments(SPEC), 9)
    assert spec is not None
    local = pd.concat(sweep_partition(spec, iter([pd.DataFrame({"id": list(range(1, 10))})])))
    assert local["mismatch"].isna().all()
    for strategy, part in local.groupby("strategy"):
        assert summary.loc[strategy, "mean_moved_fraction"] == pytest.approx(part["moved_fraction"].mean())
        assert summary.loc[strategy, "max_overload"] == pytest.approx(part["overload"].max())
        ordered = sorted(part["moved_over_ideal"].dropna())  # nearest rank, as every reported percentile
        assert summary.loc[strategy, "p99_moved_over_ideal"] == pytest.approx(ordered[math.ceil(0.99 * len(ordered)) - 1])


# ------------------------------------------------------------------------------------------ cluster mode
# The cluster run proves what only a standalone cluster's executors can show, not the whole matrix
# again (local mode ran it above): the real-clock lane with the served, replicated set (store_mmap,
# ha, filter_tag, alloc, plugmq serve children forked inside an executor's task) and both delay
# plugins on one virtual-clock workload, a pair the headline ranks. Their rows must equal the same
# experiments' local rows. The allocation sweep runs there too, on 3 x 3 pairs (9 x 9 locally).
CLUSTER_EXPERIMENTS = ("served/served/replicated/r0", "delay/levels/lv/r0", "delay/levels/wh/r0")
_MATRICES = SPEC_TOML.split("[[matrix]]\n")
# The file's workloads and plugin sets, its served matrix, its delay matrix on the levels workload only.
CLUSTER_SPEC_TOML = "[[matrix]]\n".join([
    _MATRICES[0], _MATRICES[1], _MATRICES[2].replace('workloads = ["levels", "arbitrary"]', 'workloads = ["levels"]')])


def test_the_cluster_matrix_is_a_part_of_the_local_one() -> None:
    cluster = [e.experiment_id for e in expand_matrix(parse_experiments(tomllib.loads(CLUSTER_SPEC_TOML)))]
    local = {e.experiment_id: e for e in expand_matrix(parse_experiments(SPEC))}
    assert sorted(cluster) == sorted(CLUSTER_EXPERIMENTS) and set(cluster) <= set(local)
    for exp in expand_matrix(parse_experiments(tomllib.loads(CLUSTER_SPEC_TOML))):
        assert exp.seed == local[exp.experiment_id].seed and exp.workload == local[exp.experiment_id].workload
        assert exp.plugin_set == local[exp.experiment_id].plugin_set


def test_cluster_mode_runs_the_matrix_with_progress_and_the_same_tables_as_local_mode(
        outcome: CompareOutcome, standalone_cluster: Any, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(CLUSTER_SPEC_TOML)
    out = tmp_path / "cluster"
    n = len(CLUSTER_EXPERIMENTS)
    # Standard output is a pipe here, as under CI or nohup: progress must still come line by line.
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "plugmq"), "compare", str(spec), "--out", str(out), "--master",
         standalone_cluster.master_url, "--sweep-max", "3", "--work-dir", str(tmp_path / "work"),
         "--real-clock-lock", str(tmp_path / "real-clock.lock"),
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
         "--conf", f"spark.local.dir={tmp_path / 'driver'}", "--conf", "spark.sql.shuffle.partitions=2"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    done = [line for line in lines if re.match(rf"\[\s*\d/{n}\] (ok|failed|unsupported) ", line)]
    assert len(done) == n and all(" · elapsed " in line and " · ETA " in line for line in done), proc.stdout
    assert any("(real-clock lane)" in line for line in done)
    local_dir = outcome.report.parent
    cluster_files = sorted(p.name for p in out.glob("*.parquet"))
    assert cluster_files == sorted(p.name for p in local_dir.glob("*.parquet"))
    for name in cluster_files:
        assert pq.read_schema(out / name) == pq.read_schema(local_dir / name), name
    # Same experiments, same outcomes, and the deterministic (virtual-clock) figures are equal.
    local_exp = outcome.tables["experiments"].set_index("experiment_id")
    cluster_exp = pd.read_parquet(out / "experiments.parquet").set_index("experiment_id")
    assert sorted(cluster_exp.index) == sorted(CLUSTER_EXPERIMENTS)
    assert cluster_exp["status"].to_dict() == local_exp.loc[list(cluster_exp.index), "status"].to_dict()
    assert set(cluster_exp["status"]) == {"ok"} and set(cluster_exp["progress"]) == {"sent"}
    assert set(cluster_exp["lane"]) == {"real-clock lane", "parallel"}

    def deterministic(metrics: pd.DataFrame) -> dict[tuple[str, str], float]:
        rows = metrics[metrics["deterministic"].astype(bool) & metrics["experiment_id"].isin(CLUSTER_EXPERIMENTS)]
        return dict(zip(zip(rows["experiment_id"], rows["metric"], strict=True), rows["value"], strict=True))

    cluster_figures = deterministic(pd.read_parquet(out / "metrics.parquet"))
    assert {"delay/levels/lv/r0", "delay/levels/wh/r0"} <= {exp for exp, _ in cluster_figures}
    assert cluster_figures == deterministic(outcome.tables["metrics"])
    assert (pd.read_parquet(out / "sweep_summary.parquet")["pairs"] == 9).all(), "3 queues x 3 consumers"
    assert standalone_cluster.master_url in (out / "report.html").read_text()
