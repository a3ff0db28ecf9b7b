"""Time, behind one interface, so every time-dependent part runs on real or virtual time.

``SystemClock`` runs timers on one daemon thread. ``ManualClock`` never moves on its own:
``advance``/``set`` move it and run every due timer *in the advancing thread*, in deadline order
(ties in scheduling order), with ``now()`` equal to each timer's deadline while it runs. That is
what makes tests and simulations deterministic: no sleeping, no races with background threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs

__all__ = ["Clock", "ManualClock", "SystemClock", "Timer"]


@attrs.define(eq=False)
class Timer:
    """A scheduled callback; ``cancel()`` stops it if it has not run yet."""

    deadline: float
    callback: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@runtime_checkable
class Clock(Protocol):
    """What every time-dependent component takes. Times are seconds since the epoch (float)."""

    def now(self) -> float:
        """Current time in seconds since the epoch."""

    def now_ms(self) -> int:
        """Current time in whole milliseconds since the epoch (RocketMQ's timestamp unit)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (no wall-clock steps): for leases and timeouts.

        Only differences between two readings mean anything.
        """

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once when the clock reaches ``deadline`` (seconds since the epoch)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once ``delay`` seconds from now."""

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds of this clock's time passed.

        Returns whether the event is set.
        """


class _TimerQueue:
    """Deadline-ordered timers; ties keep scheduling order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._counter = itertools.count()

    def push(self, timer: Timer) -> None:
        heapq.heappush(self._heap, (timer.deadline, next(self._counter), timer))

    def pop_due(self, now: float) -> Timer | None:
        while self._heap:
            deadline, _, timer = self._heap[0]
            if timer.cancelled:
                heapq.heappop(self._heap)
                continue
            if deadline <= now:
                heapq.heappop(self._heap)
                return timer
            return None
        return None

    def next_deadline(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None


class ManualClock:
    """Virtual time. Starts at ``start`` (default 1_700_000_000.0) and moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._timers = _TimerQueue()
        self._lock = threading.RLock()  # guards the timer heap only, never held while a callback runs
        self._advancing = threading.RLock()  # one advance at a time; re-entrant for advance() in a timer
        self._moved = threading.Condition(self._lock)

    def now(self) -> float:
        return self._now

    def now_ms(self) -> int:
        return int(self._now * 1000)

    def monotonic(self) -> float:
        return self._now

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(float(deadline), callback)
        with self._lock:
            self._timers.push(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self._now + delay, callback)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running due timers in deadline order."""
        if seconds < 0:
            raise ValueError(f"ManualClock.advance needs seconds >= 0, got {seconds}")
        self.set(self._now + seconds)

    def set(self, when: float) -> None:
        """Move time to ``when`` (never backwards), running due timers in deadline order."""
        if when < self._now:
            raise ValueError(f"ManualClock cannot go back from {self._now} to {when}")
        with self._advancing:
            while True:
                with self._lock:
                    timer = self._timers.pop_due(when)
                    if timer is None:
                        break
                    self._now = max(self._now, timer.deadline)
                    timer.fired = True
                # Outside the heap lock: a callback may take component locks that other threads
                # hold while they schedule timers (call_at needs only the heap lock).
                timer.callback()
            with self._lock:
                self._now = max(self._now, float(when))
                self._moved.notify_all()

    def run_due(self) -> None:
        """Run timers already due at the current time (e.g. ones scheduled for 'now')."""
        self.set(self._now)

    def next_deadline(self) -> float | None:
        """Deadline of the earliest pending timer, or None."""
        with self._lock:
            return self._timers.next_deadline()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        deadline = None if timeout is None else self._now + timeout
        with self._lock:
            while not event.is_set():
                if deadline is not None and self._now >= deadline:
                    break
                # Woken by advance(); the short real timeout only notices event.set() from elsewhere.
                self._moved.wait(0.01)
        return event.is_set()


class SystemClock:
    """Wall-clock time with a single daemon thread running timers."""

    def __init__(self) -> None:
        self._timers = _TimerQueue()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return time.time()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(float(deadline), callback)
        with self._cond:
            self._timers.push(timer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="plugmq-clock", daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(time.time() + delay, callback)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                timer = self._timers.pop_due(time.time())
                if timer is None:
                    deadline = self._timers.next_deadline()
                    self._cond.wait(None if deadline is None else max(0.0, deadline - time.time()))
                    continue
            timer.fired = True
            try:
                timer.callback()
            except Exception:  # noqa: BLE001 - a failing timer must not kill every other timer
                from plugmq.core.logs import get_logger

                get_logger(__name__).exception("timer callback failed")
