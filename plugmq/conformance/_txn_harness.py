"""Fixtures and helpers the transaction clauses share: brokers on a ManualClock, what is visible,
what was discarded, the check-back horizon, and the killed child of the restart clauses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plugmq.broker.broker import Broker
from plugmq.core import Family, ManualClock, MessageQueue, StoredMessage, TransactionCapabilities
from plugmq.core.names import TRANS_DISCARD_TOPIC

__all__ = ["TransactionHarness"]


class TransactionHarness:
    """Fixtures and helpers of the transaction clauses. Needs fixture ``txn_plugins``."""

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
