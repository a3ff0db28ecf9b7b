"""delay_wheel behaviour on real files and a ManualClock: timing, order, hours, cancel, restart."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugmq.broker.components import open_delay_scheduler, plugin_declaration
from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    DelayScheduler,
    DelayUnsupportedError,
    ManualClock,
    Prop,
    encode_msg_id,
)
from plugmq.plugins.delay_wheel.scheduler import WheelDelayScheduler

HOUR = 3600


class Sink:
    """The broker's write-back, reduced to a list: what was delivered, when."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.delivered: list[tuple[int, AppendRequest]] = []
        self.fail_next = 0

    def __call__(self, request: AppendRequest) -> AppendResult:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("store refused the write (test)")
        self.delivered.append((self.clock.now_ms(), request))
        return AppendResult(AppendStatus.PUT_OK, "0" * 32, len(self.delivered) - 1, 0, 1, self.clock.now_ms())

    def uids(self) -> list[str]:
        return [r.properties[Prop.UNIQ_KEY] for _, r in self.delivered]

    def was_delivered(self, request: AppendRequest) -> bool:
        return request.properties[Prop.UNIQ_KEY] in self.uids()


def request(uid: str, deliver_at_ms: int, topic: str = "orders", **props: str) -> AppendRequest:
    return AppendRequest(
        topic=topic, queue_id=3, body=f"body-{uid}".encode(), tags_code=77, born_timestamp_ms=123,
        born_host="10.0.0.9:4567", reconsume_times=2, sys_flag=0,
        properties={Prop.UNIQ_KEY: uid, Prop.DELIVER_AT_MS: str(deliver_at_ms), Prop.TAGS: "TagA", **props},
    )


def open_wheel(data_dir: Path, clock: ManualClock, sink: Sink, **options: Any) -> WheelDelayScheduler:
    wheel = open_delay_scheduler("delay_wheel", data_dir, deliver=sink, clock=clock,
                                 was_delivered=sink.was_delivered, options=options)
    assert isinstance(wheel, WheelDelayScheduler)
    return wheel


def next_deadline(clock: ManualClock) -> float:
    """When the clock's next timer is due (one is armed)."""
    deadline = clock.next_deadline()
    assert deadline is not None, "no timer armed"
    return deadline


def put(wheel: DelayScheduler, clock: ManualClock, uid: str, delay_ms: int, **props: str) -> tuple[str, int]:
    at = clock.now_ms() + delay_ms
    return wheel.schedule(request(uid, at, **props), deliver_at_ms=at, delay_level=None).msg_id, at


@pytest.fixture
def sink(clock: ManualClock) -> Sink:
    return Sink(clock)


def test_declaration_and_capabilities() -> None:
    decl = plugin_declaration("delay_wheel")
    caps = decl.capabilities
    assert caps.cancel and caps.arbitrary_delay and caps.levels_ms is None
    assert caps.max_delay_ms >= 2 * 365 * 86_400_000 and caps.resolution_ms == 1 and not caps.clamps


