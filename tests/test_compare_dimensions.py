"""The comparison dimensions of this round without Spark: served throughput (``plugmq serve`` and the
official client in child processes), replication (a slave in a child process) and delay precision
on the real clock (millisecond delays, bursts due together)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugmq.core.errors import ConfigError
from plugmq.measure.children import broker_toml
from plugmq.spark.experiments import Experiment, expand_matrix, parse_experiments
from plugmq.spark.replay import run_experiment
from plugmq.testing import wait_for
from tests.helpers import specs

MMAP = {"store_mmap": {"flush": "async"}}
BASE: dict[str, Any] = {
    "run": {"seed": 11},
    "workloads": {
        "served": {"producer_rate": 60, "warmup_s": 0.2, "duration_s": 0.8, "message_size": 64,
                   "consumers_per_subscription": 1, "drain_s": 20, "serve": {"receive_batch": 8}},
        "delay_burst": {"clock": "real", "producer_rate": 150, "warmup_s": 0.1, "duration_s": 0.6, "drain_s": 20,
                        "delay": {"fraction": 1.0, "distribution": "uniform", "min_delay_s": 0.01,
                                  "max_delay_s": 0.3, "burst_ms": 100}},
        "embedded": {"producer_rate": 0, "warmup_s": 0.1, "duration_s": 0.4, "message_size": 128,
                     "consumers_per_subscription": 1, "drain_s": 20},
    },
    "plugin_sets": {
        "plain": {"plugins": ["store_mmap", "filter_tag", "alloc"], "options": MMAP},
        "async": {"plugins": ["store_mmap", "ha", "filter_tag", "alloc"], "options": MMAP,
                  "broker": {"role": "async_master"}},
        "sync": {"plugins": ["store_mmap", "ha", "filter_tag", "alloc"], "options": MMAP,
                 "broker": {"role": "sync_master"}},
        "schedule_10ms": {"plugins": ["store_mmap", "delay_schedule", "alloc"],
                          "options": {**MMAP, "delay_schedule": {"tick_ms": 10, "fsync": False}}},
    },
    "matrix": [{"name": "served", "kind": "served", "workloads": ["served"], "plugin_sets": ["plain", "sync"]},
               {"name": "replication", "kind": "replication", "workloads": ["embedded"],
                "plugin_sets": ["plain", "async", "sync"]},
               {"name": "delay_real", "kind": "delay_precision", "workloads": ["delay_burst"],
                "plugin_sets": ["schedule_10ms"]}],
}


def spec_with(**changes: Any) -> dict[str, Any]:
    return specs.spec_with(BASE, **changes)


def experiment(data: dict[str, Any], workload: str, plugin_set: str) -> Experiment:
    return next(e for e in expand_matrix(parse_experiments(data))
                if e.workload.name == workload and e.plugin_set.name == plugin_set)


# ------------------------------------------------------------------------------------------ the experiments file
def test_serve_and_replication_knobs_parse() -> None:
    spec = parse_experiments(BASE)
    served = spec.workloads["served"]
    assert served.serve is not None and served.serve.receive_batch == 8 and served.clock == "real"
    assert spec.workloads["embedded"].serve is None
    assert spec.plugin_sets["sync"].replication == "ha" and spec.plugin_sets["sync"].role == "sync_master"
    assert spec.plugin_sets["plain"].replication is None
    assert spec.workloads["delay_burst"].delay is not None and spec.workloads["delay_burst"].delay.burst_ms == 100
    assert len(expand_matrix(spec)) == 6


@pytest.mark.parametrize(("changes", "message"), [
    ({"workloads__served__clock": "virtual"}, "workloads.served.serve: a served workload runs on the real clock"),
    ({"workloads__served__batch_size": 4}, "workloads.served.batch_size: the official Python client sends one"),
    ({"workloads__served__filter": {"type": "TAG", "selectivity": 0.5}}, "workloads.served.filter: not measured"),
    ({"workloads__served__serve": {"receive_batch": 0}}, "workloads.served.serve.receive_batch must be >= 1"),
    ({"workloads__served__serve": {"recieve_batch": 4}}, "workloads.served.serve.recieve_batch: unknown key"),
    ({"plugin_sets__plain__broker": {"role": "sync_master"}},
     "plugin_sets.plain.broker.role = \"sync_master\" waits for a slave: add a replication plugin"),
    ({"plugin_sets__sync__broker": {"role": "slave"}}, "plugin_sets.sync.broker.role: a plugin set describes the master"),
    ({"plugin_sets__sync__broker": {"broker_id": 3}}, "plugin_sets.sync.broker.broker_id: set by the experiment runner"),
    ({"plugin_sets__plain__server": {"listen": "127.0.0.1:9876"}}, "plugin_sets.plain.server.listen: set by the"),
    ({"workloads__embedded__clock": "virtual", "workloads__embedded__producer_rate": 10},
     "plugin set 'async' replicates to a slave in another process, which runs on the real clock"),
    ({"workloads__delay_burst__delay": {"fraction": 1.0, "levels": [1], "burst_ms": 100}},
     "workloads.delay_burst.delay.burst_ms: bursts round deliver-at times"),
    ({"workloads__delay_burst__delay__burst_ms": -1}, "workloads.delay_burst.delay.burst_ms must be >= 0"),
    ({"workloads__delay_burst__producer_rate": 0}, "workloads.delay_burst.producer_rate: a burst workload"),
    ({"matrix__2__workloads": ["embedded"]}, "workload 'embedded' needs clock = \"real\" and a delay mix"),
    ({"workloads__delay_burst__clock": "virtual"}, "kind \"delay_precision\" measures delays on the real clock"),
])
def test_validation_errors_name_the_key_path(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_experiments(spec_with(**changes))
    assert message in str(caught.value)


def test_child_configuration_is_toml_the_server_reads() -> None:
    import tomllib

    tables = {"broker": {"name": "exp", "plugins": ["store_mmap", "ha"], "role": "slave", "broker_id": 1},
              "plugins.ha": {"master": "127.0.0.1:1234", "heartbeat_ms": 200},
              "server": {"long_polling_s": 1.5, "auth": {"enabled": False}}}
    assert tomllib.loads(broker_toml(tables)) == {
        "broker": tables["broker"], "plugins": {"ha": tables["plugins.ha"]}, "server": tables["server"]}
    with pytest.raises(ValueError, match=r"broker.limit: inf cannot be written"):
        broker_toml({"broker": {"limit": float("inf")}})


def test_bursts_put_deliver_at_times_on_a_grid_and_leave_the_rest_of_the_draw_alone() -> None:
    from plugmq.spark.workload import DUE, MessageFactory

    def due_times(burst_ms: int) -> list[int]:
        exp = experiment(spec_with(workloads__delay_burst__delay__burst_ms=burst_ms), "delay_burst", "schedule_10ms")
        factory = MessageFactory(exp.workload, exp.seed, 0, "0.0")
        messages = [factory.next(1_000_000 + 7 * i) for i in range(200)]
        assert all(m.deliver_at_ms is not None and str(m.deliver_at_ms) == m.properties[DUE] for m in messages)
        return [m.deliver_at_ms for m in messages if m.deliver_at_ms is not None]

    plain, burst = due_times(0), due_times(100)
    assert any(t % 100 for t in plain) and all(t % 100 == 0 for t in burst)
    assert all(0 <= b - p < 100 for p, b in zip(plain, burst, strict=True)), "rounded up, never earlier"
    assert len(set(burst)) < len(burst) / 5, "many messages fall due at one instant"


# ------------------------------------------------------------------------------------------ runs (child processes)
@pytest.mark.slow
def test_served_replicated_workload_through_plugmq_serve_and_the_official_client(tmp_path: Path) -> None:
    """The served path end to end with a sync slave: every message sent through the client is
    received and acked once, and the slave confirms it all; both children are stopped."""
    result = run_experiment(experiment(BASE, "served", "sync"), work_dir=tmp_path)
    assert result.status == "ok", result.error
    m = result.metric_map()
    assert m["messages_published"] > 0 and m["publish_errors"] == 0
    assert m["consume_missing"] == 0 and m["consume_duplicates"] == 0 and m["backlog_final"] == 0
    assert m["consume_rate_msg_s"] > 0 and 0 < m["end_to_end_latency_p50_ms"] <= m["end_to_end_latency_max_ms"]
    assert m["publish_latency_count"] == m["messages_published"]
    assert m["server_start_s"] > 0 and m["server_cpu_ms_per_msg"] > 0 and m["server_resident_memory_mb"] > 0
    # Sync double-write: nothing acked is left unreplicated. The sampled lag counts log records:
    # the one send in flight plus the pop state records of one receive batch (8), which the
    # consumer's receive writes and no send waits for.
    assert m["replication_unreplicated_bytes"] == 0 and m["replication_lag_messages_max"] <= 1 + 8, "sync double-write"
    assert m["slave_bytes_on_disk"] > 0 and m["bytes_on_disk"] > 0
    assert result.info["served"] is True and result.info["role"] == "sync_master"
    assert not _children_left(tmp_path)


@pytest.mark.slow
def test_async_replication_of_an_embedded_master_measures_lag_and_catch_up(tmp_path: Path) -> None:
    result = run_experiment(experiment(BASE, "embedded", "async"), work_dir=tmp_path)
    assert result.status == "ok", result.error
    m = result.metric_map()
    assert m["messages_published"] > 0 and m["publish_not_ok"] == 0 and m["consume_missing"] == 0
    assert m["replication_samples"] > 0 and m["replication_lag_bytes_max"] >= m["replication_lag_bytes_mean"] >= 0
    assert m["replication_unreplicated_bytes"] == 0 and m["replication_catch_up_ms"] >= 0
    assert m["slave_bytes_on_disk"] > 0
    assert not _children_left(tmp_path)


@pytest.mark.slow
def test_a_served_run_whose_receives_all_fail_is_a_failed_row(tmp_path: Path) -> None:
    """Without a TAG filter plugin the served broker refuses every receive: the run fails with the
    server's own reason instead of reporting a consume rate of 0."""
    data = spec_with(plugin_sets__plain__plugins=["store_mmap", "alloc"], workloads__served__duration_s=0.3,
                     workloads__served__drain_s=1)
    result = run_experiment(experiment(data, "served", "plain"), work_dir=tmp_path)
    assert result.status == "failed"
    assert "every receive failed" in result.error and "add filter_tag to broker.plugins" in result.error
    assert not _children_left(tmp_path)


