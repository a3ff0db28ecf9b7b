"""What a run costs and where it ran: CPU, resident memory, disk, load average, environment.

Linux figures come from ``/proc``; elsewhere the probes answer None (memory) or raise
(:func:`process_cpu_s`), and the callers say the figure was not measured.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from plugmq.kit.diskspace import allocated_bytes as disk_bytes

__all__ = ["CpuMeter", "LoadWindow", "disk_bytes", "environment", "load_average", "own_cpu_s", "own_memory_mb",
           "process_cpu_s", "process_rss_mb", "status_kib"]

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def own_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    times = os.times()
    return times.user + times.system


def status_kib(field: str, pid: int | str = "self") -> int | None:
    """A size from ``/proc/<pid>/status`` in KiB: ``VmRSS`` (resident, mapped files included),
    ``VmHWM`` (peak resident), ``RssAnon`` (heap and other anonymous memory); None without /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def process_rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (None when /proc has no answer)."""
    kib = status_kib("VmRSS", pid)
    return None if kib is None else kib / 1024


def own_memory_mb() -> tuple[float | None, float | None]:
    """(resident, peak resident) of this process in MiB; (None, None) without /proc."""
    rss, peak = status_kib("VmRSS"), status_kib("VmHWM")
    return (None if rss is None else rss / 1024, None if peak is None else peak / 1024)


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (zeros where the system has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


@attrs.define
class LoadWindow:
    """The load average when a run began and when it ended (every speed is reported with it)."""

    before: tuple[float, float, float] = attrs.field(factory=load_average)
    after: tuple[float, float, float] | None = None

    def finish(self) -> LoadWindow:
        self.after = load_average()
        return self

    def text(self) -> str:
        """``load average (1/5/15 min) before 0.52/0.61/0.70, after ...``."""
        after = "/".join(f"{v:.2f}" for v in self.after) if self.after is not None else "-"
        return f"load average (1/5/15 min) before {'/'.join(f'{v:.2f}' for v in self.before)}, after {after}"

    def as_dict(self) -> dict[str, list[float] | None]:
        return {"before": [round(v, 2) for v in self.before],
                "after": [round(v, 2) for v in self.after] if self.after is not None else None}


class CpuMeter:
    """CPU time across one phase of a run: of a child process (``pid``, optional) and of this one."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._child = process_cpu_s(pid) if pid is not None else 0.0
        self._own = own_cpu_s()
        self._wall = time.perf_counter()

    def child_s(self) -> float | None:
        return process_cpu_s(self.pid) - self._child if self.pid is not None else None

    def own_s(self) -> float:
        return own_cpu_s() - self._own

    def wall_s(self) -> float:
        return time.perf_counter() - self._wall


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """Where a run ran: host, cores (all and usable), 1-minute load, versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "load_1m": load_average()[0],
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        **{name: _version(name) for name in ("plugmq", "pyspark", "numpy", "lmdb", "rocksdict")},
    }
