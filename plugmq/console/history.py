"""A small in-memory history the console samples: each group's lag per queue, each topic's offsets.

A sampler thread asks every broker, every ``interval_s`` of the console's clock, for
``consumer-progress`` of every group and ``topic-status`` of every normal topic, signing with the
account of the session seen last (nothing is sampled while nobody is signed in). It keeps the last
``keep`` samples of each series: lag over time for the group pages, and a topic's rate (messages
stored per second between the last two samples) for the topic pages.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from plugmq.console.brokers import Broker, Credentials, Fleet
from plugmq.core.clock import Clock
from plugmq.core.errors import PlugmqError
from plugmq.core.logs import get_logger

__all__ = ["History", "Series"]

log = get_logger(__name__)

Series = deque[tuple[float, int]]


class History:
    """Lag per (broker, group, topic, queue) and stored offsets per (broker, topic) over time."""

    def __init__(self, fleet: Fleet, clock: Clock, credentials: Callable[[], Credentials | bool | None],
                 interval_s: float = 10.0, keep: int = 360) -> None:
        self._fleet = fleet
        self._clock = clock
        self._credentials = credentials  # False: nobody signed in, do not sample
        self._interval = interval_s
        self._keep = keep
        self._lock = threading.Lock()
        self.lag: dict[tuple[str, str, str, int], Series] = {}
        self.offsets: dict[tuple[str, str], Series] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="plugmq-console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # the sampler outlives a bad answer; the log has it
                log.exception("console sample failed")
            self._clock.wait(self._stop, self._interval)

    def sample(self) -> bool:
        """One round over every broker; False when nobody is signed in (nothing sampled)."""
        credentials = self._credentials()
        if credentials is False:
            return False
        account = credentials if isinstance(credentials, Credentials) else None
        try:
            _, _, brokers = self._fleet.cluster(account)
        except PlugmqError as exc:
            log.info("console sample skipped", reason=str(exc))
            return False
        now = self._clock.now()
        for broker in brokers:
            self._sample_broker(broker, account, now)
        return True

    def _sample_broker(self, broker: Broker, account: Credentials | None, now: float) -> None:
        call = self._fleet.call
        try:
            groups = call(broker.endpoint, "consumer-progress", {}, account)
            topics = call(broker.endpoint, "topic-list", {}, account)
            progress = [call(broker.endpoint, "consumer-progress", {"group": g["group"]}, account) for g in groups]
            statuses = [call(broker.endpoint, "topic-status", {"topic": t["topic"]}, account)
                        for t in topics if t["kind"] == "normal"]
        except PlugmqError as exc:
            log.info("broker not sampled", broker=broker.name, reason=str(exc))
            return
        with self._lock:
            for group in progress:
                for q in group["queues"]:
                    self._add(self.lag, (broker.name, group["group"], q["topic"], q["queue_id"]), now, q["lag"])
            for status in statuses:
                stored = sum(q["max_offset"] for q in status["queues"])
                self._add(self.offsets, (broker.name, status["topic"]), now, stored)

    def _add(self, table: dict[Any, Series], key: Any, now: float, value: int) -> None:
        series = table.get(key)
        if series is None:
            series = table[key] = deque(maxlen=self._keep)
        series.append((now, value))

    def lag_series(self, group: str) -> dict[tuple[str, str, int], list[tuple[float, int]]]:
        """(broker, topic, queue) -> [(time, lag)] for ``group``."""
        with self._lock:
            return {(b, t, q): list(series) for (b, g, t, q), series in self.lag.items() if g == group}

    def rate(self, broker: str, topic: str) -> float | None:
        """Messages stored per second on ``topic`` of ``broker`` between the last two samples."""
        with self._lock:
            series = self.offsets.get((broker, topic))
            if series is None or len(series) < 2:
                return None
            (t0, v0), (t1, v1) = series[-2], series[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else None
