"""The state journal (plugmq.broker.journal) on every store: records and snapshots round trip, a torn
snapshot falls back to the one before, the retention floor follows snapshots, a slave follows
what log shipping brings and learns of a cut, a read-only journal refuses writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugmq.broker.components import open_store
from plugmq.broker.journal import SNAPSHOT_PART_BYTES, Journal
from plugmq.core import AppendRequest, ManualClock, ReplicableStore
from plugmq.core.errors import ReadOnlyBrokerError

STORES = ["store_mmap", "store_lmdb", "store_rocks"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[ReplicableStore]:
    opened = open_store(request.param, tmp_path / "master", clock=clock)
    assert isinstance(opened, ReplicableStore)
    yield opened
    opened.close()


def test_records_and_snapshots_round_trip(store: ReplicableStore) -> None:
    journal = Journal(store, "unit")
    assert journal.replay().snapshot is None and journal.floor() is None
    journal.append([b"r1", b"r2"])
    first_floor = journal.floor()
    assert first_floor is not None
    store.append(AppendRequest(topic="Other", queue_id=0, body=b"message"))
    big = bytes(range(256)) * (SNAPSHOT_PART_BYTES // 256 * 2 + 7)  # three parts
    journal.write_snapshot(big)
    assert journal.floor() is not None and journal.floor() > first_floor  # type: ignore[operator]
    journal.append([b"r3"])
    replay = Journal(store, "unit").replay()
    assert replay.snapshot == big and replay.records == (b"r3",)
    assert Journal(store, "other").replay().records == ()


def test_a_torn_snapshot_falls_back_to_the_one_before(store: ReplicableStore) -> None:
    journal = Journal(store, "unit")
    journal.write_snapshot(b"good")
    journal.append([b"after-good"])
    # A snapshot of three parts of which a crash kept only the head (tags: 1 head, 2 part).
    store.append(AppendRequest(topic=journal.topic, queue_id=0, body=b"torn", tags_code=1,
                               properties={"STATE_SNAPSHOT_PARTS": "3"}))
    journal.append([b"after-restart"])
    replay = Journal(store, "unit").replay()
    assert replay.snapshot == b"good" and replay.records == (b"after-good", b"after-restart")


def test_snapshot_due_by_age_or_lag(store: ReplicableStore, clock: ManualClock) -> None:
    journal = Journal(store, "unit", clock=clock, snapshot_age_ms=60_000, snapshot_lag_bytes=64 << 10)
    journal.write_snapshot(b"state")
    store.append(AppendRequest(topic="Other", queue_id=0, body=b"m"))
    clock.advance(59)
    assert not journal.snapshot_due(), "a fresh snapshot holds little back"
    clock.advance(1)
    assert journal.snapshot_due(), "a minute old, with log after it"
    journal.write_snapshot(b"state")
    store.append(AppendRequest(topic="Other", queue_id=0, body=b"x" * (65 << 10)))
    assert journal.snapshot_due(), "fresh, but more log than snapshot_lag_bytes after it"
    journal.write_snapshot(b"state")
    clock.advance(120)
    assert not journal.snapshot_due(), "nothing written after the snapshot: it holds nothing back"
    assert not Journal(store, "unit", clock=clock, writable=lambda: False).snapshot_due()


def test_read_only_journal_refuses_writes(store: ReplicableStore) -> None:
    journal = Journal(store, "unit", writable=lambda: False, broker_name="b")
    with pytest.raises(ReadOnlyBrokerError, match="slave"):
        journal.append([b"x"])
    with pytest.raises(ReadOnlyBrokerError):
        journal.write_snapshot(b"x")


def _ship(master: ReplicableStore, slave: ReplicableStore) -> None:
    while slave.log_end_offset() < master.log_end_offset():
        slave.append_log(master.read_log(slave.log_end_offset(), 1 << 20))


def test_a_slave_follows_and_learns_of_a_cut(store: ReplicableStore, tmp_path: Path) -> None:
    plugin = type(store).__module__.split(".")[2]
    slave_store = open_store(plugin, tmp_path / "slave", clock=ManualClock(1_700_000_000), store_host="127.0.0.2:1")
    assert isinstance(slave_store, ReplicableStore)
    try:
        master = Journal(store, "unit")
        master.append([b"a"])
        master.write_snapshot(b"snap")
        master.append([b"b"])
        _ship(store, slave_store)
        follower = Journal(slave_store, "unit", writable=lambda: False)
        assert follower.replay() == master.replay()
        cut_at = store.log_end_offset()
        master.append([b"c", b"d"])
        _ship(store, slave_store)
        assert follower.follow() == [b"c", b"d"] and follower.follow() == []
        assert follower.floor() == master.floor()
        slave_store.truncate_log(cut_at)
        assert follower.follow() is None  # cut below what it applied: replay afresh
        assert follower.replay().records == (b"b",)
    finally:
        slave_store.close()


def test_delay_intents_round_trip_and_a_damaged_one_is_a_clear_error() -> None:
    from plugmq.broker.delayledger import decode_intent, encode_intent
    from plugmq.core import AppendRequest, CorruptRecordError, Prop

    request = AppendRequest("Orders", 3, b"\x00body\xff", {Prop.UNIQ_KEY: "u-1", "k": "v\u00e9"}, tags_code=42,
                            born_timestamp_ms=1_700_000_000_123, born_host="10.0.0.1:99", reconsume_times=2,
                            sys_flag=4)
    for level in (None, 3):
        (decoded, deliver_at, decoded_level), msg_id = decode_intent(encode_intent(request, 1_700_000_005_000, level,
                                                                                  "ID-7"))
        assert (decoded, deliver_at, decoded_level, msg_id) == (request, 1_700_000_005_000, level, "ID-7")
    record = encode_intent(request, 1, None, "ID-7")
    for damaged in (record[:-1], record + b"x", b"C" + record[1:], record[:10]):
        with pytest.raises(CorruptRecordError, match="delay intent record cannot be decoded"):
            decode_intent(damaged)
