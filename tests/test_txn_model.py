"""The txn plugin against the transaction family's reference model, with a tight schedule.

The conformance suite runs the model (``plugmq.conformance._txn_model``) with the plugin's default
options; here txn runs with three checks at most and a 4 KiB op log, so random sends, decisions,
clock moves and restarts also reach discards and op-log compaction often. The real broker
(store_lmdb + txn, ManualClock) must agree on every check made, every message visible, every
discard and every ``end`` return value.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from plugmq.broker.broker import Broker
from plugmq.conformance._txn_model import model_machine
from plugmq.core import ManualClock

TOPIC = "TxnModel"
OPTIONS = {"txn": {"transaction_timeout_s": 6.0, "check_interval_s": 30.0, "check_max": 3, "compact_bytes": 4096}}


def test_txn_matches_model(tmp_path: Path) -> None:
    clock = ManualClock()

    def open_at(data_dir: Path) -> Broker:
        broker = Broker.open(data_dir, plugins=["store_lmdb", "txn"], options=OPTIONS, clock=clock)
        broker.create_topic(TOPIC, 2)
        return broker

    probe = open_at(tmp_path / "probe")
    assert probe.transactions is not None
    caps = probe.transactions.capabilities
    probe.close()
    assert (caps.check_max, caps.transaction_timeout_ms, caps.check_interval_ms) == (3, 6_000, 30_000)
    machine = model_machine(open_at, tmp_path / "model", clock, caps, TOPIC, "pg", ManualClock.advance)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=40, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))
