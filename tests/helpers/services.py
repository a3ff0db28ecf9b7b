"""A broker's optional services, for tests that loaded the plugin providing them."""

from __future__ import annotations

from plugmq.broker.broker import Broker
from plugmq.core import DelayScheduler, ReplicationService, TransactionService

__all__ = ["delay_of", "replication_of", "transactions_of"]


def transactions_of(broker: Broker) -> TransactionService:
    """The broker's transaction service (the test loaded ``txn``)."""
    assert broker.transactions is not None, f"{broker.name} has no transaction plugin"
    return broker.transactions


def delay_of(broker: Broker) -> DelayScheduler:
    """The broker's delay scheduler (the test loaded a delay plugin)."""
    assert broker.delay is not None, f"{broker.name} has no delay plugin"
    return broker.delay


def replication_of(broker: Broker) -> ReplicationService:
    """The broker's replication (the test loaded a replication plugin)."""
    assert broker.replication is not None, f"{broker.name} has no replication plugin"
    return broker.replication
