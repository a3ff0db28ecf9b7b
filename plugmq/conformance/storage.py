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

import os
import pickle
import random
import threading
from collections.abc import Iterator
from pathlib import Path

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
    assert_stored,
    capabilities_of,
    check_after_kill,
    flip_newest_body,
    read_present,
    request,
    require,
    run_and_kill,
    write_concurrently,
)
from plugmq.conformance.storage_replication import ReplicationClauses
from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    ManualClock,
    MessageStore,
    StoreError,
    ValidationError,
    encode_msg_id,
)
from plugmq.core.contracts import SYSTEM_RECORD_HEADROOM
from plugmq.core.errors import InvalidNameError, MessageTooLargeError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE

__all__ = ["StoreConformance", "StoreUnderTest", "assert_stored", "flip_newest_body"]


class StoreConformance(ReplicationClauses):
    """The storage contract. Needs the fixture ``store_plugin`` -> :class:`StoreUnderTest`.

    The log-shipping clauses (stores with the ``replication`` capability) come from
    :class:`plugmq.conformance.storage_replication.ReplicationClauses`.
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

    # -- durability ---------------------------------------------------------------------------

    def test_close_and_reopen_keep_everything(self, opener: Opener, clock: ManualClock) -> None:
        """close keeps everything: offsets, keys and ids are the same after reopening and appends continue
        after them."""
        store = opener()
        written = []
        for i in range(20):
            req = request(queue_id=i % 3, body=os.urandom(i * 37), keys=f"re{i}")
            written.append((req, store.append(req)))
            clock.advance(1)
        batch = [request(queue_id=1, body=f"batch{i}".encode()) for i in range(4)]
        written += zip(batch, store.append_batch(batch))
        store.flush()
        maxima = {q: store.max_offset(TOPIC, q) for q in range(3)}
        store = opener.reopen(store)
        store.close()  # close is idempotent
        store.close()
        store = opener()
        assert {q: store.max_offset(TOPIC, q) for q in range(3)} == maxima
        for req, res in written:
            assert_stored(store.read(res.commit_log_offset), req, res)
        if capabilities_of(opener.sut.plugin).query_by_key:
            assert [m.body for m in store.query_by_key(TOPIC, "re5")] == [written[5][0].body]
        req = request(queue_id=1, body=b"after reopen")
        res = store.append(req)
        assert res.queue_offset == maxima[1]
        assert res.commit_log_offset > max(r.commit_log_offset for _, r in written)
        assert_stored(store.read(res.commit_log_offset), req, res)

    def test_restart_after_kill_mid_write(self, opener: Opener, tmp_path: Path) -> None:
        """After a SIGKILL mid-write, every append that returned reads back as acknowledged and the store
        takes appends again."""
        require(opener.sut, "crash_recovery")
        sut = opener.sut
        options_file = tmp_path / "options.pickle"
        options_file.write_bytes(pickle.dumps(dict(sut.options)))
        acked: dict[int, tuple[int, int, int]] = {}
        for round_no in range(2):
            acked.update(run_and_kill(sut, opener.data_dir, options_file, first=round_no * 100_000, acks=150))
            store = opener()
            check_after_kill(store, acked if sut.acks_survive_kill else {})
            store.close()

    @pytest.mark.plugmq_damages_files("flips bytes inside the newest records of a closed store (StoreUnderTest.corrupt_tail)")
    def test_corrupted_tail_never_returned(self, opener: Opener) -> None:
        """Damages the store's files on purpose (its ``corrupt_tail`` hook, under ``tmp_path``), then
        reopens: the damaged records and everything after them are cut, nothing damaged is returned."""
        sut = opener.sut
        if sut.corrupt_tail is None:
            pytest.skip(f"{sut.plugin}: no corrupt_tail hook given (only the store knows its file format)")
        store = opener()
        written = []
        for i in range(30):
            req = request(queue_id=i % 2, body=f"tail-{i}-".encode() * (i + 1), keys=f"t{i}")
            written.append((req, store.append(req)))
        store.close()
        sut.corrupt_tail(opener.data_dir)
        store = opener()
        by_offset = {res.commit_log_offset: (req, res) for req, res in written}
        missing = 0
        for req, res in written:
            got = store.read(res.commit_log_offset)
            if got is None:
                missing += 1
            else:
                assert_stored(got, req, res)
            by_id = store.query_by_id(res.msg_id)
            assert by_id is None or by_id.body == req.body
        assert missing, "the hook damaged the tail, yet every record still reads back: damage went unnoticed"
        for queue_id in (0, 1):
            low, high = store.min_offset(TOPIC, queue_id), store.max_offset(TOPIC, queue_id)
            entries = store.read_queue(TOPIC, queue_id, low, 1000)
            assert [e.queue_offset for e in entries] == list(range(low, high))
            for entry in entries:
                got = store.read(entry.commit_log_offset)
                assert got is not None, f"queue entry {entry.queue_offset} points at a damaged record (not cut)"
                assert_stored(got, *by_offset[entry.commit_log_offset])
        req = request(queue_id=0, body=b"after the cut")
        before = store.max_offset(TOPIC, 0)
        res = store.append(req)
        assert res.queue_offset == before
        assert_stored(store.read(res.commit_log_offset), req, res)

    # -- refusals -----------------------------------------------------------------------------

    def test_oversize_record_refused_and_store_usable(self, opener: Opener) -> None:
        """A body above the limit is refused, writes nothing (a batch neither) and the store stays usable."""
        store = opener()
        first = store.append(request(body=b"before"))
        # One byte over the default context's store_body_limit: the client limit plus the headroom
        # every store gives the broker's own records.
        too_big = b"x" * (DEFAULT_MAX_BODY_SIZE + SYSTEM_RECORD_HEADROOM + 1)
        with pytest.raises((StoreError, MessageTooLargeError)):
            store.append(request(body=too_big))
        with pytest.raises((StoreError, MessageTooLargeError)):
            store.append_batch([request(body=b"ok-1"), request(queue_id=1, body=too_big), request(body=b"ok-2")])
        assert store.max_offset(TOPIC, 0) == 1 and store.max_offset(TOPIC, 1) == 0, "a refused write left something"
        req = request(body=b"after")
        res = store.append(req)
        assert res.queue_offset == 1 and res.commit_log_offset > first.commit_log_offset
        assert_stored(store.read(res.commit_log_offset), req, res)
        store = opener.reopen(store)
        assert [e.commit_log_offset for e in store.read_queue(TOPIC, 0, 0, 10)] == [
            first.commit_log_offset, res.commit_log_offset]
        assert store.max_offset(TOPIC, 1) == 0

    def test_badly_named_topic_rejected(self, opener: Opener, tmp_path: Path) -> None:
        """A topic name that breaks the name rule is refused before any file is touched; a batch holding
        one writes nothing."""
        store = opener()
        with pytest.raises(InvalidNameError):
            AppendRequest(topic="bad topic/..", queue_id=0, body=b"x")
        # A request that slipped past validation must still not reach the disk (names become files).
        sneaky = request(body=b"x")
        object.__setattr__(sneaky, "topic", "../../escaped")
        with pytest.raises((ValidationError, StoreError)):
            store.append(sneaky)
        with pytest.raises((ValidationError, StoreError)):
            store.append_batch([request(body=b"fine"), sneaky])
        assert store.max_offset(TOPIC, 0) == 0, "the good half of a refused batch was written"
        assert "../../escaped" not in store.queues()
        assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped*"))
        res = store.append(request(body=b"still fine"))
        assert res.queue_offset == 0

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

    # -- retention ----------------------------------------------------------------------------

    def test_retention_keeps_fresh_and_stays_consistent(self, opener: Opener, clock: ManualClock) -> None:
        """Retention removes only expired records; each queue stays readable from min to max offset and
        appends continue, also after a reopen."""
        require(opener.sut, "retention")
        store = opener()
        written = {}
        for i in range(40):
            req = request(queue_id=i % 2, body=f"r{i}".encode() * 50)
            res = store.append(req)
            written[res.commit_log_offset] = (req, res)
        assert store.clean_expired(clock.now_ms()) == 0, "nothing is old yet, nothing may go"
        assert all(store.read(off) is not None for off in written)
        clock.advance(10 * 365 * 86400)
        removed = store.clean_expired(clock.now_ms())
        assert removed >= 0
        for queue_id in (0, 1):
            low, high = store.min_offset(TOPIC, queue_id), store.max_offset(TOPIC, queue_id)
            assert 0 <= low <= high == 20
            entries = store.read_queue(TOPIC, queue_id, low, 100)
            assert [e.queue_offset for e in entries] == list(range(low, high))
            for entry in entries:
                assert_stored(store.read(entry.commit_log_offset), *written[entry.commit_log_offset])
            assert all(e.queue_offset >= low for e in store.read_queue(TOPIC, queue_id, 0, 100))
        res = store.append(request(queue_id=0, body=b"fresh"))
        assert res.queue_offset == 20
        store = opener.reopen(store)
        assert store.max_offset(TOPIC, 0) == 21 and read_present(store, res.commit_log_offset).body == b"fresh"

    def test_retention_never_removes_what_the_floor_holds(self, opener: Opener, clock: ManualClock) -> None:
        """Records at or above ``context.retention.lowest()`` (what consumer groups and services
        still need) survive any age; only a store's own disk watermark may force them out."""
        require(opener.sut, "retention")
        store = opener()
        written = [store.append(request(queue_id=i % 2, body=f"h{i}".encode() * 50)) for i in range(40)]
        floor = written[25].commit_log_offset
        opener.floor.hold("conformance", lambda: floor)
        try:
            for _ in range(3):
                clock.advance(10 * 365 * 86400)
                store.clean_expired(clock.now_ms())
            for res in written[25:]:
                message = store.read(res.commit_log_offset)
                assert message is not None and message.queue_offset == res.queue_offset, (
                    "a record at or above the retention floor was removed"
                )
            for queue_id in (0, 1):
                held = next(r for i, r in enumerate(written) if i >= 25 and i % 2 == queue_id)
                assert store.min_offset(TOPIC, queue_id) <= held.queue_offset
        finally:
            opener.floor.release("conformance")

    # -- model-based --------------------------------------------------------------------------

    def test_stateful_against_reference_model(self, store_plugin: StoreUnderTest, tmp_path: Path) -> None:
        """Random appends, batches, reads, queries, clock steps and reopens answer as plain Python lists
        do."""
        machine = store_machine(store_plugin, tmp_path)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=8, stateful_step_count=20, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ))


