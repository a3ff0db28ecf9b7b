"""Retention run by the broker on its ManualClock: files past retention disappear when the test only
advances the clock; what a consumer group has not consumed survives until the force watermark."""

from __future__ import annotations

import datetime as dt
import heapq
from pathlib import Path
from typing import Any

import pytest
import structlog

from plugmq.broker.broker import Broker
from plugmq.broker.retention import RETENTION_INTERVAL_S
from plugmq.client.transactions import TransactionProducer
from plugmq.core import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    DelayCapabilities,
    DelayContext,
    Family,
    ManualClock,
    Message,
    MessageQueue,
    PluginDeclaration,
    TransactionDecision,
    encode_msg_id,
    hookimpl,
)
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.services import transactions_of

TOPIC = "Keep"
BODY = 3000
NEVER: dict[str, Any] = {"disk_max_used_ratio": 1.0, "disk_force_clean_ratio": 1.0, "disk_critical_ratio": 1.0}
MMAP: dict[str, Any] = {"commit_log_segment_size": 64 * 1024, "consume_queue_entries_per_file": 8, "index_slot_count": 31,
        "index_max_entries": 20, "file_reserved_hours": 1, "delete_when": "04", **NEVER}
KV: dict[str, Any] = {"file_reserved_hours": 1, "retention_batch": 16}
STORES: dict[str, dict[str, Any]] = {"store_mmap": MMAP, "store_lmdb": KV, "store_rocks": KV}


def local(hour: int, minute: int = 0) -> float:
    """Epoch seconds of a local wall-clock time (delete_when is a local hour, like RocketMQ)."""
    return dt.datetime(2023, 11, 14, hour, minute).timestamp()


def open_broker(path: Path, clock: ManualClock, store: str, **extra: Any) -> Broker:
    return Broker.open(path, plugins=[store, "filter_tag"], options={store: {**STORES[store], **extra}}, clock=clock)


