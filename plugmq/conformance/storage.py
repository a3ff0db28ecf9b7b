"""Conformance clauses of the storage family, for any MessageStore plugin.

Subclass :class:`StoreConformance` and provide one fixture, ``store_plugin``, returning a
:class:`StoreUnderTest`: the plugin's entry-point name and the options to open it with. The suite
opens, closes and reopens stores itself (``plugmq.broker.components.open_store``) under pytest's
``tmp_path`` on a ManualClock; the kill clause runs a real child process and SIGKILLs it.
Capabilities come from the plugin's declaration; a clause whose capability is not declared is a
skip that says so. The corrupted-tail clause needs the store's own ``corrupt_tail`` hook (only
the store knows its file format) and is a skip without one; it is the one clause that damages
the plugin's files on purpose (marker ``plugmq_damages_files``, listed by the runner).
"""

from __future__ import annotations

import functools
import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from plugmq.conformance._store_model import store_machine
from plugmq.conformance._store_support import (
    STORE_HOST,
    TOPIC,
    Opener,
    StoreUnderTest,
    assert_bulk_reads_as_read,
    assert_stored,
    capabilities_of,
    flip_newest_body,
    read_present,
    request,
    require,
    write_concurrently,
)
from plugmq.conformance.storage_direct import DirectAppendClauses
from plugmq.conformance.storage_durability import DurabilityClauses
from plugmq.conformance.storage_replication import ReplicationClauses
from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ConsumeQueueEntry,
    ManualClock,
    MessageStore,
    encode_msg_id,
)
from plugmq.core.contracts import BulkReading, ColumnAppending, QueueRunReading
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE

__all__ = ["StoreConformance", "StoreUnderTest", "assert_stored", "flip_newest_body"]


