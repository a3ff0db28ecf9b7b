"""Run one experiment inside a Spark task: real-clock lock, process isolation, timeout, failure row.

Virtual-clock experiments measure logic: they take no lock and run side by side. Real-clock
experiments measure speed: the driver puts them in one serial lane (one Spark task runs them one
after another, see :mod:`plugmq.spark.job`), and each holds the host's real-clock lock
(``lock_path``, an exclusive ``flock``) while it runs, so two comparisons on one host never take
throughput figures at the same time. Only real-clock experiments ever wait for that lock; while one
waits it reports who holds it (a progress event every few seconds). The wait is recorded
(``lock_wait_s``).

With ``isolate=True`` (the default) the experiment runs in a process of its own, forked from a
fork server that has already imported plugmq and the built-in plugins (a fresh interpreter per
experiment cost 0.5-3 s of start-up on a loaded 2-core host): a crash, a hang (``timeout_s``) or a
leak in a plugin costs that experiment only, and resident memory is the experiment's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from plugmq.measure.probes import environment
from plugmq.spark.experiments import Experiment
from plugmq.spark.progress import ProgressAddress, ProgressEvent, ProgressSender
from plugmq.spark.replay import describe, run_experiment
from plugmq.spark.results import ExperimentResult

__all__ = ["PERF_ISOLATION", "ExecOptions", "execute", "real_clock_lock"]

# lane: real-clock experiments one at a time in their own lane, next to virtual ones (default);
# exclusive: the lane starts once every virtual-clock experiment has finished;
# none: real-clock experiments run in parallel like virtual ones, without the host lock.
PERF_ISOLATION = ("lane", "exclusive", "none")
WAIT_REPORT_EVERY_S = 10.0
_POLL_S = 0.2

# Imported once by the fork server, so a forked experiment starts without paying for them.
_PRELOAD = ["plugmq.spark.worker", "plugmq.spark.replay", "plugmq.spark.replay_virtual", "plugmq.spark.replay_real",
            "plugmq.spark.scans", "plugmq.plugins.store_mmap", "plugmq.plugins.store_lmdb", "plugmq.plugins.store_rocks",
            "plugmq.plugins.delay_level", "plugmq.plugins.delay_wheel", "plugmq.plugins.delay_schedule",
            "plugmq.plugins.filter_tag", "plugmq.plugins.filter_sql", "plugmq.plugins.alloc", "plugmq.plugins.txn"]


def _default_lock_path() -> str:
    return os.path.join(tempfile.gettempdir(), "plugmq-real-clock.lock")


@attrs.frozen
class ExecOptions:
    work_dir: str | None = None
    window_s: float = 10.0
    isolate: bool = True
    timeout_s: float = 1800.0
    perf_isolation: str = attrs.field(default="lane", validator=attrs.validators.in_(PERF_ISOLATION))
    keep_data: bool = False
    lock_path: str = attrs.field(factory=_default_lock_path)
    progress: ProgressAddress | None = None


@contextlib.contextmanager
def real_clock_lock(path: str, *, owner: str,
                    on_wait: Callable[[float, str], None] | None = None) -> Iterator[float]:
    """Hold the host's real-clock lock; yields the seconds waited for it.

    While it waits, ``on_wait(waited_s, holder)`` is called at once and then every
    ``WAIT_REPORT_EVERY_S``; ``holder`` is what the holder wrote into the lock file (``owner``).
    """
    began = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        next_report = began
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.perf_counter()
                if on_wait is not None and now >= next_report:
                    on_wait(now - began, _read_holder(fd))
                    next_report = now + WAIT_REPORT_EVERY_S
                time.sleep(_POLL_S)
        waited = time.perf_counter() - began
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{owner} (since {time.strftime('%H:%M:%S')})".encode(), 0)
        yield waited
    finally:
        os.close(fd)  # releases the lock


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 1000, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def execute(exp: Experiment, options: ExecOptions, progress: ProgressSender | None = None) -> ExperimentResult:
    """Run ``exp`` (under the real-clock lock if it is real-clock), isolated or in this process; never raises."""
    sender = progress or ProgressSender(None)
    host, pid = socket.gethostname(), os.getpid()
    locked = exp.workload.clock == "real" and options.perf_isolation != "none"
    sender.send(ProgressEvent("started", exp.experiment_id, exp.workload.clock, host=host, pid=pid))

    def waiting(waited: float, holder: str) -> None:
        sender.send(ProgressEvent("waiting", exp.experiment_id, exp.workload.clock, waited_s=waited, holder=holder,
                                  host=host, pid=pid))

    lock: contextlib.AbstractContextManager[float] = (
        real_clock_lock(options.lock_path, owner=f"pid {pid} on {host}: {exp.experiment_id}", on_wait=waiting)
        if locked else contextlib.nullcontext(0.0))
    with lock as waited:
        entered = time.time()
        if options.isolate:
            result = _run_isolated(exp, options)
        else:
            result = run_experiment(exp, work_dir=options.work_dir, window_s=options.window_s,
                                    keep_data=options.keep_data)
    result.info["lock_wait_s"] = waited
    # Process start-up, imports and unpickling before the experiment's own clock starts (profiling).
    started_at = result.info.get("started_at")
    result.info["start_delay_s"] = started_at - entered if isinstance(started_at, float) else None
    result.info["perf_isolation"] = options.perf_isolation
    result.info["real_clock_lock"] = locked
    result.info["isolated"] = options.isolate
    sender.send(ProgressEvent("finished", exp.experiment_id, exp.workload.clock, status=result.status,
                              wall_s=float(result.info.get("wall_s") or 0.0), host=host, pid=pid))
    result.info["progress"] = sender.problem or "sent"
    return result


def _failed(exp: Experiment, error: str) -> ExperimentResult:
    result = ExperimentResult(exp.experiment_id, status="failed", error=error)
    result.info.update(describe(exp))
    result.info["env"] = environment()
    return result


_context: Any = None


def _fork_context() -> Any:
    """The fork-server context of this process (one server per Spark Python worker, started on first use)."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        _context = context
    return _context


