"""delay_level reading due messages as runs (``QueueRunReading.read_queue_run``: entries and
records in one call, no ConsumeQueueEntry) delivers exactly what the entry-by-entry path
delivers, in the same order, once each; also when the store cannot vouch for some runs (it
answers None) and those stretches go entry by entry."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.components import open_delay_scheduler, open_store
from plugmq.core import AppendRequest, AppendResult, ManualClock, MessageStore, Prop, StoredMessage
from plugmq.core.contracts import QueueRunReading, has_capability

T0 = 1_700_000_000_000
TOPIC = "Orders"
# Small files (runs cross consume-queue files), watermarks off: the machine's disk is shared.
SMALL = {"commit_log_segment_size": 1 << 20, "consume_queue_entries_per_file": 64, "index_slot_count": 1021,
         "index_max_entries": 8192, "disk_max_used_ratio": 1.0, "disk_force_clean_ratio": 1.0,
         "disk_critical_ratio": 1.0}


class EntriesOnly:
    """store_mmap without ``read_queue_run``: the scheduler reads entries, then their records."""

    def __init__(self, store: MessageStore) -> None:
        self._inner = store

    def __getattr__(self, name: str) -> Any:
        if name == "read_queue_run":
            raise AttributeError(name)
        return getattr(self._inner, name)


class Unvouched(EntriesOnly):
    """store_mmap whose ``read_queue_run`` answers None ("not exact") on the calls ``refuse`` names."""

    def __init__(self, store: MessageStore, refuse: set[int]) -> None:
        super().__init__(store)
        self.refuse = refuse
        self.calls = 0

    def read_queue_run(self, topic: str, queue_id: int, offset: int, max_messages: int) -> list[StoredMessage] | None:
        self.calls += 1
        if self.calls in self.refuse:
            return None
        run: list[StoredMessage] | None = self._inner.read_queue_run(  # type: ignore[attr-defined]
            topic, queue_id, offset, max_messages)
        return run


class Run:
    """A store_mmap (seen through ``view``), delay_level over it and a batched write-back."""

    def __init__(self, data_dir: Path, view: str, refuse: set[int] | None = None, dispatch_batch: int = 50) -> None:
        self.clock = ManualClock(T0 / 1000)
        self.data_dir = data_dir
        self.raw = open_store("store_mmap", data_dir, clock=self.clock, options=SMALL)
        self.store: Any = (self.raw if view == "runs" else EntriesOnly(self.raw) if view == "entries"
                           else Unvouched(self.raw, refuse or set()))
        self.delivered: list[str] = []
        self.scheduler = open_delay_scheduler(
            "delay_level", data_dir, deliver=self.deliver, clock=self.clock, store=self.store,
            was_delivered=lambda r: False, deliver_batch=self.deliver_batch,
            options={"levels": "1s 2s 5s", "dispatch_batch": dispatch_batch})
        self.scheduler.start()
        self.clock.run_due()

    def deliver(self, request: AppendRequest) -> AppendResult:
        self.delivered.append(request.properties[Prop.UNIQ_KEY])
        return self.raw.append(request)

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> Sequence[AppendResult]:
        self.delivered.extend(r.properties[Prop.UNIQ_KEY] for r in requests)
        return self.raw.append_batch(requests)

    def play(self, ops: list[tuple[int, int]], delay_ms: int = 0) -> None:
        for i, (level, pause_ms) in enumerate(ops):
            request = AppendRequest(TOPIC, i % 3, f"body-{i}".encode(),
                                    {Prop.UNIQ_KEY: f"m{i}", Prop.TAGS: f"T{i % 2}", "n": str(i)})
            self.scheduler.schedule(request, deliver_at_ms=self.clock.now_ms() + delay_ms, delay_level=level)
            self.clock.set((self.clock.now_ms() + pause_ms) / 1000)
        self.clock.set((self.clock.now_ms() + delay_ms + 6000) / 1000)

    def topic(self) -> list[tuple[int, int, str, bytes, dict[str, str], int]]:
        """The real topic's messages, queue by queue: what a consumer sees of each."""
        found = []
        for qid in range(self.raw.queues().get(TOPIC, 0)):
            for entry in self.raw.read_queue(TOPIC, qid, 0, 100_000):
                m = self.raw.read(entry.commit_log_offset, entry.size)
                assert m is not None
                found.append((qid, m.queue_offset, m.unique_id or "?", m.body, dict(m.properties), m.tags_code))
        return found

    def close(self) -> None:
        self.scheduler.close()
        self.raw.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def test_the_views_declare_what_they_should(tmp_path: Path) -> None:
    raw = open_store("store_mmap", tmp_path, clock=ManualClock(T0 / 1000), options=SMALL)
    try:
        assert has_capability(cast(object, raw), QueueRunReading)  # (no narrowing of raw)
        assert not isinstance(EntriesOnly(raw), QueueRunReading)
        assert isinstance(Unvouched(raw, set()), QueueRunReading)
    finally:
        raw.close()


_OPS = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0, 0, 0, 0, 1, 400, 1500])), min_size=1, max_size=150)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS, refuse=st.sets(st.integers(1, 40), max_size=8), batch=st.sampled_from([1, 7, 50, 1000]))
def test_runs_deliver_what_entries_deliver(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[int, int]],
                                           refuse: set[int], batch: int) -> None:
    entries = Run(tmp_path_factory.mktemp("entries"), "entries", dispatch_batch=batch)
    runs = Run(tmp_path_factory.mktemp("runs"), "runs", dispatch_batch=batch)
    mixed = Run(tmp_path_factory.mktemp("mixed"), "unvouched", refuse, dispatch_batch=batch)
    try:
        for run in (entries, runs, mixed):
            run.play(ops)
        expected = [f"m{i}" for i in range(len(ops))]
        assert sorted(entries.delivered) == sorted(expected)
        assert runs.delivered == entries.delivered
        assert mixed.delivered == entries.delivered
        assert runs.topic() == entries.topic() == mixed.topic()
        for run in (runs, mixed):
            metrics = run.scheduler.metrics()
            assert (metrics["delivered"], metrics["missing"], run.scheduler.pending()) == (len(ops), 0, 0)
    finally:
        for run in (entries, runs, mixed):
            run.close()


def test_a_burst_read_as_runs_goes_out_once_in_order(tmp_path: Path) -> None:
    """900 messages due at once on one level: read in growing runs up to a batch of 400 each,
    every one written back once, in send order; the level's offset ends past the last."""
    run = Run(tmp_path, "runs", dispatch_batch=400)
    try:
        run.play([(2, 0)] * 900, delay_ms=2000)
        assert run.delivered == [f"m{i}" for i in range(900)]
        assert [m[2] for m in run.topic()] == [f"m{i}" for i in range(0, 900, 3)] + [
            f"m{i}" for i in range(1, 900, 3)] + [f"m{i}" for i in range(2, 900, 3)]
        assert run.scheduler.metrics()["batches"] == 3 and run.scheduler.pending() == 0
    finally:
        run.close()
