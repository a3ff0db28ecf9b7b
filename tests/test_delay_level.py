"""delay_level on a real store (store_lmdb) and a ManualClock: the RocketMQ level mechanics,
clamp and refusals, restarts, overdue start-up, dead letters, failed write-backs, the offset file."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.components import open_delay_scheduler, open_store, plugin_declaration
from plugmq.core import (
    AppendRequest,
    AppendResult,
    ConfigError,
    DelayUnsupportedError,
    ManualClock,
    MessageStore,
    Prop,
    tags_code,
)
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.errors import DelayError
from plugmq.core.names import SCHEDULE_TOPIC
from plugmq.plugins.delay_level import DelayLevelOptions, LevelDelayScheduler

T0 = 1_700_000_000_000
TOPIC = "Orders"


class Bench:
    """A store, the scheduler, and the broker's write-back reduced to a recording append."""

    def __init__(self, data_dir: Path, clock: ManualClock) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.store: MessageStore | None = None
        self.scheduler: LevelDelayScheduler | None = None
        self.delivered: list[tuple[int, AppendRequest]] = []
        self.fail_next = 0
        self.seq = 0
        self.due: dict[str, int] = {}

    def open(self, start: bool = True, **options: Any) -> LevelDelayScheduler:
        if self.store is None:
            self.store = open_store("store_lmdb", self.data_dir, clock=self.clock)
        scheduler = open_delay_scheduler("delay_level", self.data_dir, deliver=self.deliver, clock=self.clock,
                                         store=self.store, was_delivered=self.was_delivered, options=options)
        assert isinstance(scheduler, LevelDelayScheduler)
        self.scheduler = scheduler
        if start:
            scheduler.start()
            self.clock.run_due()  # the catch-up of what came due while closed runs on the clock's thread
        return scheduler

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if self.store is not None:
            self.store.close()
            self.store = None

    def deliver(self, request: AppendRequest) -> AppendResult:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("disk refused the write-back (test)")
        assert self.store is not None
        result = self.store.append(request)
        self.delivered.append((self.clock.now_ms(), request))
        return result

    def was_delivered(self, request: AppendRequest) -> bool:
        assert self.store is not None
        uid = request.properties[Prop.UNIQ_KEY]
        return any(m.unique_id == uid and m.reconsume_times == request.reconsume_times
                   for m in self.store.query_by_key(request.topic, uid))

    def send(self, uid: str, level: int, **props: str) -> AppendResult:
        assert self.scheduler is not None
        levels = self.scheduler.capabilities.levels_ms or DEFAULT_DELAY_LEVELS_MS
        due = self.clock.now_ms() + levels[min(level, len(levels)) - 1]
        request = AppendRequest(
            topic=TOPIC, queue_id=self.seq % 4, body=f"body-{uid}".encode(),
            properties={Prop.UNIQ_KEY: uid, Prop.TAGS: "TagA", Prop.KEYS: f"k-{uid}", Prop.DELAY_LEVEL: str(level),
                        **props},
            tags_code=tags_code("TagA"), born_timestamp_ms=self.clock.now_ms(), born_host="10.0.0.9:4567",
            reconsume_times=self.seq % 3,
        )
        self.seq += 1
        result = self.scheduler.schedule(request, deliver_at_ms=due, delay_level=level)
        self.due[uid] = due
        return result

    def uids(self) -> list[str]:
        return [r.properties[Prop.UNIQ_KEY] for _, r in self.delivered]

    def at(self, ms: int) -> None:
        self.clock.set(ms / 1000)

    def topic_uids(self, topic: str = TOPIC) -> collections.Counter[str]:
        assert self.store is not None
        found: collections.Counter[str] = collections.Counter()
        for qid in range(self.store.queues().get(topic, 0)):
            for entry in self.store.read_queue(topic, qid, 0, 100_000):
                message = self.store.read(entry.commit_log_offset, entry.size)
                assert message is not None
                found[message.unique_id or "?"] += 1
        return found


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path, ManualClock(T0 / 1000))
    yield b
    b.close()


# -- declaration and options -------------------------------------------------------------------


def test_declaration_follows_rocketmq_defaults() -> None:
    decl = plugin_declaration("delay_level")
    caps = decl.capabilities
    assert decl.options is DelayLevelOptions
    assert caps.levels_ms == DEFAULT_DELAY_LEVELS_MS and len(caps.levels_ms) == 18
    assert (caps.cancel, caps.arbitrary_delay, caps.clamps) == (False, False, True)
    assert caps.max_delay_ms == 2 * 3_600_000 and caps.resolution_ms == 1


