"""`plugmq conformance --plugin X` runs the families X declares and names the clauses that damage files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGMQ = Path(sys.executable).with_name("plugmq")  # the console script installed with the package


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGMQ), "conformance", *args], capture_output=True,
                          text=True, timeout=600)


def test_only_the_declared_families_are_collected() -> None:
    done = run("--plugin", "alloc", "--collect-only", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and {line.split("::")[1] for line in collected} == {"TestAllocationContract", "TestBrokerContract"}
    assert "plugmq conformance: alloc (allocation)" in done.stdout
    assert "left out:" in done.stdout and "(delay, filter, storage, transaction)" in done.stdout
    assert "skipped" not in done.stdout


def test_an_events_plugin_runs_only_the_broker_clauses() -> None:
    done = run("--plugin", "audit", "--collect-only", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and all("::TestBrokerContract::" in line for line in collected)


def test_damaging_clauses_are_marked_listed_and_reported() -> None:
    done = run("--plugin", "store_lmdb", "-q", "-k", "corrupted_tail or single_append")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "clauses that damage the plugin's files on purpose" in out
    assert "test_corrupted_tail_never_returned[store_lmdb]: flips bytes" in out
    assert "clauses that damaged the plugin's files on purpose" in out  # the summary at the end
    summary = out[out.index("clauses that damaged"):]
    assert "PASSED" in summary and "corrupted_tail" in summary and "single_append" not in summary
