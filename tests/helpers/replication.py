"""What the in-process replication tests share: the end of a broker's replicated log."""

from __future__ import annotations

from plugmq.broker.broker import Broker
from plugmq.core import ReplicableStore


def end_of(broker: Broker) -> int:
    store = broker.store
    assert isinstance(store, ReplicableStore)
    return store.log_end_offset()
