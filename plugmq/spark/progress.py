"""Live progress of a comparison, from the Spark tasks to the driver, readable without a terminal.

A Spark task reports nothing to the driver until it ends, and the real-clock lane is one task
running many experiments; so every task sends small JSON lines over TCP to a
:class:`ProgressServer` in the driver: an experiment started, is waiting for the host's
real-clock lock (and who holds it), finished (status, wall time). :class:`ProgressTracker` turns
them into one log line per finished experiment with the elapsed time and an ETA.

Progress is best effort: a task that cannot reach the driver (a firewall between executors and
the driver's ``--progress-port``) runs its experiments all the same and says so in its rows.
"""

from __future__ import annotations

import json
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from plugmq.spark.experiments import Experiment

__all__ = ["ProgressAddress", "ProgressEvent", "ProgressSender", "ProgressServer", "ProgressTracker", "format_s"]


@attrs.frozen
class ProgressAddress:
    """Where tasks send their progress (shipped to the tasks inside the execution options)."""

    host: str
    port: int
    token: str


@attrs.frozen
class ProgressEvent:
    """``kind``: "started" | "waiting" | "finished". ``waited_s``/``holder`` for waiting; ``status``,
    ``wall_s`` for finished; ``host``, ``pid`` of the process running the experiment."""

    kind: str
    experiment_id: str
    clock: str = ""
    status: str = ""
    wall_s: float = 0.0
    waited_s: float = 0.0
    holder: str = ""
    host: str = ""
    pid: int = 0


class ProgressSender:
    """The task side: one connection per task, opened lazily; a failure disables it for the task."""

    def __init__(self, address: ProgressAddress | None) -> None:
        self.address = address
        self.problem = "" if address is not None else "no progress address"
        self._sock: socket.socket | None = None

    def send(self, event: ProgressEvent) -> None:
        if self.address is None or (self.problem and self._sock is None):
            return
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.address.host, self.address.port), timeout=5.0)
            payload = {"token": self.address.token, **attrs.asdict(event)}
            self._sock.sendall(json.dumps(payload).encode("utf-8") + b"\n")
        except OSError as exc:
            self.problem = f"cannot reach the driver's progress port {self.address.host}:{self.address.port}: {exc}"
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        for raw in self.rfile:
            try:
                data = json.loads(raw)
                if data.pop("token", None) != self.server.token:
                    continue  # not one of our tasks
                event = ProgressEvent(**data)
            except (ValueError, TypeError):
                continue
            self.server.deliver(event)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], token: str, deliver: Callable[[ProgressEvent], None]) -> None:
        super().__init__(address, _Handler)
        self.token = token
        self.lock = threading.Lock()
        self._deliver = deliver

    def deliver(self, event: ProgressEvent) -> None:
        with self.lock:  # one event at a time: the tracker and the printer are not thread-safe
            self._deliver(event)


class ProgressServer:
    """The driver side: a TCP listener on the address the executors reach the driver at."""

    def __init__(self, host: str, on_event: Callable[[ProgressEvent], None], port: int = 0) -> None:
        self._server = _Server((host, port), secrets.token_hex(8), on_event)
        self._thread = threading.Thread(target=self._server.serve_forever, name="plugmq-progress", daemon=True)

    @property
    def address(self) -> ProgressAddress:
        host, port = self._server.server_address[:2]
        return ProgressAddress(str(host), int(port), self._server.token)

    def __enter__(self) -> ProgressServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def format_s(seconds: float | None) -> str:
    """``m:ss`` (or ``h:mm:ss``); "?" when unknown."""
    if seconds is None:
        return "?"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressTracker:
    """Counts finished experiments and estimates the time left, lane by lane.

    The real-clock lane runs its experiments one after another; virtual-clock ones share the other
    task slots (all of them once the lane is done). The ETA is the later of the two lanes' ends,
    each from the mean wall time of its experiments finished so far (the other lane's mean until
    one has finished).
    """

    def __init__(self, experiments: Sequence[Experiment], slots: int, *, serial_real: bool,
                 clock: Callable[[], float] = time.monotonic, began: float | None = None) -> None:
        self.total = len(experiments)
        self.clock_of = {e.experiment_id: e.workload.clock for e in experiments}
        self.slots = max(1, slots)
        self.serial_real = serial_real
        self.clock = clock
        self.began = clock() if began is None else began  # elapsed counts from here (the command's start)
        self.done: dict[str, float] = {}
        self.statuses: dict[str, int] = {}
        self.waiting: dict[str, float] = {}

    def _lane(self, experiment_id: str) -> str:
        return "real" if self.serial_real and self.clock_of.get(experiment_id) == "real" else "parallel"

    def elapsed(self) -> float:
        return self.clock() - self.began

    def eta(self) -> float | None:
        """Seconds until the last experiment should finish; None before any has."""
        if not self.done:
            return None
        means: dict[str, float] = {}
        left = {"real": 0, "parallel": 0}
        for experiment_id in self.clock_of:
            if experiment_id not in self.done:
                left[self._lane(experiment_id)] += 1
        for lane in left:
            walls = [w for e, w in self.done.items() if self._lane(e) == lane]
            if walls:
                means[lane] = sum(walls) / len(walls)
        overall = sum(self.done.values()) / len(self.done)
        real_s = left["real"] * means.get("real", overall)
        parallel_slots = self.slots - (1 if left["real"] else 0)
        parallel_s = left["parallel"] * means.get("parallel", overall) / max(1, parallel_slots)
        return max(real_s, parallel_s)

    def line(self, event: ProgressEvent) -> str | None:
        """The text to print for ``event`` (None: nothing worth a line)."""
        if event.kind == "waiting":
            self.waiting[event.experiment_id] = event.waited_s
            return (f"waiting for the real-clock lane: {event.experiment_id} has waited {format_s(event.waited_s)}; "
                    f"held by {event.holder or 'another process'}")
        if event.kind != "finished" or event.experiment_id in self.done:
            return None
        self.waiting.pop(event.experiment_id, None)
        self.done[event.experiment_id] = event.wall_s
        self.statuses[event.status] = self.statuses.get(event.status, 0) + 1
        lane = "real-clock lane" if self._lane(event.experiment_id) == "real" else self.clock_of.get(
            event.experiment_id, "?") + " clock"
        width = len(str(self.total))
        return (f"[{len(self.done):>{width}}/{self.total}] {event.status:<11} {event.experiment_id} "
                f"{event.wall_s:.1f} s ({lane}) · elapsed {format_s(self.elapsed())} · ETA {format_s(self.eta())}")

    def summary(self) -> dict[str, Any]:
        return {"done": len(self.done), "total": self.total, "statuses": dict(self.statuses)}