def _listed(append: Callable[[list[AppendRequest]], Sequence[AppendResult]],
            batch: list[AppendRequest]) -> list[AppendResult]:
    return list(append(batch))


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    """What a call answered, or the type of what it raised."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the two paths must refuse alike, whatever they refuse with
        return "raised", type(exc).__name__


class StoreConformance(DurabilityClauses, ReplicationClauses, DirectAppendClauses):
    """The storage contract. Needs the fixture ``store_plugin`` -> :class:`StoreUnderTest`.

    The durability, refusal and retention clauses come from
    :class:`plugmq.conformance.storage_durability.DurabilityClauses`, the log-shipping clauses
    (stores with the ``replication`` capability) from
    :class:`plugmq.conformance.storage_replication.ReplicationClauses`, the direct append's from
    :class:`plugmq.conformance.storage_direct.DirectAppendClauses`.
    """

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def opener(self, store_plugin: StoreUnderTest, tmp_path: Path, clock: ManualClock) -> Iterator[Opener]:
        opener = Opener(store_plugin, tmp_path / "data", clock)
        yield opener
        opener.close_all()

    # -- declaration --------------------------------------------------------------------------

    def test_declares_storage_and_satisfies_protocol(self, store_plugin: StoreUnderTest, opener: Opener) -> None:
        """The plugin declares the storage family with StoreCapabilities, and its store is a MessageStore
        with those capabilities."""
        caps = capabilities_of(store_plugin.plugin)
        store = opener()
        assert isinstance(store, MessageStore), f"{store_plugin.plugin}'s store lacks MessageStore methods"
        assert store.capabilities == caps, "the store's capabilities differ from the plugin's declaration"

    # -- round trips --------------------------------------------------------------------------

    def test_single_append_round_trip(self, opener: Opener, clock: ManualClock) -> None:
        """One append reads back exactly as requested, plus its offsets, size, store time, store host and
        message id."""
        store = opener()
        req = request(keys="order-1 order-2", uniq="UNIQ0001", tags="TagA", tags_code=-123456789,
                      born_timestamp_ms=1_600_000_000_123, born_host="192.168.0.7:5555", reconsume_times=3,
                      sys_flag=0x2, prepared_transaction_offset=77)
        res = store.append(req)
        assert res.status is AppendStatus.PUT_OK
        assert res.queue_offset == 0 and res.size > 0
        assert res.store_timestamp_ms == clock.now_ms()
        assert res.msg_id == encode_msg_id(STORE_HOST, res.commit_log_offset)
        assert_stored(store.read(res.commit_log_offset), req, res)
        assert_stored(store.read(res.commit_log_offset, res.size), req, res)

    def test_batch_append_round_trip(self, opener: Opener) -> None:
        """A batch reads back exactly, in request order, with consecutive queue offsets per queue."""
        store = opener()
        reqs = [request(queue_id=i % 3, body=f"batch-{i}".encode(), keys=f"b{i}") for i in range(10)]
        results = store.append_batch(reqs)
        assert len(results) == len(reqs)
        per_queue: dict[int, list[int]] = {}
        for req, res in zip(reqs, results):
            assert res.status is AppendStatus.PUT_OK
            per_queue.setdefault(req.queue_id, []).append(res.queue_offset)
            assert_stored(store.read(res.commit_log_offset), req, res)
        for queue_id, offsets in per_queue.items():
            assert offsets == list(range(len(offsets))), f"queue {queue_id}: batch offsets {offsets} not consecutive"
        assert store.append_batch([]) == []

    def test_append_columns_stores_what_append_batch_stores(self, store_plugin: StoreUnderTest, tmp_path: Path,
                                                            clock: ManualClock) -> None:
        """With the ColumnAppending capability: the same batches through ``append_columns`` and through
        ``append_batch`` (two stores, one clock) answer the same results, read back the same and
        refuse the same; an empty batch answers an empty AppendColumns."""
        openers = [Opener(store_plugin, tmp_path / name, clock) for name in ("batch", "columns")]
        try:
            plain, columnar = openers[0](), openers[1]()
            if not isinstance(columnar, ColumnAppending):
                pytest.skip(f"{store_plugin.plugin}'s store has no append_columns (ColumnAppending)")
            assert isinstance(plain, ColumnAppending)
            huge = request(body=b"x" * (DEFAULT_MAX_BODY_SIZE + 1))
            batches = [[request(queue_id=i % 3, body=f"c{n}-{i}".encode(), keys=f"k{i}", uniq=f"U{n}{i}", tags="T",
                                tags_code=i, born_timestamp_ms=n) for i in range(n)] for n in (1, 7, 0, 30)]
            for batch in [*batches[:2], [*batches[1], huge], *batches[2:]]:
                clock.advance(3)
                expected = _outcome(functools.partial(plain.append_batch, batch))
                got = _outcome(functools.partial(_listed, columnar.append_columns, batch))
                assert got == expected, "append_columns answered otherwise than append_batch"
            assert len(columnar.append_columns([])) == 0
            for queue_id in range(3):
                entries = plain.read_queue(TOPIC, queue_id, 0, 100)
                assert columnar.read_queue(TOPIC, queue_id, 0, 100) == entries
                assert [columnar.read(e.commit_log_offset) for e in entries] == [
                    plain.read(e.commit_log_offset) for e in entries]
        finally:
            for opener in openers:
                opener.close_all()

    def test_empty_and_max_size_bodies(self, opener: Opener) -> None:
        """Bodies from empty to the maximum size are stored and read back unchanged."""
        store = opener()
        for body in (b"", os.urandom(DEFAULT_MAX_BODY_SIZE), b"after"):
            req = request(body=body)
            res = store.append(req)
            assert_stored(store.read(res.commit_log_offset), req, res)
        store = opener.reopen(store)
        entries = store.read_queue(TOPIC, 0, 0, 10)
        assert [len(read_present(store, e.commit_log_offset).body) for e in entries] == [0, DEFAULT_MAX_BODY_SIZE, 5]

    # -- offsets ------------------------------------------------------------------------------

    def test_queue_offsets_dense_and_monotonic(self, opener: Opener) -> None:
        """Queue offsets are dense and 0-based per queue; commit-log offsets grow with every append."""
        store = opener()
        rng = random.Random(7)
        expected: dict[tuple[str, int], int] = {}
        last_clo = -1
        for i in range(60):
            topic = rng.choice([TOPIC, "OtherTopic"])
            queue_id = rng.randrange(4)
            res = store.append(request(topic, queue_id, f"m{i}".encode()))
            assert res.queue_offset == expected.get((topic, queue_id), 0), f"queue {topic}/{queue_id} skipped an offset"
            expected[(topic, queue_id)] = res.queue_offset + 1
            assert res.commit_log_offset > last_clo, "commit-log offsets must grow with every append"
            last_clo = res.commit_log_offset
        for (topic, queue_id), count in expected.items():
            assert store.max_offset(topic, queue_id) == count
            assert [e.queue_offset for e in store.read_queue(topic, queue_id, 0, 1000)] == list(range(count))

    def test_min_max_offsets_and_queues(self, opener: Opener) -> None:
        """min_offset, max_offset and queues() describe what was written; unknown queues read as empty."""
        store = opener()
        assert (store.min_offset(TOPIC, 0), store.max_offset(TOPIC, 0)) == (0, 0)
        assert store.max_offset("NeverWritten", 5) == 0
        for i in range(5):
            store.append(request(queue_id=2, body=bytes([i])))
        store.append(request("OtherTopic", 0))
        assert (store.min_offset(TOPIC, 2), store.max_offset(TOPIC, 2)) == (0, 5)
        assert store.max_offset(TOPIC, 0) == 0 and store.max_offset(TOPIC, 3) == 0
        assert dict(store.queues()) == {TOPIC: 3, "OtherTopic": 1}

    def test_read_queue_paging(self, opener: Opener) -> None:
        """read_queue pages through a queue in order; past the end, with max_entries 0 or for an unknown
        queue it is empty."""
        store = opener()
        reqs = [request(body=f"p{i}".encode(), tags_code=i * 11) for i in range(25)]
        results = [store.append(r) for r in reqs]
        seen = []
        offset = 0
        while True:
            page = store.read_queue(TOPIC, 0, offset, 7)
            if not page:
                break
            assert len(page) <= 7
            seen += page
            offset = page[-1].queue_offset + 1
        assert [e.queue_offset for e in seen] == list(range(25))
        for entry, req, res in zip(seen, reqs, results):
            assert (entry.commit_log_offset, entry.size, entry.tags_code) == (res.commit_log_offset, res.size, req.tags_code)
        assert [e.queue_offset for e in store.read_queue(TOPIC, 0, 20, 100)] == [20, 21, 22, 23, 24]
        assert store.read_queue(TOPIC, 0, 25, 10) == [] and store.read_queue(TOPIC, 0, 90, 10) == []
        assert store.read_queue(TOPIC, 0, 0, 0) == []
        assert store.read_queue(TOPIC, 1, 0, 10) == [] and store.read_queue("Nothing", 0, 0, 10) == []

    def test_bulk_read_answers_as_read(self, opener: Opener) -> None:
        """A store declaring BulkReading reads a run of entries as ``read`` reads each: across
        queues and topics, in any order, repeated, and None past the end, below 0 and off a
        record's start."""
        store = opener()
        if not isinstance(store, BulkReading):
            pytest.skip(f"{opener.sut.plugin} does not implement BulkReading (read_entries reads one by one)")
        results = [store.append(request(TOPIC if i % 5 else "OtherTopic", i % 3, body=f"bulk{i}".encode() * i,
                                        keys=f"b{i}")) for i in range(40)]
        results += store.append_batch([request(queue_id=1, body=b"batched") for _ in range(5)])
        entries = [e for qid in range(3) for e in store.read_queue(TOPIC, qid, 0, 100)]
        assert len(entries) == 37
        ahead = [e for e in entries if e.queue_offset % 4 == 0]
        runs: tuple[list[ConsumeQueueEntry], ...] = (entries, entries[::-1], ahead + ahead, [entries[0]], [])
        for run in runs:
            assert store.read_many(run) == [store.read(e.commit_log_offset, e.size) for e in run]
        last = results[-1]
        odd = [last.commit_log_offset + last.size, last.commit_log_offset + last.size + 10_000, -1, 1 << 60,
               results[3].commit_log_offset + 1]
        assert_bulk_reads_as_read(store, [r.commit_log_offset for r in results] + odd)
        assert all(m is None for m in store.read_many([attrs.evolve(entries[0], commit_log_offset=o) for o in odd]))

    def test_queue_run_answers_as_read_queue_and_read(self, opener: Opener) -> None:
        """A store declaring QueueRunReading reads a run of a sound queue as ``read_queue`` then
        ``read`` would: from any offset (below the start: from the start), any length, across
        queues and topics, [] past the end and for queues it does not hold."""
        store = opener()
        if not isinstance(store, QueueRunReading):
            pytest.skip(f"{opener.sut.plugin} does not implement QueueRunReading (pulls read entries, then records)")
        for i in range(30):
            store.append(request(TOPIC if i % 4 else "OtherTopic", i % 2, body=f"run{i}".encode() * i, keys=f"r{i}"))
        store.append_batch([request(queue_id=1, body=b"batched") for _ in range(6)])
        for topic, queue_id in ((TOPIC, 0), (TOPIC, 1), ("OtherTopic", 0), ("OtherTopic", 1)):
            end = store.max_offset(topic, queue_id)
            for offset, wanted in ((0, 100), (0, 1), (2, 3), (end - 1, 5), (-3, 2)):
                expected = [store.read(e.commit_log_offset, e.size) for e in store.read_queue(topic, queue_id, offset, wanted)]
                run = store.read_queue_run(topic, queue_id, offset, wanted)
                assert run == expected, f"{topic}/{queue_id} from {offset}, {wanted} wanted"
                assert all(m.queue_offset == e for m, e in zip(run or [], range(max(offset, 0), end)))
            assert store.read_queue_run(topic, queue_id, end, 10) == []
        assert store.read_queue_run(TOPIC, 7, 0, 10) == [] and store.read_queue_run("Nothing", 0, 0, 10) == []

    # -- queries ------------------------------------------------------------------------------

    def test_query_by_id_and_unknown_ids(self, opener: Opener) -> None:
        """query_by_id finds a message by its id in one read, and answers None for unknown ids and ids past
        the end."""
        store = opener()
        pairs = [(r, store.append(r)) for r in (request(body=f"id{i}".encode()) for i in range(5))]
        for req, res in pairs:
            assert_stored(store.query_by_id(res.msg_id), req, res)
        last = pairs[-1][1]
        assert store.query_by_id(encode_msg_id(STORE_HOST, last.commit_log_offset + last.size + 10_000)) is None
        assert store.read(last.commit_log_offset + last.size + 10_000) is None
        assert store.read(1 << 60) is None

    def test_query_by_key_and_time_range(self, opener: Opener, clock: ManualClock) -> None:
        """query_by_key finds messages by key and unique id within an inclusive store-time range, at most
        max_results."""
        require(opener.sut, "query_by_key")
        store = opener()
        stamps = []
        written: list[tuple[AppendRequest, AppendResult]] = []
        for i in range(6):
            req = request(queue_id=i % 2, body=f"k{i}".encode(), keys=f"shared own{i}", uniq=f"UNIQ{i:04d}")
            written.append((req, store.append(req)))
            stamps.append(clock.now_ms())
            clock.advance(10)
        store.append(request("OtherTopic", keys="shared"))
        found = store.query_by_key(TOPIC, "shared")
        assert sorted(m.commit_log_offset for m in found) == [res.commit_log_offset for _, res in written]
        by_offset = {res.commit_log_offset: (req, res) for req, res in written}
        for message in found:
            assert_stored(message, *by_offset[message.commit_log_offset])
        own3 = store.query_by_key(TOPIC, "own3")
        assert [m.body for m in own3] == [b"k3"]
        assert [m.body for m in store.query_by_key(TOPIC, "UNIQ0004")] == [b"k4"], "unique ids are keys too"
        ranged = store.query_by_key(TOPIC, "shared", begin_ms=stamps[1], end_ms=stamps[3])
        assert sorted(m.body for m in ranged) == [b"k1", b"k2", b"k3"]
        limited = store.query_by_key(TOPIC, "shared", max_results=2)
        assert len(limited) == 2 and {m.body for m in limited} <= {f"k{i}".encode() for i in range(6)}
        assert store.query_by_key(TOPIC, "absent") == []
        assert store.query_by_key("NoSuchTopic", "shared") == []

    def test_offset_for_timestamp(self, opener: Opener, clock: ManualClock) -> None:
        """offset_for_timestamp gives the first queue offset stored at or after a time, the max offset when
        none is."""
        require(opener.sut, "query_by_time")
        store = opener()
        start = clock.now_ms()
        for i in range(10):
            store.append(request(queue_id=1, body=bytes([i])))
            clock.advance(1)  # one message per second
        assert store.offset_for_timestamp(TOPIC, 1, start - 5000) == 0
        assert store.offset_for_timestamp(TOPIC, 1, start) == 0
        assert store.offset_for_timestamp(TOPIC, 1, start + 1) == 1
        assert store.offset_for_timestamp(TOPIC, 1, start + 4000) == 4
        assert store.offset_for_timestamp(TOPIC, 1, start + 4500) == 5
        assert store.offset_for_timestamp(TOPIC, 1, start + 60_000) == 10, "past the end: the max offset"
        assert store.offset_for_timestamp(TOPIC, 0, start) == 0, "an empty queue: its max offset, 0"

    # -- concurrency --------------------------------------------------------------------------

    def test_readers_never_see_past_max_offset(self, opener: Opener) -> None:
        """While writers append, every entry read_queue shows is below max_offset read after it:
        a consumer's next offset (last entry + 1) is never beyond the queue's max."""
        require(opener.sut, "concurrent_writers")
        store = opener()
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                for i in range(600):
                    store.append(request(body=f"w{i}".encode()))
            except BaseException as exc:  # noqa: BLE001 - surfaced below
                errors.append(exc)
            finally:
                stop.set()

        thread = threading.Thread(target=writer)
        thread.start()
        seen_past_max = []
        offset = 0
        while not stop.is_set() or offset < store.max_offset(TOPIC, 0):
            entries = store.read_queue(TOPIC, 0, offset, 64)
            high = store.max_offset(TOPIC, 0)
            if entries:
                if entries[-1].queue_offset >= high:
                    seen_past_max.append((entries[-1].queue_offset, high))
                offset = entries[-1].queue_offset + 1
        thread.join()
        assert not errors, errors
        assert not seen_past_max, f"read_queue showed entries max_offset did not count yet: {seen_past_max[:5]}"
        assert offset == 600

    def test_concurrent_writers_lose_and_interleave_nothing(self, opener: Opener) -> None:
        """Many writers lose and double no offset, one writer's appends keep their order and a batch stays
        together in each queue."""
        require(opener.sut, "concurrent_writers")
        store = opener()
        results, batches = write_concurrently(store, threads=4, rounds=25)
        everything = [pair for pairs in results for pair in pairs]
        assert len({res.commit_log_offset for _, res in everything}) == len(everything), "two messages, one offset"
        for queue_id in (0, 1):
            mine = sorted(res.queue_offset for req, res in everything if req.queue_id == queue_id)
            assert mine == list(range(len(mine))), f"queue {queue_id}: offsets lost or doubled"
            assert store.max_offset(TOPIC, queue_id) == len(mine)
            by_offset = {res.commit_log_offset: (req, res) for req, res in everything if req.queue_id == queue_id}
            for entry in store.read_queue(TOPIC, queue_id, 0, 10_000):
                assert_stored(store.read(entry.commit_log_offset), *by_offset[entry.commit_log_offset])
        for got in batches:
            assert [r.queue_offset for r in got] == list(range(got[0].queue_offset, got[0].queue_offset + 3)), (
                "another writer's message landed inside a batch"
            )
        for pairs in results:
            own = [res.commit_log_offset for _, res in pairs]
            assert own == sorted(own), "one writer's messages must keep their order"

    # -- model-based --------------------------------------------------------------------------

    def test_stateful_against_reference_model(self, store_plugin: StoreUnderTest, tmp_path: Path) -> None:
        """Random appends, batches, reads, queries, clock steps and reopens answer as plain Python lists
        do."""
        machine = store_machine(store_plugin, tmp_path)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=8, stateful_step_count=20, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ))


