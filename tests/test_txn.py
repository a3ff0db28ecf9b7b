"""The txn plugin beyond the shared clauses: half/commit records, op log tail and compaction,
retention losses, several producers per group, options, and the TransactionProducer's refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from plugmq.broker.broker import Broker
from plugmq.broker.components import open_store
from plugmq.broker.journal import Journal
from plugmq.client.transactions import TransactionProducer
from plugmq.core import (
    ConfigError,
    ManualClock,
    Message,
    MessageQueue,
    Prop,
    StoredMessage,
    TransactionDecision,
    TransactionError,
    ValidationError,
)
from plugmq.core.errors import ClientError
from plugmq.core.message import SysFlag
from plugmq.core.names import TRANS_HALF_TOPIC
from plugmq.plugins.txn.oplog import OpLog
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.services import transactions_of

COMMIT, ROLLBACK, UNKNOWN = TransactionDecision.COMMIT, TransactionDecision.ROLLBACK, TransactionDecision.UNKNOWN
TOPIC = "TxnUnit"


def by_arg(_message: Message, arg: TransactionDecision) -> TransactionDecision:
    return arg


def open_broker(make_broker: BrokerFactory, **txn: object) -> Broker:
    """A store_lmdb broker with txn (its options ``txn``) in the test's data dir, TOPIC created."""
    broker = make_broker(["store_lmdb", "txn"], options={"txn": txn} if txn else {})
    broker.create_topic(TOPIC, 2)
    return broker


def visible(broker: Broker) -> list[bytes]:
    return sorted(m.body for q in broker.topic_queues(TOPIC) for m in broker.pull(q, 0, 1000).messages)


class Recorder:
    def __init__(self, answer: TransactionDecision = UNKNOWN) -> None:
        self.answer = answer
        self.bodies: list[bytes] = []

    def __call__(self, message: StoredMessage) -> TransactionDecision:
        self.bodies.append(message.body)
        return self.answer


def test_half_and_committed_records(make_broker: BrokerFactory) -> None:
    broker = open_broker(make_broker)
    producer = broker.transaction_producer("pg", by_arg, Recorder())
    result = producer.send_in_transaction(Message(TOPIC, b"body", tags="T", properties={"u": "1"}), UNKNOWN,
                                          selector=lambda queues, _m, _a: queues[1], check_immunity_s=60)
    assert result.send_result.queue == MessageQueue(TOPIC, broker.name, 1)
    half = broker.query_by_id(result.transaction_id)
    assert half is not None and half.topic == TRANS_HALF_TOPIC and half.queue_id == 0
    assert half.properties[Prop.REAL_TOPIC] == TOPIC and half.properties[Prop.REAL_QUEUE_ID] == "1"
    assert half.properties[Prop.PRODUCER_GROUP] == "pg" and half.properties[Prop.TRANSACTION_PREPARED] == "true"
    assert half.properties[Prop.CHECK_IMMUNITY_SECONDS] == "60"
    assert half.sys_flag & SysFlag.TRANSACTION_ROLLBACK == SysFlag.TRANSACTION_PREPARED
    assert transactions_of(broker).end(result.transaction_id, COMMIT)
    (real,) = broker.pull(MessageQueue(TOPIC, broker.name, 1), 0, 10).messages
    assert real.body == b"body" and real.tags == "T" and real.user_properties == {"u": "1"}
    assert real.sys_flag & SysFlag.TRANSACTION_ROLLBACK == SysFlag.TRANSACTION_COMMIT
    assert real.prepared_transaction_offset == half.commit_log_offset
    assert Prop.REAL_TOPIC not in real.properties and Prop.CHECK_IMMUNITY_SECONDS not in real.properties
    assert real.unique_id == result.unique_id == half.unique_id


