"""Failover and recovery as a comparison dimension: ``kind = "chaos"`` runs a plugmq chaos schedule
per plugin set, and the report headlines recovery seconds and acknowledged-message loss like the
other measures (a round that never recovered makes a lower bound, flagged like a cap)."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from plugmq.chaos.checker import CheckResult, FaultOutcome
from plugmq.core.errors import ConfigError
from plugmq.spark.experiments import Matrix, expand_matrix, parse_experiments
from plugmq.spark.headline import headline_rows
from plugmq.spark.replay import run_experiment
from plugmq.spark.replay_chaos import chaos_config, chaos_metrics, chaos_mode
from plugmq.testing.zookeeper import zookeeper_missing

SPEC: dict[str, Any] = tomllib.loads("""
[workloads.failover]
producers_per_topic = 2
message_size = 64
chaos = { faults = ["kill-master"], rounds = 1, steady_s = 1.0, session_timeout_s = 2.0 }

[workloads.plain]
producer_rate = 10

[plugin_sets.sync]
plugins = ["store_mmap", "ha", "alloc"]
options.store_mmap = { flush = "async" }
options.ha = { min_in_sync_replicas = 1 }  # as examples/chaos/failover.toml: a master left alone acks alone
broker = { role = "sync_master" }

[plugin_sets.plain]
plugins = ["store_mmap", "alloc"]
options.store_mmap = { flush = "sync" }