def test_never_early_lateness_within_one_tick_and_props_cleared(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    due = {}
    for i, delay in enumerate([1, 999, 1000, 1001, 2500, 59_999, 61_000, 3_599_999, 3_600_001]):
        _, due[f"m{i}"] = put(wheel, clock, f"m{i}", delay, color="red")
    clock.advance(0.4)
    put(wheel, clock, "late-comer", 250, color="red")
    due["late-comer"] = clock.now_ms() + 250
    for _ in range(3700):
        clock.advance(1.0)
    assert sorted(sink.uids()) == sorted(due)
    for at_ms, req in sink.delivered:
        uid = req.properties[Prop.UNIQ_KEY]
        assert at_ms == due[uid], uid  # the millisecond level: exactly on time on a ManualClock
        assert Prop.DELIVER_AT_MS not in req.properties and Prop.DELAY_LEVEL not in req.properties
        assert req.properties["color"] == "red" and req.properties[Prop.TAGS] == "TagA"
        assert (req.topic, req.queue_id, req.body) == ("orders", 3, f"body-{uid}".encode())
        assert (req.tags_code, req.born_timestamp_ms, req.born_host, req.reconsume_times) == (77, 123, "10.0.0.9:4567", 2)
    metrics = wheel.metrics()
    assert metrics["delivered"] == len(due) and metrics["pending"] == 0
    assert metrics["late_ms_max"] == 0 and metrics["late_ms_p99"] == 0
    wheel.close()


def test_past_or_now_goes_to_the_next_millisecond(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    clock.advance(0.25)
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    clock.run_due()
    put(wheel, clock, "past", -10_000)
    put(wheel, clock, "now", 0)
    clock.run_due()
    assert sink.uids() == []
    clock.advance(0.001)
    assert sink.uids() == ["past", "now"]
    assert [at for at, _ in sink.delivered] == [clock.now_ms()] * 2
    wheel.close()


def test_order_is_deliver_millisecond_then_insertion(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    base = (clock.now_ms() // 1000 + 50) * 1000
    due = {}
    for i in range(300):
        # deliver times scattered inside one second (several per millisecond), other seconds interleaved
        at = base + (i * 7919) % 100 * 10
        due[f"s{i:03d}"] = at
        wheel.schedule(request(f"s{i:03d}", at), deliver_at_ms=at, delay_level=None)
        wheel.schedule(request(f"other{i}", base + 1000 + i), deliver_at_ms=base + 1000 + i, delay_level=None)
    clock.set(base / 1000 - 0.001)
    assert sink.uids() == []
    for _ in range(1000):  # one millisecond at a time through the second
        clock.advance(0.001)
        assert all(due[u] == at for at, r in sink.delivered for u in [r.properties[Prop.UNIQ_KEY]])
    assert sink.uids() == sorted(due, key=lambda u: (due[u], u))
    clock.advance(1)
    assert sink.uids()[300:] == [f"other{i}" for i in range(300)]
    wheel.close()


def test_a_burst_in_one_second_goes_out_in_store_batches(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    batches: list[int] = []

    def deliver_batch(requests: Sequence[AppendRequest]) -> list[AppendResult]:
        batches.append(len(requests))
        return [sink(r) for r in requests]

    wheel = open_delay_scheduler("delay_wheel", tmp_path, deliver=sink, deliver_batch=deliver_batch, clock=clock,
                                 was_delivered=sink.was_delivered, options={"dispatch_batch": 500})
    wheel.start()
    at = clock.now_ms() + 20_000
    for i in range(2100):
        put(wheel, clock, f"b{i:04d}", at - clock.now_ms() + i % 3)
    clock.advance(19.99)  # preloaded and sorted ahead of time
    assert wheel.metrics()["index_entries_preloaded"] == 2100 and not sink.delivered
    clock.advance(0.01)
    assert batches == [500, 200]  # the first millisecond: 700 messages in one second's batches
    clock.advance(0.002)
    assert sum(batches) == 2100 and max(batches) <= 500
    assert sink.uids() == sorted(sink.uids(), key=lambda u: (int(u[1:]) % 3, u))
    assert wheel.metrics()["batches"] == len(batches)
    wheel.close()


def test_many_seconds_over_hours_and_idle_wheel_sets_one_timer(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    _, due = put(wheel, clock, "far", (2 * HOUR + 5 * 60) * 1000 + 7)
    clock.run_due()  # start()'s first callback
    # No spinning through 7,500 empty seconds: one timer, when the message's second is preloaded
    # (preload_seconds ahead), then one at its millisecond.
    armed = wheel.metrics()["timers_armed"]
    assert int(next_deadline(clock) * 1000) == (due // 1000 - 10) * 1000
    clock.set(next_deadline(clock))
    assert int(next_deadline(clock) * 1000) == due and wheel.metrics()["timers_armed"] == armed + 1
    clock.set(due / 1000)
    assert sink.uids() == ["far"] and sink.delivered[0][0] == due
    # then one more: the hour wheel's step at the end of that hour, which moves the window on
    assert wheel.metrics()["timers_armed"] == armed + 2
    assert clock.next_deadline() == (clock.now_ms() // 1000 // HOUR + 1) * HOUR
    assert len(wheel.hours_on_disk()) == 1
    assert wheel.clean_expired(clock.now_ms()) == 0  # not over yet
    clock.set(next_deadline(clock))
    assert clock.next_deadline() is None and len(wheel.hours_on_disk()) == 1
    assert wheel.clean_expired(clock.now_ms()) == 3  # log, index, heads (no cancel log: nothing cancelled)
    assert wheel.hours_on_disk() == [] and wheel.clean_expired(clock.now_ms()) == 0
    expected = []
    for i in range(300):
        delay = (i * 37_003) % (6 * HOUR * 1000) + 1000
        put(wheel, clock, f"n{i}", delay)
        expected.append((clock.now_ms() + delay, i))
    clock.advance(6 * HOUR + 2)
    assert sink.uids()[1:] == [f"n{i}" for _, i in sorted(expected)]
    seconds = {ms // 1000 for ms, _ in expected}
    assert wheel.metrics()["timers_armed"] <= armed + 3 + 2 * len(seconds) + len({s // HOUR for s in seconds})
    wheel.close()


def _mapped_hour_files(data_dir: Path) -> set[str]:
    with open("/proc/self/maps") as maps:
        return {Path(line.split()[-1]).name for line in maps if str(data_dir) in line}


def test_hour_boundary_maps_only_the_nearest_two_hours(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    start_hour = clock.now_ms() // 1000 // HOUR
    for h in range(1, 7):
        for k in range(3):
            put(wheel, clock, f"h{h}-{k}", (h * HOUR + 100 * k) * 1000)
    hours = wheel.hours_on_disk()
    assert len(hours) == 6 and hours[0] > start_hour
    assert wheel.mapped_hours() == hours[:2]
    assert {name.split(".")[0] for name in _mapped_hour_files(tmp_path)} == {f"{h:010d}" for h in hours[:2]}
    wheel.start()
    seen_windows = []
    for _ in range(7 * 12):
        clock.advance(HOUR / 12)
        mapped = wheel.mapped_hours()
        assert len(mapped) <= 2
        tick_hour = int(wheel.metrics()["tick"]) // HOUR
        assert mapped == [h for h in wheel.hours_on_disk() if h >= tick_hour][:2]
        assert {n.split(".")[0] for n in _mapped_hour_files(tmp_path)} == {f"{h:010d}" for h in mapped}
        seen_windows.append(tuple(mapped))
    assert len(sink.uids()) == 18
    assert len(set(seen_windows)) >= 6  # the window really moved hour by hour
    # retention: every hour the tick passed goes at the next clean
    assert wheel.clean_expired(clock.now_ms()) == 6 * 3
    assert wheel.hours_on_disk() == [] and list((tmp_path / "delay_wheel" / "hours").iterdir()) == []
    wheel.close()


def test_a_nearer_hour_displaces_the_farther_mapped_one(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    put(wheel, clock, "h5", 5 * HOUR * 1000)
    put(wheel, clock, "h9", 9 * HOUR * 1000)
    far = wheel.mapped_hours()
    put(wheel, clock, "h2", 2 * HOUR * 1000)
    assert wheel.mapped_hours() == sorted(wheel.hours_on_disk())[:2] and wheel.mapped_hours() != far
    clock.advance(10 * HOUR)
    assert sink.uids() == ["h2", "h5", "h9"]
    wheel.close()


def test_cancel(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    near, _ = put(wheel, clock, "near", 5_000)
    far, _ = put(wheel, clock, "far", 30 * 86_400_000)
    keep, _ = put(wheel, clock, "keep", 5_000)
    done, _ = put(wheel, clock, "done", 1_000)
    clock.advance(1)
    assert sink.uids() == ["done"]
    assert wheel.cancel(done) is False  # already delivered
    assert wheel.cancel(near) is True and wheel.cancel(near) is True
    assert wheel.cancel(far) is True
    assert wheel.cancel(encode_msg_id("127.0.0.1:10911", ((1 << 20) << 32) | 5)) is False  # unknown hour
    assert wheel.cancel(encode_msg_id("127.0.0.1:10911", (int(near[16:], 16) | 999))) is False  # unknown index
    assert wheel.cancel(encode_msg_id("10.1.1.1:10911", int(keep[16:], 16))) is False  # another broker
    assert wheel.pending() == 1
    wheel.close()
    # the cancel survives a restart
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    assert wheel.pending() == 1
    clock.advance(31 * 86_400)
    assert sink.uids() == ["done", "keep"]
    assert wheel.metrics()["cancelled"] == 0 and wheel.pending() == 0
    wheel.close()


def test_clean_restart_mid_second_resumes_at_tick_and_local_index(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    for i in range(10):
        put(wheel, clock, f"a{i}", 2_000)
    for i in range(10):
        put(wheel, clock, f"b{i}", 3 * HOUR * 1000)
    sink.fail_next = 0

    class Stop(BaseException):
        pass

    calls = 0
    original = sink.__call__

    def deliver_then_stop(req: AppendRequest) -> AppendResult:
        nonlocal calls
        calls += 1
        if calls == 5:
            wheel.close()  # a clean shutdown in the middle of a second
            raise Stop
        return original(req)

    wheel._deliver = deliver_then_stop
    with pytest.raises(Stop):
        clock.advance(2)
    assert sink.uids() == [f"a{i}" for i in range(4)]
    wheel = open_wheel(tmp_path, clock, sink)
    assert wheel.pending() == 16  # the interrupted batch was settled with was_delivered on opening
    wheel.start()
    clock.run_due()
    assert sink.uids() == [f"a{i}" for i in range(10)]
    clock.advance(3 * HOUR)
    assert sink.uids()[10:] == [f"b{i}" for i in range(10)]
    wheel.close()


def test_overdue_at_start_delivered_oldest_first_with_lateness_metrics(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    order = []
    for i, delay_s in enumerate([7000, 10, 3 * HOUR, 200, 9000, 60, 2 * HOUR]):
        put(wheel, clock, f"o{i}", delay_s * 1000)
        order.append((delay_s, f"o{i}"))
    put(wheel, clock, "future", 10 * HOUR * 1000)
    wheel.close()
    clock.advance(4 * HOUR)  # the broker is down
    wheel = open_wheel(tmp_path, clock, sink)
    assert sink.uids() == []
    wheel.start()
    assert sink.uids() == []  # start() returns at once; the backlog goes out on the clock's thread
    clock.run_due()
    assert sink.uids() == [uid for _, uid in sorted(order)]
    metrics = wheel.metrics()
    assert metrics["overdue_at_start"] == 7 and metrics["pending"] == 1
    assert metrics["late_ms_max"] == (4 * HOUR - 10) * 1000
    assert metrics["late_ms_p50"] >= HOUR * 1000
    clock.advance(6 * HOUR)
    assert sink.uids()[-1] == "future"
    wheel.close()


def test_dead_letter_for_messages_overdue_beyond_the_limit(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    options = {"dead_letter_older_than_ms": HOUR * 1000}
    wheel = open_wheel(tmp_path, clock, sink, **options)
    put(wheel, clock, "very-late", 10_000)
    put(wheel, clock, "a-bit-late", (2 * HOUR - 60) * 1000)
    put(wheel, clock, "on-time", 3 * HOUR * 1000)
    wheel.close()
    clock.advance(2 * HOUR)
    wheel = open_wheel(tmp_path, clock, sink, **options)
    wheel.start()
    clock.advance(HOUR)
    topics = [(r.properties[Prop.UNIQ_KEY], r.topic, r.queue_id) for _, r in sink.delivered]
    assert topics == [("very-late", "%DLQ%DELAY", 0), ("a-bit-late", "orders", 3), ("on-time", "orders", 3)]
    dlq = sink.delivered[0][1]
    assert dlq.properties[Prop.REAL_TOPIC] == "orders" and dlq.properties[Prop.REAL_QUEUE_ID] == "3"
    assert Prop.DELIVER_AT_MS not in dlq.properties
    assert wheel.metrics()["dead_lettered"] == 1 and wheel.metrics()["delivered"] == 2
    wheel.close()


def test_refuse_or_clamp_over_the_maximum(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path / "refuse", clock, sink, max_delay_ms=60_000)
    assert not wheel.capabilities.clamps and wheel.capabilities.max_delay_ms == 60_000
    with pytest.raises(DelayUnsupportedError, match="max_delay_ms"):
        put(wheel, clock, "too-far", 60_001)
    put(wheel, clock, "edge", 60_000)
    assert wheel.pending() == 1
    wheel.close()
    wheel = open_wheel(tmp_path / "clamp", clock, sink, max_delay_ms=60_000, clamp_to_max_delay=True)
    assert wheel.capabilities.clamps
    wheel.start()
    put(wheel, clock, "clamped", 10 * HOUR * 1000)
    clock.advance(59.999)
    assert sink.uids() == []
    clock.advance(0.001)
    assert sink.uids() == ["clamped"] and wheel.metrics()["clamped"] == 1
    wheel.close()


def test_two_year_delay_without_rewriting(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    two_years_ms = 2 * 365 * 86_400_000
    msg_id, at = put(wheel, clock, "patient", two_years_ms)
    put(wheel, clock, "soon", 1_000)
    assert len(wheel.hours_on_disk()) == 2  # files only for hours that hold messages
    log_file = tmp_path / "delay_wheel" / "hours" / f"{at // 1000 // HOUR:010d}.log"
    clock.advance(1)
    wheel.close()
    inode, record = os.stat(log_file).st_ino, log_file.read_bytes()
    clock.advance(365 * 86_400)
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    # never rewritten: same file, same bytes (mapping may only preallocate a zero tail)
    assert os.stat(log_file).st_ino == inode and log_file.read_bytes()[:len(record)] == record
    clock.set(at / 1000 - 0.001)
    assert sink.uids() == ["soon"]
    clock.set(at / 1000)
    # timers: the hour step, the preload ahead of each second, the second itself
    assert sink.uids() == ["soon", "patient"] and wheel.metrics()["timers_armed"] <= 4
    assert wheel.cancel(msg_id) is False
    wheel.close()


def test_failed_write_back_is_retried_not_lost_or_duplicated(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink, retry_after_error_ms=5_000)
    wheel.start()
    for i in range(3):
        put(wheel, clock, f"r{i}", 1_000)
    sink.fail_next = 1
    clock.advance(1)
    assert sink.uids() == [] and wheel.metrics()["deliver_errors"] == 1
    clock.advance(4.9)
    assert sink.uids() == []
    clock.advance(0.1)
    assert sink.uids() == ["r0", "r1", "r2"]
    wheel.close()


class Crash(BaseException):
    """Stands in for the process dying inside the broker's write-back (real kills: test_delay_wheel_crash)."""


@pytest.mark.parametrize("reached_store", [True, False])
def test_in_doubt_delivery_settled_by_was_delivered(tmp_path: Path, clock: ManualClock, sink: Sink,
                                                     reached_store: bool) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    for i in range(4):
        put(wheel, clock, f"d{i}", 2_000)
    original = Sink.__call__

    def dying(self: Sink, req: AppendRequest) -> AppendResult:
        if req.properties[Prop.UNIQ_KEY] == "d2":
            if reached_store:
                original(self, req)
            raise Crash
        return original(self, req)

    wheel._deliver = dying.__get__(sink)
    with pytest.raises(Crash):
        clock.advance(2)
    # the dead process never closed anything; a new one opens the same files
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    clock.run_due()
    assert sink.uids() == ["d0", "d1", "d2", "d3"]
    # the whole batch d0..d3 was in doubt; the broker's store says which of it got there
    found = 3 if reached_store else 2
    metrics = wheel.metrics()
    assert (metrics["in_doubt_found_delivered"], metrics["in_doubt_redelivered"]) == (found, 4 - found)
    wheel.close()


def test_without_was_delivered_an_in_doubt_message_is_redelivered(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_delay_scheduler("delay_wheel", tmp_path, deliver=sink, clock=clock)
    assert wheel.capabilities.no_duplicates_after_restart is False
    wheel.start()
    put(wheel, clock, "x", 1_000)

    def dying(req: AppendRequest) -> AppendResult:
        sink(req)
        raise Crash

    wheel._deliver = dying  # type: ignore[attr-defined]
    with pytest.raises(Crash):
        clock.advance(1)
    wheel = open_delay_scheduler("delay_wheel", tmp_path, deliver=sink, clock=clock)
    wheel.start()
    clock.run_due()
    assert sink.uids() == ["x", "x"]  # documented: no callback, assume not delivered
    wheel.close()


def test_torn_append_is_adopted_and_lost_head_file_is_rebuilt(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    for i in range(20):
        put(wheel, clock, f"t{i}", 10_000 + (i % 4) * 1000)
    hour_dir = tmp_path / "delay_wheel" / "hours"
    (head,) = hour_dir.glob("*.head")
    header_bytes = head.read_bytes()[:64]
    put(wheel, clock, "t20", 10_000)
    wheel.close()
    # as if the process died after the index entry and head were written but not the header
    with open(head, "r+b") as f:
        f.write(header_bytes)
    wheel = open_wheel(tmp_path, clock, sink)
    assert wheel.pending() == 21
    wheel.close()
    head.unlink()  # lost entirely: rebuilt from the index
    wheel = open_wheel(tmp_path, clock, sink)
    assert wheel.pending() == 21
    wheel.start()
    clock.advance(14)
    expected = sorted(range(21), key=lambda i: ((i % 4) if i < 20 else 0, i))
    assert sink.uids() == [f"t{i}" for i in expected]
    wheel.close()


def test_msg_id_and_result_fields(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    at = clock.now_ms() + 5 * HOUR * 1000
    result = wheel.schedule(request("id", at), deliver_at_ms=at, delay_level=None)
    assert result.status is AppendStatus.PUT_OK and len(result.msg_id) == 32
    assert int(result.msg_id[16:], 16) >> 32 == -(-at // 1000) // HOUR
    second = wheel.schedule(request("id2", at), deliver_at_ms=at, delay_level=None)
    assert second.queue_offset == result.queue_offset + 1 and second.msg_id != result.msg_id
    assert attrs.has(type(result))
    wheel.close()


@pytest.mark.parametrize("damage", ["log-record", "index-entry"])
def test_one_corrupt_record_costs_that_record_only(tmp_path: Path, clock: ManualClock, sink: Sink, damage: str) -> None:
    wheel = open_wheel(tmp_path, clock, sink)
    for i in range(6):
        put(wheel, clock, f"c{i}", 3 * HOUR * 1000)  # one second, one chain
    put(wheel, clock, "other", 3 * HOUR * 1000 + 1000)
    wheel.close()
    hours = tmp_path / "delay_wheel" / "hours"
    if damage == "log-record":
        (log_file,) = hours.glob("*.log")
        data = bytearray(log_file.read_bytes())
        second_record = len(data) * 2 // 7  # inside c1 or c2's record
        data[second_record] ^= 0xFF
        log_file.write_bytes(bytes(data))
    else:
        (idx_file,) = hours.glob("*.idx")
        data = bytearray(idx_file.read_bytes())
        data[3 * 32 + 4] ^= 0xFF  # entry of c3: the chain from c5 back breaks there
        idx_file.write_bytes(bytes(data))
    wheel = open_wheel(tmp_path, clock, sink)
    wheel.start()
    clock.advance(3 * HOUR + 2)
    delivered = sink.uids()
    assert wheel.metrics()["corrupt_skipped"] >= 1 and wheel.pending() == 0
    assert "other" in delivered and len(delivered) == 6
    survivors = [u for u in delivered if u != "other"]
    assert survivors == sorted(survivors)  # still in insertion order
    if damage == "index-entry":
        assert "c3" not in delivered
    wheel.close()


def test_fsync_option_round_trip(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink, fsync=True)
    wheel.start()
    ids = [put(wheel, clock, f"f{i}", (i * 1_901_000) % (30 * HOUR * 1000) + 1000)[0] for i in range(40)]
    assert wheel.cancel(ids[7]) is True
    clock.advance(HOUR)
    wheel.close()
    wheel = open_wheel(tmp_path, clock, sink, fsync=True)
    wheel.start()
    clock.advance(30 * HOUR)
    assert sorted(sink.uids()) == sorted(f"f{i}" for i in range(40) if i != 7)
    wheel.close()


def test_lateness_quantiles_are_nearest_rank_bucket_edges() -> None:
    """The one quantile definition (plugmq.kit.histogram): never below the true value, at most ~6 % above."""
    from plugmq.kit.lateness import LatenessHistogram

    hist = LatenessHistogram()
    assert hist.quantile(0.99) is None and hist.figures()["late_ms_p99"] == 0
    for ms in range(1, 10_001):
        hist.record(ms)
    assert hist.max_ms == 10_000
    assert 5_000 <= hist.quantile(0.5) <= 5_000 * 1.06  # type: ignore[operator]
    assert 9_900 <= hist.quantile(0.99) <= 10_000  # type: ignore[operator]
    hist.record(-5)  # a clock step backwards is counted as on time, never as negative
    assert hist.count == 10_001 and hist.quantile(0.0) == 0


def test_a_failing_store_at_the_end_of_an_hour_waits_for_the_retry(tmp_path: Path, clock: ManualClock, sink: Sink) -> None:
    wheel = open_wheel(tmp_path, clock, sink, retry_after_error_ms=HOUR * 1000)
    wheel.start()
    to_end_of_hour = HOUR - clock.now_ms() // 1000 % HOUR
    put(wheel, clock, "edge", (to_end_of_hour - 1) * 1000)
    put(wheel, clock, "next", (to_end_of_hour + 10) * 1000)
    sink.fail_next = 1
    clock.advance(to_end_of_hour + 20)  # the hour ends while the retry is pending
    assert sink.uids() == [] and wheel.metrics()["timers_armed"] <= 4
    clock.advance(HOUR)
    assert sink.uids() == ["edge", "next"]
    wheel.close()
