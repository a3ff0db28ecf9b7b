"""``plugmq bench grpc`` end to end on a tiny load: every phase runs and the report holds its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("rocketmq", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.bench.grpc_startup import SITUATIONS
from plugmq.cli import main


@pytest.mark.slow
def test_bench_grpc_reports_rates_cpu_start_up_and_the_crash_check() -> None:
    result = CliRunner().invoke(main, ["bench", "grpc", "--messages", "64", "--steady-s", "2", "--no-redis", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {(r["scenario"], r["threads"]): r for r in report["rows"]}
    assert rows[("gRPC send (official client)", 8)]["rate"] > 0
    assert rows[("gRPC send (official client)", 8)]["server_cpu_ms"] > 0
    assert any(s.startswith("gRPC receive") for s, _ in rows)
    assert report["redis"] == "not measured: turned off (--no-redis)"
    assert [s["situation"] for s in report["startups"]] == [
        "first start, empty data dir", "restart after SIGTERM", "restart after kill -9 during sends"]
    assert all(s["serving_s"] > 0 and "broker_open_s" in s["phases"] for s in report["startups"])
    steady = report["steady"]
    assert steady["send_rate"] > 0 and steady["backlog_samples"]
    # the clients' own CPU, measured beside the server's (they share the machine's cores)
    assert steady["producer_cpu_ms_per_send"] > 0 and steady["consumer_cpu_ms_per_ack"] > 0
    assert set(steady["cpu_s"]) == {"server", "producers", "consumers", "elapsed"}
    assert report["crash"]["acked_lost"] == 0 and report["crash"]["producer_reconnect_s"] >= 0
    assert {g["goal"] for g in report["goals"]} >= {"server CPU per sent message <= 0.25 ms"}


@pytest.mark.slow
def test_bench_grpc_startup_only_times_each_situation_for_both_interpreters() -> None:
    result = CliRunner().invoke(main, ["bench", "grpc", "--startup-only", "--backlog-mb", "1", "--rounds", "1",
                                       "--baseline-python", sys.executable, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["backlog_messages"] == 1024
    samples = {(s["python"], s["situation"]): s for s in report["samples"]}
    assert set(samples) == {(python, situation) for python in ("baseline", "this") for situation in SITUATIONS}
    for sample in samples.values():
        assert sample["serving_s"] > 0 and sample["cpu_s"] > 0
        assert {"imports_s", "broker_open_s"} <= set(sample["phases"])


@pytest.mark.slow
def test_bench_grpc_tls_measures_both_servers_each_round() -> None:
    pytest.importorskip("trustme", reason="needs the bench extra (trustme)")
    # A child process: the run puts its CA in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, which gRPC reads once.
    done = subprocess.run([str(Path(sys.executable).with_name("plugmq")), "bench", "grpc", "--tls", "--messages", "64",
                           "--rounds", "2", "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    for scenario in ("official client send", "generated stub send"):
        for kind in ("plain", "tls"):
            rates = report["rates"][f"{scenario} {kind}"]
            assert len(rates) == 2 and all(rate > 0 for rate in rates)
        assert report["ratios"][scenario] > 0 and report["capacity_ratios"][scenario] > 0


def test_the_baseline_comparison_pairs_served_rows_and_the_steady_run() -> None:
    from plugmq.bench.grpc import Report, Row, _ratios

    def report(rate: float, cpu: float, ack: float) -> Report:
        return Report({}, [Row("in-process send (baseline)", 1, 9e9), Row("gRPC send (official client)", 8, rate, cpu)],
                      steady={"send_rate": 100.0, "ack_rate": ack, "server_cpu_ms_per_message": cpu})

    ratios = _ratios(report(300.0, 0.5, 95.0), report(200.0, 1.0, 50.0))
    assert ratios["gRPC send (official client), 8 threads: msg/s"] == (300.0, 200.0)
    assert ratios["gRPC send (official client), 8 threads: server CPU ms/msg"] == (0.5, 1.0)
    assert ratios["steady: ack_rate / send_rate"] == (0.95, 0.5)
    assert not any(key.startswith("in-process") for key in ratios)  # nothing served to compare


def test_the_printed_steady_run_names_each_process_cpu_and_the_busy_cores() -> None:
    from rich.console import Console

    from plugmq.bench.grpc import _print_steady

    steady = {"seconds": 10.0, "send_threads": 8, "receive_threads": 4, "send_rate": 500.0, "ack_rate": 250.0,
              "backlog_samples": [{"t": 5.0, "sent": 2500, "acked": 1250, "backlog": 1250}],
              "backlog_growth_per_s": 250.0, "server_cpu_ms_per_message": 1.8,
              "cpu_s": {"server": 6.0, "producers": 5.0, "consumers": 3.0, "elapsed": 10.0},
              "producer_cpu_ms_per_send": 1.0, "consumer_cpu_ms_per_ack": 1.2}
    console = Console(width=200, record=True)
    _print_steady(steady, 2, console)
    text = console.export_text()
    assert "producers 1.000 ms per send, consumers 1.200 ms per receive+ack" in text
    assert "kept 1.40 of 2 cores busy" in text
