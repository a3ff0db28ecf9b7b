"""plugmq compare on a real local SparkSession: tasks, failures, equality with local runs, outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from plugmq.spark.compare import CompareOutcome, run_compare
from plugmq.spark.execute import ExecOptions
from plugmq.spark.experiments import expand_matrix, parse_experiments
from plugmq.spark.replay import run_experiment
from plugmq.spark.sweep import sweep_partition
from tests.spark_fixtures import spark  # noqa: F401 - the session fixture

pytestmark = pytest.mark.spark

FLUSH = {"store_mmap": {"flush": "async"}}
SPEC: dict[str, Any] = {
    "run": {"seed": 3, "window_s": 5},
    "workloads": {
        "levels": {"producer_rate": 5, "duration_s": 12, "consumers_per_subscription": 2,
                   "delay": {"fraction": 0.5, "levels": [1, 2]}},
        "arbitrary": {"producer_rate": 5, "duration_s": 12,
                      "delay": {"fraction": 0.5, "distribution": "uniform", "min_delay_s": 1, "max_delay_s": 20}},
        "churn": {"queues_per_topic": 8, "producer_rate": 2, "duration_s": 60, "consumers_per_subscription": 2,
                  "churn": {"joins_per_minute": 2, "leaves_per_minute": 1}},
        "burst": {"producer_rate": 300, "duration_s": 0.3, "message_size": 200},
    },
    "plugin_sets": {
        "lv": {"plugins": ["store_mmap", "delay_level", "alloc"], "options": FLUSH},
        "wh": {"plugins": ["store_mmap", "delay_wheel", "alloc"], "options": FLUSH},
        "tight": {"plugins": ["store_mmap", "alloc"], "options": FLUSH, "broker": {"max_message_size": 64}},
    },
    "matrix": [
        {"name": "delay", "kind": "delay", "workloads": ["levels", "arbitrary"], "plugin_sets": ["lv", "wh"]},
        {"name": "misc", "kind": "general", "workloads": ["churn", "burst"], "plugin_sets": ["wh", "tight"]},
    ],
}


@pytest.fixture(scope="module")
def outcome(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> CompareOutcome:  # noqa: F811
    base = tmp_path_factory.mktemp("compare")
    options = ExecOptions(work_dir=str(base), window_s=5, isolate=True, timeout_s=300,
                          lock_path=str(base / "host.lock"))
    return run_compare(spark, parse_experiments(SPEC, source="test"), base / "out", options=options, sweep_max=9,
                       master="local[2]")


def test_every_experiment_is_one_task(outcome: CompareOutcome) -> None:
    exp = outcome.tables["experiments"]
    assert len(exp) == len(outcome.experiments) == 8
    assert exp["partition_id"].nunique() == 8 and exp["task_attempt_id"].nunique() == 8
    # Partition i runs the i-th experiment of the seeded order.
    assert (exp["partition_id"] == exp["order"]).all()
    ids = [e.experiment_id for e in expand_matrix(parse_experiments(SPEC))]
    assert exp.sort_values("order")["experiment_id"].tolist() == ids


def test_failures_are_rows_not_crashes(outcome: CompareOutcome) -> None:
    exp = outcome.tables["experiments"].set_index("experiment_id")
    assert exp.loc["delay/arbitrary/lv/r0", "status"] == "unsupported"
    assert "cannot be expressed by levels" in exp.loc["delay/arbitrary/lv/r0", "error"]
    for workload in ("churn", "burst"):
        row = exp.loc[f"misc/{workload}/tight/r0"]
        assert row["status"] == "failed" and "MessageTooLargeError" in row["error"]
    assert (exp["status"] == "ok").sum() == 5
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
    assert len(tables["experiments"]) == 8
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
    for chart in ("delay_lateness_cdf.png", "misc_throughput.png", "sweep_by_consumers.png"):
        assert (out / chart).stat().st_size > 5_000
    assert any("p99 lateness" in f for f in outcome.findings)


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
