"""The fused single put: the compiled put_one through store_mmap's direct append (DirectAppending).

The direct append is taken only while the store's append would do nothing more than store: a log
listener (replication shipping) or a sync-flush group sends put_one back to ``store.append``, also
when set after the topic's plan was made. Equality with the general path on stored bytes, results,
traffic and queries: tests/test_put_encoder.py (broker level), the storage conformance clause
[direct_append_stores_what_append_stores] and the kernel fuzz target
``kit._requestcodec.put_one+store_mmap direct append``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugmq.broker.broker import Broker
from plugmq.core import AppendRequest, Message
from plugmq.core.errors import StoreError, ValidationError
from plugmq.kit import requestcodec
from plugmq.plugins.store_mmap import MmapMessageStore
from plugmq.plugins.store_mmap.appender import compiled_kernel

pytestmark = pytest.mark.skipif(not requestcodec.native_available() or compiled_kernel() is None,
                                reason="the compiled kernels were not built")


def _open(path: Path, flush: str = "async") -> Broker:
    broker = Broker.open(path, plugins=["store_mmap"], options={"store_mmap": {"flush": flush}})
    broker.create_topic("T", 2)
    return broker


def _store(broker: Broker) -> MmapMessageStore:
    store = broker._parts.sender._store
    assert isinstance(store, MmapMessageStore)
    return store


def _direct(broker: Broker) -> object | None:
    plan = broker._parts.sender._plans["T"]
    return plan[15]  # put_plan: the direct append is the 16th item


def test_a_log_listener_set_after_the_plan_hears_every_put(tmp_path: Path) -> None:
    """The plan keeps its capsule; the direct append declines per call while a listener is set,
    so the store's append tells it of every record, and takes the calls again once it is gone."""
    with _open(tmp_path / "b") as broker:
        store = _store(broker)
        first = broker.put(Message("T", b"a", keys=["k1"]), 0)
        assert _direct(broker) is not None
        heard: list[int] = []
        store.set_log_listener(heard.append)
        listened = [broker.put(Message("T", f"b{i}".encode(), keys=["k1"]), i % 2) for i in range(3)]
        assert _direct(broker) is not None  # the same plan: the check is per call
        found = [broker.query_by_id(s.msg_id) for s in listened]
        assert heard == [m.commit_log_offset + m.size for m in found if m is not None] and len(heard) == 3
        store.set_log_listener(None)
        after = broker.put(Message("T", b"c", keys=["k1"]), 0)
        assert len(heard) == 3
        assert [m.body for m in broker.query_by_key("T", "k1")] == [b"a", b"b0", b"b1", b"b2", b"c"]
        assert (first.queue_offset, listened[0].queue_offset, listened[2].queue_offset, after.queue_offset) == (
            0, 1, 2, 3)


def test_no_direct_append_for_a_sync_flush(tmp_path: Path) -> None:
    """A sync flush waits for its group commit after every append: the store offers no direct
    append, and the plan stores through ``append`` (which waits)."""
    with _open(tmp_path / "b", flush="sync") as broker:
        assert _store(broker).direct_append() is None
        sent = broker.put(Message("T", b"a"), 1)
        assert _direct(broker) is None
        found = broker.query_by_id(sent.msg_id)
        assert found is not None and found.body == b"a"


def test_the_direct_append_refuses_as_append_does(tmp_path: Path) -> None:
    """A bad request is refused with the same words, nothing stored; a closed store refuses."""
    with _open(tmp_path / "b") as broker:
        store = _store(broker)
        capsule = store.direct_append()
        bad = AppendRequest.trusted("T", 0, b"x", {"k": "v\x02"})
        words = _refusals(store, capsule, bad, ValidationError)
        assert words[0] == words[1] and "separators" in words[0]
        assert store.max_offset("T", 0) == 0
        with pytest.raises(ValidationError, match="separators"):
            broker.put(Message("T", b"x", properties={"k": "v"}), 0, extra_properties={"e": "\x01"})
        assert store.max_offset("T", 0) == 0
        good = AppendRequest("T", 1, b"ok", {})
        stored = requestcodec.append_direct(capsule, good)
        read = store.read(stored.commit_log_offset) if stored is not None else None
        assert read is not None and read.body == b"ok"
    closed = _refusals(store, capsule, good, StoreError)
    assert closed[0] == closed[1] and "closed" in closed[0]


def _refusals(store: MmapMessageStore, capsule: object, request: AppendRequest, error: type[Exception]) -> list[str]:
    """What ``append`` and the direct append say refusing ``request`` (each must raise ``error``)."""
    words = []
    for call in (store.append, lambda r: requestcodec.append_direct(capsule, r)):
        with pytest.raises(error) as refused:
            call(request)
        words.append(str(refused.value))
    return words


def test_put_batch_fused_refuses_and_publishes_as_the_general_path(tmp_path: Path) -> None:
    """The compiled batch put: a bad queue id and a rate limit refuse it with the general path's
    words and store nothing; a log listener hears the batch (the store's append_columns stores it
    then); with an observer of stored messages the general path runs (it hands them requests)."""
    from plugmq.config.limits import RateLimit
    from plugmq.core import ManualClock
    from plugmq.core.errors import RateLimitedError
    from tests.test_event_hooks import OnStored

    batch = [Message("T", b"a", keys=["k1"]), Message("T", b"bb", tags="x")]
    with Broker.open(tmp_path / "b", plugins=["store_mmap"], clock=ManualClock(1_000.0),
                     options={"store_mmap": {"flush": "async"}}) as broker:
        broker.create_topic("T", 2)
        store = _store(broker)
        words = []
        for disabled in (False, True):  # fused, then the general path with the Python encoder
            requestcodec._native_disabled = disabled
            try:
                with pytest.raises(ValidationError) as refused:
                    broker.put_batch(batch, 5)
            finally:
                requestcodec._native_disabled = False
            words.append(str(refused.value))
        assert words[0] == words[1] and "out of range" in words[0]
        assert store.max_offset("T", 0) == store.max_offset("T", 1) == 0
        broker.rate_limits.set("topics", "T", RateLimit(messages_per_s=1, burst_s=1))
        broker.put_batch(batch, 0)  # a full bucket lets one send through (into debt)
        with pytest.raises(RateLimitedError):
            broker.put_batch(batch, 0)  # the clock stands still: the bucket stays empty
        assert store.max_offset("T", 0) == 2
        broker.rate_limits.set("topics", "T", None)
        heard: list[int] = []
        store.set_log_listener(heard.append)
        sent = broker.put_batch(batch, 1)
        store.set_log_listener(None)
        last = broker.query_by_id(sent[-1].msg_id)
        assert last is not None and heard == [last.commit_log_offset + last.size]
        observer = OnStored("stored-recorder")
        broker.add_observer(observer, "stored-recorder")
        observed = broker.put_batch(batch, 0)
        assert [c["message"].msg_id for c in observer.calls] == [r.msg_id for r in observed]
        broker.remove_observer("stored-recorder")
        again = broker.put_batch(batch, 0)
        assert [r.queue_offset for r in observed] == [2, 3] and [r.queue_offset for r in again] == [4, 5]
        assert len(observer.calls) == 2
        assert [m.body for m in broker.query_by_key("T", "k1")] == [b"a"] * 4
        assert broker.traffic.snapshot().messages_in == {("T", "normal"): 8}
