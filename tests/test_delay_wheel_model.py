"""delay_wheel against a reference model (a sorted list): long horizons and random operations."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.components import open_delay_scheduler
from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ManualClock,
    Prop,
)
from plugmq.plugins.delay_wheel.scheduler import WheelDelayScheduler

HOUR = 3600
DAY = 86_400


class Model:
    """What the wheel with its millisecond level must do: due = the deliver time (or the next
    millisecond if that has passed), delivered in due order, insertion order within a
    millisecond, cancelled ones never."""

    def __init__(self) -> None:
        self.waiting: dict[str, tuple[int, int]] = {}
        self.delivered: list[str] = []
        self.cancelled: dict[str, int] = {}
        self.seq = 0

    def schedule(self, uid: str, deliver_at_ms: int, now_ms: int) -> None:
        self.waiting[uid] = (max(deliver_at_ms, now_ms + 1), self.seq)
        self.seq += 1

    def cancel(self, uid: str, now_ms: int) -> bool:
        if uid in self.waiting:
            self.cancelled[uid] = self.waiting.pop(uid)[0]
            return True
        # cancelling again answers True while the message is still not due, False afterwards
        return uid in self.cancelled and self.cancelled[uid] > now_ms

    def due(self, now_ms: int) -> list[str]:
        ready = sorted((key, uid) for uid, key in self.waiting.items() if key[0] <= now_ms)
        for _, uid in ready:
            del self.waiting[uid]
            self.delivered.append(uid)
        return [uid for _, uid in ready]


class Harness:
    """One wheel on real files plus the model, driven through the same operations."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.clock = ManualClock()
        self.model = Model()
        self.delivered: list[tuple[int, str, int]] = []
        self.ids: dict[str, str] = {}
        self.at: dict[str, int] = {}
        self.wheel = self._open()

    def _deliver(self, request: AppendRequest) -> AppendResult:
        uid = request.properties[Prop.UNIQ_KEY]
        self.delivered.append((self.clock.now_ms(), uid, self.at[uid]))
        return AppendResult(AppendStatus.PUT_OK, "0" * 32, 0, 0, 1, self.clock.now_ms())

    def _was_delivered(self, request: AppendRequest) -> bool:
        return any(uid == request.properties[Prop.UNIQ_KEY] for _, uid, _ in self.delivered)

    def _open(self) -> WheelDelayScheduler:
        wheel = open_delay_scheduler("delay_wheel", self.data_dir, deliver=self._deliver, clock=self.clock,
                                     was_delivered=self._was_delivered)
        assert isinstance(wheel, WheelDelayScheduler)
        wheel.start()
        self.clock.run_due()  # the overdue backlog goes out on the clock's first turn
        return wheel

    def schedule(self, delay_ms: int) -> None:
        uid = f"u{len(self.ids)}"
        now = self.clock.now_ms()
        at = max(0, now + delay_ms)
        self.at[uid] = at
        request = AppendRequest(topic="T", queue_id=0, body=uid.encode(), properties={Prop.UNIQ_KEY: uid})
        self.ids[uid] = self.wheel.schedule(request, deliver_at_ms=at, delay_level=None).msg_id
        self.model.schedule(uid, at, now)

    def cancel(self, pick: int) -> None:
        if not self.ids:
            return
        uid = sorted(self.ids)[pick % len(self.ids)]
        assert self.wheel.cancel(self.ids[uid]) == self.model.cancel(uid, self.clock.now_ms()), uid

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.model.due(self.clock.now_ms())
        self.check()

    def restart(self, downtime: float) -> None:
        self.wheel.close()
        self.clock.advance(downtime)
        self.wheel = self._open()
        self.model.due(self.clock.now_ms())
        self.check()

    def check(self) -> None:
        assert [uid for _, uid, _ in self.delivered] == self.model.delivered
        assert self.wheel.pending() == len(self.model.waiting)
        for when, uid, at in self.delivered:
            assert when >= at, f"{uid} delivered {at - when} ms early"

    def close(self) -> None:
        self.wheel.close()


def test_long_horizon_thousands_of_messages_over_simulated_days(tmp_path: Path) -> None:
    rng = random.Random(2024)
    h = Harness(tmp_path)
    for step in range(600):
        for _ in range(rng.randint(0, 12)):
            kind = rng.random()
            if kind < 0.5:
                delay = rng.randint(-2_000, 120_000)
            elif kind < 0.85:
                delay = rng.randint(0, 6 * HOUR * 1000)
            else:
                delay = rng.randint(0, 4 * DAY * 1000)
            h.schedule(delay)
        if rng.random() < 0.3:
            h.cancel(rng.randrange(1 << 30))
        if step % 150 == 149:
            h.restart(rng.choice([0, 30, 2 * HOUR]))
        else:
            h.advance(rng.choice([0.5, 1, 7, 60, 600, 1800]))
    assert len(h.ids) > 3000
    h.advance(5 * DAY)
    assert h.wheel.pending() == 0 and not h.model.waiting
    assert len(h.delivered) == len(h.model.delivered) > 3000
    future = [(when - at) for when, uid, at in h.delivered]
    assert max(future) <= 2 * HOUR * 1000 + 1  # at most the planned downtime plus one tick
    h.clock.advance(HOUR)
    assert h.wheel.clean_expired(h.clock.now_ms()) > 0
    assert h.wheel.hours_on_disk() == []  # everything delivered or cancelled: every hour retired
    h.close()


_delays = st.one_of(
    st.integers(-3_000, 15_000),
    st.integers(0, 3 * HOUR * 1000),
    st.integers(0, 3 * DAY * 1000),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), _delays),
        st.tuples(st.just("cancel"), st.integers(0, 1000)),
        st.tuples(st.just("advance"), st.sampled_from([0.001, 0.5, 1, 3, 59, 600, HOUR, 5 * HOUR])),
        st.tuples(st.just("restart"), st.sampled_from([0, 1, 90, 2 * HOUR])),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_random_schedule_cancel_advance_restart_match_the_model(ops: list[tuple[str, float]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp))
        for op, arg in ops:
            getattr(h, op)(arg)
        h.advance(4 * DAY)
        assert not h.model.waiting and h.wheel.pending() == 0
        h.close()