def test_options_shape_the_capabilities(bench: Bench) -> None:
    scheduler = bench.open(levels="2s 1m 1d", clamp_to_max_delay=False, tick_ms=100)
    caps = scheduler.capabilities
    assert caps.levels_ms == (2000, 60_000, 86_400_000) and caps.max_delay_ms == 86_400_000
    assert not caps.clamps and caps.resolution_ms == 100


@pytest.mark.parametrize("bad", [{"levels": "1s 5x"}, {"levels": ""}, {"levels": "0s"}, {"tick_ms": 0},
                                 {"clamp_to_max_delay": "yes"}, {"clamp_over_max": "yes"},
                                 {"dead_letter_topic": "bad topic"},
                                 {"dispatch_batch": 0}, {"levels": " ".join(["1s"] * 600)}])
def test_bad_options_are_config_errors(bench: Bench, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        bench.open(**bad)


def test_needs_the_brokers_store(tmp_path: Path, clock: ManualClock) -> None:
    with pytest.raises(DelayError, match="store"):
        open_delay_scheduler("delay_level", tmp_path, deliver=lambda r: None, clock=clock)  # type: ignore[arg-type, return-value]


# -- the RocketMQ mechanics --------------------------------------------------------------------


def test_stored_in_schedule_topic_queue_per_level_with_deliver_time_as_tag(bench: Bench) -> None:
    bench.open()
    result = bench.send("a", 3, color="red")
    store = bench.store
    assert store is not None
    assert store.max_offset(SCHEDULE_TOPIC, 2) == 1 and store.max_offset(TOPIC, 0) == 0
    [entry] = store.read_queue(SCHEDULE_TOPIC, 2, 0, 10)
    assert entry.tags_code == T0 + 10_000
    scheduled = store.query_by_id(result.msg_id)
    assert scheduled is not None and (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 2)
    assert scheduled.properties[Prop.REAL_TOPIC] == TOPIC and scheduled.properties[Prop.REAL_QUEUE_ID] == "0"
    assert scheduled.properties[Prop.DELAY_LEVEL] == "3" and scheduled.properties["color"] == "red"


def test_each_level_delivers_exactly_at_its_delay_never_before(bench: Bench) -> None:
    scheduler = bench.open()
    for level in range(1, 19):
        bench.send(f"l{level}", level)
    assert scheduler.pending() == 18
    for level, delay in enumerate(DEFAULT_DELAY_LEVELS_MS, start=1):
        bench.at(T0 + delay - 1)
        assert f"l{level}" not in bench.uids(), f"level {level} delivered early"
        bench.at(T0 + delay)
        assert bench.uids()[-1] == f"l{level}"
    assert [at for at, _ in bench.delivered] == [T0 + d for d in DEFAULT_DELAY_LEVELS_MS]
    assert scheduler.pending() == 0
    metrics = scheduler.metrics()
    assert metrics["delivered"] == 18 and metrics["late_ms_max"] == 0


def test_write_back_is_the_original_message_with_delay_properties_cleared(bench: Bench) -> None:
    bench.open()
    bench.send("a", 2, color="red")
    bench.at(T0 + 5000)
    [(_, got)] = bench.delivered
    assert (got.topic, got.queue_id, got.body) == (TOPIC, 0, b"body-a")
    assert dict(got.properties) == {Prop.UNIQ_KEY: "a", Prop.TAGS: "TagA", Prop.KEYS: "k-a", "color": "red"}
    assert (got.tags_code, got.born_timestamp_ms, got.born_host, got.reconsume_times) == (
        tags_code("TagA"), T0, "10.0.0.9:4567", 0)
    assert bench.topic_uids() == {"a": 1}


def test_order_within_a_level_is_send_order(bench: Bench) -> None:
    bench.open()
    for i in range(30):
        bench.send(f"m{i}", 2)
        if i % 4 == 3:
            bench.at(bench.clock.now_ms() + 250)
    bench.at(T0 + 20_000)
    assert bench.uids() == [f"m{i}" for i in range(30)]
    assert all(at == bench.due[u] for at, u in zip([a for a, _ in bench.delivered], bench.uids()))


def test_one_timer_per_level_armed_for_the_head_and_none_when_idle(bench: Bench) -> None:
    scheduler = bench.open()
    bench.send("a", 18)
    bench.send("b", 1)
    assert scheduler.metrics()["armed_timers"] == 2
    assert bench.clock.next_deadline() == pytest.approx((T0 + 1000) / 1000)
    bench.at(T0 + 1000)
    assert bench.clock.next_deadline() == pytest.approx((T0 + 7_200_000) / 1000)  # no polling in between
    bench.at(T0 + 7_200_000)
    assert bench.uids() == ["b", "a"]
    assert scheduler.metrics()["armed_timers"] == 0 and bench.clock.next_deadline() is None


def test_tick_coalesces_wake_ups_without_delivering_early(bench: Bench) -> None:
    bench.open(tick_ms=1000)
    bench.at(T0 + 300)
    bench.send("a", 1)  # due T0 + 1300, wakes at T0 + 2000
    bench.at(T0 + 1999)
    assert bench.uids() == []
    bench.at(T0 + 2000)
    assert bench.delivered == [(T0 + 2000, bench.delivered[0][1])]


def test_level_above_max_is_clamped_like_rocketmq(bench: Bench) -> None:
    scheduler = bench.open()
    bench.send("over", 25)
    store = bench.store
    assert store is not None and store.max_offset(SCHEDULE_TOPIC, 17) == 1
    [entry] = store.read_queue(SCHEDULE_TOPIC, 17, 0, 1)
    message = store.read(entry.commit_log_offset)
    assert message is not None and message.properties[Prop.DELAY_LEVEL] == "18"
    bench.at(T0 + 7_200_000 - 1)
    assert bench.uids() == []
    bench.at(T0 + 7_200_000)
    assert bench.uids() == ["over"] and scheduler.metrics()["clamped"] == 1


def test_level_above_max_refused_when_clamping_is_off(bench: Bench) -> None:
    scheduler = bench.open(clamp_to_max_delay=False, levels="1s 5s")
    with pytest.raises(DelayUnsupportedError, match="clamp_to_max_delay"):
        bench.send("over", 3)
    with pytest.raises(DelayUnsupportedError):
        scheduler.schedule(AppendRequest(TOPIC, 0, b"x", properties={Prop.UNIQ_KEY: "z"}), deliver_at_ms=T0,
                           delay_level=0)
    assert scheduler.pending() == 0 and bench.store is not None and bench.store.queues().get(SCHEDULE_TOPIC, 0) == 0


def test_arbitrary_delay_and_cancel_are_refused_naming_the_alternatives(bench: Bench) -> None:
    scheduler = bench.open()
    request = AppendRequest(TOPIC, 0, b"x", properties={Prop.UNIQ_KEY: "x", Prop.DELIVER_AT_MS: str(T0 + 1000)})
    with pytest.raises(DelayUnsupportedError, match="delay_wheel or delay_schedule"):
        scheduler.schedule(request, deliver_at_ms=T0 + 1000, delay_level=None)  # equals level 1: still refused
    result = bench.send("a", 1)
    with pytest.raises(DelayUnsupportedError, match="delay_wheel or delay_schedule"):
        scheduler.cancel(result.msg_id)
    bench.at(T0 + 1000)
    assert bench.uids() == ["a"] and scheduler.pending() == 0


def test_full_batches_continue_at_once_and_persist_each(bench: Bench) -> None:
    scheduler = bench.open(dispatch_batch=10)
    for i in range(95):
        bench.send(f"m{i}", 1)
    before = scheduler.metrics()["offset_persists"]
    bench.at(T0 + 1000)
    assert bench.uids() == [f"m{i}" for i in range(95)]
    assert {at for at, _ in bench.delivered} == {T0 + 1000}
    assert scheduler.metrics()["offset_persists"] - before == 10


# -- failures, restarts, start-up --------------------------------------------------------------


def test_failed_write_back_is_retried_without_loss_or_repeat(bench: Bench) -> None:
    scheduler = bench.open(retry_after_error_ms=3000)
    for i in range(5):
        bench.send(f"m{i}", 1)
    bench.fail_next = 1
    bench.at(T0 + 1000)
    assert bench.uids() == [] and scheduler.metrics()["deliver_errors"] == 1
    bench.at(T0 + 3999)
    assert bench.uids() == []
    bench.at(T0 + 4000)
    assert bench.uids() == [f"m{i}" for i in range(5)] and scheduler.pending() == 0


def test_clean_restart_keeps_offsets_and_pending(bench: Bench) -> None:
    scheduler = bench.open()
    for i in range(10):
        bench.send(f"m{i}", 1 + i % 3)
    bench.at(T0 + 5000)
    delivered = bench.uids()
    assert len(delivered) == 7 and scheduler.pending() == 3
    bench.close()
    assert (bench.data_dir / "delay_level" / "offsets.bin").stat().st_size > 0
    scheduler = bench.open()
    assert scheduler.pending() == 3 and bench.uids() == delivered
    bench.at(T0 + 10_000)
    assert bench.topic_uids() == collections.Counter(f"m{i}" for i in range(10))


def test_in_doubt_deliveries_are_settled_with_the_store(bench: Bench) -> None:
    """What a crash between write-back and offset persist leaves: the store has the copies."""
    bench.open()
    for i in range(6):
        bench.send(f"m{i}", 1)
    bench.close()
    bench.store = open_store("store_lmdb", bench.data_dir, clock=bench.clock)
    for i in range(4):  # the killed process had written these back, but not its offset
        bench.store.append(AppendRequest(TOPIC, i % 4, f"body-m{i}".encode(),
                                         properties={Prop.UNIQ_KEY: f"m{i}"}, reconsume_times=i % 3))
    bench.at(T0 + 1000)
    scheduler = bench.open()
    assert scheduler.metrics()["in_doubt_settled"] == 4
    assert bench.uids() == ["m4", "m5"]
    assert bench.topic_uids() == collections.Counter(f"m{i}" for i in range(6))


def test_a_retry_copy_is_not_mistaken_for_the_first_delivery(bench: Bench) -> None:
    bench.open()
    bench.send("m0", 1)  # reconsume_times 0
    bench.close()
    bench.store = open_store("store_lmdb", bench.data_dir, clock=bench.clock)
    bench.store.append(AppendRequest(TOPIC, 0, b"other", properties={Prop.UNIQ_KEY: "m0"}, reconsume_times=5))
    bench.at(T0 + 1000)
    scheduler = bench.open()
    assert scheduler.metrics()["in_doubt_settled"] == 0 and bench.uids() == ["m0"]


def test_overdue_at_start_oldest_first_across_levels_with_lateness(bench: Bench) -> None:
    bench.open(levels="10s 20s 30s")
    for i in range(9):
        bench.send(f"m{i}", 3 - i % 3)  # 30s, 20s, 10s, 30s, ... so levels interleave by deliver time
        bench.at(bench.clock.now_ms() + 700)
    assert bench.uids() == []
    bench.close()
    bench.at(T0 + 60_000)
    scheduler = bench.open(levels="10s 20s 30s")
    got = bench.uids()
    assert sorted(got) == [f"m{i}" for i in range(9)]
    assert [bench.due[u] for u in got] == sorted(bench.due.values())
    metrics = scheduler.metrics()
    assert metrics["overdue_at_start"] == 9
    assert metrics["late_at_start_ms_max"] == T0 + 60_000 - min(bench.due.values())


def test_start_returns_before_the_overdue_backlog_goes_out(bench: Bench) -> None:
    bench.open()
    for i in range(50):
        bench.send(f"m{i}", 1 + i % 2)
    bench.close()
    bench.at(T0 + 3_600_000)
    scheduler = bench.open(start=False)
    scheduler.start()
    assert bench.uids() == [] and scheduler.pending() == 50  # nothing delivered inside start()
    bench.clock.run_due()
    assert sorted(bench.uids()) == sorted(bench.due) and scheduler.pending() == 0
    assert scheduler.metrics()["overdue_at_start"] == 50


def test_dead_letter_older_than_limit_at_start(bench: Bench) -> None:
    bench.open()
    bench.send("old", 1)  # due T0 + 1 s
    bench.send("young", 3)  # due T0 + 10 s
    bench.close()
    bench.at(T0 + 105_000)  # overdue by 104 s and 95 s
    scheduler = bench.open(dead_letter_older_than_ms=100_000)
    assert bench.uids() == ["old", "young"]
    (_, old), (_, young) = bench.delivered
    assert old.topic == "%DLQ%DELAY_LEVEL" and old.queue_id == 0
    assert old.properties[Prop.REAL_TOPIC] == TOPIC and old.properties[Prop.REAL_QUEUE_ID] == "0"
    assert young.topic == TOPIC and scheduler.metrics()["dead_lettered"] == 1
    bench.close()
    bench.open(dead_letter_older_than_ms=100_000)
    assert len(bench.delivered) == 2


def test_queues_beyond_a_shortened_level_list_are_still_served(bench: Bench) -> None:
    bench.open()
    bench.send("l5", 5)  # 1 min on the default list
    bench.close()
    scheduler = bench.open(levels="1s 5s")
    assert scheduler.pending() == 1
    bench.at(T0 + 60_000)
    assert bench.uids() == ["l5"]


def test_offset_file_survives_a_torn_slot_and_refuses_total_damage(bench: Bench) -> None:
    bench.open()
    for i in range(3):
        bench.send(f"m{i}", 1)
    bench.at(T0 + 1000)
    bench.close()
    path = bench.data_dir / "delay_level" / "offsets.bin"
    raw = bytearray(path.read_bytes())
    newest = max(range(2), key=lambda s: int.from_bytes(raw[s * 4096 + 8:s * 4096 + 16], "little"))
    raw[newest * 4096 + 20] ^= 0xFF  # tear the newest slot: the older one (taken earlier) wins
    path.write_bytes(bytes(raw))
    scheduler = bench.open()
    assert scheduler.pending() == 0 and bench.topic_uids() == {"m0": 1, "m1": 1, "m2": 1}
    bench.close()
    path.write_bytes(b"\xff" * 8192)
    with pytest.raises(DelayError, match="no valid slot"):
        bench.open()


# -- a property: any mix of levels and clock moves -------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7000)), min_size=1, max_size=40))
def test_any_schedule_is_delivered_once_never_early_in_level_order(tmp_path_factory: pytest.TempPathFactory,
                                                                    ops: list[tuple[int, int]]) -> None:
    bench = Bench(tmp_path_factory.mktemp("prop"), ManualClock(T0 / 1000))
    try:
        bench.open(levels="1s 2s 3s 7s", dispatch_batch=3)
        for i, (level, pause) in enumerate(ops):
            bench.send(f"m{i}", level)
            bench.at(bench.clock.now_ms() + pause)
            if i == len(ops) // 2:
                bench.close()
                bench.open(levels="1s 2s 3s 7s", dispatch_batch=3)
        bench.at(bench.clock.now_ms() + 7000)
        got = bench.uids()
        assert sorted(got) == sorted(bench.due) and len(set(got)) == len(got)
        for at, request in bench.delivered:
            assert at >= bench.due[request.properties[Prop.UNIQ_KEY]]
        for level in range(1, 5):
            mine = [u for u in got if ops[int(u[1:])][0] == level]
            assert mine == sorted(mine, key=lambda u: int(u[1:]))
    finally:
        bench.close()


# -- inside a broker ---------------------------------------------------------------------------


def test_inside_a_broker_levels_retries_and_refusals(tmp_path: Path, clock: ManualClock) -> None:
    from plugmq.broker.broker import Broker
    from plugmq.core import Message, MessageQueue

    with Broker.open(tmp_path, plugins=["store_lmdb", "delay_level"], clock=clock) as broker:
        broker.create_topic(TOPIC, 1)
        queue = MessageQueue(TOPIC, broker.name, 0)
        sent = broker.put(Message(TOPIC, b"later", tags="A", delay_level=2), 0)
        assert broker.max_offset(queue) == 0
        clock.advance(4.999)
        assert broker.max_offset(queue) == 0
        clock.advance(0.001)
        [got] = broker.pull(queue, 0).messages
        assert got.body == b"later" and got.unique_id == sent.unique_id and got.tags == "A"
        assert Prop.DELAY_LEVEL not in got.properties and Prop.REAL_TOPIC not in got.properties
        with pytest.raises(DelayUnsupportedError, match="delay_wheel"):
            broker.put(Message(TOPIC, b"at", deliver_at_ms=clock.now_ms() + 60_000), 0)
        with pytest.raises(DelayUnsupportedError, match="cannot cancel"):
            broker.cancel_delayed(sent.msg_id)
        broker.send_back(got, "G1")  # the default policy: level 3 + 0 = 10 s
        retry = MessageQueue("%RETRY%G1", broker.name, 0)
        clock.advance(9.999)
        assert broker.max_offset(retry) == 0
        clock.advance(0.001)
        [again] = broker.pull(retry, 0).messages
        assert again.reconsume_times == 1 and again.unique_id == sent.unique_id
