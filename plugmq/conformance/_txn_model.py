"""The transaction family's reference model, driven by a Hypothesis state machine.

The model is the contract in a few lines: the first check at store time + timeout (or the check
immunity), then one per interval, at most ``check_max``, the discard at the next due time after
that; a decision ends a transaction once; checks already made survive restarts. The broker on a
ManualClock must agree with it on every message visible, every one discarded, every check made,
every ``end`` answer and the pending count. Comparisons happen only at moments no check is due
within the service's ``schedule_resolution_ms`` before them, where the contract leaves no doubt.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.conformance._txn_support import COMMIT, ROLLBACK, UNKNOWN, open_producer
from plugmq.core import ManualClock, Message, MessageQueue, StoredMessage, TransactionCapabilities, TransactionDecision
from plugmq.core.names import TRANS_DISCARD_TOPIC

__all__ = ["TransactionModel", "Txn", "model_machine"]


@attrs.define
class Txn:
    status: str  # open, committed, rolled_back, discarded
    due_ms: int
    answer_at: int | None  # the check that answers (None: every check answers UNKNOWN)
    answer: TransactionDecision
    checks: int = 0


@attrs.define
class TransactionModel:
    """Transactions by body, advanced by the declared schedule."""

    caps: TransactionCapabilities
    txns: dict[bytes, Txn] = attrs.field(factory=dict)

    def advance(self, until_ms: int) -> None:
        for txn in self.txns.values():
            while txn.status == "open" and txn.due_ms <= until_ms:
                if txn.checks >= self.caps.check_max:
                    txn.status = "discarded"
                    break
                txn.checks += 1
                if txn.checks == txn.answer_at:
                    txn.status = "committed" if txn.answer is COMMIT else "rolled_back"
                else:
                    txn.due_ms += self.caps.check_interval_ms

    def clear_moment(self, at_ms: int) -> int:
        """The first moment from ``at_ms`` with no check due in the resolution window before it."""
        window = self.caps.schedule_resolution_ms
        while window:
            ahead = copy.deepcopy(self)
            ahead.advance(at_ms)
            late = [t.due_ms for t in ahead.txns.values() if t.status == "open" and at_ms - window < t.due_ms <= at_ms]
            if not late:
                break
            at_ms = max(late) + window
        return at_ms

    def with_status(self, status: str) -> Counter[bytes]:
        return Counter(body for body, txn in self.txns.items() if txn.status == status)


def model_machine(open_at: Callable[[Path], Broker], root: Path, clock: ManualClock, caps: TransactionCapabilities,
                  topic: str, group: str, step: Callable[[ManualClock, float], None]) -> type[RuleBasedStateMachine]:
    """A state machine over brokers the caller opens: ``open_at(data_dir)``, one new data dir under
    ``root`` per example (reopened by the restart rule). ``step`` advances the clock."""
    horizon_s = (caps.transaction_timeout_ms + (caps.check_max + 1) * caps.check_interval_ms) // 1000
    advances = st.one_of(st.integers(0, 120), st.sampled_from([caps.check_interval_ms // 1000, horizon_s]))

    class Transactions(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = TransactionModel(caps)
            self.calls: Counter[bytes] = Counter()
            self.ids: list[tuple[bytes, str]] = []
            self.data_dir = fresh_dir(root)
            self.broker, self.producer = self._open()

        def _open(self) -> tuple[Broker, TransactionProducer]:
            broker = open_at(self.data_dir)
            return broker, open_producer(broker, group, lambda _message, arg: arg, self._check)

        def _check(self, message: StoredMessage) -> TransactionDecision:
            self.calls[message.body] += 1
            txn = self.model.txns[message.body]
            return txn.answer if self.calls[message.body] == txn.answer_at else UNKNOWN

        @rule(local=st.sampled_from([COMMIT, ROLLBACK, UNKNOWN]),
              answer_at=st.one_of(st.none(), st.integers(1, max(1, caps.check_max))),
              answer=st.sampled_from([COMMIT, ROLLBACK]),
              immunity_s=st.one_of(st.none(), st.integers(0, 100)) if caps.check_immunity else st.none())
        def send(self, local: TransactionDecision, answer_at: int | None, answer: TransactionDecision,
                 immunity_s: int | None) -> None:
            body = f"model-{len(self.ids)}".encode()
            first = caps.transaction_timeout_ms if immunity_s is None else immunity_s * 1000
            status = {COMMIT: "committed", ROLLBACK: "rolled_back", UNKNOWN: "open"}[local]
            self.model.txns[body] = Txn(status, clock.now_ms() + first, answer_at, answer)
            result = self.producer.send_in_transaction(Message(topic, body), local, check_immunity_s=immunity_s)
            self.ids.append((body, result.transaction_id))

        @rule(seconds=advances)
        def advance(self, seconds: int) -> None:
            target = self.model.clear_moment(clock.now_ms() + seconds * 1000)
            self.model.advance(target)
            step(clock, (target - clock.now_ms()) / 1000)

        @precondition(lambda self: bool(self.ids))
        @rule(pick=st.integers(0, 1000), decision=st.sampled_from([COMMIT, ROLLBACK]))
        def end(self, pick: int, decision: TransactionDecision) -> None:
            body, transaction_id = self.ids[pick % len(self.ids)]
            txn = self.model.txns[body]
            expected = txn.status == "open"
            if expected:
                txn.status = "committed" if decision is COMMIT else "rolled_back"
            assert self.broker.transactions is not None
            answered = self.broker.transactions.end(transaction_id, decision)
            assert answered is expected, (f"end({decision.name}) of a transaction the model has {txn.status} "
                                          f"answered {answered}")

        @precondition(lambda self: caps.persistent_check_count)
        @rule()
        def restart(self) -> None:
            self.producer.close()
            self.broker.close()
            self.broker, self.producer = self._open()

        @invariant()
        def broker_agrees_with_the_model(self) -> None:
            shown = Counter(m.body for q in self.broker.topic_queues(topic) for m in self.broker.pull(q, 0, 4096).messages)
            discard = MessageQueue(TRANS_DISCARD_TOPIC, self.broker.name, 0)
            dropped = Counter(m.body for m in self.broker.pull(discard, 0, 4096).messages)
            assert shown == self.model.with_status("committed"), (
                f"visible {dict(shown)}, the model has committed {dict(self.model.with_status('committed'))}")
            assert dropped == self.model.with_status("discarded"), (
                f"discarded {dict(dropped)}, the model has {dict(self.model.with_status('discarded'))}")
            checks = Counter({body: t.checks for body, t in self.model.txns.items() if t.checks})
            assert self.calls == checks, f"checks made {dict(self.calls)}, the schedule says {dict(checks)}"
            assert self.broker.transactions is not None
            pending = sum(t.status == "open" for t in self.model.txns.values())
            assert self.broker.transactions.pending() == pending, (
                f"pending() is {self.broker.transactions.pending()}, the model has {pending} open")

        def teardown(self) -> None:
            self.producer.close()
            self.broker.close()

    return Transactions


def fresh_dir(root: Path) -> Path:
    """A new data dir under ``root`` for one example of the machine."""
    root.mkdir(parents=True, exist_ok=True)
    return root / f"example-{len(list(root.iterdir()))}"