def test_producer_refusals(tmp_path: Path, make_broker: BrokerFactory) -> None:
    plain = make_broker(["store_lmdb"], data_dir=tmp_path / "plain")
    with pytest.raises(TransactionError, match="add 'txn'"):
        plain.transaction_producer("pg", by_arg, Recorder())
    broker = open_broker(make_broker)
    producer = TransactionProducer(broker, "pg", by_arg, Recorder())
    with pytest.raises(TransactionError, match="system topic"):
        producer.send_in_transaction(Message("%RETRY%pg", b"x"), COMMIT)
    with pytest.raises(ValidationError, match="check_immunity_s"):
        producer.send_in_transaction(Message(TOPIC, b"x"), COMMIT, check_immunity_s=-1)
    with pytest.raises(ValidationError, match="not a queue"):
        producer.send_in_transaction(Message(TOPIC, b"x"), COMMIT,
                                     selector=lambda _q, _m, _a: MessageQueue("Other", broker.name, 0))
    with pytest.raises(ValidationError):
        TransactionProducer(broker, "pg", "not callable", Recorder())  # type: ignore[arg-type]
    producer.close()
    with pytest.raises(ClientError, match="closed"):
        producer.send_in_transaction(Message(TOPIC, b"x"), COMMIT)
    assert transactions_of(broker).pending() == 0 and visible(broker) == []
    assert broker.max_offset(MessageQueue(TRANS_HALF_TOPIC, broker.name, 0)) == 0