[[matrix]]
name = "failover"
kind = "chaos"
workloads = ["failover"]
plugin_sets = ["sync", "plain"]
""")


@pytest.mark.parametrize(("change", "message"), [
    ({"workloads": {"failover": {"chaos": {"faults": ["nope"]}}}},
     "workloads.failover.chaos.faults has unknown fault 'nope'; plugmq chaos knows kill, kill-master"),
    ({"workloads": {"failover": {"clock": "virtual", "producer_rate": 1}}},
     "workloads.failover.chaos: a chaos schedule runs on the real clock"),
    ({"workloads": {"failover": {"serve": {}}}}, "workloads.failover.chaos: a workload is served or a chaos schedule"),
    ({"workloads": {"failover": {"topics": 2}}}, "workloads.failover.topics: not measured under a chaos schedule"),
    ({"matrix": [{"kind": "chaos", "workloads": ["plain"], "plugin_sets": ["plain"]}]},
     "matrix[0].workloads: workload 'plain' has no chaos table"),
    ({"matrix": [{"kind": "general", "workloads": ["failover"], "plugin_sets": ["plain"]}]},
     "matrix[0].workloads: workload 'failover' is a chaos schedule; compare it in a matrix of kind = \"chaos\""),
])
def test_a_chaos_workload_says_what_it_cannot_be(change: dict[str, Any], message: str) -> None:
    spec = copy.deepcopy(SPEC)
    for key, value in change.items():
        if key == "matrix":
            spec["matrix"] = value
        else:
            for name, table in value.items():
                spec[key][name].update(table)
    with pytest.raises(ConfigError) as caught:
        parse_experiments(spec, source="test")
    assert message in str(caught.value)


def test_the_plugin_set_is_the_composition_chaos_runs() -> None:
    sync, plain = expand_matrix(parse_experiments(SPEC, source="test"), seed=1)[:2]
    if sync.plugin_set.name != "sync":
        sync, plain = plain, sync
    config = chaos_config(sync)
    assert config["broker"]["plugins"] == ["store_mmap", "ha", "alloc", "filter_tag"], "the client's TAG filter"
    assert "role" not in config["broker"]
    assert config["plugins"]["store_mmap"] == {"flush": "async"}
    assert chaos_mode(sync) == "sync_master", "a replicating set runs in its own role"
    assert chaos_mode(plain) == "sync_master", "the others in the workload's chaos.mode"


def _outcome(name: str, send: float | None, receive: float | None, watched: float = 30.0) -> FaultOutcome:
    return FaultOutcome(name, 1, "broker-0", 0.0, 4.0, 0, 0, 0, 0.0, send, receive, watched)


def _check(lost: int, outcomes: tuple[FaultOutcome, ...]) -> CheckResult:
    return CheckResult(sends=100, acked=90, send_failures=10, read_back=90, lost=tuple(f"m{i}" for i in range(lost)),
                       lost_seen=(), redelivered_after_ack=(), position_conflicts=(), reordered=(),
                       duplicate_deliveries=0, stored_twice=(), failed_but_stored=0, stale_acks=(), faults=outcomes)


def test_recovery_over_rounds_counts_a_round_never_recovered_as_the_time_watched() -> None:
    metrics = chaos_metrics(_check(2, (_outcome("kill-master", 4.0, 5.0), _outcome("kill-master", 6.0, None, 30.0),
                                       _outcome("kill-master", 5.0, 7.0))))
    assert metrics["chaos_lost_acked"] == 2 and metrics["chaos_acked"] == 90 and metrics["chaos_rounds"] == 3
    assert metrics["chaos_send_recovery_s"] == 5.0 and metrics["chaos_send_recovery_max_s"] == 6.0
    assert metrics["chaos_receive_recovery_s"] == 7.0 and metrics["chaos_receive_recovery_max_s"] == 30.0
    assert metrics["chaos_send_never_recovered"] == 0 and metrics["chaos_receive_never_recovered"] == 1


def _summary(figures: dict[str, dict[str, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"matrix": "failover", "workload": "failover", "plugin_set": p, "metric": m, "value": v,
                          "low": v, "high": v, "runs": 1, "how": "median"}
                         for p, metrics in figures.items() for m, v in metrics.items()])


def test_recovery_and_loss_are_headlined_like_any_measure_and_a_lower_bound_is_flagged() -> None:
    matrix = Matrix(name="failover", kind="chaos", workloads=("failover",), plugin_sets=("sync", "async"))
    experiments = pd.DataFrame([{"matrix": "failover", "workload": "failover", "plugin_set": p, "clock": "real",
                                 "workload_json": "{}"} for p in ("sync", "async")])
    sync = chaos_metrics(_check(0, (_outcome("kill-master", 4.2, 4.6),)))
    lossy = chaos_metrics(_check(3, (_outcome("kill-master", 9.8, None, 61.0),)))
    rows = {r.measure: r for r in headline_rows([matrix], _summary({"sync": sync, "async": lossy}), experiments)}
    lost = rows["acknowledged messages lost to the faults"]
    assert lost.headlined and lost.winner == "sync" and lost.margin == "3 msg less"
    send = rows["send recovery after a fault (median of rounds)"]
    assert send.headlined and send.winner == "sync" and send.margin == "2.33x (5.60 s less)"
    receive = rows["receive recovery after a fault (median of rounds)"]
    assert not receive.headlined
    assert receive.why_not.startswith("capped: async's 61 s is a lower bound: the time watched, 1 round(s) never "
                                      "recovered (61 s) — a recovery never seen counts as the time it was watched")
    assert receive.flags == ("async: 61 s is a lower bound: the time watched, 1 round(s) never recovered (61 s)",)


@pytest.mark.slow  # ZooKeeper, two serve children, a SIGKILL of the master and the election: ~40 s
def test_a_chaos_experiment_runs_the_schedule_on_the_plugin_set(tmp_path: Path) -> None:
    if zookeeper_missing():
        pytest.skip(zookeeper_missing() or "")
    exp = next(e for e in expand_matrix(parse_experiments(SPEC, source="test"), seed=1) if e.plugin_set.name == "sync")
    result = run_experiment(exp, work_dir=tmp_path)
    assert result.status == "ok", result.error
    metrics = result.metric_map()
    assert metrics["chaos_rounds"] == 1 and metrics["chaos_acked"] > 0
    assert metrics["chaos_lost_acked"] == 0 and metrics["chaos_redelivered_after_ack"] == 0, "an ack is a promise"
    assert 0 < metrics["chaos_send_recovery_s"] < 60 and metrics["chaos_send_never_recovered"] == 0
    assert result.info["chaos_mode"] == "sync_master"