def fill(broker: Broker, clock: ManualClock, n: int) -> list[int]:
    """n messages round-robin over 2 queues, one virtual second apart; their commit-log offsets."""
    broker.create_topic(TOPIC, 2)
    out = []
    for i in range(n):
        result = broker.put(Message(TOPIC, i.to_bytes(4, "big") * (BODY // 4), keys=(f"k{i}",)), i % 2)
        out.append(int(result.msg_id[-16:], 16))
        clock.advance(1)
    return out


def readable(broker: Broker, offsets: list[int]) -> list[bool]:
    return [broker.store.read(o) is not None for o in offsets]


def files(path: Path, store: str) -> int:
    return sum(1 for p in (path / store).rglob("*") if p.is_file())


@pytest.mark.parametrize("store", sorted(STORES))
def test_expired_data_disappears_by_advancing_the_clock_only(tmp_path: Path, store: str) -> None:
    clock = ManualClock(local(1))
    with open_broker(tmp_path, clock, store) as broker:
        offsets = fill(broker, clock, 100)
        before = files(tmp_path, store)
        segments_before = len(broker.store.commit_log.segments) if store == "store_mmap" else 0  # type: ignore[attr-defined]
        clock.set(local(2, 30))  # expired for an hour and a half; store_mmap waits for 04:00
        if store != "store_mmap":
            assert not any(readable(broker, offsets)), "expired records go at the next round"
            assert broker.store.min_offset(TOPIC, 0) == 50 and broker.query_by_key(TOPIC, "k3") == []
        else:
            assert all(readable(broker, offsets)), "02:30 is not the delete hour"
            clock.set(local(4, 1))
            segments = broker.store.commit_log.segments  # type: ignore[attr-defined]
            assert len(segments) == 1, "every segment but the one being written"
            gone = [o for o in offsets if o < segments[0].start]
            assert gone and not any(readable(broker, gone)) and broker.query_by_key(TOPIC, "k3") == []
            assert files(tmp_path, store) < before, "segments, consume-queue and index files went"
        rounds = broker.retention.rounds
        assert rounds >= (local(2, 30) - local(1)) / RETENTION_INTERVAL_S - 1
        removed = broker.retention.removed["store"]
    print(f"\nFIGURES retention {store}: 100 x {BODY} B over 100 virtual s; {removed} "
          f"{'files' if store == 'store_mmap' else 'records'} removed by {rounds} broker rounds "
          f"(every {RETENTION_INTERVAL_S:.0f} s), files {before} -> {files(tmp_path, store)}"
          + (f", segments {segments_before} -> 1" if store == "store_mmap" else ""))


@pytest.mark.parametrize("store", sorted(STORES))
def test_what_a_group_has_not_consumed_survives(tmp_path: Path, store: str) -> None:
    clock = ManualClock(local(1))
    with open_broker(tmp_path, clock, store) as broker:
        offsets = fill(broker, clock, 100)
        consumer = broker.pull_consumer("G")
        for qid in (0, 1):
            consumer.commit(MessageQueue(TOPIC, broker.name, qid), 20)  # consumed messages 0..39
        with structlog.testing.capture_logs() as logs:
            clock.set(local(4, 30))
        kept = readable(broker, offsets)
        first_kept = sum(kept)
        assert all(kept[40:]), "nothing the group has not consumed is removed"
        assert not all(kept[:40]), "what it consumed may go"
        assert broker.store.stats()["retention_held"] == 1
        assert any("kept" in e["event"] and e.get("holders", {}).get("consumer groups") == offsets[40] for e in logs)
        for qid in (0, 1):
            consumer.commit(MessageQueue(TOPIC, broker.name, qid), 45)  # consumed up to 89
        clock.advance(3600)
        kept = readable(broker, offsets)
        assert all(kept[90:]) and not any(kept[:60])
        held_at = sum(kept)
    print(f"\nFIGURES retention floor {store}: group at 40/100 -> {first_kept} kept after 3.5 h; "
          f"group at 90/100 -> {held_at} kept")


def test_force_watermark_removes_unconsumed_data_logged_and_counted(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    with open_broker(tmp_path, clock, "store_mmap") as broker:
        offsets = fill(broker, clock, 100)
        consumer = broker.pull_consumer("G")
        for qid in (0, 1):
            consumer.commit(MessageQueue(TOPIC, broker.name, qid), 0)  # consumed nothing
        clock.set(local(4, 30))
        assert all(readable(broker, offsets)), "below the force watermark nothing unconsumed goes"
        segments = len(broker.store.commit_log.segments)  # type: ignore[attr-defined]
    with structlog.testing.capture_logs() as logs, \
            open_broker(tmp_path, clock, "store_mmap", disk_force_clean_ratio=0.0) as broker:
        clock.advance(RETENTION_INTERVAL_S)
        stats = broker.store.stats()
        assert stats["retention_forced_segments"] == 1, "one segment per round, like RocketMQ"
        assert stats["retention_forced_unconsumed_bytes"] > 0
        assert not readable(broker, offsets[:1])[0]
        clock.advance(RETENTION_INTERVAL_S * (segments - 2))
        assert len(broker.store.commit_log.segments) == 1  # type: ignore[attr-defined]
        forced = broker.store.stats()["retention_forced_unconsumed_bytes"]
    warnings = [e for e in logs if e["log_level"] == "warning" and "force-clean" in e["event"]]
    assert warnings and all(w["unconsumed_bytes"] > 0 and "consumer groups" in w["holders"] for w in warnings)
    print(f"\nFIGURES force watermark: {segments - 1} segments holding unconsumed messages removed in "
          f"{segments - 1} rounds, {forced:.0f} unconsumed bytes counted, {len(warnings)} warnings")


def test_txn_op_log_compacted_by_the_clock(make_broker: BrokerFactory, clock: ManualClock) -> None:
    options: dict[str, dict[str, Any]] = {"store_lmdb": {"file_reserved_hours": 1}, "txn": {"fsync": False}}
    broker = make_broker(["store_lmdb", "txn"], options=options)
    broker.create_topic(TOPIC, 1)
    producer = TransactionProducer(broker, "pg", lambda _m, _a: TransactionDecision.COMMIT,
                                   lambda _m: TransactionDecision.COMMIT)
    for i in range(1500):
        producer.send_in_transaction(Message(TOPIC, i.to_bytes(4, "big")), None)
    before = transactions_of(broker).metrics()["op_log_bytes"]
    assert before > 64 << 10
    clock.advance(RETENTION_INTERVAL_S)
    after = transactions_of(broker).metrics()["op_log_bytes"]
    assert after < before // 10 and broker.retention.removed["transactions"] == 1
    metrics = transactions_of(broker).metrics()
    assert metrics["compactions"] == 1 and metrics["committed"] == 1500
    broker.close()
    broker = make_broker(["store_lmdb", "txn"], options=options)
    assert transactions_of(broker).pending() == 0 and broker.max_offset(MessageQueue(TOPIC, broker.name, 0)) == 1500
    print(f"\nFIGURES txn op log: 1500 committed transactions, op log {before} B -> {after} B at the next "
          "retention round")


class OldDelayPlugin:
    """A third-party delay plugin written before clean_expired joined the contract: due messages
    in a heap, delivered by a clock timer."""

    capabilities = DelayCapabilities(cancel=False, arbitrary_delay=True)

    def __init__(self, context: DelayContext) -> None:
        self._context = context
        self._heap: list[tuple[int, int, AppendRequest]] = []
        self._seq = 0

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        self._seq += 1
        heapq.heappush(self._heap, (deliver_at_ms, self._seq, request))
        self._context.clock.call_at(deliver_at_ms / 1000, self._deliver_due)
        return AppendResult(AppendStatus.PUT_OK, encode_msg_id(self._context.store_host, self._seq), 0, self._seq,
                            len(request.body), self._context.clock.now_ms())

    def _deliver_due(self) -> None:
        now = self._context.clock.now_ms()
        while self._heap and self._heap[0][0] <= now:
            _, _, request = heapq.heappop(self._heap)
            assert self._context.deliver is not None
            self._context.deliver(request)

    def start(self) -> None: ...
    def cancel(self, msg_id: str) -> bool: return False
    def pending(self) -> int: return len(self._heap)
    def metrics(self) -> dict[str, float]: return {}
    def close(self) -> None: ...


class OldDelayPluginPackage:
    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name="old_delay", families={Family.DELAY})

    @hookimpl
    def plugmq_make_delay_scheduler(self, context: DelayContext) -> OldDelayPlugin:
        return OldDelayPlugin(context)


def test_a_service_without_clean_expired_is_skipped_with_a_line(tmp_path: Path) -> None:
    clock = ManualClock()
    with structlog.testing.capture_logs() as logs:
        broker = Broker.open(tmp_path, plugins=["store_lmdb", "old_delay"], clock=clock,
                             plugin_objects={"old_delay": OldDelayPluginPackage()})
    with broker:
        assert any(e["event"].startswith("component has no clean_expired") and e["component"] == "delay"
                   for e in logs)
        broker.create_topic(TOPIC, 1)
        broker.put(Message(TOPIC, b"later", deliver_at_ms=clock.now_ms() + 30_000), 0)
        clock.advance(60)
        assert broker.retention.failures == 0 and broker.retention.rounds == 6
        assert [m.body for m in broker.pull(MessageQueue(TOPIC, broker.name, 0), 0).messages] == [b"later"]


def test_what_a_pop_group_has_not_acked_survives(tmp_path: Path) -> None:
    clock = ManualClock(local(1))
    with open_broker(tmp_path, clock, "store_lmdb") as broker:
        broker.create_topic("Pop", 1)
        offsets = [int(broker.put(Message("Pop", bytes([i]) * 100), 0).msg_id[-16:], 16) for i in range(50)]
        consumer = broker.simple_consumer("P", {"Pop": "*"})
        got = consumer.receive(30, invisible_duration_s=10 * 3600)
        assert len(got) == 30
        for message in got:
            if message.body[0] != 7:
                consumer.ack(message)  # message 7 stays in flight
        clock.set(local(4, 30))
        kept = readable(broker, offsets)
        assert kept == [i >= 7 for i in range(50)], "in flight and not yet received: kept; acked before them: gone"
        consumer.close()
