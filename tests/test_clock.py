from __future__ import annotations

import threading

import pytest

from plugmq import ManualClock, SystemClock


def test_manual_clock_runs_timers_in_deadline_order_at_their_time() -> None:
    clock = ManualClock(start=100.0)
    seen: list[tuple[str, float]] = []
    clock.call_at(105, lambda: seen.append(("b", clock.now())))
    clock.call_at(102, lambda: seen.append(("a", clock.now())))
    clock.call_at(105, lambda: seen.append(("c", clock.now())))  # tie: scheduling order
    cancelled = clock.call_at(103, lambda: seen.append(("x", clock.now())))
    cancelled.cancel()
    clock.advance(4)
    assert seen == [("a", 102.0)]
    assert clock.now() == 104.0
    clock.set(110)
    assert seen == [("a", 102.0), ("b", 105.0), ("c", 105.0)]
    assert clock.now_ms() == 110_000


def test_timer_scheduled_by_a_timer_runs_in_the_same_advance() -> None:
    clock = ManualClock(start=0.0)
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(clock.now())
        if len(ticks) < 5:
            clock.call_later(1, tick)

    clock.call_later(1, tick)
    clock.advance(10)
    assert ticks == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert clock.next_deadline() is None


def test_manual_clock_refuses_going_back() -> None:
    clock = ManualClock(start=10.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(9)
    with pytest.raises(ValueError, match="seconds >= 0"):
        clock.advance(-1)


def test_manual_wait_returns_when_virtual_time_passes() -> None:
    clock = ManualClock(start=0.0)
    event = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(clock.wait(event, 5)))
    waiter.start()
    clock.advance(2)
    assert waiter.is_alive()
    clock.advance(3)
    waiter.join(timeout=10)
    assert result == [False]


def test_system_clock_runs_a_due_timer() -> None:
    clock = SystemClock()
    fired = threading.Event()
    clock.call_at(clock.now() - 1, fired.set)
    assert fired.wait(timeout=10)


def test_timer_callbacks_run_without_the_clock_lock() -> None:
    """A component lock held by one thread while it schedules, and taken by a timer callback in
    the advancing thread, must not deadlock."""
    clock = ManualClock(start=0.0)
    component = threading.Lock()
    scheduled = threading.Event()
    release = threading.Event()

    def callback() -> None:
        with component:
            pass

    clock.call_at(1, callback)

    def other_thread() -> None:
        with component:
            scheduled.set()
            release.wait(10)
            clock.call_at(5, lambda: None)  # needs the clock while holding the component lock

    worker = threading.Thread(target=other_thread)
    worker.start()
    scheduled.wait(10)
    advancer = threading.Thread(target=lambda: clock.advance(2))
    advancer.start()
    release.set()
    worker.join(10)
    advancer.join(10)
    assert not worker.is_alive() and not advancer.is_alive()
    assert clock.now() == 2.0 and clock.next_deadline() == 5.0
