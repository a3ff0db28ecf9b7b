"""delay_schedule against a reference model: a long simulated run and a hypothesis property.

The model: a message is delivered at the first tick boundary at or after its deliver time while
the scheduler runs; messages that came due while it was down are delivered on the clock's first
turn after start(), oldest first; ties by schedule order; a cancelled message is never delivered; cancel says True exactly
when the message was not delivered yet. Clock moves are whole ticks, so those rules are exact.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.core import AppendRequest, AppendResult, AppendStatus, DelayContext, ManualClock, Prop
from plugmq.plugins.delay_schedule import DelayScheduleOptions, ScheduleDelayScheduler

T0 = 1_700_000_000.0  # a multiple of every tick used here


class Model:
    def __init__(self, tick_ms: int) -> None:
        self.tick_ms = tick_ms
        self.due: dict[str, int] = {}
        self.order: dict[str, int] = {}
        self.cancelled: set[str] = set()
        self.done: set[str] = set()
        self.delivered: list[tuple[int, str]] = []

    def schedule(self, uid: str, when: int) -> None:
        self.order[uid] = len(self.order)
        self.due[uid] = when

    def _waiting(self) -> list[str]:
        return sorted(
            (u for u in self.due if u not in self.done and u not in self.cancelled),
            key=lambda u: (self.due[u], self.order[u]),
        )

    def run_until(self, now: int) -> None:
        for uid in self._waiting():
            at = -(-self.due[uid] // self.tick_ms) * self.tick_ms
            if at <= now:
                self.delivered.append((at, uid))
                self.done.add(uid)

    def start(self, now: int) -> None:
        for uid in self._waiting():
            if self.due[uid] <= now:
                self.delivered.append((now, uid))
                self.done.add(uid)

    def cancel(self, uid: str) -> bool:
        if uid in self.done:
            return False
        self.cancelled.add(uid)
        return True

    def pending(self) -> int:
        return len(self.due) - len(self.done) - len(self.cancelled)


class Real:
    def __init__(self, directory: Path, options: DelayScheduleOptions) -> None:
        self.dir = directory
        self.options = options
        self.clock = ManualClock(T0)
        self.delivered: list[tuple[int, str]] = []
        self.ids: dict[str, str] = {}
        self.scheduler = self._open()
        self.scheduler.start()
        self.clock.run_due()

    def _deliver(self, request: AppendRequest) -> AppendResult:
        assert Prop.DELIVER_AT_MS not in request.properties
        self.delivered.append((self.clock.now_ms(), request.properties[Prop.UNIQ_KEY]))
        return AppendResult(AppendStatus.PUT_OK, "00" * 16, 0, 0, 1, self.clock.now_ms())

    def _open(self) -> ScheduleDelayScheduler:
        context = DelayContext(broker_name="b", data_dir=self.dir, clock=self.clock, deliver=self._deliver)
        return ScheduleDelayScheduler(context, self.options)

    def schedule(self, uid: str, when: int) -> None:
        request = AppendRequest(
            topic="T", queue_id=0, body=uid.encode() * 20,
            properties={Prop.UNIQ_KEY: uid, Prop.DELIVER_AT_MS: str(when)},
        )
        self.ids[uid] = self.scheduler.schedule(request, deliver_at_ms=when, delay_level=None).msg_id

    def restart(self, downtime_s: float) -> None:
        self.scheduler.close()
        self.clock.advance(downtime_s)
        self.scheduler = self._open()
        self.scheduler.start()
        self.clock.run_due()


def _options(**kw: Any) -> DelayScheduleOptions:
    return DelayScheduleOptions(**{"fsync": False, "message_log_segment_bytes": 64 << 10, **kw})


@pytest.mark.parametrize("bucket_minutes", [1, 60])
def test_long_horizon_matches_the_model(tmp_path: Path, bucket_minutes: int) -> None:
    rng = random.Random(bucket_minutes)
    options = _options(bucket_minutes=bucket_minutes, load_ahead_ms=30_000)
    real, model = Real(tmp_path, options), Model(options.tick_ms)
    delays = [lambda: rng.randrange(0, 5_000), lambda: rng.randrange(0, 600_000),
              lambda: rng.randrange(0, 6 * 3_600_000), lambda: rng.randrange(0, 2 * 86_400_000)]
    n = 0
    while n < 3_000:
        now = real.clock.now_ms()
        for _ in range(rng.randrange(1, 40)):
            uid = f"m{n}"
            n += 1
            when = now + rng.choice(delays)()
            real.schedule(uid, when)
            model.schedule(uid, when)
        for _ in range(rng.randrange(0, 4)):
            uid = f"m{rng.randrange(n)}"
            if uid in model.cancelled:
                continue
            assert real.scheduler.cancel(real.ids[uid]) is model.cancel(uid), uid
        step = rng.choice([0.5, 30.0, 600.0, 3_600.0, 7_200.0])
        if rng.random() < 0.05:
            real.restart(step)
            model.start(real.clock.now_ms())
        else:
            real.clock.advance(step)
            model.run_until(real.clock.now_ms())
    real.clock.advance(3 * 86_400)
    model.run_until(real.clock.now_ms())
    assert real.clock.now_ms() - T0 * 1000 > 2 * 86_400_000  # days of simulated time
    assert len(model.delivered) > 2_500
    assert real.delivered == model.delivered
    assert real.scheduler.pending() == 0
    # Everything settled, so retention removes every segment and all but the active log.
    assert real.scheduler.clean_expired(real.clock.now_ms()) > 0
    assert list((tmp_path / "delay_schedule" / "schedule_log").iterdir()) == []
    assert len(list((tmp_path / "delay_schedule" / "message_log").glob("*.log"))) == 1
    real.scheduler.close()


_op = st.one_of(
    st.tuples(st.just("schedule"), st.integers(0, 240_000)),
    st.tuples(st.just("schedule_same_time"), st.integers(0, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    st.tuples(st.just("advance"), st.integers(0, 300)),
    st.tuples(st.just("restart"), st.integers(0, 300)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_op, min_size=1, max_size=60),
    tick_ms=st.sampled_from([1, 500, 1000]),
    load_ahead_ms=st.sampled_from([0, 10_000, 90_000]),
)
def test_random_schedule_cancel_advance_restart(ops: list[tuple[str, int]], tick_ms: int, load_ahead_ms: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        options = _options(bucket_minutes=1, tick_ms=tick_ms, load_ahead_ms=load_ahead_ms, dispatch_batch=3)
        real, model = Real(Path(tmp), options), Model(tick_ms)
        uids: list[str] = []
        for kind, arg in ops:
            now = real.clock.now_ms()
            if kind == "schedule" or (kind == "schedule_same_time" and not uids):
                uid = f"m{len(uids)}"
                real.schedule(uid, now + arg)
                model.schedule(uid, now + arg)
                uids.append(uid)
            elif kind == "schedule_same_time":
                uid = f"m{len(uids)}"
                when = model.due[uids[arg % len(uids)]]
                real.schedule(uid, max(when, now))
                model.schedule(uid, max(when, now))
                uids.append(uid)
            elif kind == "cancel" and uids:
                uid = uids[arg % len(uids)]
                if uid not in model.cancelled:
                    assert real.scheduler.cancel(real.ids[uid]) is model.cancel(uid)
            elif kind == "advance":
                real.clock.advance(arg * tick_ms / 1000)
                model.run_until(real.clock.now_ms())
            elif kind == "restart":
                real.restart(arg * tick_ms / 1000)
                model.start(real.clock.now_ms())
            assert real.delivered == model.delivered
            assert real.scheduler.pending() == model.pending()
        real.clock.advance(600)
        model.run_until(real.clock.now_ms())
        assert real.delivered == model.delivered
        assert real.scheduler.pending() == 0
        real.scheduler.close()
