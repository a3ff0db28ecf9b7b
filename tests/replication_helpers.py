"""What the in-process replication tests share: waiting on real replication threads, log ends."""

from __future__ import annotations

import time
from collections.abc import Callable

from plugmq.broker.broker import Broker
from plugmq.core import ReplicableStore

#: Bound on waits for other real threads (not a timed assertion: it keeps a broken build from hanging).
DEADLINE_S = 20.0


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def end_of(broker: Broker) -> int:
    store = broker.store
    assert isinstance(store, ReplicableStore)
    return store.log_end_offset()
