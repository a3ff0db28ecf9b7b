"""What the in-process replication tests share: the end of a broker's replicated log, and a
sync_master pair with failover on (ha plugin) whose second broker follows the first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plugmq.broker.broker import Broker
from plugmq.core import Clock, ReplicableStore
from plugmq.testing import WAIT_S, wait_for

_HA = {"heartbeat_ms": 100, "peer_timeout_ms": 3000, "reconnect_ms": 20, "reconnect_max_ms": 200,
       "sync_timeout_ms": 2000}


def end_of(broker: Broker) -> int:
    store = broker.store
    assert isinstance(store, ReplicableStore)
    return store.log_end_offset()


@contextmanager
def following_pair(tmp_path: Path, clock: Clock, *, ha: dict[str, Any] | None = None,
                   **settings: Any) -> Iterator[tuple[Broker, Broker]]:
    """Brokers a (master, epoch 1) and b (its slave, connected) in ``tmp_path``: store_mmap,
    delay_wheel and ha, sync_master with failover; ``ha`` adds to the ha plugin's options,
    ``settings`` go to both ``Broker.open``."""
    opened: list[Broker] = []
    try:
        for name, broker_id in (("a", 1), ("b", 2)):
            opened.append(Broker.open(tmp_path / name, plugins=["store_mmap", "delay_wheel", "ha"],
                                      role="sync_master", failover=True, broker_id=broker_id, clock=clock,
                                      store_host=f"127.0.0.{broker_id + 1}:10911", options={"ha": {**_HA, **(ha or {})}}, **settings))
        a, b = opened
        a.promote(1)
        b.follow(a.replication.master_address)  # type: ignore[union-attr]
        wait_for(lambda: a.replication.status().slaves, WAIT_S, "the slave to connect")  # type: ignore[union-attr]
        yield a, b
    finally:
        for broker in reversed(opened):
            broker.close()
