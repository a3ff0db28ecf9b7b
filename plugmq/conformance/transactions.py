"""Transaction conformance: half messages, decisions, check-back and restarts, for any txn plugin.

Subclass :class:`TransactionConformance` and provide one fixture, ``txn_plugins``: the plugin
names of a broker holding the transaction plugin under test and a store (e.g.
``("store_lmdb", "txn", "alloc")``). Plugins run with their default options unless the subclass
sets ``PLUGIN_OPTIONS`` (plugin name -> option table; tables of plugins not in the list are
ignored), e.g. to shrink a store's segment files; the check-back
schedule each clause expects is the one the service declares in its
:class:`~plugmq.core.contracts.TransactionCapabilities` (timeout, interval, max, resolution).
Everything runs on a ManualClock; the restart clauses SIGKILL a real child process
(``_txn_child``) at each step of a transaction's life and reopen its data dir.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from plugmq.broker.broker import Broker
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus
from plugmq.conformance._txn_support import COMMIT, ROLLBACK, UNKNOWN, Checks, by_arg, decide, open_producer
from plugmq.conformance.transactions_restart import RestartClauses
from plugmq.core import Message, MessageQueue, Prop, StoredMessage, TransactionDecision, TransactionError
from plugmq.core.names import TRANS_HALF_TOPIC

__all__ = ["TransactionConformance"]


class TransactionConformance(RestartClauses):
    """The transaction contract. Needs fixture ``txn_plugins`` -> tuple of plugin names."""

    # ---------------------------------------------------------------------------- visibility
    def test_invisible_until_commit(self, open_broker: Callable[..., Broker]) -> None:
        """A half message is invisible until committed, then appears once on its real topic and queue as it
        was sent."""
        broker = open_broker()
        seen_inside: list[int] = []
        consumed: list[StoredMessage] = []

        def sink(messages: list[StoredMessage]) -> ConsumeStatus:
            consumed.extend(messages)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = broker.push_consumer("txn-conformance-cg", sink, background=False, max_reconsume_times=0,
                                        consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(self.TOPIC).start()

        def local(message: Message, arg: Any) -> TransactionDecision:
            consumer.consume_available()
            seen_inside.append(len(self.visible(broker)) + len(consumed))
            return COMMIT

        message = Message(self.TOPIC, b"payload", tags="TagA", keys="order-1", properties={"k": "v"})
        result = open_producer(broker, self.GROUP, local, Checks(broker.clock)).send_in_transaction(message)
        assert seen_inside == [0], "the half message was visible while the local transaction ran"
        assert result.local_decision is COMMIT and result.applied
        consumer.consume_available()
        visible = self.visible(broker)
        assert [m.body for m in visible] == [b"payload"] and [m.body for m in consumed] == [b"payload"]
        got = visible[0]
        assert got.tags == "TagA" and got.keys == ("order-1",) and got.user_properties.get("k") == "v"
        assert got.unique_id == result.unique_id and got.queue_id == result.send_result.queue.queue_id
        assert self.discarded(broker) == []

    def test_unknown_stays_invisible_and_is_never_on_the_real_topic_early(self, open_broker, clock) -> None:
        """An UNKNOWN transaction stays invisible and never reaches its real topic early."""
        broker = open_broker()
        caps = self.caps(broker)
        open_producer(broker, self.GROUP, decide(UNKNOWN), Checks(clock)).send_in_transaction(
            Message(self.TOPIC, b"open"))
        self.advance(clock, caps.transaction_timeout_ms / 1000 * 0.9)
        assert self.visible(broker) == [] and broker.transactions.pending() == 1

    def test_rollback_never_visible_never_checked(self, open_broker, clock) -> None:
        """A rolled-back message is never visible and never checked back."""
        broker = open_broker()
        checks = Checks(clock, COMMIT)
        result = open_producer(broker, self.GROUP, decide(ROLLBACK), checks).send_in_transaction(
            Message(self.TOPIC, b"rolled back"))
        assert result.local_decision is ROLLBACK and result.applied
        self.advance(clock, self.horizon_s(self.caps(broker)), 5.0)
        assert self.visible(broker) == [] and self.discarded(broker) == [] and checks.calls == []
        assert broker.transactions.pending() == 0

    def test_exception_or_no_answer_in_local_transaction_counts_as_unknown(self, open_broker, clock) -> None:
        """A local transaction that raises or answers nothing counts as UNKNOWN and is checked after the
        timeout."""
        broker = open_broker()
        caps = self.caps(broker)
        checks = Checks(clock, COMMIT)

        def failing(message: Message, arg: Any) -> TransactionDecision:
            raise RuntimeError("database unreachable")

        sent_at = clock.now()
        result = open_producer(broker, self.GROUP, failing, checks).send_in_transaction(Message(self.TOPIC, b"raised"))
        assert result.local_decision is UNKNOWN and not result.applied
        assert result.local_error is not None and "database unreachable" in result.local_error
        silent = open_producer(broker, self.GROUP, by_arg, checks).send_in_transaction(
            Message(self.TOPIC, b"silent"), None)  # a local transaction that answers nothing
        assert silent.local_decision is UNKNOWN and not silent.applied
        assert self.visible(broker) == []
        self.advance(clock, (caps.transaction_timeout_ms + caps.schedule_resolution_ms) / 1000 + 1)
        assert sorted(m.body for m in self.visible(broker)) == [b"raised", b"silent"]
        assert len(checks.calls) == 2 and all(t >= sent_at + caps.transaction_timeout_ms / 1000 for t in checks.times)

    def test_check_listener_sees_the_real_topic_and_the_transaction_id(self, open_broker, clock) -> None:
        """The check listener gets the half message with its real topic, keys and properties and the
        transaction id as msg_id."""
        broker = open_broker()
        checks = Checks(clock, COMMIT)
        result = open_producer(broker, self.GROUP, decide(UNKNOWN), checks).send_in_transaction(
            Message(self.TOPIC, b"who", keys="biz-7", properties={"p": "1"}))
        self.advance(clock, self.horizon_s(self.caps(broker)), 5.0)
        assert len(checks.calls) == 1
        seen = checks.calls[0][1]
        assert seen.topic == self.TOPIC and seen.body == b"who" and seen.keys == ("biz-7",)
        assert seen.msg_id == result.transaction_id and seen.unique_id == result.unique_id
        assert seen.user_properties.get("p") == "1"
        assert [m.body for m in self.visible(broker)] == [b"who"]

    # ---------------------------------------------------------------------------- check-back
    def test_check_schedule_timeout_interval_max_then_discard(self, open_broker, clock) -> None:
        """Checks come at the timeout, then once per interval, at most check_max times, then the message
        moves to the discard topic."""
        broker = open_broker()
        caps = self.caps(broker)
        checks = Checks(clock, UNKNOWN)
        sent_at = clock.now()
        result = open_producer(broker, self.GROUP, decide(UNKNOWN), checks).send_in_transaction(
            Message(self.TOPIC, b"never decided"))
        res = caps.schedule_resolution_ms / 1000 + 1e-3
        with structlog.testing.capture_logs() as logs:
            self.advance(clock, self.horizon_s(caps), 1.0)
        times = checks.times
        assert len(times) == caps.check_max, f"expected {caps.check_max} checks, got {len(times)}"
        if times:
            first = times[0] - sent_at
            assert caps.transaction_timeout_ms / 1000 <= first <= caps.transaction_timeout_ms / 1000 + res
            for a, b in itertools.pairwise(times):
                assert caps.check_interval_ms / 1000 <= b - a <= caps.check_interval_ms / 1000 + res
        dropped = self.discarded(broker)
        assert [m.body for m in dropped] == [b"never decided"] and self.visible(broker) == []
        assert dropped[0].properties.get(Prop.REAL_TOPIC) == self.TOPIC
        assert dropped[0].unique_id == result.unique_id
        assert any(entry.get("log_level") in ("warning", "error", "critical") for entry in logs), \
            "a discard must leave a warning in the log"
        assert broker.transactions.pending() == 0
        self.advance(clock, self.horizon_s(caps), 10.0)
        assert len(checks.times) == caps.check_max and len(self.discarded(broker)) == 1

    def test_check_answer_settles(self, open_broker, clock) -> None:
        """A check answered COMMIT or ROLLBACK settles the transaction."""
        broker = open_broker()
        caps = self.caps(broker)
        answers = iter([UNKNOWN, UNKNOWN, COMMIT])
        checks = Checks(clock, lambda _m: next(answers))
        rolled = Checks(clock, ROLLBACK)
        open_producer(broker, self.GROUP, decide(UNKNOWN), checks).send_in_transaction(Message(self.TOPIC, b"late"))
        open_producer(broker, "txn-conformance-other", decide(UNKNOWN), rolled).send_in_transaction(
            Message(self.TOPIC, b"dropped"))
        self.advance(clock, self.horizon_s(caps), 1.0)
        if caps.check_max >= 3:
            assert len(checks.calls) == 3 and [m.body for m in self.visible(broker)] == [b"late"]
        assert len(rolled.calls) == (1 if caps.check_max >= 1 else 0)
        assert self.discarded(broker, b"dropped") == []

    def test_check_immunity_delays_first_check_without_burning_counts(self, open_broker, clock) -> None:
        """The check-immunity property delays the first check without counting checks."""
        broker = open_broker()
        caps = self.caps(broker)
        if not caps.check_immunity:
            pytest.skip("the transaction plugin does not declare capability check_immunity")
        immunity_s = (caps.transaction_timeout_ms + 3 * caps.check_interval_ms) // 1000 + 1
        checks = Checks(clock, UNKNOWN)
        sent_at = clock.now()
        open_producer(broker, self.GROUP, decide(UNKNOWN), checks).send_in_transaction(
            Message(self.TOPIC, b"immune"), check_immunity_s=immunity_s)
        self.advance(clock, immunity_s - 1, 1.0)
        assert checks.calls == [], "checked during the message's check-immunity time"
        self.advance(clock, self.horizon_s(caps) + immunity_s, 1.0)
        assert len(checks.times) == caps.check_max, "waiting out immunity must not count as checks"
        if checks.times:
            assert immunity_s <= checks.times[0] - sent_at <= immunity_s + caps.schedule_resolution_ms / 1000 + 1e-3
        assert len(self.discarded(broker, b"immune")) == 1

    def test_group_without_live_checker_waits_uncounted(self, open_broker, clock) -> None:
        """Checks of a group without a live listener wait uncounted and come due within one interval of a
        listener registering."""
        broker = open_broker()
        caps = self.caps(broker)
        gone = Checks(clock, UNKNOWN)
        producer = open_producer(broker, self.GROUP, decide(UNKNOWN), gone)
        producer.send_in_transaction(Message(self.TOPIC, b"orphan"))
        producer.close()
        self.advance(clock, 2 * self.horizon_s(caps), 10.0)
        assert gone.calls == [] and self.discarded(broker) == [] and broker.transactions.pending() == 1
        back = Checks(clock, UNKNOWN)
        registered_at = clock.now()
        open_producer(broker, self.GROUP, decide(UNKNOWN), back)
        self.advance(clock, self.horizon_s(caps), 1.0)
        assert len(back.calls) == caps.check_max, "checks that waited for a live producer must not be counted"
        if back.calls:
            assert back.times[0] - registered_at <= (caps.check_interval_ms + caps.schedule_resolution_ms) / 1000 + 1
        assert len(self.discarded(broker, b"orphan")) == 1

    # ---------------------------------------------------------------------------- decisions
    def test_decision_twice_has_no_second_effect(self, open_broker, clock) -> None:
        """A second COMMIT or ROLLBACK of a settled transaction changes nothing and returns False."""
        broker = open_broker()
        service = broker.transactions
        checks = Checks(clock, COMMIT)
        producer = open_producer(broker, self.GROUP, by_arg, checks)
        committed = producer.send_in_transaction(Message(self.TOPIC, b"once"), COMMIT)
        assert service.end(committed.transaction_id, COMMIT) is False
        assert service.end(committed.transaction_id, ROLLBACK) is False
        rolled = producer.send_in_transaction(Message(self.TOPIC, b"never"), ROLLBACK)
        assert service.end(rolled.transaction_id, COMMIT) is False
        assert service.end(rolled.transaction_id, ROLLBACK) is False
        later = producer.send_in_transaction(Message(self.TOPIC, b"later"), UNKNOWN)
        assert service.end(later.transaction_id, UNKNOWN) is True  # still open: nothing recorded
        assert service.end(later.transaction_id, COMMIT) is True
        assert service.end(later.transaction_id, COMMIT) is False
        assert service.end(later.transaction_id, ROLLBACK) is False
        self.advance(clock, self.horizon_s(self.caps(broker)), 5.0)
        assert sorted(m.body for m in self.visible(broker)) == [b"later", b"once"]
        assert checks.calls == [] and service.pending() == 0

    def test_concurrent_commits_apply_once(self, open_broker, clock) -> None:
        """Commits of one transaction from many threads apply once: exactly one returns True."""
        broker = open_broker()
        service = broker.transactions
        producer = open_producer(broker, self.GROUP, decide(UNKNOWN), Checks(clock))
        ids = [producer.send_in_transaction(Message(self.TOPIC, f"race-{i}".encode())).transaction_id for i in range(5)]
        outcomes: list[bool] = []
        lock = threading.Lock()

        def commit(tid: str) -> None:
            ok = service.end(tid, COMMIT)
            with lock:
                outcomes.append(ok)

        threads = [threading.Thread(target=commit, args=(tid,)) for tid in ids for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count(True) == 5
        assert sorted(m.body for m in self.visible(broker)) == sorted(f"race-{i}".encode() for i in range(5))

    def test_unknown_transaction_id_is_an_error(self, open_broker) -> None:
        """end with an id that names no half message raises TransactionError."""
        broker = open_broker()
        sent = broker.put(Message(self.TOPIC, b"plain"), 0)
        with pytest.raises(TransactionError):
            broker.transactions.end(sent.msg_id, COMMIT)
        with pytest.raises(TransactionError):
            broker.transactions.end("not-an-id", COMMIT)

    def test_delayed_transactional_message_refused(self, open_broker, clock) -> None:
        """Without delayed_transactions a delayed half message is refused with TransactionError and nothing
        is stored."""
        broker = open_broker()
        if self.caps(broker).delayed_transactions:
            pytest.skip("the transaction plugin declares delayed_transactions; refusal does not apply")
        producer = open_producer(broker, self.GROUP, decide(COMMIT), Checks(clock))
        with pytest.raises(TransactionError, match="delay"):
            producer.send_in_transaction(Message(self.TOPIC, b"later", delay_level=3))
        with pytest.raises(TransactionError, match="delay"):
            producer.send_in_transaction(Message(self.TOPIC, b"later", deliver_at_ms=clock.now_ms() + 60_000))
        assert broker.transactions.pending() == 0
        assert broker.max_offset(MessageQueue(TRANS_HALF_TOPIC, broker.name, 0)) == 0