@pytest.mark.parametrize("table, fragment", [
    ({"check_max": -1}, "check_max"),
    ({"check_interval_s": 0}, "check_interval_s"),
    ({"fsync": "yes"}, "fsync"),
    ({"transaction_timeout_s": "6"}, "transaction_timeout_s"),
    ({"checks": 3}, "unknown option"),
])
def test_options_are_validated(make_broker: BrokerFactory, table: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        make_broker(["store_lmdb", "txn"], options={"txn": table})


def test_configured_schedule_is_declared_and_kept(make_broker: BrokerFactory, clock: ManualClock) -> None:
    broker = open_broker(make_broker, transaction_timeout_s=2, check_interval_s=5, check_max=3)
    caps = transactions_of(broker).capabilities
    assert (caps.transaction_timeout_ms, caps.check_interval_ms, caps.check_max) == (2000, 5000, 3)
    times: list[float] = []
    start = clock.now()

    def check(_message: StoredMessage) -> TransactionDecision:
        times.append(clock.now() - start)
        return UNKNOWN

    TransactionProducer(broker, "pg", by_arg, check).send_in_transaction(Message(TOPIC, b"x"), UNKNOWN)
    clock.advance(100)
    assert times == [2, 7, 12] and transactions_of(broker).metrics()["discarded"] == 1


def test_several_producers_of_a_group_share_check_back(make_broker: BrokerFactory, clock: ManualClock) -> None:
    broker = open_broker(make_broker, check_max=50)
    first, second = Recorder(), Recorder(COMMIT)
    a = TransactionProducer(broker, "pg", by_arg, first)
    b = TransactionProducer(broker, "pg", by_arg, second)
    a.send_in_transaction(Message(TOPIC, b"one"), UNKNOWN)
    b.close()
    clock.advance(6)
    assert first.bodies == [b"one"] and second.bodies == []
    a.close()
    clock.advance(300)
    assert transactions_of(broker).pending() == 1 and first.bodies == [b"one"]
    assert transactions_of(broker).metrics()["checks_waiting"] == 1
    TransactionProducer(broker, "pg", by_arg, second)
    clock.advance(0)
    assert second.bodies == [b"one"] and visible(broker) == [b"one"]


def test_checker_raising_or_answering_nothing_counts_as_unknown(make_broker: BrokerFactory, clock: ManualClock) -> None:
    calls: list[int] = []

    def flaky(_message: StoredMessage) -> TransactionDecision | None:
        """Breaks its contract: raises once, then answers None once."""
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("db down")
        return None if len(calls) == 2 else COMMIT

    broker = open_broker(make_broker)
    TransactionProducer(broker, "pg", by_arg, flaky).send_in_transaction(  # type: ignore[arg-type]
        Message(TOPIC, b"x"), UNKNOWN)
    with structlog.testing.capture_logs() as logs:
        clock.advance(6 + 30 + 30)
    assert len(calls) == 3 and visible(broker) == [b"x"]
    assert sum(e["log_level"] == "warning" for e in logs) == 2


def test_an_older_op_log_file_is_imported_once_and_its_torn_tail_cut(tmp_path: Path) -> None:
    """Data dirs written before the journal kept the op records in ``txn/oplog``: its valid records
    become the journal's first snapshot; a record torn by a crash is cut; the file is set aside."""
    from plugmq.plugins.txn import oplog as op

    legacy = tmp_path / "txn" / "oplog"
    legacy.parent.mkdir()
    legacy.write_bytes(op.record(op.COMMIT, 0, 3) + op.record(op.DONE, 0) + op.record(op.CHECKED, 1, 2)
                       + b"C\x00\x00\x00garbage-half-record")  # a write torn by a crash
    store = open_store("store_lmdb", tmp_path / "store", clock=ManualClock())
    try:
        with structlog.testing.capture_logs() as logs:
            state = OpLog(Journal(store, "txn"), fsync=False, legacy=legacy).replay()
        assert state.terminal == {0} and state.checks == {1: 2}
        assert any(e["event"] == "transaction op log tail cut" for e in logs)
        assert not legacy.exists() and legacy.with_name("oplog.imported").exists()
        again = OpLog(Journal(store, "txn"), fsync=False, legacy=legacy).replay()
        assert again.terminal == {0} and again.checks == {1: 2}
    finally:
        store.close()


def test_compaction_keeps_open_counts_and_settled_state(make_broker: BrokerFactory, clock: ManualClock) -> None:
    broker = open_broker(make_broker, compact_bytes=4096, check_max=5)
    producer = TransactionProducer(broker, "pg", by_arg, Recorder())
    producer.send_in_transaction(Message(TOPIC, b"open-early"), UNKNOWN)
    clock.advance(6 + 30)  # two checks counted for open-early
    for i in range(400):
        producer.send_in_transaction(Message(TOPIC, f"m{i}".encode()), COMMIT if i % 2 else ROLLBACK)
    metrics = transactions_of(broker).metrics()
    assert metrics["compactions"] >= 1 and metrics["op_log_bytes"] < 4096 * 3
    broker.close()
    checks = Recorder()
    broker = open_broker(make_broker, compact_bytes=4096, check_max=5)
    assert transactions_of(broker).pending() == 1
    TransactionProducer(broker, "pg", by_arg, checks)
    clock.advance(1000)
    assert checks.bodies == [b"open-early"] * 3  # 5 allowed, 2 made before the restart
    assert len(visible(broker)) == 200
    assert transactions_of(broker).metrics()["discarded"] == 1


def test_op_log_replay_rules(tmp_path: Path) -> None:
    from plugmq.plugins.txn import oplog as op

    store = open_store("store_lmdb", tmp_path, clock=ManualClock())
    log = OpLog(Journal(store, "txn"), fsync=False)
    log.replay()
    log.append(b"".join([
        op.record(op.CHECKED, 5, 1), op.record(op.CHECKED, 5, 2), op.record(op.COMMIT, 6, 10),
        op.record(op.ROLLBACK, 6), op.record(op.DISCARD, 7, 3), op.record(op.COMMIT, 7, 9),
        op.record(op.COMMIT, 8, 4), op.record(op.DONE, 8), op.record(op.WATERMARK, 3), op.record(op.CHECKED, 2, 9),
    ]))
    log.close()
    state = OpLog(Journal(store, "txn"), fsync=False).replay()
    store.close()
    assert state.watermark == 3 and state.checks == {5: 2}
    assert state.decided == {7: (op.DISCARD, 3)}  # the first decision wins; 6 was rolled back after
    assert state.terminal == {6, 8}


def test_open_half_is_held_against_store_retention(make_broker: BrokerFactory, clock: ManualClock) -> None:
    """An undecided half stays in the store however old it gets: the service holds it through
    the broker's retention floor, and the broker's own retention rounds leave it alone."""
    options = {"store_lmdb": {"file_reserved_hours": 0.001}}  # 3.6 s
    broker = make_broker(["store_lmdb", "txn"], options=options)
    broker.create_topic(TOPIC, 1)
    checks = Recorder(COMMIT)
    TransactionProducer(broker, "pg", by_arg, Recorder()).send_in_transaction(Message(TOPIC, b"x"), UNKNOWN)
    TransactionProducer(broker, "pg", by_arg, Recorder()).send_in_transaction(Message(TOPIC, b"y"), ROLLBACK)
    clock.advance(5)  # a broker retention round ran meanwhile
    assert broker.store.clean_expired(clock.now_ms()) == 0, "the first half is open: nothing may go"
    assert broker.store.stats()["retention_held"] == 1
    TransactionProducer(broker, "pg", by_arg, checks)
    clock.advance(1)  # the first check (6 s after the half) commits it
    assert checks.bodies == [b"x"] and visible(broker) == [b"x"]
    assert transactions_of(broker).metrics().get("lost", 0) == 0
    # Settled: the halves (and the unconsumed commit) are free to go once the op log's next
    # snapshot (within a minute: plugmq.broker.journal) stops holding its earlier records.
    clock.advance(90)
    assert broker.store.min_offset(TRANS_HALF_TOPIC, 0) == 2 and visible(broker) == []


def test_half_lost_to_forced_retention_is_reported(make_broker: BrokerFactory, clock: ManualClock) -> None:
    """Only the disk watermark may remove an open half (store_mmap's force-clean): the service
    then reports the loss instead of checking a message that is gone."""
    options = {"store_mmap": {"commit_log_segment_size": 16_384, "disk_force_clean_ratio": 0.0,
                              "disk_max_used_ratio": 1.0, "disk_critical_ratio": 1.0}}
    broker = make_broker(["store_mmap", "txn"], options=options)
    broker.create_topic(TOPIC, 1)
    checks = Recorder(COMMIT)
    TransactionProducer(broker, "pg", by_arg, checks).send_in_transaction(Message(TOPIC, b"x"), UNKNOWN)
    with structlog.testing.capture_logs() as forced:
        for i in range(12):  # pushes the half's segment out of the way of the one being written
            broker.put(Message(TOPIC, bytes([i]) * 3000), 0)
        assert broker.store.clean_expired(clock.now_ms()) >= 1
    assert any("force-clean" in e["event"] and e["unconsumed_bytes"] > 0 for e in forced)
    assert broker.store.stats()["retention_forced_unconsumed_bytes"] > 0
    with structlog.testing.capture_logs() as logs:
        clock.advance(10)
    assert checks.bodies == [] and transactions_of(broker).pending() == 0
    assert transactions_of(broker).metrics()["lost"] == 1
    assert any(e["log_level"] == "error" for e in logs)


def test_unfinished_commit_is_delivered_at_start(make_broker: BrokerFactory, clock: ManualClock) -> None:
    """A COMMIT record without its DONE record (the crash window), written by hand: the next
    start delivers it once, and a second start does nothing more."""
    from plugmq.plugins.txn import oplog as op

    broker = open_broker(make_broker)
    result = TransactionProducer(broker, "pg", by_arg, Recorder()).send_in_transaction(
        Message(TOPIC, b"late"), UNKNOWN)
    half = broker.query_by_id(result.transaction_id)
    assert half is not None
    broker.close()
    store = open_store("store_lmdb", broker.data_dir, clock=clock)
    log = OpLog(Journal(store, "txn"), fsync=False)
    log.replay()
    log.append(op.record(op.COMMIT, half.queue_offset, 0))
    store.close()
    for _ in range(2):
        checks = Recorder(ROLLBACK)
        broker = open_broker(make_broker)
        TransactionProducer(broker, "pg", by_arg, checks)
        clock.advance(100)
        assert visible(broker) == [b"late"] and checks.bodies == [] and transactions_of(broker).pending() == 0
        broker.close()