@contextlib.contextmanager
def _plain_main() -> Iterator[None]:
    """Start a process without asking it to re-import this process's ``__main__``.

    multiprocessing makes a forked-from-server child import the parent's main module (for
    functions defined there); ours lives in :mod:`plugmq.spark.worker`, and the parent's main is
    the Spark Python worker (``pyspark.daemon``: about a second of imports per experiment).
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _run_isolated(exp: Experiment, options: ExecOptions) -> ExperimentResult:
    from plugmq.spark.worker import run_request

    with tempfile.TemporaryDirectory(prefix="plugmq-task-", dir=options.work_dir) as tmp:
        request, response, stderr = Path(tmp) / "request.pkl", Path(tmp) / "result.pkl", Path(tmp) / "stderr.txt"
        request.write_bytes(pickle.dumps((exp, options.work_dir, options.window_s, options.keep_data)))
        began = time.perf_counter()
        process = _fork_context().Process(target=run_request, args=(str(request), str(response), str(stderr)),
                                          name=f"plugmq-experiment-{exp.order}", daemon=True)
        with _plain_main():
            process.start()
        process.join(options.timeout_s)
        if process.is_alive():
            process.kill()
            process.join()
            return _failed(exp, f"timed out after {options.timeout_s:g} s (raise --experiment-timeout if the "
                                f"workload is meant to take longer); stderr tail: {_tail(stderr, 2000)!r}")
        if process.exitcode != 0 or not response.exists():
            return _failed(exp, f"the experiment process exited with status {process.exitcode} after "
                                f"{time.perf_counter() - began:.1f} s; stderr tail:\n{_tail(stderr, 4000)}")
        result: ExperimentResult = pickle.loads(response.read_bytes())
        return result


def _tail(path: Path, size: int) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-size:]
    except OSError:
        return ""
