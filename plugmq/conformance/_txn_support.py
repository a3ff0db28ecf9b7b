"""Helpers shared by the transaction conformance clauses and their child process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.core import Clock, Message, StoredMessage, TransactionDecision

__all__ = ["COMMIT", "ROLLBACK", "UNKNOWN", "Checks", "body_for", "by_arg", "decide", "open_producer"]

COMMIT, ROLLBACK, UNKNOWN = TransactionDecision.COMMIT, TransactionDecision.ROLLBACK, TransactionDecision.UNKNOWN


def body_for(label: str) -> bytes:
    return f"txn-conformance:{label}".encode()


def open_producer(broker: Broker, group: str, local: Callable[[Any, Any], TransactionDecision],
                  checker: Callable[[StoredMessage], TransactionDecision]) -> TransactionProducer:
    return broker.transaction_producer(group, local, checker)


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


def decide(decision: TransactionDecision) -> Callable[[Message, Any], TransactionDecision]:
    """A local transaction that always answers ``decision``."""
    return lambda _message, _arg: decision


def by_arg(_message: Message, arg: Any) -> Any:
    """A local transaction whose outcome is the ``arg`` of ``send_in_transaction``."""
    return arg
