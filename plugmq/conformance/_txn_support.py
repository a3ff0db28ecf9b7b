"""Helpers shared by the transaction conformance clauses and their child process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.core import StoredMessage, TransactionDecision

__all__ = ["body_for", "open_producer"]


def body_for(label: str) -> bytes:
    return f"txn-conformance:{label}".encode()


def open_producer(broker: Broker, group: str, local: Callable[[Any, Any], TransactionDecision],
                  checker: Callable[[StoredMessage], TransactionDecision]) -> TransactionProducer:
    return broker.transaction_producer(group, local, checker)
