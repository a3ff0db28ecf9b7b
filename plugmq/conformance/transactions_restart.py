"""Transaction clauses across restarts (a part of :class:`TransactionConformance`): a clean restart,
a SIGKILL at every step of a transaction's life, and the model-based clause with restarts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from plugmq.broker.broker import Broker
from plugmq.conformance._txn_child import STEPS
from plugmq.conformance._txn_harness import TransactionHarness
from plugmq.conformance._txn_model import model_machine
from plugmq.conformance._txn_support import COMMIT, ROLLBACK, UNKNOWN, Checks, body_for, by_arg, decide, open_producer
from plugmq.conformance.budget import examples
from plugmq.core import Family, ManualClock, Message

__all__ = ["RestartClauses"]


class RestartClauses(TransactionHarness):
    """Clauses of :class:`~plugmq.conformance.transactions.TransactionConformance` that restart."""

    # ---------------------------------------------------------------------------- restarts
    def test_clean_restart_keeps_open_and_settled_transactions(self, open_broker, clock) -> None:
        """A clean restart keeps open transactions (checked again) and settled ones (never checked again)."""
        broker = open_broker()
        caps = self.caps(broker)
        first = Checks(clock, UNKNOWN)
        producer = open_producer(broker, self.GROUP, by_arg, first)
        producer.send_in_transaction(Message(self.TOPIC, b"committed"), COMMIT)
        producer.send_in_transaction(Message(self.TOPIC, b"rolled back"), ROLLBACK)
        producer.send_in_transaction(Message(self.TOPIC, b"open"), UNKNOWN)
        self.advance(clock, (caps.transaction_timeout_ms + caps.schedule_resolution_ms) / 1000 + 1)
        made = len(first.calls)
        broker.close()
        broker = open_broker()
        assert broker.transactions.pending() == 1
        second = Checks(clock, lambda m: COMMIT if m.body == b"open" else ROLLBACK)
        open_producer(broker, self.GROUP, decide(UNKNOWN), second)
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
        open_producer(broker, self.GROUP, decide(UNKNOWN), checks)
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
        open_producer(broker, self.GROUP, decide(UNKNOWN), again)
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
