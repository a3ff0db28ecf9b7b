"""plugmq compare without Spark: the experiments file, the matrix, histograms, replays, the sweep model."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugmq.core.errors import ConfigError
from plugmq.core.pluginmanager import installed_allocate_strategies
from plugmq.spark.experiments import (
    Experiment,
    SweepSpec,
    expand_matrix,
    load_experiments,
    parse_experiments,
)
from plugmq.spark.replay import run_experiment
from plugmq.spark.sweep import (
    SweepModel,
    _pair_rows,
    _plugin_owners,
    joiner_id,
    member_id,
)
from tests.helpers import specs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "compare"

BASE: dict[str, Any] = {
    "run": {"seed": 7},
    "workloads": {
        "levels": {"producer_rate": 10, "duration_s": 20, "consumers_per_subscription": 2,
                   "delay": {"fraction": 0.5, "levels": [1, 2, 3]}},
        "arbitrary": {"producer_rate": 10, "duration_s": 20,
                      "delay": {"fraction": 0.5, "distribution": "uniform", "min_delay_s": 1, "max_delay_s": 40}},
    },
    "plugin_sets": {
        "lv": {"plugins": ["store_mmap", "delay_level", "alloc"], "options": {"store_mmap": {"flush": "async"}}},
        "wh": {"plugins": ["store_mmap", "delay_wheel", "alloc"], "options": {"store_mmap": {"flush": "async"}}},
        "sc": {"plugins": ["store_lmdb", "delay_schedule", "alloc"], "options": {"store_lmdb": {"flush": "sync"}}},
    },
    "matrix": [{"name": "delay", "kind": "delay", "workloads": ["levels", "arbitrary"],
                "plugin_sets": ["lv", "wh", "sc"], "repetitions": 2}],
}


def spec_with(**changes: Any) -> dict[str, Any]:
    return specs.spec_with(BASE, **changes)


# ------------------------------------------------------------------------------------------ file and matrix
def test_matrix_expands_every_cell_in_a_seeded_order() -> None:
    spec = parse_experiments(BASE)
    runs = expand_matrix(spec)
    assert len(runs) == 2 * 3 * 2
    cells = Counter((e.workload.name, e.plugin_set.name) for e in runs)
    assert set(cells.values()) == {2} and len(cells) == 6
    assert [e.order for e in runs] == list(range(12))
    assert len({e.experiment_id for e in runs}) == 12
    again = [e.experiment_id for e in expand_matrix(parse_experiments(BASE))]
    assert again == [e.experiment_id for e in runs], "same seed, same order"
    other = [e.experiment_id for e in expand_matrix(spec, seed=8)]
    assert sorted(other) == sorted(again) and other != again, "another seed shuffles differently"
    natural = sorted(again, key=lambda i: (i.split("/")[1], i.split("/")[2], i))
    assert again != natural, "the order is randomised, not the declaration order"


def test_repetitions_share_the_seed_unless_reseeded() -> None:
    runs = expand_matrix(parse_experiments(BASE))
    assert {e.seed for e in runs if e.workload.name == "levels"} == {0}
    reseeded = expand_matrix(parse_experiments(spec_with(matrix__0__reseed=True)))
    assert {e.seed for e in reseeded if e.workload.name == "levels"} == {0, 1}


def test_defaults_and_derived_values() -> None:
    spec = parse_experiments(BASE)
    levels = spec.workloads["levels"]
    assert levels.clock == "virtual" and levels.delay is not None and levels.delay.levels == (1, 2, 3)
    sc = spec.plugin_sets["sc"]
    assert (sc.store, sc.flush, sc.delay, sc.allocation_strategy) == ("store_lmdb", "sync", "delay_schedule", "AVG")
    real = parse_experiments(spec_with(workloads__plain={"duration_s": 1},
                                       matrix__0__workloads=["plain"])).workloads["plain"]
    assert real.clock == "real" and real.producer_rate == 0


def test_workload_flush_overrides_the_store_for_that_workload() -> None:
    spec = parse_experiments(spec_with(workloads__levels__flush="sync"))
    exp = next(e for e in expand_matrix(spec) if e.workload.name == "levels" and e.plugin_set.name == "lv")
    assert exp.effective_flush == "sync" and exp.store_options()["store_mmap"]["flush"] == "sync"
    assert exp.plugin_set.options["store_mmap"]["flush"] == "async", "the plugin set itself is unchanged"


@pytest.mark.parametrize(("changes", "message"), [
    ({"plugin_sets__lv__options": {}}, "plugin_sets.lv.options.store_mmap.flush: the durability mode must be stated"),
    ({"plugin_sets__lv__options": {"store_mmap": {"flush": "sometimes"}}}, "plugin_sets.lv.options.store_mmap.flush must be"),
    ({"plugin_sets__lv__options": {"store_mmap": {"flush": "sync", "flsh_interval_ms": 5}}},
     "plugin_sets.lv.options.store_mmap: unknown option 'flsh_interval_ms'"),
    ({"plugin_sets__lv__plugins": ["store_mmap", "store_lmdb"]}, "plugin_sets.lv.plugins"),
    ({"plugin_sets__lv__plugins": ["store_mmapp"]}, "unknown plugin 'store_mmapp'"),
    ({"plugin_sets__lv__allocation_strategy": "AVERAGE"}, "plugin_sets.lv.allocation_strategy: 'AVERAGE'"),
    ({"workloads__levels__delay__fraction": 1.5}, "workloads.levels.delay.fraction must be <= 1"),
    ({"workloads__levels__delay__distribution": "uniform"}, "workloads.levels.delay: give exactly one of"),
    ({"workloads__levels__queus_per_topic": 3}, "workloads.levels.queus_per_topic: unknown key. Did you mean 'queues_per_topic'?"),
    ({"workloads__levels__producer_rate": 0}, "workloads.levels.producer_rate: a virtual-clock workload needs a rate"),
    ({"workloads__levels__batch_size": 4}, "workloads.levels.batch_size: delayed messages cannot be batched"),
    ({"workloads__levels__clock": "real"}, "workloads.levels.drain_s"),
    ({"workloads__levels__filter": {"type": "XPATH"}}, "workloads.levels.filter.type must be one of"),
    ({"workloads__levels__filter": {"type": "TAG", "selectivity": 0.1, "expression": "A"}},
     "workloads.levels.filter: give either 'selectivity' alone"),
    ({"matrix__0__plugin_sets": ["lv", "nope"]}, "matrix[0].plugin_sets: unknown plugin set 'nope'"),
    ({"matrix__0__kind": "speed"}, "matrix[0].kind must be one of"),
    ({"matrix__0__repetitions": 0}, "matrix[0].repetitions must be >= 1"),
    ({"matrix": []}, "matrix: at least one"),
    ({"sweep": {"strategies": ["MACHINE_ROOM"]}}, "sweep.strategies: the sweep models"),
])
def test_validation_errors_name_the_key_path(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_experiments(spec_with(**changes))
    assert message in str(caught.value)


def test_broker_settings_are_validated_and_runner_owned_keys_refused() -> None:
    with pytest.raises(ConfigError, match=r"plugin_sets.lv.broker.data_dir: set by the experiment runner"):
        parse_experiments(spec_with(plugin_sets__lv__broker={"data_dir": "/x"}))
    with pytest.raises(ConfigError, match=r"plugin_sets.lv.broker"):
        parse_experiments(spec_with(plugin_sets__lv__broker={"max_mesage_size": 10}))


def test_files_read_from_toml_and_broken_toml_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\nseed = 1\n")
    with pytest.raises(ConfigError, match="broken.toml: not valid TOML"):
        load_experiments(broken)
    missing_yaml = tmp_path / "e.yaml"
    missing_yaml.write_text("run: {seed: 1}\n")
    try:
        import yaml  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ConfigError, match="PyYAML"):
            load_experiments(missing_yaml)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_shipped_example_files_validate(name: str) -> None:
    spec = load_experiments(EXAMPLES / name)
    runs = expand_matrix(spec)
    assert runs and all(e.plugin_set.flush in ("sync", "async") for e in runs)
    raw = tomllib.loads((EXAMPLES / name).read_text())
    assert all("flush" in t["options"][spec.plugin_sets[n].store] for n, t in raw["plugin_sets"].items())


def test_speedup_example_has_24_experiments() -> None:
    assert len(expand_matrix(load_experiments(EXAMPLES / "speedup24.toml"))) == 24


# ------------------------------------------------------------------------------------------ replays
def _experiment(spec_data: dict[str, Any], workload: str, plugin_set: str) -> Experiment:
    spec = parse_experiments(spec_data)
    return next(e for e in expand_matrix(spec) if e.workload.name == workload and e.plugin_set.name == plugin_set)


def test_virtual_replay_is_deterministic_and_never_early(tmp_path: Path) -> None:
    exp = _experiment(BASE, "levels", "wh")
    first = run_experiment(exp, work_dir=tmp_path)
    second = run_experiment(exp, work_dir=tmp_path)
    assert first.status == "ok", first.error
    det = {n: v for n, v, _, d in first.metrics if d}
    assert det == {n: v for n, v, _, d in second.metrics if d}
    assert det["delay_early_deliveries"] == 0 and det["delay_undelivered"] == 0
    assert det["delay_delivered"] == det["delay_scheduled"] > 0
    assert det["messages_consumed"] == det["messages_published"] == 200
    assert det["consume_missing"] == 0 and det["consume_duplicates"] == 0
    assert 0 <= det["delay_lateness_max_ms"] <= 1000, "the wheel's resolution is one second"
    assert first.histograms["delay_lateness"].n == det["delay_delivered"]
    assert not list(tmp_path.iterdir()), "the broker directory is removed"


def test_level_strategy_reports_unsupported_for_arbitrary_delays(tmp_path: Path) -> None:
    result = run_experiment(_experiment(BASE, "arbitrary", "lv"), work_dir=tmp_path)
    assert result.status == "unsupported"
    assert "delay_level serves only the fixed delay levels" in result.error
    assert result.metrics == [] and result.histograms == {}, "no partial figures"
    wheel = run_experiment(_experiment(BASE, "arbitrary", "wh"), work_dir=tmp_path)
    assert wheel.status == "ok" and wheel.metric_map()["delay_early_deliveries"] == 0


def test_failed_experiment_returns_a_row_with_the_error(tmp_path: Path) -> None:
    data = spec_with(plugin_sets__lv__broker={"max_message_size": 64},
                     workloads__levels__message_size=200)
    result = run_experiment(_experiment(data, "levels", "lv"), work_dir=tmp_path)
    assert result.status == "failed"
    assert "every send failed" in result.error and "MessageTooLargeError" in result.error
    rows = result.rows()
    assert rows[0]["kind"] == "experiment" and rows[0]["name"] == "failed" and len(rows) == 1


def test_churn_replay_measures_moves_and_balance(tmp_path: Path) -> None:
    data = spec_with(workloads__churn={"queues_per_topic": 12, "producer_rate": 5, "duration_s": 120,
                                       "consumers_per_subscription": 3,
                                       "churn": {"joins_per_minute": 2, "leaves_per_minute": 2}},
                     plugin_sets__ch={"plugins": ["store_mmap", "alloc"], "options": {"store_mmap": {"flush": "async"}},
                                      "allocation_strategy": "CONSISTENT_HASH"},
                     matrix__0__workloads=["churn"], matrix__0__plugin_sets=["lv", "ch"])
    avg = run_experiment(_experiment(data, "churn", "lv"), work_dir=tmp_path).metric_map()
    ch = run_experiment(_experiment(data, "churn", "ch"), work_dir=tmp_path).metric_map()
    for m in (avg, ch):
        assert m["allocation_membership_changes"] == 8, "2 joins + 2 leaves per minute for 2 minutes"
        assert m["consume_duplicates"] == 0 and m["consume_missing"] == 0
        assert m["allocation_overload"] >= 1 and m["allocation_overload_max"] >= m["allocation_overload"]
    assert avg["allocation_changes_moving_nothing"] == 0, "every AVG join or leave moves queues"
    assert avg["allocation_overload_initial"] == 1.0
    assert avg["allocation_imbalance_initial"] == 1.0, "12 queues over 3 consumers, AVG: 4 each"
    assert avg["allocation_imbalance"] <= ch["allocation_imbalance"]


def test_filter_scan_counts_precheck_and_false_positives(tmp_path: Path) -> None:
    data = spec_with(
        workloads__tag={"duration_s": 0.5, "filter": {"type": "TAG", "selectivity": 0.2}},
        workloads__sql={"duration_s": 0.5, "filter": {"type": "SQL92", "selectivity": 0.2}},
        plugin_sets__f={"plugins": ["store_mmap", "filter_tag", "filter_sql", "alloc"],
                        "options": {"store_mmap": {"flush": "async"}}},
        matrix__0__workloads=["tag", "sql"], matrix__0__plugin_sets=["f"])
    tag = run_experiment(_experiment(data, "tag", "f"), work_dir=tmp_path).metric_map()
    sql = run_experiment(_experiment(data, "sql", "f"), work_dir=tmp_path).metric_map()
    assert tag["filter_entries"] > 20 and sql["filter_entries"] > 20
    assert tag["filter_precheck_pass_rate"] == pytest.approx(tag["filter_selectivity"]), "tag hashes: no false positive"
    assert tag["filter_false_positive_rate"] == 0
    assert sql["filter_precheck_pass_rate"] == 1.0, "SQL92 has no consume-queue pre-check"
    assert sql["filter_false_positive_rate"] == pytest.approx(1 - sql["filter_selectivity"])
    assert tag["consume_missing"] == 0 and sql["consume_missing"] == 0


# ------------------------------------------------------------------------------------------ sweep model
@pytest.mark.parametrize("strategy", ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"])
def test_sweep_model_equals_the_installed_strategy_on_every_small_pair(strategy: str) -> None:
    spec = SweepSpec(max_queues=14, max_consumers=14, strategies=(strategy,), virtual_nodes=4)
    model = SweepModel(spec)
    factories = installed_allocate_strategies()
    params = {"virtual_nodes": 4} if strategy == "CONSISTENT_HASH" else {}
    for c in range(1, 15):
        for joined in (False, True):
            order = list(model.order(c, joined=joined))
            names = [member_id(int(i)) if i < c else joiner_id(c) for i in order]
            owners = model.owners(strategy, c, joined=joined)
            for q in range(1, 15):
                expected = _plugin_owners(factories, strategy, params, q, names)
                got = {p: names[order.index(i)] for p, i in enumerate(owners[q - 1, :q])}
                assert got == expected, (strategy, q, c, joined)


def test_sweep_rows_for_average_blocks() -> None:
    model = SweepModel(SweepSpec(max_queues=10, max_consumers=3, strategies=("AVG",)))
    rows = _pair_rows(model, "AVG", 3).set_index("queues")
    assert rows.loc[10, "max_per_consumer"] == 4 and rows.loc[10, "min_per_consumer"] == 3
    assert rows.loc[10, "imbalance"] == pytest.approx(4 / 3)
    assert np.isnan(rows.loc[2, "imbalance"]) and rows.loc[2, "idle_consumers"] == 1
    # 9 queues, the joiner sorts third: [0,1,2][3,4,5][6,7,8] -> [0,1,2][3,4][5,6 joiner][7,8]
    assert rows.loc[9, "moved_on_join"] == 2


# ------------------------------------------------------------------------------------------ command line
def test_dry_run_lists_the_seeded_order_without_spark() -> None:
    import subprocess
    import sys

    from click.testing import CliRunner

    from plugmq.cli import main

    result = CliRunner().invoke(main, ["compare", str(EXAMPLES / "quick.toml"), "--out", "unused", "--dry-run"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    runs = expand_matrix(load_experiments(EXAMPLES / "quick.toml"))
    assert f"{len(runs)} experiments in run order" in result.output and "sweep: 200 x 200" in result.output
    assert runs[0].experiment_id in result.output
    probe = "import sys, plugmq.spark, plugmq.spark.cli; print('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False", "importing plugmq.spark must not start pyspark"


def test_bad_experiments_file_is_a_clean_cli_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plugmq.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[workloads.w]\nduration_s = 1\n[plugin_sets.p]\nplugins = ["store_mmap"]\n'
                   '[[matrix]]\nworkloads = ["w"]\nplugin_sets = ["p"]\n')
    result = CliRunner().invoke(main, ["compare", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert "plugin_sets.p.options.store_mmap.flush: the durability mode must be stated" in result.output


# ------------------------------------------------------------------------------------------ real clock, isolation
def test_real_clock_replay_measures_rates_and_latencies(tmp_path: Path) -> None:
    data = spec_with(workloads__burst={"producer_rate": 400, "duration_s": 0.5, "warmup_s": 0.2, "message_size": 100,
                                       "batch_size": 4, "consumers_per_subscription": 2},
                     matrix__0__workloads=["burst"])
    result = run_experiment(_experiment(data, "burst", "wh"), work_dir=tmp_path)
    assert result.status == "ok", result.error
    m = result.metric_map()
    assert m["messages_published"] > 0 and m["publish_errors"] == 0
    assert m["publish_rate_msg_s"] == pytest.approx(m["messages_published"] / 0.5, rel=0.05)
    assert m["publish_rate_mb_s"] == pytest.approx(m["publish_rate_msg_s"] * 100 / 1e6)
    assert m["publish_latency_count"] == m["messages_published"], "a batch counts once per message"
    assert m["consume_missing"] == 0 and m["consume_duplicates"] == 0 and m["backlog_final"] == 0
    assert 0 < m["end_to_end_latency_p50_ms"] <= m["end_to_end_latency_p99_ms"] <= m["end_to_end_latency_max_ms"]
    assert [det for name, _, _, det in result.metrics if name == "publish_rate_msg_s"] == [False], "speed varies"
    assert {name for _, name, _ in result.series} >= {"published", "publish_rate_msg_s", "consumed"}


def test_isolated_experiment_that_overruns_its_timeout_is_a_failed_row(tmp_path: Path) -> None:
    from plugmq.spark.execute import ExecOptions, execute

    options = ExecOptions(work_dir=str(tmp_path), timeout_s=0.05, lock_path=str(tmp_path / "lock"))
    result = execute(_experiment(BASE, "levels", "wh"), options)
    assert result.status == "failed" and "timed out after 0.05 s" in result.error
    assert result.info["workload"] == "levels" and result.info["isolated"] is True


def test_only_real_clock_experiments_take_the_host_lock_and_a_waiter_says_who_holds_it(tmp_path: Path) -> None:
    import threading

    from plugmq.spark.execute import ExecOptions, execute, real_clock_lock

    path = str(tmp_path / "lock")
    waits: list[tuple[float, str]] = []
    holder = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with real_clock_lock(path, owner="pid 1 on elsewhere: stores/burst/mmap/r0"):
            holder.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holder.wait(30)
        # A virtual-clock experiment never waits for the lock, even while it is held.
        virtual = execute(_experiment(BASE, "levels", "wh"),
                          ExecOptions(work_dir=str(tmp_path), isolate=False, lock_path=path))
        assert virtual.status == "ok" and virtual.info["real_clock_lock"] is False and virtual.info["lock_wait_s"] == 0
        timer = threading.Timer(0.6, release.set)
        timer.start()
        with real_clock_lock(path, owner="me", on_wait=lambda waited, who: waits.append((waited, who))) as waited:
            assert waited >= 0.5
    finally:
        release.set()
        thread.join()
    assert waits and waits[0][0] < 0.5, "the first wait is reported at once"
    assert waits[0][1].startswith("pid 1 on elsewhere: stores/burst/mmap/r0 (since ")


def test_tasks_plan_puts_real_clock_experiments_in_one_serial_lane() -> None:
    from plugmq.spark.job import estimated_cost_s, plan_tasks

    data = spec_with(workloads__burst={"producer_rate": 0, "duration_s": 1},
                     workloads__burst2={"producer_rate": 0, "duration_s": 2, "message_size": 512})
    data["matrix"].append({"name": "speed", "kind": "storage", "workloads": ["burst", "burst2"],
                           "plugin_sets": ["wh", "sc"], "repetitions": 2})
    experiments = expand_matrix(parse_experiments(data))
    real = [i for i, e in enumerate(experiments) if e.workload.clock == "real"]
    virtual = [i for i, e in enumerate(experiments) if e.workload.clock == "virtual"]
    assert len(real) == 8 and len(virtual) == 12
    [stage] = plan_tasks(experiments, "lane")
    assert stage[0] == real, "one lane, in the seeded run order"
    assert sorted(i for [i] in stage[1:]) == virtual
    costs = [estimated_cost_s(experiments[i]) for [i] in stage[1:]]
    assert costs == sorted(costs, reverse=True), "the longest virtual-clock experiments start first"
    first, second = plan_tasks(experiments, "exclusive")
    assert first == stage[1:] and second == [real]
    [parallel] = plan_tasks(experiments, "none")
    assert sorted(i for [i] in parallel) == list(range(len(experiments)))
    assert plan_tasks([], "lane") == []


def test_progress_tracker_lines_and_eta() -> None:
    from plugmq.spark.progress import ProgressEvent, ProgressTracker, format_s

    data = spec_with(workloads__burst={"producer_rate": 0, "duration_s": 1})
    data["matrix"].append({"name": "speed", "kind": "storage", "workloads": ["burst"], "plugin_sets": ["wh", "sc"]})
    experiments = expand_matrix(parse_experiments(data))
    now = [100.0]
    tracker = ProgressTracker(experiments, slots=2, serial_real=True, clock=lambda: now[0])
    real = [e.experiment_id for e in experiments if e.workload.clock == "real"]
    virtual = [e.experiment_id for e in experiments if e.workload.clock == "virtual"]
    assert tracker.eta() is None
    assert tracker.line(ProgressEvent("started", real[0], "real")) is None
    wait = tracker.line(ProgressEvent("waiting", real[0], "real", waited_s=12, holder="pid 7 on h: x"))
    assert wait == f"waiting for the real-clock lane: {real[0]} has waited 0:12; held by pid 7 on h: x"
    now[0] = 130.0
    line = tracker.line(ProgressEvent("finished", real[0], "real", status="ok", wall_s=10.0))
    assert line is not None and line.startswith(f"[ 1/{len(experiments)}] ok ")
    assert "(real-clock lane) · elapsed 0:30 · ETA " in line
    # One real-clock experiment left (10 s in the lane); 12 virtual ones on the one slot the lane leaves,
    # at the only mean known so far (10 s): 120 s.
    assert tracker.eta() == pytest.approx(120.0)
    for experiment_id in virtual[:6]:
        tracker.line(ProgressEvent("finished", experiment_id, "virtual", status="ok", wall_s=2.0))
    assert tracker.eta() == pytest.approx(max(10.0, 6 * 2.0 / 1))
    assert tracker.line(ProgressEvent("finished", virtual[0], "virtual", status="ok", wall_s=2.0)) is None, "once"
    assert format_s(3725) == "1:02:05" and format_s(None) == "?"


# ------------------------------------------------------------------------------------------ headline table
def test_headline_names_the_winner_the_margin_and_whether_it_beats_the_spread() -> None:
    import pandas as pd

    from plugmq.spark.headline import headline_rows
    from plugmq.spark.kinds import KINDS

    spec = parse_experiments(BASE)
    summary = pd.DataFrame([
        # workload, plugin set, metric, median, low, high, runs
        ("levels", "lv", "delay_lateness_p99_ms", 0.0, 0.0, 0.0, 2),
        ("levels", "wh", "delay_lateness_p99_ms", 950.0, 940.0, 960.0, 2),
        ("levels", "sc", "delay_lateness_p99_ms", 450.0, 440.0, 460.0, 2),
        ("levels", "wh", "publish_cost_us_per_msg", 40.0, 30.0, 50.0, 2),
        ("levels", "sc", "publish_cost_us_per_msg", 45.0, 35.0, 55.0, 2),
        ("arbitrary", "wh", "delay_lateness_p99_ms", 900.0, 900.0, 900.0, 2),
    ], columns=["workload", "plugin_set", "metric", "value", "low", "high", "runs"]).assign(matrix="delay")
    experiments = pd.DataFrame([{"matrix": "delay", "workload": w, "plugin_set": p}
                                for w in ("levels", "arbitrary") for p in ("lv", "wh", "sc")])
    rows = {(r.scenario, r.measure): r for r in headline_rows(spec.matrices, summary, experiments)}
    lateness = rows[("levels", "p99 lateness of delayed messages")]
    assert (lateness.winner, lateness.runner_up) == ("lv", "sc")
    assert lateness.margin == "450 ms less", "no factor against a zero"
    assert lateness.spread == "identical in all 2 runs" or lateness.spread.startswith("clear")
    assert [name for name, _ in lateness.ranking] == ["lv", "sc", "wh"]
    cost = rows[("levels", "send cost (CPU + I/O per message)")]
    assert cost.winner == "wh" and cost.margin == "1.12x (5 µs less)"
    assert cost.spread.startswith("within the run-to-run spread")
    assert ("arbitrary", "p99 lateness of delayed messages") not in rows, "one contender: nothing to compare"
    for kind in KINDS.values():
        assert {m.metric for m in kind.headline} <= set(kind.columns), kind.name
