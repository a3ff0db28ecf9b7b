"""Run one experiment inside a Spark task: host lock, process isolation, timeout, failure row.

Virtual-clock experiments measure logic and may share the machine; real-clock experiments
measure speed, so by default (``perf_isolation="exclusive"``) they hold an exclusive host-wide
lock that every other experiment on the host takes shared: a throughput figure is never taken
while another experiment uses the same disk and cores. The wait is recorded (``lock_wait_s``).

With ``isolate=True`` (the default) the experiment runs in a fresh Python process
(``python -m plugmq.spark.worker``): a crash, a hang (``timeout_s``) or a leak in a plugin costs
that experiment only, and resident memory is the experiment's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from plugmq.spark.experiments import Experiment
from plugmq.spark.replay import describe, run_experiment
from plugmq.spark.results import ExperimentResult, environment

__all__ = ["ExecOptions", "execute", "host_lock"]

PERF_ISOLATION = ("exclusive", "none")


@attrs.frozen
class ExecOptions:
    work_dir: str | None = None
    window_s: float = 10.0
    isolate: bool = True
    timeout_s: float = 1800.0
    perf_isolation: str = "exclusive"
    keep_data: bool = False
    lock_path: str = attrs.field(factory=lambda: os.path.join(tempfile.gettempdir(), "plugmq-compare.lock"))


@contextlib.contextmanager
def host_lock(path: str, exclusive: bool) -> Iterator[float]:
    """Hold the host-wide experiment lock (shared or exclusive); yields the seconds waited."""
    began = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield time.perf_counter() - began
    finally:
        os.close(fd)  # releases the lock


def execute(exp: Experiment, options: ExecOptions) -> ExperimentResult:
    """Run ``exp`` under the host lock, isolated or in this process; never raises."""
    exclusive = exp.workload.clock == "real" and options.perf_isolation == "exclusive"
    with host_lock(options.lock_path, exclusive) if options.perf_isolation != "none" else contextlib.nullcontext(0.0) as waited:
        if options.isolate:
            result = _run_isolated(exp, options)
        else:
            result = run_experiment(exp, work_dir=options.work_dir, window_s=options.window_s,
                                    keep_data=options.keep_data)
    result.info["lock_wait_s"] = waited
    result.info["perf_isolation"] = options.perf_isolation
    result.info["exclusive"] = exclusive
    result.info["isolated"] = options.isolate
    return result


def _failed(exp: Experiment, error: str) -> ExperimentResult:
    result = ExperimentResult(exp.experiment_id, status="failed", error=error)
    result.info.update(describe(exp))
    result.info["env"] = environment()
    return result


def _run_isolated(exp: Experiment, options: ExecOptions) -> ExperimentResult:
    with tempfile.TemporaryDirectory(prefix="plugmq-task-", dir=options.work_dir) as tmp:
        request, response = Path(tmp) / "request.pkl", Path(tmp) / "result.pkl"
        request.write_bytes(pickle.dumps((exp, options.work_dir, options.window_s, options.keep_data)))
        began = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "plugmq.spark.worker", str(request), str(response)],
                                  capture_output=True, text=True, timeout=options.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stderr or b"")[-2000:]
            return _failed(exp, f"timed out after {options.timeout_s:g} s (raise --experiment-timeout if the "
                                f"workload is meant to take longer); stderr tail: {tail!r}")
        if proc.returncode != 0 or not response.exists():
            return _failed(exp, f"the experiment process exited with status {proc.returncode} after "
                                f"{time.perf_counter() - began:.1f} s; stderr tail:\n{proc.stderr[-4000:]}")
        result: ExperimentResult = pickle.loads(response.read_bytes())
        return result
