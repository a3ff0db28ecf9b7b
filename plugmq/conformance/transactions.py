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
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from plugmq.broker.broker import Broker
from plugmq.client.consumer import ConsumeFrom, ConsumeStatus
from plugmq.conformance._txn_child import STEPS
from plugmq.conformance._txn_model import model_machine
from plugmq.conformance._txn_support import body_for, open_producer
from plugmq.conformance.budget import examples
from plugmq.core import (
    Clock,
    Family,
    ManualClock,
    Message,
    MessageQueue,
    Prop,
    StoredMessage,
    TransactionCapabilities,
    TransactionDecision,
    TransactionError,
)
from plugmq.core.names import TRANS_DISCARD_TOPIC, TRANS_HALF_TOPIC

__all__ = ["TransactionConformance"]

COMMIT, ROLLBACK, UNKNOWN = TransactionDecision.COMMIT, TransactionDecision.ROLLBACK, TransactionDecision.UNKNOWN


class Checks:
    """A check listener that records (virtual time, message) per call and answers ``answer``."""

    def __init__(self, clock: Clock, answer: TransactionDecision | Callable[[StoredMessage], Any] = UNKNOWN):
        self.clock = clock
        self.answer = answer
        self.calls: list[tuple[float, StoredMessage]] = []

    def __call__(self, message: StoredMessage) -> Any:
        self.calls.append((self.clock.now(), message))
        return self.answer(message) if callable(self.answer) else self.answer

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.calls]


def _decide(decision: TransactionDecision) -> Callable[[Message, Any], TransactionDecision]:
    return lambda _message, _arg: decision


def _by_arg(_message: Message, arg: Any) -> Any:
    """A local transaction whose outcome is the ``arg`` of ``send_in_transaction``."""
    return arg


