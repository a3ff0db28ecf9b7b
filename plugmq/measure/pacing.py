"""Producers on a rate: each send has its slot on the clock.

A paced producer sends its k-th message (or batch) at ``offset + k * period`` seconds from the
run's start, not "after the previous send plus a pause": a slow send delays the next one only
until it catches up with its slot, so the offered rate holds over the run (OpenMessaging
Benchmark's producer rate). ``offset`` spreads several producers of one topic over the period,
so they do not send in lock-step. A rate of 0 means as fast as the producer can.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Pacer"]


class Pacer:
    """Slots for one producer: ``rate`` sends per second (0: no pacing) until ``horizon_s``.

    ``elapsed`` is the run's clock (seconds since its start); ``stop`` ends the run early. With
    ``producers`` producers on one rate, producer ``index`` takes the slots offset by
    ``index / producers`` of a period.
    """

    def __init__(self, rate: float, horizon_s: float, elapsed: Callable[[], float], stop: threading.Event, *,
                 index: int = 0, producers: int = 1) -> None:
        self.period = 1 / rate if rate > 0 else 0.0
        self.offset = self.period * index / max(1, producers)
        self.horizon_s = horizon_s
        self._elapsed = elapsed
        self._stop = stop
        self._k = 0

    def next(self) -> bool:
        """Wait for the next slot; False once the run is over (its horizon or its stop event)."""
        if self._stop.is_set():
            return False
        now = self._elapsed()
        if now >= self.horizon_s:
            return False
        if self.period:
            target = self.offset + self._k * self.period
            if target >= self.horizon_s:
                return False
            self._k += 1
            if target > now and self._stop.wait(target - now):
                return False
        return True
