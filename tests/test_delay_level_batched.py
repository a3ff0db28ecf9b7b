"""delay_level's batched write-back (runs of scheduled messages read with ``read_entries``, one
``deliver_batch`` per run) delivers exactly what the one-by-one path delivers: the same messages in
the same order per due time, on store_mmap and store_lmdb; and a crash after a batch reached its
topic but before the level's offset moved loses and repeats nothing once reopened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.components import open_delay_scheduler, open_store
from plugmq.core import AppendRequest, AppendResult, DelayScheduler, ManualClock, MessageStore, Prop
from plugmq.core.names import SCHEDULE_TOPIC

T0 = 1_700_000_000_000
TOPIC = "Orders"
LEVELS = "1s 2s 5s"


class _Crash(BaseException):
    """The process dies right after a batch reached its topic (a BaseException: the write-back's
    failure handling does not catch it, as it could not catch a kill)."""


class Run:
    """A store, delay_level over it, and a write-back appending to the real topic (one by one, or
    in batches) that records what reached it."""

    def __init__(self, data_dir: Path, store: str, batched: bool) -> None:
        self.clock = ManualClock(T0 / 1000)
        self.data_dir = data_dir
        self.store: MessageStore = open_store(store, data_dir, clock=self.clock)
        self.batched = batched
        self.delivered: list[str] = []
        self.crash_after_batches: int | None = None
        self.store_only: int | None = None  # the next batch stores this many, then fails
        self.scheduler = self.open()

    def open(self) -> DelayScheduler:
        scheduler = open_delay_scheduler("delay_level", self.data_dir, deliver=self.deliver, clock=self.clock,
                                         store=self.store, was_delivered=self.was_delivered,
                                         deliver_batch=self.deliver_batch if self.batched else None,
                                         options={"levels": LEVELS, "dispatch_batch": 7})
        scheduler.start()
        self.clock.run_due()
        return scheduler

    def deliver(self, request: AppendRequest) -> AppendResult:
        result = self.store.append(request)
        self.delivered.append(request.properties[Prop.UNIQ_KEY])
        return result

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        if self.store_only is not None:
            part, self.store_only = requests[:self.store_only], None
            self.store.append_batch(part)
            self.delivered.extend(r.properties[Prop.UNIQ_KEY] for r in part)
            raise OSError("disk went away mid-batch")
        results = self.store.append_batch(requests)
        self.delivered.extend(r.properties[Prop.UNIQ_KEY] for r in requests)
        if self.crash_after_batches is not None:
            self.crash_after_batches -= 1
            if self.crash_after_batches <= 0:
                self.crash_after_batches = None
                raise _Crash
        return results

    def was_delivered(self, request: AppendRequest) -> bool:
        uid = request.properties[Prop.UNIQ_KEY]
        return any(m.unique_id == uid for m in self.store.query_by_key(request.topic, uid))

    def send(self, i: int, level: int) -> None:
        request = AppendRequest(TOPIC, i % 3, f"body-{i}".encode(),
                                {Prop.UNIQ_KEY: f"m{i}", Prop.KEYS: f"m{i}", Prop.TAGS: "T"})
        self.scheduler.schedule(request, deliver_at_ms=self.clock.now_ms(), delay_level=level)

    def topic(self) -> list[str]:
        """What the real topic holds, queue by queue in offset order."""
        found = []
        for qid in range(self.store.queues().get(TOPIC, 0)):
            for entry in self.store.read_queue(TOPIC, qid, 0, 100_000):
                message = self.store.read(entry.commit_log_offset, entry.size)
                assert message is not None
                found.append(message.unique_id or "?")
        return found

    def close(self) -> None:
        self.scheduler.close()
        self.store.close()


def _play(run: Run, ops: list[tuple[int, int]]) -> None:
    for i, (level, pause_ms) in enumerate(ops):
        run.send(i, level)
        run.clock.set((run.clock.now_ms() + pause_ms) / 1000)
    run.clock.set((run.clock.now_ms() + 6000) / 1000)


@pytest.mark.parametrize("store", ["store_mmap", "store_lmdb"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0, 0, 0, 1, 400, 1500])), min_size=1, max_size=60))
def test_batched_reads_and_write_back_deliver_what_one_by_one_does(tmp_path_factory: pytest.TempPathFactory,
                                                                  store: str, ops: list[tuple[int, int]]) -> None:
    one = Run(tmp_path_factory.mktemp("one"), store, batched=False)
    bulk = Run(tmp_path_factory.mktemp("bulk"), store, batched=True)
    try:
        _play(one, ops)
        _play(bulk, ops)
        assert bulk.delivered == one.delivered
        assert sorted(bulk.delivered) == sorted(f"m{i}" for i in range(len(ops)))
        assert bulk.topic() == one.topic()
        assert bulk.scheduler.metrics()["delivered"] == one.scheduler.metrics()["delivered"] == len(ops)
    finally:
        one.close()
        bulk.close()


@pytest.mark.parametrize("store", ["store_mmap", "store_lmdb"])
def test_a_crash_mid_burst_loses_and_repeats_nothing(tmp_path: Path, store: str) -> None:
    """A 200-message same-millisecond burst of one level; the process dies after the third batch
    reached the topic, before the level's offset moved past it. Reopened, the in-doubt batch is
    settled from the store and the rest follows: each message once, in send order."""
    run = Run(tmp_path, store, batched=True)
    try:
        for i in range(200):
            run.send(i, 2)
        run.crash_after_batches = 3
        with pytest.raises(_Crash):
            run.clock.set((T0 + 2000) / 1000)
        assert run.delivered == [f"m{i}" for i in range(21)]
        # The dead process's scheduler is dropped unclosed (no offset write on the way out).
        run.scheduler = run.open()
        assert run.scheduler.metrics()["in_doubt_settled"] == 7
        run.clock.set((T0 + 3000) / 1000)
        assert run.delivered == [f"m{i}" for i in range(200)]
        assert sorted(run.topic()) == sorted(f"m{i}" for i in range(200))
        assert run.scheduler.pending() == 0
    finally:
        run.close()


@pytest.mark.parametrize("store", ["store_mmap", "store_lmdb"])
def test_a_batch_stored_in_part_past_an_unreadable_entry_resumes_after_what_was_stored(tmp_path: Path,
                                                                                      store: str) -> None:
    """One batch: m0 m1, a scheduled record without its real topic, m2 m3 m4. The write-back
    stores three of the five requests, then fails: the level moves past m2 (the record without
    a topic counted missing once, not again on the retry), and the retry sends m3 m4 once."""
    run = Run(tmp_path, store, batched=True)
    try:
        for i in range(5):
            if i == 2:
                run.store.append(AppendRequest(SCHEDULE_TOPIC, 0, b"lost", {Prop.DELAY_LEVEL: "1"},
                                               tags_code=run.clock.now_ms()))  # due with the others
            run.send(i, 1)
        run.store_only = 3
        run.clock.set((T0 + 1) / 1000)  # all due (the retry comes retry_after_error_ms later)
        assert run.delivered == ["m0", "m1", "m2"]
        metrics = run.scheduler.metrics()
        assert (metrics["deliver_errors"], metrics["missing"], metrics["delivered"]) == (1, 1, 3)
        assert run.scheduler.pending() == 2
        run.clock.set((T0 + 5000) / 1000)  # past retry_after_error_ms
        assert run.delivered == [f"m{i}" for i in range(5)]
        assert sorted(run.topic()) == [f"m{i}" for i in range(5)]
        metrics = run.scheduler.metrics()
        assert (metrics["missing"], metrics["delivered"], run.scheduler.pending()) == (1, 5, 0)
    finally:
        run.close()
