"""delay_schedule (QMQ delay server) on real files with a ManualClock."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ConfigError,
    DelayContext,
    DelayUnsupportedError,
    Family,
    ManualClock,
    Prop,
    ValidationError,
    encode_msg_id,
)
from plugmq.core.errors import DelayError, PluginError
from plugmq.plugins import delay_schedule
from plugmq.plugins.delay_schedule import DelayScheduleOptions, ScheduleDelayScheduler

T0 = 1_700_000_000.0  # on a 500 ms tick boundary
HOST = "10.0.0.1:10911"


class Harness:
    """A scheduler on ``tmp_path`` whose deliver callback records (now_ms, uid, request)."""

    def __init__(self, tmp_path: Path, *, start: float = T0, **options: Any) -> None:
        self.dir = tmp_path
        self.clock = ManualClock(start)
        self.options = DelayScheduleOptions(**{"fsync": False, **options})
        self.delivered: list[tuple[int, str, AppendRequest]] = []
        self.fail_next = 0
        self.scheduler = self.open()

    def deliver(self, request: AppendRequest) -> AppendResult:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("store unavailable")
        now = self.clock.now_ms()
        self.delivered.append((now, request.properties[Prop.UNIQ_KEY], request))
        return AppendResult(AppendStatus.PUT_OK, "00" * 16, len(self.delivered), 0, 1, now)

    def context(self) -> DelayContext:
        return DelayContext(
            broker_name="b1",
            data_dir=self.dir,
            clock=self.clock,
            store_host=HOST,
            options={"delay_schedule": self.options},
            deliver=self.deliver,
            was_delivered=lambda r: r.properties[Prop.UNIQ_KEY] in self.uids(),
        )

    def open(self) -> ScheduleDelayScheduler:
        scheduler = delay_schedule.plugmq_make_delay_scheduler(self.context())
        assert isinstance(scheduler, ScheduleDelayScheduler)
        return scheduler

    def restart(self, downtime_s: float = 0.0, **options: Any) -> None:
        self.scheduler.close()
        if options:
            self.options = DelayScheduleOptions(**{"fsync": False, **options})
        self.clock.advance(downtime_s)
        self.scheduler = self.open()
        self.scheduler.start()

    def put(self, uid: str, deliver_at_ms: int, *, topic: str = "Orders", queue_id: int = 1) -> str:
        request = AppendRequest(
            topic=topic,
            queue_id=queue_id,
            body=f"body-{uid}".encode(),
            properties={Prop.UNIQ_KEY: uid, Prop.DELIVER_AT_MS: str(deliver_at_ms), "user": "p"},
            tags_code=7,
            born_timestamp_ms=123,
            born_host="10.1.1.1:5555",
            reconsume_times=2,
            sys_flag=0,
        )
        return self.scheduler.schedule(request, deliver_at_ms=deliver_at_ms, delay_level=None).msg_id

    def uids(self) -> list[str]:
        return [uid for _, uid, _ in self.delivered]

    def files(self, sub: str, pattern: str) -> list[Path]:
        return sorted((self.dir / "delay_schedule" / sub).glob(pattern))


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    harness.scheduler.start()
    yield harness
    harness.scheduler.close()


def now_ms(h: Harness) -> int:
    return h.clock.now_ms()


# ------------------------------------------------------------------------------- declaration


def test_declaration_states_capabilities() -> None:
    decl = delay_schedule.plugmq_declare()
    assert decl.name == "delay_schedule"
    assert decl.families == frozenset({Family.DELAY})
    assert decl.options is DelayScheduleOptions
    caps = decl.capabilities
    assert caps.cancel and caps.arbitrary_delay and not caps.clamps
    assert caps.max_delay_ms == 2 * 365 * 86_400_000
    assert caps.resolution_ms == 1
    assert caps.levels_ms is None


@pytest.mark.parametrize(
    "bad",
    [{"bucket_minutes": 0}, {"bucket_minutes": 61}, {"wheel_slots": 1000}, {"tick_ms": 0}, {"fsync": 1},
     {"dead_letter_topic": "bad topic"}, {"load_ahead_ms": -1}],
)
def test_options_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="plugins.delay_schedule"):
        DelayScheduleOptions(**bad)


def test_needs_a_deliver_callback(tmp_path: Path) -> None:
    context = DelayContext(broker_name="b", data_dir=tmp_path, clock=ManualClock(T0))
    with pytest.raises(PluginError, match="deliver"):
        delay_schedule.plugmq_make_delay_scheduler(context)


def test_delay_above_maximum_is_refused_or_clamped(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_delay_ms=60_000)
    h.scheduler.start()
    with pytest.raises(DelayUnsupportedError, match="max_delay_ms"):
        h.put("far", now_ms(h) + 60_001)
    h.put("edge", now_ms(h) + 60_000)
    h.restart(max_delay_ms=60_000, clamp_to_max_delay=True)
    assert h.scheduler.capabilities.clamps
    h.put("clamped", now_ms(h) + 3_600_000)
    h.clock.advance(60)
    assert h.uids() == ["edge", "clamped"]
    h.scheduler.close()


# ------------------------------------------------------------------------------- timing


def test_never_early_and_at_most_one_tick_late(h: Harness) -> None:
    rng = random.Random(7)
    base = now_ms(h)
    due = {f"m{i}": base + rng.randrange(0, 3 * 3_600_000) for i in range(400)}
    for uid, when in due.items():
        h.put(uid, when)
    while len(h.delivered) < len(due):
        h.clock.advance(rng.choice([0.3, 1.7, 13.0, 61.0, 600.0]))
    for delivered_at, uid, _ in h.delivered:
        assert due[uid] <= delivered_at < due[uid] + 500, uid
    assert h.scheduler.metrics()["late_ms_max"] < 500


def test_order_by_deliver_time_then_insertion(h: Harness) -> None:
    base = now_ms(h) + 10_000
    plan = [("a", base + 300), ("b", base + 100), ("c", base + 300), ("d", base + 100), ("e", base + 250),
            ("f", base + 1_000), ("g", base + 300)]
    for uid, when in plan:
        h.put(uid, when)
    h.clock.advance(20)
    assert h.uids() == ["b", "d", "e", "a", "c", "g", "f"]


def test_delivered_request_is_the_original_minus_delay_properties(h: Harness) -> None:
    h.put("x", now_ms(h) + 1_500, topic="Pay", queue_id=3)
    h.clock.advance(2)
    (_, _, request), = h.delivered
    assert request.topic == "Pay" and request.queue_id == 3
    assert request.body == b"body-x"
    assert dict(request.properties) == {Prop.UNIQ_KEY: "x", "user": "p"}
    assert (request.tags_code, request.born_timestamp_ms, request.born_host, request.reconsume_times) == (
        7, 123, "10.1.1.1:5555", 2)


def test_nothing_spins_while_idle(h: Harness) -> None:
    when = now_ms(h) + 5 * 86_400_000
    h.put("late", when)
    h.clock.run_due()
    # The only wake-up is the load of that far bucket, one load-ahead before it starts.
    bucket = when - when % 3_600_000
    assert h.clock.next_deadline() == (bucket - 60_000) / 1000
    assert h.scheduler.metrics()["wheel_entries"] == 0
    h.clock.set((bucket - 60_000) / 1000)
    assert h.scheduler.metrics()["wheel_entries"] == 1
    assert h.clock.next_deadline() == when / 1000


# ------------------------------------------------------------------------------- buckets and loading


@pytest.mark.parametrize("bucket_minutes", [1, 60])
def test_bucket_length_variants(tmp_path: Path, bucket_minutes: int) -> None:
    h = Harness(tmp_path, bucket_minutes=bucket_minutes, load_ahead_ms=30_000)
    h.scheduler.start()
    rng = random.Random(bucket_minutes)
    base = now_ms(h)
    due = {f"m{i}": base + rng.randrange(0, 4 * 3_600_000) for i in range(300)}
    for uid, when in due.items():
        h.put(uid, when)
    h.clock.run_due()
    bucket = bucket_minutes * 60_000
    segments = h.files("schedule_log", "*.seg")
    assert {int(p.stem) for p in segments} == {w - w % bucket for w in due.values()}
    h.clock.advance(4 * 3600 + 1)
    assert sorted(h.uids()) == sorted(due)
    assert [u for _, u, _ in h.delivered] == sorted(due, key=lambda u: (due[u], int(u[1:])))
    assert all(due[u] <= t < due[u] + 500 for t, u, _ in h.delivered)
    h.scheduler.close()


def test_segments_load_ahead_of_their_bucket(tmp_path: Path) -> None:
    h = Harness(tmp_path, bucket_minutes=60, load_ahead_ms=300_000)
    h.scheduler.start()
    hour = 3_600_000
    next_hour = (now_ms(h) // hour + 2) * hour  # a bucket well in the future
    h.put("in-far-bucket", next_hour + 1_000)
    h.clock.run_due()
    assert h.scheduler.metrics()["wheel_entries"] == 0
    h.clock.set((next_hour - 300_000 - 1) / 1000)
    assert h.scheduler.metrics()["wheel_entries"] == 0
    h.clock.set((next_hour - 300_000) / 1000)
    assert h.scheduler.metrics()["wheel_entries"] == 1
    loads = h.scheduler.metrics()["segments_loaded"]
    # A message for the already-loaded bucket goes straight into the wheel.
    h.put("joins-loaded", next_hour + 500)
    h.clock.run_due()
    m = h.scheduler.metrics()
    assert m["wheel_entries"] == 2 and m["segments_loaded"] == loads
    h.clock.set(next_hour / 1000 + 2)
    assert h.uids() == ["joins-loaded", "in-far-bucket"]
    h.scheduler.close()


# ------------------------------------------------------------------------------- cancel


def test_msg_id_is_the_message_log_offset_id(h: Harness) -> None:
    request = AppendRequest(topic="T", queue_id=0, body=b"x", properties={Prop.UNIQ_KEY: "x"})
    for _ in range(3):
        result = h.scheduler.schedule(request, deliver_at_ms=now_ms(h) + 10_000, delay_level=None)
        assert result.msg_id == encode_msg_id(HOST, result.commit_log_offset)
    assert result.queue_offset == 2 and result.status is AppendStatus.PUT_OK


def test_past_deliver_time_is_delivered_on_the_next_clock_turn(h: Harness) -> None:
    h.clock.advance(0.2)  # off the tick grid
    h.put("past", now_ms(h) - 5_000)
    h.clock.advance(0)
    assert h.delivered[0][:2] == (now_ms(h), "past")
    assert h.scheduler.metrics()["late_ms_max"] == 5_000


def test_cancel(h: Harness) -> None:
    base = now_ms(h)
    ids = {u: h.put(u, base + 10_000 * (i + 1)) for i, u in enumerate("abcde")}
    assert h.scheduler.cancel(ids["b"]) is True  # before the iterator moved it
    h.clock.run_due()
    assert h.scheduler.cancel(ids["d"]) is True  # in a loaded segment, in the wheel
    assert h.scheduler.cancel(ids["d"]) is True  # still not going to be delivered
    assert h.scheduler.pending() == 3
    h.clock.advance(15)
    assert h.uids() == ["a"]
    assert h.scheduler.cancel(ids["a"]) is False  # delivered
    assert h.scheduler.cancel(encode_msg_id(HOST, 999_999)) is False  # unknown offset
    assert h.scheduler.cancel(encode_msg_id(HOST, 1)) is False  # not a record boundary
    assert h.scheduler.cancel(encode_msg_id("10.9.9.9:1", 0)) is False  # another broker's id
    with pytest.raises(ValidationError, match="nonsense"):
        h.scheduler.cancel("nonsense")  # not a message id at all
    h.restart()
    assert h.scheduler.pending() == 2
    assert h.scheduler.cancel(ids["e"]) is True
    h.clock.advance(100)
    assert h.uids() == ["a", "c"]
    assert h.scheduler.metrics()["cancelled"] == 1  # this process's cancels


# ------------------------------------------------------------------------------- restart


def test_clean_restart_loses_and_duplicates_nothing(h: Harness) -> None:
    rng = random.Random(3)
    base = now_ms(h)
    due = {f"m{i}": base + rng.randrange(0, 2 * 3_600_000) for i in range(500)}
    for uid, when in list(due.items())[:250]:
        h.put(uid, when)
    h.clock.advance(1800)
    h.restart()
    for uid, when in list(due.items())[250:]:
        h.put(uid, max(when, now_ms(h)))
        due[uid] = max(when, now_ms(h))
    h.clock.advance(1800)
    h.restart(downtime_s=600)
    h.clock.advance(3 * 3600)
    assert sorted(h.uids()) == sorted(due)
    assert len(h.uids()) == len(set(h.uids()))
    assert all(t >= due[u] for t, u, _ in h.delivered)
    assert h.scheduler.pending() == 0


def test_overdue_messages_are_delivered_at_start_oldest_first(h: Harness) -> None:
    base = now_ms(h)
    offsets = [7_000, 1_000, 3_600_000 + 5, 90_000, 1_000, 250]
    for i, off in enumerate(offsets):
        h.put(f"m{i}", base + off)
    h.clock.run_due()
    h.scheduler.close()
    h.clock.advance(2 * 3600)
    h.scheduler = h.open()
    assert h.delivered == []
    h.scheduler.start()
    assert h.delivered == []  # start() returns at once: the backlog is loaded and delivered by timers
    h.clock.run_due()  # no clock movement: the timers are due now
    expected = sorted(range(len(offsets)), key=lambda i: (offsets[i], i))
    assert h.uids() == [f"m{i}" for i in expected]
    m = h.scheduler.metrics()
    assert m["overdue_at_start"] == len(offsets)
    assert m["start_late_ms_max"] == 2 * 3_600_000 - 250


def test_dead_letter_for_long_overdue_messages(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.scheduler.start()
    base = now_ms(h)
    h.put("old", base + 1_000)
    h.put("recent", base + 3_000_000)
    h.put("future", base + 4_000_000)
    h.clock.run_due()
    h.scheduler.close()
    h.clock.advance(3_600)
    h.options = DelayScheduleOptions(fsync=False, dead_letter_older_than_ms=1_800_000)
    h.scheduler = h.open()
    h.scheduler.start()
    h.clock.run_due()
    (_, _, old), (_, _, recent) = h.delivered
    assert old.topic == "%DLQ%DELAY_SCHEDULE" and old.queue_id == 0
    assert old.properties[Prop.REAL_TOPIC] == "Orders" and old.properties[Prop.REAL_QUEUE_ID] == "1"
    assert recent.topic == "Orders"
    assert h.scheduler.metrics()["dead_lettered"] == 1
    h.clock.advance(1_000)
    assert h.uids() == ["old", "recent", "future"] and h.delivered[2][2].topic == "Orders"
    h.scheduler.close()


def test_bucket_length_cannot_change_under_existing_data(tmp_path: Path) -> None:
    h = Harness(tmp_path, bucket_minutes=60)
    h.put("x", now_ms(h) + 10_000_000)
    h.scheduler.close()
    with pytest.raises(ConfigError, match="bucket_minutes"):
        h.options = DelayScheduleOptions(fsync=False, bucket_minutes=1)
        h.open()


def test_replay_after_lost_checkpoint_does_not_duplicate(h: Harness) -> None:
    """A crash after segment appends but before the checkpoint write makes the iterator replay
    records the segments already hold; they must be skipped."""
    base = now_ms(h)
    for i in range(50):
        h.put(f"m{i}", base + 10_000 + i * 60_000)
    h.clock.run_due()
    h.scheduler.close()
    checkpoint = h.dir / "delay_schedule" / "checkpoint.json"
    state = json.loads(checkpoint.read_text())
    assert state["iterate_offset"] > 0
    checkpoint.write_text(json.dumps({**state, "iterate_offset": 0, "next_seq": 0}))
    h.scheduler = h.open()
    h.scheduler.start()
    assert h.scheduler.pending() == 50
    h.clock.advance(3600)
    assert h.uids() == [f"m{i}" for i in range(50)]


def test_torn_tails_are_cut_at_recovery(h: Harness) -> None:
    base = now_ms(h)
    for i in range(20):
        h.put(f"m{i}", base + 5_000 + i * 1_000)
    h.clock.run_due()
    h.clock.advance(8)  # a few delivered, so the dispatch log exists
    h.scheduler.close()
    for sub, pattern in [("message_log", "*.log"), ("schedule_log", "*.seg"), ("schedule_log", "*.dispatch")]:
        (path,) = h.files(sub, pattern)
        with path.open("ab") as f:
            f.write(b"\x51\x53\x43\x31\x00\x00\x01\x00torn")
    h.scheduler = h.open()
    h.scheduler.start()
    h.put("after", now_ms(h) + 30_000)
    h.clock.advance(60)
    assert h.uids() == [f"m{i}" for i in range(20)] + ["after"]


def test_failed_delivery_is_retried_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path, retry_after_error_ms=2_000)
    h.scheduler.start()
    base = now_ms(h)
    for i in range(5):
        h.put(f"m{i}", base + 1_000 + i)
    h.clock.run_due()
    h.fail_next = 2
    h.clock.advance(1.5)
    assert h.uids() == []
    h.clock.advance(2)
    assert h.uids() == []  # the retry failed too
    h.clock.advance(2)
    assert h.uids() == [f"m{i}" for i in range(5)]
    assert h.scheduler.metrics()["deliver_failures"] == 2
    h.scheduler.close()


# ------------------------------------------------------------------------------- retention


def test_segments_are_deleted_only_when_their_dispatch_log_is_complete(tmp_path: Path) -> None:
    h = Harness(tmp_path, bucket_minutes=1, load_ahead_ms=0, message_log_segment_bytes=64 << 10)
    h.scheduler.start()
    minute = 60_000
    bucket = (now_ms(h) // minute + 2) * minute
    ids = [h.put(f"m{i}", bucket + i * 1_000, topic="Big") for i in range(30)]
    h.scheduler.cancel(ids[29])
    h.clock.run_due()
    segment = h.dir / "delay_schedule" / "schedule_log" / f"{bucket:016d}.seg"
    assert segment.exists()
    h.clock.set((bucket + 27_000) / 1000)  # 29 of 30 settled (28 delivered + 1 cancelled)
    assert len(h.delivered) == 28 and segment.exists()
    assert h.scheduler.clean_expired(now_ms(h) + 3_600_000) == 0  # one message is still to go
    h.restart()  # the state survives a restart
    assert segment.exists() and h.scheduler.pending() == 1
    h.clock.advance(1)
    assert len(h.delivered) == 29
    assert segment.exists()  # done, but only the retention pass removes it ...
    assert h.scheduler.clean_expired(bucket + minute - 1) == 0  # ... once its bucket is over
    assert h.scheduler.clean_expired(bucket + minute) >= 2
    assert not segment.exists() and not segment.with_suffix(".dispatch").exists()


def test_message_log_segments_go_once_all_their_buckets_are_done(tmp_path: Path) -> None:
    h = Harness(tmp_path, bucket_minutes=1, message_log_segment_bytes=64 << 10)
    h.scheduler.start()
    body = "x" * 2_000
    base = now_ms(h)
    pinned = h.put("pinned", base + 86_400_000)  # keeps its message-log segment for a day
    for i in range(200):
        h.put(f"m{i}{body}", base + 10_000 + i * 100)
    h.clock.run_due()
    before = len(h.files("message_log", "*.log"))
    assert before >= 5
    h.clock.advance(60)
    assert len(h.delivered) == 200
    removed = h.scheduler.clean_expired(now_ms(h))
    after = h.files("message_log", "*.log")
    assert len(after) == 2  # the pinned message's segment and the active one
    assert removed >= before - 2  # (plus the schedule segments and their dispatch logs)
    assert h.scheduler.metrics()["message_log_segments_deleted"] == before - 2
    assert h.scheduler.cancel(pinned) is True
    h.restart()
    assert h.scheduler.pending() == 0
    h.scheduler.clean_expired(base + 2 * 86_400_000)
    assert h.files("schedule_log", "*") == []
    h.scheduler.close()
    with pytest.raises(DelayError, match="closed"):
        h.scheduler.cancel(pinned)
    h.scheduler.close()


# ------------------------------------------------------------------------------- real clock, threads


def test_concurrent_producers_on_the_system_clock(tmp_path: Path) -> None:
    """Producer threads and the clock's timer thread share the scheduler; waits on an event,
    never on a sleep, and asserts no timing beyond "not before the deliver time"."""
    import threading
    import time

    from plugmq.core.clock import SystemClock

    clock = SystemClock()
    lock = threading.Lock()
    done = threading.Event()
    seen: list[tuple[int, str]] = []
    due: dict[str, int] = {}
    total = 4 * 150

    def deliver(request: AppendRequest) -> AppendResult:
        with lock:
            seen.append((time.time_ns() // 1_000_000, request.properties[Prop.UNIQ_KEY]))
            if len(seen) == total:
                done.set()
        return AppendResult(AppendStatus.PUT_OK, "00" * 16, 0, 0, 1, 0)

    context = DelayContext(broker_name="b", data_dir=tmp_path, clock=clock, deliver=deliver)
    scheduler = ScheduleDelayScheduler(context, DelayScheduleOptions(fsync=False, tick_ms=20))
    scheduler.start()

    def produce(worker: int) -> None:
        rng = random.Random(worker)
        for i in range(150):
            uid = f"w{worker}-{i}"
            when = clock.now_ms() + rng.randrange(0, 300)
            with lock:
                due[uid] = when
            request = AppendRequest(topic="T", queue_id=worker, body=b"x", properties={Prop.UNIQ_KEY: uid})
            scheduler.schedule(request, deliver_at_ms=when, delay_level=None)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done.wait(60), f"only {len(seen)} of {total} delivered"
    scheduler.close()
    assert sorted(uid for _, uid in seen) == sorted(due)
    assert all(at >= due[uid] for at, uid in seen)