@pytest.mark.slow
def test_real_clock_delay_precision_run_delivers_every_burst_never_early(tmp_path: Path) -> None:
    """Lateness on the real clock is a measurement (not deterministic); what must hold is that every
    delayed message is delivered, none before its time, and the figures are labelled as measured."""
    result = run_experiment(experiment(BASE, "delay_burst", "schedule_10ms"), work_dir=tmp_path)
    assert result.status == "ok", result.error
    m = result.metric_map()
    assert m["delay_delivered"] > 0 and m["delay_early_deliveries"] == 0 and m["delay_undelivered"] == 0
    assert m["delay_delivered"] == m["delay_lateness_count"]
    assert 0 <= m["delay_lateness_p50_ms"] <= m["delay_lateness_p99_ms"] <= m["delay_lateness_max_ms"]
    assert [det for name, _, _, det in result.metrics if name == "delay_delivered"] == [False]


@pytest.mark.slow
def test_a_broker_child_stops_when_the_experiment_process_is_killed(tmp_path: Path) -> None:
    """An experiment that overruns its timeout is SIGKILLed: its plugmq serve child must not live on."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from plugmq.measure.children import BrokerChild\n"
        "child = BrokerChild.from_tables(Path(sys.argv[1]), {'broker': {'name': 'orphan', 'data_dir': 'data', "
        "'plugins': ['store_mmap']}, 'plugins.store_mmap': {'flush': 'async'}})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "b")], stdout=subprocess.PIPE, text=True)
    pid = 0
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        wait_for(lambda: not _running(pid), 60, "the serve child to exit after its parent was killed", interval=0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children_left(root: Path) -> list[str]:
    """Processes still running with a command line that names a file under ``root``."""
    left = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(root) in cmdline:
                left.append(cmdline)
    return left
