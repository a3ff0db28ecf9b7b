"""The txn plugin against a reference model: random sends, decisions, clock moves and restarts.

The model is the contract in a few lines: first check at store time + timeout (or immunity),
then one per interval, at most ``check_max``, discard at the next due time; a decision ends a
transaction once; checks survive restarts. The real broker (store_lmdb + txn, ManualClock) must
agree on every check made, every message visible, every discard and every ``end`` return value.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.core import ManualClock, Message, MessageQueue, TransactionDecision
from plugmq.core.names import TRANS_DISCARD_TOPIC
from tests.helpers.services import transactions_of

COMMIT, ROLLBACK, UNKNOWN = TransactionDecision.COMMIT, TransactionDecision.ROLLBACK, TransactionDecision.UNKNOWN
TOPIC = "TxnModel"
TIMEOUT_MS, INTERVAL_MS, CHECK_MAX = 6_000, 30_000, 3
OPTIONS = {"txn": {"transaction_timeout_s": TIMEOUT_MS / 1000, "check_interval_s": INTERVAL_MS / 1000,
                   "check_max": CHECK_MAX, "compact_bytes": 4096}}


@attrs.define
class Txn:
    status: str  # open, committed, rolled_back, discarded
    due_ms: int
    answer_at: int | None
    answer: TransactionDecision
    checks: int = 0


def model_advance(txns: dict[bytes, Txn], until_ms: int) -> None:
    for txn in txns.values():
        while txn.status == "open" and txn.due_ms <= until_ms:
            if txn.checks >= CHECK_MAX:
                txn.status = "discarded"
                break
            txn.checks += 1
            if txn.checks == txn.answer_at:
                txn.status = "committed" if txn.answer is COMMIT else "rolled_back"
            else:
                txn.due_ms += INTERVAL_MS


sends = st.tuples(st.just("send"), st.sampled_from([COMMIT, ROLLBACK, UNKNOWN]),
                  st.one_of(st.none(), st.integers(1, CHECK_MAX)), st.sampled_from([COMMIT, ROLLBACK]),
                  st.one_of(st.none(), st.integers(0, 100)))
ops = st.lists(st.one_of(
    sends,
    st.tuples(st.just("advance"), st.integers(0, 120)),
    st.tuples(st.just("end"), st.integers(0, 30), st.sampled_from([COMMIT, ROLLBACK])),
    st.tuples(st.just("restart")),
), max_size=30)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_txn_matches_model(operations: list[tuple]) -> None:
    clock = ManualClock()
    calls: Counter[bytes] = Counter()
    model: dict[bytes, Txn] = {}
    ids: list[tuple[bytes, str]] = []

    def checker(message: object) -> TransactionDecision:
        body = message.body  # type: ignore[attr-defined]
        calls[body] += 1
        txn = model[body]
        return txn.answer if calls[body] == txn.answer_at else UNKNOWN

    with tempfile.TemporaryDirectory(prefix="plugmq-txn-model-") as tmp:
        def open_() -> tuple[Broker, TransactionProducer]:
            broker = Broker.open(Path(tmp), plugins=["store_lmdb", "txn"], options=OPTIONS, clock=clock)
            broker.create_topic(TOPIC, 2)
            return broker, TransactionProducer(broker, "pg", lambda _m, arg: arg, checker)

        broker, producer = open_()
        try:
            for op in operations:
                if op[0] == "send":
                    _, local, answer_at, answer, immunity = op
                    body = f"m{len(ids)}".encode()
                    first = TIMEOUT_MS if immunity is None else immunity * 1000
                    status = {COMMIT: "committed", ROLLBACK: "rolled_back", UNKNOWN: "open"}[local]
                    model[body] = Txn(status, clock.now_ms() + first, answer_at, answer)
                    result = producer.send_in_transaction(Message(TOPIC, body), local, check_immunity_s=immunity)
                    ids.append((body, result.transaction_id))
                elif op[0] == "advance":
                    model_advance(model, clock.now_ms() + op[1] * 1000)
                    clock.advance(op[1])
                elif op[0] == "end" and ids:
                    body, tid = ids[op[1] % len(ids)]
                    expected = model[body].status == "open"
                    if expected:
                        model[body].status = "committed" if op[2] is COMMIT else "rolled_back"
                    assert transactions_of(broker).end(tid, op[2]) is expected
                elif op[0] == "restart":
                    broker.close()
                    broker, producer = open_()
                assert_agrees(broker, model, calls)
            model_advance(model, clock.now_ms() + 1_000_000)
            clock.advance(1_000)
            assert_agrees(broker, model, calls)
        finally:
            broker.close()


def assert_agrees(broker: Broker, model: dict[bytes, Txn], calls: Counter[bytes]) -> None:
    shown = Counter(m.body for q in broker.topic_queues(TOPIC) for m in broker.pull(q, 0, 1000).messages)
    dropped = Counter(m.body for m in broker.pull(MessageQueue(TRANS_DISCARD_TOPIC, broker.name, 0), 0, 1000).messages)
    assert shown == Counter(b for b, t in model.items() if t.status == "committed")
    assert dropped == Counter(b for b, t in model.items() if t.status == "discarded")
    assert calls == Counter({b: t.checks for b, t in model.items() if t.checks})
    assert transactions_of(broker).pending() == sum(t.status == "open" for t in model.values())