class TransactionConformance:
    """The transaction contract. Needs fixture ``txn_plugins`` -> tuple of plugin names."""

    TOPIC = "TxnConformance"
    GROUP = "txn-conformance-pg"
    PLUGIN_OPTIONS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def options_for(self, plugins: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        return {name: dict(table) for name, table in self.PLUGIN_OPTIONS.items() if name in plugins}

    # ---------------------------------------------------------------------------- fixtures
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def data_dir(self, tmp_path: Path) -> Path:
        return tmp_path / "broker"

    @pytest.fixture
    def open_broker(self, txn_plugins: tuple[str, ...], data_dir: Path,
                    clock: ManualClock) -> Iterator[Callable[..., Broker]]:
        opened: list[Broker] = []

        def open_(at: ManualClock | None = None) -> Broker:
            broker = Broker.open(data_dir, plugins=list(txn_plugins), options=self.options_for(txn_plugins),
                                 clock=at or clock)
            opened.append(broker)
            if broker.transactions is None:
                pytest.skip(f"plugins {txn_plugins} hold no {Family.TRANSACTION.value} plugin")
            broker.create_topic(self.TOPIC, 2)
            return broker

        yield open_
        for broker in opened:
            broker.close()

    # ---------------------------------------------------------------------------- helpers
    @staticmethod
    def caps(broker: Broker) -> TransactionCapabilities:
        assert broker.transactions is not None
        return broker.transactions.capabilities

    def visible(self, broker: Broker, body: bytes | None = None) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        for queue in broker.topic_queues(self.TOPIC):
            found += broker.pull(queue, broker.min_offset(queue), 1024).messages
        return [m for m in found if body is None or m.body == body]

    @staticmethod
    def discarded(broker: Broker, body: bytes | None = None) -> list[StoredMessage]:
        queue = MessageQueue(TRANS_DISCARD_TOPIC, broker.name, 0)
        messages = broker.pull(queue, broker.min_offset(queue), 1024).messages
        return [m for m in messages if body is None or m.body == body]

    @staticmethod
    def horizon_s(caps: TransactionCapabilities) -> float:
        """Long enough for every check and the discard of a message sent now."""
        ms = caps.transaction_timeout_ms + (caps.check_max + 2) * caps.check_interval_ms
        return (ms + 2 * caps.schedule_resolution_ms) / 1000

    @staticmethod
    def advance(clock: ManualClock, seconds: float, step_s: float = 1.0) -> None:
        """Advance in steps, so a plugin checking by periodic scans gets its passes too."""
        steps = max(1, int(seconds / step_s))
        for _ in range(steps):
            clock.advance(seconds / steps)

    def run_child(self, step: str, txn_plugins: tuple[str, ...], data_dir: Path, clock: ManualClock) -> dict[str, Any]:
        spec = {"step": step, "data_dir": str(data_dir), "plugins": list(txn_plugins), "start": clock.now(),
                "options": self.options_for(txn_plugins), "topic": self.TOPIC, "group": self.GROUP}
        proc = subprocess.run([sys.executable, "-m", "plugmq.conformance._txn_child", json.dumps(spec)],
                              capture_output=True, timeout=120, check=False)
        lines = proc.stdout.decode().splitlines()
        report = json.loads(lines[-1]) if lines else {}
        assert report.get("step") == step and proc.returncode == -signal.SIGKILL, (
            f"child did not reach step {step!r} (exit {proc.returncode}, report {report}); stderr tail:\n"
            + proc.stderr.decode()[-3000:]
        )
        return report

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
        open_producer(broker, self.GROUP, _decide(UNKNOWN), Checks(clock)).send_in_transaction(
            Message(self.TOPIC, b"open"))
        self.advance(clock, caps.transaction_timeout_ms / 1000 * 0.9)
        assert self.visible(broker) == [] and broker.transactions.pending() == 1

    def test_rollback_never_visible_never_checked(self, open_broker, clock) -> None:
        """A rolled-back message is never visible and never checked back."""
        broker = open_broker()
        checks = Checks(clock, COMMIT)
        result = open_producer(broker, self.GROUP, _decide(ROLLBACK), checks).send_in_transaction(
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
        silent = open_producer(broker, self.GROUP, _by_arg, checks).send_in_transaction(
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
        result = open_producer(broker, self.GROUP, _decide(UNKNOWN), checks).send_in_transaction(
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
        result = open_producer(broker, self.GROUP, _decide(UNKNOWN), checks).send_in_transaction(
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
        open_producer(broker, self.GROUP, _decide(UNKNOWN), checks).send_in_transaction(Message(self.TOPIC, b"late"))
        open_producer(broker, "txn-conformance-other", _decide(UNKNOWN), rolled).send_in_transaction(
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
        open_producer(broker, self.GROUP, _decide(UNKNOWN), checks).send_in_transaction(
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
        producer = open_producer(broker, self.GROUP, _decide(UNKNOWN), gone)
        producer.send_in_transaction(Message(self.TOPIC, b"orphan"))
        producer.close()
        self.advance(clock, 2 * self.horizon_s(caps), 10.0)
        assert gone.calls == [] and self.discarded(broker) == [] and broker.transactions.pending() == 1
        back = Checks(clock, UNKNOWN)
        registered_at = clock.now()
        open_producer(broker, self.GROUP, _decide(UNKNOWN), back)
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
        producer = open_producer(broker, self.GROUP, _by_arg, checks)
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
        producer = open_producer(broker, self.GROUP, _decide(UNKNOWN), Checks(clock))
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
        producer = open_producer(broker, self.GROUP, _decide(COMMIT), Checks(clock))
        with pytest.raises(TransactionError, match="delay"):
            producer.send_in_transaction(Message(self.TOPIC, b"later", delay_level=3))
        with pytest.raises(TransactionError, match="delay"):
            producer.send_in_transaction(Message(self.TOPIC, b"later", deliver_at_ms=clock.now_ms() + 60_000))
        assert broker.transactions.pending() == 0
        assert broker.max_offset(MessageQueue(TRANS_HALF_TOPIC, broker.name, 0)) == 0

    # ---------------------------------------------------------------------------- restarts
    def test_clean_restart_keeps_open_and_settled_transactions(self, open_broker, clock) -> None:
        """A clean restart keeps open transactions (checked again) and settled ones (never checked again)."""
        broker = open_broker()
        caps = self.caps(broker)
        first = Checks(clock, UNKNOWN)
        producer = open_producer(broker, self.GROUP, _by_arg, first)
        producer.send_in_transaction(Message(self.TOPIC, b"committed"), COMMIT)
        producer.send_in_transaction(Message(self.TOPIC, b"rolled back"), ROLLBACK)
        producer.send_in_transaction(Message(self.TOPIC, b"open"), UNKNOWN)
        self.advance(clock, (caps.transaction_timeout_ms + caps.schedule_resolution_ms) / 1000 + 1)
        made = len(first.calls)
        broker.close()
        broker = open_broker()
        assert broker.transactions.pending() == 1
        second = Checks(clock, lambda m: COMMIT if m.body == b"open" else ROLLBACK)
        open_producer(broker, self.GROUP, _decide(UNKNOWN), second)
        self.advance(clock, self.horizon_s(caps), 5.0)
        assert [m.body for _, m in second.calls] == [b"open"]
        assert sorted(m.body for m in self.visible(broker)) == [b"committed", b"open"]
        assert made + len(second.calls) <= max(caps.check_max, 1)

    @pytest.mark.parametrize("step", STEPS)
    def test_restart_after_kill(self, step: str, txn_plugins: tuple[str, ...], data_dir: Path,
                                open_broker: Callable[..., Broker]) -> None:
        """After a SIGKILL at any step of a transaction's life the message ends visible once, discarded
        once or gone, as decided, with checks still counted."""
        start = ManualClock()
        report = self.run_child(step, txn_plugins, data_dir, start)
        clock = ManualClock(report["now"])
        broker = open_broker(clock)
        caps = self.caps(broker)
        body = body_for(step)
        checks = Checks(clock, COMMIT if step == "in_local" else UNKNOWN)
        open_producer(broker, self.GROUP, _decide(UNKNOWN), checks)
        self.advance(clock, self.horizon_s(caps), 5.0)
        visible, dropped = self.visible(broker, body), self.discarded(broker, body)
        if step in ("commit_before_visible", "commit_after_visible", "check_commit_before_visible"):
            assert (len(visible), len(dropped), len(checks.calls)) == (1, 0, 0), \
                "a recorded commit must become visible exactly once after the crash, without a new check"
        elif step == "rolled_back":
            assert (len(visible), len(dropped), len(checks.calls)) == (0, 0, 0)
        elif step == "in_local":
            assert (len(visible), len(dropped), len(checks.calls)) == (1, 0, 1)
        elif step == "in_check":
            assert (len(visible), len(dropped)) == (0, 1)
            if caps.persistent_check_count:
                assert report["checks"] + len(checks.calls) == caps.check_max, \
                    "the check made before the crash must still count after the restart"
        elif step == "discard_before_visible":
            assert (len(visible), len(dropped), len(checks.calls)) == (0, 1, 0)
        assert broker.transactions is not None and broker.transactions.pending() == 0
        broker.close()
        again = Checks(clock, COMMIT)
        broker = open_broker(clock)
        open_producer(broker, self.GROUP, _decide(UNKNOWN), again)
        self.advance(clock, self.horizon_s(caps), 10.0)
        assert again.calls == [], "a settled transaction was checked again after a restart"
        assert (len(self.visible(broker, body)), len(self.discarded(broker, body))) == (len(visible), len(dropped))

    def test_random_sends_decisions_and_restarts_match_a_reference_model(
            self, txn_plugins: tuple[str, ...], tmp_path: Path, clock: ManualClock) -> None:
        """Random sends (committed, rolled back or unknown, with check answers and immunity), ends,
        clock steps and restarts: visible, discarded and pending messages and the checks made agree
        with the declared schedule."""
        def open_at(data_dir: Path) -> Broker:
            broker = Broker.open(data_dir, plugins=list(txn_plugins), options=self.options_for(txn_plugins),
                                 clock=clock)
            if broker.transactions is None:
                broker.close()
                pytest.skip(f"plugins {txn_plugins} hold no {Family.TRANSACTION.value} plugin")
            broker.create_topic(self.TOPIC, 2)
            return broker

        probe = open_at(tmp_path / "probe")  # the schedule the service keeps with these options
        caps = self.caps(probe)
        probe.close()
        machine = model_machine(open_at, tmp_path / "model", clock, caps, self.TOPIC, self.GROUP, self.advance)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples(12), stateful_step_count=15, deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))
