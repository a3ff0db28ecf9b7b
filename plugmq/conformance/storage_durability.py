"""Storage clauses of durability, refusals and retention (a part of :class:`StoreConformance`).

Close and reopen, SIGKILL mid-write, a corrupted tail, oversize and badly named writes, and
retention against the floor. Every clause needs the fixtures ``opener`` and ``clock`` that
:class:`plugmq.conformance.storage.StoreConformance` provides.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from plugmq.conformance._store_support import (
    TOPIC,
    Opener,
    assert_bulk_reads_as_read,
    assert_stored,
    capabilities_of,
    check_after_kill,
    read_present,
    request,
    require,
    run_and_kill,
)
from plugmq.core import (
    AppendRequest,
    ManualClock,
    StoreError,
    ValidationError,
)
from plugmq.core.contracts import SYSTEM_RECORD_HEADROOM
from plugmq.core.errors import InvalidNameError, MessageTooLargeError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE

__all__ = ["DurabilityClauses"]


class DurabilityClauses:
    """Clauses of :class:`~plugmq.conformance.storage.StoreConformance` that stop, kill, damage,
    refuse or clean."""

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
        assert_bulk_reads_as_read(store, [res.commit_log_offset for _, res in written])
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
        assert_bulk_reads_as_read(store, sorted(written))
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

